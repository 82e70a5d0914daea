"""Tests of the ListOps generator, tokeniser, TSV files and cache (sparse_runner.data.listops_generator,
listops_files and listops_splits).

Labels are checked with a stack machine written here over the token ids, independent of
``listops_generator.evaluate``, and lengths are computed from the token lists, not from ``tree_length``.
"""

from __future__ import annotations

import logging
import os
import random
import shutil

import numpy as np
import pytest

from sparse_runner.checks import ConfigError, DataError
from sparse_runner.data import listops_files as lf
from sparse_runner.data import listops_generator as lg
from sparse_runner.data import listops_splits as ls

# Small settings: hundreds of examples in milliseconds.
SMALL = dict(min_length=20, max_length=120, max_depth=10, max_args=10)
TINY_CFG = dict(num_train=40, num_val=10, num_test=10, seed=7, **SMALL)

ID = lf.TOKEN_TO_ID
OP_IDS = {ID[op]: op for op in ("MIN", "MAX", "MED", "SM")}
DIGIT_IDS = {ID[str(d)]: d for d in range(10)}


def stack_value(ids: list[int]) -> int:
    """Evaluate a tokenised ListOps sequence with a stack (independent of listops_generator.evaluate)."""
    stack: list = []
    for i in ids:
        if i in OP_IDS:
            stack.append(("op", OP_IDS[i]))
        elif i in DIGIT_IDS:
            stack.append(DIGIT_IDS[i])
        elif i == ID["X"]:
            args = []
            while not isinstance(stack[-1], tuple):
                args.append(stack.pop())
            _, op = stack.pop()
            assert len(args) >= 2, "an operator needs at least two arguments"
            if op == "MIN":
                value = min(args)
            elif op == "MAX":
                value = max(args)
            elif op == "MED":
                value = int(np.median(args))
            else:
                value = int(np.sum(args)) % 10
            stack.append(value)
        else:
            raise AssertionError(f"unexpected id {i}")
    assert len(stack) == 1 and isinstance(stack[0], int), stack
    return stack[0]


def ids_of(*tokens: str) -> list[int]:
    return [ID[t] for t in tokens]


def assert_splits_equal(a: dict, b: dict) -> None:
    assert set(a) == set(b) == set(ls.SPLITS)
    for split in ls.SPLITS:
        np.testing.assert_array_equal(a[split].tokens, b[split].tokens)
        np.testing.assert_array_equal(a[split].offsets, b[split].offsets)
        np.testing.assert_array_equal(a[split].labels, b[split].labels)


def assert_one_line_error(excinfo, *needles: str) -> None:
    message = str(excinfo.value)
    assert "\n" not in message, message
    for needle in needles:
        assert needle in message, (needle, message)


# ----------------------------------------------------------------------------------------------------
# Vocabulary, serialisation, tokenisation
# ----------------------------------------------------------------------------------------------------


def test_vocab_layout():
    assert lf.VOCAB[0] == "<pad>" and lf.PAD_ID == 0
    assert lf.VOCAB[1:11] == tuple(str(d) for d in range(10))
    assert lf.VOCAB[11:] == ("MIN", "MAX", "MED", "SM", "X")
    assert lf.NUM_CLASSES == 10


def test_stack_machine_itself():
    # Guard the reference: MED of an even count is the truncated mean of the two middle values.
    assert stack_value(ids_of("MED", "1", "2", "X")) == 1
    assert stack_value(ids_of("MED", "3", "9", "0", "8", "X")) == 5  # median 5.5 -> 5
    assert stack_value(ids_of("SM", "5", "7", "9", "X")) == 1
    assert stack_value(ids_of("MAX", "2", "MIN", "4", "7", "X", "0", "X")) == 4


def test_serialisation_example_and_tokens():
    text = lg.tree_to_string(("MAX", (2, 9)))
    assert text == "( ( ( [MAX 2 ) 9 ) ] )"
    assert lf.tokenize(text) == ids_of("MAX", "2", "9", "X")
    nested = ("MIN", (("MAX", (2, 9)), 3))
    assert lg.tree_to_string(nested) == "( ( ( [MIN ( ( ( [MAX 2 ) 9 ) ] ) ) 3 ) ] )"
    assert lf.tokenize(lg.tree_to_string(nested)) == ids_of("MIN", "MAX", "2", "9", "X", "3", "X")
    assert lg.tree_to_string(5) == "5"


