"""report.html and the terminal overview: which tables hold runs and which rows fold (filled.py), learning
curves from log.jsonl (curves.py), the page's content (page.py), what goes to stdout, and the page in a real
browser (headless Chromium: no console error, every image decoded, the tables with their columns, the first
claim's verdict on the first screen at 1280 px and nothing wider than the window)."""

from __future__ import annotations

import json
import math
import re
import struct
import sys
from pathlib import Path

import pytest
from PIL import Image

from sparse_runner.reporting import collect_runs, main
from sparse_runner.reporting.curves import read_log, task_curves
from sparse_runner.reporting.filled import classify
from sparse_runner.reporting.render import Table
from tests.chromium import Chromium, find_binary
from tests.test_report import write_run

CPU = ("experiment=lra_listops_cpu",)


# ------------------------------------------------------------------------------------- filled.py
def lra_like(ours_listops: str) -> Table:
    return Table(slug="t", title="T", headers=["model", "source", "ListOps", "Text", "Avg"], rows=[
        ["Transformer", "published", "36.37", "64.27", "50.32"],
        ["Transformer (softmax)", "ours: paper presets", "run: sparse-run experiment=lra_listops",
         "run: sparse-run experiment=lra_text", ""],
        ["Transformer (softmax)", "ours: CPU presets", ours_listops, "run: sparse-run experiment=lra_text_cpu", ""],
    ], numeric={2, 3, 4})


def test_a_table_with_a_run_folds_only_its_empty_rows_of_ours() -> None:
    baseline = lra_like("run: sparse-run experiment=lra_listops_cpu")
    filled = classify(lra_like("41.23 ± 0.50 (n=3)"), baseline)
    assert filled.has_runs and filled.empty_rows == [1]
    assert [row[1] for row in filled.shown_rows] == ["published", "ours: CPU presets"]
    assert filled.fold_line() == "1 row of ours without runs; `sparse-run experiment=lra_listops` fills one of 2 empty cells"
    empty = classify(baseline, baseline)
    assert not empty.has_runs and empty.empty_rows == [1, 2]
    assert empty.fold_line().startswith("no runs yet; `sparse-run experiment=lra_listops` fills one of 4")


def test_published_columns_never_fold_and_a_table_like_its_baseline_has_no_runs() -> None:
    # Correia et al.'s layout: published and ours side by side; folding the row would hide the published number.
    side_by_side = Table(slug="c", title="C", headers=["model", "de→en published", "de→en ours"],
                         rows=[["softmax", "29.79", "run: sparse-run experiment=x model=softmax"]])
    assert classify(side_by_side, side_by_side).empty_rows == []
    # Bhojanapalli et al.'s layout: no fill cells, commands in the notes; computed columns are filled anyway.
    computed = Table(slug="b", title="B", headers=["heads", "params ours", "F1 published", "F1 ours"],
                     rows=[["8", "335.17", "90.89", ""]], notes=["Fill: `sparse-run -m experiment=b seed=0,1,2`."])
    filled = classify(computed, computed)
    assert not filled.has_runs and filled.fold_line() == "no runs yet; fill: `sparse-run -m experiment=b seed=0,1,2`"
    ours = Table(slug="b", title="B", headers=computed.headers, rows=[["8", "335.17", "90.89", "88.10"]])
    assert classify(ours, computed).has_runs
    # A table a paper shows only once some runs exist, holding only published rows and empty rows of ours.
    robustness = Table(slug="r", title="R", headers=["model", "source", "shift", "shifted acc"], rows=[
        ["ERNIE", "published: Liu et al.", "n/p", "78.77"],
        ["hst", "ours: CPU presets", "1", "run: sparse-run experiment=p model=hst"]])
    filled = classify(robustness, None)
    assert not filled.has_runs and filled.empty_rows == [1]


