"""zoexec.profiler, in one process: the timing helpers, the forward grid's warm visits,
collectives timed from the last arrival, and the samples' settings (the multi-rank
measuring run is in tests/integration/test_loop_e2e.py)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from zoexec.profiler import blocks as profiler_blocks
from zoexec.profiler import collectives, timing
from zoexec.profiler.blocks import WARM_VISIT_BELOW_S, forward_grid
from zoexec.profiler.budget import FIRST_ROUND_SHARE, MIN_PASSES, STAGE_WEIGHTS, Budget
from zoexec.profiler.collectives import collective_samples
from zoexec.profiler.probe import SPEED_CHECKS
from zoexec.profiler.settings import Settings
from zoexec.profiler.timing import summarize
from zoplan.cli import app
from zoplan.execrules import SPEED_CHECK_KINDS
from zoplan.profiling.build import disturbance_line


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
                                          (["--repeats", "0"], "repeats must be >= 1, got 0"),
                                          (["--time-budget", "0"], "--time-budget must be a "
                                           "number of seconds > 0, got 0"),
                                          (["--time-budget", "nan"], "--time-budget must be a "
                                           "number of seconds > 0, got nan")])
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


# ---- the time budget -------------------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def test_the_budget_runs_later_rounds_only_while_they_fit():
    """The first round always runs (its allowance FIRST_ROUND_SHARE of the budget, split
    over the stages by their weights); a later one only when the time left holds
    another round as long as the last (the loaded machine of the issue: rounds of 50 s
    in a 120 s budget give 2, not 3)."""
    clock = Clock()
    budget = Budget(seconds=120.0, device="cpu", rounds_planned=3, clock=clock)
    assert budget.next_round() and budget.allowance == pytest.approx(120 * FIRST_ROUND_SHARE)
    weights = dict(STAGE_WEIGHTS["cpu"])
    assert budget.stage("copies") == pytest.approx(50.0 + budget.allowance * weights["copies"])
    assert budget.stage("ranks") == pytest.approx(50.0 + budget.allowance)
    clock.now += 50.0
    budget.end_round()
    assert budget.next_round()                      # 70 s left hold another 50 s round
    assert budget.allowance == pytest.approx(70.0 / 2)
    clock.now += 50.0
    assert not budget.next_round()                  # 20 s left: no third round
    assert budget.rounds_done == 2
    quiet = Budget(seconds=120.0, rounds_planned=3, clock=Clock())
    for _ in range(3):
        assert quiet.next_round()
        quiet.clock.now += 30.0
    assert not quiet.next_round() and quiet.rounds_done == 3   # all planned rounds, no more


def test_the_eta_counts_the_rounds_that_fit():
    """Early in the first round the ETA is what its allowance leaves (not the pace of its
    first small stage: the demo under load printed ETA 8m43s); from half its weight on,
    the pace; after it, the rounds that fit at the first round's length."""
    clock = Clock()
    budget = Budget(seconds=120.0, rounds_planned=3, clock=clock)
    budget.next_round()
    budget.stage("forwards")
    clock.now += 4.0                                 # copies (weight 0.05) took 4 s
    assert budget.eta_s() == pytest.approx(budget.allowance - 4.0)
    budget.stage("zo")                               # copies and forwards: half the weight
    clock.now += 26.0                                # 30 s for 0.5: 30 s more at that pace,
    assert budget.eta_s() == pytest.approx(36.0)     # but the allowance runs 36 s more
    budget.stage("done")                             # a 30 s round: two more fit
    assert budget.eta_s() == pytest.approx(60.0)
    clock.now += 36.0                                # a 66 s round: none fits the 54 s left
    assert budget.eta_s() == 0.0
    short = Budget(seconds=120.0, rounds_planned=3, clock=Clock())
    short.next_round()
    short.clock.now += 30.0
    short.next_round()                               # rounds of 30 s: two more fit
    assert short.eta_s() == pytest.approx(60.0)
    short.clock.now += 10.0
    assert short.eta_s() == pytest.approx(50.0)


