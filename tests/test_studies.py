"""The study presets of the claims table (conf/experiment/*_study_cpu.yaml): each is one multirun whose sweep (seeds
included) expands to the jobs its claims read, every job composes and validates, a shrunk job trains through the
real CLI and is recognised by its claim's arm, and the claims' rows say "not run" with the study's command without
runs and compute their verdicts from runs (fake metrics.json files with the studies' resolved configs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparse_runner import cli
from sparse_runner.reporting import collect_runs
from sparse_runner.reporting import claims
from sparse_runner.reporting.claims import HELD, INCONCLUSIVE, NOT_HELD, NOT_RUN
from sparse_runner.reporting.papers import all_claims, bhojanapalli2020
from sparse_runner.reporting.papers.bhojanapalli2020 import bert as bhojanapalli2020_bert, lm as bhojanapalli2020_lm
from sparse_runner.reporting.papers.correia2019 import claims as correia
from sparse_runner.reporting.presets import compose

# study -> (the swept keys' values of its jobs, how many jobs)
STUDIES = {
    correia.STUDY: ({"model": {"softmax", "entmax15", "entmax"}, "seed": {"0", "1", "2"}}, 9),
    bhojanapalli2020_lm.STUDY: ({"model": {"standard_heads", "fixed_head"}, "model.num_heads": {"2", "8", "32"},
                                 "seed": {"0", "1", "2"}}, 18),
    bhojanapalli2020_bert.STUDY: ({"model.head_size": {"32", "128"}, "pretrain": {"mlm_cpu", "none"},
                                   "finetune": {"squad_cpu"}, "seed": {"0", "1", "2"}}, 12),
}
STUDY_CLAIMS = {
    correia.STUDY: correia.PILOT_CLAIMS,   # the confirmatory density claim has a command of its own (below)
    bhojanapalli2020_lm.STUDY: bhojanapalli2020_lm.CLAIMS,
    bhojanapalli2020_bert.STUDY: bhojanapalli2020_bert.CLAIMS,
}


def study_jobs(study: str) -> list[list[str]]:
    """The jobs of `sparse-run -m experiment=<study>`, as the CLI expands them (the preset's own sweep)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    overrides = [f"experiment={study}"]
    with initialize_config_dir(config_dir=str(cli.CONF_DIR), version_base="1.3", job_name="test"):
        return cli.job_override_lists(overrides + cli._config_sweeps(overrides, hydra_compose), True)


@pytest.mark.parametrize("study", STUDIES)
def test_the_study_is_one_multirun_with_its_seeds(study: str):
    values, count = STUDIES[study]
    jobs = study_jobs(study)
    assert len(jobs) == count
    swept: dict[str, set[str]] = {}
    for job in jobs:
        for override in job[1:]:
            key, _, value = override.partition("=")
            swept.setdefault(key, set()).add(value)
    assert swept == values
    cli.preflight([f"experiment={study}"], True, check_resources=False)   # every job composes and validates


def test_the_lm_study_puts_standard_heads_below_the_block():
    config = compose((f"experiment={bhojanapalli2020_lm.STUDY}", "model=standard_heads", "model.num_heads=32"))
    assert config["model"]["d_model"] // 32 == 2 and config["task"]["block_size"] == 128
    assert config["model"]["head_size"] is None and config["trainer"]["patience"]
    fixed = compose((f"experiment={bhojanapalli2020_lm.STUDY}", "model=fixed_head", "model.num_heads=32"))
    assert fixed["model"]["head_size"] == 32


def test_the_claims_table_holds_the_studies_claims_not_run_with_their_commands():
    table = all_claims.tables([])[0]
    notes = "\n".join(table.notes)
    for study, claims in STUDY_CLAIMS.items():
        assert claims
        for claim in claims:
            row = claim.row([])
            assert row.verdict == NOT_RUN, claim.statement
            assert row.commands and all(command == f"sparse-run -m experiment={study}" for command in row.commands)
            assert any(r[0] == claim.statement and r[8] == NOT_RUN for r in table.rows)
        assert f"`sparse-run -m experiment={study}`" in notes
    assert all(claim in bhojanapalli2020.CLAIMS for claim in bhojanapalli2020_lm.CLAIMS + bhojanapalli2020_bert.CLAIMS)
    confirm = correia.CONFIRMATORY_CLAIM
    assert confirm.row([]).verdict == NOT_RUN and confirm.row([]).commands == [correia.CONFIRM_COMMAND]
    assert any(r[0] == confirm.statement and r[8] == NOT_RUN for r in table.rows)
    assert f"`{correia.CONFIRM_COMMAND}`" in notes


def test_the_confirmatory_command_runs_its_seeds_only():
    """The confirmatory density study's command replaces the preset's sweep of models and seeds: 1.5-entmax at
    the fresh seeds 3-7, each job composed as the pilot's but for the seed."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    overrides = correia.CONFIRM_COMMAND.split()[2:]
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(cli.CONF_DIR), version_base="1.3", job_name="test"):
        jobs = cli.job_override_lists(overrides + cli._config_sweeps(overrides, hydra_compose), True)
    assert jobs == [[f"experiment={correia.STUDY}", "model=entmax15", f"seed={seed}"] for seed in range(3, 8)]
    pilot, fresh = compose(tuple(jobs[0][:2]) + ("seed=0",)), compose(tuple(jobs[0]))
    assert {**pilot, "seed": 3} == fresh


# ------------------------------------------------------------------------------------------- fake runs
def write_run(root: Path, name: str, overrides: tuple[str, ...], seed: int, family: str, metrics: dict,
              *, minimise: bool = False, analysis: dict | None = None) -> Path:
    """A completed run's metrics.json with the resolved config of `overrides` at `seed` (what the runner writes)."""
    config = compose((*overrides, f"seed={seed}"))
    primary = next(iter(metrics))
    validation = primary.replace("test/", "val/")
    data = {
        "schema": 2, "status": "completed", "task": config["task"]["name"], "task_family": family,
        "model": config["model"]["name"], "experiment": overrides[0].split("=", 1)[1], "overrides": list(overrides[1:]),
        "config": config, "seed": seed, "primary_metric": primary, "metrics": {**metrics, validation: metrics[primary]},
        "selection": {"metric": validation, "mode": "min" if minimise else "max", "best_value": metrics[primary]},
        "wall_time_s": 600.0, "analysis": analysis,
    }
    run_dir = root / name
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.json").write_text(json.dumps(data))
    return run_dir


def rows(claims, root: Path) -> dict[str, object]:
    records = collect_runs([root])
    return {claim.statement: claim.row(records) for claim in claims}


def analysis(js: float, decoder_self: float, context: float) -> dict:
    types = {"encoder_self": (js, 0.5), "decoder_self": (js, decoder_self), "context": (js, context)}
    return {"attention": {name: {"js_mean": j, "mean_density": d, "layers": []} for name, (j, d) in types.items()}}


def test_correia_claims_from_runs(tmp_path: Path):
    study = f"experiment={correia.STUDY}"
    for seed in range(3):
        wobble = 0.1 * seed
        write_run(tmp_path, f"softmax{seed}", (study, "model=softmax"), seed, "translation", {"test/bleu": 20.0 + wobble},
                  analysis=analysis(0.29 + 0.01 * seed, 1.0, 1.0))   # every arm has a spread (claims.without_spread)
        write_run(tmp_path, f"entmax{seed}", (study, "model=entmax"), seed, "translation", {"test/bleu": 20.2 + wobble},
                  analysis=analysis(0.36 + 0.01 * seed, 0.60 + 0.02 * seed, 0.40))
        write_run(tmp_path, f"entmax15_{seed}", (study, "model=entmax15"), seed, "translation",
                  {"test/bleu": 17.0 + wobble}, analysis=analysis(0.20 + 0.01 * seed, 0.30, 0.45 + 0.01 * seed))
    write_run(tmp_path, "mt_cpu", ("experiment=mt_cpu", "model=entmax"), 5, "translation", {"test/bleu": 40.0})  # no arm's
    found = rows(correia.CLAIMS, tmp_path)
    alpha_bleu = found["α-entmax translates no worse than softmax (by at most 1 BLEU)"]
    assert alpha_bleu.verdict == HELD and alpha_bleu.difference.startswith("+0.20 [")   # above -1: not inferior
    assert alpha_bleu.treatment == "α-entmax: 20.30 ± 0.10 (n=3)" and not alpha_bleu.commands
    assert "non-inferiority" in alpha_bleu.test and "family: Correia" in alpha_bleu.test
    assert found["1.5-entmax translates no worse than softmax (by at most 1 BLEU)"].verdict == NOT_HELD   # 3 BLEU below
    js = found["α-entmax heads are more diverse than softmax's (JS divergence ×100, mean over layers and types)"]
    assert js.verdict == HELD and js.difference.startswith("+7.00 [")
    assert found["1.5-entmax heads are more diverse than softmax's (JS divergence ×100, mean over layers and types)"].verdict == NOT_HELD
    denser = found["α-entmax: the decoder's self-attention is denser than its context attention (head density, %)"]
    assert denser.verdict == HELD and denser.difference.startswith("+22.00 [")
    assert denser.treatment == "α-entmax, decoder self: 62.00 ± 2.00 (n=3)" and "paired" in denser.test
    assert found["1.5-entmax: the decoder's self-attention is denser than its context attention (head density, %)"].verdict == NOT_HELD


def test_a_paired_claim_with_one_seed_has_no_interval(tmp_path: Path):
    write_run(tmp_path, "entmax0", (f"experiment={correia.STUDY}", "model=entmax"), 0, "translation",
              {"test/bleu": 20.0}, analysis=analysis(0.3, 0.6, 0.4))
    denser = rows(correia.CLAIMS, tmp_path)["α-entmax: the decoder's self-attention is denser than its context attention (head density, %)"]
    assert denser.verdict == INCONCLUSIVE and denser.difference == "+20.00 (too few seeds for an interval)"
    assert denser.commands == [correia.STUDY_COMMAND]


@pytest.mark.parametrize("fixed_at_32, expected", [(98.0, HELD), (110.0, NOT_HELD)])
def test_the_lm_trend_claim_from_runs(tmp_path: Path, fixed_at_32: float, expected: str):
    """One trend claim over all the study's runs: perplexity on log2(heads) per geometry (2 heads: x = 1, 8: 3,
    32: 5), standard slope minus fixed slope per doubling. Standard heads rise 2.5 per doubling; fixed heads fall
    0.5 (held), or rise as fast (not held: the difference lies below the SESOI of 0.25)."""
    study = f"experiment={bhojanapalli2020_lm.STUDY}"
    ppl = {("standard_heads", 2): 100.0, ("standard_heads", 8): 105.0, ("standard_heads", 32): 110.0,
           ("fixed_head", 2): 100.0, ("fixed_head", 8): (100.0 + fixed_at_32) / 2, ("fixed_head", 32): fixed_at_32}
    for (model, heads), value in ppl.items():
        for seed in range(3):
            write_run(tmp_path, f"{model}{heads}_{seed}", (study, f"model={model}", f"model.num_heads={heads}"), seed,
                      "lm", {"test/ppl": value + 0.1 * seed}, minimise=True)
    [trend] = rows(bhojanapalli2020_lm.CLAIMS, tmp_path).values()
    assert trend.verdict == expected
    slope = (fixed_at_32 - 100.0) / 4
    assert trend.difference.startswith(f"{2.5 - slope:+.2f} [") and trend.difference.endswith("per doubling")
    assert trend.treatment.startswith("standard heads (d/h): +2.50 per doubling [") and trend.treatment.endswith("(n=9)")
    assert not trend.commands


def test_pretraining_claims_from_runs(tmp_path: Path):
    study = f"experiment={bhojanapalli2020_bert.STUDY}"
    f1 = {("128", True): 30.0, ("128", False): 20.0, ("32", True): 31.0}
    for (size, pretrained), value in f1.items():
        for seed in range(3):
            more = () if pretrained else ("pretrain=none",)
            run_dir = write_run(tmp_path, f"{size}{pretrained}{seed}", (study, f"model.head_size={size}", *more), seed,
                                "squad", {"test/f1": value + seed})
            if pretrained:   # run.py records where the stage put the weights: a path per seed, one group still
                metrics = json.loads((run_dir / "metrics.json").read_text())
                metrics["config"]["model"]["init_from"] = f"outputs/pretrain/mlm_sotu_dp{size}_seed{seed}_{seed}a{size}"
                (run_dir / "metrics.json").write_text(json.dumps(metrics))
    found = list(rows(bhojanapalli2020_bert.CLAIMS, tmp_path).values())
    assert [row.verdict for row in found] == [HELD, INCONCLUSIVE]   # d_p 128 one point below 32: inside the noise
    assert found[0].baseline == "d_p 128, from scratch: 21.00 ± 1.00 (n=3)"
    assert found[0].treatment == "d_p 128, pre-trained: 31.00 ± 1.00 (n=3)"


# ------------------------------------------------------------------------------------- a job trains
@pytest.mark.slow   # ~20 s; the other study jobs' compositions are checked above without training
def test_a_shrunk_lm_study_job_trains_through_the_cli_and_fills_its_arm(tmp_path: Path):
    """The heaviest job of the LM study (32 fixed heads), shrunk to 3 steps: the real run is recognised by the arm
    built from the same overrides (its resolved config is that preset's)."""
    shrink = ("trainer.max_steps=3", "trainer.eval_every=3", "trainer.eval_max_batches=1", "trainer.num_threads=1",
              "task.max_train_lines=200", "task.sample_tokens=0")
    job = (f"experiment={bhojanapalli2020_lm.STUDY}", "model=fixed_head", "model.num_heads=32", *shrink)
    env = {**os.environ, "SPARSE_RUNNER_CACHE": os.environ.get("SPARSE_RUNNER_CACHE", str(Path.home() / ".cache" / "sparse_runner"))}
    done = subprocess.run([sys.executable, "-c", "from sparse_runner.cli import run_main; run_main()", *job,
                           f"paths.output_dir={tmp_path}", "hydra.job.chdir=false"],
                          capture_output=True, text=True, env=env, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    records = collect_runs([tmp_path / "runs"])
    assert [rec.status for rec in records] == ["completed"]
    arm = claims.preset_arm("32 fixed", job[:3] + shrink, "lm", "test/ppl", "cmd")
    assert arm.runs(records) == records
    assert bhojanapalli2020_lm.CLAIMS[0].row(records).verdict == NOT_RUN   # not the study's budget: no arm's run
