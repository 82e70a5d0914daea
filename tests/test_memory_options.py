"""Memory and precision options of the trainer: per-layer activation checkpointing (the same gradients
with dropout on, SAR's shifted pass included; evaluation, analysis and cached decoding never
checkpoint) and bf16 autocast on CPU (finite, exactly resumable; fp16 refused on CPU)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.utils.checkpoint

from sparse_runner.checks import ConfigError
from sparse_runner.config import validate
from sparse_runner.run import run
from sparse_runner.tasks import build_task
from sparse_runner.tasks.listops import ListOpsTask
from sparse_runner.training.trainer import Trainer
from tests.conftest import compose_config, on_train_batch, simulated_crash
from tests.test_language_modeling import TINY_LM, write_corpus
from tests.test_translation_task import tiny_mt, write_pair_files

DROPOUT = ["model.dropout=0.3", "model.attention_dropout=0.2"]  # dropout on, so the recomputation must replay its masks


@pytest.fixture(scope="module")
def data_dirs(tmp_path_factory) -> dict[str, Path]:
    return {"lm": write_corpus(tmp_path_factory.mktemp("lm")), "mt": write_pair_files(tmp_path_factory.mktemp("mt"))}


def config(kind: str, data_dirs: dict[str, Path], cache_dir: Path, *extra: str):
    """A tiny validated config of one model kind: classifier (ListOps), sar (ERNIE-Sparse), seq2seq, lm."""
    if kind == "seq2seq":
        overrides, tiny = tiny_mt(data_dirs["mt"], *extra), False
    elif kind == "lm":
        overrides, tiny = [*TINY_LM, f"task.data_dir={data_dirs['lm']}", *extra], False
    elif kind == "sar":  # SAR's second pass with every block boundary moved 3 tokens
        overrides, tiny = ["model=ernie_sparse", "model.pattern_options.block_size=8", "model.regulariser_options.shift=3", *extra], True
    else:
        overrides, tiny = list(extra), True
    return validate(compose_config(overrides, cache_dir=cache_dir, tiny=tiny))


def step_gradients(cfg, tmp_path: Path, seed: int = 1) -> tuple[float, dict[str, torch.Tensor]]:
    """Loss and float64 parameter gradients of one training step (task loss + regularisers) on the first batch."""
    task = build_task(cfg)
    torch.manual_seed(0)
    model = task.build_model(cfg.model).double()
    trainer = Trainer(cfg, task, model, tmp_path, torch.device("cpu"), fingerprint={})
    plan = task.plan_epoch(seed=0, epoch=0, batch_size=8, bucket_size=1, max_tokens=cfg.trainer.batch_tokens)
    batch = task.make_batch("train", plan[0], torch.device("cpu"))
    torch.manual_seed(seed)  # the dropout masks
    out = trainer.training_step(batch)
    out.loss.backward()
    return float(out.loss.detach()), {name: p.grad for name, p in model.named_parameters() if p.grad is not None}


class CheckpointCalls:
    """Wraps torch.utils.checkpoint.checkpoint: records whether each call was made with gradients on."""

    def __init__(self, monkeypatch) -> None:
        self.grad_enabled: list[bool] = []
        original = torch.utils.checkpoint.checkpoint

        def checkpoint(*args, **kwargs):
            self.grad_enabled.append(torch.is_grad_enabled())
            return original(*args, **kwargs)

        monkeypatch.setattr(torch.utils.checkpoint, "checkpoint", checkpoint)


# ------------------------------------------------------------------------------ activation checkpointing
@pytest.mark.parametrize("kind", ["classifier", "sar", "seq2seq", "lm"])
def test_checkpointed_gradients_equal_plain_ones_with_dropout(kind, data_dirs, cache_dir, tmp_path, monkeypatch):
    calls = CheckpointCalls(monkeypatch)
    plain_loss, plain = step_gradients(config(kind, data_dirs, cache_dir, *DROPOUT), tmp_path / "plain")
    assert not calls.grad_enabled
    loss, checkpointed = step_gradients(config(kind, data_dirs, cache_dir, *DROPOUT, "trainer.activation_checkpointing=true"), tmp_path / "ckpt")
    layers = {"classifier": 2, "sar": 2 * 2, "seq2seq": 1 + 2, "lm": 2}[kind]  # SAR runs the 2 encoder layers twice
    assert len(calls.grad_enabled) == layers
    assert loss == plain_loss
    assert checkpointed.keys() == plain.keys()
    for name in plain:
        torch.testing.assert_close(checkpointed[name], plain[name], rtol=1e-10, atol=1e-12, msg=name)
    # The comparison has power: other dropout masks give other gradients.
    _, other = step_gradients(config(kind, data_dirs, cache_dir, *DROPOUT), tmp_path / "other", seed=2)
    assert any(not torch.allclose(other[name], plain[name]) for name in plain)


def test_recomputation_sees_the_shift_of_its_forward_pass(data_dirs, cache_dir, tmp_path):
    """SAR's shifted pass ends (shifted_blocks exits) before backward recomputes its layers: the
    recomputation must still see shift 3, the first pass's recomputation shift 0."""
    cfg = config("sar", data_dirs, cache_dir, *DROPOUT, "trainer.activation_checkpointing=true")
    task = build_task(cfg)
    model = task.build_model(cfg.model)
    trainer = Trainer(cfg, task, model, tmp_path, torch.device("cpu"), fingerprint={})
    layer, layout = model.encoder.layers[0], model.encoder.layout
    seen, forward = [], layer.forward

    def spy(*args, **kwargs):
        seen.append((torch.is_grad_enabled() and not torch.is_inference_mode_enabled(), layout.shift))
        return forward(*args, **kwargs)

    layer.forward = spy
    batch = task.make_batch("train", task.plan_epoch(seed=0, epoch=0, batch_size=8, bucket_size=1, max_tokens=None)[0], torch.device("cpu"))
    out = trainer.training_step(batch)
    forward_shifts = [shift for _, shift in seen]
    assert forward_shifts == [0, 3]
    out.loss.backward()
    recomputed = [shift for _, shift in seen[2:]]
    assert sorted(recomputed) == [0, 3] and layout.shift == 0


