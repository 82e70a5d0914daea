"""Unusable ListOps input (task=listops_lra with task.data_dir, a damaged cache, impossible generator
settings) is refused in ONE line naming the file (and line), the problem and what is expected: a
`DataError` / `ConfigError` from the task, and on the real command line exit status 2, that line alone
on stderr, no traceback, and no metrics.json or checkpoint written."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparse_runner.checks import ConfigError, DataError
from sparse_runner.data.listops_splits import prepare_listops
from sparse_runner.tasks import build_task
from tests.conftest import TINY, sparse_run

GOOD_ROWS = "( ( ( [MAX 2 ) 9 ) ] )\t9\n( ( ( [MIN 4 ) 1 ) ] )\t1\n( ( ( [SM 5 ) 7 ) ] )\t2\n"

# name: (text of basic_train.tsv, line or None, what the message must say)
BROKEN_TRAIN = {
    "malformed_row": ("Source\tTarget\n" + GOOD_ROWS + "this line has no label\n", 5, ["1 tab-separated fields", "expected 'Source<TAB>Target' rows"]),
    "wrong_header": ("source\ttarget\n" + GOOD_ROWS, 1, ["expected the header 'Source<TAB>Target'", "got 'source\\ttarget'"]),
    "non_integer_label": ("Source\tTarget\n" + GOOD_ROWS + "( ( ( [MAX 2 ) 9 ) ] )\tnine\n", 5, ["label 'nine' is not an integer", "expected an integer 0-9"]),
    "out_of_range_label": ("Source\tTarget\n( ( ( [SM 5 ) 7 ) ] )\t12\n", 2, ["label 12 is out of range", "expected an integer 0-9"]),
    "unknown_token": ("Source\tTarget\n" + GOOD_ROWS + "( ( ( [FIRST 2 ) 9 ) ] )\t2\n", 5, ["unknown ListOps token '[FIRST'", "valid tokens are"]),
    "empty_file": ("", 1, ["the file is empty", "expected the header 'Source<TAB>Target'"]),
    "header_only": ("Source\tTarget\r\n", None, ["no examples (only the header); expected 'Source<TAB>Target' rows"]),
}


def release_dir(root: Path, train: str) -> Path:
    """A task.data_dir whose basic_train.tsv holds `train` (val and test are fine)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "basic_train.tsv").write_text(train)
    for split in ("val", "test"):
        (root / f"basic_{split}.tsv").write_text("Source\tTarget\n" + GOOD_ROWS)
    return root


def expected_start(data_dir: Path, line: int | None) -> str:
    path = data_dir / "basic_train.tsv"
    return f"{path}:{line}: " if line is not None else f"{path}: "


def assert_refused_in_one_line(result, tmp_path: Path, start: str, needles: list[str]) -> None:
    """Exit 2, `sparse-run: error: <start>...` as the only line on stderr, nothing of a run written."""
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr[-3000:]
    assert lines[0].startswith(f"sparse-run: error: {start}"), lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert "Traceback" not in result.stdout + result.stderr
    assert not list(tmp_path.rglob("metrics.json"))
    assert not list(tmp_path.rglob("*.pt"))


# ----------------------------------------------------------------------------------------- the task


@pytest.mark.parametrize("case", sorted(BROKEN_TRAIN))
def test_task_refuses_broken_release_file(tmp_path, tiny_config, case):
    text, line, needles = BROKEN_TRAIN[case]
    data_dir = release_dir(tmp_path / "lra", text)
    cfg = tiny_config("task=listops_lra", f"task.data_dir={data_dir}", f"paths.cache_dir={tmp_path / 'cache'}")
    with pytest.raises(DataError) as excinfo:
        build_task(cfg)
    message = str(excinfo.value)
    assert "\n" not in message and message.startswith(expected_start(data_dir, line)), message
    for needle in needles:
        assert needle in message, (needle, message)


def test_task_refuses_incomplete_cache(tmp_path, tiny_config):
    data_dir = release_dir(tmp_path / "lra", "Source\tTarget\n" + GOOD_ROWS)
    cfg = tiny_config("task=listops_lra", f"task.data_dir={data_dir}", f"paths.cache_dir={tmp_path / 'cache'}")
    assert build_task(cfg).sizes() == {"train": 3, "val": 3, "test": 3}
    (directory,) = (tmp_path / "cache" / "listops").glob("official-*")
    (directory / "tokens_test.npz").unlink()
    with pytest.raises(DataError) as excinfo:
        build_task(cfg)
    assert str(excinfo.value) == (
        f"ListOps cache {directory} is incomplete (missing tokens_test.npz); "
        f"delete that directory (rm -r {directory}) and rerun to rebuild it"
    )


def test_task_names_generator_keys_when_too_few_trees_fit(tmp_path, tiny_config):
    # Only the ten digits are shorter than 2 tokens, and TINY asks for 384 distinct examples.
    cfg = tiny_config("task.generator.min_length=0", "task.generator.max_length=2", f"paths.cache_dir={tmp_path / 'cache'}")
    with pytest.raises(ConfigError) as excinfo:
        build_task(cfg)
    assert not isinstance(excinfo.value, DataError)
    message = str(excinfo.value)
    assert "\n" not in message and message.startswith("task.generator: ListOps generator rejected"), message
    assert "widen the length window" in message


# ---------------------------------------------------------------------------------- the command line


def cli(tmp_path: Path, *overrides: str):
    return sparse_run([*TINY, *overrides], cwd=tmp_path, cache_dir=tmp_path / "cache")


# Every case's message, of the whole file or of a row, is checked in-process above
# (test_task_refuses_broken_release_file); the command line prints any of them the same way: one of them here.
@pytest.mark.parametrize("case", ["header_only"])
def test_cli_refuses_broken_release_file_in_one_line(tmp_path, case):
    text, line, needles = BROKEN_TRAIN[case]
    data_dir = release_dir(tmp_path / "lra", text)
    result = cli(tmp_path, "task=listops_lra", f"task.data_dir={data_dir}")
    assert_refused_in_one_line(result, tmp_path, expected_start(data_dir, line), needles)


def test_cli_refuses_incomplete_cache_in_one_line(tmp_path):
    data_dir = release_dir(tmp_path / "lra", "Source\tTarget\n" + GOOD_ROWS)
    prepare_listops(
        data_dir=data_dir, cache_dir=tmp_path / "cache",
        num_train=1, num_val=1, num_test=1, min_length=0, max_length=2, max_depth=1, max_args=2, seed=0,
    )
    (directory,) = (tmp_path / "cache" / "listops").glob("official-*")
    (directory / "tokens_train.npz").unlink()
    result = cli(tmp_path, "task=listops_lra", f"task.data_dir={data_dir}")
    assert_refused_in_one_line(result, tmp_path, f"ListOps cache {directory} is incomplete", [f"rm -r {directory}"])


def test_cli_refuses_generator_settings_too_few_trees_fit(tmp_path):
    result = cli(tmp_path, "task.generator.min_length=0", "task.generator.max_length=2")
    assert_refused_in_one_line(result, tmp_path, "task.generator: ListOps generator rejected", ["widen the length window"])
