"""16-bit weights that still learn (docs/precision.md), in one process: stochastic
rounding is unbiased and addressed like z, plain rounding's lost share is measured, z on
CUDA is one draw per CUDA chunk, and a Llama block in bf16 keeps its rotary tables in fp32
as transformers does."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from zoexec.maths import zo
from zoexec.model.export import hf_tensors
from zoexec.model.families import TensorSpec, bind_block, make_specs
from zoexec.model.precision import LostUpdates
from zoexec.store.loading import build_parts
from zoplan.execrules import Z_CHUNK, Z_CHUNK_CUDA, chunk_bounds, z_chunk, z_draw_calls
from zoplan.models import get_model

HALF = [torch.bfloat16, torch.float16]


def _neighbours(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The 16-bit values just below and just above each fp32 value (float64)."""
    r = x.to(dtype)
    down = torch.where(r.double() > x.double(), torch.nextafter(r, torch.tensor(-math.inf, dtype=dtype)), r)
    up = torch.where(r.double() < x.double(), torch.nextafter(r, torch.tensor(math.inf, dtype=dtype)), r)
    return down.double(), up.double()


def _round(dtype, x, gen):
    out = torch.empty(x.numel(), dtype=dtype)
    zo.round_stochastic_(out, x.clone(), torch.empty(x.numel(), dtype=torch.int32), gen)
    return out


@pytest.mark.parametrize("dtype", HALF)
def test_stochastic_rounding_is_unbiased_and_picks_a_neighbour(dtype):
    """Each value lands on one of its two 16-bit neighbours; over many draws the mean
    is the exact value: every element within 5 standard errors of its Bernoulli draws,
    and the squared errors in standard units average about 1, as they do unbiased.
    bf16: every finite value (zeros and subnormals too); fp16: its normal range
    (|w| >= 2**-14; below, fp16's fixed 6e-8 spacing is rounded to nearest)."""
    x = torch.randn(2000, generator=torch.Generator().manual_seed(0)) * 0.02
    if dtype == torch.bfloat16:
        x[:4] = torch.tensor([0.0, -0.0, 3e-41, -2e-39])
    else:
        x = torch.copysign(x.abs().clamp_min(2.0**-14), x)
    down, up = _neighbours(x, dtype)
    gen = torch.Generator().manual_seed(1)
    draws = 400
    total = torch.zeros(x.numel(), dtype=torch.float64)
    for _ in range(draws):
        value = _round(dtype, x, gen).double()
        assert bool(((value == down) | (value == up)).all())
        total += value
    step = up - down
    p = torch.where(step > 0, (x.double() - down) / step.clamp_min(1e-300), 0.0)
    stderr = step * torch.sqrt(p * (1 - p) / draws)
    error = (total / draws - x.double()).abs()
    units = (error / stderr)[stderr > 0]
    assert float(units.max()) < 5
    assert 0.8 < float((units * units).mean()) < 1.2
    # round to nearest is off by a quarter of a step on average: the test tells them apart
    nearest = (x.to(dtype).double() - x.double()).abs()
    assert float(nearest.sum()) > 20 * float(error.sum() / math.sqrt(draws))


@pytest.mark.parametrize("dtype", HALF)
def test_representable_values_stay_put(dtype):
    exact = torch.tensor([0.0, 1.0, -0.5, 0.125, -2.0, 1024.0])
    out = _round(dtype, exact, torch.Generator().manual_seed(0))
    assert out.float().tolist() == exact.tolist()


def _block(numel: int = 5000) -> list[TensorSpec]:
    w = torch.empty(numel - 100, 1)
    return make_specs([("weight", w), ("bias", torch.empty(100))])


