"""Atomic file writes: a reader (or a run killed with -9) never sees a half-written file.

Every file the runner produces (metrics, configs, checkpoints, reports, cached data) goes through
these helpers: write to a temporary file in the same directory, flush and fsync, then `os.replace`,
which is atomic on POSIX file systems.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import IO, Any, Iterator


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _current_umask()


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
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
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
def atomic_directory(path: str | os.PathLike) -> Iterator[Path]:
    """Build a directory under a temporary name; rename it to `path` only when the block succeeds.

    Used for caches (generated datasets, tokenisers) so that a killed generation leaves nothing that
    a later run could mistake for a finished cache. If another process finished `path` first, its
    copy is kept and ours is discarded.
    """
    path = Path(path)
    with _naming(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    os.chmod(tmp, 0o777 & ~_UMASK)  # mkdtemp makes 0700; a shared cache must be as readable as any new folder
    try:
        yield tmp
        try:
            os.rename(tmp, path)
        except OSError:
            if not path.is_dir():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
