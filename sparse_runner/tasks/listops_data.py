"""ListOps data for the Long Range Arena (LRA) task: generator, tokeniser, TSV files and a token cache.

ListOps (LRA paper, section D.4 of the reference notes) asks a model to evaluate a nested expression of
list operators over the digits 0-9, e.g. ``[MAX 2 9 [MIN 4 7 ] 0 ]`` -> 9; the label is the value
(10 classes).

What this module provides
-------------------------
* ``generate_examples``: the LRA generator (random trees, kept only if ``min_length < length < max_length``,
  deduplicated) with a seeded ``random.Random`` so the same seed gives the same data.
* ``tree_to_string`` / ``tokenize``: the release's text form (``( ( ( [MAX 2 ) 9 ) ] )``) and LRA's input
  pipeline rule that turns it into ids (parentheses deleted, ``]`` -> ``X``, ``[`` of operators stripped).
* ``read_tsv`` / ``write_tsv``: the official release format (``Source<TAB>Target`` header).
* ``TokenizedSplit``: all sequences of a split as one flat ``uint8`` array plus offsets, saved as ``.npz``.
* ``prepare_listops``: reads the official ``basic_{train,val,test}.tsv`` files or generates them, and
  caches the tokenised arrays so the (pure Python, slow) work is done once.

Tree representation
-------------------
A leaf is an ``int`` 0-9. An operator node is a tuple ``(op, children)`` with ``op`` one of
``OPERATORS`` (without the ``[``) and ``children`` a tuple of at least two subtrees. This is more
direct to evaluate than LRA's binary nesting, which only matters for the serialised text.

Errors
------
Anything wrong with the input (a malformed or empty TSV file, an unknown token, an incomplete cache)
raises ``sparse_runner.checks.DataError``, and an impossible generator setting a ``ConfigError``: one
line naming the file (and line) or the parameter, the problem and what is expected, which the command
line prints as a refusal (exit status 2) rather than a crash.

Pure Python + numpy on purpose: data preparation must not depend on torch.
"""

from __future__ import annotations

import hashlib
import json
import logging
import operator
import os
import random
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Union

import numpy as np

from sparse_runner.checks import ConfigError, DataError, one_line
from sparse_runner.io import atomic_directory, atomic_open
from sparse_runner.tasks.sequence_splits import PackedSplit

logger = logging.getLogger(__name__)

# ----------------------------------------------------------------------------------------------------
# Vocabulary
# ----------------------------------------------------------------------------------------------------

PAD_ID = 0
OPERATORS: tuple[str, ...] = ("MIN", "MAX", "MED", "SM")
END_TOKEN = "X"  # what the closing "]" becomes after tokenisation
#: id 0 = padding, ids 1..10 = digits "0".."9", ids 11..14 = operators, id 15 = "X" (the closing "]").
VOCAB: tuple[str, ...] = ("<pad>",) + tuple(str(d) for d in range(10)) + OPERATORS + (END_TOKEN,)
TOKEN_TO_ID: dict[str, int] = {token: i for i, token in enumerate(VOCAB)}
NUM_CLASSES = 10
SPLITS: tuple[str, ...] = ("train", "val", "test")

#: Probability that a node (above max_depth) becomes an operator; LRA's VALUE_P = 0.25 means
#: "r > 0.25 -> leaf", so an operator is drawn when r <= 0.25.
VALUE_P = 0.25

# Bumped whenever the generator or the tokeniser changes what a given seed / file produces, so that
# old caches (whose directory names hash this) are not reused.
_DATA_FORMAT_VERSION = 1

