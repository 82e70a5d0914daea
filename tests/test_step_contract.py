"""The trainer's side of the task contract: named stats and regulariser terms reach the step log and
TensorBoard for every task, evaluation is sums -> finalise, and the distributed seam adds a sharded
evaluation up to the single-process metrics."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from sparse_runner.run import run
from sparse_runner.tasks.listops import ListOpsTask
from sparse_runner.training import distributed
from sparse_runner.training.regularisers import symmetric_kl


def step_rows(run_dir: Path) -> list[dict]:
    return [row for row in map(json.loads, (run_dir / "log.jsonl").read_text().splitlines()) if "train/loss" in row]


def tensorboard_tags(run_dir: Path) -> set[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tb"))
    events.Reload()
    return set(events.Tags()["scalars"])


def test_symmetric_kl():
    a = torch.randn(3, 5, 7)
    assert symmetric_kl(a, a).item() == pytest.approx(0.0, abs=1e-7)
    b = a + torch.randn(3, 5, 7)
    assert symmetric_kl(a, b).item() > 0 and symmetric_kl(a, b).item() == pytest.approx(symmetric_kl(b, a).item())
    mask = torch.zeros(3, 5, dtype=torch.bool)
    mask[:, :2] = True
    c = b.clone()
    c[:, 2:] = a[:, 2:] + 100.0  # differences where the mask is False do not count
    assert symmetric_kl(a, c, mask).item() == pytest.approx(symmetric_kl(a[:, :2], b[:, :2]).item(), rel=1e-5)


def test_task_stats_reach_the_step_log_and_tensorboard(tiny_config, tmp_path, monkeypatch):
    original = ListOpsTask.forward_loss

    def forward_loss(self, model, batch):
        out = original(self, model, batch)
        out.stats["examples"] = float(len(batch["labels"]))
        return out

    monkeypatch.setattr(ListOpsTask, "forward_loss", forward_loss)
    run(tiny_config("trainer.max_steps=10", "trainer.eval_every=10"), tmp_path)
    rows = step_rows(tmp_path)
    assert [row["train/examples"] for row in rows] == [16.0, 16.0]  # window means of batch_size=16
    assert "train/examples" in tensorboard_tags(tmp_path)


def test_rdrop_regulariser_applies_to_a_task_and_is_logged(tiny_config, tmp_path):
    run(tiny_config("trainer.max_steps=10", "trainer.eval_every=10"), tmp_path / "plain")
    run(tiny_config("trainer.max_steps=10", "trainer.eval_every=10", "regulariser=rdrop", "model.regulariser_options.weight=2.0"), tmp_path / "rdrop")
    plain, rdrop = step_rows(tmp_path / "plain"), step_rows(tmp_path / "rdrop")
    assert all("train/rdrop_kl" not in row for row in plain)
    # Dropout 0.1 makes two passes differ: a positive KL, added (x2) to the optimised loss.
    assert all(math.isfinite(row["train/rdrop_kl"]) and row["train/rdrop_kl"] > 0 for row in rdrop)
    assert rdrop[0]["train/loss"] != plain[0]["train/loss"]
    assert "train/rdrop_kl" in tensorboard_tags(tmp_path / "rdrop")


def test_single_process_seam_is_the_identity():
    assert not distributed.is_distributed() and distributed.is_main() and distributed.world_size() == 1
    plan = [1, 2, 3]
    assert distributed.shard(plan) == plan
    sums = {"loss": 1.5, "items": [(0, "a")]}
    assert distributed.all_reduce_sums(sums) is sums


def _evaluate_on_rank(rank: int, world: int, init_file: str, overrides: list[str], cache_dir: str, out_dir: str) -> None:
    """One rank of a gloo group: build the tiny run, evaluate 'val' on its shard, write the metrics, and leave
    the group as a launched run does (`distributed.teardown`), so that an exit that aborts fails the test."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        _write_rank_metrics(rank, overrides, cache_dir, out_dir)
        dist.barrier()  # no rank leaves (closing its connections) while another still receives
    finally:
        distributed.teardown()


def _write_rank_metrics(rank: int, overrides: list[str], cache_dir: str, out_dir: str) -> None:
    from sparse_runner.config import validate
    from sparse_runner.run import fingerprint
    from sparse_runner.tasks import build_task
    from sparse_runner.training.trainer import Trainer
    from tests.conftest import compose_config

    cfg = validate(compose_config(overrides, cache_dir=Path(cache_dir)))
    task = build_task(cfg)
    torch.manual_seed(0)
    trainer = Trainer(cfg, task, task.build_model(cfg.model), Path(out_dir) / "run", torch.device("cpu"), fingerprint=fingerprint(cfg))
    metrics = trainer.evaluate("val")
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"metrics": metrics, "shard": len(distributed.shard(task.eval_plan("val")))}))


def test_sharded_evaluation_adds_up_to_the_single_process_metrics(tiny_config, cache_dir, tmp_path):
    overrides = ["trainer.batch_size=8"]
    tiny_config(*overrides)  # generates the data once, in this process
    # The single process: this one, without a process group (as a run without torchrun), on one thread as each rank.
    single_dir = tmp_path / "single"
    single_dir.mkdir()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _write_rank_metrics(0, overrides, str(cache_dir), str(single_dir))
    finally:
        torch.set_num_threads(threads)
    out = tmp_path / "world2"
    out.mkdir()
    mp.spawn(_evaluate_on_rank, args=(2, str(out / "init"), overrides, str(cache_dir), str(out)), nprocs=2, join=True)
    single = json.loads((single_dir / "rank0.json").read_text())
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["shard"] + ranks[1]["shard"] == single["shard"] and ranks[1]["shard"] > 0
    for rank in ranks:  # every rank ends with the same, whole-split metrics
        assert rank["metrics"]["val/accuracy"] == single["metrics"]["val/accuracy"]
        assert rank["metrics"]["val/majority_accuracy"] == single["metrics"]["val/majority_accuracy"]
        assert rank["metrics"]["val/loss"] == pytest.approx(single["metrics"]["val/loss"], rel=1e-6)
