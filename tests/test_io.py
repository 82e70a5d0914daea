"""Atomic writes: a failed or interrupted write leaves the old file (or nothing), never half a file."""

from __future__ import annotations

import json

import pytest

from sparse_runner.io import atomic_open, atomic_write_json, atomic_write_text


def test_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "metrics.json"
    atomic_write_json(path, {"status": "completed"})
    with pytest.raises(RuntimeError):
        with atomic_open(path) as handle:
            handle.write('{"status": "runn')
            raise RuntimeError("killed mid-write")
    assert json.loads(path.read_text()) == {"status": "completed"}
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.json"]


def test_new_file_appears_only_when_complete(tmp_path):
    path = tmp_path / "sub" / "report.md"
    with atomic_open(path) as handle:
        handle.write("partial")
        assert not path.exists()  # readers never see the partial content
    assert path.read_text() == "partial"
    atomic_write_text(path, "replaced")
    assert path.read_text() == "replaced"


def test_written_files_have_ordinary_permissions(tmp_path):
    import os

    path = tmp_path / "metrics.json"
    atomic_write_text(path, "{}")
    mask = os.umask(0)
    os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~mask


def test_stale_temporaries_of_a_killed_run_are_removed(tmp_path):
    from sparse_runner.run import remove_stale_temporaries

    (tmp_path / "checkpoints").mkdir()
    stale = [tmp_path / ".metrics.json.abc123de.tmp", tmp_path / "checkpoints" / ".last.pt.xyz_9876.tmp"]  # as atomic_open names them
    for path in stale:
        path.write_text("half")
    keep = tmp_path / "metrics.json"
    keep.write_text("{}")
    remove_stale_temporaries(tmp_path)
    assert not any(p.exists() for p in stale) and keep.exists()


def test_atomic_directory_gets_the_usual_permissions(tmp_path):
    from sparse_runner.io import _UMASK, atomic_directory

    with atomic_directory(tmp_path / "cache") as staging:
        (staging / "a.txt").write_text("x")
    assert (tmp_path / "cache").stat().st_mode & 0o777 == 0o777 & ~_UMASK  # not mkdtemp's 0700
