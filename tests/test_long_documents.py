"""Long-document classification: the readers of IMDB (aclImdb), Hyperpartisan (the official XML pair) and arXiv
(class folders, JSON lines) on small files in those layouts, hub rows through `datasets` (its local json
loader), the seeded splits, the sotu_era substitute and its floors, macro-F1, one-line refusals, and a
pre-training stage fine-tuned on a block-sparse pattern through the real runner."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from sparse_runner.checks import ConfigError
from sparse_runner.config import validate
from sparse_runner.data.errors import DataFormatError
from sparse_runner.data.long_documents import (
    DATASETS,
    HYPERPARTISAN_FILES,
    Documents,
    from_hub_rows,
    hold_out,
    macro_f1,
    majority_accuracy,
    nearest_centroid_accuracy,
    read_aclimdb,
    read_arxiv,
    read_hyperpartisan,
    sotu_era,
    sotu_era_documents,
    stratified_split,
)
from sparse_runner.run import pretrain_dir, run
from sparse_runner.tasks import build_task
from tests.conftest import compose_config
from tests.test_language_modeling import write_corpus

GOOD = ["wonderful", "superb", "moving", "brilliant", "delightful"]
BAD = ["awful", "boring", "dreadful", "clumsy", "tedious"]
FILLER = ["the", "film", "plot", "actor", "scene", "story", "camera", "music"]


def review(rng: random.Random, label: int, words: int = 60) -> str:
    """Filler words with a few sentiment words of the label's side: a learnable toy."""
    side = GOOD if label else BAD
    return " ".join(rng.choice(side) if rng.random() < 0.15 else rng.choice(FILLER) for _ in range(words))


