"""What drawing an estimator's direction d costs (zoplan.estimators; the executor's
zoexec.maths.estimators), in place of the z draw of zoplan.pricing.zo; the schedules
(zoplan.pricing.schedules) count the draws and passes of each task.

mezo: a z draw (zoplan.pricing.zo).
lowrank: z over the vectors only; per matrix (m x n) U and V, r(m + n) normal values
  drawn whole on one thread (two seeded generators), and the product U V^T tile by tile:
  a GEMM of inner size r whose cost is writing its m*n fp32 outputs (2rmn FLOPs, r <=
  64: memory-bound), LOWRANK_BYTES an element, plus on a 16-bit compute dtype the copy
  of each tile into d (4 read, c written). The z draw of the matrices, m*n values at
  z_ns_per_elem, is what it saves.
sparse: a z draw of every tensor, each tensor's threshold (a selection over its sample
  of numel / SPARSE_STRIDE values: SELECT_PASSES passes over them) and the mask, chunk
  by chunk: |theta| (p read, p written), the comparison (p read, 1 written) and the
  masked fill (1 and c read, c written): MASK_BYTES(p, c) an element, three kernels a
  chunk.
On a CPU the bytes are in units of the measured fp32 pass (compute.zo_pass_ns, 12 bytes
an element: CPU_PASS_BYTES), and each operator call costs its dispatch: a share of a
block forward's (compute.overhead_us over BLOCK_OPS operators, as zoplan.pricing.compute
prices the embedding's and the head's): LOWRANK_OPS a matrix (two seeded generators,
two draws, the scaling, the product), SPARSE_OPS a tensor (its sample, |.|, the
selection) and MASK_OPS a chunk; on a GPU at the achieved HBM bandwidth, a launch per
kernel.
A CPU profile without the z model prices a d draw as a quarter of the update task's
zo_ns_per_param (2 draws + 2 passes), times DRAW_SHARE_PER_PARAM's share for the
estimator (rough: the z model prices it as measured).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from zoplan.estimators import SPARSE_STRIDE, is_matrix, matrix_dims, tile_rows
from zoplan.execrules import chunk_bounds, z_chunk
from zoplan.hardware import HardwareProfile
from zoplan.models import dtype_bytes
from zoplan.pricing.compute import has_z_model
from zoplan.pricing.figures import given
from zoplan.pricing.units import NS, US
from zoplan.pricing.work import Work
from zoplan.pricing.zo import (
    CPU_PASS_BYTES,
    cpu_z_time_s,
    hbm_pass,
    pass_time_s,
    z_draw,
    zo_time_s,
)
from zoplan.workload import Workload

LOWRANK_BYTES = 4      # the product's fp32 output, an element (U and V are r(m+n) values)
BLOCK_OPS = 40         # operators of an OPT block's forward (zoplan.pricing.compute's EMBED_OPS)
LOWRANK_OPS, SPARSE_OPS, MASK_OPS = 7, 4, 3   # operator calls a matrix, a tensor, a chunk
SELECT_PASSES = 4      # a selection (kthvalue) over a sample: about 4 passes over it
# lowrank: the product writes a third of an fp32 pass (4 of 12 bytes); sparse: a draw
# and about two passes (MASK_BYTES at 4-byte weights: 24 of 12)
DRAW_SHARE_PER_PARAM = {"mezo": 1.0, "lowrank": 1.0 / 3.0, "sparse": 3.0}


def mask_bytes(param_bytes: int, compute_bytes: int) -> int:
    """sparse: bytes an element of the mask's three kernels (module docstring)."""
    p, c = param_bytes, compute_bytes
    return 3 * p + 2 + 2 * c


def _split(shapes: Sequence[tuple[int, ...]]) -> tuple[list[int], list[tuple[int, int]]]:
    """(the vectors' element counts, the matrices' (m, n))."""
    return ([math.prod(s) for s in shapes if not is_matrix(s)],
            [matrix_dims(s) for s in shapes if is_matrix(s)])


