"""Atomic file writes: a reader (or a run killed with -9) never sees a half-written file.

Every file the runner produces (metrics, configs, checkpoints, reports, cached data) goes through
these helpers: write to a temporary file in the same directory, flush and fsync, then `os.replace`,
which is atomic on POSIX file systems.

A temporary sibling of NAME is named `.NAME.XXXXXXXX.tmp` (`is_temporary`, `temporary_target`): a run
killed mid-write leaves one, and the runner removes exactly these names, never another `.tmp` file.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import IO, Any, Iterator


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _current_umask()

# tempfile's random part is 8 characters of [a-z0-9_].
_TEMPORARY = re.compile(r"\.(?P<target>.+)\.[a-z0-9_]{8}\.tmp")


def _temporary_sibling_options(path: Path) -> dict[str, Any]:
    """mkstemp / mkdtemp arguments that name a temporary sibling of `path` as `temporary_target` reads it."""
    return {"prefix": f".{path.name}.", "suffix": ".tmp", "dir": path.parent}


def temporary_target(name: str) -> str | None:
    """The name of the file or folder that `name` is a temporary sibling of (atomic_open, atomic_directory),
    or None when `name` is not one of this module's temporaries."""
    match = _TEMPORARY.fullmatch(name)
    return match.group("target") if match else None


def is_temporary(name: str) -> bool:
    """Whether `name` is one of this module's temporary siblings (`.NAME.XXXXXXXX.tmp`)."""
    return temporary_target(name) is not None


class NotWritable(OSError):
    """`path` could not be written (a read-only file system, no permission); the error names `path`
    itself, not the temporary sibling that the write goes through."""


@contextlib.contextmanager
def _naming(path: Path) -> Iterator[None]:
    """Report a failure to make the parent directories or the temporary sibling of `path` as `path`'s."""
    try:
        yield
    except NotWritable:
        raise
    except OSError as exc:
        if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise NotWritable(exc.errno, exc.strerror, str(path)) from None
        raise


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """Open a temporary sibling of `path` for writing; on success it replaces `path` atomically.

    On an exception the temporary file is removed and `path` is left as it was.
    """
    path = Path(path)
    with _naming(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(**_temporary_sibling_options(path))
    binary = "b" in mode
    try:
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; results should be as readable as any new file
        with os.fdopen(fd, mode, encoding=None if binary else encoding) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_open(path, "w") as handle:
        handle.write(text)


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike, *, replace: bool = False) -> Iterator[Path]:
    """Build a directory under a temporary name; rename it to `path` only when the block succeeds.

    Used for caches (generated datasets, tokenisers) so that a killed generation leaves nothing that
    a later run could mistake for a finished cache. If another process finished `path` first, its
    copy is kept and ours is discarded.

    replace=True: a directory already at `path` is replaced as a whole (nothing of it stays); it is moved
    aside and removed once the new one is in its place.
    """
    path = Path(path)
    with _naming(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(**_temporary_sibling_options(path)))
    os.chmod(tmp, 0o777 & ~_UMASK)  # mkdtemp makes 0700; a shared cache must be as readable as any new folder
    try:
        yield tmp
        if replace and path.is_dir() and not path.is_symlink():
            with _naming(path):
                _swap_in(tmp, path)
            return
        try:
            os.rename(tmp, path)
        except OSError:
            if not path.is_dir():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _swap_in(new: Path, path: Path) -> None:
    """Put the directory `new` in the place of the directory `path`, and remove what `path` held."""
    old = Path(tempfile.mkdtemp(**_temporary_sibling_options(path)))
    os.rename(path, old)  # onto the empty directory mkdtemp made: a free temporary name
    try:
        os.rename(new, path)
    except OSError:
        os.rename(old, path)
        raise
    shutil.rmtree(old, ignore_errors=True)
