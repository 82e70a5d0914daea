"""Helpers shared by the benchmark scripts in scripts/ (timing only; nothing here is used by a run)."""

from __future__ import annotations

import statistics
import sys
import time

import torch

from sparse_runner.run import seed_everything
from sparse_runner.training.schedules import build_scheduler
from sparse_runner.training.trainer import optimizer_groups


def minimal_training_tokens_per_s(cfg, task, steps: int | None = None, device: str = "cpu") -> tuple[float, int]:
    """Train cfg's model on cfg's task with a hand-written loop, as a researcher would write it:
    AdamW, clipping and the lr schedule, no logging, checkpoints or progress. Returns (tokens/s, tokens)."""
    _, tokens_per_s, tokens = train_minimal(cfg, task, steps, device)
    return tokens_per_s, tokens


def train_minimal(cfg, task, steps: int | None = None, device: str = "cpu") -> tuple[torch.nn.Module, float, int]:
    """The loop of `minimal_training_tokens_per_s`; returns (trained model, tokens/s, tokens)."""
    t = cfg.trainer
    steps = t.max_steps if steps is None else steps
    seed_everything(cfg.seed, t.deterministic)
    model = task.build_model(cfg.model).to(device)
    model.train()
    opt = torch.optim.AdamW(optimizer_groups(model, t.lr, t.weight_decay, t.alpha_lr_scale), lr=t.lr, betas=tuple(t.betas))
    sched = build_scheduler(opt, schedule=t.schedule, warmup_steps=t.warmup_steps, max_steps=t.max_steps, min_lr_ratio=t.min_lr_ratio)
    epoch, index = 0, 0
    plan = task.plan_epoch(seed=cfg.seed, epoch=0, batch_size=t.batch_size, bucket_size=t.bucket_size, max_tokens=t.batch_tokens)
    tokens = 0
    start = time.perf_counter()
    for _ in range(steps):
        if index == len(plan):
            epoch, index = epoch + 1, 0
            plan = task.plan_epoch(seed=cfg.seed, epoch=epoch, batch_size=t.batch_size, bucket_size=t.bucket_size, max_tokens=t.batch_tokens)
        batch = task.make_batch("train", plan[index], torch.device(device))
        index += 1
        loss = task.forward_loss(model, batch).loss  # the task's forward + loss, nothing else
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if t.clip_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), t.clip_grad_norm)
        opt.step()
        sched.step()
        tokens += batch["num_tokens"]
    return model, tokens / (time.perf_counter() - start), tokens


def training_throughput(models: list[str], steps: int, rounds: int, overrides: list[str]) -> list[dict]:
    """Training tokens/s of the same config with each model= option, as ratios to softmax.

    Rounds alternate between the models so that machine noise hits them alike; medians are reported.
    """
    from hydra import compose, initialize_config_dir

    from sparse_runner.config import CONF_DIR, validate
    from sparse_runner.tasks import build_task

    configs = {}
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        for model in models:
            configs[model] = validate(compose(config_name="config", overrides=[f"model={model}", "trainer.device=cpu", *overrides]))
    task = build_task(configs[models[0]])
    tps: dict[str, list[float]] = {m: [] for m in models}
    minimal_training_tokens_per_s(configs[models[0]], task, steps=min(steps, 20))  # warm-up
    for _ in range(rounds):
        for model in models:
            tps[model].append(minimal_training_tokens_per_s(configs[model], task, steps=steps)[0])
            print(f"training {model}: {tps[model][-1]:.0f} tok/s", file=sys.stderr)
    med = {m: statistics.median(v) for m, v in tps.items()}
    return [{"model": m, "tokens_per_s": med[m], "rounds": tps[m], "x_softmax": med[m] / med["softmax"]} for m in models]


def training_markdown(rows: list[dict], steps: int, rounds: int, overrides: list[str], paper: dict[str, float] | None = None) -> list[str]:
    """Markdown lines for `training_throughput` rows; `paper` adds a column of published ratios."""
    head = f"## Training tokens/s ({steps} steps x {rounds} rounds, medians; overrides: {' '.join(overrides) or 'none'})"
    cols = "| model | tokens/s | x softmax |" + (" paper |" if paper else "")
    rule = "|---|---:|---:|" + ("---:|" if paper else "")
    lines = [head, "", cols, rule]
    for r in rows:
        extra = f" {paper[r['model']]:.2f} |" if paper and r["model"] in paper else (" |" if paper else "")
        lines.append(f"| {r['model']} | {r['tokens_per_s']:.0f} | {r['x_softmax']:.2f} |{extra}")
    return lines + [""]


def write_benchmark(out_dir, name: str, result: dict, markdown: list[str]) -> None:
    """<out_dir>/<name>.json and .md, written atomically; the markdown is also printed."""
    from pathlib import Path

    from sparse_runner.io import atomic_write_json, atomic_write_text

    out = Path(out_dir)
    atomic_write_json(out / f"{name}.json", result)
    atomic_write_text(out / f"{name}.md", "\n".join(markdown) + "\n")
    print("\n".join(markdown))
