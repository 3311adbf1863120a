"""The counter-based z and the fused pass: the Triton kernel (zoexec.maths.fused, run by
Triton's interpreter on the CPU) gives bit for bit what the plain torch implementation
of the same maths (zoexec.maths.counter) gives, on whole blocks and on 2, 3 and 8
slices, bf16 and fp16, with and without weight decay; a slice holds exactly the whole
block's bits; the stochastic rounding is unbiased; the Gaussian is a standard normal's
moments. Kept cheap: the interpreter runs a program (a few hundred numpy operations)
in about 0.2-0.4 s, so each piece of a range is one program."""

from __future__ import annotations

import math
import os

os.environ.setdefault("TRITON_INTERPRET", "1")   # before triton is imported

import pytest  # noqa: E402
import torch  # noqa: E402

from zoexec.maths import counter as cm  # noqa: E402
from zoexec.maths.counter import Perturb, Term, counter_pass, philox  # noqa: E402
from zoexec.model.families import TensorSpec  # noqa: E402

try:
    import triton  # noqa: F401
except ImportError:   # the `test` extra pins it: a venv without it skips the kernel's half
    fused = None
else:
    from zoexec.maths import fused

needs_triton = pytest.mark.skipif(fused is None, reason="triton is not installed (pip install "
                                  "'.[test]' pins it): the fused kernel cannot be interpreted")
ONE_PROGRAM = 1024      # elements per program: every piece of the block below is one
SPECS = [TensorSpec(name="w", shape=(701,), numel=701, offset=0, decay=True),
         TensorSpec(name="b", shape=(299,), numel=299, offset=701, decay=False)]
TOTAL = 1000
BLOCK = 3


def _slices(count: int) -> list[tuple[int, int]]:
    """The block's ranges of `count` slices as the engine cuts them (64-aligned starts)."""
    size = math.ceil(TOTAL / count / 64) * 64
    return [(i * size, min(TOTAL, (i + 1) * size)) for i in range(count) if i * size < TOTAL]