def write_aclimdb(root: Path, per_class: int = 24, seed: int = 0) -> Path:
    rng = random.Random(seed)
    for split in ("train", "test"):
        for label, name in enumerate(("neg", "pos")):
            folder = root / "aclImdb" / split / name
            folder.mkdir(parents=True)
            for i in range(per_class if split == "train" else per_class // 2):
                (folder / f"{i}_{7 if label else 2}.txt").write_text(review(rng, label) + "<br /><br />The end.", encoding="utf-8")
    (root / "aclImdb" / "train" / "unsup").mkdir()  # unlabelled reviews: never read
    (root / "aclImdb" / "train" / "unsup" / "0_0.txt").write_text("no label")
    return root


def write_hyperpartisan(root: Path, n: int = 40, seed: int = 0) -> Path:
    """The official pair: articles with a title and <p>/<a> markup, and the ground truth by id."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    articles, truth = ["<articles>"], ["<articles>"]
    for i in range(n):
        label = i % 2
        articles.append(f'<article id="{i:07d}" published-at="2017-01-0{i % 9 + 1}" title="Headline {i}">'
                        f"<p>{review(rng, label)}</p><p>More <a href=\"https://x.org\" type=\"external\">link</a> text &amp; more.</p></article>")
        truth.append(f'<article id="{i:07d}" hyperpartisan="{"true" if label else "false"}" labeled-by="article" url="https://x.org/{i}"/>')
    (root / HYPERPARTISAN_FILES[0]).write_text("\n".join(articles + ["</articles>"]), encoding="utf-8")
    (root / HYPERPARTISAN_FILES[1]).write_text("\n".join(truth + ["</articles>"]), encoding="utf-8")
    return root


# ---------------------------------------------------------------------------------------------- readers
def test_aclimdb_release(tmp_path):
    parts = read_aclimdb(write_aclimdb(tmp_path))
    assert sorted(parts) == ["test", "train"]
    assert len(parts["train"]) == 48 and len(parts["test"]) == 24
    assert parts["train"].label_counts(2).tolist() == [24, 24]
    assert "<br />" not in parts["train"].texts[0] and "The end." in parts["train"].texts[0]
    assert all(any(w in t for w in BAD) or not any(w in t for w in GOOD) for t in parts["train"].texts[:24])


def test_aclimdb_refusals(tmp_path):
    write_aclimdb(tmp_path)
    for path in (tmp_path / "aclImdb" / "test" / "pos").iterdir():
        path.unlink()
    with pytest.raises(DataFormatError, match=r"test/pos holds no \.txt review; valid: the aclImdb release"):
        read_aclimdb(tmp_path)
    with pytest.raises(DataFormatError, match=r"has no train/neg/ folder"):
        read_aclimdb(tmp_path / "elsewhere")
    (tmp_path / "aclImdb" / "test" / "pos" / "1_9.txt").write_bytes(b"caf\xe9")
    with pytest.raises(DataFormatError, match=r"1_9\.txt: not valid UTF-8"):
        read_aclimdb(tmp_path)


def test_hyperpartisan_release(tmp_path):
    docs = read_hyperpartisan(write_hyperpartisan(tmp_path))
    assert len(docs) == 40 and docs.labels.tolist() == [i % 2 for i in range(40)]
    assert docs.texts[3].startswith("Headline 3\n") and "link text & more." in docs.texts[3] and "<p>" not in docs.texts[3]


def test_hyperpartisan_refusals(tmp_path):
    root = write_hyperpartisan(tmp_path)
    truth = root / HYPERPARTISAN_FILES[1]
    truth.write_text(truth.read_text().replace('id="0000005" hyperpartisan="true"', 'id="0000005" hyperpartisan="maybe"'))
    with pytest.raises(DataFormatError, match=r"article '0000005' has hyperpartisan='maybe'; valid: true, false"):
        read_hyperpartisan(root)
    truth.write_text(truth.read_text().replace('<article id="0000005" hyperpartisan="maybe" labeled-by="article" url="https://x.org/5"/>', ""))
    with pytest.raises(DataFormatError, match=r"no label for article '0000005'"):
        read_hyperpartisan(root)
    truth.write_text('<?xml version="1.0"?><!DOCTYPE a [<!ENTITY x "xx">]><articles>&x;</articles>')
    with pytest.raises(DataFormatError, match=r"declares a DTD or entities"):
        read_hyperpartisan(root)
    truth.write_text("<articles><article id=")
    with pytest.raises(DataFormatError, match=r"not well-formed XML"):
        read_hyperpartisan(root)
    truth.unlink()
    with pytest.raises(DataFormatError, match=r"has no ground-truth-training-byarticle-20181122\.xml"):
        read_hyperpartisan(root)


def test_arxiv_class_folders_and_json_lines(tmp_path):
    names = DATASETS["arxiv"]
    for k, name in enumerate(("cs.AI", "math.ST")):
        (tmp_path / "release" / name).mkdir(parents=True)
        for i in range(3):
            (tmp_path / "release" / name / f"{i}.txt").write_text(f"paper {i} of {name}")
    found = read_arxiv(tmp_path / "release")
    assert list(found) == ["all"] and found["all"].labels.tolist() == [names.index("cs.AI")] * 3 + [names.index("math.ST")] * 3
    (tmp_path / "release" / "hep-th").mkdir()
    with pytest.raises(DataFormatError, match=r"hep-th/ is not an arXiv class of the dataset; valid: math.AC, cs.CV"):
        read_arxiv(tmp_path / "release")

    hub = tmp_path / "hub"
    hub.mkdir()
    for split in ("train", "val", "test"):
        (hub / f"{split}_data.txt").write_text("".join(json.dumps({"text": f"{split} {i}", "label": i % 11}) + "\n" for i in range(12)))
    found = read_arxiv(hub)
    assert sorted(found) == ["test", "train", "val"] and found["train"].labels.tolist() == [i % 11 for i in range(12)]
    (hub / "val_data.txt").write_text('{"text": "x", "label": 11}\n')
    with pytest.raises(DataFormatError, match=r"val_data\.txt:1: expected .*label.*0\.\.10"):
        read_arxiv(hub)
    (hub / "val_data.txt").unlink()
    with pytest.raises(DataFormatError, match=r"JSON-lines splits but none for val"):
        read_arxiv(hub)


def test_hub_rows_through_datasets(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = datasets.Dataset.from_dict({"text": ["a b", "c d"], "title": ["T1", None], "hyperpartisan": [True, False]})
    docs = from_hub_rows(rows, text_field="text", label_field="hyperpartisan", title_field="title", dataset_name="hyperpartisan", where="hub train")
    assert docs.texts == ["T1\na b", "c d"] and docs.labels.tolist() == [1, 0]
    with pytest.raises(DataFormatError, match=r"hub train: no column 'label'; it has text, title, hyperpartisan"):
        from_hub_rows(rows, text_field="text", label_field="label", dataset_name="imdb", where="hub train")
    bad = datasets.Dataset.from_dict({"text": ["x"], "label": [2]})
    with pytest.raises(DataFormatError, match=r"row 0: label 2 is not one of 0\.\.1 \(neg, pos\)"):
        from_hub_rows(bad, text_field="text", label_field="label", dataset_name="imdb", where="hub test")


# ---------------------------------------------------------------------------------------------- splits and floors
def test_stratified_split_is_seeded_disjoint_and_proportional():
    docs = Documents([f"d{i}" for i in range(100)], np.arange(100) % 4)
    test, train = stratified_split(docs, [0.2], seed=3)
    assert len(test) == 20 and len(train) == 80 and test.label_counts(4).tolist() == [5, 5, 5, 5]
    assert not set(test.texts) & set(train.texts)
    again, _ = stratified_split(docs, [0.2], seed=3)
    other, _ = stratified_split(docs, [0.2], seed=4)
    assert again.texts == test.texts and other.texts != test.texts
    rest, val = hold_out(train, 0.125, seed=1)
    assert len(val) == 8 and len(rest) == 72
    with pytest.raises(ConfigError, match=r"task.val_fraction: 0.001 of 80 training documents leaves an empty split"):
        hold_out(train, 0.001, seed=1)


def test_sotu_era_substitute():
    docs = sotu_era_documents()
    assert len(docs) == 233
    assert (sotu_era(1860), sotu_era(1861), sotu_era(1913), sotu_era(1914), sotu_era(1960), sotu_era(1961), sotu_era(2021)) == (0, 1, 1, 2, 2, 3, 3)
    counts = docs.label_counts(4)
    assert counts.sum() == 233 and counts.max() / 233 < 0.35  # no era is a majority
    assert min(len(t.split()) for t in docs.texts) > 900  # whole speeches, not sentences


def test_floors():
    rng = random.Random(0)
    train = Documents([review(rng, i % 2) for i in range(40)], np.arange(40) % 2)
    test = Documents([review(rng, i % 2) for i in range(20)], np.arange(20) % 2)
    assert nearest_centroid_accuracy(train, test, 2) >= 0.9
    assert majority_accuracy(train, Documents(["a", "b", "c"], [0, 0, 1]), 2) == pytest.approx(2 / 3)
    # Shuffled labels carry nothing: the rule falls to chance.
    noise = Documents(train.texts, np.asarray([rng.randint(0, 1) for _ in range(40)]))
    assert nearest_centroid_accuracy(noise, test, 2) < 0.8


def test_macro_f1():
    labels = np.array([0, 0, 1, 1, 2, 2])
    assert macro_f1(labels, labels, 3) == 1.0
    predicted = np.array([0, 1, 1, 1, 0, 2])
    # class 0: tp 1 fp 1 fn 1 -> 0.5; class 1: tp 2 fp 1 fn 0 -> 0.8; class 2: tp 1 fp 0 fn 1 -> 2/3
    assert macro_f1(predicted, labels, 3) == pytest.approx((0.5 + 0.8 + 2 / 3) / 3)
    assert macro_f1(np.zeros(4, int), np.zeros(4, int), 11) == 1.0  # absent classes do not count


# ---------------------------------------------------------------------------------------------- the task and the runner
MODEL = ["model=bigbird", "model.d_model=32", "model.num_heads=2", "model.ffn_dim=64", "model.num_layers=2",
         "model.pattern_options.block_size=8", "model.pattern_options.random_blocks=1"]
TRAINER = ["trainer.batch_size=8", "trainer.max_steps=12", "trainer.eval_every=6", "trainer.warmup_steps=2", "trainer.log_every=4",
           "trainer.progress=false", "trainer.num_threads=1", "trainer.lr=3e-3", "trainer.analysis=false"]


def imdb_args(root: Path) -> list[str]:
    return ["task=imdb_long", "task.source=files", f"task.data_dir={root}", "task.max_length=64", "task.vocab_size=60"]


def config(cache_dir, *overrides):
    return validate(compose_config([*MODEL, *TRAINER, *overrides], cache_dir=cache_dir, tiny=False))


def test_hub_splits_of_each_task():
    """What each task asks of its dataset's splits (a split it does not name is held out)."""
    splits = {name: dict(compose_config([f"task={name}"], tiny=False).task.hf_splits) for name in ("imdb_long", "hyperpartisan", "arxiv_classification")}
    assert splits == {"imdb_long": {"train": "train", "test": "test"}, "hyperpartisan": {"train": "train"},
                      "arxiv_classification": {"train": "train", "val": "validation", "test": "test"}}


def test_task_splits_and_describes_itself(tmp_path, cache_dir):
    task = build_task(config(cache_dir, "task=hyperpartisan", "task.source=files", f"task.data_dir={write_hyperpartisan(tmp_path)}",
                             "task.max_length=64", "task.vocab_size=60"))
    assert task.sizes() == {"train": 32, "val": 4, "test": 4}  # 80/10/10 of 40, stratified
    assert not set(task.docs["test"].texts) & (set(task.docs["train"].texts) | set(task.docs["val"].texts))
    info = task.describe()
    assert info["data"]["source"] == "release" and info["labels"] == ["false", "true"]
    assert set(info["baselines"]) == {"majority", "bag_of_words_nearest_centroid"}
    example = task.examples["train"][0]
    assert example[0] == 2 and example[-1] == 3 and len(example) <= 64  # [CLS] ... [SEP]
    # Scoring: accuracy and macro-F1 from the per-batch confusion counts agree with the direct formulas.
    predicted = np.array([1, 1, 0, 1])
    batch = task.make_batch("test", np.arange(4), torch.device("cpu"))
    sums = task.eval_step(lambda tokens, lengths: torch.nn.functional.one_hot(torch.from_numpy(predicted), 2).float(), batch, "test")
    scores = task.finalise("test", sums)
    labels = task.docs["test"].labels
    assert scores["test/accuracy"] == pytest.approx(float((predicted == labels).mean()))
    assert scores["test/macro_f1"] == pytest.approx(macro_f1(predicted, labels, 2))


def test_task_from_the_hub_loader(tmp_path, cache_dir):
    pytest.importorskip("datasets")
    rng = random.Random(1)
    for split, n in (("train", 30), ("test", 10)):
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps({"text": review(rng, i % 2), "label": i % 2}) + "\n" for i in range(n)))
    files = f"{{train:{tmp_path}/train.jsonl,test:{tmp_path}/test.jsonl}}"
    task = build_task(config(cache_dir, "task=imdb_long", "task.hf_path=json", f"task.hf_data_files={files}", "task.max_length=64",
                             "task.vocab_size=60"))
    assert task.sizes() == {"train": 26, "val": 4, "test": 10}  # round(0.1 * 15) = 2 per class and task.describe()["data"]["source"] == "hub"