# ------------------------------------------------------------------------------------- curves.py
def write_log(run_dir: Path, steps: int, loss=lambda step: 2.0 - step / 1000, val=lambda step: step / 1000) -> None:
    lines = []
    for step in range(10, steps + 1, 10):
        lines.append({"step": step, "train/loss": loss(step)})
        if step % 50 == 0:
            lines.append({"step": step, "val/loss": 1.0, "val/accuracy": val(step)})
    (run_dir / "log.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_read_log_keeps_the_last_value_of_a_step_and_skips_what_is_not_json(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    log.write_text('{"step": 10, "train/loss": 2.0}\n{"step": 20, "train/loss": 1.9}\n{"step": 20, "train/l'
                   '\n{"step": 20, "train/loss": 1.8}\n{"step": 30, "train/loss": NaN}\n')
    curve = read_log(log, ("train/loss", "val/accuracy"))
    assert curve["val/accuracy"] == {}
    assert curve["train/loss"][10] == 2.0 and curve["train/loss"][20] == 1.8 and math.isnan(curve["train/loss"][30])


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    """Three seeds of one CPU preset, a failed and a diverged run beside them, all with logs; the third
    seed (the best) drew alpha trajectories and Pathfinder-like examples."""
    root = tmp_path / "outputs"
    for seed, acc in ((0, 0.40), (1, 0.42), (2, 0.44)):
        run = write_run(root / "multirun" / f"seed{seed}", preset=CPU, experiment="lra_listops_cpu", test_acc=acc,
                        val_acc=acc - 0.01, config_updates={"seed": seed},
                        overrides=["experiment=lra_listops_cpu", f"seed={seed}"])
        write_log(run, 200, val=lambda step, acc=acc: acc * step / 200)
    failed = write_run(root / "multirun" / "failed", preset=CPU, experiment="lra_listops_cpu", status="failed",
                       error="RuntimeError: out of memory", test_acc=None, val_acc=None,
                       config_updates={"seed": 3, "trainer.lr": 0.01})
    write_log(failed, 60)
    diverged = write_run(root / "multirun" / "diverged", preset=CPU, experiment="lra_listops_cpu", status="diverged",
                         test_acc=None, val_acc=None, step=100, config_updates={"seed": 4, "trainer.lr": 1.0})
    write_log(diverged, 100, loss=lambda step: math.inf if step >= 100 else 2.0)
    first = root / "multirun" / "seed2"   # the best seed on validation: the one whose figures a group shows
    (first / "figures").mkdir()
    (first / "outputs").mkdir()
    Image.new("RGB", (64, 48), "teal").save(first / "figures" / "alpha_trajectories.png")
    Image.new("RGB", (64, 48), "navy").save(first / "figures" / "js_per_layer.png")
    Image.new("RGB", (80, 40), "black").save(first / "outputs" / "pathfinder_examples.png")
    return root


def png_size(png: bytes) -> tuple[int, int]:
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", png[16:24])


def test_one_figure_per_task_and_experiment_seeds_as_a_band_unfinished_runs_apart(sweep: Path) -> None:
    figures = task_curves(collect_runs([sweep]))
    assert [(f.task, f.experiment) for f in figures] == [("listops", "lra_listops_cpu")]
    width, height = png_size(figures[0].png)
    assert width > 600 and height > 250
    assert figures[0].caption.startswith("1 group of completed runs (mean over seeds")
    assert "2 runs that did not complete dashed, never averaged" in figures[0].caption