def test_tokenize_rules():
    # Parentheses are deleted even when glued to other tokens; "]" becomes X; "[" of operators goes.
    assert lf.tokenize("((( [SM 1 )(4 )] )") == ids_of("SM", "1", "4", "X")
    assert lf.tokenize("  [MED\t3  0 ]\n") == ids_of("MED", "3", "0", "X")
    assert "(" not in lf.VOCAB and ")" not in lf.VOCAB and "]" not in lf.VOCAB


@pytest.mark.parametrize("bad", ["[FIRST", "[", "10", "[5", "max"])
def test_tokenize_unknown_token_is_one_line_error(bad):
    with pytest.raises(ValueError) as excinfo:
        lf.tokenize(f"( ( ( [MAX 2 ) {bad} ) ] )")
    assert_one_line_error(excinfo, repr(bad), "[MAX", "]")


# ----------------------------------------------------------------------------------------------------
# Trees and the generator
# ----------------------------------------------------------------------------------------------------


def test_random_trees_length_value_and_text_agree():
    rng = random.Random(0)
    for _ in range(300):
        tree = lg.generate_tree(rng, max_depth=5, max_args=6)
        ids = lf.tokenize(lg.tree_to_string(tree))
        assert lg.tree_length(tree) == len(ids)
        assert lg.evaluate(tree) == stack_value(ids)


def test_child_count_is_2_to_max_args_inclusive_and_depth_capped():
    # LRA's generator calls Python's random.randint(2, max_args): both ends included.
    counts, depths = set(), set()

    def walk(tree, depth):
        depths.add(depth)
        if not isinstance(tree, int):
            counts.add(len(tree[1]))
            for child in tree[1]:
                walk(child, depth + 1)

    rng = random.Random(1)
    for _ in range(2000):
        walk(lg.generate_tree(rng, max_depth=3, max_args=4), 1)
    assert counts == {2, 3, 4}
    assert max(depths) == 3  # leaves are forced at depth == max_depth


@pytest.mark.parametrize(
    "params",
    [SMALL, dict(min_length=10, max_length=60, max_depth=6, max_args=5), dict(min_length=3, max_length=8, max_depth=3, max_args=3)],
)
def test_generated_examples_bounds_labels_and_uniqueness(params):
    examples = lg.generate_examples(300, seed=3, **params)
    assert len(examples) == 300
    assert len({source for source, _ in examples}) == 300
    for source, label in examples:
        ids = lf.tokenize(source)
        assert params["min_length"] < len(ids) < params["max_length"], len(ids)
        assert label == stack_value(ids)
        assert 0 <= label <= 9


def test_generator_is_deterministic_per_seed():
    a = lg.generate_examples(100, seed=11, **SMALL)
    b = lg.generate_examples(100, seed=11, **SMALL)
    c = lg.generate_examples(100, seed=12, **SMALL)
    assert a == b
    assert a != c
    # A prefix of a longer request is the shorter request (generation order).
    assert lg.generate_examples(150, seed=11, **SMALL)[:100] == a


def test_impossible_window_fails_instead_of_looping():
    # Only single digits have length 1: at most 10 distinct examples exist.
    # The settings are at fault, so it is a ConfigError (exit 2 on the command line), not a crash.
    with pytest.raises(ConfigError, match="rejected") as excinfo:
        lg.generate_examples(11, min_length=0, max_length=2, max_depth=10, max_args=10, seed=0,
                             max_consecutive_rejects=10_000)
    assert_one_line_error(excinfo, "after 10 of 11", "min_length=0", "max_length=2", "widen the length window")


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(num_examples=1, min_length=10, max_length=10, max_depth=10, max_args=10), "min_length < max_length"),
        (dict(num_examples=1, min_length=1, max_length=10, max_depth=10, max_args=1), "max_args must be >= 2"),
        (dict(num_examples=1, min_length=1, max_length=10, max_depth=0, max_args=3), "max_depth must be >= 1"),
        (dict(num_examples=-1, min_length=1, max_length=10, max_depth=3, max_args=3), "num_examples must be >= 0"),
    ],
)
def test_generator_rejects_bad_parameters(kwargs, needle):
    with pytest.raises(ConfigError) as excinfo:
        lg.generate_examples(seed=0, **kwargs)
    assert_one_line_error(excinfo, needle)


# ----------------------------------------------------------------------------------------------------
# TSV files
# ----------------------------------------------------------------------------------------------------


