"""The estimators' directions (zoexec.maths.estimators, zoplan.estimators): each one's
d is its definition (the plain one of zoexec.reference), a flat range of a block gets
exactly the whole block's bits (the update on the slice), lowrank keeps V for its
period and nothing else, sparse perturbs the smallest magnitudes, and the settings are
checked where they are declared."""

from __future__ import annotations

import pytest
import torch

from zoexec.maths.estimators import Directions, direction_seed, lowrank_factors, v_seed
from zoexec.maths.history import StepRecord, Update
from zoexec.maths.zo import z_block
from zoexec.model.families import make_specs
from zoexec.reference import plain_direction
from zoplan.estimators import EstimatorSpec, direction_parts
from zoplan.workload import Workload

SHAPES = [("w1", (37, 29)), ("b1", (29,)), ("w2", (64, 50)), ("norm", (50,)), ("w3", (3, 5, 7))]
SPECS = make_specs([(name, torch.empty(shape)) for name, shape in SHAPES])
NUMEL = SPECS[-1].stop
LOWRANK = EstimatorSpec(estimator="lowrank", lowrank_rank=3, lowrank_every=4)
SPARSE = EstimatorSpec(estimator="sparse", sparse_share=0.3)


def _dirs(spec: EstimatorSpec, *, chunk: int | None = None) -> Directions:
    dirs = Directions(spec, run_seed=7, device="cpu")
    if chunk:
        dirs.chunk = chunk    # small tiles: ranges cut them
    return dirs


def _theta() -> torch.Tensor:
    return torch.randn(NUMEL, generator=torch.Generator().manual_seed(5))


@pytest.mark.parametrize("spec", [EstimatorSpec(), LOWRANK, SPARSE], ids=lambda s: s.estimator)
def test_a_blocks_direction_is_its_plain_definition(spec):
    theta = _theta()
    got = _dirs(spec).fill(torch.empty(NUMEL), seed=11, step=5, block=2, specs=SPECS, theta=theta)
    want = plain_direction(spec, run_seed=7, seed=11, step=5, block=2, specs=SPECS, theta=theta)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("spec", [LOWRANK, SPARSE], ids=lambda s: s.estimator)
@pytest.mark.parametrize("chunk", [None, 40])
def test_a_range_gets_the_whole_blocks_bits(spec, chunk):
    """Ranges that cut tensors, tiles (chunk 40: a tile of one or two rows) and z chunks:
    bit for bit the whole block's d there (sparse: after the whole block's draw, whose
    thresholds the range uses)."""
    theta = _theta()
    whole = _dirs(spec, chunk=chunk).fill(torch.empty(NUMEL), seed=3, step=9, block=0,
                                          specs=SPECS, theta=theta)
    dirs = _dirs(spec, chunk=chunk)
    dirs.fill(torch.empty(NUMEL), seed=3, step=9, block=0, specs=SPECS, theta=theta)
    for start, stop in [(0, 64), (64, 1500), (1000, 4321), (1152, NUMEL), (37 * 29, 37 * 29 + 29)]:
        part = dirs.fill(torch.full((stop - start,), 9.0), seed=3, step=9, block=0, specs=SPECS,
                         theta=theta[start:stop], start=start)
        assert torch.equal(part, whole[start:stop]), (start, stop)


def test_a_sparse_range_without_the_whole_blocks_thresholds_is_refused():
    with pytest.raises(AssertionError, match="no sparse thresholds of step 9, block 0"):
        _dirs(SPARSE).fill(torch.empty(64), seed=3, step=9, block=0, specs=SPECS,
                           theta=_theta()[:64], start=0)


def test_lowrank_is_low_rank_keeps_v_for_its_period_and_z_on_vectors():
    dirs = _dirs(LOWRANK)
    d = {step: dirs.fill(torch.empty(NUMEL), seed=direction_seed(100 + step, 0), step=step,
                         block=1, specs=SPECS) for step in (4, 7, 8)}
    w2 = SPECS[2]
    mats = {step: x[w2.offset:w2.stop].view(64, 50) for step, x in d.items()}
    for m in mats.values():
        assert torch.linalg.matrix_rank(m) == 3
    # steps 4 and 7 share V (period 1): their column spaces of the transpose agree
    _, v4 = lowrank_factors(104, v_seed(7, 4, 4), 1, 2, (64, 50), 3)
    _, v7 = lowrank_factors(107, v_seed(7, 7, 4), 1, 2, (64, 50), 3)
    _, v8 = lowrank_factors(108, v_seed(7, 8, 4), 1, 2, (64, 50), 3)
    assert torch.equal(v4, v7) and not torch.equal(v4, v8)
    both = torch.cat([mats[4], mats[7]]).T    # rows of both lie in span(V)
    assert torch.linalg.matrix_rank(both) == 3
    assert torch.linalg.matrix_rank(torch.cat([mats[7], mats[8]]).T) == 6
    # vectors: MeZO's z, the same seeds
    z = z_block(104, 1, SPECS)
    b1 = SPECS[1]
    assert torch.equal(d[4][b1.offset:b1.stop], z[b1.offset:b1.stop])
    # unit variance entries: d = U V^T / sqrt(r)
    assert 0.7 < float(mats[4].std()) < 1.3


