"""The fused pass (`--zo-kernel fused`): zoexec.maths.counter's maths as one Triton kernel
launch per range (a block or a slice of it) and update term. A launch reads theta once,
regenerates z (and the rounding's noise) from the counter in registers, applies the
term with its rounding, writes theta, and with the last term also writes the next
perturbation: no z buffer, no scratch. Each element finds its tensor in the block's
table (spec_table: the tensors' offsets and decay, on the device once per layout) and
computes its tensor's key from the (seed, block) hash chain. zoexec.maths.counter says what is computed; this module only how,
in the same order of operations (tests/unit/test_fused_zo.py: bit for bit the same
under TRITON_INTERPRET=1).

Only Triton APIs present in 3.6 (the GPU image's) and 3.9 (the CPU tests'): tl.load,
tl.store, tl.arange, tl.program_id, tl.static_range, tl.where, tl.full, tl.umulhi,
tl.sqrt_rn, tl.div_rn, .to() with bitcast. Imported only where the fused path runs
(zoexec.train.engine) or is tested: triton is the `cuda` extra's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import triton
import triton.language as tl

from zoexec.maths import counter as cm
from zoexec.maths import zo
from zoexec.maths.counter import Perturb, Term

BLOCK = 1024   # elements a program computes

_SQRT2 = tl.constexpr(cm.SQRT2)
_LN2_HI = tl.constexpr(cm.LN2_HI)
_LN2_LO = tl.constexpr(cm.LN2_LO)
_HALF_PI = tl.constexpr(cm.HALF_PI)
_TWO_M24 = tl.constexpr(cm.TWO_M24)
_L0, _L1, _L2, _L3, _L4 = (tl.constexpr(c) for c in cm.LOG_C)
_C0, _C1, _C2, _C3, _C4, _C5 = (tl.constexpr(c) for c in cm.COS_C)
_S0, _S1, _S2, _S3, _S4, _S5 = (tl.constexpr(c) for c in cm.SIN_C)
# the dtypes a kernel reads and writes: fp32, bf16 (passed as its int16 bits), fp16
F32, BF16, F16 = 0, 1, 2
_KIND = {torch.float32: F32, torch.bfloat16: BF16, torch.float16: F16}


@triton.jit
def _philox(index, k0, k1, n: tl.constexpr):
    """Philox4x32-10 of the counters (index lo, index hi, 0, 0) under (k0, k1)."""
    c0 = (index & 0xFFFFFFFF).to(tl.uint32)
    c1 = (index >> 32).to(tl.uint32)
    c2 = tl.full([n], 0, tl.uint32)
    c3 = tl.full([n], 0, tl.uint32)
    m0 = tl.full([n], 0xD2511F53, tl.uint32)
    m1 = tl.full([n], 0xCD9E8D57, tl.uint32)
    w0 = tl.full([n], 0x9E3779B9, tl.uint32)
    w1 = tl.full([n], 0xBB67AE85, tl.uint32)
    a = tl.full([n], 0, tl.uint32) + k0
    b = tl.full([n], 0, tl.uint32) + k1
    for step in tl.static_range(10):
        if step > 0:
            a = a + w0
            b = b + w1
        hi0 = tl.umulhi(c0, m0)
        lo0 = c0 * m0
        hi1 = tl.umulhi(c2, m1)
        lo1 = c2 * m1
        c0, c1, c2, c3 = hi1 ^ c1 ^ a, lo1, hi0 ^ c3 ^ b, lo0
    return c0, c1, c2, c3


@triton.jit
def _gaussian(w0, w1):
    """Box-Muller's cosine branch (zoexec.maths.counter.gaussian), same operations."""
    x = ((w0 >> 9) * 2 + 1).to(tl.float32)
    bits = x.to(tl.int32, bitcast=True)
    e = (bits >> 23) - 127
    f = ((bits & 0x7FFFFF) | 0x3F800000).to(tl.float32, bitcast=True)
    big = f > _SQRT2
    f = tl.where(big, f * 0.5, f)
    ef = (tl.where(big, e + 1, e) - 24).to(tl.float32)
    s = tl.div_rn(f - 1.0, f + 1.0)
    s2 = s * s
    p = s2 * _L0 + _L1
    p = p * s2 + _L2
    p = p * s2 + _L3
    p = p * s2 + _L4
    p = p * s2 + 2.0
    log_u = ef * _LN2_HI + (s * p + ef * _LN2_LO)
    r = tl.sqrt_rn(log_u * -2.0)
    quadrant = w1 >> 30
    a = ((((w1 >> 7) & 0x7FFFFF) * 2 + 1).to(tl.float32) * _TWO_M24) * _HALF_PI
    a2 = a * a
    c = a2 * _C0 + _C1
    c = c * a2 + _C2
    c = c * a2 + _C3
    c = c * a2 + _C4
    c = c * a2 + _C5
    c = c * a2 + 1.0
    t = a2 * _S0 + _S1
    t = t * a2 + _S2
    t = t * a2 + _S3
    t = t * a2 + _S4
    t = t * a2 + _S5
    t = a * (t * a2 + 1.0)
    v = tl.where(quadrant == 0, c, tl.where(quadrant == 1, -t, tl.where(quadrant == 2, -c, t)))
    return r * v