@pytest.mark.parametrize("dtype", HALF)
def test_update_summed_over_a_block_matches_the_intended_update(dtype):
    """The weight change of a block under a MeZO-sized update (lr 1e-6, |g| ~ 10) sums
    to the exact fp32 change within 4 sigma of the rounding's own variance (sigma from
    each element's two neighbours), over 20 step seeds; round to nearest loses it."""
    specs = _block()
    n = specs[-1].stop
    theta0 = (torch.randn(n, generator=torch.Generator().manual_seed(2)) * 0.02).to(dtype)
    z_scores, kept_plain = [], []
    for seed in range(20):
        z = zo.z_block(seed, 0, specs)
        exact = theta0.double() - 1e-6 * 10.0 * z.double()
        theta = theta0.clone()
        zo.apply_update_stochastic(theta, z, lr=1e-6, g=10.0, weight_decay=0.0, specs=specs,
                                   seed=seed, block=0)
        down, up = _neighbours(exact.float(), dtype)
        step = up - down
        p = torch.where(step > 0, (exact - down) / step.clamp_min(1e-300), 0.0)
        sigma = float(torch.sqrt((p * (1 - p) * step * step).sum()))
        change, intended = float((theta.double() - theta0.double()).sum()), float((exact - theta0.double()).sum())
        z_scores.append((change - intended) / sigma)
        plain = theta0.clone()
        zo.apply_update(plain, z.to(dtype), lr=1e-6, g=10.0, weight_decay=0.0,
                        decay_mask_or_specs=specs)
        kept_plain.append(float((plain != theta0).float().mean()))
    assert max(abs(s) for s in z_scores) < 4, z_scores
    assert abs(sum(z_scores) / len(z_scores)) < 4 / math.sqrt(len(z_scores)), z_scores
    if dtype == torch.bfloat16:
        assert max(kept_plain) < 0.2   # round to nearest keeps under 20% of the weights' moves


def test_stochastic_rounding_is_addressed_like_z():
    """Same (seed, block) -> same bits on every rank; another seed or block -> other
    bits; the chunking (zoplan.execrules.sr_chunk) follows z's chunks on the CPU."""
    specs = _block(3 * (1 << 20) + 7)
    n = specs[-1].stop
    theta0 = (torch.randn(n, generator=torch.Generator().manual_seed(3)) * 0.02).to(torch.bfloat16)
    z = zo.z_block(5, 1, specs)

    def run(seed, block, scratch=None):
        theta = theta0.clone()
        zo.apply_update_stochastic(theta, z, lr=1e-5, g=3.0, weight_decay=0.1, specs=specs,
                                   seed=seed, block=block, scratch=scratch)
        return theta
    first = run(5, 1)
    scratch = [torch.empty(1 << 20) for _ in range(3)]
    assert torch.equal(first, run(5, 1, scratch))
    assert not torch.equal(first, run(6, 1)) and not torch.equal(first, run(5, 2))
    assert len(chunk_bounds(specs[0].numel)) == 3


def test_weight_decay_alone_is_rounded_stochastically_too():
    """(1 - lr*wd) rounds to exactly 1 in 16 bits; stochastic rounding keeps its mean."""
    specs = _block()
    theta0 = torch.full((specs[-1].stop,), 0.5, dtype=torch.bfloat16)
    theta = theta0.clone()
    zo.apply_update_stochastic(theta, torch.zeros(specs[-1].stop), lr=1e-3, g=0.0,
                               weight_decay=1.0, specs=specs, seed=0, block=0)
    weight = theta[:specs[0].numel].double()
    assert float(weight.mean()) == pytest.approx(0.5 * (1 - 1e-3), rel=2e-4)
    assert torch.equal(theta[specs[1].offset:], theta0[specs[1].offset:])   # no decay on biases