@pytest.mark.parametrize("overrides, message", [
    (["task=sotu_era", "task.dataset=imdb"], r"^task.dataset: imdb with task.source=sotu_era"),
    (["task=imdb_long", "task.source=files"], r"^task.data_dir: task imdb_long reads local files .* valid: the aclImdb release"),
    (["task=imdb_long", "task.dataset=yelp"], r"^task.dataset: unknown value 'yelp'; valid: imdb, hyperpartisan, arxiv, sotu_era"),
    (["task=imdb_long", "+task.hf_splits.dev=validation"], r"^task.hf_splits: must map train"),
    (["task=sotu_era", "task.test_fraction=0.5", "task.val_fraction=0.5"], r"^task.test_fraction: 0.5 \+ task.val_fraction 0.5 leaves no training"),
    (["task=sotu_era", "model.pooling=mean"], r"^model.pooling: task family 'long_document' does not use this key"),
])
def test_refusals_are_one_line(cache_dir, overrides, message):
    with pytest.raises(ConfigError, match=message):
        config(cache_dir, *overrides)


def test_pretrain_stage_then_block_sparse_fine_tuning(tmp_path, cache_dir):
    """mlm_long_cpu's stage (on a small corpus) then imdb_long on aclImdb files with BigBird blocks of 8: the run
    starts from the stage's encoder and learns the toy sentiment beyond the majority class."""
    corpus = write_corpus(tmp_path / "corpus")
    stage = ["pretrain=mlm_long_cpu", "pretrain.task.source=files", f"pretrain.task.data_dir={corpus}", "pretrain.task.vocab_size=60",
             "pretrain.task.max_length=64", *[f"pretrain.{a}" for a in TRAINER], f"paths.output_dir={tmp_path / 'out'}"]
    cfg = config(cache_dir, *imdb_args(write_aclimdb(tmp_path / "imdb")), *stage, "trainer.max_steps=30", "trainer.eval_every=10")
    run(cfg, tmp_path / "imdb_run")
    m = json.loads((tmp_path / "imdb_run" / "metrics.json").read_text())
    assert m["status"] == "completed" and m["pretraining"]["run_dir"] == str(pretrain_dir(cfg))
    assert m["task_info"]["tokenizer"]["source"].startswith("pre-trained run")
    metrics = m["metrics"]
    assert {"test/accuracy", "test/macro_f1", "test/majority_accuracy"} <= set(metrics)
    assert metrics["test/accuracy"] > metrics["test/majority_accuracy"] + 0.1


def test_bigbird_attention_analysis_when_every_document_fills_max_length(tmp_path, cache_dir):
    """Every review is longer than 32 ids, so no batch is padded (as every sotu_era speech at 1,024 ids)."""
    cfg = config(cache_dir, *imdb_args(write_aclimdb(tmp_path / "imdb")), "task.max_length=32", "trainer.analysis=true",
                 "trainer.max_steps=2", "trainer.eval_every=2", "trainer.analysis_max_batches=1")
    run(cfg, tmp_path / "run")
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["status"] == "completed"
