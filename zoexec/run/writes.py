"""A run's writes that the system refuses (a full disk, a quota, a read-only or vanished
file system): one line naming the file, why, and the free space where it was, as a
ZoError (exit 2), whichever file it was: the log, the metrics, the trace, a snapshot,
final/, best/. What the run folder held before the failed write stays whole (the log
and the metrics are appended line by line and flushed; weights are written aside and
renamed), so the run resumes exactly with --resume once there is room
(docs/failures.md, "A full disk")."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from zoexec.run.verify import free_bytes
from zoplan.errors import ZoError
from zoplan.memory import fmt_bytes

DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def write_failed(path: Path | str, exc: OSError, *, what: str, tail: str = "") -> str:
    """'cannot write <what> <path>: <why>; <free> free on its file system<tail>'."""
    free = free_bytes(Path(path))
    room = f"; {fmt_bytes(free)} free on its file system" if free is not None else ""
    return f"cannot write {what} {path}: {exc.strerror or exc}{room}{tail}"


def resume_hint(folder: Path | str | None) -> str:
    """What the line of a failed write in a run folder adds: how the run goes on."""
    if folder is None:
        return ""
    return (f" (the run stopped; what {folder} holds is whole: resume it with --resume "
            f"{folder} once there is room)")


@contextmanager
def writing(path: Path | str, *, what: str, folder: Path | str | None = None) -> Iterator[None]:
    """An OSError inside (an open, a write, a flush, an fsync of `path`) is one ZoError
    line (write_failed), the resume hint for a run `folder` after it."""
    try:
        yield
    except OSError as exc:
        raise ZoError(write_failed(path, exc, what=what, tail=resume_hint(folder))) from None


def is_disk_full(exc: BaseException) -> bool:
    """An OSError of a full disk or a quota, or an error caused by one."""
    current: BaseException | None = exc
    for _ in range(8):
        if current is None:
            return False
        if isinstance(current, OSError) and current.errno in DISK_FULL:
            return True
        current = current.__cause__ or current.__context__
    return False