def test_tsv_round_trip(tmp_path):
    rows = lg.generate_examples(30, seed=2, **SMALL)
    path = tmp_path / "sub" / "basic_train.tsv"
    lf.write_tsv(path, rows)
    assert path.read_text().splitlines()[0] == "Source\tTarget"
    assert lf.read_tsv(path) == rows
    assert [p.name for p in path.parent.iterdir()] == ["basic_train.tsv"]  # no temporary left


def test_read_official_format_written_by_hand(tmp_path):
    # As csv.writer wrote the release: "\r\n" line ends.
    path = tmp_path / "basic_val.tsv"
    path.write_bytes(
        b"Source\tTarget\r\n"
        b"( ( ( [MAX 2 ) 9 ) ] )\t9\r\n"
        b"( ( ( [MED ( ( ( [SM 5 ) 7 ) ] ) ) 8 ) ] )\t5\r\n"
    )
    rows = lf.read_tsv(path)
    assert rows == [("( ( ( [MAX 2 ) 9 ) ] )", 9), ("( ( ( [MED ( ( ( [SM 5 ) 7 ) ] ) ) 8 ) ] )", 5)]
    for source, label in rows:
        assert stack_value(lf.tokenize(source)) == label


# (content, line, what the message must say): each names the problem and what is expected.
MALFORMED_TSV = [
    ("", 1, ["the file is empty", "expected the header 'Source<TAB>Target'"]),
    ("( ( ( [MAX 2 ) 9 ) ] )\t9\n", 1, ["expected the header 'Source<TAB>Target'", "got '( ( ( [MAX"]),  # no header
    ("Source,Target\n[MAX 1 2 ]\t2\n", 1, ["expected the header", "got 'Source,Target'"]),
    ("Source\tTarget\n( ( ( [MAX 2 ) 9 ) ] )\t9\n[MAX 1 ]\n", 3, ["1 tab-separated fields", "expected 'Source<TAB>Target' rows"]),
    ("Source\tTarget\n[MAX 1 2 ]\t2\textra\n", 2, ["3 tab-separated fields", "expected 'Source<TAB>Target' rows"]),
    ("Source\tTarget\n[MAX 1 2 ]\t10\n", 2, ["label 10 is out of range", "expected an integer 0-9"]),
    ("Source\tTarget\n[MAX 1 2 ]\t-1\n", 2, ["label -1 is out of range", "expected an integer 0-9"]),
    ("Source\tTarget\n[MAX 1 2 ]\tx\n", 2, ["label 'x' is not an integer", "expected an integer 0-9"]),
    ("Source\tTarget\n[MAX 1 2 ]\t2.0\n", 2, ["label '2.0' is not an integer", "expected an integer 0-9"]),
    ("Source\tTarget\n[MAX 1 2 ]\t\n", 2, ["label '' is not an integer", "expected an integer 0-9"]),
    ("Source\tTarget\n \t2\n", 2, ["empty Source", "expected 'Source<TAB>Target' rows"]),
    ("Source\tTarget\n[MAX 1 2 ]\t2\n\n", 3, ["an empty line", "expected 'Source<TAB>Target' rows"]),  # blank line
]


@pytest.mark.parametrize("content, line, needles", MALFORMED_TSV)
def test_malformed_tsv_is_one_line_data_error_naming_file_and_line(tmp_path, content, line, needles):
    path = tmp_path / "bad.tsv"
    path.write_text(content)
    with pytest.raises(DataError) as excinfo:
        lf.read_tsv(path)
    assert_one_line_error(excinfo, f"{path}:{line}:", *needles)


def test_header_only_tsv_is_refused(tmp_path):
    # Read as zero examples, it trained on nothing and reported accuracy 0.0 over 0 examples.
    for ending in ("\n", "\r\n", ""):
        path = tmp_path / "header_only.tsv"
        path.write_text("Source\tTarget" + ending, newline="")
        with pytest.raises(DataError) as excinfo:
            lf.read_tsv(path)
        assert str(excinfo.value).startswith(f"{path}: no examples (only the header); expected ")
        assert_one_line_error(excinfo)


def test_non_utf8_tsv_names_the_line(tmp_path):
    path = tmp_path / "latin1.tsv"
    path.write_bytes(b"Source\tTarget\n( ( ( [MAX 2 ) 9 ) ] )\t9\n( ( ( [MAX 2 ) 9 ) ] )\xe9\t9\n")
    with pytest.raises(DataError) as excinfo:
        lf.read_tsv(path)
    assert_one_line_error(excinfo, f"{path}:3:", "not UTF-8")