# ---- CPU ---------------------------------------------------------------------------
def cpu_draw_s(profile: HardwareProfile, shapes: Sequence[tuple[int, ...]], workload: Workload,
               local_ranks: int = 1) -> float:
    """One d draw over tensors of these shapes on a CPU rank (module docstring)."""
    spec = workload.estimator_spec
    numels = [math.prod(s) for s in shapes]
    if not has_z_model(profile):
        return 0.25 * DRAW_SHARE_PER_PARAM[spec.estimator] * zo_time_s(profile, sum(numels),
                                                                        local_ranks)
    if spec.estimator == "mezo":
        return cpu_z_time_s(profile, numels, local_ranks)
    if spec.estimator == "lowrank":
        vectors, matrices = _split(shapes)
        z_ns = given(profile.figures().compute.z_ns_per_elem, "compute.z_ns_per_elem")
        factors = sum((m + n) * spec.lowrank_rank for m, n in matrices)
        draws: float = (len(matrices) * LOWRANK_OPS * _op_s(profile)
                 + factors * z_ns * NS)
        cb = dtype_bytes(workload.compute_dtype)
        per_elem = LOWRANK_BYTES + (4 + cb if cb != 4 else 0)
        product = per_elem / CPU_PASS_BYTES * pass_time_s(
            profile, sum(m * n for m, n in matrices), local_ranks)
        return cpu_z_time_s(profile, vectors, local_ranks) + draws + product
    masks = mask_bytes(dtype_bytes(workload.param_dtype), dtype_bytes(workload.compute_dtype))
    select = SELECT_PASSES * pass_time_s(profile, sum(-(-n // SPARSE_STRIDE) for n in numels),
                                         local_ranks)
    chunks = sum(len(chunk_bounds(n, z_chunk("cpu"))) for n in numels)
    calls = (len(numels) * SPARSE_OPS + chunks * MASK_OPS) * _op_s(profile)
    return (cpu_z_time_s(profile, numels, local_ranks) + select + calls
            + masks / CPU_PASS_BYTES * pass_time_s(profile, sum(numels), local_ranks))


def _op_s(profile: HardwareProfile) -> float:
    """One operator call's dispatch on a CPU rank: a BLOCK_OPS-th of a block forward's."""
    overhead = profile.figures().compute.overhead_us
    return overhead * US / BLOCK_OPS


# ---- GPU ---------------------------------------------------------------------------
def gpu_draw(profile: HardwareProfile, shapes: Sequence[tuple[int, ...]],
             workload: Workload) -> Work:
    """One d draw over tensors of these shapes on a GPU: device and host seconds."""
    spec, c = workload.estimator_spec, dtype_bytes(workload.compute_dtype)
    numels = [math.prod(s) for s in shapes]
    if spec.estimator == "mezo":
        return z_draw(profile, numels, c)
    if spec.estimator == "lowrank":
        vectors, matrices = _split(shapes)
        factors = [(m + n) * spec.lowrank_rank for m, n in matrices]
        tiles = sum(-(-m // tile_rows(n, z_chunk("cuda"))) for m, n in matrices)
        per_elem = LOWRANK_BYTES + (4 + c if c != 4 else 0)
        product = hbm_pass(profile, per_elem * sum(m * n for m, n in matrices),
                           tiles * (1 if c == 4 else 2))
        return z_draw(profile, vectors, c) + z_draw(profile, factors, 4) + product
    chunks = sum(len(chunk_bounds(n, z_chunk("cuda"))) for n in numels)
    sample = sum(-(-n // SPARSE_STRIDE) for n in numels)
    select = hbm_pass(profile, SELECT_PASSES * sample * 4, len(numels))
    masks = hbm_pass(profile, mask_bytes(dtype_bytes(workload.param_dtype), c) * sum(numels),
                     3 * chunks)
    return z_draw(profile, numels, c) + select + masks


def draw_share(workload: Workload, pieces: list[int], shapes: list[tuple[int, ...]]) -> float:
    """The share of a whole block's d draw a slice's deferred update pays (lowrank and
    sparse: in proportion to its elements; the tiles and thresholds it reuses are
    priced with the block's)."""
    total = sum(math.prod(s) for s in shapes)
    return sum(pieces) / total if total else 0.0