def test_checkpointed_translation_run_equals_plain_run(data_dirs, cache_dir, tmp_path, monkeypatch):
    """A whole run (training, validation with greedy decoding, test with cached beam search, the
    attention analysis) gives the same metrics, hypotheses and analysis; only training checkpoints."""
    run(config("seq2seq", data_dirs, cache_dir, "trainer.max_steps=6", "trainer.eval_every=3"), tmp_path / "plain")
    calls = CheckpointCalls(monkeypatch)
    run(config("seq2seq", data_dirs, cache_dir, "trainer.max_steps=6", "trainer.eval_every=3", "trainer.activation_checkpointing=true"), tmp_path / "ckpt")
    assert calls.grad_enabled and all(calls.grad_enabled)
    assert len(calls.grad_enabled) == 6 * 3  # steps x (1 encoder + 2 decoder layers): never in evaluation
    plain, ckpt = (json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("plain", "ckpt"))
    assert ckpt["status"] == "completed"
    assert ckpt["metrics"] == plain["metrics"] and ckpt["analysis"] == plain["analysis"]
    assert (tmp_path / "ckpt/outputs/test.hyp").read_text() == (tmp_path / "plain/outputs/test.hyp").read_text()


def test_activation_checkpointing_must_be_a_bool(tiny_config):
    with pytest.raises(ConfigError) as error:
        tiny_config("trainer.activation_checkpointing=sometimes")
    assert str(error.value).startswith("trainer.activation_checkpointing:") and "\n" not in str(error.value)


# ------------------------------------------------------------------------------ bf16 on CPU
def test_bf16_cpu_run_is_finite_and_resumes_exactly(tiny_config, tmp_path, monkeypatch):
    overrides = ("trainer.precision=bf16", "trainer.device=cpu", "trainer.max_steps=20")
    dtypes = set()
    original = ListOpsTask.forward_loss

    def forward_loss(self, model, batch):
        out = original(self, model, batch)
        dtypes.add(out.logits.dtype)
        return out

    with monkeypatch.context() as patch:
        patch.setattr(ListOpsTask, "forward_loss", forward_loss)
        run(tiny_config(*overrides), tmp_path / "straight")
    assert dtypes == {torch.bfloat16}  # autocast really ran on CPU
    with monkeypatch.context() as patch:
        on_train_batch(patch, ListOpsTask, 13, simulated_crash)
        with pytest.raises(RuntimeError, match="simulated crash"):
            run(tiny_config(*overrides), tmp_path / "resumed")
    run(tiny_config(*overrides), tmp_path / "resumed")
    straight, resumed = (json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("straight", "resumed"))
    assert resumed["status"] == "completed"
    assert resumed["metrics"] == straight["metrics"] and resumed["selection"] == straight["selection"]
    logs = [[json.loads(line) for line in (tmp_path / d / "log.jsonl").read_text().splitlines()] for d in ("straight", "resumed")]
    losses = [[row["train/loss"] for row in rows if "train/loss" in row] for rows in logs]
    assert losses[0] == losses[1] and all(math.isfinite(x) for x in losses[0])


def test_fp16_on_cpu_is_refused_in_one_line(tiny_config, tmp_path):
    with pytest.raises(ConfigError) as error:
        run(tiny_config("trainer.precision=fp16", "trainer.device=cpu"), tmp_path)
    assert str(error.value) == "trainer.precision: fp16 runs on GPU only, and this run is on cpu; valid: fp32, bf16"
