"""The counter-based z: Philox4x32-10 keyed by (seed, block, tensor) and counted by the
global element index, its Gaussian made of correctly rounded IEEE operations only, and
one pass that applies the pending update(s) with stochastic rounding (noise from the
same counter space) and writes the next perturbation. This module is the plain torch
implementation (`--zo-kernel counter`, any device); zoexec.maths.fused is the same maths
as one Triton kernel (`--zo-kernel fused`, CUDA), bit for bit the same on the CPU
through Triton's interpreter (tests/unit/test_fused_zo.py).

Addressing: element e (0-based, of the flattened tensor) of tensor i of block b under
seed s draws the four 32-bit words Philox4x32-10(counter = (e mod 2^32, e div 2^32, 0,
0), key = (h mod 2^32, h div 2^32)), h = mix_seed(s, b, i, COUNTER_TAG). Words 0 and 1
make z (gaussian), word 2 the stochastic rounding's noise (its top 16 bits for bf16,
top 13 for fp16). Nothing depends on where a range starts or how it is cut: a slice
holds exactly the whole block's bits, on any device count, through either
implementation.

The Gaussian (docs/maths.md): Box-Muller's cosine branch, z = sqrt(-2 ln u) cos(2 pi v),
with u = (2 m + 1) / 2^24 (m the top 23 bits of word 0: u in [2^-24, 1 - 2^-24], so
|z| <= sqrt(48 ln 2) = 5.77), and the angle's quadrant from word 1's top two bits and
its place in the quadrant from the next 23. ln and cos/sin are our own: ln through the
exponent and mantissa bits and 2 atanh((f-1)/(f+1)) to s^11 (f in [sqrt(1/2), sqrt(2))),
cos and sin on [0, pi/2) by their Taylor series to the 12th and 13th power, all in
fp32 with +, -, *, / and sqrt, each correctly rounded: numpy (the interpreter) and
torch agree on every bit. On a GPU Triton may contract a * b + c into one FMA and its
division and square root are its own: a GPU's bits equal the same GPU's, not the CPU's
(a run replays exactly on the device model and versions it ran on: run.json's z).

The update of one term (seed s_j, alpha = -lr g_j, shrink = 1 - lr wd), per element in
fp32: x = theta; x = x * shrink (decayed tensors, wd > 0); x = x + (z * alpha) (g != 0);
stored into theta's dtype: fp32 as is, 16-bit rounded stochastically (update
"stochastic": x's bits plus the noise, the dropped bits cleared; unbiased) or to
nearest ("plain"). Several terms (q directions, several pending steps) are applied in
order, each stored before the next. The perturbation: work = rn(theta + (z * scale)),
scale = sign * eps, from the stored theta, rounded to nearest into work's dtype.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from zoexec.maths.estimators import direction_seed
from zoexec.maths.history import Update
from zoexec.maths.zo import mix_seed

COUNTER_TAG = 0x435A       # "CZ": the counter generator's keys
MASK32 = 0xFFFFFFFF
PHILOX_M = (0xD2511F53, 0xCD9E8D57)
PHILOX_W = (0x9E3779B9, 0xBB67AE85)
PHILOX_ROUNDS = 10
CHUNK = 1 << 16            # elements a torch pass computes at once (never changes a bit)
KINDS = ("stochastic", "nearest")   # how a 16-bit theta stores an update
NOISE_SHIFT = {torch.bfloat16: 16, torch.float16: 19}   # word 2 >> this: the noise


def f32(value: float) -> float:
    """`value` rounded to the nearest fp32 (both implementations use these exact values)."""
    return float(struct.unpack("<f", struct.pack("<f", value))[0])


SQRT2 = f32(2.0 ** 0.5)
LN2_HI = 0.693145751953125          # ln 2's top bits: e * LN2_HI is exact for |e| < 2^8
LN2_LO = f32(0.6931471805599453 - LN2_HI)
HALF_PI = f32(1.5707963267948966)
TWO_M24 = 2.0 ** -24
# ln f = s * (2 + s^2 (2/3 + s^2 (2/5 + ...))), s = (f - 1) / (f + 1), highest first
LOG_C = tuple(f32(2.0 / k) for k in (11, 9, 7, 5, 3))
# cos a = 1 + a^2 (-1/2! + a^2 (1/4! ...)), sin a = a (1 + a^2 (-1/3! + ...)), highest first
COS_C = tuple(f32((-1) ** k / float(_f)) for k, _f in
              ((6, 479001600), (5, 3628800), (4, 40320), (3, 720), (2, 24), (1, 2)))
SIN_C = tuple(f32((-1) ** k / float(_f)) for k, _f in
              ((6, 6227020800), (5, 39916800), (4, 362880), (3, 5040), (2, 120), (1, 6)))


def counter_key(seed: int, block: int, index: int) -> tuple[int, int]:
    """Philox's key of tensor `index` of `block` under `seed` (two 32-bit words)."""
    h = mix_seed(seed, block, index, COUNTER_TAG)
    return h & MASK32, h >> 32


