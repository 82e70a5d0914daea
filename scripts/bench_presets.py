#!/usr/bin/env python
"""What every paper preset costs on this device: seconds per training step and the GPU-hours of a full run.

Paper presets: conf/experiment/*.yaml except the CPU presets (*_cpu) and the studies (*study*). For each, with
its default model and trainer.device=<device>, the task is built from what is on this machine, then
`MinimalTraining` (scripts/benchmarking.py: the preset's model, optimiser, schedule and precision; no evaluation,
logging or checkpoints) runs --warmup untimed and --steps timed steps. Full run = trainer.max_steps x seconds per
step / 3600 hours; a preset with a pre-training stage (pretrain=..., `config.pretrain_config`) has the stage
measured the same way and added. Evaluation and checkpoints are not counted: the figures are lower bounds.

Data: nothing is downloaded unless --allow-downloads (HF_HUB_OFFLINE=1 and HF_DATASETS_OFFLINE=1 otherwise).
Tasks whose data are generated (ListOps, Pathfinder) generate a few thousand examples (GENERATED_DATA): a
step's shapes do not depend on how many there are, and the table says "generated, N examples". A task whose
data are not on this machine is "not measured (needs ...)" with the loader's one-line reason.

    python scripts/bench_presets.py --device cuda                        # every preset, ~1 min where data are missing
    python scripts/bench_presets.py --device cuda --presets lra_listops,lra_text --steps 50

Writes <out>/presets_<device>.json and .md (default out: outputs/bench/presets), rewritten after every preset.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from benchmarking import add_device_argument, device_description, failed_cell, require_device, write_benchmark

# task.name -> overrides that generate fewer examples of the same shapes (the full sets take minutes to hours).
GENERATED_DATA = {
    "listops_lra": ["task.generator.num_train=3000", "task.generator.num_val=64", "task.generator.num_test=64"],
    "pathfinder": ["task.num_train=2048", "task.num_val=64", "task.num_test=64"],
}


def experiments_dir() -> Path:
    """The experiment= presets' folder (the package's own conf/)."""
    from sparse_runner.config import CONF_DIR

    return Path(CONF_DIR) / "experiment"


def paper_presets() -> list[str]:
    """The experiment= presets that reproduce a paper at its size: every one but *_cpu and the studies."""
    return sorted(p.stem for p in experiments_dir().glob("*.yaml") if not p.stem.endswith("_cpu") and "study" not in p.stem)


def data_note(cfg) -> str:
    """Where the stage's data come from, for the table."""
    from omegaconf import OmegaConf

    task = cfg.task
    if task.name in GENERATED_DATA:
        examples = OmegaConf.select(cfg, "task.generator.num_train", default=None) or OmegaConf.select(cfg, "task.num_train", default=None)
        return f"generated, {examples} training examples"
    return task.get("hf_path") or task.get("data_dir") or task.name


def measure_stage(cfg, device: str, warmup: int, steps: int) -> dict:
    """One stage (the run, or its pre-training): its task built here, then `measure_training`. Returns the
    measurement with "max_steps" and "gpu_hours", or {"not_measured": "needs <data>", "reason": the loader's message}
    when its data are not here."""
    from benchmarking import measure_training
    from sparse_runner.data.errors import DataUnavailable
    from sparse_runner.tasks import build_task

    base = {"task": cfg.task.name, "data": data_note(cfg), "max_steps": cfg.trainer.max_steps, "precision": cfg.trainer.precision,
            "batch_size": cfg.trainer.batch_size}
    try:
        task = build_task(cfg)
    except (DataUnavailable, OSError, ImportError, ConnectionError) as error:
        return {**base, "not_measured": f"needs {base['data']}", "reason": " ".join(str(error).split())}
    try:
        measured = measure_training(cfg, task, device, warmup, steps)
    except Exception as error:  # noqa: BLE001 -- a row of the table, never the end of the run
        return {**base, "not_measured": failed_cell(error, device)}
    return {**base, **measured, "gpu_hours": cfg.trainer.max_steps * measured["seconds_per_step"] / 3600}


def measure_preset(preset: str, device: str, warmup: int, steps: int, overrides: list[str]) -> dict:
    """{"preset", "model", "stages": [run, pre-training?], "gpu_hours"}: gpu_hours is the sum over the stages,
    None when one of them was not measured."""
    from omegaconf import OmegaConf

    from benchmarking import compose_run_config
    from sparse_runner.config import pretrain_config, validate

    base = [f"experiment={preset}", f"trainer.device={device}"]
    cfg = compose_run_config([*base, *overrides])
    extra = [o for o in GENERATED_DATA.get(cfg.task.name, []) if o.split("=")[0] not in {x.split("=")[0] for x in overrides}]
    if extra:
        cfg = compose_run_config([*base, *extra, *overrides])
    stages = [{"stage": "run", **measure_stage(cfg, device, warmup, steps)}]
    if cfg.pretrain.task is not None:
        pre = pretrain_config(cfg)
        OmegaConf.update(pre, "trainer.device", device)
        stages.insert(0, {"stage": "pre-training", **measure_stage(validate(pre), device, warmup, steps)})
    hours = [s.get("gpu_hours") for s in stages]
    return {"preset": preset, "model": cfg.model.name, "stages": stages, "gpu_hours": None if None in hours else sum(hours)}


