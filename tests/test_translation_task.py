"""Translation through the real runner on tiny generated parallel files: metrics, hypotheses, analysis
of all three attention types, tokenizer reuse, token batching, exact resume and the offline message."""

from __future__ import annotations

import json
import os
import random
import signal
from pathlib import Path

import numpy as np
import pytest

from sparse_runner import example_scores
from sparse_runner.run import run
from sparse_runner.tasks import build_task
from sparse_runner.tasks.batching import plan_epoch, plan_eval
from sparse_runner.tasks.translation import TranslationTask
from sparse_runner.training.trainer import Preempted
from tests.conftest import compose_config, on_train_batch, sparse_run

# A made-up language pair: each source word has one target word and the order is reversed, so a
# small model can learn it, yet it is not a copy.
SRC_WORDS = [f"{a}{b}" for a in "bcdfg" for b in "aeiou"]
TGT_WORDS = [f"{b}{a}{b}" for a in "mnprs" for b in "aeiou"]


def write_pair_files(directory: Path, n_train=400, n_eval=24, seed=0) -> Path:
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("valid", n_eval), ("test", n_eval)):
        src, tgt = [], []
        for _ in range(n):
            ids = [rng.randrange(len(SRC_WORDS)) for _ in range(rng.randint(2, 6))]
            src.append(" ".join(SRC_WORDS[i] for i in ids))
            tgt.append(" ".join(TGT_WORDS[i] for i in reversed(ids)) + ".")
        (directory / f"{split}.xx").write_text("\n".join(src) + "\n")
        (directory / f"{split}.yy").write_text("\n".join(tgt) + "\n")
    return directory


def tiny_mt(data_dir: Path, *extra: str) -> list[str]:
    return [
        "task=translation_files", f"task.data_dir={data_dir}", "task.src_lang=xx", "task.tgt_lang=yy",
        "task.vocab_size=64", "task.max_length=24", "task.decoding.beam_size=3",
        "model.d_model=32", "model.num_heads=2", "model.ffn_dim=64", "model.num_layers=1", "model.decoder_layers=2",
        "trainer.batch_tokens=256", "trainer.batch_size=16", "trainer.max_steps=12", "trainer.eval_every=6",
        "trainer.warmup_steps=3", "trainer.log_every=3", "trainer.progress=false", "trainer.num_threads=1",
        "trainer.label_smoothing=0.1", *extra,
    ]


def compose_mt(data_dir, cache_dir, *extra):
    from sparse_runner.config import validate

    return validate(compose_config(tiny_mt(data_dir, *extra), cache_dir=cache_dir, tiny=False))


@pytest.fixture(scope="module")
def pair_dir(tmp_path_factory):
    return write_pair_files(tmp_path_factory.mktemp("pairs"))


def test_translation_run_writes_scores_hypotheses_and_analysis(pair_dir, cache_dir, tmp_path):
    cfg = compose_mt(pair_dir, cache_dir, "model=entmax")
    run(cfg, tmp_path / "run")
    m = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert m["status"] == "completed" and m["task_family"] == "translation"
    for split in ("val", "test"):
        for key in ("loss", "ppl", "bleu", "sacrebleu", "chrf"):
            assert f"{split}/{key}" in m["metrics"]
        assert 0.0 <= m["metrics"][f"{split}/bleu"] <= 100.0
    assert m["selection"]["metric"] == "val/bleu" and m["selection"]["mode"] == "max"
    info = m["task_info"]
    assert info["sacrebleu_signature"].startswith("nrefs:1|") and "Moses" in info["bleu_tokenization"]
    hyps = (tmp_path / "run" / "outputs" / "test.hyp").read_text().splitlines()
    assert len(hyps) == 24
    # the per-sentence BLEU statistics give back the corpus BLEU of the test split
    record = example_scores.read(open(tmp_path / "run" / "test_examples.npz", "rb"))
    assert record.metric == "test/bleu" and len(record) == 24 and m["test_examples"]["reducer"] == "bleu"
    assert record.value() == pytest.approx(m["metrics"]["test/bleu"], rel=1e-9, abs=1e-9)
    # alpha-entmax: a learned alpha per head in each layer of all three attention types
    alpha = m["analysis"]["alpha"]
    assert [t for t in alpha] == ["encoder_self", "context", "decoder_self"]
    assert alpha["encoder_self"]["count"] == 2 and alpha["context"]["count"] == 4 and alpha["decoder_self"]["count"] == 4
    attention = m["analysis"]["attention"]
    assert set(attention) == {"encoder_self", "context", "decoder_self"}
    for kind in attention.values():
        for layer in kind["layers"]:
            assert 0.0 < layer["mean_density"] <= 1.0 and 0.0 <= layer["js"] <= 1.0
    assert any(Path(f).name == "alpha_histogram.png" for f in m["figures"])