@triton.jit
def _load32(ptr, offs, mask, kind: tl.constexpr):
    if kind == 1:
        raw = tl.load(ptr + offs, mask=mask, other=0).to(tl.int32)
        x = (raw << 16).to(tl.float32, bitcast=True)
    else:
        x = tl.load(ptr + offs, mask=mask, other=0.0).to(tl.float32)
    return x


@triton.jit
def _store(ptr, offs, mask, x, word, kind: tl.constexpr, stochastic: tl.constexpr):
    """x (fp32) into `kind`: as is, to nearest even, or stochastically with `word`;
    returns the stored value in fp32 (no second read of what was written)."""
    out = x
    if kind == 0:
        tl.store(ptr + offs, x, mask=mask)
    elif kind == 1:
        bits = x.to(tl.int32, bitcast=True)
        if stochastic:
            bits = bits + (word >> 16).to(tl.int32)
        else:
            bits = bits + (0x7FFF + ((bits >> 16) & 1))
        top = (bits >> 16).to(tl.int16)
        tl.store(ptr + offs, top, mask=mask)
        out = (top.to(tl.int32) << 16).to(tl.float32, bitcast=True)
    else:
        if stochastic:
            bits = x.to(tl.int32, bitcast=True) + (word >> 19).to(tl.int32)
            y = (bits & -8192).to(tl.float32, bitcast=True).to(tl.float16)
        else:
            y = x.to(tl.float16)
        tl.store(ptr + offs, y, mask=mask)
        out = y.to(tl.float32)
    return out


@triton.jit
def _splitmix(x):
    x = x + 0x9E3779B97F4A7C15
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB
    return x ^ (x >> 31)


@triton.jit
def _key(h_lo, h_hi, tensor):
    """Philox's key of `tensor` (per element): zoexec.maths.counter.counter_key, the
    hash chain after (seed, block) given as h, continued by the tensor and the tag."""
    h = (h_hi.to(tl.uint32, bitcast=True).to(tl.uint64) << 32) \
        | h_lo.to(tl.uint32, bitcast=True).to(tl.uint64)
    h = _splitmix(h ^ tensor.to(tl.uint64))
    h = _splitmix(h ^ 0x435A) >> 1
    return (h & 0xFFFFFFFF).to(tl.uint32), (h >> 32).to(tl.uint32)


@triton.jit
def _zo_pass(theta, work, count, start, table, decays, num_tensors, uh0, uh1, alpha, shrink,
             ph0, ph1, scale, UPDATE: tl.constexpr, DECAY: tl.constexpr, STEP: tl.constexpr,
             PERTURB: tl.constexpr, THETA: tl.constexpr, WORK: tl.constexpr,
             STOCHASTIC: tl.constexpr, N: tl.constexpr):
    """The block's range [start, start + count) at `theta` (and `work`): each element's
    tensor from `table` (the tensors' first offsets, then the block's end) and its
    decay from `decays`; one update term (UPDATE; its decay: DECAY, its z term: STEP)
    then the perturbation (PERTURB)."""
    offs = tl.program_id(0).to(tl.int64) * N + tl.arange(0, N).to(tl.int64)
    mask = offs < count
    where = offs + start
    tensor = tl.zeros([N], dtype=tl.int32)
    for i in range(1, num_tensors):
        tensor += (where >= tl.load(table + i)).to(tl.int32)
    index = where - tl.load(table + tensor, mask=mask, other=0)
    x = _load32(theta, offs, mask, THETA)
    if UPDATE:
        k0, k1 = _key(uh0, uh1, tensor)
        w0, w1, w2, w3 = _philox(index, k0, k1, N)
        if DECAY:
            decayed = tl.load(decays + tensor, mask=mask, other=0) != 0
            x = tl.where(decayed, x * shrink, x)
        if STEP:
            x = x + _gaussian(w0, w1) * alpha
        x = _store(theta, offs, mask, x, w2, THETA, STOCHASTIC)
    if PERTURB:
        k0, k1 = _key(ph0, ph1, tensor)
        v0, v1, v2, v3 = _philox(index, k0, k1, N)
        y = x + _gaussian(v0, v1) * scale
        _store(work, offs, mask, y, v2, WORK, False)