# Source-text token -> id, after "(" and ")" are deleted. One lookup implements LRA's rules
# ("]" -> "X", "[MAX" -> "MAX"). Bare "MAX" / "X" are accepted too: LRA's pipeline would map them to
# the same vocabulary entries.
_SOURCE_TOKEN_TO_ID: dict[str, int] = dict(TOKEN_TO_ID)
del _SOURCE_TOKEN_TO_ID["<pad>"]
_SOURCE_TOKEN_TO_ID.update({"[" + op: TOKEN_TO_ID[op] for op in OPERATORS})
_SOURCE_TOKEN_TO_ID["]"] = TOKEN_TO_ID[END_TOKEN]
_DELETE_PARENS = str.maketrans("", "", "()")
_VALID_SOURCE_TOKENS = " ".join([str(d) for d in range(10)] + ["[" + op for op in OPERATORS] + ["]", "(", ")"])

Tree = Union[int, tuple]  # int leaf, or (op: str, children: tuple[Tree, ...])


# ----------------------------------------------------------------------------------------------------
# Trees
# ----------------------------------------------------------------------------------------------------


class _TooLong(Exception):
    """Raised inside the sampler once a tree has reached max_length (it can no longer be kept)."""


def _make_tree_sampler(rng: random.Random, *, max_depth: int, max_args: int, length_limit: float):
    """Return ``sample() -> (tree, length)`` drawing LRA trees from ``rng``.

    ``sample`` raises ``_TooLong`` once the running length reaches ``length_limit`` (checked at each
    operator node): such a tree would be rejected anyway, and stopping early skips the (heavy-tailed)
    work of finishing it. This keeps the
    distribution of kept trees exactly LRA's: the draws are i.i.d., so restarting after a stopping time
    gives the same independent sequence of trees; only *which* trees a given seed yields differs from a
    sampler that finishes every tree.

    Written as a closure over local names because this is the hot loop of data generation.
    """
    uniform = rng.random
    extra_args = max_args - 1  # number of possible child counts 2..max_args
    operators = OPERATORS
    num_ops = len(operators)
    length = 0

    def operator_node(depth: int) -> tuple:
        """An operator node at ``depth`` (the caller has already decided it is not a leaf)."""
        nonlocal length
        length += 2  # the operator token and its closing "]"
        if length >= length_limit:
            raise _TooLong
        # LRA draws the argument count with Python's random.randint(2, max_args), which is
        # INCLUSIVE: 2..max_args children (checked against lra_benchmarks/data/listops.py, which
        # imports the stdlib `random`, not numpy). We follow the released generator. Drawn as
        # 2 + int(u * (max_args - 1)) because rng.randint costs more than the rest of the node.
        num_children = 2 + int(uniform() * extra_args)
        child_depth = depth + 1
        # At depth == max_depth a leaf is forced and, as in LRA, no random number is drawn for it.
        can_branch = child_depth < max_depth
        children = []
        # Children are drawn inline rather than by a call per child: most nodes are leaves, and a
        # Python call per leaf was the largest cost of generation.
        for _ in range(num_children):
            if can_branch and uniform() <= VALUE_P:  # LRA: r > VALUE_P -> leaf
                children.append(operator_node(child_depth))
            else:
                length += 1
                children.append(int(uniform() * 10))  # uniform digit 0-9 (cheaper than rng.choice)
        if length >= length_limit:
            raise _TooLong
        # Uniform over the four operators; int(u * n) has a bias of order 2**-53, i.e. none.
        return (operators[int(uniform() * num_ops)], tuple(children))

    def sample() -> tuple[Tree, int]:
        nonlocal length
        length = 0
        # LRA starts the recursion at depth 1; the root follows the same leaf/operator rule.
        if 1 < max_depth and uniform() <= VALUE_P:
            return operator_node(1), length
        return int(uniform() * 10), 1

    return sample


def generate_tree(rng: random.Random, *, max_depth: int, max_args: int) -> Tree:
    """Draw one LRA ListOps tree (no length limit). Mainly for tests and exploration."""
    _check_tree_params(max_depth=max_depth, max_args=max_args)
    tree, _ = _make_tree_sampler(rng, max_depth=max_depth, max_args=max_args, length_limit=float("inf"))()
    return tree


