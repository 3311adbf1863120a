"""Trace directory round trip and its errors (zoplan.trace)."""

import pytest

from zoplan.errors import ZoError
from zoplan.trace import Span, read_trace, write_trace


def test_trace_round_trips_every_span(tmp_path):
    spans = [Span(kind=kind, rank=rank, start_s=0.5 * i, dur_s=0.25, block=i, step=i % 2)
             for rank in range(3) for i, kind in enumerate(("h2d", "allgather", "forward", "d2h"))]
    spans.append(Span(kind="allreduce", rank=0, start_s=9.0, dur_s=0.1))
    write_trace(tmp_path, spans, {"plan_sha256": "x"})
    meta, back = read_trace(tmp_path)
    assert meta["plan_sha256"] == "x" and meta["schema_version"] == 1
    key = lambda s: (s.rank, s.start_s, s.kind)  # noqa: E731
    assert sorted(back, key=key) == sorted(spans, key=key)


def test_bad_line_is_named_with_its_line_number(tmp_path):
    write_trace(tmp_path, [Span(kind="h2d", rank=0, start_s=0.0, dur_s=1.0)], {})
    good = (tmp_path / "rank0.jsonl").read_text()
    (tmp_path / "rank0.jsonl").write_text(good + "\n" + "{oops\n")
    with pytest.raises(ZoError, match=r"rank0.jsonl:3 is not valid JSON"):
        read_trace(tmp_path)


def test_span_missing_a_field_is_a_user_error(tmp_path):
    write_trace(tmp_path, [Span(kind="h2d", rank=0, start_s=0.0, dur_s=1.0)], {})
    (tmp_path / "rank0.jsonl").write_text('{"kind": "h2d", "rank": 0}\n')
    with pytest.raises(ZoError, match="malformed span"):
        read_trace(tmp_path)


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_numbers_in_a_json_input_are_one_line(tmp_path, constant):
    from zoplan.io import load_json

    path = tmp_path / "p.json"
    path.write_text('{"a": [1, ' + constant + ']}')
    with pytest.raises(ZoError, match=f"plan {path} holds {constant}, which is not a finite"):
        load_json(path, what="plan")


def test_a_rank_s_span_writer_holds_at_most_its_buffer_and_writes_what_read_trace_reads(tmp_path):
    from zoplan.trace import SpanWriter, write_trace_meta

    writer = SpanWriter(tmp_path, 1, buffer=8)
    for step in range(50):
        writer.append(Span(kind="h2d", rank=1, start_s=float(step), dur_s=0.5, step=step))
        assert len(writer._held) < 8
    writer.close()
    write_trace_meta(tmp_path, {"world_size": 2})
    meta, spans = read_trace(tmp_path)
    assert meta["world_size"] == 2 and [s.step for s in spans] == list(range(50))
    assert writer.count == 50


def test_the_schema_types_name_the_kinds_lanes_and_version_of_the_constants():
    from typing import get_args

    from zoplan import trace
    assert get_args(trace.SpanKind) == trace.KINDS
    assert get_args(trace.SpanLane) == ("",) + trace.LANES
    assert get_args(trace.TraceMeta.model_fields["schema_version"].annotation) == (
        trace.TRACE_SCHEMA_VERSION,)
