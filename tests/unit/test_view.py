"""zoplan.views (show, compare, listings, gantt, chrome): rendered text, rank folding, critical path, exports, CLI."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from zoplan.cli import app
from zoplan.errors import ZoError
from zoplan.layout import Layout
from zoplan.models import get_model
from zoplan.plan import Plan
from zoplan.trace import LANES, Span, write_trace
from zoplan.views.chrome import measured_pid_offset
from zoplan.views.compare import compare_command
from zoplan.views.gantt import LABEL_WIDTH, Window, critical_breakdown, critical_path, lane_cells
from zoplan.views.listings import render_models, render_profiles
from zoplan.views.show import render_short_timeline, show_command

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from view_synth import make_plan_data, make_trace_spans, write_plan  # noqa: E402

LAYOUTS = {1: Layout(), 8: Layout(pertp=2, ddp=4, slices=4),
           64: Layout(pertp=2, ddp=32, nodes=8, slices=8)}


def console(width: int) -> Console:
    return Console(width=width, record=True, force_terminal=False)


def show_text(plan: Path, width: int = 80, **kwargs) -> str:
    con = console(width)
    args = dict(trace=None, ranks=None, blocks=None, width=None, chrome=None, svg=None)
    show_command(plan=plan, console=con, **{**args, **kwargs})
    return con.export_text()


@pytest.fixture(scope="module")
def plans(tmp_path_factory) -> dict[int, Path]:
    folder = tmp_path_factory.mktemp("plans")
    out = {}
    for ranks, layout in LAYOUTS.items():
        out[ranks] = folder / f"plan{ranks}.json"
        model = "opt-1.3b" if ranks == 64 else "tiny-opt"
        write_plan(out[ranks], layout=layout, model=model, slow_node=1.3)
    return out


@pytest.fixture(scope="module")
def trace8(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("trace") / "t8"
    write_trace(folder, make_trace_spans(LAYOUTS[8], 4, rank_skew=0.01), {"world_size": 8})
    return folder


def chart_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line[LABEL_WIDTH:LABEL_WIDTH + 1] == "│"]


# ---- rendering ------------------------------------------------------------------------
@pytest.mark.parametrize("width", [80, 200])
@pytest.mark.parametrize("ranks", [1, 8, 64])
def test_show_renders_lanes_axis_legend_at_width(plans, ranks, width):
    text = show_text(plans[ranks], width=width)
    rows = chart_lines(text)
    assert all(len(line) == width for line in rows), [len(r) for r in rows]
    labels = {line[RANK_LABEL:LABEL_WIDTH].strip() for line in rows}
    assert {"comp", "h2d", "coll", "d2h", "path"} <= labels
    assert "time [ms]" in text and "└┬" in text
    for word in ("forward", "update", "h2d", "d2h", "idle", "waiting (critical path)"):
        assert word in text
    assert "step time" in text and "speed-up vs ZO2" in text and "3.00x" in text
    assert len(rows) <= 4 * 7 + 1, "ranks must be folded"
    if ranks == 64:
        assert "64 ranks drawn as 2 row set(s)" in text
        assert "r0×56 = ranks 0-7,16-63" in text


RANK_LABEL = 10


def test_idle_gaps_and_partial_cells_are_visible(plans):
    text = show_text(plans[1], width=80)
    compute = next(line for line in chart_lines(text) if line[RANK_LABEL:14].strip() == "comp")
    assert "·" in compute and "█" in compute and "▓" in compute


def test_many_distinct_ranks_get_summary_rows(plans, tmp_path):
    trace = tmp_path / "t64"
    spans = make_trace_spans(LAYOUTS[64], get_model("opt-1.3b").num_layers, steps=2,
                             rank_skew=0.003)
    write_trace(trace, spans, {"world_size": 64})
    text = show_text(plans[64], width=120, trace=trace)
    assert "+58 ranks" in text
    assert "share of ranks busy" in text
    assert "measured: 64 ranks: first 6 row sets shown, the other 58 ranks summarised" in text


def test_zoom_to_blocks_and_ranks(plans):
    text = show_text(plans[8], ranks="2-3", blocks="1-2")
    assert "(blocks 1-2), ranks 2-3" in text
    window = next(line for line in text.splitlines() if line.startswith("window"))
    assert not window.startswith("window 0 ")
    assert "r2-3" in text and "r0" not in "".join(chart_lines(text))


def test_measured_step_under_predicted_with_lane_table(plans, trace8):
    text = show_text(plans[8], width=100, trace=trace8)
    assert text.index("predicted step") < text.index("measured step 2")
    assert "skipping warm-up step 0" in text
    for word in ("busy time per lane", "meas/pred", "compute", "collective", "step"):
        assert word in text
    assert "r0 " in text and "r7 " in text   # measured ranks differ: one row set each


def test_short_timeline_is_compact(plans):
    con = console(80)
    render_short_timeline(Plan.load(plans[8]), con)
    text = con.export_text()
    assert len(text.splitlines()) <= 10
    assert "timeline of rank 0 of 8" in text and "time [ms]" in text
    assert all(len(line) <= 80 for line in text.splitlines())


def test_models_and_profiles_tables(monkeypatch, tmp_path):
    con = console(140)
    render_models(con)
    text = con.export_text()
    assert "opt-175b" in text and "tiny-qwen3" in text and "block MiB" in text and "sizes in fp16" in text
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    import zoplan.hardware
    shipped = zoplan.hardware.shipped_profiles()
    monkeypatch.setattr("zoplan.views.listings.shipped_profiles",
                        lambda: {"dgx-a100-80gb": shipped["dgx-a100-80gb"], "broken": broken})
    con = console(140)
    render_profiles(con)
    text = con.export_text()
    assert "A100-SXM4-80GB" in text and "nvswitch" in text
    assert "broken" in text and "not valid JSON" in text


# ---- critical path --------------------------------------------------------------------
def span(kind, rank, start, dur, block=-1):
    return Span(kind=kind, rank=rank, start_s=start, dur_s=dur, block=block)


def test_critical_path_follows_latest_predecessor_across_slice_group():
    layout = Layout(ddp=2, slices=2)
    spans = [span("h2d", 0, 0.0, 1.0, 0), span("h2d", 1, 0.0, 3.0, 0),
             span("allgather", 0, 3.0, 1.0, 0), span("allgather", 1, 3.0, 1.0, 0),
             span("update", 0, 4.5, 0.5, 0), span("forward", 0, 5.0, 2.0, 0),
             span("forward", 1, 4.0, 1.0, 0)]
    path = critical_path(spans, layout)
    assert [(s.kind, s.rank) for s in path] == [("h2d", 1), ("allgather", 0), ("update", 0),
                                                 ("forward", 0)]
    parts = critical_breakdown(path)
    assert parts["wait"] == pytest.approx(0.5) and parts["h2d"] == pytest.approx(3.0)


def test_cell_rule_majority_kind_and_partial():
    window = Window(start_s=0.0, end_s=4.0, cells=4)
    cells = lane_cells([span("update", 0, 0.0, 0.4), span("forward", 0, 0.4, 0.6),
                        span("forward", 0, 2.0, 0.2)], window)
    assert cells == (("forward", 2), (None, 0), ("forward", 1), (None, 0))


# ---- exports --------------------------------------------------------------------------
def test_chrome_trace_processes_lanes_and_durations(plans, trace8, tmp_path):
    out = tmp_path / "trace.json"
    show_text(plans[8], trace=trace8, chrome=out)
    events = json.loads(out.read_text())["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert complete and all(e["ph"] in ("X", "M") for e in events)
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    offset = measured_pid_offset(8)
    assert {p for p in names if p < offset} == set(range(8))
    assert names[3] == "predicted rank 3" and names[offset + 3] == "measured rank 3"
    assert {e["pid"] for e in complete} <= set(names)
    sums: dict = {}
    for e in complete:
        if e["pid"] < offset:
            sums[(e["pid"], e["tid"])] = sums.get((e["pid"], e["tid"]), 0.0) + e["dur"]
    expected: dict = {}
    for s in Plan.load(plans[8]).spans():
        key = (s.rank, LANES.index(s.lane))
        expected[key] = expected.get(key, 0.0) + s.dur_s * 1e6
    assert sums.keys() == expected.keys()
    for key, value in expected.items():
        assert sums[key] == pytest.approx(value, abs=1e-2)


def test_svg_export(plans, tmp_path):
    out = tmp_path / "timeline.svg"
    show_text(plans[8], svg=out, width=120)
    svg = out.read_text()
    assert svg.lstrip().startswith("<svg") and "critical" in svg


def test_outputs_written_only_when_all_can_be(plans, tmp_path):
    chrome = tmp_path / "c.json"
    with pytest.raises(ZoError, match="does not exist"):
        show_text(plans[8], chrome=chrome, svg=tmp_path / "missing" / "t.svg")
    assert not chrome.exists()
    with pytest.raises(ZoError, match="--ranks 9-12: plan has ranks 0-7"):
        show_text(plans[8], chrome=chrome, ranks="9-12")
    assert not chrome.exists()


# ---- errors ---------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, message", [
    ({"ranks": "5-9"}, "--ranks 5-9: plan has ranks 0-3"),
    ({"ranks": "x"}, "--ranks x: expected a range"),
    ({"ranks": "3-1"}, "runs backwards"),
    ({"blocks": "0-9"}, "--blocks 0-9: model tiny-opt has blocks 0-3"),
    ({"width": 30}, "--width 30: the chart needs at least 35 columns"),
])
def test_bad_selections_are_user_errors(tmp_path, kwargs, message):
    plan = tmp_path / "p4.json"
    write_plan(plan, layout=Layout(ddp=4))
    with pytest.raises(ZoError, match=message.replace("(", r"\(")):
        show_text(plan, **kwargs)


def test_malformed_or_mismatched_trace_is_a_user_error(plans, tmp_path):
    bad = tmp_path / "bad"
    write_trace(bad, make_trace_spans(LAYOUTS[8], 4, steps=2), {"world_size": 8})
    (bad / "rank0.jsonl").write_text("{broken\n")
    with pytest.raises(ZoError, match="rank0.jsonl:1 is not valid JSON"):
        show_text(plans[8], trace=bad)
    good = tmp_path / "good"
    write_trace(good, make_trace_spans(LAYOUTS[8], 4, steps=2), {"world_size": 8})
    with pytest.raises(ZoError, match="recorded with 8 ranks; plan has 1"):
        show_text(plans[1], trace=good)
    write_trace(good, make_trace_spans(LAYOUTS[8], 4, steps=2), {})
    with pytest.raises(ZoError, match="spans of rank 7; plan has rank 0"):
        show_text(plans[1], trace=good)
    with pytest.raises(ZoError, match="has no meta.json"):
        show_text(plans[1], trace=tmp_path)


def test_not_simulated_ranks_are_reported(tmp_path):
    plan = tmp_path / "partial.json"
    write_plan(plan, layout=LAYOUTS[8], simulated_ranks=2)
    text = show_text(plan, ranks="0-3")
    assert "ranks 2-3 were not simulated" in text
    with pytest.raises(ZoError, match="holds no spans of these ranks"):
        show_text(plan, ranks="4-7")


# ---- compare --------------------------------------------------------------------------
def test_compare_plans_and_candidates(plans, tmp_path):
    con = console(160)
    compare_command(plans=[plans[1], plans[8]], console=con)
    text = con.export_text()
    assert "plan1.json" in text and "plan8.json" in text and "1.00x" in text
    con = console(120)
    compare_command(plans=[plans[8]], console=con)
    text = con.export_text()
    assert "ranked candidates" in text and "1.50x" in text and "1 layout(s) pruned" in text
    data = make_plan_data(layout=Layout())
    data["candidates"] = []
    lonely = tmp_path / "lonely.json"
    Plan.from_dict(data).save(lonely)
    with pytest.raises(ZoError, match="lists no candidates"):
        compare_command(plans=[lonely], console=console(80))


# ---- CLI ------------------------------------------------------------------------------
runner = CliRunner()


@pytest.mark.parametrize("args, expect", [
    (["models"], "opt-175b"),
    (["profiles"], "dgx-a100-80gb"),
])
def test_cli_listings(args, expect):
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert expect in result.output


def test_cli_show_and_compare(plans, tmp_path):
    out = tmp_path / "c.json"
    result = runner.invoke(app, ["show", str(plans[8]), "--width", "100", "--chrome", str(out)])
    assert result.exit_code == 0, result.output
    assert "critical" in result.output and f"wrote {out}" in result.output
    result = runner.invoke(app, ["compare", str(plans[1]), str(plans[8])])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("args, message", [
    (["show", "{plan4}", "--ranks", "5-9"], "--ranks 5-9: plan has ranks 0-3"),
    (["show", "{missing}"], "does not exist"),
    (["compare", "{plan4}", "{missing}"], "does not exist"),
])
def test_cli_failures_are_one_line_exit_2(tmp_path, args, message):
    plan4 = tmp_path / "p4.json"
    write_plan(plan4, layout=Layout(ddp=4))
    names = {"plan4": plan4, "missing": tmp_path / "nope.json"}
    result = runner.invoke(app, [a.format(**names) for a in args])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.output