def _median_truncated(values: list[int]) -> int:
    """``int(np.median(values))`` without numpy's per-call overhead (values are non-negative ints).

    For an even count numpy's median is the mean of the two middle values; int() truncates it, which for
    non-negative numbers is floor division.
    """
    ordered = sorted(values)
    n = len(ordered)
    mid = n // 2
    if n % 2:
        return ordered[mid]
    return (ordered[mid - 1] + ordered[mid]) // 2


def evaluate(tree: Tree) -> int:
    """Value (0-9) of a tree: MIN, MAX, MED = int(np.median) (truncated), SM = sum % 10."""
    if isinstance(tree, int):
        return tree
    op, children = tree
    # Leaves inline (most children are leaves; a call each would dominate the cost).
    values = [child if child.__class__ is int else evaluate(child) for child in children]
    if op == "MIN":
        return min(values)
    if op == "MAX":
        return max(values)
    if op == "MED":
        return _median_truncated(values)
    if op == "SM":
        return sum(values) % 10
    raise ValueError(f"unknown ListOps operator {op!r}; expected one of {', '.join(OPERATORS)}")


def tree_length(tree: Tree) -> int:
    """Number of tokens after tokenisation: 1 per leaf, 2 per operator node (operator and ``]``)."""
    if isinstance(tree, int):
        return 1
    return 2 + sum(tree_length(child) for child in tree[1])


_DIGIT_TEXT = tuple(str(d) for d in range(10))


def _serialise(tree: tuple, out: list[str]) -> None:
    """Append the text pieces of operator node ``tree`` to ``out`` (joined with spaces by the caller)."""
    op, children = tree
    # LRA nests an operator with children c1..ck as ((...((op c1) c2)...ck) ]) and writes every binary
    # pair (A, B) as "( A B )": so k+1 opening parentheses, then "[op", then each child followed by
    # the ")" that closes its pair, then "] )".
    out.append("( " * (len(children) + 1) + "[" + op)
    for child in children:
        if child.__class__ is int:  # leaves inline: most nodes are leaves
            out.append(_DIGIT_TEXT[child])
        else:
            _serialise(child, out)
        out.append(")")
    out.append("] )")


def tree_to_string(tree: Tree) -> str:
    """LRA release text of a tree, e.g. MAX(2, 9) -> ``"( ( ( [MAX 2 ) 9 ) ] )"``."""
    if isinstance(tree, int):
        return str(tree)
    out: list[str] = []
    _serialise(tree, out)
    return " ".join(out)


def _check_tree_params(*, max_depth: int, max_args: int) -> None:
    if max_depth < 1:
        raise ConfigError(f"max_depth must be >= 1, got {max_depth}")
    if max_args < 2:
        raise ConfigError(f"max_args must be >= 2 (an operator has 2..max_args children), got {max_args}")


