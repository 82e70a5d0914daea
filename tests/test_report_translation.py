"""sparse-report on fake translation runs: Correia et al. (2019) Table 1, the runs behind it, the figures.

The run directories are written here with the layout of a real translation run's metrics.json (a 20-step
`experiment=mt_cpu` run: schema 1, config, analysis, metrics, task_info, selection, speed), their configs the
ones the presets compose; only the numbers are invented. The report is built once for the module (drawing the figures is the slow part) and each test
reads a different part of it.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sparse_runner.reporting import main
from sparse_runner.reporting.papers.correia2019.published import CORREIA2019_TABLE1, TRANSLATION_COLUMNS
from test_report import preset_config

ATTENTION_TYPES = ("encoder_self", "context", "decoder_self")
BLEU_TOKENIZATION = ("Moses tokenizer (sacremoses 0.2.0, lang=en, escape=False, aggressive_dash_splits=False), "
                     "case-sensitive, multi-bleu.perl-style corpus BLEU (4-grams, no smoothing) via sacrebleu "
                     "tokenize=none")
SACREBLEU_SIGNATURE = "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0"
# The experiment a run composes, and config keys changed from it (`more`: overrides the command line adds).
CPU_SIZE = {"experiment": "mt_cpu"}                       # 3+3 layers, d 256, 4 heads, 3000 tokens/batch, 1000 steps
PAPER_SIZE = {"experiment": "correia2019_iwslt17_de_en"}  # Transformer-Base: 6+6, d 512, 8 heads, 8192 tokens/batch
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _histogram(values: list[float], value_range: tuple[float, float], weight: int = 1) -> dict:
    counts, edges = np.histogram(values, bins=15, range=value_range)
    return {"bins": 15, "range": list(value_range), "edges": edges.tolist(),
            "counts": (counts * weight).astype(int).tolist(), "count": int(counts.sum()) * weight}


def _head_densities(model: str, attn: int, layer: int, heads: int) -> list[float]:
    """Softmax is dense by construction; the sparse models get a spread of densities in (0, 1)."""
    if model == "softmax":
        return [1.0] * heads
    return [round(0.05 + 0.9 * ((h + layer + attn) % heads) / heads, 4) for h in range(heads)]


def attention_analysis(model: str, layers: int, heads: int, sentences: int = 50) -> dict:
    """analysis["attention"] as AttentionStats.summary() writes it: per type, per layer, and totals."""
    out = {}
    for attn, attn_type in enumerate(ATTENTION_TYPES):
        per_layer, all_densities = [], []
        for layer in range(layers):
            density = _head_densities(model, attn, layer, heads)
            all_densities += density
            js = {"softmax": 0.02, "entmax15": 0.3}.get(model, 0.25) + 0.03 * layer + 0.01 * attn
            hist = _histogram(density, (0.0, 1.0), weight=sentences)
            per_layer.append({
                "layer": layer, "num_heads": heads, "head_density": density,
                "mean_density": sum(density) / heads, "min_density": min(density), "max_density": max(density),
                "js": js, "num_queries": 1522, "possible_pairs": 204856,
                "sentence_density_hist": {"counts": hist["counts"], "count": hist["count"]},
            })
        out[attn_type] = {
            "layers": per_layer,
            "mean_density": sum(all_densities) / len(all_densities),
            "js_mean": sum(layer["js"] for layer in per_layer) / layers,
            "sentence_density_hist": _histogram(all_densities, (0.0, 1.0), weight=sentences),
        }
    return out


def alpha_analysis(model: str, layers: int, heads: int) -> dict:
    """analysis["alpha"] as alpha_summary() writes it; fixed-α models report their constant α too."""
    fixed = {"softmax": 1.0, "entmax15": 1.5, "sparsemax": 2.0}.get(model)
    out = {}
    for attn, attn_type in enumerate(ATTENTION_TYPES):
        per_layer = [{"layer": layer, "alphas": [fixed if fixed is not None else
                                                 1.02 + 0.95 * ((3 * h + layer + 5 * attn) % 11) / 11
                                                 for h in range(heads)]}
                     for layer in range(layers)]
        alphas = [a for layer in per_layer for a in layer["alphas"]]
        out[attn_type] = {"layers": per_layer, "alphas": alphas, **_histogram(alphas, (1.0, 2.0)),
                          "out_of_range": 0}
    return out


def translation_metrics(run_dir: Path, *, model: str, size: dict, status: str = "completed", test_bleu=20.0,
                        val_bleu=19.0, tokens_per_second=1500.0, analysis: bool = True, step=None,
                        stopped_early: bool = False, seed: int = 0, label: str | None = None) -> dict:
    """A translation run's metrics.json, in the layout of a real one: its config is what `experiment=<size's>
    model=<model> <size's more>` composes (monitor resolved, as the runner writes it); `label` is the model=
    name its command line gave, when that is not `model`."""
    experiment, more = size["experiment"], size.get("more", ())
    config = preset_config(f"experiment={experiment}", f"model={model}", *more, seed=seed,
                           **{"paths.output_dir": str(run_dir.parent), "trainer.monitor": "val/bleu",
                              "trainer.monitor_mode": "max"})
    model = config["model"]["name"] = label or model
    task, layers, heads = config["task"]["name"], config["model"]["num_layers"], config["model"]["num_heads"]
    finished = status == "completed"
    step = config["trainer"]["max_steps"] if step is None else step
    metrics = {
        "schema": 1, "status": status, "error": "CUDA out of memory" if status == "failed" else None,
        "run_dir": str(run_dir), "task": task, "task_family": "translation", "model": model,
        "experiment": experiment, "overrides": [f"experiment={experiment}", f"model={model}", *more], "config": config,
        "seed": seed, "num_parameters": 7578624, "device": "cpu", "attention_backend": "sdpa",
        "max_steps": config["trainer"]["max_steps"], "dataset_sizes": {"train": 28771, "val": 500, "test": 500},
        "figures": [str(run_dir / "figures" / "js_per_layer.png")],
        "metrics": {
            "val/loss": 3.1, "val/ppl": 22.2, "val/bleu": val_bleu - 0.5, "val/sacrebleu": val_bleu - 1.0,
            "val/chrf": 45.0, "test/loss": 3.2, "test/ppl": 24.5, "test/bleu": test_bleu,
            "test/sacrebleu": None if test_bleu is None else test_bleu - 1.25, "test/chrf": 47.5,
            "best/val/bleu": val_bleu,
        },
        "task_info": {
            "tokenizer": {"type": "sentencepiece-bpe (joint)", "vocab_size": 8000, "model": "/cache/x.model"},
            "dropped_long_train_pairs": 0,
            "decoding": {"test": {"beam_size": 4, "length_penalty": 1.0, "max_len_a": 1.5, "max_len_b": 10},
                         "val": {"beam_size": 1}},
            "sacrebleu_signature": SACREBLEU_SIGNATURE,
            "chrf_signature": "nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.6.0",
            "bleu_tokenization": BLEU_TOKENIZATION,
        },
        "selection": {"metric": "val/bleu", "mode": "max", "best_value": val_bleu, "best_step": step},
        "step": step, "stopped_early": stopped_early, "tokens_seen": 56233,
        "train_time_s": 900.0, "tokens_per_second": tokens_per_second if finished else None,
        "wall_time_s": 950.0 if finished else None, "peak_memory_mb": 1776.9,
    }
    if analysis:
        metrics["analysis"] = {"attention": attention_analysis(model, layers, heads),
                               "alpha": alpha_analysis(model, layers, heads)}
    return metrics


def write_run(root: Path, name: str, **kwargs) -> Path:
    run_dir = root / name
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.json").write_text(json.dumps(translation_metrics(run_dir, **kwargs)), encoding="utf-8")
    return run_dir


def build_runs(root: Path) -> None:
    """CPU-size es→en Bible and paper-size IWSLT runs of the three Table 1 models, plus runs that must not
    fill a cell (failed, still running, worse on validation) and one run without analysis."""
    # Directory names say nothing true about the runs: the report reads metrics.json.
    write_run(root, "a", model="softmax", size=CPU_SIZE, test_bleu=12.3456, val_bleu=11.0, tokens_per_second=1500.0)
    # An identical output scores 100.00000000000004 BLEU: shown as 100.00.
    write_run(root, "b", model="entmax15", size=CPU_SIZE, test_bleu=100.00000000000004, val_bleu=11.5,
              tokens_per_second=1350.0)
    write_run(root, "c", model="entmax", size=CPU_SIZE, test_bleu=12.5, val_bleu=11.2, tokens_per_second=1100.0)
    paper = dict(size=PAPER_SIZE, step=45000, stopped_early=True)
    write_run(root, "d", model="softmax", test_bleu=29.1, val_bleu=30.0, tokens_per_second=20000.0, **paper)
    write_run(root, "e", model="entmax15", test_bleu=29.25, val_bleu=30.1, tokens_per_second=18000.0,
              analysis=False, **paper)
    write_run(root, "f", model="entmax", test_bleu=29.5, val_bleu=30.2, tokens_per_second=15000.0, **paper)
    # Another configuration (smaller batches), better test BLEU but worse validation BLEU than "d": no preset,
    # an other run beside it.
    write_run(root, "g", model="softmax", test_bleu=31.0, val_bleu=29.0, tokens_per_second=20000.0,
              **{**paper, "size": {**PAPER_SIZE, "more": ("trainer.batch_tokens=4096",)}})
    # Failed and unfinished runs never fill a cell, whatever they score.
    write_run(root, "h", model="entmax", status="failed", test_bleu=99.0, val_bleu=99.0, **paper)
    write_run(root, "i", model="softmax", status="running", test_bleu=98.0, val_bleu=98.0, **paper)


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("translation") / "outputs"
    build_runs(root)
    out = root.parent / "report"
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main([str(root), "--out", str(out)])
    return {"code": code, "out": out, "md": (out / "report.md").read_text(encoding="utf-8"),
            "stdout": stdout.getvalue(), "stderr": stderr.getvalue()}


def section(markdown: str, title_start: str) -> str:
    """The markdown between the heading starting with `title_start` and the next heading."""
    return markdown.split(f"\n## {title_start}")[1].split("\n## ")[0]


def table1(markdown: str) -> str:
    return section(markdown, "Correia et al. 2019 Table 1: translation")


def test_report_succeeds(report: dict) -> None:
    assert report["code"] == 0
    assert report["stdout"] == report["md"]
    assert "warning" not in report["stderr"]


def test_table1_published_beside_ours(report: dict) -> None:
    table = table1(report["md"])
    header = next(line for line in table.splitlines() if line.startswith("| model |"))
    assert header == ("| model | IWSLT17 de→en published | IWSLT17 de→en ours | KFTT ja→en published | KFTT ja→en ours "
                      "| WMT16 ro→en published | WMT16 ro→en ours | WMT14 en→de published | WMT14 en→de ours "
                      "| es→en Bible (ours, CPU) |")
    kftt = "run: sparse-run experiment=correia2019_kftt_ja_en model="
    assert (f"| softmax | 29.79 | 29.10 | 21.57 | {kftt}softmax | 32.70 | run: sparse-run "
            "experiment=correia2019_wmt16_ro_en model=softmax | 26.02 | run: sparse-run "
            "experiment=correia2019_wmt14_en_de model=softmax | 12.35 |") in table
    assert f"| 1.5-entmax | 29.83 | 29.25 | 22.13 | {kftt}entmax15 |" in table
    assert f"| α-entmax | 29.90 | 29.50 | 21.74 | {kftt}entmax |" in table
    assert "sparsemax" not in table                   # no sparsemax run: no row for it


def test_table1_fill_commands_for_missing_columns(report: dict) -> None:
    table = table1(report["md"])
    for pair in ("kftt_ja_en", "wmt16_ro_en", "wmt14_en_de"):
        assert f"`sparse-run -m experiment=correia2019_{pair} model=softmax,entmax15,entmax`" in table
    assert "experiment=correia2019_iwslt17_de_en model=softmax,entmax15" not in table   # that column is full
    assert "experiment=mt_cpu model=" not in table


def test_table1_scale_row_and_caption(report: dict) -> None:
    table = table1(report["md"])
    scale = next(line for line in table.splitlines() if line.startswith("| scale |"))
    assert scale.startswith("| scale |  | paper size: 6+6 layers d512 h8, 8192 tokens/batch, 45k steps (stopped early) "
                            "|  |  |  |  |  |  |")
    assert scale.endswith("| CPU size: 3+3 layers d256 h4, 3000 tokens/batch, 1000 steps |")
    assert "Correia et al., EMNLP 2019, Table 1" in table
    assert f"Tokenized BLEU of ours: {BLEU_TOKENIZATION}." in table
    assert SACREBLEU_SIGNATURE in table


def test_bleu_is_rounded(report: dict) -> None:
    assert "| 1.5-entmax | 29.83 | 29.25 |" in table1(report["md"])
    row = next(line for line in table1(report["md"]).splitlines() if line.startswith("| 1.5-entmax |"))
    assert row.endswith("| 100.00 |")                 # the Bible column
    for path in report["out"].glob("correia2019_*"):
        assert "100.00000000000004" not in path.read_text(encoding="utf-8")


def test_failed_running_and_other_runs_do_not_fill_preset_cells(report: dict) -> None:
    table = table1(report["md"])
    assert "99.00" not in table and "98.00" not in table
    # g is no preset (another batch size): an other run beside softmax, not in the softmax cell.
    assert "| softmax | 29.79 | 29.10 |" in table
    other = next(line for line in table.splitlines() if line.startswith("| other runs:"))
    assert other.startswith("| other runs: softmax · dense · h8 (softmax + trainer.batch_tokens=4096) |  | 31.00 |  |  |  |"
                            "  |  |  |  |")
    runs = section(report["md"], "Correia et al. 2019 Table 1: our runs")
    rows = {line.split("|")[-2].strip(): line for line in runs.splitlines() if line.startswith("| ")}
    assert set(rows) - {"run"} == {"a", "b", "c", "d", "e", "f", "g"}   # h failed, i running: not here
    assert rows["g"].startswith("| IWSLT17 de→en | other runs: softmax · dense · h8 (softmax + trainer.batch_tokens=4096) "
                                "| 31.00 |")


def test_runs_table_sacrebleu_chrf_speed(report: dict) -> None:
    runs = section(report["md"], "Correia et al. 2019 Table 1: our runs")
    # column | model | BLEU | sacreBLEU | chrF | best val | tokens/s | speed % ours | speed % published | scale | run
    assert ("| es→en Bible (ours, CPU) | α-entmax | 12.50 | 11.25 | 47.50 | 11.20 | 1100 | 73 | 75 | CPU size: "
            "3+3 layers d256 h4, 3000 tokens/batch, 1000 steps | c |") in runs
    assert "| IWSLT17 de→en | 1.5-entmax | 29.25 | 28.00 | 47.50 | 30.10 | 18000 | 90 | 90 |" in runs
    assert "| IWSLT17 de→en | softmax | 29.10 | 27.85 | 47.50 | 30.00 | 20000 | 100 | 100 |" in runs


def test_csv_and_latex(report: dict) -> None:
    out = report["out"]
    rows = list(csv.reader(io.StringIO((out / "correia2019_table1.csv").read_text(encoding="utf-8"))))
    assert rows[0][:3] == ["model", "IWSLT17 de→en published", "IWSLT17 de→en ours"]
    assert rows[1][:4] == ["softmax", "29.79", "29.10", "21.57"]
    assert rows[3][:3] == ["α-entmax", "29.90", "29.50"]
    assert rows[2][-1] == "100.00"
    runs = list(csv.DictReader(io.StringIO((out / "correia2019_table1_runs.csv").read_text(encoding="utf-8"))))
    assert {row["run"] for row in runs} == {"a", "b", "c", "d", "e", "f", "g"}
    tex = (out / "correia2019_table1.tex").read_text(encoding="utf-8")
    assert "IWSLT17 de$\\rightarrow$en published" in tex and "\\toprule" in tex
    assert "$\\alpha$-entmax & 29.90 & 29.50" in tex
    assert "run: sparse-run experiment=correia2019\\_kftt\\_ja\\_en model=softmax" in tex
    assert "α" not in tex and "→" not in tex                # pdflatex-safe


FIGURES = ("js_per_layer", "alpha_histograms", "density_histograms", "head_density_per_layer")


@pytest.mark.parametrize("group", ["bible_es_en_mt_cpu", "iwslt17_de_en_correia2019_iwslt17_de_en"])
def test_figures_written_and_linked(report: dict, group: str) -> None:
    for name in FIGURES:
        path = report["out"] / "figures" / f"{group}_{name}.png"
        data = path.read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 10_000, path
        assert f"](figures/{group}_{name}.png)" in report["md"]
    assert not list((report["out"] / "figures").glob(".*"))      # no temporary file left behind


def test_run_without_analysis_is_left_out_of_figures(report: dict) -> None:
    figures = section(report["md"], "Figures: Correia et al. 2019 analysis, task=iwslt17_de_en")
    assert "Runs: softmax `d`, α-entmax `f`." in figures
    assert "Without analysis, so not drawn: 1.5-entmax." in figures
    assert "1.5-entmax | 29.83 | 29.25" in table1(report["md"])  # its BLEU still counts


def test_no_analysis_anywhere_and_malformed_analysis(tmp_path: Path, capsys) -> None:
    root = tmp_path / "outputs"
    write_run(root, "plain", model="entmax", size=CPU_SIZE, analysis=False)
    assert main([str(root), "--formats", "md"]) == 0
    assert not (root / "report" / "figures").exists()
    assert "## Figures" not in capsys.readouterr().out

    broken = json.loads((root / "plain" / "metrics.json").read_text())
    broken["analysis"] = {"attention": {"encoder_self": {"layers": "oops"}}}
    (root / "plain" / "metrics.json").write_text(json.dumps(broken))
    assert main([str(root), "--formats", "md"]) == 0
    captured = capsys.readouterr()
    assert "figures for task=bible_es_en, experiment=mt_cpu skipped: malformed analysis" in captured.err
    assert "| α-entmax | 29.90 | run: sparse-run experiment=correia2019_iwslt17_de_en model=entmax |" in captured.out


def test_report_does_not_import_torch() -> None:
    # The report draws its figures with sparse_runner.analysis.figures: that must not pull torch in either.
    code = ("import sys; import sparse_runner.reporting.report, sparse_runner.analysis.figures; "
            "print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "False", result.stderr


def test_published_table1_is_complete() -> None:
    rows = CORREIA2019_TABLE1["rows"]
    assert list(rows) == ["softmax", "1.5-entmax", "α-entmax"]
    assert [rows[model]["IWSLT17 de→en"] for model in rows] == [29.79, 29.83, 29.90]
    assert rows["α-entmax"]["WMT14 en→de"] == 26.93 and rows["1.5-entmax"]["KFTT ja→en"] == 22.13
    for row in rows.values():
        assert set(row) == set(CORREIA2019_TABLE1["columns"])
    # Every published column is one of ours, and the CPU column is the only unpublished one.
    published = [column for column, spec in TRANSLATION_COLUMNS.items() if spec["published"]]
    assert published == CORREIA2019_TABLE1["columns"]


def test_alpha_entmax_spelled_as_softmax_is_in_the_alpha_entmax_row(tmp_path: Path, capsys) -> None:
    root = tmp_path / "outputs"
    write_run(root, "spelled", model="softmax", size={**CPU_SIZE, "more": ("normaliser=alpha_entmax",)},
              test_bleu=13.0, analysis=False)
    write_run(root, "keyed", model="softmax", size={**PAPER_SIZE, "more": ("model.normaliser=alpha_entmax", "++model.normaliser_options.alpha=null",
                                                                    "++model.normaliser_options.alpha_init=random")},
              test_bleu=30.0, analysis=False)
    assert main([str(root), "--formats", "md"]) == 0
    table = table1(capsys.readouterr().out)
    assert "| α-entmax | 29.90 | 30.00 | 21.74 |" in table
    assert next(line for line in table.splitlines() if line.startswith("| α-entmax |")).endswith("| 13.00 |")
    softmax = next(line for line in table.splitlines() if line.startswith("| softmax |"))
    assert "13.00" not in softmax and "30.00" not in softmax
    assert not [line for line in table.splitlines() if line.startswith("| other runs")]


def test_iwslt_alias_and_sparsemax_row(tmp_path: Path, capsys) -> None:
    root = tmp_path / "outputs"
    write_run(root, "alias", model="softmax", size={**PAPER_SIZE, "more": ("task=iwslt",)}, test_bleu=28.0,
              analysis=False)
    write_run(root, "sparse", model="sparsemax", size=CPU_SIZE, test_bleu=11.0, analysis=False)
    assert main([str(root), "--formats", "md"]) == 0
    table = table1(capsys.readouterr().out)
    assert "| softmax | 29.79 | 28.00 |" in table        # task=iwslt is the IWSLT17 de→en column
    # sparsemax: no published number, our Bible run, fill commands elsewhere.
    assert ("| sparsemax |  | run: sparse-run experiment=correia2019_iwslt17_de_en model=sparsemax |  |"
            in table) and next(line for line in table.splitlines() if "| sparsemax |" in line).endswith("| 11.00 |")
