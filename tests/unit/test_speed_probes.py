"""The machine's speed through a traced CPU run (zoexec.train.speed.SpeedMonitor) and a
profile (zoexec.profiler.probe: SpeedProbe, merge_probes): probes between steps, so that
`zoplan calibrate` knows the speed of the whole run, not only of its two ends."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from zoexec.profiler.probe import SPEED_CHECKS, SpeedProbe, merge_probes
from zoexec.train import speed
from zoplan.execrules import probe_every


def test_probe_every_follows_the_plans_step():
    assert probe_every(0.1) == 30           # a probe about every 3 s
    assert probe_every(0.25) == 12
    assert probe_every(10.0) == 1           # long steps: a probe after each
    assert probe_every(0.0) == 1


def test_monitor_probes_between_steps_on_rank_0(monkeypatch):
    monkeypatch.setattr(speed.zgroups, "host_barrier", lambda env: None)
    env = SimpleNamespace(rank=0)
    monitor = speed.SpeedMonitor(env=env, threads=1, every=3, probe=SpeedProbe())
    steps = 10
    monitor.check()
    for done in range(1, steps + 1):
        monitor.after_step(done, steps)
    monitor.check()
    meta = monitor.meta()
    assert len(meta["speed_check"]) == 2
    assert [p["after_step"] for p in meta["speed_probes"]] == [2, 5, 8]   # never after the last
    for probe in meta["speed_probes"]:
        assert all(probe[name] > 0 for name in SPEED_CHECKS)
    # other ranks only wait at the barriers; CUDA runs and untraced runs do nothing
    other = speed.SpeedMonitor(env=SimpleNamespace(rank=1), threads=1, every=3)
    other.check()
    other.after_step(3, steps)
    assert other.meta() == {"speed_check": [], "speed_probes": []}
    idle = speed.SpeedMonitor(env=env, threads=1)
    idle.check()
    idle.after_step(3, steps)
    assert idle.meta() == {}


def test_merge_probes_takes_the_median_of_check_and_probes():
    check = {"threads": 2, **{n: {**shape, "median_s": 1.0} for n, shape in SPEED_CHECKS.items()}}
    probes = [{n: v for n in SPEED_CHECKS} for v in (2.0, 3.0, 4.0, 5.0)]
    merged = merge_probes(check, probes)
    assert merged["probes"] == 4 and merged["threads"] == 2
    assert all(merged[n]["median_s"] == pytest.approx(3.0) for n in SPEED_CHECKS)
    assert check["gemm"]["median_s"] == 1.0                  # the input is left alone
    assert merged["gemm"]["hidden"] == SPEED_CHECKS["gemm"]["hidden"]
