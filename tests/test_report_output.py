"""What sparse-report writes, from run folders that may come from anyone: figures inlined only from regular
PNG files inside their run folder (S2), CSV cells a spreadsheet reads as text (S3), no escape sequence on the
terminal (S5), no raw HTML in report.md, and --out replaced as a whole."""

from __future__ import annotations

import base64
import csv
import io
import json
import os
import re
import signal
from pathlib import Path

import pytest
from PIL import Image

from sparse_runner.reporting import main
from sparse_runner.reporting import html as report_html
from sparse_runner.reporting import render
from sparse_runner.reporting.render import Table, render_csv, render_markdown
from tests.test_report import write_run

CPU = ("experiment=lra_listops_cpu",)
MANIFEST = ".sparse-report.json"


def one_run(root: Path, name: str = "run", **kwargs) -> Path:
    return write_run(root / name, preset=CPU, experiment=kwargs.pop("experiment", "lra_listops_cpu"),
                     overrides=["experiment=lra_listops_cpu"], **kwargs)


def png(path: Path, colour: str = "teal") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (32, 24), colour).save(path)
    return path


class Hung(Exception):
    pass


@pytest.fixture
def deadline():
    """Fails a test that blocks (a FIFO opened for reading waits for a writer forever) instead of hanging."""
    def alarm(signum, frame):
        raise Hung("sparse-report blocked")
    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


# ------------------------------------------------------------------------------ S2: figures inlined
def test_only_regular_png_files_inside_the_run_folder_are_inlined(tmp_path: Path, deadline, capsys) -> None:
    root = tmp_path / "outputs"
    run = one_run(root)
    figures = run / "figures"
    png(figures / "alpha_trajectories.png")                       # a real figure: shown
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"TOP-SECRET\n")
    outside_png = png(tmp_path / "elsewhere.png", "red")           # a PNG, but not the run's
    (figures / "js_per_layer.png").symlink_to(secret)
    (figures / "density.png").symlink_to(outside_png)
    (figures / "zeros.png").symlink_to("/dev/zero")
    os.mkfifo(figures / "fifo.png")
    (figures / "text.png").write_text("not a picture")
    huge = figures / "huge.png"
    huge.write_bytes(png(tmp_path / "small.png").read_bytes())
    os.truncate(huge, 20 * 2**20 + 1)                              # over 20 MB, sparse: nothing written
    (figures / "inside.png").symlink_to("alpha_trajectories.png")  # a link within the run: fine
    (run / "outputs").mkdir()
    (run / "outputs" / "pathfinder_examples.png").symlink_to(outside_png)

    assert main([str(root), "--print", "none", "--formats", "html"]) == 0
    page = (root / "report" / "report.html").read_text(encoding="utf-8")
    assert base64.b64encode(b"TOP-SECRET\n").decode() not in page
    assert base64.b64encode(outside_png.read_bytes()).decode() not in page
    skipped = [text for _, text in re.findall(r'<(p|span) class="skipped">(.*?)</\1>', page)]
    reasons = {name: " ".join(text for text in skipped if name in text) for name in
               ("js_per_layer.png", "density.png", "zeros.png", "fifo.png", "text.png", "huge.png",
                "pathfinder_examples.png")}
    assert "outside the run folder" in reasons["js_per_layer.png"]
    assert "outside the run folder" in reasons["density.png"]
    assert "outside the run folder" in reasons["zeros.png"]
    assert "not a regular file" in reasons["fifo.png"]
    assert "not a PNG" in reasons["text.png"]
    assert "20 MB" in reasons["huge.png"]
    assert "outside the run folder" in reasons["pathfinder_examples.png"]
    shown = base64.b64encode((figures / "alpha_trajectories.png").read_bytes()).decode()
    assert page.count(shown) >= 2                                   # the figure and the link to it
    # the run list's files cell links the run's own files, never a link out of the run folder
    links = [link for link in page.split('href="')[1:]]
    assert not any(link.startswith(("../secret", "../elsewhere")) or "js_per_layer.png" in link.split('"')[0]
                   for link in links)
    assert any("figures/alpha_trajectories.png" in link.split('"')[0] for link in links)