def test_disturbed_samples_are_retaken_until_the_deadline_then_kept_and_counted(monkeypatch):
    clock = FakeTime()
    monkeypatch.setattr(timing, "time", clock)

    class Busy(timing.Guard):
        def clean(self, mark, wall_s):   # every sample disturbed (a busy machine)
            return False

    guard = Busy(retries=8, deadline=clock.now + 10 * timing.BACKOFF_S + 0.05)
    job = lambda: clock.sleep(0.01)  # noqa: E731
    out = timing.time_samples(job, repeats=5, guard=guard)
    assert len(out) == 5
    # retaken while before the deadline (each retake sleeps BACKOFF_S), then kept
    assert guard.rejected == 10 and guard.disturbed_kept == 5 and guard.samples == 5
    free = Busy(retries=8)                           # no deadline: the old bound, 8 x repeats
    timing.time_samples(job, repeats=2, guard=free)
    assert free.rejected == 16 and free.disturbed_kept == 2


def test_a_late_forward_grid_stops_after_min_passes(monkeypatch):
    clock = FakeTime()
    monkeypatch.setattr(timing, "time", clock)

    class Block:
        def embed(self, ids):
            return None, None

        def block_forward(self, hidden, ctx):
            clock.sleep(0.1)

    monkeypatch.setattr(profiler_blocks, "build_block", lambda hidden, seq, **kw: Block())
    monkeypatch.setattr(Settings, "forward_grid", property(lambda self: [("opt", 128, 1, 32)]))
    settings = Settings(repeats=5, quick=False, ranks=1, cores=2)
    guard = timing.Guard(deadline=clock.now)         # already late
    monkeypatch.setattr(timing, "ACTIVE_GUARD", [guard])
    monkeypatch.setattr(profiler_blocks, "ACTIVE_GUARD", [guard])
    points = forward_grid(settings, dtype="fp32", device="cpu")
    assert len(points[0]["samples_s"]) == MIN_PASSES and guard.cut == ["forwards fp32"]
    guard.deadline = None                            # in time: every pass
    assert len(forward_grid(settings, dtype="fp32", device="cpu")[0]["samples_s"]) == 5


@pytest.mark.parametrize("budget,expect", [
    (dict(time_budget_s=120, elapsed_s=95, rounds=2, rounds_planned=3, samples=400, retaken=0,
          disturbed_kept=0, cut=[]),
     "1m35s of a 2m00s budget, 2 of 3 rounds; no sample disturbed by other processes"),
    (dict(time_budget_s=120, elapsed_s=131, rounds=1, rounds_planned=3, samples=300,
          retaken=100, disturbed_kept=140, cut=["forwards fp32"]),
     "2m11s, 11s over its 2m00s budget (the first round's least work), 1 of 3 rounds; other "
     "processes used 96% of the CPUs and disturbed 60% of 400 samples (100 retaken, 140 kept "
     "disturbed; cut short: forwards fp32): the figures are slower and noisier than this "
     "machine's own: re-measure when it is quiet"),
])
def test_the_disturbance_in_one_line(budget, expect):
    assert disturbance_line(budget, 96.0) == expect


class OneRank:
    """torch.distributed as one rank sees it alone (barriers and all-reduces do nothing)."""

    @staticmethod
    def barrier():
        pass

    @staticmethod
    def all_reduce(tensor, op=None):
        pass

    @staticmethod
    def get_rank():
        return 0


def test_late_ranks_keep_fewer_pairs_and_keep_disturbed_samples():
    from zoexec.profiler import cpu

    settings = Settings(repeats=5, quick=False, ranks=2, cores=2)
    calls = []
    out = cpu._paired(lambda: calls.append(1), OneRank, settings, 1, late=lambda: True)
    assert len(out["together"]["samples_s"]) == cpu.PAIRS_LATE
    out = cpu._paired(lambda: None, OneRank, settings, 1)
    assert len(out["together"]["samples_s"]) == max(settings.repeats, cpu.PAIRS_MIN)

    class Busy(timing.Guard):
        def clean(self, mark, wall_s):
            return False

    late = Busy(retries=8, deadline=0.0)
    assert len(timing.rank_samples(lambda: None, repeats=3, dist=OneRank, guard=late)) == 3
    assert (late.rejected, late.disturbed_kept) == (0, 3)