def _theta(dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(5)
    return (torch.randn(TOTAL, generator=gen) * 0.02).to(dtype)


def _terms(decay: bool) -> list[Term]:
    return [Term.of(seed=101, lr=1e-3, g=2.5, weight_decay=0.1 if decay else 0.0)]


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and torch.equal(a.view(torch.int16 if a.element_size() == 2
                                                      else torch.int32),
                                              b.view(torch.int16 if b.element_size() == 2
                                                     else torch.int32))


def _whole(dtype, decay, run=counter_pass, **kw):
    theta, work = _theta(dtype), torch.empty(TOTAL, dtype=dtype)
    run(theta, specs=SPECS, block=BLOCK, terms=_terms(decay),
        perturb=Perturb(seed=202, scale=1e-3, out=work), **kw)
    return theta, work


def _sliced(dtype, decay, count, run=counter_pass, **kw):
    theta = _theta(dtype)
    for lo, hi in _slices(count):
        run(theta[lo:hi], specs=SPECS, block=BLOCK, terms=_terms(decay), start=lo, **kw)
    return theta


# ---- the torch implementation: its own properties (fast) ----------------------------------
def test_philox_is_random123s_philox4x32_10():
    words = philox(torch.zeros(1, dtype=torch.int64), (0, 0))
    assert [int(w) for w in words] == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("decay", [False, True])
@pytest.mark.parametrize("count", [2, 3, 8])
def test_a_slice_gets_the_whole_blocks_bits(dtype, decay, count):
    whole = _theta(dtype)
    counter_pass(whole, specs=SPECS, block=BLOCK, terms=_terms(decay))
    assert len(_slices(count)) == count
    assert _same(_sliced(dtype, decay, count), whole)
    assert not _same(whole, _theta(dtype))                  # it moved


def test_the_gaussian_has_a_standard_normals_moments_and_is_box_muller_to_1e_6():
    index = torch.arange(1 << 16, dtype=torch.int64)
    w = philox(index, cm.counter_key(9, 0, 0))
    z = cm.gaussian(w[0], w[1]).double()
    n = z.numel()
    assert abs(z.mean()) < 5 / math.sqrt(n)
    assert abs(z.var() - 1) < 5 * math.sqrt(2 / n)
    assert abs((z ** 4).mean() - 3) < 5 * math.sqrt(96 / n)
    assert abs((z ** 3).mean()) < 5 * math.sqrt(15 / n)
    assert z.abs().max() <= math.sqrt(48 * math.log(2))
    # the same uniforms through fp64's own log, sqrt and cos
    u = ((w[0] >> 9) * 2 + 1).double() * 2.0 ** -24
    angle = ((w[1] >> 30).double() + (((w[1] >> 7) & 0x7FFFFF) * 2 + 1).double() * 2.0 ** -24)
    exact = torch.sqrt(-2 * torch.log(u)) * torch.cos(angle * math.pi / 2)
    assert (z - exact).abs().max() < 1e-6


def test_the_square_root_is_correctly_rounded():
    x = torch.rand(1 << 16, generator=torch.Generator().manual_seed(1)) * 40
    exact = torch.sqrt(x.double())
    got = cm.sqrt_rn(x).double()
    for other in (torch.nextafter(got.float(), torch.full_like(x, math.inf)).double(),
                  torch.nextafter(got.float(), torch.zeros_like(x)).double()):
        assert bool(((got - exact).abs() <= (other - exact).abs()).all())


def _rounding_bias(dtype, run, **kw) -> float:
    """Mean of (|stored| - |exact|) / ulp over 8192 weights of one exact fp32 fraction
    of their ulp (0.7 above the lower neighbour: round to nearest moves each 0.3 up),
    signs and powers of two mixed; unbiased: 0 within 5 standard errors."""
    n, ulp_bits = 8192, 8 if dtype == torch.bfloat16 else 11
    powers = 2.0 ** (torch.arange(n) % 8 - 4).double()
    theta = (powers * torch.where(torch.arange(n) % 2 == 0, 1.0, -1.0)).to(dtype)
    spec = [TensorSpec(name="w", shape=(n,), numel=n, offset=0, decay=True)]
    shrink = cm.f32(1.0 - 0.3 * 2.0 ** -ulp_bits)
    run(theta, specs=spec, block=0, terms=[Term(seed=7, alpha=0.0, shrink=shrink)], **kw)
    exact = powers * shrink                                        # exact in fp64
    ulp = powers * 2.0 ** -ulp_bits                                # below each power
    d = (theta.double().abs() - exact) / ulp
    return float(d.mean()) / (5 * 0.5 / math.sqrt(n))            # in units of the bound


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_stochastic_rounding_is_unbiased(dtype):
    assert abs(_rounding_bias(dtype, counter_pass)) < 1


def test_a_zero_update_leaves_16_bit_weights_alone_and_nearest_rounds_to_nearest():
    theta = _theta(torch.bfloat16)
    counter_pass(theta, specs=SPECS, block=BLOCK, terms=[Term(seed=1, alpha=0.0)])
    assert _same(theta, _theta(torch.bfloat16))
    x = torch.randn(4096, generator=torch.Generator().manual_seed(2))
    for dtype in (torch.bfloat16, torch.float16):
        assert _same(cm.round_store(x, dtype, kind="nearest"), x.to(dtype))


# ---- the kernel against it, bit for bit (the interpreter) ----------------------------------
@needs_triton
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("decay", [False, True])
def test_the_kernel_gives_the_torch_bits_on_a_whole_block(dtype, decay):
    theta, work = _whole(dtype, decay)
    k_theta, k_work = _whole(dtype, decay, fused.fused_pass, block_elems=ONE_PROGRAM)
    assert _same(k_theta, theta) and _same(k_work, work)


@needs_triton
@pytest.mark.parametrize(("dtype", "decay", "count"), [(torch.bfloat16, True, 8),
                                                       (torch.float16, False, 3),
                                                       (torch.float16, True, 2)])
def test_the_kernel_gives_the_whole_blocks_bits_on_slices(dtype, decay, count):
    whole = _theta(dtype)
    counter_pass(whole, specs=SPECS, block=BLOCK, terms=_terms(decay))
    assert _same(_sliced(dtype, decay, count, fused.fused_pass, block_elems=ONE_PROGRAM), whole)


@needs_triton
def test_the_kernel_applies_several_terms_in_order_and_fp32_weights():
    terms = [*_terms(True), Term.of(seed=303, lr=1e-3, g=-1.5, weight_decay=0.0)]
    out = []
    for run, kw in ((counter_pass, {}), (fused.fused_pass, {"block_elems": ONE_PROGRAM})):
        theta, work = _theta(torch.float32), torch.empty(TOTAL, dtype=torch.bfloat16)
        run(theta, specs=SPECS, block=BLOCK, terms=terms,
            perturb=Perturb(seed=9, scale=-1e-3, out=work), **kw)
        out.append((theta, work))
    assert _same(out[0][0], out[1][0]) and _same(out[0][1], out[1][1])


@needs_triton
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_kernels_stochastic_rounding_is_unbiased(dtype):
    assert abs(_rounding_bias(dtype, fused.fused_pass, block_elems=8192)) < 1


# ---- which path a run takes, and what run.json says of it ---------------------------------
def test_auto_takes_fused_only_where_it_runs_and_says_why_it_fell_back():
    from zoexec.maths.paths import choose
    from zoplan.errors import ZoError

    cpu = "the fused kernel runs on CUDA GPUs, this rank's device is cpu"
    assert choose("auto", fused_problem=cpu, estimator="mezo", tuning="full") == ("torch", None)
    assert choose("auto", fused_problem=None, estimator="mezo", tuning="full") == ("fused", None)
    # a plan that priced the torch path runs it (the measured step is the predicted one)
    assert choose("auto", fused_problem=None, estimator="mezo", tuning="full",
                  planned="torch") == ("torch", None)
    assert choose("fused", fused_problem=None, estimator="mezo", tuning="full",
                  planned="torch") == ("fused", None)
    path, why = choose("auto", fused_problem=None, estimator="lowrank", tuning="full")
    assert path == "torch" and "lowrank" in why
    assert choose("counter", fused_problem=cpu, estimator="mezo", tuning="full")[0] == "counter"
    for named, estimator, tuning, words in (("fused", "mezo", "full", "runs on CUDA"),
                                            ("counter", "sparse", "full", "sparse"),
                                            ("fused", "mezo", "lora", "lora")):
        with pytest.raises(ZoError, match=words):
            choose(named, fused_problem=cpu if tuning == "full" else None,
                   estimator=estimator, tuning=tuning)


def test_a_resume_on_another_path_or_before_the_option_is_judged_by_the_recorded_path():
    from zoexec.run.verify import z_problem

    cpu = {"device_kind": "cpu", "torch": "2.13.0"}
    fused_run = {**cpu, "zo_kernel": "fused", "triton": "3.6.0"}
    problem = z_problem([{**cpu, "zo_kernel": "torch"}], recorded=fused_run, resumed=True,
                        local_ranks=1)
    assert problem and "--zo-kernel fused" in problem and "\n" not in problem
    # run.json written before --zo-kernel: its runs drew z with torch
    assert z_problem([{**cpu, "zo_kernel": "torch"}], recorded=cpu, resumed=True,
                     local_ranks=1) is None
    assert "--zo-kernel torch" in z_problem([{**cpu, "zo_kernel": "counter"}], recorded=cpu,
                                            resumed=True, local_ranks=1)
    mixed = z_problem([{**cpu, "zo_kernel": "torch"}, {**cpu, "zo_kernel": "counter"}],
                      recorded=None, resumed=False, local_ranks=2)
    assert mixed and "different --zo-kernel paths" in mixed


def test_the_device_module_says_where_the_fused_kernel_cannot_run(monkeypatch):
    import shutil

    from zoexec.runtime.device import fused_zo_problem

    assert "this rank's device is cpu" in fused_zo_problem(torch.device("cpu"))
    if fused is None:
        assert "triton is not importable" in fused_zo_problem(torch.device("cuda", 0))
        return
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert "no C compiler" in fused_zo_problem(torch.device("cuda", 0))
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    assert fused_zo_problem(torch.device("cuda", 0)) is None


def test_pending_updates_become_terms_in_order_with_weight_decay_once_an_update():
    from zoexec.maths.estimators import direction_seed
    from zoexec.maths.history import Update

    two = Update(step=3, seed=44, g=1.5, lr=1e-3, gs=(1.0, 2.0))
    terms = cm.terms_of([Update(step=2, seed=33, g=0.5, lr=1e-3), two,
                         Update(step=4, seed=55, g=1.0, lr=0.0)], weight_decay=0.1)
    assert [t.seed for t in terms] == [33, direction_seed(44, 0), direction_seed(44, 1)]
    assert [t.decays for t in terms] == [True, True, False]
    assert terms[1].alpha == cm.f32(-1e-3 * 0.5) and terms[2].alpha == cm.f32(-1e-3 * 1.0)
