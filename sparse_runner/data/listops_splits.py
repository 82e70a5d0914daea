"""ListOps splits for the Long Range Arena task: the official release files or generated, tokenised and cached.

``prepare_listops`` reads the official ``basic_{train,val,test}.tsv`` files or generates them
(``listops_generator``), and caches the tokenised arrays (``split_cache``) so the (pure Python, slow)
work is done once.

Errors
------
Anything wrong with the input (a malformed or empty TSV file, an unknown token, an incomplete cache)
raises ``sparse_runner.checks.DataError``, and an impossible generator setting a ``ConfigError``: one
line naming the file (and line) or the parameter, the problem and what is expected, which the command
line prints as a refusal (exit status 2) rather than a crash.

Pure Python + numpy on purpose: data preparation must not depend on torch.
"""

from __future__ import annotations

import logging
import operator
import os
import time
from pathlib import Path
from typing import Callable

from sparse_runner.checks import ConfigError, DataError
from sparse_runner.data.listops_files import TokenizedSplit, write_tsv
from sparse_runner.data.listops_generator import generate_examples
from sparse_runner.data.split_cache import split_cache

logger = logging.getLogger(__name__)

SPLITS: tuple[str, ...] = ("train", "val", "test")

# Bumped whenever the generator or the tokeniser changes what a given seed / file produces, so that
# old caches (whose directory names hash this) are not reused.
_DATA_FORMAT_VERSION = 1


def _official_files(data_dir: Path) -> dict[str, Path]:
    return {split: data_dir / f"basic_{split}.tsv" for split in SPLITS}


def _cached(cache_root: Path, source: str, identity: object, build: Callable[[], dict], **options) -> dict[str, TokenizedSplit]:
    """`split_cache` in ListOps' layout: ``<source>-<hash>/tokens_{train,val,test}.npz``."""
    return split_cache(
        cache_root, TokenizedSplit, identity, build, what="ListOps", prefix=source, file_name="tokens_{}.npz", names=SPLITS, **options
    )


def _prepare_official(data_dir: Path, cache_root: Path) -> dict[str, TokenizedSplit]:
    files = _official_files(data_dir)
    missing = [str(p) for p in files.values() if not p.is_file()]
    if missing:
        raise DataError(
            f"ListOps data_dir {data_dir}: missing {', '.join(missing)}; expected "
            f"{', '.join(p.name for p in files.values())} (the LRA release names)"
        )
    # Path, size and modification time identify the file content cheaply; a rewritten file gets a new
    # cache directory (old ones are left for the user to delete).
    identity = [_DATA_FORMAT_VERSION]
    for split in SPLITS:
        stat = files[split].stat()
        identity.append([str(files[split].resolve()), stat.st_size, stat.st_mtime_ns])

    def build() -> dict[str, TokenizedSplit]:
        start = time.perf_counter()
        splits = {split: TokenizedSplit.from_file(path) for split, path in files.items()}
        logger.info(
            "ListOps: tokenised official files from %s (%s examples) in %.1f s",
            data_dir, "/".join(str(len(s)) for s in splits.values()), time.perf_counter() - start,
        )
        return splits

    return _cached(cache_root, "official", identity, build, identity_file=None)


def _prepare_generated(cache_root: Path, params: dict) -> dict[str, TokenizedSplit]:
    rows: dict[str, list[tuple[str, int]]] = {}

    def build() -> dict[str, TokenizedSplit]:
        counts = {split: params[f"num_{split}"] for split in SPLITS}
        total = sum(counts.values())
        start = time.perf_counter()
        # One seeded stream for all splits, cut in generation order: the examples are distinct, so no
        # example appears in two splits.
        examples = generate_examples(
            total,
            min_length=params["min_length"],
            max_length=params["max_length"],
            max_depth=params["max_depth"],
            max_args=params["max_args"],
            seed=params["seed"],
        )
        elapsed = time.perf_counter() - start
        logger.info("ListOps: generated %d examples in %.1f s (%.0f/s)", total, elapsed, total / elapsed if elapsed > 0 else float("inf"))
        begin = 0
        for split in SPLITS:
            rows[split] = examples[begin : begin + counts[split]]
            begin += counts[split]
        return {split: TokenizedSplit.from_rows(rows[split]) for split in SPLITS}

    def write_release_files(directory: Path) -> None:
        for split in SPLITS:
            write_tsv(directory / f"basic_{split}.tsv", rows[split])  # same format as the release, for inspection

    identity = {"version": _DATA_FORMAT_VERSION, **params}
    return _cached(cache_root, "generated", identity, build, identity_file="params.json", write_extra=write_release_files)


def prepare_listops(
    *,
    data_dir: str | os.PathLike | None,
    cache_dir: str | os.PathLike,
    num_train: int,
    num_val: int,
    num_test: int,
    min_length: int,
    max_length: int,
    max_depth: int,
    max_args: int,
    seed: int,
) -> dict[str, TokenizedSplit]:
    """Tokenised ``{"train", "val", "test"}`` splits of ListOps, from the release files or generated.

    With ``data_dir``: reads ``basic_{train,val,test}.tsv`` there; the counts and generator parameters are
    ignored, and sequences longer than ``max_length`` are kept (truncation is the model's job). Arrays are
    cached under ``cache_dir/listops/official-<hash>/``, the hash covering each file's path, size and mtime.
    A missing, malformed or example-less file raises ``DataError`` naming it (and the line).

    Without: generates ``num_train + num_val + num_test`` distinct examples with ``seed`` and caches TSV
    files and arrays under ``cache_dir/listops/generated-<hash of the parameters>/``. A later call with
    the same parameters loads that directory and generates nothing. The keyword arguments are the
    ``task.generator`` keys; a value out of range, or a length window too few distinct trees fit, raises
    ``ConfigError``.

    A damaged cache directory raises ``DataError`` saying which directory to delete.
    """
    cache_root = Path(cache_dir) / "listops"
    if data_dir is not None:
        return _prepare_official(Path(data_dir), cache_root)
    params = {
        "num_train": num_train, "num_val": num_val, "num_test": num_test,
        "min_length": min_length, "max_length": max_length,
        "max_depth": max_depth, "max_args": max_args, "seed": seed,
    }
    for name, value in params.items():
        if isinstance(value, bool):
            raise TypeError(f"prepare_listops: {name} must be an int, got {value!r}")
        try:
            params[name] = operator.index(value)  # accepts numpy ints, rejects floats and strings
        except TypeError:
            raise TypeError(f"prepare_listops: {name} must be an int, got {value!r}") from None
    for split in SPLITS:
        if params[f"num_{split}"] < 1:
            raise ConfigError(
                f"num_{split} must be >= 1 (a split without examples cannot be trained on or scored), got {params[f'num_{split}']}"
            )
    return _prepare_generated(cache_root, params)
