"""The MeZO and ZO2 baseline runners (zoexec.baselines) on a tiny model on the CPU:
MeZO's update of one tensor equals the update computed by hand from its definition;
ZO2 (blocks on the host, the update deferred, the dual forward) gives MeZO's losses
and weights bit for bit for the same seeds; `zoexec baseline` prints what it timed."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from zoexec.baselines.common import BaselineConfig
from zoexec.baselines.mezo import run_mezo
from zoexec.baselines.zo2 import run_zo2
from zoexec.cli import app
from zoexec.store.loading import build_parts
from zoplan.models import get_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """tiny-opt with two blocks (a config.json)."""
    path = tmp_path_factory.mktemp("model") / "config.json"
    path.write_text(json.dumps({**get_model("tiny-opt").hf_config, "num_hidden_layers": 2}))
    return str(path)


def _cfg(model, **kw):
    base = dict(model=model, batch=2, seq=16, steps=2, dtype="fp32", lr=1e-3, eps=1e-3,
                weight_decay=0.1, seed=5)
    return BaselineConfig(**{**base, **kw})


def test_mezo_updates_a_tensor_as_its_definition_says(tiny):
    """One step; block 1's first matrix by hand: z is the draw of torch.normal that
    falls to it when a generator seeded with the step seed draws every tensor in z
    order; +eps z, -2 eps z, +eps z, then theta - lr (g z + wd theta)."""
    cfg = _cfg(tiny, steps=1)
    parts, flats = build_parts(tiny, param_dtype="fp32", compute_dtype="fp32", seed=cfg.seed,
                               attn_implementation="eager")
    result, held = run_mezo(cfg)
    theta0 = flats[1][:parts.block_specs[0].numel].view(parts.block_specs[0].shape).clone()
    from zoexec.maths import zo

    gen = torch.Generator().manual_seed(zo.step_seed(cfg.seed, 0))
    before = [t for t, _ in held.embed] + [t for _, f in enumerate(flats) for t in
                                           [f[s.offset:s.stop].view(s.shape) for s in parts.block_specs]]
    index = len(held.embed) + len(parts.block_specs)      # block 1, tensor 0
    for shape in [tuple(t.shape) for t in before[:index]]:
        torch.normal(0.0, 1.0, size=shape, generator=gen)
    z = torch.normal(0.0, 1.0, size=tuple(theta0.shape), generator=gen)
    eps, lr, wd, g = cfg.eps, cfg.lr, cfg.weight_decay, result.records[0].g
    theta = theta0 + 1.0 * z * eps
    theta = theta + -2.0 * z * eps
    theta = theta + 1.0 * z * eps
    theta = theta - lr * (g * z + wd * theta)
    got = held.flats[1][:theta0.numel()].view(theta0.shape)
    assert torch.equal(got, theta)
    assert not torch.equal(got, theta0)


def test_zo2_equals_mezo_bit_for_bit(tiny):
    """Same seeds and batches: the same losses each step and, after ZO2's flush, the
    same weights (a tied head untied in both, as ZO2 runs)."""
    cfg = _cfg(tiny, steps=3, untie_head=True)
    mezo, m_held = run_mezo(cfg)
    zo2, z_held = run_zo2(cfg)
    assert [(r.loss_plus, r.loss_minus) for r in mezo.records] == \
        [(r.loss_plus, r.loss_minus) for r in zo2.records]
    for a, b in zip(m_held.flats, z_held.flats, strict=True):
        assert torch.equal(a, b)
    for (a, _), (b, _) in zip(m_held.embed + m_held.head, z_held.embed + z_held.head, strict=True):
        assert torch.equal(a, b)
    assert set(zo2.kind_s) >= {"h2d", "update", "forward", "d2h", "embed", "head"}


def test_zoexec_baseline_prints_its_step_and_refuses_bad_input(tiny, tmp_path):
    runner = CliRunner()
    out = tmp_path / "zo2.json"
    done = runner.invoke(app, ["baseline", "zo2", "--model", tiny, "--batch", "2", "--seq", "8",
                               "--steps", "2", "--json", "-o", str(out)])
    assert done.exit_code == 0, done.output
    summary = json.loads(done.output)
    assert summary["baseline"] == "zo2" and summary["step_s_median"] > 0
    assert summary["host_memory"] == "pageable" and json.loads(out.read_text()) == summary
    bad = runner.invoke(app, ["baseline", "mezo", "--model", tiny, "--steps", "0"])
    assert bad.exit_code == 2 and "--steps must be >= 1" in bad.output, bad.output
    bad = runner.invoke(app, ["baseline", "mezo", "--model", tiny, "-o", str(tmp_path / "no" / "x")])
    assert bad.exit_code == 2 and "does not exist" in bad.output, bad.output
