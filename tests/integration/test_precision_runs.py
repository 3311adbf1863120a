"""16-bit weights that still learn, in real runs on the CPU (docs/precision.md):
- every update mode keeps the layout invariance of the fp32 tests: 1 rank, PertP 2,
  DDP 2 and 2 x 2, sliced and unsliced, give the 1-rank run's losses and weights (bit
  for bit without DDP). With DDP each shard runs its bf16 GEMMs over fewer rows, which
  rounds differently (losses within 1e-3 relative, measured 7e-5), so g moves by up to
  a few percent (it divides the loss difference by 2 eps): each step's rounding of a
  weight may go the other way, so a weight may differ by one 16-bit step per step
  plus the update's own difference, lr x |dg| x |z| per step (3 steps x 1e-5 x 0.2 x 5
  = 3e-5). How many weights differ grows with the g differences: a rounding goes the
  other way with probability about lr x |dg| x |z| / (16-bit step) per weight and step
  (1e-5 x 0.1 x 0.8 / 1.2e-4 = 0.7%), so at most 5% of the 16-bit weights may differ
  (measured 1.7-3.5%); rounding noise that depended on the layout would change about
  half of them;
- "master": at least 99% of the fp32 master weights change every step, and final/
  holds the fp32 masters;
- "stochastic": over 200 steps the loss tracks an fp32 run's (tolerance below), while
  "plain" rounding falls behind at the same lr.
"""

from __future__ import annotations

import json
import statistics
import uuid

import pytest
import torch
from safetensors.torch import load_file

from zoexec.config import RunConfig
from zoexec.launch.spawn import run_in_process, spawn_local
from zoplan.handplan import hand_plan
from zoplan.layout import Layout
from zoplan.workload import Workload

MODES = {"master": ("fp32", "bf16"), "stochastic": ("bf16", "bf16"), "plain": ("bf16", "bf16")}
LAYOUTS = {"1": Layout(), "pertp2": Layout(pertp=2), "ddp2": Layout(ddp=2),
           "ddp2-s2": Layout(ddp=2, slices=2), "2x2-s4": Layout(pertp=2, ddp=2, slices=4)}
SEED, STEPS, LR, EPS = 5, 3, 1e-5, 1e-3


def _workload(update: str, *, batch: int = 4, seq: int = 16) -> Workload:
    param, compute = MODES[update]
    return Workload(batch=batch, seq=seq, param_dtype=param, compute_dtype=compute, update=update)


def _config(tmp, name: str, layout: Layout, workload: Workload, *, model="tiny-opt", **kw):
    plan = hand_plan(model=model, layout=layout, workload=workload)
    args = {"plan": plan.data, "plan_path": f"{name}.json", "seed": SEED, "eps": EPS,
            "threads": 1, "quiet": True, "out": str(tmp / name),
            "run_id": f"t{uuid.uuid4().hex[:10]}", "steps": STEPS, "lr": LR}
    return RunConfig.make(**{**args, **kw})


def _final(tmp, name: str) -> dict:
    return load_file(str(tmp / name / "final" / "model.safetensors"))


def _losses(tmp, name: str) -> list[tuple]:
    lines = (tmp / name / "losses.jsonl").read_text().splitlines()
    return [(r["loss_plus"], r["loss_minus"], r["g"]) for r in map(json.loads, lines)]


@pytest.fixture(scope="module")
def layout_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("precision-layouts")
    for update in MODES:
        for name, layout in LAYOUTS.items():
            cfg = _config(tmp, f"{update}-{name}", layout, _workload(update))
            # one rank runs in this process (as `zoexec run` does), the others spawn
            run_in_process(cfg) if layout.world_size == 1 else spawn_local(cfg)
    return tmp