def _i32(word: int) -> int:
    """A uint32 as the int32 of the same bits (one kernel signature for every key)."""
    return word - (1 << 32) if word >= 1 << 31 else word


def _as_kernel(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


def _halves(seed: int, block: int) -> tuple[int, int]:
    """The key hash after (seed, block) (zoexec.maths.zo.mix_seed's chain) as two int32."""
    h = 0x5A4F5A4F5A4F5A4F
    for part in (seed, block):
        h = zo._splitmix64(h ^ (int(part) & zo._MASK64))
    return _i32(h & cm.MASK32), _i32(h >> 32)


_TABLES: dict[tuple[object, ...], tuple[torch.Tensor, torch.Tensor]] = {}


def spec_table(specs: Sequence[Any], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The block's tensor table on `device` (each tensor's first offset, then the block's
    end: int64; each tensor's decay: int8), made once per block layout and device (the
    specs never change during a run, so no step copies it)."""
    fields = tuple((int(s.offset), int(s.numel), bool(getattr(s, "decay", False)))
                   for s in specs)
    key = (device, fields)
    if key not in _TABLES:
        stop = 0
        for offset, numel, _ in fields:
            if offset != stop:
                raise ValueError(f"the fused pass needs a block's tensors back to back: one "
                                 f"starts at {offset}, the one before ends at {stop}")
            stop = offset + numel
        starts = [offset for offset, _, _ in fields] + [stop]
        _TABLES[key] = (torch.tensor(starts, dtype=torch.int64, device=device),
                        torch.tensor([d for _, _, d in fields], dtype=torch.int8, device=device))
    return _TABLES[key]


def fused_pass(theta: torch.Tensor, *, specs: Sequence[Any], block: int, terms: Sequence[Term],
               perturb: Perturb | None = None, start: int = 0,
               kind: str = "stochastic", block_elems: int = BLOCK) -> int:
    """zoexec.maths.counter.counter_pass as Triton launches over the whole range (every
    tensor it meets): one a term (the last also writes `perturb`), or one perturbation
    alone without terms; `block_elems` elements a program (a power of two; never
    changes a bit). Returns the launches made."""
    assert kind in cm.KINDS, kind
    count = min(theta.numel(), max(0, (specs[-1].offset + specs[-1].numel if specs else 0)
                                   - start))
    if count <= 0 or (not terms and perturb is None):
        return 0
    table, decays = spec_table(specs, theta.device)
    theta_k = _as_kernel(theta)
    work_k = _as_kernel(perturb.out) if perturb is not None else theta_k
    ph = _halves(perturb.seed, block) if perturb is not None else (0, 0)
    grid = (triton.cdiv(count, block_elems),)
    jobs: list[Term | None] = list(terms) or [None]
    for number, term in enumerate(jobs):
        last = number == len(jobs) - 1
        uh = _halves(term.seed, block) if term is not None else (0, 0)
        _zo_pass[grid](
            theta_k, work_k, count, start, table, decays, len(specs), uh[0], uh[1],
            term.alpha if term is not None else 0.0, term.shrink if term is not None else 1.0,
            ph[0], ph[1], perturb.scale if perturb is not None else 0.0,
            UPDATE=term is not None, DECAY=bool(term is not None and term.decays),
            STEP=bool(term is not None and term.alpha), PERTURB=last and perturb is not None,
            THETA=_KIND[theta.dtype],
            WORK=_KIND[perturb.out.dtype] if perturb is not None else 0,
            STOCHASTIC=kind == "stochastic", N=block_elems, enable_fp_fusion=False)
    return len(jobs)