def test_sparse_perturbs_the_smallest_magnitudes_of_each_tensor():
    theta = _theta()
    d = _dirs(SPARSE).fill(torch.empty(NUMEL), seed=3, step=0, block=0, specs=SPECS, theta=theta)
    for t in SPECS:
        on = d[t.offset:t.stop] != 0
        mags = theta[t.offset:t.stop].abs()
        assert mags[on].max() <= mags[~on].min(), t.name
        assert 0.15 < float(on.float().mean()) < 0.45, (t.name, float(on.float().mean()))


def test_direction_seeds_and_parts():
    assert direction_seed(42, 0) == 42 and len({direction_seed(42, j) for j in range(8)}) == 8
    # the parts of every shard tile the global batch, each direction's rows in order
    for q, shards in [(1, 1), (2, 1), (2, 2), (4, 2), (2, 4), (3, 2)]:
        rows = []
        for s in range(shards):
            rows += [(j, s * 12 // shards + lo, s * 12 // shards + hi)
                     for j, lo, hi in direction_parts(examples=12, directions=q, data_shard=s,
                                                      num_shards=shards)]
        covered = [(j, r) for j, lo, hi in rows for r in range(lo, hi)]
        assert covered == [(r * q // 12, r) for r in range(12)], (q, shards)
    with pytest.raises(ValueError, match=r"global batch \(12\) is not divisible by the directions \(5\)"):
        direction_parts(examples=12, directions=5, data_shard=0, num_shards=1)


def test_an_update_of_several_directions_and_its_log_line():
    record = StepRecord(step=3, seed=9, loss_plus=1.0, loss_minus=0.5, g=1.5, lr=0.1,
                        gs=(1.0, 2.0))
    assert record.update.terms == ((0, 0.5), (1, 1.0))
    assert Update(step=3, seed=9, g=2.0, lr=0.1).terms == ((0, 2.0),)
    line = record.to_dict()
    assert line["gs"] == [1.0, 2.0] and StepRecord.from_dict(line) == record
    assert "gs" not in StepRecord(step=0, seed=1, loss_plus=1, loss_minus=1, g=0.0).to_dict()
    nan = StepRecord(step=3, seed=9, loss_plus=1.0, loss_minus=0.5, g=1.5, gs=(1.0, float("nan")))
    assert nan.update is None and nan.to_dict()["nonfinite"] is True


@pytest.mark.parametrize("kw, message", [
    (dict(estimator="adam"), "estimator must be one of mezo, lowrank, sparse, got 'adam'"),
    (dict(estimator="lowrank", lowrank_rank=0), "lowrank_rank must be a whole number >= 1"),
    (dict(estimator="lowrank", lowrank_every=1.5), "lowrank_every must be a whole number >= 1"),
    (dict(estimator="sparse", sparse_share=0.0), r"sparse_share must be a number in \(0, 1\]"),
    (dict(estimator="mezo", lowrank_rank=4), "lowrank_rank: not a setting of estimator 'mezo'"),
    (dict(estimator="sparse", directions=2), "directions 2 with estimator 'sparse'"),
    (dict(directions=65), "directions must be a whole number >= 1 and <= 64"),
])
def test_bad_estimator_settings_name_the_field(kw, message):
    with pytest.raises(ValueError, match=message):
        EstimatorSpec(**kw)


def test_the_workload_writes_estimator_keys_only_when_not_mezo():
    plain = Workload(batch=4, seq=8, param_dtype="fp32", compute_dtype="fp32")
    assert "estimator" not in plain.to_dict() and "directions" not in plain.to_dict()
    low = Workload(batch=4, seq=8, param_dtype="fp32", compute_dtype="fp32", estimator="lowrank",
                   lowrank_rank=4, directions=2)
    assert {k: v for k, v in low.to_dict().items() if k in ("estimator", "lowrank_rank",
            "lowrank_every", "sparse_share", "directions")} == {
        "estimator": "lowrank", "lowrank_rank": 4, "lowrank_every": 50, "directions": 2}
    assert Workload.from_dict(low.to_dict()) == low
    with pytest.raises(ValueError, match=r"batch \(6\) must be divisible by directions \(4\)"):
        Workload(batch=6, seq=8, directions=4)
