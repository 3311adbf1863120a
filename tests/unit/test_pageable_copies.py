"""Copies as they behave (issue 39): raw pageable copies, what a baseline's code does
with memory that is not page-locked, reproduce the H200's pass-2 figures (one direction
alone, and both queued at once, which ran one after the other), and no baseline that
copies pageable memory is priced with its two directions overlapping."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zoplan.hardware import HardwareProfile, load_profile
from zoplan.models import get_model
from zoplan.pricing.baselines import copy_period, distzo2_step, zo2_step
from zoplan.pricing.copies import pageable_copies_s, staging_s

REPO = Path(__file__).resolve().parents[2]
PASS2 = REPO / "benchmarks" / "results" / "h200-2026-12-04" / "pass2" / "summary.json"
SIZE = 256 << 20   # the overlap stage's copies (scripts/gpu_stages.py copies)


def _measured() -> dict:
    return json.loads(PASS2.read_text())["stages"]["overlap"]


def test_the_copy_model_reproduces_the_h200s_pageable_copies():
    h200, m = load_profile("hgx-h200"), _measured()
    h2d = SIZE / pageable_copies_s(h200, SIZE, 0) / 1e9
    d2h = SIZE / pageable_copies_s(h200, 0, SIZE) / 1e9
    both = 2 * SIZE / pageable_copies_s(h200, SIZE, SIZE) / 1e9
    assert h2d == pytest.approx(m["pageable_h2d_gbps"], rel=0.10)
    assert d2h == pytest.approx(m["pageable_d2h_gbps"], rel=0.10)
    assert both == pytest.approx(m["pageable_duplex_both_gbps"], rel=0.10)
    # pinned copies overlap: both ways at once near twice one way (not pageable's fate)
    assert m["pinned_duplex_both_gbps"] > 1.8 * m["pinned_h2d_gbps"]


@pytest.mark.parametrize("model", ["opt-1.3b", "opt-13b"])
def test_raw_pageable_baselines_never_overlap_their_two_directions(model):
    """ZO2 and DistZO2 with pageable blocks (pinned False): the host's period holds the
    upload and the offload one after the other, each at its pageable rate, beside its
    issue; a pinned ZO2's directions overlap (its period is shorter)."""
    h200, spec = load_profile("hgx-h200"), get_model(model)
    block = spec.block_params * 2
    serial = block / (6.908e9) + block / (13.82e9)
    zo2 = zo2_step(spec, h200, batch=8, seq=512, dtype="bf16", pinned=False)
    assert zo2.parts["period_s"] >= zo2.parts["issue_s"] + serial * (1 - 1e-9)
    pinned = zo2_step(spec, h200, batch=8, seq=512, dtype="bf16")
    assert pinned.parts["period_s"] < zo2.parts["period_s"]
    upload, host = copy_period(h200, block, 0.0, pinned=False)
    assert host == pytest.approx(serial) and upload == pytest.approx(block / 6.908e9)
    dist = distzo2_step(spec, h200, batch=8, seq=512, pertp=2, ddp=4, slices=8,
                        dtype="bf16", pinned=False)
    piece = block / 8
    assert dist.parts["period_s"] >= piece / 6.908e9 + piece / 13.82e9


def test_zoexecs_staging_ring_copies_at_pinned_rates_beside_the_host():
    """zoexec's answer to pageable memory (a ring of pinned slots the rank's thread
    fills): its host time per copy is one direction's pageable copy, the DMA runs at
    the pinned rate beside it; a page-locked store costs the host nothing."""
    data = json.loads(load_profile("hgx-h200").to_json())
    data["pcie"]["pinned"] = False
    pageable = HardwareProfile.from_dict(data)
    block = get_model("opt-1.3b").block_params * 2
    assert staging_s(pageable, block, "h2d") == pytest.approx(block / 6.908e9)
    assert staging_s(pageable, block, "d2h") == pytest.approx(block / 13.82e9)
    assert staging_s(load_profile("hgx-h200"), block, "h2d") == 0.0