def test_z_on_cuda_is_one_draw_per_cuda_chunk():
    """The CUDA rule, run on the CPU: a device of type cuda draws z in chunks of
    Z_CHUNK_CUDA (one seeded launch each, the tensor's chunk c seeded by
    mix_seed(seed, block, tensor, c)); the planner counts the same calls."""
    assert zo._chunk_of(torch.device("cuda")) == z_chunk("cuda") == Z_CHUNK_CUDA > Z_CHUNK
    assert zo._chunk_of("cpu") == Z_CHUNK
    specs = _block(Z_CHUNK_CUDA + 300)
    numels = [s.numel for s in specs]
    jobs = zo._chunk_jobs(9, 4, specs, chunk=z_chunk("cuda"))
    assert len(jobs) == z_draw_calls(numels, "cuda") == 3
    assert z_draw_calls(numels, "cpu") == 17 + 1
    z = zo.z_block(9, 4, specs, chunk=z_chunk("cuda"))
    for index, spec in enumerate(specs):
        for c, (lo, hi) in enumerate(chunk_bounds(spec.numel, Z_CHUNK_CUDA)):
            gen = torch.Generator().manual_seed(zo.mix_seed(9, 4, index, c))
            expect = torch.empty(hi - lo).normal_(generator=gen)
            assert torch.equal(z[spec.offset + lo:spec.offset + hi], expect), (index, c)
    cpu_chunk = torch.empty(Z_CHUNK).normal_(generator=torch.Generator().manual_seed(
        zo.mix_seed(9, 4, 0, 1)))   # the CPU's chunk 1 of tensor 0: not what CUDA draws there
    assert not torch.equal(z[Z_CHUNK:2 * Z_CHUNK], cpu_chunk)


def test_plain_rounding_measures_and_reports_the_lost_share(capsys):
    specs = _block()
    theta = (torch.randn(specs[-1].stop, generator=torch.Generator().manual_seed(4)) * 0.02)
    theta = theta.to(torch.bfloat16)
    z = zo.z_block(1, 0, specs).to(torch.bfloat16)
    check = LostUpdates(enabled=True, update="plain", lr=1e-6, dtype=torch.bfloat16)
    before = check.before(theta, 0)
    zo.apply_update(theta, z, lr=1e-6, g=10.0, weight_decay=0.0, decay_mask_or_specs=specs)
    check.after(theta, z, before, g=10.0)
    assert not check.result and not capsys.readouterr().err   # read after the step only
    check.settle()
    assert check.result["lost_share"] > 0.8
    share = check.result["lost_share"]
    assert f"lost {share:.0%} of the first update" in capsys.readouterr().err
    assert check.before(theta, 0) is None                  # measured once
    big = LostUpdates(enabled=True, update="plain", lr=1.0, dtype=torch.bfloat16, quiet=True)
    before = big.before(theta, 0)
    zo.apply_update(theta, z, lr=1.0, g=1.0, weight_decay=0.0, decay_mask_or_specs=specs)
    big.after(theta, z, before, g=1.0)
    big.settle()
    assert big.result["lost_share"] < 0.01


def test_llama_in_bf16_equals_transformers_own_bf16_forward():
    """Rotary frequencies stay fp32 when zoexec casts a Llama to bf16 (as transformers
    does when it builds one in bf16): the block-wise forward gives transformers' logits
    bit for bit, up to the model's last position."""
    spec = get_model("tiny-llama")
    parts, flats = build_parts(spec, seed=1, param_dtype="bf16", compute_dtype="bf16")
    assert parts.resident.model.rotary_emb.inv_freq.dtype == torch.float32
    config = dict(spec.hf_config)
    hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(config.pop("model_type"), **config),
                                          dtype=torch.bfloat16, attn_implementation="sdpa")
    missing, unexpected = hf.load_state_dict(dict(hf_tensors(parts, flats)), strict=False)
    assert not unexpected and all("rotary" in k for k in missing)
    hf.eval()
    ids = torch.randint(0, spec.vocab, (1, spec.max_positions), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        hidden, ctx = parts.embed(ids)
        for flat in flats:
            bind_block(parts, flat.clone())
            hidden = parts.block_forward(hidden, ctx)
        mine = parts.logits(hidden)
        theirs = hf(ids).logits
    assert torch.equal(mine, theirs)
