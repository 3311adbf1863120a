"""zoexec.profiler, in one process: the timing helpers, the forward grid's warm visits,
collectives timed from the last arrival, and the samples' settings (the multi-rank
measuring run is in tests/integration/test_loop_e2e.py)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from zoexec.profiler import blocks as profiler_blocks
from zoexec.profiler import collectives, timing
from zoexec.profiler.blocks import WARM_VISIT_BELOW_S, forward_grid
from zoexec.profiler.collectives import collective_samples
from zoexec.profiler.probe import SPEED_CHECKS
from zoexec.profiler.settings import Settings
from zoexec.profiler.timing import summarize
from zoplan.cli import app
from zoplan.execrules import SPEED_CHECK_KINDS


def test_settings_travel_as_plain_data():
    """The planner side reads the settings from the samples, never from this class."""
    settings = Settings(repeats=3, quick=True, ranks=2, cores=2)
    data = settings.to_dict()
    assert data["gather_sizes"] == settings.gather_sizes
    assert data["forward_grid"] == [list(s) for s in settings.forward_grid]
    assert data["zo_hidden"] == 256 and data["rounds"] == 1
    assert tuple(SPEED_CHECKS) == SPEED_CHECK_KINDS


def test_summarize_has_median_and_iqr():
    s = summarize([3.0, 1.0, 2.0, 4.0, 100.0])
    assert s["median_s"] == 3.0 and s["iqr_s"] == [2.0, 4.0]
    assert s["samples_s"] == [3.0, 1.0, 2.0, 4.0, 100.0]


class FakeTime:
    """Stands for the `time` module of the code under test: a clock that moves only
    when that code sleeps, so timings carry none of the machine's noise."""

    def __init__(self) -> None:
        self.now = 100.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_forward_grid_warms_short_shapes_before_each_sample(monkeypatch):
    """A shape under WARM_VISIT_BELOW_S is called once untimed before each timed call
    (right after a larger shape it would run cold); a longer one is timed directly."""
    clock = FakeTime()
    monkeypatch.setattr(timing, "time", clock)
    calls = {"short": 0, "long": 0}

    class Block:
        def __init__(self, name, seconds):
            self.name, self.seconds = name, seconds

        def embed(self, ids):
            return None, None

        def block_forward(self, hidden, ctx):
            calls[self.name] += 1
            clock.sleep(self.seconds)

    blocks = {128: Block("short", 0.001), 256: Block("long", WARM_VISIT_BELOW_S * 1.2)}
    monkeypatch.setattr(profiler_blocks, "build_block", lambda hidden, seq, **kw: blocks[hidden])
    monkeypatch.setattr(Settings, "forward_grid",
                        property(lambda self: [("opt", 128, 1, 32), ("opt", 256, 1, 32)]))
    settings = Settings(repeats=3, quick=True, ranks=1, cores=2)
    points = forward_grid(settings, dtype="fp32", device="cpu")
    assert [p["samples_s"] for p in points] == [[0.001] * 3, [WARM_VISIT_BELOW_S * 1.2] * 3]
    assert calls == {"short": 1 + 2 * 3, "long": 1 + 3}


@pytest.mark.parametrize("args,message", [(["--ranks", "0"], "--ranks must be >= 1, got 0"),
                                          (["--repeats", "0"], "repeats must be >= 1, got 0")])
def test_profile_refuses_bad_settings_in_one_line(tmp_path, args, message):
    out = tmp_path / "p.json"
    result = CliRunner().invoke(app, ["profile", "--cpu", "--quick", *args, "-o", str(out)])
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [f"error: {message}"]
    assert not out.exists()


def test_collectives_are_timed_from_the_last_arrival(monkeypatch):
    """collective_samples counts a collective from the moment the last rank entered it
    (the others' earlier time there is waiting, as zoplan calibrate counts it)."""
    clock = FakeTime()
    monkeypatch.setattr(collectives, "time", clock)

    class FakeDist:
        class ReduceOp:
            MAX = "max"

        def barrier(self):
            pass

        def get_rank(self):
            return 1

        def get_world_size(self):
            return 2

        def all_reduce(self, tensor, op=None):
            assert op == "max"
            tensor.fill_(tensor.item() + 0.010)   # the other rank entered 10 ms later

    samples = collective_samples(lambda: clock.sleep(0.015), dist=FakeDist(), repeats=4,
                                 warmup=1)
    assert samples == [pytest.approx(0.005)] * 4   # 15 ms in it, 10 ms of them waiting
