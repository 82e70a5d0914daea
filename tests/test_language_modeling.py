"""Language modelling through the real runner on generated text: examples respect documents, the loss
falls below the unigram floor, every normaliser trains a causal LM, exact resume, the local-file and
hub-layout (parquet) loaders, and the offline message."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import numpy as np
import pytest

from sparse_runner import example_scores
from sparse_runner.checks import ConfigError
from sparse_runner.config import validate
from sparse_runner.run import run
from sparse_runner.tasks import build_task
from sparse_runner.tasks.language_modeling import LanguageModelingTask
from sparse_runner.tokenization import BOS_ID, EOS_ID, PAD_ID
from tests.conftest import compose_config, on_train_batch, simulated_crash, sparse_run

# A tiny grammar: predictable enough that a small model beats the unigram floor in a hundred steps.
SUBJECTS = ["the cat", "a dog", "my friend", "the old man", "our teacher"]
VERBS = ["sees", "likes", "finds", "takes", "wants"]
OBJECTS = ["the ball.", "a red apple.", "the small house.", "some water.", "the blue book."]


def sentences(rng: random.Random, n: int) -> list[str]:
    return [f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}" for _ in range(n)]


def write_corpus(directory: Path, seed: int = 0) -> Path:
    """{train,valid,test}.txt: documents of 3-8 sentences, an empty line between documents."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for split, docs in (("train", 120), ("valid", 12), ("test", 12)):
        text = "\n\n".join("\n".join(sentences(rng, rng.randint(3, 8))) for _ in range(docs))
        (directory / f"{split}.txt").write_text(text + "\n")
    return directory


TINY_LM = [
    "task=lm_files", "task.vocab_size=60", "task.block_size=32", "task.sample_tokens=20",
    "model.d_model=32", "model.num_heads=2", "model.ffn_dim=64", "model.num_layers=2",
    "trainer.batch_size=16", "trainer.max_steps=20", "trainer.eval_every=10", "trainer.warmup_steps=5",
    "trainer.log_every=5", "trainer.progress=false", "trainer.num_threads=1", "trainer.lr=3e-3",
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("lm_corpus"))


def lm_config(corpus: Path, cache_dir: Path, *extra: str):
    return validate(compose_config([*TINY_LM, f"task.data_dir={corpus}", *extra], cache_dir=cache_dir, tiny=False))


def test_blocks_stay_inside_documents_and_predict_every_token_once(corpus, cache_dir):
    task = build_task(lm_config(corpus, cache_dir))
    docs = (corpus / "train.txt").read_text().strip().split("\n\n")
    windows = task.examples["train"]
    # Each document starts with BOS; a window never holds a second BOS (it would span two documents).
    assert sum(int(w[0] == BOS_ID) for w in windows) == len(docs)
    assert all(BOS_ID not in w[1:] for w in windows)
    assert max(len(w) for w in windows) == 33  # block_size predictions + the token before the first
    # Windows overlap by one token: the predictions are the whole stream, minus the BOS of each document.
    lines = [line for doc in docs for line in doc.split("\n")]
    ids = task.tokenizer.encode(lines)
    assert sum(len(w) - 1 for w in windows) == sum(len(x) + 1 for x in ids)
    assert sum(int((w[1:] == EOS_ID).sum()) for w in windows) == len(lines)


def test_lines_mode_makes_one_example_per_line(corpus, cache_dir):
    task = build_task(lm_config(corpus, cache_dir, "task.examples=lines"))
    lines = [line for line in (corpus / "valid.txt").read_text().splitlines() if line.strip()]
    assert len(task.examples["val"]) == len(lines)
    assert all(w[0] == BOS_ID and w[-1] == EOS_ID for w in task.examples["val"])


@pytest.mark.parametrize("model", ["softmax", "entmax"])
def test_lm_learns_below_the_unigram_floor(corpus, cache_dir, tmp_path, model):
    cfg = lm_config(corpus, cache_dir, f"model={model}", "trainer.max_steps=120", "trainer.eval_every=60")
    run(cfg, tmp_path)
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["status"] == "completed" and m["primary_metric"] == "test/ppl" and m["selection"]["metric"] == "val/ppl"
    metrics = m["metrics"]
    assert metrics["test/ppl"] < 0.5 * metrics["test/unigram_ppl"], metrics
    # Several tokens per word: the per-word perplexity is the larger one.
    assert metrics["test/word_ppl"] > metrics["test/ppl"] > 1.0
    # per window, its summed loss and tokens: exp(sum / sum) is the test perplexity
    record = example_scores.read(open(tmp_path / "test_examples.npz", "rb"))
    assert record.metric == "test/ppl" and record.reducer == "exp_ratio" and len(record) == m["dataset_sizes"]["test"]
    assert record.value() == pytest.approx(metrics["test/ppl"], rel=1e-5)
    losses = [row["train/loss"] for row in map(json.loads, (tmp_path / "log.jsonl").read_text().splitlines()) if "train/loss" in row]
    assert losses[-1] < losses[0] - 0.5
    sample = (tmp_path / "outputs" / "sample.txt").read_text()
    assert sample.strip() and any(word in sample for word in ("cat", "dog", "ball", "book", "the"))
    if model == "entmax":  # learned alphas in the LM's causal self-attention
        assert m["analysis"]["alpha"]["decoder_self"]["count"] == 4