def test_preempted_translation_resumes_exactly(pair_dir, cache_dir, tmp_path, monkeypatch):
    """SIGUSR1 after step 8, then the same command again: the uninterrupted run's metrics and output."""
    cfg = compose_mt(pair_dir, cache_dir)
    run(cfg, tmp_path / "straight")
    with monkeypatch.context() as patch:
        on_train_batch(patch, TranslationTask, 8, lambda: os.kill(os.getpid(), signal.SIGUSR1))
        with pytest.raises(Preempted):
            run(cfg, tmp_path / "resumed")
    assert json.loads((tmp_path / "resumed" / "metrics.json").read_text())["status"] == "preempted"
    run(cfg, tmp_path / "resumed")
    a, b = (json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("straight", "resumed"))
    assert a["metrics"] == b["metrics"] and b["status"] == "completed"
    assert (tmp_path / "straight" / "outputs" / "test.hyp").read_text() == (tmp_path / "resumed" / "outputs" / "test.hyp").read_text()


def test_tokenizer_is_trained_once_and_shared(pair_dir, cache_dir):
    first = build_task(compose_mt(pair_dir, cache_dir))
    mtime = os.path.getmtime(first.tokenizer.path)
    second = build_task(compose_mt(pair_dir, cache_dir, "model=sparsemax", "seed=3"))
    assert second.tokenizer.path == first.tokenizer.path and os.path.getmtime(second.tokenizer.path) == mtime
    other = build_task(compose_mt(pair_dir, cache_dir, "task.vocab_size=60"))
    assert other.tokenizer.path != first.tokenizer.path


def test_translation_batches_hold_at_most_batch_tokens(pair_dir, cache_dir):
    task = build_task(compose_mt(pair_dir, cache_dir))
    lengths = task.train_lengths()
    plan = task.plan_epoch(seed=0, epoch=0, batch_size=16, bucket_size=10, max_tokens=256)
    assert sorted(np.concatenate(plan).tolist()) == list(range(len(lengths)))
    for batch in plan:
        assert len(batch) * lengths[batch].max() <= 256 or len(batch) == 1
        made = task.make_batch("train", batch, "cpu")
        assert made["tgt_in"].shape == made["tgt_out"].shape and made["num_tokens"] == int(made["tgt_lengths"].sum())
    again = task.plan_epoch(seed=0, epoch=0, batch_size=16, bucket_size=10, max_tokens=256)
    assert all((x == y).all() for x, y in zip(plan, again))


def test_token_batching_plans():
    lengths = np.array([5, 50, 7, 300, 12, 9, 40, 3])
    for plan in (plan_eval(lengths, 4, max_tokens=100), plan_epoch(lengths, 4, seed=1, epoch=0, max_tokens=100)):
        assert sorted(np.concatenate(plan).tolist()) == list(range(8))
        for batch in plan:
            assert len(batch) * lengths[batch].max() <= 100 or len(batch) == 1  # 300 > 100 travels alone


def test_offline_hub_task_is_one_line(tmp_path, cache_dir):
    """The design card's command, with the hub unreachable: one line on stderr, exit 2, no traceback."""
    env_backup = {k: os.environ.get(k) for k in ("HF_ENDPOINT", "HF_HOME")}
    os.environ.update(HF_ENDPOINT="http://127.0.0.1:9", HF_HOME=str(tmp_path / "hf"))
    try:
        proc = sparse_run(["model=entmax", "task=iwslt17_de_en", f"paths.output_dir={tmp_path}"], tmp_path, cache_dir, timeout=120)
    finally:
        for k, v in env_backup.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "iwslt17_de_en" in lines[0] and "task.source=files task.data_dir=" in lines[0]
    assert not list(tmp_path.glob("runs/*/metrics.json"))


def test_local_files_train_to_a_sensible_bleu(pair_dir, cache_dir, tmp_path):
    """Long enough to learn the made-up pair: BLEU far above an untrained model's."""
    cfg = compose_mt(
        pair_dir, cache_dir, "model.d_model=64", "model.ffn_dim=128", "model.num_heads=4", "trainer.max_steps=300",
        "trainer.eval_every=150", "trainer.lr=3e-3", "trainer.warmup_steps=30", "trainer.analysis=false", "trainer.label_smoothing=0.0",
    )
    run(cfg, tmp_path / "run")
    m = json.loads((tmp_path / "run" / "metrics.json").read_text())["metrics"]
    assert m["test/bleu"] > 40, m  # an untrained model scores ~0
