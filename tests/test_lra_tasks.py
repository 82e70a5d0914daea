"""The LRA task families beyond ListOps (Text, Retrieval, Image, Pathfinder): each loader on files
written here in its official format, the offline substitutes, the two-tower model, tiny end-to-end
runs, exact resume and the one-line errors."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import re
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from sparse_runner.checks import ConfigError
from sparse_runner.config import validate
from sparse_runner.data.byte_text import encode_bytes
from sparse_runner.models import DualEncoderClassifier
from sparse_runner.run import run
from sparse_runner.tasks import build_task
from sparse_runner.tasks.lra_retrieval import LraRetrievalTask
from tests.conftest import compose_config, on_train_batch, simulated_crash, sparse_run
from tests.test_translation_data import hf_cache, offline_calls  # noqa: F401  (fixtures: the hub unreachable, in-process)

SMALL_MODEL = [
    "model.d_model=32", "model.num_heads=2", "model.ffn_dim=64", "trainer.max_steps=12", "trainer.eval_every=6",
    "trainer.batch_size=8", "trainer.warmup_steps=2", "trainer.log_every=3", "trainer.progress=false",
    "trainer.num_threads=1", "trainer.analysis=false",
]


def lra_config(cache_dir: Path, *overrides: str):
    return validate(compose_config([*SMALL_MODEL, *overrides], cache_dir=cache_dir, tiny=False))


def metrics(run_dir: Path) -> dict:
    return json.loads((run_dir / "metrics.json").read_text())


# ---------------------------------------------------------------------------------------------- files
def write_class_folders(root: Path, splits=("train", "test"), per_class: int = 12) -> Path:
    """aclImdb-style {split}/{neg,pos}/*.txt: positive reviews say 'great', negative ones 'awful'."""
    rng = np.random.default_rng(0)
    for split in splits:
        for label, word in (("neg", "awful"), ("pos", "great")):
            folder = root / split / label
            folder.mkdir(parents=True)
            for i in range(per_class):
                filler = " ".join(rng.choice(["the", "film", "was", "plot", "actor", "é"], size=20))
                (folder / f"{i}_{rng.integers(1, 10)}.txt").write_text(f"{filler} {word} {filler}", encoding="utf-8")
    return root


def write_aan_files(root: Path, rows: int = 24) -> Path:
    """LRA's new_aan_pairs.{train,eval,test}.tsv: no header; label, id1, id2, text1, text2 (labels as floats)."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    for name in ("train", "eval", "test"):
        lines = []
        for i in range(rows):
            label = i % 2
            topic = rng.choice(["parsing", "translation", "tagging"])
            other = topic if label else "unrelated \"quoted\" text"
            lines.append(f"{float(label)}\tP{i}a\tP{i}b\tabstract about {topic} {i}\tcited work on {other}")
        (root / f"new_aan_pairs.{name}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def write_idx(root: Path, n_train: int = 40, n_test: int = 20) -> Path:
    """MNIST-style IDX files (gzip), 28x28 images whose brightness encodes the label."""
    root.mkdir(parents=True, exist_ok=True)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        labels = (np.arange(n) % 10).astype(np.uint8)
        images = np.repeat((labels * 25)[:, None, None], 28, 1).repeat(28, 2).astype(np.uint8)
        with gzip.open(root / f"{prefix}-images-idx3-ubyte.gz", "wb") as f:
            f.write(struct.pack(">IIII", 0x803, n, 28, 28) + images.tobytes())
        with gzip.open(root / f"{prefix}-labels-idx1-ubyte.gz", "wb") as f:
            f.write(struct.pack(">II", 0x801, n) + labels.tobytes())
    return root


def write_cifar_batches(root: Path, per_batch: int = 10) -> Path:
    """CIFAR-10's python release: data_batch_1..5 and test_batch, pickled dicts of (n, 3072) uint8."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(2)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        labels = rng.integers(0, 10, per_batch).tolist()
        data = rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8)
        with open(folder / name, "wb") as f:
            pickle.dump({b"data": data, b"labels": labels}, f)
    return root


# ---------------------------------------------------------------------------------------------- text
def test_bytes_are_tokens():
    ids = encode_bytes("aé", max_length=10)
    assert ids.tolist() == [ord("a") + 1, 0xC3 + 1, 0xA9 + 1]  # UTF-8 bytes, shifted past the pad id 0
    assert encode_bytes("abcdef", max_length=4).tolist() == [98, 99, 100, 101]


def test_text_from_class_folders_trains_end_to_end(tmp_path, cache_dir):
    data = write_class_folders(tmp_path / "aclImdb")
    cfg = lra_config(cache_dir, "task=lra_text", "task.source=files", f"task.data_dir={data}", "task.max_length=200")
    task = build_task(cfg)
    assert task.sizes() == {"train": 24, "val": 24, "test": 24}  # no val folder: test doubles as val, as in LRA
    assert task.describe()["data"]["source"] == "release"
    run(cfg, tmp_path / "run")
    m = metrics(tmp_path / "run")
    assert m["status"] == "completed" and m["task_family"] == "lra_text"
    assert 0.0 <= m["metrics"]["test/accuracy"] <= 1.0 and m["metrics"]["test/majority_accuracy"] == 0.5
    assert 0.0 <= m["data_wait_fraction"] < 1.0


def test_text_bbc_substitute_is_labelled_and_split_per_class(tmp_path, cache_dir, monkeypatch):
    root = write_bbc_folders(tmp_path / "bbc")
    monkeypatch.setattr("sparse_runner.tasks.lra_text.fetch_bbc_news", lambda cache: root)
    task = build_task(lra_config(tmp_path / "cache", "task=lra_text_bbc"))
    assert task.sizes() == {"train": 80, "val": 10, "test": 10}
    assert all(np.bincount(task.splits[s].labels).tolist() == [n] * 5 for s, n in (("train", 16), ("val", 2), ("test", 2)))
    info = task.describe()["data"]
    assert info["source"] == "substitute" and info["substitute_for"] == "IMDB"


def test_text_missing_class_folder_is_one_line(tmp_path, cache_dir):
    data = write_class_folders(tmp_path / "aclImdb")
    cfg = lra_config(cache_dir, "task=lra_text", "task.source=files", f"task.data_dir={data}", "task.classes=[neg,neutral]")
    with pytest.raises(ConfigError, match=r"no class folder .*neutral.*folders there: neg, pos"):
        build_task(cfg)


@pytest.mark.parametrize("task, dataset", [("lra_text", "stanfordnlp/imdb")])
def test_offline_hub_is_one_line(task, dataset, tmp_path, cache_dir):
    env = {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "hf")}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        proc = sparse_run([f"task={task}", f"paths.output_dir={tmp_path}"], tmp_path, cache_dir, timeout=120)
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert dataset in lines[0] and "task.source=files task.data_dir=" in lines[0] and "offline substitute" in lines[0]


# The same refusal for the image task, from the task in this process with the hub unreachable (as
# tests/test_translation_data.py's hub tests make it); the command line prints it as it prints the text task's above.
@pytest.mark.parametrize("task, dataset", [("lra_image", "uoft-cs/cifar10")])
def test_offline_hub_refusal_names_the_dataset_and_the_local_options(task, dataset, tmp_path, hf_cache, offline_calls):
    from sparse_runner.data.errors import DataUnavailable

    with pytest.raises(DataUnavailable) as info:
        build_task(lra_config(tmp_path / "cache", f"task={task}"))
    line = str(info.value)
    assert "\n" not in line and str(hf_cache) in line, line
    assert dataset in line and "task.source=files task.data_dir=" in line and "offline substitute" in line, line
    assert offline_calls == [True]  # the unreachable hub was detected: the local cache only, no network retries


# ---------------------------------------------------------------------------------------------- retrieval
def test_aan_release_files_load_as_pairs(tmp_path, cache_dir):
    data = write_aan_files(tmp_path / "tsv_data")
    task = build_task(lra_config(cache_dir, "task=lra_retrieval", f"task.data_dir={data}", "task.max_length=64"))
    assert task.sizes() == {"train": 24, "val": 24, "test": 24}
    pair = task.splits["train"]
    assert pair.labels.tolist() == [i % 2 for i in range(24)]
    assert bytes((pair.first.sequence(3) - 1).astype(np.uint8)).decode() == "abstract about " + bytes((pair.first.sequence(3) - 1).astype(np.uint8)).decode()[15:]
    assert bytes((pair.second.sequence(0) - 1).astype(np.uint8)).decode() == 'cited work on unrelated "quoted" text'  # quotes kept verbatim
    batch = task.make_batch("train", np.array([0, 1, 2]), torch.device("cpu"))
    assert batch["tokens1"].shape[0] == 3 and batch["tokens2"].shape[0] == 3 and batch["labels"].tolist() == [0, 1, 0]


def test_aan_missing_file_is_one_line(tmp_path, cache_dir):
    data = write_aan_files(tmp_path / "tsv_data")
    (data / "new_aan_pairs.eval.tsv").unlink()
    with pytest.raises(ConfigError, match=r"^task.data_dir: .* lacks new_aan_pairs.eval.tsv"):
        lra_config(cache_dir, "task=lra_retrieval", f"task.data_dir={data}")


def write_bbc_folders(root: Path, per_class: int = 20) -> Path:
    """BBC News' layout: <topic>/<nnn>.txt; each article names its own id in both halves."""
    for name in ("business", "entertainment", "politics", "sports", "tech"):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            (root / name / f"{i:03d}.txt").write_text(f"{name} story {name}{i:03d} " * 8)
    return root


def test_bbc_pairs_are_halves_of_one_article_or_of_two(tmp_path, monkeypatch):
    monkeypatch.setattr("sparse_runner.tasks.lra_retrieval.fetch_bbc_news", lambda cache: write_bbc_folders(tmp_path / "bbc"))
    cfg = lra_config(tmp_path / "cache", "task=lra_retrieval_bbc", "task.max_length=64", "task.num_train=200", "task.num_val=40", "task.num_test=40")
    task = build_task(cfg)
    assert task.describe()["data"]["substitute_for"] == "AAN"
    decoded = lambda ids: bytes((ids - 1).astype(np.uint8)).decode()
    articles: dict[str, set] = {}
    for split in ("train", "val", "test"):
        pairs = task.splits[split]
        assert pairs.labels.sum() * 2 == len(pairs)  # balanced
        for i, label in enumerate(pairs.labels):
            a, b = (re.search(r"([a-z]+\d{3})", decoded(side.sequence(i))).group(1) for side in (pairs.first, pairs.second))
            assert (a == b) == bool(label)
            articles.setdefault(split, set()).update({a, b})
        assert max(pairs.first.lengths()) <= 64
    assert not (articles["train"] & articles["test"]) and not (articles["val"] & articles["test"])  # articles stay in their split
    again = build_task(cfg).splits["test"]
    assert np.array_equal(again.first.tokens, task.splits["test"].first.tokens)  # deterministic (and cached)


def test_two_towers_encode_each_document_alone():
    torch.manual_seed(0)
    cfg = compose_config(["task=lra_retrieval", "model.d_model=32", "model.num_heads=2", "model.ffn_dim=64", "model.dropout=0.0"], tiny=False)
    from sparse_runner.models import build_classifier

    model = build_classifier(cfg.model, vocab_size=257, num_classes=2, max_length=40, pad_id=0, pairs=True).eval()
    assert isinstance(model, DualEncoderClassifier)
    a, b = torch.randint(1, 257, (3, 40)), torch.randint(1, 257, (3, 25))
    la, lb = torch.tensor([40, 30, 12]), torch.tensor([25, 25, 7])
    with torch.no_grad():
        logits = model(a, la, b, lb)
        x1, x2 = model.encode(a, la), model.encode(b, lb)  # each tower alone, at its own width
        expected = model.head(torch.cat([x1, x2, x1 * x2, x1 - x2], -1))
        assert torch.allclose(logits, expected, atol=1e-5)
        # The second document cannot change the first one's encoding: no cross attention.
        b2 = torch.randint(1, 257, (3, 25))
        assert torch.allclose(model.encode(a, la), x1) and not torch.allclose(model(a, la, b2, lb), logits)


def test_retrieval_resume_is_exact(tmp_path, cache_dir, monkeypatch):
    overrides = ["task=lra_retrieval", f"task.data_dir={write_aan_files(tmp_path / 'aan', rows=48)}", "task.max_length=64"]
    run(lra_config(cache_dir, *overrides), tmp_path / "full")
    with monkeypatch.context() as patch:
        on_train_batch(patch, LraRetrievalTask, 9, simulated_crash)
        with pytest.raises(RuntimeError, match="simulated crash"):
            run(lra_config(cache_dir, *overrides), tmp_path / "resumed")
    run(lra_config(cache_dir, *overrides), tmp_path / "resumed")
    full, resumed = metrics(tmp_path / "full"), metrics(tmp_path / "resumed")
    assert resumed["status"] == "completed" and resumed["metrics"] == full["metrics"]


# ---------------------------------------------------------------------------------------------- images
def test_image_from_idx_files_pads_to_32_and_trains(tmp_path, cache_dir):
    data = write_idx(tmp_path / "fmnist")
    cfg = lra_config(cache_dir, "task=lra_image", "task.source=files", "task.file_format=idx", f"task.data_dir={data}")
    task = build_task(cfg)
    assert task.sizes() == {"train": 36, "val": 4, "test": 20}  # LRA's split: train[:90%], train[90%:]
    image = task.splits["train"].images()[1]
    assert image.shape == (32, 32) and image[0].max() == 0 and image[16, 16] == 25  # padded border, label 1 -> 25
    model = task.build_model(cfg.model)
    assert model.encoder.embed.padding_idx is None  # grey level 0 is a pixel, not padding
    run(cfg, tmp_path / "run")
    assert metrics(tmp_path / "run")["status"] == "completed"


def test_image_from_cifar_batches_is_greyscale(tmp_path, cache_dir):
    data = write_cifar_batches(tmp_path / "cifar")
    task = build_task(lra_config(cache_dir, "task=lra_image", "task.source=files", f"task.data_dir={data}"))
    assert task.sizes() == {"train": 45, "val": 5, "test": 10}
    with open(data / "cifar-10-batches-py" / "data_batch_1", "rb") as f:
        rgb = pickle.load(f, encoding="bytes")[b"data"][0].reshape(3, 32 * 32).astype(float)
    # tf.image.rgb_to_grayscale, as LRA's pipeline: / 255, weighted sum, * 255.5, truncated (float32 there;
    # this float64 version differs for 237 of the 2^24 colours, none of them here)
    grey = np.floor((0.2989 * rgb[0] + 0.5870 * rgb[1] + 0.1140 * rgb[2]) / 255 * 255.5)
    assert np.array_equal(task.splits["train"].sequence(0), grey.astype(np.uint8))


def test_image_max_length_must_be_the_pixel_count(cache_dir):
    with pytest.raises(ConfigError, match=r"^task.max_length: must equal the pixels per image \(1024\), got 784"):
        lra_config(cache_dir, "task=lra_image", "task.max_length=784")


# ---------------------------------------------------------------------------------------------- pathfinder
def test_pathfinder_trains_and_draws_its_examples(tmp_path, cache_dir):
    cfg = lra_config(cache_dir, "task=pathfinder", "task.difficulty=easy", "task.num_train=64", "task.num_val=16", "task.num_test=16", "model.pooling=mean")
    run(cfg, tmp_path)
    m = metrics(tmp_path)
    assert m["status"] == "completed" and m["task_family"] == "pathfinder"
    assert m["task_info"]["data"]["source"] == "generated"
    assert (tmp_path / "outputs" / "pathfinder_examples.png").stat().st_size > 1000


def test_pathfinder_bad_difficulty_is_one_line(cache_dir):
    with pytest.raises(ConfigError, match=r"^task.difficulty: unknown value 'extreme'; valid: easy, intermediate, hard"):
        lra_config(cache_dir, "task=pathfinder", "task.difficulty=extreme")


# ---------------------------------------------------------------------------------------------- every model
@pytest.mark.parametrize("model", ["softmax", "entmax", "entmax15", "sparsemax", "fixed_head"])
def test_every_model_variant_runs_on_the_pair_and_image_tasks(model, tmp_path, cache_dir):
    for task in (["task=lra_retrieval", f"task.data_dir={write_aan_files(tmp_path / 'aan')}", "task.max_length=48"],
                 ["task=pathfinder", "task.difficulty=easy", "task.num_train=64", "task.num_val=16", "task.num_test=16"]):
        cfg = lra_config(cache_dir, f"model={model}", *task, "trainer.max_steps=2", "trainer.eval_every=2", "trainer.eval_max_batches=1")
        built = build_task(cfg)
        out = built.forward_loss(built.build_model(cfg.model), built.make_batch("train", np.arange(4), torch.device("cpu")))
        out.loss.backward()
        assert torch.isfinite(out.loss)