def test_tolerated_variants_of_the_release_format(tmp_path):
    # A byte-order mark before the header and a label written with a leading zero are still a 0-9 label.
    path = tmp_path / "variants.tsv"
    path.write_bytes("\ufeffSource\tTarget\r\n( ( ( [MAX 2 ) 9 ) ] )\t09\r\n".encode("utf-8"))
    assert lf.read_tsv(path) == [("( ( ( [MAX 2 ) 9 ) ] )", 9)]


def test_missing_tsv_is_data_error(tmp_path):
    with pytest.raises(DataError) as excinfo:
        lf.read_tsv(tmp_path / "nope.tsv")
    assert_one_line_error(excinfo, "nope.tsv", "not found", "expected a file with the header")


# ----------------------------------------------------------------------------------------------------
# TokenizedSplit
# ----------------------------------------------------------------------------------------------------


def test_tokenized_split_layout_and_npz_round_trip(tmp_path):
    rows = [("( ( ( [MAX 2 ) 9 ) ] )", 9), ("7", 7), ("( ( ( [SM 5 ) 7 ) ] )", 2)]
    split = lf.TokenizedSplit.from_rows(rows)
    assert len(split) == 3
    assert split.tokens.dtype == np.uint8 and split.offsets.dtype == np.int64 and split.labels.dtype == np.int64
    np.testing.assert_array_equal(split.lengths(), [4, 1, 4])
    assert split.lengths().dtype == np.int64
    assert split.sequence(2).tolist() == ids_of("SM", "5", "7", "X")
    assert split.sequence(-2).tolist() == ids_of("7")
    np.testing.assert_array_equal(split.labels, [9, 7, 2])
    with pytest.raises(IndexError):
        split.sequence(3)

    path = tmp_path / "tokens.npz"
    split.save(path)
    loaded = lf.TokenizedSplit.load(path)
    assert_splits_equal({s: split for s in ls.SPLITS}, {s: loaded for s in ls.SPLITS})
    assert loaded.tokens.dtype == np.uint8


def test_tokenized_split_rejects_inconsistent_arrays(tmp_path):
    path = tmp_path / "broken.npz"
    np.savez(path, tokens=np.zeros(3, np.uint8), offsets=np.array([0, 2, 5]), labels=np.array([1, 2]))
    with pytest.raises(ValueError, match="broken.npz"):
        lf.TokenizedSplit.load(path)
    with pytest.raises(DataError, match="row 1"):
        lf.TokenizedSplit.from_rows([("1", 1), ("[FIRST 1 2 ]", 1)])


# ----------------------------------------------------------------------------------------------------
# prepare_listops: official files
# ----------------------------------------------------------------------------------------------------

OFFICIAL = {
    "train": [("( ( ( [MAX 2 ) 9 ) ] )", 9), ("( ( ( [MIN 4 ) 1 ) ] )", 1)],
    "val": [("( ( ( [SM 5 ) 7 ) ] )", 2)],
    "test": [("( ( ( [MED 3 ) 8 ) ] )", 5)],
}


def write_official(data_dir, rows_by_split=OFFICIAL):
    data_dir.mkdir(parents=True, exist_ok=True)
    for split, rows in rows_by_split.items():
        lines = ["Source\tTarget"] + [f"{s}\t{t}" for s, t in rows]
        (data_dir / f"basic_{split}.tsv").write_text("\r\n".join(lines) + "\r\n")


def prepare(tmp_path, data_dir=None, **overrides):
    cfg = dict(TINY_CFG, **overrides)
    return ls.prepare_listops(data_dir=data_dir, cache_dir=tmp_path / "cache", **cfg)


def test_official_files_are_read_and_not_truncated(tmp_path):
    write_official(tmp_path / "lra")
    # max_length=3 is shorter than every official sequence: they must be kept whole.
    splits = prepare(tmp_path, data_dir=tmp_path / "lra", max_length=3, min_length=0)
    assert splits["train"].sequence(0).tolist() == ids_of("MAX", "2", "9", "X")
    np.testing.assert_array_equal(splits["train"].labels, [9, 1])
    np.testing.assert_array_equal(splits["val"].labels, [2])
    assert splits["test"].sequence(0).tolist() == ids_of("MED", "3", "8", "X")
    assert len(list((tmp_path / "cache" / "listops").glob("official-*"))) == 1