def markdown(result: dict) -> list[str]:
    meta = result["meta"]
    where = meta.get("gpu") or meta.get("cpu") or meta["device"]
    lines = [
        f"# Paper presets on {where}: seconds per step and the cost of a full run",
        "",
        f"Default model of each preset; `MinimalTraining` (scripts/benchmarking.py), {meta['warmup']} warm-up then "
        f"{meta['steps']} timed steps; hours = max_steps x s/step / 3600, pre-training stage added (evaluation and "
        f"checkpoints not counted). Overrides: {' '.join(meta['overrides']) or 'none'}.",
        "",
        "| preset | model | stage | data | batch | precision | s/step | max_steps | hours | peak memory GiB | preset hours |",
        "|---|---|---|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for row in result["presets"]:
        if "not_measured" in row:  # the config itself failed
            lines.append(f"| {row['preset']} | | | | | | not measured ({row['not_measured']}) | | | | |")
            continue
        for i, s in enumerate(row["stages"]):
            total = "" if i < len(row["stages"]) - 1 else ("-" if row["gpu_hours"] is None else f"{row['gpu_hours']:.1f}")
            head = f"| {row['preset']} | {row['model']} | {s['stage']} | {str(s['data']).replace('|', '/')} | {s['batch_size']} | {s['precision']} |"
            if "not_measured" in s:
                why = s["not_measured"].replace("|", "/")
                lines.append(f"{head} not measured ({why}) | {s['max_steps']} | | | {total} |")
                continue
            peak = "-" if s["peak_mib"] is None else f"{s['peak_mib'] / 1024:.1f}"
            lines.append(f"{head} {s['seconds_per_step']:.3f} | {s['max_steps']} | {s['gpu_hours']:.2f} | {peak} | {total} |")
    lines += ["", f"- {where}; torch {meta['torch']}; run time {meta.get('seconds', '?')} s; command: `{meta['command']}`", ""]
    return lines


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_device_argument(p)
    p.add_argument("--presets", default=None, help="comma-separated experiment= presets (default: every paper preset)")
    p.add_argument("--steps", type=int, default=20, help="timed training steps per stage")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps per stage before them")
    p.add_argument("--time-budget", type=float, default=None, help="seconds; presets not started by then are not measured")
    p.add_argument("--allow-downloads", action="store_true", help="let tasks download their data (default: what is on this machine only)")
    p.add_argument("--out", type=Path, default=Path("outputs/bench/presets"))
    p.add_argument("--overrides", nargs="*", default=[], help="config overrides after each preset (e.g. a smaller model for a smoke run)")
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    valid = paper_presets()
    args.presets = [x.strip() for x in args.presets.split(",") if x.strip()] if args.presets else valid
    known = {p.stem for p in experiments_dir().glob("*.yaml")}
    unknown = [x for x in args.presets if x not in known]
    if unknown:
        p.error(f"unknown presets {unknown}; paper presets: {', '.join(valid)}")
    if args.steps < 1 or args.warmup < 0:
        p.error("--steps must be >= 1 and --warmup >= 0")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    if not args.allow_downloads:  # read by datasets / huggingface_hub when they are imported
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    device = require_device(args.device)
    deadline = time.monotonic() + args.time_budget if args.time_budget else None
    start = time.time()
    result = {"benchmark": "presets", "meta": {**device_description(device), "warmup": args.warmup, "steps": args.steps,
                                               "overrides": args.overrides, "command": " ".join(["python", "scripts/bench_presets.py", *args.argv])},
              "presets": []}
    for preset in args.presets:
        if deadline is not None and time.monotonic() > deadline:
            row = {"preset": preset, "not_measured": "time budget spent"}
        else:
            try:
                row = measure_preset(preset, str(device), args.warmup, args.steps, args.overrides)
            except Exception as error:  # noqa: BLE001 -- e.g. a config that does not compose here
                row = {"preset": preset, "not_measured": failed_cell(error, device)[len("n/a ("):-1], "reason": f"{type(error).__name__}: {error}"}
        result["presets"].append(row)
        print(f"preset {preset}: {row.get('gpu_hours', row.get('not_measured'))}", file=sys.stderr, flush=True)
        result["meta"]["seconds"] = round(time.time() - start, 1)
        last = preset == args.presets[-1]
        write_benchmark(args.out, f"presets_{device.type}", result, markdown(result), echo=last)
    return result


if __name__ == "__main__":
    main()
