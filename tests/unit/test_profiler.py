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


def test_nccl_collectives_are_timed_from_the_last_arrival_after_the_device(monkeypatch):
    """NCCL ranks: a collective returns once queued, so collective_samples waits for the
    device (`sync`) before the end stamp, and exchanges the entry times on the device."""
    clock = FakeTime()
    monkeypatch.setattr(collectives, "time", clock)
    calls = []

    class FakeDist:
        class ReduceOp:
            MAX = "max"

        def barrier(self):
            calls.append("barrier")

        def get_rank(self):
            return 0

        def get_world_size(self):
            return 2

        def all_reduce(self, tensor, op=None):
            calls.append(("all_reduce", str(tensor.device)))
            tensor.fill_(tensor.item() + 0.004)   # the other rank entered 4 ms later

    def sync():
        calls.append("sync")
        clock.sleep(0.010)   # the queued collective runs on the device: 10 ms

    zeros = collectives.torch.zeros

    def on_device(*args, device="cpu", **kw):   # where the entry times would live
        calls.append(("zeros", device))
        return zeros(*args, **kw)
    monkeypatch.setattr(collectives.torch, "zeros", on_device)
    samples = collective_samples(lambda: calls.append("enqueue"), dist=FakeDist(), repeats=2,
                                 warmup=1, sync=sync, device="cuda:1")
    assert samples == [pytest.approx(0.006)] * 2   # 10 ms on the device, 4 ms of waiting
    assert calls[:6] == [("zeros", "cuda:1"), "barrier", "sync", "enqueue", "sync",
                         ("all_reduce", "cpu")]


def test_copy_rates_count_only_the_time_all_copies_ran():
    """Both directions of a GPU at once: H2D's 8 pieces end every 2 ms, D2H's every
    1 ms; D2H ends at 8 ms, so H2D's rate is its first 4 pieces over 8 ms (its pieces
    after D2H ended ran alone, faster)."""
    from zoexec.profiler.cuda import overlap_rates

    piece = 1_000_000
    h2d = [2.0 * (k + 1) for k in range(4)] + [8.0 + 1.0 * (k + 1) for k in range(4)]
    d2h = [1.0 * (k + 1) for k in range(8)]
    rates = overlap_rates(piece, [h2d, d2h])
    assert rates == [pytest.approx(4 * piece / 8e-3 / 1e9), pytest.approx(8 * piece / 8e-3 / 1e9)]
    assert overlap_rates(piece, [d2h]) == [pytest.approx(1.0)]   # alone: all of it


def test_forward_grids_time_each_gemm_precision_and_restore_tf32(monkeypatch):
    """bf16, fp32 with TF32 allowed and fp32 without, each on its own shapes; the TF32
    flag is what it was before."""
    import torch

    from zoexec.profiler import cuda

    seen = []

    def fake_grid(settings, *, dtype, device, sync, tick, shapes, precision):
        seen.append((precision, dtype, torch.backends.cuda.matmul.allow_tf32, len(shapes)))
        return [{"precision": precision}]
    monkeypatch.setattr(cuda, "forward_grid", fake_grid)
    before = torch.backends.cuda.matmul.allow_tf32
    settings = Settings(repeats=3, quick=False, ranks=1, cores=2, device="cuda")
    points = cuda._forward_grids(settings, tick=lambda m: None)
    assert [p["precision"] for p in points] == ["bf16", "tf32", "fp32"]
    assert [s[:3] for s in seen] == [("bf16", "bf16", False), ("tf32", "fp32", True),
                                     ("fp32", "fp32", False)]
    assert seen[0][3] == 15 and seen[1][3] == seen[2][3] == 5
    assert torch.backends.cuda.matmul.allow_tf32 == before


def test_gpu_zo_costs_give_what_the_gpu_fits_take(monkeypatch):
    """gpu_zo_costs (here on the CPU, tiny blocks) times z draws of few large and many
    small tensors with zoexec's z_block, and the passes with 16-bit and fp32 stores; the
    planner's fits take them as they are."""
    from zoexec.profiler.blocks import gpu_zo_costs
    from zoplan.profiling.fits import fit_gpu_z, hbm_from_passes

    monkeypatch.setattr(Settings, "z_gpu_blocks", property(lambda self: [(2, 1 << 16),
                                                                          (64, 64)]))
    settings = Settings(repeats=2, quick=True, ranks=1, cores=2, device="cuda")
    zo = gpu_zo_costs(settings, device="cpu", sync=None, dtype="bf16")
    assert [(d["tensors"], d["launches"], d["elems"]) for d in zo["z_draws"]] == [
        (2, 2, 1 << 17), (64, 64, 64 * 64)]
    assert [p["param_dtype"] for p in zo["passes"]] == ["bf16", "fp32"]
    assert zo["passes"][0]["elems"] == 1 << 17
    assert fit_gpu_z(zo["z_draws"])["z_launch_us"] >= 0
    assert hbm_from_passes(zo["passes"])["hbm_gbps"] > 0