# --------------------------------------------------------------------------------- the page, stdout
def test_report_html_is_self_contained_with_curves_runs_and_folded_tables(sweep: Path, capsys) -> None:
    assert main([str(sweep), "--print", "none"]) == 0
    page = (sweep / "report" / "report.html").read_text(encoding="utf-8")
    assert "<script" not in page.lower()
    sources = re.findall(r'<img src="([^"]*)"', page)
    assert sources and all(src.startswith("data:image/png;base64,") for src in sources)
    assert not re.search(r'(src|href)="(https?:)?//', page)               # nothing from a network
    assert "Learning curves, experiment=lra_listops_cpu" in page
    assert "Test examples with their labels" in page and "Learned α per head during training" in page
    # every run, failed and diverged ones marked, with links to its folder and files that resolve from the page
    for name in ("seed0", "failed", "diverged"):
        assert f'>multirun/{name}</a>' in page
    assert '<span class="status-failed">failed</span>' in page and "RuntimeError: out of memory" in page
    links = re.findall(r'<a href="([^"#]*)">', page)
    assert links and all((sweep / "report" / link).exists() for link in links)
    # LRA Table 1 holds the seeds' row; its paper-preset rows fold into one line; Correia's table has no run.
    lra = page.split('id="lra-table-1-published-vs-ours-test-accuracy"')[1].split("<h2")[0]
    assert "42.00 ± 2.00 (n=3)" in lra and "rows of ours without runs" in lra
    without = page.split('id="paper-tables-without-runs"')[1]
    assert "Correia et al. 2019 Table 1" in without and "no runs yet" in without
    # the verdicts first, then the paper tables, then the runs
    sections = ['id="claims-does-it-reproduce-verdicts-computed-from-the-runs"', "<nav>",
                'id="lra-table-1-published-vs-ours-test-accuracy"', 'id="paper-tables-without-runs"',
                'id="runs-task-listops"']
    assert [page.index(section) for section in sections] == sorted(page.index(section) for section in sections)


