"""Tests of the MNLI data (sparse_runner.data.mnli_pairs, sotu_pairs) and baselines (sparse_runner.tasks.mnli):
the readers on tiny files written here (the MultiNLI 1.0 JSONL layout and GLUE's TSV layout), Hugging
Face rows, the State of the Union substitute (on the whole shipped corpus) and the trivial baselines."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from sparse_runner.checks import ConfigError
from sparse_runner.data.documents import sotu_documents
from sparse_runner.data.mnli_pairs import (
    GLUE_FILES,
    JSONL_FILES,
    LABELS,
    PairSplit,
    find_mnli_files,
    from_hub_rows,
    read_glue_tsv,
    read_mnli_dir,
    read_multinli_jsonl,
    split_of_file,
)
from sparse_runner.data.sotu_pairs import MAX_WORDS, MIN_WORDS, sotu_pairs
from sparse_runner.tasks.mnli import OverlapRule, fit_overlap_rule, majority_baseline, overlap_baseline

# (gold_label, premise, hypothesis, genre); the "-" row has no consensus and is skipped
TRAIN = [
    ("entailment", 'He said "hello" to her.', "He greeted her.", "fiction"),
    ("-", "Nobody agreed on this one.", "Annotators disagreed.", "slate"),
    ("neutral", "The 'report' was late.", 'It was "very" late, "unbalanced', "government"),
    ("contradiction", "Tea is served at five.", "Tea is never served.", "travel"),
]
DEV_MATCHED = [("neutral", "A man walks.", "A man walks to work.", "telephone")]
DEV_MISMATCHED = [("contradiction", "The letter arrived.", "No letter came.", "letters"), ("entailment", "It's 9/11.", "A date.", "nineeleven")]
ROWS = {"train": TRAIN, "validation_matched": DEV_MATCHED, "validation_mismatched": DEV_MISMATCHED}


def one_line(exc_info) -> str:
    message = str(exc_info.value)
    assert "\n" not in message and "\r" not in message, message
    return message


def jsonl_record(gold, s1, s2, genre, i=0) -> dict:
    # the release's fields, unused ones included
    return {
        "annotator_labels": [gold], "genre": genre, "gold_label": gold, "pairID": f"{i}e", "promptID": str(i),
        "sentence1": s1, "sentence1_binary_parse": "( x )", "sentence1_parse": "(ROOT x)",
        "sentence2": s2, "sentence2_binary_parse": "( y )", "sentence2_parse": "(ROOT y)",
    }


def write_jsonl(folder: Path, rows=ROWS) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for split, name in JSONL_FILES.items():
        lines = [json.dumps(jsonl_record(*row, i=i)) for i, row in enumerate(rows[split])]
        (folder / name).write_text("\n".join(lines) + "\n\n", encoding="utf-8")  # a trailing blank line
    return folder


GLUE_TRAIN_HEADER = ["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
                     "sentence1_parse", "sentence2_parse", "sentence1", "sentence2", "label1", "gold_label"]
GLUE_DEV_HEADER = GLUE_TRAIN_HEADER[:-1] + ["label2", "label3", "label4", "label5", "gold_label"]


def glue_line(header, i, gold, s1, s2, genre) -> str:
    values = {"index": str(i), "promptID": str(i), "pairID": f"{i}n", "genre": genre, "sentence1": s1, "sentence2": s2, "gold_label": gold}
    return "\t".join(values.get(column, gold if column.startswith("label") else "( x )") for column in header)


def write_glue(folder: Path, rows=ROWS) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for split, name in GLUE_FILES.items():
        header = GLUE_TRAIN_HEADER if split == "train" else GLUE_DEV_HEADER
        lines = ["\t".join(header)] + [glue_line(header, i, *row) for i, row in enumerate(rows[split])]
        (folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def check_pairs(pairs: dict[str, PairSplit]) -> None:
    assert list(pairs) == ["train", "validation_matched", "validation_mismatched"]
    for split, rows in ROWS.items():
        kept = [r for r in rows if r[0] != "-"]
        got = pairs[split]
        assert len(got) == len(kept)
        assert got.premises == [r[1] for r in kept]
        assert got.hypotheses == [r[2] for r in kept]
        assert got.labels.tolist() == [LABELS.index(r[0]) for r in kept] and got.labels.dtype == np.int64
        assert got.genres == [r[3] for r in kept]
        assert got.matched.dtype == bool and got.matched.tolist() == [split != "validation_mismatched"] * len(kept)
        assert got.skipped == len(rows) - len(kept)


# ---------------------------------------------------------------------------------------------- readers
def test_multinli_jsonl_release(tmp_path, caplog):
    folder = write_jsonl(tmp_path)
    with caplog.at_level("INFO"):
        train = read_multinli_jsonl(folder / JSONL_FILES["train"])
    assert list(train) == ["train"] and train["train"].skipped == 1
    assert "skipped 1 of 4" in caplog.text
    check_pairs(read_mnli_dir(folder))


def test_glue_tsv_with_quote_characters(tmp_path):
    folder = write_glue(tmp_path)
    train = read_glue_tsv(folder / "train.tsv")["train"]
    assert train.hypotheses[1] == 'It was "very" late, "unbalanced'  # quotes are text, even unbalanced
    check_pairs(read_mnli_dir(folder))


@pytest.mark.parametrize("layout", ["jsonl", "glue"])
def test_release_subfolders(tmp_path, layout):
    sub = {"jsonl": "multinli_1.0", "glue": "MNLI"}[layout]
    (write_jsonl if layout == "jsonl" else write_glue)(tmp_path / sub)
    check_pairs(read_mnli_dir(tmp_path))


def test_jsonl_preferred_over_glue(tmp_path):
    write_glue(tmp_path)
    write_jsonl(tmp_path, {**ROWS, "train": ROWS["train"][:1]})
    assert len(read_mnli_dir(tmp_path)["train"]) == 1
    assert find_mnli_files(tmp_path)["train"].name == JSONL_FILES["train"]


def test_split_of_file():
    assert split_of_file("x/multinli_1.0_dev_mismatched.jsonl") == ("validation_mismatched", False)
    assert split_of_file("dev_matched.tsv") == ("validation_matched", True)
    assert split_of_file("multinli_1.0_train.jsonl") == ("train", True)
    assert split_of_file("mine.jsonl") == ("mine", True)


@pytest.mark.parametrize(
    "line, expected",
    [
        ("{not json", "line 2: not JSON"),
        ('["a", "b"]', "line 2: expected a JSON object"),
        (json.dumps({"gold_label": "neutral", "sentence1": "a"}), "line 2: no field sentence2"),
        (json.dumps({"sentence1": "a", "sentence2": "b"}), "unlabelled test file"),
        (json.dumps(jsonl_record("maybe", "a", "b", "fiction")), "gold_label 'maybe' is not a label; valid: entailment, neutral, contradiction, -"),
        (json.dumps(jsonl_record("neutral", None, "b", "fiction")), "line 2: sentence1 must be a string"),
        (json.dumps(jsonl_record(["neutral"], "a", "b", "fiction")), "line 2: gold_label ['neutral'] is not a label"),
    ],
)
def test_jsonl_refusals(tmp_path, line, expected):
    path = tmp_path / "multinli_1.0_train.jsonl"
    path.write_text(json.dumps(jsonl_record(*TRAIN[0])) + "\n" + line + "\n", encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        read_multinli_jsonl(path)
    message = one_line(err)
    assert str(path) in message and expected in message, message


def test_jsonl_not_utf8_and_all_unlabelled(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_bytes(json.dumps(jsonl_record(*TRAIN[0])).encode() + b"\n\xff\xfe{}\n")
    with pytest.raises(ConfigError) as err:
        read_multinli_jsonl(path)
    assert "line 2: not UTF-8" in one_line(err)
    path.write_text(json.dumps(jsonl_record(*TRAIN[1])) + "\n", encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        read_multinli_jsonl(path)
    assert str(path) in one_line(err) and "no labelled pair" in one_line(err)


def test_glue_refusals(tmp_path):
    folder = write_glue(tmp_path)
    # GLUE's test files: no label columns
    test = folder / "test_matched.tsv"
    test.write_text("\t".join(GLUE_TRAIN_HEADER[:10]) + "\n" + "\t".join(["0"] * 10) + "\n", encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        read_glue_tsv(test)
    assert str(test) in one_line(err) and "line 1" in one_line(err) and "unlabelled" in one_line(err)
    # a tab inside a text: one field too many, on line 3
    path = folder / "dev_matched.tsv"
    lines = path.read_text(encoding="utf-8").splitlines()
    path.write_text("\n".join(lines + [glue_line(GLUE_DEV_HEADER, 9, "neutral", "a\tb", "c", "slate")]) + "\n", encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        read_glue_tsv(path)
    assert str(path) in one_line(err) and "line 3: 17 fields, the header has 16" in one_line(err)
    # an unknown label
    path.write_text("\n".join(lines + [glue_line(GLUE_DEV_HEADER, 9, "yes", "a", "c", "slate")]) + "\n", encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        read_glue_tsv(path)
    assert "line 3: gold_label 'yes' is not a label; valid: entailment, neutral, contradiction" in one_line(err)
    # a header without the text columns
    path.write_text("a\tb\tgold_label\n1\t2\tneutral\n", encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        read_glue_tsv(path)
    assert "line 1: the header has no column sentence1, sentence2" in one_line(err)
    path.write_text("", encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        read_glue_tsv(path)
    assert "line 1: the file is empty" in one_line(err)


def test_mnli_dir_refusals(tmp_path):
    with pytest.raises(ConfigError) as err:
        read_mnli_dir(tmp_path / "nowhere")
    assert "not a directory" in one_line(err) and "multinli_1.0_train.jsonl" in one_line(err)
    with pytest.raises(ConfigError) as err:
        read_mnli_dir(tmp_path)
    message = one_line(err)
    assert "no MNLI files" in message
    for name in list(JSONL_FILES.values()) + list(GLUE_FILES.values()):
        assert name in message
    write_glue(tmp_path)
    (tmp_path / "dev_mismatched.tsv").unlink()
    with pytest.raises(ConfigError) as err:
        read_mnli_dir(tmp_path)
    assert "incomplete" in one_line(err) and "lacks dev_mismatched.tsv" in one_line(err)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError) as err:
        read_glue_tsv(tmp_path / "train.tsv")
    assert "no such file" in one_line(err)


# ------------------------------------------------------------------------------------------------- hub
def test_hub_rows():
    rows = [
        {"premise": "p0", "hypothesis": "h0", "label": 2, "genre": "fiction"},
        {"premise": "p1", "hypothesis": "h1", "label": -1, "genre": "slate"},
        {"premise": "p2", "hypothesis": "h2", "label": np.int64(0), "genre": "travel"},
    ]
    pairs = from_hub_rows(rows, matched=False)
    assert pairs.premises == ["p0", "p2"] and pairs.hypotheses == ["h0", "h2"] and pairs.labels.tolist() == [2, 0]
    assert pairs.genres == ["fiction", "travel"] and pairs.matched.tolist() == [False, False] and pairs.skipped == 1
    # GLUE's mnli: no genre; columns instead of rows
    columns = {"premise": ["a", "b"], "hypothesis": ["c", "d"], "label": [1, 1], "idx": [0, 1]}
    pairs = from_hub_rows(columns, matched=True)
    assert pairs.genres == ["", ""] and pairs.matched.all() and pairs.labels.tolist() == [1, 1]


def test_hub_dataset():
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"premise": ["a", "b", "x"], "hypothesis": ["c", "d", "y"], "label": [0, -1, 1], "genre": ["oup", "oup", "verbatim"]})
    pairs = from_hub_rows(ds, matched=False)
    assert pairs.premises == ["a", "x"] and pairs.labels.tolist() == [0, 1] and pairs.genres == ["oup", "verbatim"]


@pytest.mark.parametrize(
    "rows, expected",
    [
        ([{"premise": "a", "hypothesis": "b", "label": 3}], "row 1: label 3 is not a label id; valid: 0 (entailment), 1 (neutral), 2 (contradiction), -1"),
        ([{"premise": "a", "hypothesis": "b", "label": "neutral"}], "row 1: label 'neutral' is not a label id"),
        ([{"premise": "a", "hypothesis": "b", "label": 0}, {"premise": "a", "label": 0}], "row 2: no hypothesis"),
        ([{"premise": None, "hypothesis": "b", "label": 0}], "row 1: premise must be a string"),
        ([{"text": "a", "label": 0}], "no column premise, hypothesis"),
        ([{"premise": "a", "hypothesis": "b", "label": -1}], "all 1 rows are unlabelled"),
    ],
)
def test_hub_refusals(rows, expected):
    with pytest.raises(ConfigError) as err:
        from_hub_rows(rows, matched=True, where="nyu-mll/multi_nli test")
    message = one_line(err)
    assert message.startswith("nyu-mll/multi_nli test: ") and expected in message, message


def test_pair_split():
    a = PairSplit(["p"], ["h"], [1], [True], ["g"], skipped=2)
    b = PairSplit(["q", "r"], ["i", "j"], [0, 2], [False, False], ["", ""])
    both = PairSplit.concat([a, b])
    assert len(both) == 3 and both.premises == ["p", "q", "r"] and both.labels.tolist() == [1, 0, 2]
    assert both.matched.tolist() == [True, False, False] and both.skipped == 2
    assert both.label_counts().tolist() == [1, 1, 1]
    assert both.select(both.matched).premises == ["p"] and both.select([2, 0]).hypotheses == ["j", "h"]
    assert len(PairSplit.concat([])) == 0
    with pytest.raises(ValueError, match="differ in length"):
        PairSplit(["p"], [], [0], [True], ["g"])
    with pytest.raises(ValueError, match="labels must be in 0..2"):
        PairSplit(["p"], ["h"], [3], [True], ["g"])


# ------------------------------------------------------------------------------------------ substitute
@pytest.fixture(scope="module")
def sotu():
    docs = sotu_documents()
    return docs, sotu_pairs(docs, seed=0)


def kept(doc: list[str]) -> list[str]:
    """The sentences the substitute uses, rebuilt here independently of the module."""
    out = []
    for sentence in doc:
        words = sentence.split()
        if len(words) >= MIN_WORDS:
            out.append(" ".join(words[:MAX_WORDS]))
    return out


def test_substitute_sizes_and_balance(sotu):
    docs, pairs = sotu
    assert list(pairs) == ["train", "val", "test"]
    for split, p in pairs.items():
        counts = p.label_counts()
        assert counts[0] == counts[1] == counts[2] > 0, (split, counts)
        assert p.matched.all() and set(p.genres) == {"sotu"} and p.skipped == 0
        # every premise comes with its three hypotheses
        assert len(set(zip(p.premises, p.labels.tolist()))) >= len(p) // 3 * 0.99
        lengths = [len(s.split()) for s in p.premises + p.hypotheses]
        assert min(lengths) >= MIN_WORDS and max(lengths) <= MAX_WORDS
    # nearly every kept sentence with a successor is a premise
    assert len(pairs["train"]) // 3 >= 0.95 * sum(len(kept(d)) - 1 for d in docs["train"])
    assert len(pairs["val"]) > 5000 and len(pairs["test"]) > 5000
    # the first pairs are shuffled: a prefix is not one label
    assert len(set(pairs["val"].labels[:30].tolist())) == 3


def test_substitute_relations_hold(sotu):
    docs, pairs = sotu
    for split, p in pairs.items():
        where: dict[str, set[tuple[int, int]]] = {}
        documents = [kept(d) for d in docs[split]]
        for d, doc in enumerate(documents):
            for i, sentence in enumerate(doc):
                where.setdefault(sentence, set()).add((d, i))
        for premise, hypothesis, label in zip(p.premises, p.hypotheses, p.labels.tolist()):
            assert premise != hypothesis
            pairs_in_docs = [(a, b) for a in where[premise] for b in where[hypothesis] if a[0] == b[0]]
            if label == 0:  # continuation: the next kept sentence of the same speech
                assert any(b[1] == a[1] + 1 for a, b in pairs_in_docs), (split, premise, hypothesis)
            elif label == 1:  # same speech, at least 10 sentences away
                assert any(abs(b[1] - a[1]) >= 10 for a, b in pairs_in_docs), (split, premise, hypothesis)
            else:  # another speech: no speech holds both texts
                assert not pairs_in_docs, (split, premise, hypothesis)


def test_substitute_splits_share_no_sentence(sotu):
    _, pairs = sotu
    texts = {split: set(p.premises) | set(p.hypotheses) for split, p in pairs.items()}
    assert not texts["train"] & texts["test"]
    assert not texts["train"] & texts["val"]
    assert not texts["val"] & texts["test"]


def test_substitute_deterministic(sotu):
    docs, pairs = sotu
    again = sotu_pairs(docs, seed=0)
    for split in ("train", "val", "test"):
        assert again[split].premises == pairs[split].premises and again[split].hypotheses == pairs[split].hypotheses
        assert np.array_equal(again[split].labels, pairs[split].labels)
    other = sotu_pairs({"val": docs["val"]}, seed=1)["val"]
    assert other.hypotheses != pairs["val"].hypotheses


def test_substitute_pairs_per_document(sotu):
    docs, _ = sotu
    capped = sotu_pairs({"val": docs["val"]}, seed=0, pairs_per_document=31)["val"]  # 10 premises per speech
    assert len(capped) == 3 * 10 * len(docs["val"]) and capped.label_counts().tolist() == [80, 80, 80]
    with pytest.raises(ConfigError) as err:
        sotu_pairs({"val": docs["val"]}, seed=0, pairs_per_document=2)
    assert "pairs_per_document" in one_line(err)


def test_substitute_refusals():
    doc = [f"This is sentence number {i} here." for i in range(30)]
    with pytest.raises(ConfigError) as err:
        sotu_pairs({"train": [doc]}, seed=0)
    assert "at least two documents" in one_line(err)
    with pytest.raises(ConfigError) as err:
        sotu_pairs({"train": [doc[:5], ["Too short."] * 40]}, seed=0)
    assert "gives no pairs" in one_line(err)
    small = sotu_pairs({"train": [doc, [s.replace("This", "That") for s in doc]]}, seed=3, neutral_min_distance=5)["train"]
    assert small.label_counts().tolist() == [58, 58, 58]


# ------------------------------------------------------------------------------------------- baselines
def test_majority_baseline():
    train = PairSplit(["p"] * 3, ["h"] * 3, [1, 1, 2], [True] * 3, [""] * 3)
    split = PairSplit(["p"] * 4, ["h"] * 4, [1, 0, 0, 1], [True] * 4, [""] * 4)
    assert majority_baseline(train, split) == 0.5


def test_overlap_rule_separates_overlap_levels():
    premises = ["the cat sat on the mat"] * 6
    hypotheses = ["the cat sat on the mat", "the cat sat on a mat", "a cat ran", "the cat ran far", "blue sky", "green grass"]
    labels = [0, 0, 1, 1, 2, 2]  # high overlap -> 0, some -> 1, none -> 2
    train = PairSplit(premises, hypotheses, labels, [True] * 6, [""] * 6)
    rule = fit_overlap_rule(train)
    assert isinstance(rule, OverlapRule) and rule.labels == (2, 1, 0) and rule.train_accuracy == 1.0
    assert overlap_baseline(train, train) == 1.0


def test_baselines_on_substitute(sotu):
    _, pairs = sotu
    val = pairs["val"]
    rule = fit_overlap_rule(pairs["train"])  # low overlap -> another speech, high -> the next sentence
    assert rule.labels == (2, 1, 0) and 0.36 < rule.train_accuracy < 0.6
    for split in ("val", "test"):
        majority = majority_baseline(pairs["train"], pairs[split])
        overlap = float(np.mean(rule.predict(pairs[split]) == pairs[split].labels))
        assert majority == pytest.approx(1 / 3)
        assert 0.0 <= overlap <= 1.0 and overlap > majority + 0.03  # shared words are a (weak) cue
    # overlap_baseline = fit on train, score the split (fitted here on val's first half, scored on the rest)
    first, rest = val.select(np.arange(len(val) // 2)), val.select(np.arange(len(val) // 2, len(val)))
    assert overlap_baseline(first, rest) == pytest.approx(np.mean(fit_overlap_rule(first).predict(rest) == rest.labels))