def generate_examples(
    num_examples: int,
    *,
    min_length: int,
    max_length: int,
    max_depth: int,
    max_args: int,
    seed: int,
    max_consecutive_rejects: int = 1_000_000,
) -> list[tuple[str, int]]:
    """Generate ``num_examples`` distinct ``(source_text, label)`` pairs, LRA style.

    A tree is kept only if ``min_length < tree_length < max_length`` (strict, as in LRA) and its text has
    not been seen before. Examples are returned in generation order, so the result is a deterministic
    function of the arguments (LRA instead split in set-iteration order, which is not reproducible).

    Raises ``ConfigError`` for a parameter out of range, and if ``max_consecutive_rejects`` trees in a row
    are rejected, which means the length window is (nearly) impossible for these tree parameters or its
    distinct trees are exhausted.
    """
    if num_examples < 0:
        raise ConfigError(f"num_examples must be >= 0, got {num_examples}")
    if not 0 <= min_length < max_length:
        raise ConfigError(f"need 0 <= min_length < max_length, got min_length={min_length}, max_length={max_length}")
    _check_tree_params(max_depth=max_depth, max_args=max_args)

    rng = random.Random(seed)
    sample = _make_tree_sampler(rng, max_depth=max_depth, max_args=max_args, length_limit=max_length)
    seen: set[str] = set()
    examples: list[tuple[str, int]] = []
    rejects = 0
    while len(examples) < num_examples:
        try:
            tree, length = sample()
        except _TooLong:
            length = max_length  # reached max_length: rejected below
            tree = None
        if length <= min_length or length >= max_length:
            rejects += 1
        else:
            text = tree_to_string(tree)
            if text in seen:
                rejects += 1
            else:
                seen.add(text)
                examples.append((text, evaluate(tree)))
                rejects = 0
        if rejects >= max_consecutive_rejects:
            # The settings, not the code, are at fault: too few distinct trees fit the window.
            raise ConfigError(
                f"ListOps generator rejected {rejects} trees in a row after {len(examples)} of {num_examples} "
                f"examples (min_length={min_length}, max_length={max_length}, max_depth={max_depth}, "
                f"max_args={max_args}): too few distinct trees fit; widen the length window or ask for fewer examples"
            )
    return examples


# ----------------------------------------------------------------------------------------------------
# Tokenisation
# ----------------------------------------------------------------------------------------------------


def _source_token_ids(source: str) -> list[int]:
    tokens = source.translate(_DELETE_PARENS).split()
    try:
        return [_SOURCE_TOKEN_TO_ID[token] for token in tokens]
    except KeyError as err:
        raise ValueError(
            f"unknown ListOps token {err.args[0]!r}; valid tokens are: {_VALID_SOURCE_TOKENS}"
        ) from None


def tokenize(source: str) -> list[int]:
    """Ids (see ``VOCAB``) of one source text, following LRA's input pipeline.

    ``(`` and ``)`` are deleted (even when glued to other tokens), ``]`` becomes ``X``, the leading
    ``[`` of an operator is stripped, and the rest is split on whitespace.
    An unknown token raises ``ValueError`` (one line naming it and the valid tokens).
    """
    return _source_token_ids(source)


# ----------------------------------------------------------------------------------------------------
# TSV files (official release format)
# ----------------------------------------------------------------------------------------------------

TSV_HEADER = "Source\tTarget"
_LABEL_TEXT = {str(d): d for d in range(NUM_CLASSES)}


def write_tsv(path: str | os.PathLike, rows: Iterable[tuple[str, int]]) -> None:
    """Write ``rows`` as ``Source<TAB>Target`` lines under that header, atomically."""
    with atomic_open(path, "w") as handle:
        handle.write(TSV_HEADER + "\n")
        for source, label in rows:
            if "\t" in source or "\n" in source:
                raise ValueError(f"{path}: a ListOps source must not contain tabs or newlines")
            handle.write(f"{source}\t{int(label)}\n")


_EXPECTED_ROW = "expected 'Source<TAB>Target' rows: a ListOps expression, a tab, a label 0-9"


