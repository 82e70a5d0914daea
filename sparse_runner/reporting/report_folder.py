"""The report folder (`--out`), written as a whole: a report is built in a new folder beside it, which then
takes its place, so a reader never sees half a report, two reports at once never mix, and no file of an
earlier report stays behind.

Every report folder holds a manifest (MANIFEST: the files sparse-report wrote there). `--out` may be:
- a path where nothing is: the report is written there;
- an empty folder, or an earlier report (its manifest lists every file in it): replaced;
- anything else (a file, a folder with files sparse-report did not write): refused with one line
  (`Refused`), before anything is written, and nothing in it is touched.

The swap happens under a lock on the parent folder (flock), so that two reports finishing at once take
their turns: the folder holds one of them, whole.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from sparse_runner.io import atomic_write_json

MANIFEST = ".sparse-report.json"
WRITER = "sparse-report"
_SHOWN = 3   # file names a refusal lists


class Refused(ValueError):
    """`--out` cannot take a report; the message is the one line to print."""


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _entries(folder: Path) -> set[str]:
    """Every file, link and empty folder below `folder`, relative to it, links not followed."""
    found = set()

    def unreadable(exc: OSError) -> None:   # a folder not walked could hide a file that is not ours
        raise exc

    for dirpath, dirnames, filenames in os.walk(folder, onerror=unreadable):
        base = Path(dirpath).relative_to(folder)
        links = [name for name in dirnames if os.path.islink(os.path.join(dirpath, name))]
        found.update((base / name).as_posix() for name in filenames + links)
        if not dirnames and not filenames and dirpath != str(folder):
            found.add(base.as_posix())
    return found


def _listed(folder: Path) -> set[str] | None:
    """The files the manifest in `folder` says sparse-report wrote, or None where there is no manifest
    of ours (missing, unreadable, someone else's)."""
    manifest = folder / MANIFEST
    if manifest.is_symlink() or not manifest.is_file():
        return None
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("written_by") != WRITER or not isinstance(data.get("files"), list):
        return None
    return {str(name) for name in data["files"]}


def refusal(out_dir: Path, shown_as: str | None = None) -> str | None:
    """Why a report cannot replace `out_dir` (module docstring), in one line that names it `shown_as`
    (default: its path); None when it can."""
    name = shown_as or str(out_dir)
    if not os.path.lexists(out_dir):
        return None
    if not out_dir.is_dir():
        return f"{name} is a file, not a folder; choose a folder for the report with --out"
    present = _entries(out_dir)
    if not present:
        return None
    listed = _listed(out_dir)
    if listed is None:
        return (f"{name} is not empty and holds no report of sparse-report (no {MANIFEST} in it); "
                f"choose a new or empty folder with --out, or remove {name} if it is a report of yours")
    foreign = sorted(present - listed - {MANIFEST})
    if foreign:
        more = f" and {len(foreign) - _SHOWN} more" if len(foreign) > _SHOWN else ""
        return (f"{name} holds files sparse-report did not write ({', '.join(foreign[:_SHOWN])}{more}); "
                "move them out or choose another folder with --out")
    return None


def _inside(path: Path, folder: Path) -> bool:
    return path.parent.resolve().is_relative_to(folder.resolve())


def _remove_report(folder: Path) -> None:
    """Delete the files the manifest of `folder` lists (a manifest comes with the folder, so its names are
    only followed inside it), then the folders left empty; whatever else is there stays."""
    for name in sorted(_listed(folder) or ()) + [MANIFEST]:
        path = folder / name
        if ".." not in Path(name).parts and not Path(name).is_absolute() and _inside(path, folder):
            if path.is_symlink() or path.is_file():
                path.unlink()
    for dirpath, _, _ in os.walk(folder, topdown=False):   # the innermost folders first
        with contextlib.suppress(OSError):   # not empty: it holds something that is not ours
            os.rmdir(dirpath)


@contextlib.contextmanager
def _lock(folder: Path) -> Iterator[None]:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)   # closing the descriptor releases the lock


def _swap_in(build: Path, out_dir: Path, shown_as: str) -> None:
    """`build` takes the place of `out_dir`; an earlier report there is removed. Raises Refused where
    `out_dir`, checked again at the swap (something may have written there during the build), is not one a
    report may replace."""
    reason = refusal(out_dir, shown_as)
    if reason:
        raise Refused(reason)
    if not os.path.lexists(out_dir):
        os.rename(build, out_dir)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".old", dir=out_dir.parent))
    os.rename(out_dir, old)             # a folder may be renamed onto an empty one
    try:
        os.rename(build, out_dir)
    except BaseException:
        os.rename(old, out_dir)
        raise
    _remove_report(old)


@contextlib.contextmanager
def building(out_dir: Path) -> Iterator[Path]:
    """A new empty folder beside `out_dir` to write the report into. When the block ends without an
    exception, the folder gets its manifest and replaces `out_dir` as a whole; on an exception (Refused
    included) it is removed and `out_dir` is left as it was. Raises Refused up front where `out_dir` cannot
    take a report (refusal)."""
    target = out_dir.resolve()          # --out may be a link to the folder: the folder is replaced
    reason = refusal(target, str(out_dir))
    if reason:
        raise Refused(reason)
    target.parent.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        os.chmod(build, 0o777 & ~_umask())   # mkdtemp makes 0700; a report is as readable as any new folder
        yield build
        files = sorted(_entries(build))
        atomic_write_json(build / MANIFEST, {"written_by": WRITER, "files": files})
        with _lock(target.parent):
            _swap_in(build, target, str(out_dir))
    finally:
        if build.exists():
            shutil.rmtree(build, ignore_errors=True)
