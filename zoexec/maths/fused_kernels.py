"""The Triton kernels of the fused pass, as Triton compiles them: zoexec.maths.fused
launches `_zo_pass` (and says what it computes); the other functions are its inlined
pieces. They live apart from the typed launcher because they are Triton's language,
not Python's: Triton reads a kernel's parameter annotations (tl.constexpr, pointer and
scalar types) as part of the kernel, so these functions carry no annotations for the
type checker, and pyproject.toml lets this module alone have untyped functions and
decorators (triton.jit is untyped). Imported only where the fused path runs or is
tested: triton is the `cuda` extra's.
"""

from __future__ import annotations

import triton
import triton.language as tl

from zoexec.maths import counter as cm

_SQRT2 = tl.constexpr(cm.SQRT2)
_LN2_HI = tl.constexpr(cm.LN2_HI)
_LN2_LO = tl.constexpr(cm.LN2_LO)
_HALF_PI = tl.constexpr(cm.HALF_PI)
_TWO_M24 = tl.constexpr(cm.TWO_M24)
_L0, _L1, _L2, _L3, _L4 = (tl.constexpr(c) for c in cm.LOG_C)
_C0, _C1, _C2, _C3, _C4, _C5 = (tl.constexpr(c) for c in cm.COS_C)
_S0, _S1, _S2, _S3, _S4, _S5 = (tl.constexpr(c) for c in cm.SIN_C)


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
