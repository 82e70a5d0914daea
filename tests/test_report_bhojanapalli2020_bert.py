"""sparse-report's Bhojanapalli et al. 2020 Tables 1, 2A and 2B (BERT on SQuAD and MNLI against heads and head
size): published numbers and parameter counts, our cells from fake squad/mnli run directories whose configs are
the tables' jobs (GPU and CPU presets, pre-trained and from scratch, seeds averaged), other runs beside the
nearest job, substitute data labelled, fill commands (no torch)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparse_runner.reporting import collect_runs, main
from sparse_runner.reporting.papers import bhojanapalli2020
from sparse_runner.reporting.papers.bhojanapalli2020 import bert
from sparse_runner.reporting.render import Table
from test_report import preset_config

SQUAD_HUB = {"name": "squad", "source": "hub", "substitute_for": None, "description": "SQuAD v1.1 from the hub"}
MNLI_HUB = {"name": "multi_nli", "source": "hub", "substitute_for": None, "description": "MultiNLI from the hub"}
CLOZE = {"name": "cloze_wiki", "source": "substitute", "substitute_for": "SQuAD v1.1",
         "description": "cloze questions over embedded speeches"}
PAIRS = {"name": "pairs_wiki", "source": "substitute", "substitute_for": "MNLI",
         "description": "next sentence / same document / other document"}
CLOZE_BASELINES = {"first_sentence": {"f1": 20.0, "exact_match": 10.0}, "same_kind_first": {"f1": 31.5, "exact_match": 25.25}}
PAIRS_BASELINES = {"majority": 0.35}


def write_bert_run(run_dir: Path, family: str, *, experiment: str, heads: int | None = None,
                   head_size: int | None = None, seed: int = 0, pretrained_params: int | None = 335_170_362,
                   scores: tuple = (), data: dict | None = None, baselines: dict | None = None,
                   overrides: tuple = (), status: str = "completed", vocab: int | None = None) -> Path:
    """A fine-tuning run's metrics.json as the squad/mnli tasks write it, its config the job of the table's
    multirun (`experiment`, the swept heads or head size, the task's fine-tuning recipe, `pretrain=none` when
    `pretrained_params` is None) with `overrides`: scores are (F1, EM) in percent for squad and (matched,
    mismatched) fractions for mnli; pretraining is null when trained from scratch."""
    if family == "squad":
        f1, em = scores or (90.0, 83.0)
        metrics = {"test/f1": f1, "test/exact_match": em, "val/f1": f1 + 0.5}
    else:
        matched, mismatched = scores or (0.84, 0.83)
        metrics = {"test/accuracy_matched": matched, "test/accuracy_mismatched": mismatched, "test/accuracy": matched,
                   "val/accuracy": matched}
    swept = [f"model.head_size={head_size}"] if "table2b" in experiment else [f"model.num_heads={heads}"]
    finetune = f"finetune={family}" + ("_cpu" if experiment.endswith("_cpu") else "")
    scratch = ["pretrain=none"] if pretrained_params is None else []
    config = preset_config(f"experiment={experiment}", *swept, finetune, *scratch, *overrides, seed=seed)
    assert config["task"]["family"] == family
    info: dict = {"data": data or (SQUAD_HUB if family == "squad" else MNLI_HUB)}
    if baselines:
        info["baselines"] = baselines
    if vocab is not None:
        info["tokenizer"] = {"type": "sentencepiece-bpe", "vocab_size": vocab}
    payload = {
        "schema": 2, "status": status, "task": config["task"]["name"], "task_family": family,
        "experiment": experiment, "model": config["model"]["name"],
        "primary_metric": "test/f1" if family == "squad" else "test/accuracy",
        "overrides": [f"experiment={experiment}", *swept, finetune, f"seed={seed}", *scratch, *overrides],
        "config": config,
        "metrics": metrics if status == "completed" else {},
        "task_info": info,
        "pretraining": None if pretrained_params is None else
        {"run_dir": "outputs/mlm", "checkpoint": "outputs/mlm/checkpoints/best.pt", "step": 1000,
         "num_parameters": pretrained_params},
    }
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.json").write_text(json.dumps(payload))
    return run_dir


def write_mlm_run(run_dir: Path, experiment: str = "bhojanapalli2020_table1_cpu") -> Path:
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.json").write_text(json.dumps({
        "schema": 2, "status": "completed", "task": "mlm", "task_family": "mlm", "experiment": experiment,
        "config": {"model": {"d_model": 128}}, "metrics": {"test/loss": 3.0}, "num_parameters": 1_000_000}))
    return run_dir


T1, T1_CPU, T2A, T2B = ("bhojanapalli2020_table1", "bhojanapalli2020_table1_cpu", "bhojanapalli2020_table2a",
                         "bhojanapalli2020_table2b")


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    root = tmp_path / "outputs"
    # Table 1, GPU preset, 8 heads: two seeds of squad (mean 89.00, sample std 1.41, n=2), one mnli; pre-trained.
    write_bert_run(root / "t1/h8_squad_s0", "squad", experiment=T1, heads=8, seed=0, scores=(88.0, 80.0))
    write_bert_run(root / "t1/h8_squad_s1", "squad", experiment=T1, heads=8, seed=1, scores=(90.0, 82.5))
    write_bert_run(root / "t1/h8_mnli", "mnli", experiment=T1, heads=8, scores=(0.8412, 0.8301))
    # ... from scratch, the same geometry: a row of its own, never averaged with the pre-trained one.
    write_bert_run(root / "t1/h8_squad_scratch", "squad", experiment=T1, heads=8, pretrained_params=None,
                   scores=(70.0, 60.0), vocab=30521)
    # 32 heads: a failed squad run fills nothing; another run with a shorter schedule is a row of its own.
    write_bert_run(root / "t1/h32_squad_failed", "squad", experiment=T1, heads=32, status="failed")
    write_bert_run(root / "t1/h32_squad_short", "squad", experiment=T1, heads=32, scores=(50.0, 40.0),
                   overrides=("trainer.max_steps=100",))
    # Table 1, CPU-sized: substitute data with its trivial baselines, pre-trained (count from the pre-training run)
    # and from scratch (count from the config and the vocabulary).
    write_bert_run(root / "cpu/h8_squad", "squad", experiment=T1_CPU, heads=8, scores=(41.0, 33.0),
                   pretrained_params=424_242, data=CLOZE, baselines=CLOZE_BASELINES)
    write_bert_run(root / "cpu/h8_mnli", "mnli", experiment=T1_CPU, heads=8, scores=(0.5, 0.48),
                   pretrained_params=424_242, data=PAIRS, baselines=PAIRS_BASELINES)
    write_bert_run(root / "cpu/h8_mnli_scratch", "mnli", experiment=T1_CPU, heads=8, scores=(0.4, 0.39),
                   pretrained_params=None, data=PAIRS, baselines=PAIRS_BASELINES, vocab=999)
    # Table 2B, GPU preset, head size 64 (8 heads, d 512): both tasks.
    write_bert_run(root / "t2b/dp64_squad", "squad", experiment=T2B, head_size=64,
                   pretrained_params=142_221_626, scores=(85.5, 77.25))
    write_bert_run(root / "t2b/dp64_mnli", "mnli", experiment=T2B, head_size=64,
                   pretrained_params=142_221_626, scores=(0.8, 0.79))
    write_mlm_run(root / "cpu/mlm")
    return root


def by_slug(tables: list[Table]) -> dict[str, Table]:
    return {table.slug: table for table in tables}


def row(table: Table, label: str, heads: str, head_size: str) -> dict[str, str]:
    matches = [r for r in table.rows if r[0] == label and r[1] == heads and r[2] == head_size]
    assert len(matches) == 1, [r[:3] for r in table.rows]
    return dict(zip(table.headers, matches[0]))


def notes(table: Table) -> str:
    return "\n".join(table.notes)


# ------------------------------------------------------------------------------------------ params
def test_every_published_row_agrees_with_bert_parameters_within_one_percent() -> None:
    checked = 0
    for paper in bert.PAPER_TABLES:
        for pub in paper.rows:
            ours = paper.geometry(pub).parameters() / 1e6
            assert abs(ours - pub.params_m) / pub.params_m < 0.01, (paper.key, pub, ours)
            checked += 1
    assert checked == 11


def test_bert_parameters_counts_each_part() -> None:
    kwargs = dict(d_model=4, num_layers=1, num_heads=2, head_size=3, ffn_dim=5, vocab_size=7, max_positions=6,
                  learned_positions=True, norm_first=False)
    # embeddings 7*4 + 6*4; layer: qkv 3*(4*6+6), out 6*4+4, LNs 16, FFN 4*5+5+5*4+4; head 4*4+4+8+7
    layer = 3 * 30 + 28 + 16 + 49
    assert bert.bert_parameters(**kwargs) == 28 + 24 + layer + 35
    assert bert.bert_parameters(**{**kwargs, "learned_positions": False}) == 28 + layer + 35
    assert bert.bert_parameters(**{**kwargs, "norm_first": True}) == 28 + 24 + layer + 35 + 8
    assert bert.bert_parameters(**kwargs, learned_alpha=True) == 28 + 24 + layer + 35 + 2


def test_tables_without_runs_show_published_numbers_params_and_commands() -> None:
    tables = by_slug(bert.tables([]))
    assert list(tables) == ["bhojanapalli2020_table1", "bhojanapalli2020_table2a", "bhojanapalli2020_table2b"]
    t1, t2a, t2b = tables.values()
    assert [r[1:3] for r in t1.rows] == [["8", "128"], ["16", "64"], ["32", "32"]]
    assert [r[1:3] for r in t2a.rows] == [["8", "128"], ["12", "128"], ["16", "128"], ["32", "128"]]
    assert [r[1:3] for r in t2b.rows] == [["8", "32"], ["8", "64"], ["8", "128"], ["8", "256"]]
    first = dict(zip(t1.headers, t1.rows[0]))
    assert first["params (M) published"] == "336" and first["params (M) ours"] == "335.17"
    assert first["SQuAD F1 published"] == "90.89 ± 0.15" and first["SQuAD EM published"] == "84.1"
    assert first["MNLI-m published"] == "85 ± 0.2" and first["SQuAD F1 ours"] == first["MNLI-m ours"] == ""
    assert [dict(zip(t2b.headers, r))["params (M) ours"] for r in t2b.rows] == ["129.62", "142.22", "167.42", "217.83"]
    assert "`sparse-run -m experiment=bhojanapalli2020_table1 model.num_heads=8,16,32`" in notes(t1)
    assert "`sparse-run -m experiment=bhojanapalli2020_table2a model.num_heads=8,12,16,32`" in notes(t2a)
    assert "`sparse-run -m experiment=bhojanapalli2020_table2b model.head_size=32,64,128,256`" in notes(t2b)
    assert "heads 8: 335.17M vs 336M (-0.25%)" in notes(t1)


# ------------------------------------------------------------------------------------------- cells
def test_cells_land_in_their_rows(runs: Path) -> None:
    tables = by_slug(bert.tables(collect_runs([runs])))
    t1, t2a, t2b = tables.values()
    h8 = row(t1, "GPU preset, pre-trained", "8", "128")
    assert h8["SQuAD F1 ours"] == "89.00 ± 1.41 (n=2)" and h8["SQuAD EM ours"] == "81.25 ± 1.77 (n=2)"
    assert h8["MNLI-m ours"] == "84.12" and h8["MNLI-mm ours"] == "83.01"
    assert h8["SQuAD F1 published"] == "90.89 ± 0.15"
    scratch = row(t1, "GPU preset, from scratch", "8", "128")  # right under its pre-trained twin, not averaged in
    assert t1.rows.index(list(scratch.values())) == t1.rows.index(list(h8.values())) + 1
    assert scratch["SQuAD F1 ours"] == "70.00" and scratch["MNLI-m ours"] == "" and scratch["SQuAD F1 published"] == ""
    # bert_parameters of its config: vocabulary 30521 + [MASK], learned positions as long as squad's 384 tokens
    assert scratch["params (M) ours"] == "335.04"
    h32 = row(t1, "GPU preset, pre-trained", "32", "32")
    assert h32["SQuAD F1 ours"] == ""  # the failed run fills nothing, the short one is elsewhere
    short = row(t1, "GPU preset, pre-trained, + trainer.max_steps=100", "32", "32")
    assert short["SQuAD F1 ours"] == "50.00" and short["SQuAD F1 published"] == ""
    assert all(r[6] == "" for r in t2a.rows)  # no Table 2A run
    dp64 = row(t2b, "GPU preset, pre-trained", "8", "64")
    assert dp64["SQuAD F1 ours"] == "85.50" and dp64["MNLI-m ours"] == "80.00" and dp64["MNLI-mm ours"] == "79.00"
    assert not [r for r in t2b.rows if r[0].startswith("CPU")]  # CPU runs of Table 1 stay in Table 1


def test_cpu_runs_are_separate_labelled_rows_with_substitutes_marked(runs: Path) -> None:
    t1 = bert.tables(collect_runs([runs]))[0]
    cpu = "CPU-sized preset (d 128, 2 layers, FFN 512)"
    pre = row(t1, f"{cpu}, pre-trained", "8", "16")
    assert pre["SQuAD F1 ours"] == "41.00 †" and pre["SQuAD EM ours"] == "33.00 †"
    assert pre["MNLI-m ours"] == "50.00 †" and pre["MNLI-mm ours"] == "48.00 †"
    assert pre["params (M) ours"] == "0.42" and pre["params (M) published"] == pre["SQuAD F1 published"] == ""
    scratch = row(t1, f"{cpu}, from scratch", "8", "16")
    expected = bert.bert_parameters(d_model=128, num_layers=2, num_heads=8, head_size=16, ffn_dim=512, vocab_size=1000,
                                    max_positions=0, learned_positions=False, norm_first=True)
    assert scratch["MNLI-m ours"] == "40.00 †" and scratch["params (M) ours"] == f"{expected / 1e6:.2f}"
    # CPU rows come after every GPU row, below a rule.
    first_cpu = next(i for i, r in enumerate(t1.rows) if r[0].startswith("CPU"))
    assert all(r[0].startswith("CPU") for r in t1.rows[first_cpu:]) and first_cpu in t1.rules_before
    text = notes(t1)
    assert "cloze questions generated over real text" in text and "sentence-pair substitute, not entailment" in text
    assert "first_sentence F1 20.00 / EM 10.00, same_kind_first F1 31.50 / EM 25.25" in text
    assert "majority 35.00%" in text
    assert "squad (hub)" in text and "cloze_wiki †" in text


def test_commands_fill_exactly_the_empty_rows(runs: Path) -> None:
    t1, t2a, t2b = bert.tables(collect_runs([runs]))
    text = notes(t1)
    # GPU pre-trained: 16 heads has nothing, 32 only a failed run; 8 heads is complete.
    assert "GPU preset, pre-trained, heads 16, 32: `sparse-run -m experiment=bhojanapalli2020_table1 model.num_heads=16,32`" in text
    assert ("GPU preset, from scratch, heads 8 (no mnli run): "
            "`sparse-run -m experiment=bhojanapalli2020_table1 model.num_heads=8 pretrain=none`") in text
    assert "`sparse-run -m experiment=bhojanapalli2020_table1 model.num_heads=32 trainer.max_steps=100`" in text
    assert "`sparse-run -m experiment=bhojanapalli2020_table1_cpu model.num_heads=8 pretrain=none`" in text
    assert "model.num_heads=8,16" not in text and "bhojanapalli2020_table1_cpu model.num_heads=8`" not in text
    assert "`sparse-run -m experiment=bhojanapalli2020_table2b model.head_size=32,128,256`" in notes(t2b)


def test_a_job_of_two_tables_is_in_both(tmp_path: Path) -> None:
    # Table 2A's 8 heads of 128 and Table 2B's head size 128 at 8 heads are one model: a run of either is both.
    write_bert_run(tmp_path / "a", "squad", experiment=T2A, heads=8, scores=(89.0, 82.0))
    t1, t2a, t2b = bert.tables(collect_runs([tmp_path]))
    assert row(t2a, "GPU preset, pre-trained", "8", "128")["SQuAD F1 ours"] == "89.00"
    assert row(t2b, "GPU preset, pre-trained", "8", "128")["SQuAD F1 ours"] == "89.00"
    assert all(r[6] == "" for r in t1.rows)


def test_substitute_runs_are_not_averaged_with_official_ones(tmp_path: Path) -> None:
    root = tmp_path / "outputs"
    write_bert_run(root / "a", "squad", experiment=T1, heads=16, scores=(80.0, 70.0))
    write_bert_run(root / "b", "squad", experiment=T1, heads=16, scores=(20.0, 10.0), data=CLOZE, seed=1)
    t1 = bert.tables(collect_runs([root]))[0]
    h16 = row(t1, "GPU preset, pre-trained", "16", "64")
    assert h16["SQuAD F1 ours"] == "80.00"
    assert "1 run(s) of another configuration (substitute data beside the official data" in notes(t1)


# ------------------------------------------------------------------------------------ in the report
def test_the_paper_always_shows_them(runs: Path, tmp_path: Path) -> None:
    slugs = [t.slug for t in bhojanapalli2020.tables(collect_runs([runs]))]
    assert slugs == ["bhojanapalli2020_table1", "bhojanapalli2020_table2a", "bhojanapalli2020_table2b"]
    only_mlm = collect_runs([write_mlm_run(tmp_path / "mlm_only")])
    assert len(bhojanapalli2020.tables(only_mlm)) == 3  # a pre-training run alone: the tables say what to run
    assert len(bhojanapalli2020.tables([])) == 3  # no run at all: published numbers, parameters, commands


def test_sparse_report_writes_the_tables(runs: Path, tmp_path: Path, capsys) -> None:
    assert main([str(runs), "--out", str(tmp_path / "report")]) == 0
    report = (tmp_path / "report" / "report.md").read_text()
    assert "## Bhojanapalli et al. 2020, Table 1: BERT-large" in report
    assert "| GPU preset, pre-trained | 8 | 128 | 336 | 335.17 | 90.89 ± 0.15 | 89.00 ± 1.41 (n=2) |" in report
    assert "Table 2B: 8 heads, d 512" in report
    csv = (tmp_path / "report" / "bhojanapalli2020_table2a.csv").read_text()
    assert csv.startswith('"ours (setting, init)",heads,head size,') and "168,167.42,89.6" in csv
    assert "90.89 ± 0.15" in (tmp_path / "report" / "bhojanapalli2020_table1.tex").read_text()


def test_a_pretrained_count_unlike_bert_parameters_is_noted(tmp_path: Path) -> None:
    write_bert_run(tmp_path / "a", "mnli", experiment=T1, heads=16, pretrained_params=300_000_000)
    t1 = bert.tables(collect_runs([tmp_path]))[0]
    assert row(t1, "GPU preset, pre-trained", "16", "64")["params (M) ours"] == "335.17"  # the paper geometry's count
    assert "heads 16, head size 64: the pre-trained model of its runs has 300,000,000 parameters, not 335,170,362" in notes(t1)


def test_baselines_read_in_either_layout() -> None:
    flat = {"first_sentence_exact_match": 10.0, "first_sentence_f1": 20.0, "same_kind_first_f1": 31.5,
            "same_kind_first_exact_match": 25.25}
    assert bert._baselines_text("squad", flat) == bert._baselines_text("squad", CLOZE_BASELINES)
    assert (bert._baselines_text("mnli", {"majority": 0.35, "overlap": {"matched": 0.41, "mismatched": 0.4}})
            == "majority 35.00%, overlap matched 41.00% / mismatched 40.00%")