@pytest.mark.parametrize("normaliser", ["sparsemax", "entmax15"])
def test_every_normaliser_and_head_geometry_trains_an_lm(corpus, cache_dir, tmp_path, normaliser):
    cfg = lm_config(corpus, cache_dir, "model=fixed_head", f"model.normaliser={normaliser}", "model.num_heads=3",
                    "model.head_size=8", "trainer.max_steps=6", "trainer.eval_every=6", "task.sample_tokens=0")
    run(cfg, tmp_path)
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["status"] == "completed" and np.isfinite(m["metrics"]["test/ppl"])
    assert not (tmp_path / "outputs" / "sample.txt").exists()


def test_crash_then_resume_matches_uninterrupted(corpus, cache_dir, tmp_path, monkeypatch):
    cfg = lm_config(corpus, cache_dir, "task.sample_tokens=0")
    run(cfg, tmp_path / "straight")
    with monkeypatch.context() as patch:
        on_train_batch(patch, LanguageModelingTask, 14, simulated_crash)
        with pytest.raises(RuntimeError, match="simulated crash"):
            run(cfg, tmp_path / "resumed")
    run(cfg, tmp_path / "resumed")
    a, b = (json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("straight", "resumed"))
    assert b["status"] == "completed" and a["metrics"] == b["metrics"]


def test_hub_layout_from_local_parquet(tmp_path, cache_dir):
    """The hub path (datasets.load_dataset) on parquet files laid out like the hub's LM1B copy: one
    `text` column, train and test only, validation carved from the end of train."""
    import datasets

    rng = random.Random(1)
    files = {}
    for split, n in (("train", 300), ("test", 40)):
        files[split] = str(tmp_path / f"{split}.parquet")
        datasets.Dataset.from_dict({"text": sentences(rng, n)}).to_parquet(files[split])
    cfg = validate(compose_config([
        *TINY_LM, "task=lm1b", "task.hf_path=parquet", "task.hf_revision=null", "task.hf_data_dir=null",
        f"task.hf_data_files={{train: {files['train']}, test: {files['test']}}}", "task.val_size=30",
    ], cache_dir=cache_dir, tiny=False))
    task = build_task(cfg)
    assert task.sizes() == {"train": 270, "val": 30, "test": 40}  # lines mode: one example per sentence
    assert all(w[0] == BOS_ID and w[-1] == EOS_ID and PAD_ID not in w for w in task.examples["test"])


def test_missing_split_file_and_bad_options_are_one_line(tmp_path, cache_dir):
    (tmp_path / "train.txt").write_text("a b c\n")
    with pytest.raises(ConfigError, match=r"^task.data_dir: .* has no valid.txt / val.txt / dev.txt for the val split"):
        build_task(lm_config(tmp_path, cache_dir))
    with pytest.raises(ConfigError, match=r"^task.examples: unknown value 'words'; valid: blocks, lines"):
        lm_config(tmp_path, cache_dir, "task.examples=words")
    with pytest.raises(ConfigError, match=r"^model.pattern: task family 'lm' does not use this key"):
        lm_config(tmp_path, cache_dir, "model.pattern=causal")


def test_offline_lm1b_is_one_line(tmp_path, cache_dir):
    env_backup = {k: os.environ.get(k) for k in ("HF_ENDPOINT", "HF_HOME")}
    os.environ.update(HF_ENDPOINT="http://127.0.0.1:9", HF_HOME=str(tmp_path / "hf"))
    try:
        proc = sparse_run(["task=lm1b", f"paths.output_dir={tmp_path}"], tmp_path, cache_dir, timeout=120)
    finally:
        for k, v in env_backup.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "billion-word-benchmark/lm1b" in lines[0] and "task.source=files task.data_dir=" in lines[0]


# word_ppl's words: those of the tokenizer's normalised text (sentencepiece nmt_nfkc), not str.split()'s.
# (line, its words for word_ppl, str.split()'s words)
WORD_BOUNDARIES = [
    ("the cat\u200bsees a dog.", 5, 4),   # zero-width space: a boundary for word_ppl only
    ("the cat\u200csees a dog.", 5, 4),   # zero-width non-joiner
    ("the cat\ufeffsees a dog.", 5, 4),   # zero-width no-break space (BOM)
    ("the cat\x0bsees a dog.", 4, 5),     # vertical tab: whitespace for str.split() only
    ("the cat\x1fsees a dog.", 4, 5),     # unit separator, likewise
    ("the cat\u3000sees a dog.", 5, 5),   # ideographic space: both
]


def test_word_ppl_counts_the_tokenizers_words_not_str_split(tmp_path, cache_dir):
    import torch

    corpus = write_corpus(tmp_path / "corpus")
    (corpus / "test.txt").write_text("\n\n".join(line for line, _, _ in WORD_BOUNDARIES) + "\n")
    task = build_task(lm_config(corpus, cache_dir))
    windows = task.examples["test"]
    assert len(windows) == len(WORD_BOUNDARIES)           # one document (and window) per line
    for window, (line, words, split_words) in zip(windows, WORD_BOUNDARIES):
        assert len(line.split()) == split_words
        # What eval_step counts: the targets that start a word, EOS included.
        assert int(task.word_start[torch.from_numpy(window[1:])].sum()) == words + 1, repr(line)
    # ... and what the code and docs/tasks.md say of it.
    import sparse_runner.tasks.language_modeling as lm

    docs = (Path(__file__).resolve().parents[1] / "docs" / "tasks.md").read_text()
    for text in (lm.__doc__, docs):
        assert "U+200B" in text and "str.split()" in text