@pytest.mark.parametrize("update", list(MODES))
@pytest.mark.parametrize("name", [n for n in LAYOUTS if n != "1"])
def test_every_update_mode_keeps_the_layout_invariance(layout_runs, update, name):
    ref_losses, losses = _losses(layout_runs, f"{update}-1"), _losses(layout_runs, f"{update}-{name}")
    ref, got = _final(layout_runs, f"{update}-1"), _final(layout_runs, f"{update}-{name}")
    assert ref.keys() == got.keys()
    stored = torch.float32 if update == "master" else torch.bfloat16
    assert {t.dtype for t in got.values()} == {stored}
    if LAYOUTS[name].ddp == 1:
        assert losses == ref_losses
        for key in ref:
            assert torch.equal(ref[key], got[key]), key
        return
    for a, b in zip(ref_losses, losses, strict=True):
        assert a[:2] == pytest.approx(b[:2], rel=1e-3)
        assert a[2] == pytest.approx(b[2], rel=5e-2, abs=0.2)
    differing = 0
    for key in ref:
        a, b = ref[key].double(), got[key].double()
        if update == "master":
            torch.testing.assert_close(a, b, rtol=0, atol=1e-5, msg=key)
            continue
        differ = a != b
        differing += int(differ.sum())
        step = (torch.nextafter(ref[key], torch.full_like(ref[key], torch.inf)).double() - a).abs()
        assert bool(((a - b).abs() <= 1.01 * STEPS * step + 3e-5)[differ].all()), key
    assert differing <= 0.05 * sum(t.numel() for t in ref.values())


@pytest.mark.parametrize("model", ["tiny-opt", "tiny-llama"])
def test_master_weights_change_every_step_and_final_holds_them(tmp_path, model):
    """fp32 masters with bf16 compute at a MeZO learning rate (1e-6): one 3-step run
    snapshotting every step: its weights after s and s + 1 steps (snapshots/checkpoint-1,
    -2, then final/) differ by one update, which moves at least 99% of the weights; the
    snapshots and final/ hold fp32 tensors."""
    run_in_process(_config(tmp_path, model, Layout(), _workload("master"), model=model,
                           steps=3, lr=1e-6, save_every="1", keep=3))
    snapshots = tmp_path / model / "snapshots"
    finals = [load_file(str(snapshots / f"checkpoint-{s}" / "model.safetensors"))
              for s in (1, 2)] + [_final(tmp_path, model)]
    assert all(t.dtype == torch.float32 for f in finals for t in f.values())
    for before, after in zip(finals, finals[1:]):
        moved = sum(int((before[k] != after[k]).sum()) for k in before)
        total = sum(t.numel() for t in before.values())
        assert moved >= 0.99 * total, (moved, total)


def test_stochastic_rounding_tracks_an_fp32_run_and_plain_falls_behind(tmp_path):
    """200 steps of tiny-opt at lr 3e-6 on the built-in task, same seeds and batches:
    with bf16 storage and stochastic rounding, the loss stays within 0.003 of the fp32
    run's at every step (measured 0.0019 at seed 5; seeds 1, 2, 3: 0.0020-0.0031, the
    bf16 rounding of the initial weights) and its loss drop (first 20 steps' mean - last
    20 steps') is within 25% of the fp32 run's (measured 1.01; seeds 1-3: 1.01-1.07);
    plain round-to-nearest at the same lr drops less than 85% as much (0.53; 0.65-0.75).
    The forwards compute in fp32: the claim is about the bf16 storage and the update's
    rounding, and bf16 matmuls on a CPU took two thirds of the test's time (the bf16
    compute path: test_every_update_mode_keeps_the_layout_invariance). Not shortened: at
    120 steps, seq 16 (seeds 1, 2, 3, 5) the stochastic run's drop was 0.72-1.06 of the
    fp32 run's and plain's 0.40-0.75, and the loss gap reached 0.0033; a shorter run does
    not separate the two at these bounds."""
    losses = {}
    for update, (param, compute) in (("master", ("fp32", "fp32")),
                                     ("stochastic", ("bf16", "fp32")),
                                     ("plain", ("bf16", "fp32"))):
        workload = Workload(batch=4, seq=32, param_dtype=param, compute_dtype=compute,
                            update=update)
        records = run_in_process(_config(tmp_path, update, Layout(), workload, steps=200,
                                         lr=3e-6, out=None))
        losses[update] = [r.loss for r in records]

    def drop(curve):
        return statistics.mean(curve[:20]) - statistics.mean(curve[-20:])
    fp32, sr, plain = losses["master"], losses["stochastic"], losses["plain"]
    assert drop(fp32) > 0.01          # the task is learned visibly in 200 steps
    assert max(abs(a - b) for a, b in zip(fp32, sr)) < 0.003
    assert drop(sr) == pytest.approx(drop(fp32), rel=0.25)
    assert drop(plain) < 0.85 * drop(fp32)
