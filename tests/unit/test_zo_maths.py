"""zoexec.maths.zo (seeded z, perturb, update, projected gradient) and the ZO2 schedule's
equivalence with plain MeZO (zoexec.reference)."""

import pytest
import torch

from zoexec.maths import zo
from zoexec.model.export import hf_tensors
from zoexec.model.families import TensorSpec, build_hf_model, make_specs
from zoexec.reference import mezo_reference_train, zo2_reference_train
from zoexec.store.loading import build_parts

SPECS = make_specs([("w", torch.empty(6, 5)), ("b", torch.empty(5)), ("v", torch.empty(3, 7))])


def test_seeds_are_stable_golden_values():
    assert zo.mix_seed(1, 2, 3) == 4761168037262833853
    assert zo.step_seed(0, 1) == 385835944731417634
    assert len({zo.step_seed(base, step) for base in range(3) for step in range(50)}) == 150
    assert all(0 <= zo.mix_seed(s, -1, 0, 0) < 2**63 for s in range(20))


def test_z_golden_values():
    """Changing the z scheme silently would break replaying (seed, g) logs."""
    z = zo.z_tensor(zo.step_seed(0, 0), 0, 0, (20,))
    torch.testing.assert_close(z[:4], torch.tensor([-0.5529102, -0.2836668, -0.8138662, -0.4184191]))


def test_z_deterministic_and_depends_on_seed_block_tensor():
    z = zo.z_block(11, 2, SPECS)
    assert z.shape == (SPECS[-1].stop,) and z.dtype == torch.float32
    assert torch.equal(z, zo.z_block(11, 2, SPECS))
    assert not torch.equal(z, zo.z_block(12, 2, SPECS))
    assert not torch.equal(z, zo.z_block(11, 3, SPECS))
    assert not torch.equal(z, zo.z_block(11, zo.RESIDENT_BLOCK, SPECS))
    first, third = z[SPECS[0].offset:SPECS[0].stop], z[SPECS[2].offset:SPECS[2].stop]
    assert not torch.equal(first[:21], third[:21])


def test_z_of_a_tensor_does_not_depend_on_slicing_or_threads(monkeypatch):
    monkeypatch.setattr(zo, "Z_CHUNK", 8)               # several chunks per tensor
    z = zo.z_block(5, 1, SPECS, num_threads=1)
    assert torch.equal(z, zo.z_block(5, 1, SPECS, num_threads=3))
    for index, spec in enumerate(SPECS):
        alone = zo.z_tensor(5, 1, index, spec.shape)
        assert torch.equal(z[spec.offset:spec.stop].view(spec.shape), alone)
    # the same tensors placed elsewhere in a bigger buffer get the same z
    shifted = [TensorSpec(name=s.name, shape=s.shape, numel=s.numel, offset=s.offset + 100,
                          decay=s.decay) for s in SPECS]
    out = torch.zeros(200)
    zo.z_block(5, 1, shifted, out=out)
    assert torch.equal(out[100:100 + z.numel()], z) and out[:100].eq(0).all()


def test_perturb_into_out_of_place():
    theta, z = torch.randn(40), torch.randn(40)
    out = torch.empty(40)
    zo.perturb_into(out, theta, z, -0.5)
    torch.testing.assert_close(out, theta - 0.5 * z)
    half = torch.empty(40, dtype=torch.bfloat16)
    zo.perturb_into(half, theta, z, 0.25)
    torch.testing.assert_close(half, (theta + 0.25 * z).bfloat16())


def test_apply_update_formula_and_no_decay_tensors():
    theta = torch.randn(SPECS[-1].stop)
    z = zo.z_block(3, 0, SPECS)
    lr, g, wd = 0.1, 2.0, 0.5
    mask = torch.zeros_like(theta, dtype=torch.bool)
    for spec in SPECS:
        mask[spec.offset:spec.stop] = spec.decay
    expected = theta - lr * (g * z + wd * torch.where(mask, theta, 0.0))
    for decay in (SPECS, mask):
        got = zo.apply_update(theta.clone(), z, lr=lr, g=g, weight_decay=wd, decay_mask_or_specs=decay)
        torch.testing.assert_close(got, expected)
    only_wd = zo.apply_update(theta.clone(), z, lr=lr, g=0.0, weight_decay=wd,
                              decay_mask_or_specs=SPECS)
    bias = SPECS[1]
    assert torch.equal(only_wd[bias.offset:bias.stop], theta[bias.offset:bias.stop])
    assert not torch.equal(only_wd[:bias.offset], theta[:bias.offset])
    whole = zo.apply_update(theta.clone(), z, lr=lr, g=g, weight_decay=wd, decay_mask_or_specs=False)
    torch.testing.assert_close(whole, theta - lr * g * z)