def test_a_paper_figure_that_is_not_a_png_is_named_not_read(tmp_path: Path) -> None:
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "x.png").symlink_to("/etc/hostname")
    section = report_html.markdown_section("![The caption](figures/x.png)", tmp_path)
    assert "<img" not in section and "skipped" in section and "outside the report folder" in section


# ------------------------------------------------------------------------------------ S3: CSV cells
def test_csv_cells_are_never_formulas() -> None:
    table = Table(slug="t", title="T", headers=["=head", "n"],
                  rows=[['=HYPERLINK("http://evil","x")', "-0.5"], ["+cmd", "@SUM(A1)"], ["-2+3", "12.5"]])
    rows = list(csv.reader(io.StringIO(render_csv(table))))
    assert rows == [["'=head", "n"], ['\'=HYPERLINK("http://evil","x")', "-0.5"], ["'+cmd", "'@SUM(A1)"],
                    ["'-2+3", "12.5"]]


def test_a_formula_in_a_run_folder_name_reaches_the_csv_quoted(tmp_path: Path) -> None:
    root = tmp_path / "outputs"
    one_run(root, name="=HYPERLINK(1)")
    assert main([str(root), "--print", "none", "--formats", "csv"]) == 0
    text = (root / "report" / "runs_listops.csv").read_text(encoding="utf-8")
    cells = [cell for row in csv.reader(io.StringIO(text)) for cell in row]
    assert "'=HYPERLINK(1)" in cells and not any(cell.startswith("=") for cell in cells)


# ------------------------------------------------------------------------------ S5: the terminal
HOSTILE = "\x1b]0;owned\x07\x1b[2J\x9b31m"


def test_no_escape_sequence_reaches_the_terminal(tmp_path: Path, capsys) -> None:
    root = tmp_path / "outputs"
    one_run(root, name=f"evil{HOSTILE}", status="failed", error=f"boom{HOSTILE}", test_acc=None, val_acc=None)
    broken = root / f"broken{HOSTILE}"
    broken.mkdir()
    (broken / "metrics.json").write_text("{")                       # a warning naming this folder
    for show in ("overview", "md"):
        assert main([str(root), "--print", show, "--formats", "md"]) == 0
        out, err = capsys.readouterr()
        for text in (out, err):
            assert not any(char in text for char in "\x1b\x07\x9b"), (show, text)
        assert "boom]0;owned[2J31m" in out                          # what is left shows as plain text
        assert out.count("\n") > 10                                  # its lines kept
        assert "broken]0;owned" in err and err.count("\n") == 2      # the warning, then "wrote ..."


# ------------------------------------------------------------------------- Markdown: no raw HTML
def test_report_md_escapes_raw_html_and_the_overview_shows_it_as_written(tmp_path: Path, capsys) -> None:
    table = Table(slug="t", title="Title <script>alert(1)</script>", headers=["<b>h</b>"],
                  rows=[['<img src=x onerror="alert(1)">']], notes=["a <iframe> note, and `a < b` in code"])
    md = render_markdown([table], "summary <br>")
    for raw in ("<script>", "<b>", "<img", "<iframe>", "<br>"):
        assert raw not in md
    assert "&lt;img src=x" in md and "## Title &lt;script>" in md and "a &lt;iframe> note" in md
    assert "`a < b`" in md                     # a code span shows its text as written in any viewer

    root = tmp_path / "outputs"
    one_run(root, name="<img src=x onerror=alert(1)>")
    assert main([str(root), "--print", "overview", "--formats", "md"]) == 0
    out = capsys.readouterr().out
    assert "<img src=x onerror=alert(1)>" in out and "&lt;" not in out
    md = (root / "report" / "report.md").read_text(encoding="utf-8")
    assert "&lt;img src=x onerror=alert(1)>" in md and "<img" not in md


def test_latex_drops_control_characters() -> None:
    assert render.latex_escape(f"a{HOSTILE}b") == "a]0;owned[2J31mb"


# ------------------------------------------------------------------------------- --out as a whole
def files_under(folder: Path) -> set[str]:
    return {path.relative_to(folder).as_posix() for path in folder.rglob("*") if path.is_file()}


