"""The zo maths' primitives, each a small function of the profile's figures: a z draw,
an element-wise pass over the weights, the update (plain, fp32 masters, or stochastic
rounding and its noise). The schedules (zoplan.pricing.schedules) add them up per
task; a new estimator's cost is one more function of these.

GPU. A z draw is arithmetic-bound (Philox normal draws: some 2-6 ps a value in public
kernel benchmarks, well above 4 B over HBM bandwidth; docs/sources.md, "z per value"):
its elements at compute.z_ns_per_elem on the device, never below writing the draw at
the achieved HBM bandwidth, and one seeded generator launch per Z_CHUNK_CUDA elements
of a tensor at compute.z_launch_us of host time (zoplan.execrules.z_draw_calls). A pass
(perturb, update) is memory-bound: its bytes (zo_pass_bytes) at the achieved HBM
bandwidth, one launch. The stochastic update works per chunk in fp32 scratch
(SR_BYTES an element, SR_KERNELS kernels a chunk) with its noise, a uniform draw
seeded like z, written at HBM speed (NOISE_BYTES). The fused pass (Workload.update_kernel
"fused": fused_pass below) is one kernel per pass that regenerates z in place.
CPU. A measured profile's z model: z chunks spread over the rank's threads (the
busiest thread sets the time, zoplan.execrules.z_makespan), z_call_us to hand them to a
pool, z_chunk_us a chunk, z_ns_per_elem an element, 1 / z_rank_scaling with several
ranks; a pass at zo_pass_ns an element. A profile without it: compute.zo_ns_per_param
prices an update task's 2 draws + 2 passes per parameter.
"""

from __future__ import annotations

from zoplan.execrules import (
    chunk_bounds,
    sr_chunk,
    threads_per_rank,
    z_draw_calls,
    z_makespan,
    z_uses_pool,
)
from zoplan.hardware import Z_MODEL, HardwareProfile
from zoplan.pricing.compute import compute_share, has_z_model, hbm_time_s
from zoplan.pricing.figures import given, or_
from zoplan.pricing.host import launch_s
from zoplan.pricing.units import NS, US
from zoplan.pricing.work import Work

# Bytes per parameter of the zo passes on a GPU (the executor's passes, docs/precision.md;
# p: the stored (param) dtype's bytes, c: the compute dtype's, in which z is drawn):
#   update pass    theta -= lr*g*z (zo.apply_update): reads theta and z, writes theta  2p + c
#   perturb pass   work = theta + eps*z (zo.perturb_into): reads theta and z, writes work
#                  in the compute dtype                                                p + 2c
#   ZO2 in place   theta += s*eps*z: reads theta and z, writes theta                   2p + c
# The stochastic update (zo.apply_update_stochastic; 16-bit theta and z) works per chunk
# of execrules.sr_chunk elements in fp32 scratch: copy theta in (6 bytes per element),
# add lr*g*z (10), draw the integer noise (one generator launch per chunk, priced like
# z), and round on the bits (zo.round_stochastic_: add the noise 12, shift or mask 8, copy
# into the 16-bit store 6): SR_BYTES per element in SR_KERNELS element-wise kernels per
# chunk, in place of the update pass (weight decay, when set, adds a multiply: not priced).
SR_BYTES = 6 + 10 + 12 + 8 + 6
SR_KERNELS = 5
NOISE_BYTES = 4   # the rounding's int32 noise, written by its draw (read again in SR_BYTES)
CPU_PASS_BYTES = 12   # an fp32 pass, what compute.zo_pass_ns is measured on (CPU profiles)


def zo_pass_bytes(*, param_bytes: int, compute_bytes: int) -> tuple[int, int]:
    """(update pass, perturb pass) bytes per parameter on a GPU (plain and master; the
    stochastic update replaces the update pass by SR_BYTES)."""
    p, c = param_bytes, compute_bytes
    return 2 * p + c, p + 2 * c


def sr_chunks(tensor_numels: list[int], device_kind: str) -> int:
    """Chunks of the stochastic update over these tensors (a noise draw and SR_KERNELS
    kernels each)."""
    chunk = sr_chunk(device_kind)
    return sum(len(chunk_bounds(n, chunk)) for n in tensor_numels)


