"""The one cache of prepared splits: `split_cache` builds a task's splits once and loads them afterwards.

An entry is a directory ``root/[prefix-]<hash of identity>/`` holding one ``.npz`` per split (the
containers of `splits.py`), the identity as JSON and whatever else the builder writes for inspection
(ListOps' generated TSV files). The directory is renamed into place only when complete, so a killed
build leaves nothing to mistake for a cache; an incomplete or unreadable one can only be damage from
outside, and loading it is a one-line `DataError` saying which directory to delete.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import zipfile
from pathlib import Path
from typing import Callable, Sequence

from sparse_runner.checks import DataError, one_line
from sparse_runner.io import atomic_directory, atomic_write_json

logger = logging.getLogger(__name__)


def cache_directory(root: str | os.PathLike, identity: object, prefix: str = "") -> Path:
    """``root/<hash>`` (``root/<prefix>-<hash>`` with a `prefix`): the first 16 hex digits of the sha256 of
    `identity` as sorted-key JSON."""
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return Path(root).expanduser() / (f"{prefix}-{digest}" if prefix else digest)


def split_cache(
    root: str | os.PathLike,
    kind: type,
    identity: object,
    build: Callable[[], dict],
    *,
    what: str = "split",
    prefix: str = "",
    file_name: str = "{}.npz",
    names: Sequence[str] | None = None,
    identity_file: str | None = "identity.json",
    write_extra: Callable[[Path], None] | None = None,
) -> dict:
    """`build()` -> {split: kind}, cached under `cache_directory(root, identity, prefix)` (`kind` is
    PackedSplit or ImageSplit, or a subclass). A later call with the same identity loads the cache and
    builds nothing. `identity`: anything JSON-serialisable that determines the content (parameters, file
    stats, a format version).

    Each split is saved as `file_name` with its name in the braces; `identity` is written to
    `identity_file` (None: not written), and `write_extra(directory)` may add files before the directory
    is renamed into place. `names`: the splits a complete cache holds, none of them empty (the builder
    refuses empty ones); without, every split file found is loaded, train, val, test first. A cache
    that lacks a split of `names`, holds an empty one or cannot be read raises `DataError` naming the
    directory to delete (`what` names the data in the message).
    """
    directory = cache_directory(root, identity, prefix)
    if directory.is_dir():
        return _load(directory, kind, what, file_name, names)
    splits = build()
    with atomic_directory(directory) as tmp:
        for name, split in splits.items():
            split.save(tmp / file_name.format(name))
        if identity_file is not None:
            atomic_write_json(tmp / identity_file, identity)
        if write_extra is not None:
            write_extra(tmp)
    logger.info("cached %s in %s", "/".join(f"{k}={len(v)}" for k, v in splits.items()), directory)
    return splits


def _load(directory: Path, kind: type, what: str, file_name: str, names: Sequence[str] | None) -> dict:
    def damaged(problem: str) -> DataError:
        return DataError(f"{what} cache {directory} {problem}; delete that directory (rm -r {directory}) and rerun to rebuild it")

    if names is None:
        head, tail = file_name.split("{}")
        # train, val, test first (the order logs and metrics show), then any other name
        order = {"train": 0, "val": 1, "test": 2}
        found = (p.name[len(head) : len(p.name) - len(tail)] for p in directory.glob(f"{head}*{tail}"))
        paths = {name: directory / file_name.format(name) for name in sorted(found, key=lambda n: (order.get(n.split("_")[0], 3), n))}
    else:
        paths = {name: directory / file_name.format(name) for name in names}
        # A cache directory is renamed into place only when complete: a missing file was deleted from outside.
        missing = [p.name for p in paths.values() if not p.is_file()]
        if missing:
            raise damaged(f"is incomplete (missing {', '.join(missing)})")
    try:
        splits = {name: kind.load(path) for name, path in paths.items()}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise damaged(f"is unreadable ({one_line(err)})") from None
    if names is not None:
        empty = [name for name, split in splits.items() if len(split) == 0]
        if empty:
            # A cache with an empty split came from a source file without examples: a rebuild names that file.
            raise damaged(f"holds no {'/'.join(empty)} examples")
    logger.info("%s: loaded cache from %s (%s examples)", what, directory, "/".join(str(len(s)) for s in splits.values()))
    return splits