def _mulhilo(a: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(high, low) 32-bit words of a * m (a: int64 holding uint32; m < 2^32): the int64
    product wraps modulo 2^64 (two's complement, as torch's CPU and CUDA kernels
    multiply), which keeps all 64 bits of it (the known-answer test checks it)."""
    p = a * m
    return (p >> 32) & MASK32, p & MASK32


def philox(index: torch.Tensor, key: tuple[int, int]) -> tuple[torch.Tensor, ...]:
    """Philox4x32-10 of the counters (index mod 2^32, index div 2^32, 0, 0) under `key`:
    four int64 tensors holding the uint32 words (Random123's philox4x32_R)."""
    c0, c1 = index & MASK32, index >> 32
    c2 = c3 = torch.zeros_like(index)
    k0, k1 = key
    for step in range(PHILOX_ROUNDS):
        if step:
            k0, k1 = (k0 + PHILOX_W[0]) & MASK32, (k1 + PHILOX_W[1]) & MASK32
        hi0, lo0 = _mulhilo(c0, PHILOX_M[0])
        hi1, lo1 = _mulhilo(c2, PHILOX_M[1])
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


def _horner(x: torch.Tensor, coefficients: Sequence[float], last: float) -> torch.Tensor:
    p = torch.full_like(x, coefficients[0])
    for c in (*coefficients[1:], last):
        p = p * x + c
    return p


def sqrt_rn(x: torch.Tensor) -> torch.Tensor:
    """The correctly rounded fp32 square root of fp32 `x` >= 0 (torch's CPU sqrt is
    within an ulp, not always the nearest: 20% of values differ from numpy's): fp64's
    root rounded to fp32, then moved one ulp where the exact midpoints (25 bits: their
    squares are exact in fp64) say it is not the nearest."""
    xd = x.to(torch.float64)
    y = torch.sqrt(xd).to(torch.float32)
    up = torch.nextafter(y, torch.full_like(y, float("inf")))
    down = torch.nextafter(y, torch.zeros_like(y))
    high = (y.to(torch.float64) + up.to(torch.float64)) * 0.5
    low = (y.to(torch.float64) + down.to(torch.float64)) * 0.5
    return torch.where(xd > high * high, up, torch.where(xd < low * low, down, y))


def gaussian(w0: torch.Tensor, w1: torch.Tensor) -> torch.Tensor:
    """z (fp32) from two uint32 words: Box-Muller's cosine branch (module docstring)."""
    x = ((w0 >> 9) * 2 + 1).to(torch.float32)          # exact: < 2^24
    bits = x.view(torch.int32)
    e = (bits >> 23) - 127
    f = ((bits & 0x7FFFFF) | 0x3F800000).view(torch.float32)
    big = f > SQRT2
    f = torch.where(big, f * 0.5, f)
    ef = (torch.where(big, e + 1, e) - 24).to(torch.float32)
    s = (f - 1.0) / (f + 1.0)
    log_f = s * _horner(s * s, LOG_C, 2.0)
    log_u = ef * LN2_HI + (log_f + ef * LN2_LO)
    r = sqrt_rn(log_u * -2.0)
    quadrant = w1 >> 30
    a = ((((w1 >> 7) & 0x7FFFFF) * 2 + 1).to(torch.float32) * TWO_M24) * HALF_PI
    a2 = a * a
    cos = _horner(a2, COS_C, 1.0)
    sin = a * _horner(a2, SIN_C, 1.0)
    v = torch.where(quadrant == 0, cos, torch.where(quadrant == 1, -sin,
                                                    torch.where(quadrant == 2, -cos, sin)))
    return r * v


def round_store(x: torch.Tensor, dtype: torch.dtype, *, kind: str,
                word: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 `x` stored in `dtype`: fp32 as is; 16-bit to nearest (even) or, `kind`
    "stochastic", with `word` (uint32 in int64) as the rounding's noise."""
    if dtype == torch.float32:
        return x
    bits = x.view(torch.int32)
    if kind == "stochastic":
        assert word is not None
        bits = bits + (word >> NOISE_SHIFT[dtype]).to(torch.int32)
        if dtype == torch.bfloat16:
            return (bits >> 16).to(torch.int16).view(torch.bfloat16)
        return (bits & -(1 << 13)).view(torch.float32).to(torch.float16)
    if dtype == torch.bfloat16:
        bits = bits + (0x7FFF + ((bits >> 16) & 1))
        return (bits >> 16).to(torch.int16).view(torch.bfloat16)
    return x.to(dtype)


@dataclass(frozen=True, kw_only=True)
class Term:
    """One update term: its direction's seed, alpha = -lr g (0: no z term) and shrink =
    1 - lr wd (1: no decay), both fp32 values (f32)."""

    seed: int
    alpha: float
    shrink: float = 1.0

    @classmethod
    def of(cls, *, seed: int, lr: float, g: float, weight_decay: float) -> Term:
        return cls(seed=seed, alpha=f32(-lr * g), shrink=f32(1.0 - lr * weight_decay))

    @property
    def decays(self) -> bool:
        return self.shrink != 1.0


def terms_of(updates: Sequence[Update], *, weight_decay: float) -> list[Term]:
    """Pending updates (zoexec.maths.history.Update, in order) as terms: each direction j
    its g_j / q along direction_seed(seed, j), weight decay with each update's first
    (as the torch path applies them); terms that change nothing are left out."""
    out = []
    for update in updates:
        for index, (direction, g) in enumerate(update.terms):
            decay = weight_decay if index == 0 else 0.0
            if update.lr and (g or decay):
                out.append(Term.of(seed=direction_seed(update.seed, direction), lr=update.lr,
                                   g=g, weight_decay=decay))
    return out


@dataclass(frozen=True, kw_only=True)
class Perturb:
    """The perturbation a pass writes: `out` (the range's working copy) = theta + scale z
    of `seed` (scale = sign * eps, an fp32 value)."""

    seed: int
    scale: float
    out: torch.Tensor


@dataclass(frozen=True, kw_only=True)
class Piece:
    """A tensor's part of a flat range: tensor `index`, range positions [lo, hi), its
    first element's index in the tensor `first`, weight decay or not."""

    index: int
    lo: int
    hi: int
    first: int
    decay: bool


def pieces(specs: Sequence[Any], start: int, stop: int) -> list[Piece]:
    """Each tensor's part of the block's flat range [start, stop), in range positions."""
    out = []
    for index, spec in enumerate(specs):
        a, b = max(spec.offset, start), min(spec.offset + spec.numel, stop)
        if a < b:
            out.append(Piece(index=index, lo=a - start, hi=b - start, first=a - spec.offset,
                             decay=bool(getattr(spec, "decay", False))))
    return out


def counter_pass(theta: torch.Tensor, *, specs: Sequence[Any], block: int, terms: Sequence[Term],
                 perturb: Perturb | None = None, start: int = 0,
                 kind: str = "stochastic") -> None:
    """The pending `terms` applied to `theta` (flat, the block's range [start, start +
    len)) in place, then `perturb` written (module docstring); plain torch, chunk by
    chunk (CHUNK elements; the chunking never changes a bit)."""
    assert kind in KINDS, kind
    for piece in pieces(specs, start, start + theta.numel()):
        for lo in range(piece.lo, piece.hi, CHUNK):
            hi = min(piece.hi, lo + CHUNK)
            index = torch.arange(piece.first + lo - piece.lo, piece.first + hi - piece.lo,
                                 dtype=torch.int64, device=theta.device)
            part = theta[lo:hi]
            for term in terms:
                _update(part, index, block, piece, term, kind)
            if perturb is not None:
                z = z_of(index, perturb.seed, block, piece.index)
                x = part.to(torch.float32) + z * perturb.scale
                perturb.out[lo:hi].copy_(round_store(x, perturb.out.dtype, kind="nearest"))


def z_of(index: torch.Tensor, seed: int, block: int, tensor: int) -> torch.Tensor:
    """z (fp32) of elements `index` of tensor `tensor` of `block` under `seed`."""
    w = philox(index, counter_key(seed, block, tensor))
    return gaussian(w[0], w[1])


def _update(part: torch.Tensor, index: torch.Tensor, block: int, piece: Piece, term: Term,
            kind: str) -> None:
    w = philox(index, counter_key(term.seed, block, piece.index))
    x = part.to(torch.float32)
    if piece.decay and term.decays:
        x = x * term.shrink
    if term.alpha:
        x = x + gaussian(w[0], w[1]) * term.alpha
    part.copy_(round_store(x, part.dtype, kind=kind, word=w[2]))