def test_the_overview_says_runs_then_tables_with_runs_then_a_line_per_empty_table(sweep: Path, capsys) -> None:
    assert main([str(sweep), "--print", "overview", "--formats", "md,html"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("5 run(s) under ")
    titles = [line[3:] for line in out.splitlines() if line.startswith("## ")]
    assert titles[0] == "Runs: task=listops" and "LRA Table 1: published vs ours (test accuracy %)" in titles
    assert not any(title.startswith("Correia") for title in titles)        # no runs: one line, not a table
    empty = out.split("Paper tables without runs:\n")[1].splitlines()
    assert any(line.startswith("- Correia et al. 2019 Table 1") and "no runs yet" in line for line in empty)
    assert "| Transformer (softmax) | ours: paper presets |" not in out     # folded
    assert "+ 3 rows of ours without runs" in out
    assert err.splitlines()[-1].endswith(str(sweep / "report" / "report.html"))


def test_stdout_to_a_pipe_is_the_markdown_report(sweep: Path, capsys) -> None:
    assert main([str(sweep), "--formats", "md"]) == 0                      # capsys is no terminal
    out, err = capsys.readouterr()
    assert out == (sweep / "report" / "report.md").read_text(encoding="utf-8")
    assert not (sweep / "report" / "report.html").exists() and "report.html" not in err


# --------------------------------------------------------------------------------------- the browser
def test_report_html_in_headless_chromium(sweep: Path, tmp_path: Path) -> None:
    if find_binary() is None:
        sys.__stderr__.write("\n*** SKIPPED: no chromium on PATH, report.html was not opened in a browser "
                             "(apt-get install chromium; .ci/run installs it) ***\n")
        pytest.skip("no chromium on PATH (apt-get install chromium)")
    assert main([str(sweep), "--print", "none", "--formats", "html"]) == 0
    with Chromium.launch() as browser:
        page = browser.open(sweep / "report" / "report.html", width=1400, height=1800)
        shot = page.screenshot(tmp_path / "report.png")
        # every image decoded, those folded in <details> too
        widths = page.evaluate("document.querySelectorAll('details').forEach(d => d.open = true);"
                               "Promise.all([...document.images].map(i => i.decode().then(() => i.naturalWidth, () => 0)))")
        tables = page.evaluate("[...document.querySelectorAll('table')].map(t => ({"
                               "headers: [...t.querySelectorAll('th')].map(th => th.textContent),"
                               "rows: [...t.querySelectorAll('tbody tr')].map(tr => [...tr.cells].map(td => td.textContent))}))")
        errors = page.errors
    assert errors == []
    assert len(widths) >= 4 and all(width > 0 for width in widths), widths
    assert png_size(shot.read_bytes()) == (1400, 1800)
    lra = next(t for t in tables if t["headers"][:3] == ["model", "source", "ListOps"] and
               any(row[1] == "ours: CPU presets" for row in t["rows"]))
    assert ["Transformer", "published", "36.37"] == lra["rows"][0][:3]
    assert any(row[1] == "ours: CPU presets" and row[2] == "42.00 ± 2.00 (n=3)" for row in lra["rows"])
    runs = next(t for t in tables if "files" in t["headers"])
    assert {row[1] for row in runs["rows"]} == {"completed", "failed", "diverged"}


EVIDENCE = Path(__file__).resolve().parents[1] / "docs" / "evidence" / "ernie_sparse_listops_cpu"


def test_the_claims_view_shows_result_and_verdict_and_folds_the_statistics(tmp_path: Path) -> None:
    """The compact claims view keeps its five columns; p, Holm p, n needed, the published comparison, the
    shared arms and the commits of the runs (the kept runs record only their last process's) fold under each
    claim's paper."""
    assert main([str(EVIDENCE), "--out", str(tmp_path / "report"), "--print", "none", "--formats", "html"]) == 0
    page = (tmp_path / "report" / "report.html").read_text(encoding="utf-8")
    claims = page.split('<table class="claims">')[1].split("</table>")[0]
    head = re.findall(r'<th class="([^"]+)">', claims.split("</thead>")[0])
    assert head == ["claim", "treatment", "baseline", "result", "verdict"]
    first = claims.split("<tbody>")[1].split("</tr>")[0]
    folded = re.findall(r"<dt>([^<]+)</dt>", first)
    assert {"p", "Holm p", "n needed", "vs published", "shared arm", "commits", "test"} <= set(folded)
    assert "underpowered: 17 per arm would decide it (has 3)" in first   # ERNIE-Sparse vs BigBird on ListOps
FIRST_CLAIM = """(() => {
  const table = [...document.querySelectorAll('table')].find(
      t => [...t.querySelectorAll('thead th')].some(th => th.textContent === 'verdict'));
  const column = [...table.querySelectorAll('thead th')].findIndex(th => th.textContent === 'verdict');
  const cell = table.querySelector('tbody tr').cells[column];
  const box = cell.getBoundingClientRect();
  return {verdict: cell.textContent.trim(), left: box.left, right: box.right, top: box.top, bottom: box.bottom,
          pageWidth: document.documentElement.scrollWidth, firstSection: document.querySelector('h2').textContent};
})()"""


def test_the_verdicts_fit_the_first_screen_at_1280_px(tmp_path: Path) -> None:
    """Real kept runs (ERNIE-Sparse on ListOps, 31 runs, claims with verdicts): the claims come first, the
    first claim's verdict is on the first screen, and nothing makes the page wider than the window."""
    if find_binary() is None:
        pytest.skip("no chromium on PATH (apt-get install chromium)")
    assert main([str(EVIDENCE), "--out", str(tmp_path / "report"), "--print", "none", "--formats", "html"]) == 0
    with Chromium.launch() as browser:
        page = browser.open(tmp_path / "report" / "report.html", width=1280, height=900)
        first = page.evaluate(FIRST_CLAIM)
        page.evaluate("document.querySelectorAll('details').forEach(d => d.open = true)")
        opened_width = page.evaluate("document.documentElement.scrollWidth")
        errors = page.errors
    assert errors == []
    assert first["firstSection"].startswith("Claims")
    assert first["verdict"] in ("held", "not held", "inconclusive")
    assert 0 <= first["left"] and first["right"] <= 1280 and first["bottom"] <= 900, first
    assert first["pageWidth"] <= 1280 and opened_width <= 1280