def update_figures(profile: HardwareProfile) -> tuple[str, ...]:
    """The compute figures that price the update task (what a refit scales)."""
    if not profile.is_cpu:
        return ("z_launch_us", "z_ns_per_elem")
    if has_z_model(profile):
        return tuple(p.split(".")[1] for p in Z_MODEL)
    return ("zo_ns_per_param",)


# ---- CPU ---------------------------------------------------------------------------
def zo_time_s(profile: HardwareProfile, num_params: int, local_ranks: int = 1) -> float:
    """The update task's zo maths (2 z draws + 2 passes) by compute.zo_ns_per_param
    (CPU profiles without the z model)."""
    share = compute_share(profile, local_ranks, key="zo_rank_scaling")
    per_param = given(profile.figures().compute.zo_ns_per_param, "compute.zo_ns_per_param")
    return num_params * per_param * NS / share


def pass_time_s(profile: HardwareProfile, num_elems: float, local_ranks: int = 1) -> float:
    """One element-wise pass of the zo maths (perturb or update) over `num_elems`, on a
    CPU profile with the z model (compute.zo_pass_ns per element)."""
    share = compute_share(profile, local_ranks, key="mem_rank_scaling")
    per_elem = given(profile.figures().compute.zo_pass_ns, "compute.zo_pass_ns")
    return num_elems * per_elem * NS / share


def cpu_z_time_s(profile: HardwareProfile, tensor_numels: list[int], local_ranks: int = 1) -> float:
    """One z draw on a CPU rank (z model): the rank's threads split the chunks
    (zoplan.execrules.balance), so the busiest thread sets the time; handing the chunks
    to a thread pool costs z_call_us (one thread draws them itself)."""
    f = profile.figures()
    c = f.compute
    threads = threads_per_rank(f.host.cores, local_ranks)
    elems, chunks = z_makespan(tensor_numels, threads)
    scale = or_(c.z_rank_scaling, 1.0) if local_ranks > 1 else 1.0
    call = given(c.z_call_us, "compute.z_call_us") * US if z_uses_pool(tensor_numels, threads) else 0.0
    seconds: float = (call + chunks * or_(c.z_chunk_us, 0.0) * US
                      + elems * given(c.z_ns_per_elem, "compute.z_ns_per_elem") * NS / scale)
    return seconds


def cpu_noise_s(profile: HardwareProfile, tensor_numels: list[int]) -> float:
    """The stochastic update's noise over these tensors on a CPU rank: drawn chunk by
    chunk on one thread (z_chunk_us a chunk, z_ns_per_elem an element)."""
    c = profile.figures().compute
    seconds: float = (sr_chunks(tensor_numels, "cpu") * or_(c.z_chunk_us, 0.0) * US
                      + sum(tensor_numels) * given(c.z_ns_per_elem, "compute.z_ns_per_elem") * NS)
    return seconds


def cpu_rounding_s(profile: HardwareProfile, noise_numels: list[int], one_pass_s: float) -> float:
    """The stochastic update in place of an update pass on a CPU rank: its noise and
    SR_BYTES of element-wise work (SR_BYTES / CPU_PASS_BYTES passes of `one_pass_s`)."""
    return cpu_noise_s(profile, noise_numels) + SR_BYTES / CPU_PASS_BYTES * one_pass_s


# ---- GPU ---------------------------------------------------------------------------
def gpu_z_time_s(profile: HardwareProfile, tensor_numels: list[int], elem_bytes: int = 4) -> float:
    """Device seconds of one z draw on a GPU: z_ns_per_elem per element, never below
    writing `elem_bytes` per element at the achieved HBM bandwidth."""
    total = sum(tensor_numels)
    per_elem = given(profile.figures().compute.z_ns_per_elem, "compute.z_ns_per_elem")
    return max(total * per_elem * NS, hbm_time_s(profile, total * elem_bytes))


def z_issue_s(profile: HardwareProfile, tensor_numels: list[int]) -> float:
    """Host time to issue one z draw on a GPU: one seeded generator launch per chunk
    of Z_CHUNK_CUDA elements of each tensor (zoplan.execrules.z_draw_calls) at
    compute.z_launch_us."""
    launch = given(profile.figures().compute.z_launch_us, "compute.z_launch_us")
    return z_draw_calls(tensor_numels, "cuda") * launch * US


