"""Reading a file of a run folder that may come from anyone: only a regular file inside the folder, and
never more than a limit.

Every file sparse-report reads from a run (metrics.json, .hydra/*.yaml, log.jsonl, figures) goes through
`read_bytes`. A link to a private file would put that file into the report, a FIFO would stop the report
forever, and /dev/zero or a huge file would exhaust memory; each is refused with a reason of a few words
(`NotShown`), before anything of the file is read.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from sparse_runner.checks import one_line

MB = 2**20
_FILE_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
               stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a folder"}


class NotShown(Exception):
    """A file of a run the report does not read; its message says why, in a few words."""


def _not_regular(mode: int) -> str | None:
    if stat.S_ISREG(mode):
        return None
    return f"not a regular file ({_FILE_KINDS.get(stat.S_IFMT(mode), 'a special file')})"


def file_problem(path: Path, folder: Path, where: str = "run") -> str | None:
    """Why `path` is not a file of `folder` the report may read or link, in a few words: it cannot be
    resolved, it resolves outside `folder` (a link out of it), or it is not a regular file; None when
    it is one (links within `folder` are followed). Reads nothing of the file."""
    try:
        resolved = path.resolve(strict=True)
        mode = resolved.stat().st_mode
        inside = resolved.is_relative_to(folder.resolve(strict=True))
    except (OSError, RuntimeError) as exc:   # RuntimeError: a loop of links
        return f"cannot be read ({one_line(exc)})"
    if not inside:
        return f"a link to a file outside the {where} folder"
    return _not_regular(mode)


def read_bytes(path: Path, folder: Path, limit: int, where: str = "run") -> bytes:
    """The bytes of `path`, a regular file inside `folder` (file_problem) of at most `limit` bytes. Raises
    NotShown saying which it is not, before reading anything of a file that is not one."""
    problem = file_problem(path, folder, where)
    if problem:
        raise NotShown(problem)
    too_big = f"over the limit of {limit / MB:g} MB"
    try:
        # O_NONBLOCK: should a FIFO take the file's place after the check, opening it does not wait
        fd = os.open(path.resolve(), os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as handle:
            info = os.fstat(handle.fileno())
            problem = _not_regular(info.st_mode)
            if problem is None and info.st_size > limit:
                problem = f"{info.st_size:,} bytes, {too_big}"
            if problem:
                raise NotShown(problem)
            data = handle.read(limit + 1)
    except OSError as exc:
        reason = exc.strerror or one_line(exc)
        raise NotShown(f"cannot be read: {reason[:1].lower()}{reason[1:]}") from None
    if len(data) > limit:   # it grew after fstat
        raise NotShown(too_big)
    return data
