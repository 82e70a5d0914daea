"""Helpers shared by the benchmark scripts in scripts/ (timing only; nothing here is used by a run)."""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from sparse_runner.run import seed_everything
from sparse_runner.training.schedules import build_scheduler
from sparse_runner.training.trainer import optimizer_groups


def minimal_training_tokens_per_s(cfg, task, steps: int | None = None, device: str = "cpu") -> tuple[float, int]:
    """Train cfg's model on cfg's task with a hand-written loop, as a researcher would write it:
    AdamW, clipping and the lr schedule, no logging, checkpoints or progress. Returns (tokens/s, tokens)."""
    t = cfg.trainer
    steps = steps or t.max_steps
    seed_everything(cfg.seed, t.deterministic)
    model = task.build_model(cfg.model).to(device)
    model.train()
    opt = torch.optim.AdamW(optimizer_groups(model, t.lr, t.weight_decay, t.alpha_lr_scale), lr=t.lr, betas=tuple(t.betas))
    sched = build_scheduler(opt, schedule=t.schedule, warmup_steps=t.warmup_steps, max_steps=t.max_steps, min_lr_ratio=t.min_lr_ratio)
    epoch, index = 0, 0
    plan = task.plan_epoch(seed=cfg.seed, epoch=0, batch_size=t.batch_size, bucket_size=t.bucket_size)
    tokens = 0
    start = time.perf_counter()
    for _ in range(steps):
        if index == len(plan):
            epoch, index = epoch + 1, 0
            plan = task.plan_epoch(seed=cfg.seed, epoch=epoch, batch_size=t.batch_size, bucket_size=t.bucket_size)
        batch = task.make_batch("train", plan[index], torch.device(device))
        index += 1
        loss = F.cross_entropy(model(batch["tokens"], batch["lengths"]), batch["labels"])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if t.clip_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), t.clip_grad_norm)
        opt.step()
        sched.step()
        tokens += batch["num_tokens"]
    return tokens / (time.perf_counter() - start), tokens