def z_draw(profile: HardwareProfile, tensor_numels: list[int], elem_bytes: int) -> Work:
    """A z draw over these tensors on a GPU: device and host seconds."""
    return Work(gpu_z_time_s(profile, tensor_numels, elem_bytes),
                z_issue_s(profile, tensor_numels))


def hbm_pass(profile: HardwareProfile, num_bytes: float, launches: float = 1.0) -> Work:
    """A memory-bound pass moving `num_bytes` in `launches` kernel launches."""
    return Work(hbm_time_s(profile, num_bytes), launches * launch_s(profile))


def rounding_noise(profile: HardwareProfile, chunks: int, numels: float) -> Work:
    """The stochastic rounding's noise draws and kernels on a GPU. Device: `numels`
    uniform integers written (NOISE_BYTES each at the achieved HBM bandwidth: a uniform
    draw is Philox's raw output, no Box-Muller transform as z's normal draw has). Host:
    per chunk a seeded draw (compute.z_launch_us) and SR_KERNELS plain launches
    (compute.launch_us). On the H200 (pass 2's profile stage, apply_update_stochastic
    over 4 x 2**24 bf16 values: 1.238 ms) this and SR_BYTES price 1.287 ms (+4%); the
    noise at z's arithmetic rate would price 1.42 ms (+15%)."""
    z_launch = given(profile.figures().compute.z_launch_us, "compute.z_launch_us")
    return Work(hbm_time_s(profile, NOISE_BYTES * numels),
                chunks * (z_launch * US + SR_KERNELS * launch_s(profile)))


def gpu_update(profile: HardwareProfile, tensor_numels: list[int], *, update: str,
               update_bytes: int) -> Work:
    """The update pass over these tensors on a GPU: `update_bytes` a parameter (plain,
    master), or the stochastic update (its noise, SR_BYTES an element)."""
    total = sum(tensor_numels)
    if update != "stochastic":
        return hbm_pass(profile, update_bytes * total)
    return (rounding_noise(profile, sr_chunks(tensor_numels, "cuda"), total)
            + hbm_pass(profile, SR_BYTES * total, 0))


# ---- GPU, the fused pass (Workload.update_kernel "fused") ----------------------------
# One kernel per pass over a flat block (or slice): z is regenerated from a counter-based
# generator in the kernel (no z buffer), the pending update and its stochastic rounding
# (noise from the same counter space) and the next perturbation are computed in
# registers: the weights are read once and written once (p bytes each), the perturbed
# copy written once (c bytes). The second sign of the dual forward is a second pass that
# reads the weights and writes the copy (p + c). Each z a pass regenerates costs
# compute.z_ns_per_elem (a normal draw's Philox and Box-Muller: arithmetic-bound,
# docs/sources.md: flaggems); the rounding's uniform noise is Philox's raw output, taken
# as free beside them. A pass takes the longer of its bytes at the achieved HBM
# bandwidth and its draws, and one launch (compute.launch_us).
def fused_pass(profile: HardwareProfile, numel: float, *, read: int, write: int,
               draws: int) -> Work:
    """A fused pass over `numel` elements: `read` + `write` bytes an element, `draws`
    z values regenerated an element, one launch."""
    per_elem = given(profile.figures().compute.z_ns_per_elem, "compute.z_ns_per_elem")
    device = max(hbm_time_s(profile, (read + write) * numel), draws * numel * per_elem * NS)
    return Work(device, launch_s(profile))


def fused_update(profile: HardwareProfile, numel: float, *, param_bytes: int,
                 compute_bytes: int, perturb: bool = True) -> Work:
    """The update task's fused pass: the pending update (z of the last step) and, with
    `perturb`, the first perturbation (z of this step) written beside it."""
    return fused_pass(profile, numel, read=param_bytes,
                      write=param_bytes + (compute_bytes if perturb else 0),
                      draws=2 if perturb else 1)


def fused_perturb(profile: HardwareProfile, numel: float, *, param_bytes: int,
                  compute_bytes: int) -> Work:
    """A perturbation alone (the dual forward's other sign): read the weights, write
    the copy, z regenerated."""
    return fused_pass(profile, numel, read=param_bytes, write=compute_bytes, draws=1)