def test_missing_official_file_names_expected_files(tmp_path):
    write_official(tmp_path / "lra", {"train": OFFICIAL["train"], "test": OFFICIAL["test"]})
    with pytest.raises(DataError) as excinfo:
        prepare(tmp_path, data_dir=tmp_path / "lra")
    assert_one_line_error(excinfo, f"missing {tmp_path / 'lra' / 'basic_val.tsv'};", "basic_train.tsv", "basic_test.tsv")


def test_bad_token_in_official_file_names_file_and_line(tmp_path):
    write_official(tmp_path / "lra", dict(OFFICIAL, val=[("( ( ( [SM 5 ) 7 ) ] )", 2), ("[FIRST 1 2 ]", 1)]))
    with pytest.raises(DataError) as excinfo:
        prepare(tmp_path, data_dir=tmp_path / "lra")
    assert_one_line_error(excinfo, f"{tmp_path / 'lra' / 'basic_val.tsv'}:3:", "'[FIRST'", "valid tokens are")
    assert not (tmp_path / "cache" / "listops").exists() or not list((tmp_path / "cache" / "listops").iterdir())


@pytest.mark.parametrize("split", ls.SPLITS)
def test_official_file_with_only_a_header_is_refused(tmp_path, split):
    write_official(tmp_path / "lra", dict(OFFICIAL, **{split: []}))
    path = tmp_path / "lra" / f"basic_{split}.tsv"
    with pytest.raises(DataError) as excinfo:
        prepare(tmp_path, data_dir=tmp_path / "lra")
    assert_one_line_error(excinfo)
    assert str(excinfo.value).startswith(f"{path}: no examples (only the header); expected ")


def test_official_cache_is_reused_and_a_changed_file_is_reread(tmp_path, monkeypatch):
    data_dir = tmp_path / "lra"
    write_official(data_dir)
    first = prepare(tmp_path, data_dir=data_dir)

    def no_reading(*args, **kwargs):
        raise AssertionError("the cache should have been used")

    with monkeypatch.context() as m:
        m.setattr(lf, "_iter_tsv", no_reading)
        assert_splits_equal(first, prepare(tmp_path, data_dir=data_dir))

    val = data_dir / "basic_val.tsv"
    old = val.stat()
    write_official(data_dir, {"val": [("( ( ( [SM 5 ) 6 ) ] )", 1)]})
    os.utime(val, ns=(old.st_atime_ns, old.st_mtime_ns + 1_000_000_000))  # coarse clocks: make sure
    second = prepare(tmp_path, data_dir=data_dir)
    np.testing.assert_array_equal(second["val"].labels, [1])
    assert second["val"].sequence(0).tolist() == ids_of("SM", "5", "6", "X")


# ----------------------------------------------------------------------------------------------------
# prepare_listops: generated data
# ----------------------------------------------------------------------------------------------------


def test_generated_splits_sizes_bounds_labels_and_no_overlap(tmp_path):
    splits = prepare(tmp_path)
    assert [len(splits[s]) for s in ls.SPLITS] == [40, 10, 10]
    seen = set()
    for split in splits.values():
        lengths = split.lengths()
        assert np.all((lengths > SMALL["min_length"]) & (lengths < SMALL["max_length"]))
        for i in range(len(split)):
            seq = split.sequence(i)
            assert stack_value(seq.tolist()) == split.labels[i]
            seen.add(seq.tobytes())
    assert len(seen) == 60  # distinct within and across splits


def test_generated_tsv_files_match_the_arrays(tmp_path):
    splits = prepare(tmp_path)
    (directory,) = (tmp_path / "cache" / "listops").glob("generated-*")
    for split in ls.SPLITS:
        from_file = lf.TokenizedSplit.from_rows(lf.read_tsv(directory / f"basic_{split}.tsv"))
        assert_splits_equal({s: from_file for s in ls.SPLITS}, {s: splits[split] for s in ls.SPLITS})


def test_generated_cache_is_reused_without_generating(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO)
    first = prepare(tmp_path)
    assert "generated 60 examples" in caplog.text

    def no_generation(*args, **kwargs):
        raise AssertionError("the cache should have been used")

    monkeypatch.setattr(ls, "generate_examples", no_generation)
    caplog.clear()
    assert_splits_equal(first, prepare(tmp_path))
    assert "loaded cache" in caplog.text
    # Other parameters are another cache entry (so they do call the generator).
    with pytest.raises(AssertionError, match="cache should have been used"):
        prepare(tmp_path, seed=8)