def test_projected_grad_sign():
    assert zo.projected_grad(2.0, 1.0, 1e-3) == pytest.approx(500.0)
    assert zo.projected_grad(1.0, 2.0, 1e-3) < 0
    assert zo.projected_grad(1.5, 1.5, 1e-3) == 0.0


@pytest.mark.parametrize("name", ["tiny-opt", "tiny-llama"])
def test_deferred_update_schedule_equals_plain_mezo(name):
    """ZO2 order (update of t-1 applied when the block is next used, out-of-place
    perturbation, final flush) == MeZO-SGD (in place +eps, -2eps, +eps, update).
    Tolerances (fp32): losses rtol 1e-5; g atol 1e-2 (a loss difference divided by
    2*eps = 2e-3 amplifies rounding ~500x); weights atol 1e-4 against moves of ~1e-2."""
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 512, (4, 16), generator=gen) for _ in range(4)]
    kw = dict(seed=9, lr=1e-3, eps=1e-3, weight_decay=0.1, steps=4)
    parts, flats = build_parts(name, seed=1)
    got = zo2_reference_train(parts, flats, batches, **kw)
    model = build_hf_model(name, seed=1)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    want = mezo_reference_train(model, batches, **kw)
    for (lp, lm, g), (rp, rm, rg) in zip(got, want):
        assert lp == pytest.approx(rp, rel=1e-5) and lm == pytest.approx(rm, rel=1e-5)
        assert g == pytest.approx(rg, abs=1e-2)
    ref = model.state_dict()
    mine = dict(hf_tensors(parts, flats))
    moved = max((ref[k] - start[k]).abs().max().item() for k in mine)
    assert moved > 1e-3
    for key, tensor in mine.items():
        torch.testing.assert_close(tensor, ref[key], rtol=0, atol=1e-4, msg=key)


def test_planner_z_makespan_is_z_blocks_busiest_thread(monkeypatch):
    """zoplan.execrules.z_makespan (what the planner prices) = the largest share
    zo.z_block hands one thread."""
    from zoplan.execrules import z_makespan

    monkeypatch.setattr(zo, "Z_CHUNK", 8)
    import zoplan.execrules as threads
    monkeypatch.setattr(threads, "Z_CHUNK", 8)
    sizes = [s.numel for s in SPECS]
    jobs = zo._chunk_jobs(3, 0, SPECS)
    for count in (1, 2, 3, 5):
        groups = zo._balance(jobs, count)
        loads = [sum(stop - start for _, start, stop in g) for g in groups]
        assert z_makespan(sizes, count) == (max(loads), len(groups[loads.index(max(loads))]))
    assert z_makespan(sizes, 1)[0] == sum(sizes)


# ---- z and the updates over a flat range (the update on the slice) ---------------------------
RANGE_SPECS = make_specs([("w", torch.empty(30, 100)), ("b", torch.empty(100)),
                          ("v", torch.empty(27, 111)), ("n", torch.empty(7))])