def test_a_report_replaces_the_earlier_one_as_a_whole(tmp_path: Path, capsys) -> None:
    root = tmp_path / "outputs"
    one_run(root)
    out = root / "report"
    assert main([str(root), "--print", "none", "--formats", "md,csv,tex"]) == 0
    assert "runs_listops.csv" in files_under(out) and "runs_listops.tex" in files_under(out)
    assert main([str(root), "--print", "none", "--formats", "md"]) == 0
    assert files_under(out) == {"report.md", MANIFEST}                # the earlier tables are gone
    assert json.loads((out / MANIFEST).read_text())["files"] == ["report.md"]
    assert not [path for path in tmp_path.rglob(".*.tmp")]             # no temporary folder left
    assert not [path for path in root.iterdir() if path.name.startswith(".report")]


def test_two_reports_on_one_out_at_once_leave_one_whole_report(tmp_path: Path, monkeypatch, capsys) -> None:
    """Report B is written from start to end while report A is being built: the folder is A's alone."""
    root_a, root_b = tmp_path / "a", tmp_path / "b"
    one_run(root_a)
    one_run(root_b, name="run_of_b", test_acc=0.25)
    out = tmp_path / "report"
    write_report = render.write_report
    inner: list[int] = []

    def write_while_b_runs(*args, **kwargs):
        if not inner:
            inner.append(-1)      # B's own write_report comes here too
            inner[0] = main([str(root_b), "--out", str(out), "--print", "none", "--formats", "md,tex"])
        return write_report(*args, **kwargs)

    monkeypatch.setattr("sparse_runner.reporting.report.write_report", write_while_b_runs)
    assert main([str(root_a), "--out", str(out), "--print", "none", "--formats", "md,csv"]) == 0
    assert inner == [0]
    files = files_under(out)
    assert not any(name.endswith(".tex") for name in files)              # nothing of B's is left
    assert "runs_listops.csv" in files
    assert "run_of_b" not in (out / "report.md").read_text()
    assert sorted(json.loads((out / MANIFEST).read_text())["files"]) == sorted(files - {MANIFEST})


def test_out_that_holds_other_files_is_refused_and_left_as_it_was(tmp_path: Path, capsys) -> None:
    root = tmp_path / "outputs"
    one_run(root)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("mine")
    assert main([str(root), "--out", str(mine), "--print", "none"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(mine) in err and "holds no report of sparse-report" in err
    assert files_under(mine) == {"thesis.tex"} and (mine / "thesis.tex").read_text() == "mine"
    assert [path.name for path in tmp_path.iterdir()] and not list(tmp_path.glob(".mine*"))

    # an earlier report that someone added a file to: refused, nothing removed
    out = tmp_path / "report"
    assert main([str(root), "--out", str(out), "--print", "none", "--formats", "md"]) == 0
    (out / "notes.txt").write_text("mine too")
    capsys.readouterr()
    assert main([str(root), "--out", str(out), "--print", "none", "--formats", "md,csv"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "notes.txt" in err
    assert files_under(out) == {"report.md", MANIFEST, "notes.txt"}

    # an empty folder is fine, and so is a file of ours missing from an earlier report
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main([str(root), "--out", str(empty), "--print", "none", "--formats", "md"]) == 0
    (empty / "report.md").unlink()
    assert main([str(root), "--out", str(empty), "--print", "none", "--formats", "md"]) == 0
    assert files_under(empty) == {"report.md", MANIFEST}


def test_a_failed_report_leaves_the_earlier_one_whole(tmp_path: Path, monkeypatch, capsys) -> None:
    root = tmp_path / "outputs"
    one_run(root)
    out = root / "report"
    assert main([str(root), "--print", "none", "--formats", "md,csv"]) == 0
    capsys.readouterr()
    before = {name: (out / name).read_bytes() for name in files_under(out)}
    one_run(root, name="later", test_acc=0.25)        # the next report's markdown differs

    def full_disk(*args, **kwargs):               # report.html fails after report.md is written
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("sparse_runner.reporting.report.render_page", full_disk)
    assert main([str(root), "--print", "none", "--formats", "md,html"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot write the report" in err and "No space left" in err
    assert {name: (out / name).read_bytes() for name in files_under(out)} == before
    assert not [path for path in root.iterdir() if path.name.startswith(".report")]