@pytest.mark.parametrize("split", ls.SPLITS)
def test_generated_split_without_examples_is_refused(tmp_path, split):
    with pytest.raises(ConfigError) as excinfo:
        prepare(tmp_path, **{f"num_{split}": 0})
    assert_one_line_error(excinfo, f"num_{split} must be >= 1", "got 0")


def test_impossible_generator_window_is_a_config_error(tmp_path):
    # Only the ten digits are shorter than 2 tokens: 60 distinct examples cannot exist.
    with pytest.raises(ConfigError) as excinfo:
        prepare(tmp_path, min_length=0, max_length=2)
    assert_one_line_error(excinfo, "rejected", "widen the length window")


# ----------------------------------------------------------------------------------------------------
# prepare_listops: a damaged cache
# ----------------------------------------------------------------------------------------------------


def _damage(directory, how):
    target = directory / "tokens_val.npz"
    if how == "missing":
        target.unlink()
    elif how == "garbage":
        target.write_bytes(b"not an npz file")
    elif how == "truncated":
        target.write_bytes(target.read_bytes()[:100])
    elif how == "empty_split":  # as a cache written before header-only files were refused
        lf.TokenizedSplit(np.zeros(0, np.uint8), np.zeros(1, np.int64), np.zeros(0, np.int64)).save(target)


@pytest.mark.parametrize("how, needle", [
    ("missing", "is incomplete (missing tokens_val.npz)"),
    ("garbage", "is unreadable"),
    ("truncated", "is unreadable"),
    ("empty_split", "holds no val examples"),
])
@pytest.mark.parametrize("source", ["generated", "official"])
def test_damaged_cache_is_one_line_data_error_saying_what_to_delete(tmp_path, how, needle, source):
    data_dir = None
    if source == "official":
        data_dir = tmp_path / "lra"
        write_official(data_dir)
    prepare(tmp_path, data_dir=data_dir)
    (directory,) = (tmp_path / "cache" / "listops").glob(f"{source}-*")
    _damage(directory, how)
    with pytest.raises(DataError) as excinfo:
        prepare(tmp_path, data_dir=data_dir)
    assert_one_line_error(excinfo, f"ListOps cache {directory} ", needle, f"delete that directory (rm -r {directory})")
    shutil.rmtree(directory)  # doing what the message says is enough
    assert len(prepare(tmp_path, data_dir=data_dir)["val"]) == (1 if source == "official" else 10)


def test_same_params_same_data_different_seed_different_data(tmp_path):
    a = prepare(tmp_path / "a")
    b = prepare(tmp_path / "b")
    c = prepare(tmp_path / "c", seed=8)
    assert_splits_equal(a, b)
    assert not np.array_equal(a["train"].tokens, c["train"].tokens)


@pytest.mark.parametrize("where", ["generator", "writing"])
def test_killed_generation_leaves_nothing_usable(tmp_path, monkeypatch, where):
    real_generate = lg.generate_examples
    real_write = lf.write_tsv
    calls = {"generate": 0, "write": 0}

    def generate_then_die(num_examples, **kwargs):
        calls["generate"] += 1
        real_generate(num_examples // 2, **kwargs)  # half-way through...
        raise KeyboardInterrupt  # ...the run is killed

    def write_then_die(path, rows):
        calls["write"] += 1
        real_write(path, rows)
        if calls["write"] == 2:  # two of the three TSV files are written
            raise KeyboardInterrupt

    with monkeypatch.context() as m:
        if where == "generator":
            m.setattr(ls, "generate_examples", generate_then_die)
        else:
            m.setattr(ls, "write_tsv", write_then_die)
        with pytest.raises(KeyboardInterrupt):
            prepare(tmp_path)
    cache_root = tmp_path / "cache" / "listops"
    assert not cache_root.exists() or list(cache_root.iterdir()) == []

    def counting_generate(*args, **kwargs):
        calls["generate"] += 1
        return real_generate(*args, **kwargs)

    before = calls["generate"]
    monkeypatch.setattr(ls, "generate_examples", counting_generate)
    splits = prepare(tmp_path)
    assert calls["generate"] == before + 1  # nothing half-made was taken for a cache
    assert [len(splits[s]) for s in ls.SPLITS] == [40, 10, 10]
