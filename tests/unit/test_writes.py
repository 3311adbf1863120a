"""A refused write of a run (a full disk) is one line naming the file (issue 41):
zoexec.run.writes, the trace's span file, and the launcher's words for a full disk no
writer named."""

from __future__ import annotations

import errno
import os

import pytest

from zoexec.launch import failures
from zoexec.launch.rank import _TraceFile
from zoexec.run.writes import is_disk_full, writing
from zoplan.errors import ZoError
from zoplan.trace import Span, SpanWriter

FULL = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_refused_write_names_the_file_and_the_free_space(tmp_path):
    with pytest.raises(ZoError) as caught, writing(tmp_path / "metrics.jsonl", what="the metrics",
                                                   folder=tmp_path):
        raise FULL
    line = str(caught.value)
    assert line.startswith(f"cannot write the metrics {tmp_path / 'metrics.jsonl'}: No space left "
                           f"on device; ") and "free on its file system" in line
    assert f"resume it with --resume {tmp_path}" in line


def test_a_full_disk_under_the_trace_is_one_line(tmp_path, monkeypatch):
    def full(self) -> None:
        if self._held:
            raise FULL
    monkeypatch.setattr(SpanWriter, "flush", full)
    spans = _TraceFile(tmp_path, 0, buffer=1)
    with pytest.raises(ZoError, match=r"cannot write the trace .*rank0.jsonl: No space left on device"):
        spans.append(Span(kind="h2d", rank=0, start_s=0.0, dur_s=0.001, block=0, step=0))


def test_a_full_disk_no_writer_named_is_the_user_s_exit_2():
    """Wrapped once (a lane's failure caused by it) or not at all: exit 2, and the
    line says what ran out."""
    try:
        try:
            raise FULL
        except OSError as exc:
            raise RuntimeError("the write-back failed") from exc
    except RuntimeError as exc:
        wrapped = exc
    assert is_disk_full(FULL) and is_disk_full(wrapped)
    assert not is_disk_full(OSError(errno.EACCES, "denied"))
    assert failures.exit_code(FULL) == 2 and failures.exit_code(wrapped) == 2
    assert failures.failure_reason(FULL).startswith("no space left on a device: OSError: [Errno 28]")