def _ranges(total: int, count: int, *, align: int = 1, seed: int = 0) -> list[tuple[int, int]]:
    """Random [start, stop) ranges of a block of `total` elements (starts on `align`),
    plus ones that cut a tensor, cut a chunk, sit inside one chunk, or are empty."""
    gen = torch.Generator().manual_seed(seed)
    out = [(0, total), (0, 0), (1000, 1000), (2999, 3101), (1500, 1600), (3100, total)]
    for _ in range(count):
        start = int(torch.randint(0, total // align, (1,), generator=gen)) * align
        stop = min(total, start + int(torch.randint(1, 4000, (1,), generator=gen)))
        out.append((start, stop))
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_z_range_is_z_blocks_slice(monkeypatch, dtype):
    """z_range(start, stop) == z_block[start:stop] for ranges that cut tensors and chunks
    (chunks of 1000 here), drawn by one or three threads, or through a given scratch."""
    monkeypatch.setattr(zo, "Z_CHUNK", 1000)
    total = RANGE_SPECS[-1].stop
    whole = zo.z_block(5, 2, RANGE_SPECS, out=torch.empty(total, dtype=dtype))
    scratch = torch.empty(1000, dtype=dtype)
    for start, stop in _ranges(total, 60):
        for threads in (1, 3):
            got = zo.z_range(5, 2, RANGE_SPECS, start, stop, dtype=dtype, num_threads=threads)
            assert got.dtype == dtype and torch.equal(got, whole[start:stop]), (start, stop)
        got = zo.z_range(5, 2, RANGE_SPECS, start, stop,
                         out=torch.empty(stop - start, dtype=dtype), scratch=scratch)
        assert torch.equal(got, whole[start:stop]), (start, stop)


def test_z_range_draws_only_the_chunks_it_touches(monkeypatch):
    """The CUDA rule counted on the CPU: z is drawn in chunks of Z_CHUNK_CUDA (2**24; 700
    here) of each tensor, seeded (seed, block, tensor, chunk) as on the CPU; a range draws
    exactly the chunks zoplan.execrules.z_range_draws prices, at most one chunk more than
    the range at each end; a whole block takes z_draw_calls(.., "cuda") draws."""
    import zoplan.execrules as rules

    assert zo._chunk_of("cuda") == rules.z_chunk("cuda") == rules.Z_CHUNK_CUDA == 1 << 24
    assert zo._chunk_of("cpu") == rules.z_chunk("cpu") == rules.Z_CHUNK
    monkeypatch.setattr(zo, "Z_CHUNK_CUDA", 700)
    monkeypatch.setattr(rules, "Z_CHUNK_CUDA", 700)
    chunk = zo._chunk_of("cuda")
    numels = [s.numel for s in RANGE_SPECS]
    drawn: list[int] = []
    real = torch.Tensor.normal_

    def counting(self, *args, **kw):
        drawn.append(self.numel())
        return real(self, *args, **kw)

    monkeypatch.setattr(torch.Tensor, "normal_", counting)
    whole = zo.z_block(3, 1, RANGE_SPECS, chunk=chunk)
    assert len(drawn) == rules.z_draw_calls(numels, "cuda") == 5 + 1 + 5 + 1
    gen = torch.Generator().manual_seed(zo.mix_seed(3, 1, 2, 1))   # tensor v, chunk 1
    v = RANGE_SPECS[2]
    assert torch.equal(whole[v.offset + 700:v.offset + 1400], real(torch.empty(700), generator=gen))
    for start, stop in _ranges(whole.numel(), 40, seed=1):
        drawn.clear()
        got = zo.z_range(3, 1, RANGE_SPECS, start, stop, chunk=chunk)
        assert torch.equal(got, whole[start:stop]), (start, stop)
        assert sorted(drawn) == sorted(rules.z_range_draws(numels, start, stop, "cuda")), \
            (start, stop)
        assert sum(drawn) <= stop - start + 2 * 700


def _update_both(theta0, z, start, stop, **kw):
    """(the whole block's update [start:stop], the update of the range alone)."""
    whole = zo.apply_update(theta0.clone(), z, **kw)
    part = zo.apply_update(theta0[start:stop].clone(), z[start:stop], start=start, **kw)
    return whole[start:stop], part


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_apply_update_on_a_range_is_the_whole_updates_range(dtype):
    """theta, z and decay over the range [start, stop) of a block (64-aligned starts, as
    slices have, and stops there or at the block's end) give bit for bit that range of the whole block's update; 16-bit weights
    of 300k elements on two threads, where one torch add over a range and one over the
    block would compute different elements in scalar code."""
    specs = make_specs([("w", torch.empty(300, 1000)), ("b", torch.empty(1001)),
                        ("v", torch.empty(270, 1111))])
    total = specs[-1].stop
    theta0 = (torch.randn(total, generator=torch.Generator().manual_seed(1)) * 0.02).to(dtype)
    z = zo.z_block(4, 0, specs).to(dtype)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for start, stop in _ranges(total, 30, align=64, seed=2) + [(64 * 4700, total)]:
            start, stop = start - start % 64, min(total, -(-stop // 64) * 64)   # as slices
            whole, part = _update_both(theta0, z, start, stop, lr=0.37, g=1.3,
                                       weight_decay=0.2, decay_mask_or_specs=specs)
            assert torch.equal(whole, part), (start, stop, int((whole != part).sum()))
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_stochastic_update_on_a_range_rounds_as_the_whole_block(monkeypatch, dtype):
    """The rounding noise of a chunk the range cuts is drawn whole and cut, so the range's
    weights get the whole block's bits (chunks of 1000 here), with or without scratch."""
    monkeypatch.setattr(zo, "sr_chunk", lambda kind: 1000)
    total = RANGE_SPECS[-1].stop
    theta0 = (torch.randn(total, generator=torch.Generator().manual_seed(3)) * 0.02).to(dtype)
    z = zo.z_block(6, 1, RANGE_SPECS).to(dtype)
    kw = dict(lr=1e-3, g=1.3, weight_decay=0.2, specs=RANGE_SPECS, seed=6, block=1)
    whole = zo.apply_update_stochastic(theta0.clone(), z, **kw)
    assert (whole != theta0).float().mean() > 0.2
    scratch = [torch.empty(1000) for _ in range(2)]
    for start, stop in _ranges(total, 60, seed=4):
        part = zo.apply_update_stochastic(theta0[start:stop].clone(), z[start:stop],
                                          start=start, scratch=scratch, **kw)
        assert torch.equal(part, whole[start:stop]), (start, stop)