def _iter_tsv(path: str | os.PathLike) -> Iterator[tuple[int, str, int]]:
    """Yield ``(line_number, source, label)`` of a release-format TSV file, validating as it goes.

    Every problem raises ``DataError`` naming the file and, where there is one, the line."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: ListOps TSV file not found; expected a file with the header 'Source<TAB>Target'")
    # Binary lines decoded one by one, so that a bad byte is reported with its line number. The official
    # files were written by csv.writer and end their lines with "\r\n"; "\n" alone is accepted too.
    line_number = 0
    with open(path, "rb") as handle:
        for line_number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise DataError(f"{path}:{line_number}: not UTF-8 text ({err.reason} at byte {err.start}); {_EXPECTED_ROW}") from None
            line = line.rstrip("\n").removesuffix("\r")
            if line_number == 1:
                header = line.removeprefix("\ufeff")  # a byte-order mark some editors write
                if header != TSV_HEADER:
                    raise DataError(f"{path}:1: expected the header 'Source<TAB>Target', got {header[:60]!r}")
                continue
            fields = line.split("\t")
            if len(fields) != 2:
                what = "an empty line" if line.strip() == "" else f"{len(fields)} tab-separated fields"
                raise DataError(f"{path}:{line_number}: {what}; {_EXPECTED_ROW}")
            source, label_text = fields
            if source.strip() == "":
                raise DataError(f"{path}:{line_number}: empty Source; {_EXPECTED_ROW}")
            label = _LABEL_TEXT.get(label_text)
            if label is None:
                label = _parse_label(label_text, f"{path}:{line_number}")
            yield line_number, source, label
    if line_number == 0:
        raise DataError(f"{path}:1: the file is empty; expected the header 'Source<TAB>Target' and one row per example")
    if line_number == 1:
        # A split without examples would train on nothing or score 0 of 0 as accuracy 0.0.
        raise DataError(f"{path}: no examples (only the header); {_EXPECTED_ROW}, one per line")


def _parse_label(text: str, where: str) -> int:
    """A label written other than as one digit ("05", " 5"), or the DataError saying why it is none."""
    try:
        value = int(text)
    except ValueError:
        raise DataError(f"{where}: label {text[:20]!r} is not an integer; expected an integer 0-9 in Target") from None
    if not 0 <= value < NUM_CLASSES:
        raise DataError(f"{where}: label {value} is out of range; expected an integer 0-9 in Target")
    return value


def read_tsv(path: str | os.PathLike) -> list[tuple[str, int]]:
    """Read a release-format TSV file into ``(source, label)`` pairs.

    A missing or empty file, a missing or wrong header, no example row, a line without exactly 2
    tab-separated fields, an empty source, or a label that is not an integer 0-9 raises ``DataError``
    (a ``ValueError``) naming the file and line.
    """
    return [(source, label) for _, source, label in _iter_tsv(path)]


# ----------------------------------------------------------------------------------------------------
# Tokenised splits
# ----------------------------------------------------------------------------------------------------


class TokenizedSplit(PackedSplit):
    """All sequences of one ListOps split, concatenated (a `PackedSplit` whose ids and labels are checked
    against ListOps' vocabulary and classes).

    tokens:  (total_tokens,) uint8  ids from ``VOCAB`` (no padding inside)
    offsets: (n + 1,) int64        sequence i is ``tokens[offsets[i]:offsets[i + 1]]``
    labels:  (n,) int64            values 0-9
    """

    def __post_init__(self) -> None:
        self.tokens = np.asarray(self.tokens, dtype=np.uint8)
        super().__post_init__()

    def _problem(self) -> str | None:
        problem = super()._problem()
        if problem:
            return problem
        if len(self.labels) and self.labels.max() >= NUM_CLASSES:
            return f"labels must be in 0..{NUM_CLASSES - 1}"
        if len(self.tokens) and self.tokens.max() >= len(VOCAB):
            return f"token ids must be < {len(VOCAB)}"
        return None

    @classmethod
    def from_rows(cls, rows: Iterable[tuple[str, int]]) -> "TokenizedSplit":
        """Tokenise ``(source, label)`` pairs (``DataError`` naming the row for an unknown token)."""
        return cls._from_numbered(((i, source, label) for i, (source, label) in enumerate(rows)), where="row ")

    @classmethod
    def _from_numbered(cls, rows: Iterable[tuple[int, str, int]], *, where: str) -> "TokenizedSplit":
        # A bytearray holds one byte per token: the full LRA train split (~10^8 tokens) would take
        # several GB as a Python list of ints.
        tokens = bytearray()
        offsets = [0]
        labels: list[int] = []
        for number, source, label in rows:
            try:
                tokens.extend(_source_token_ids(source))
            except ValueError as err:
                raise DataError(f"{where}{number}: {err}") from None
            offsets.append(len(tokens))
            labels.append(label)
        return cls(np.frombuffer(bytes(tokens), dtype=np.uint8).copy(), np.array(offsets), np.array(labels))


# ----------------------------------------------------------------------------------------------------
# Preparation with a cache
# ----------------------------------------------------------------------------------------------------


def _official_files(data_dir: Path) -> dict[str, Path]:
    return {split: data_dir / f"basic_{split}.tsv" for split in SPLITS}


def _short_hash(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def _load_cache(directory: Path) -> dict[str, TokenizedSplit] | None:
    """The cached splits in ``directory``, or None if it does not exist."""
    if not directory.is_dir():
        return None
    paths = {split: directory / f"tokens_{split}.npz" for split in SPLITS}
    missing = [p.name for p in paths.values() if not p.is_file()]
    # An incomplete or unreadable cache cannot come from this module (directories are renamed into place
    # only when complete): a file was deleted or damaged from outside. The directory is rebuilt once gone.
    if missing:
        raise DataError(
            f"ListOps cache {directory} is incomplete (missing {', '.join(missing)}); "
            f"delete that directory (rm -r {directory}) and rerun to rebuild it"
        )
    try:
        splits = {split: TokenizedSplit.load(path) for split, path in paths.items()}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise DataError(
            f"ListOps cache {directory} is unreadable ({one_line(err)}); "
            f"delete that directory (rm -r {directory}) and rerun to rebuild it"
        ) from None
    empty = [split for split, data in splits.items() if len(data) == 0]
    if empty:
        # Written before files without examples were refused; rebuilding reports the file itself.
        raise DataError(
            f"ListOps cache {directory} holds no {'/'.join(empty)} examples; "
            f"delete that directory (rm -r {directory}) and rerun to rebuild it"
        )
    logger.info("ListOps: loaded cache from %s (%s examples)", directory, "/".join(str(len(s)) for s in splits.values()))
    return splits


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
    directory = cache_root / f"official-{_short_hash(identity)}"
    cached = _load_cache(directory)
    if cached is not None:
        return cached

    start = time.perf_counter()
    splits = {split: TokenizedSplit._from_numbered(_iter_tsv(path), where=f"{path}:") for split, path in files.items()}
    with atomic_directory(directory) as tmp:
        for split, data in splits.items():
            data.save(tmp / f"tokens_{split}.npz")
    logger.info(
        "ListOps: tokenised official files from %s (%s examples) in %.1f s; cached in %s",
        data_dir, "/".join(str(len(s)) for s in splits.values()), time.perf_counter() - start, directory,
    )
    return splits


def _prepare_generated(cache_root: Path, params: dict) -> dict[str, TokenizedSplit]:
    directory = cache_root / f"generated-{_short_hash({'version': _DATA_FORMAT_VERSION, **params})}"
    cached = _load_cache(directory)
    if cached is not None:
        return cached

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
    # Everything is written into a temporary directory that is renamed into place at the end, so a
    # generation killed half-way leaves no directory that a later call would take for a cache.
    with atomic_directory(directory) as tmp:
        splits: dict[str, TokenizedSplit] = {}
        begin = 0
        for split in SPLITS:
            rows = examples[begin : begin + counts[split]]
            begin += counts[split]
            write_tsv(tmp / f"basic_{split}.tsv", rows)  # same format as the release, for inspection
            splits[split] = TokenizedSplit.from_rows(rows)
            splits[split].save(tmp / f"tokens_{split}.npz")
        with atomic_open(tmp / "params.json", "w") as handle:
            json.dump({"version": _DATA_FORMAT_VERSION, **params}, handle, indent=2)
            handle.write("\n")
    logger.info(
        "ListOps: generated %d examples in %.1f s (%.0f/s); wrote %s",
        total, elapsed, total / elapsed if elapsed > 0 else float("inf"), directory,
    )
    return splits


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
