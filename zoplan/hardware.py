"""HardwareProfile: the machine the planner simulates, loaded from JSON and validated.

A profile describes ONE node type (a cluster is `nodes` copies of it joined by a
network; how many comes from the job, `zoplan optimize --gpus`, never from the
profile: a `max_nodes` key of older profiles is read and ignored). Every figure is
data with its unit in the name and a source note in `sources` (dotted path -> note,
"[S]" spec, "[M]" measured, "[D]" derived); shipped
profiles live in hwprofiles/, `zoplan profile` writes measured ones. Some figures belong
to one device kind only (zoplan.hwcheck: _REQUIRED_BY_KIND, _OPTIONAL_BY_KIND); a figure of
the other kind is refused.

Semantics the simulator relies on (units: GB/s = 1e9 bytes/s, one direction):
- device.kind "cuda": each rank owns one GPU with concurrent engines (compute, H2D,
  D2H, collective). device.kind "cpu": each rank is a gloo process on a shared host;
  `device.concurrent_engines` false means a rank's tasks run one at a time.
- pcie.h2d_gbps / d2h_gbps: one rank's host link alone, per direction.
  CUDA: pcie.h2d_duplex_gbps / d2h_duplex_gbps: each direction of one GPU's link while
  the other direction runs too (A100: H2D drops to 11-13 GB/s while D2H stays near 24);
  pcie.uplink_h2d_duplex_gbps / uplink_d2h_duplex_gbps (optional, both or neither): the
  same for a switch uplink (its member GPUs copying both ways at once). CPU:
  pcie.duplex_gbps, both directions of one rank's copies together (a CPU rank copies one
  way at a time). pcie.switch_groups: ranks that share one switch uplink of
  pcie.switch_uplink_gbps per direction. host.mem_bw_gbps: ceiling of all
  host<->device traffic of a node together (measured: all GPUs copying both ways).
- fabric.kind: "nvswitch" (every GPU in fabric.groups reaches every other at
  p2p_gbps per direction per GPU), "bridge" (groups are bridged pairs), "host" (peer
  traffic crosses PCIe and host memory; no fast fabric), "shm" (CPU ranks: gloo over
  shared memory / loopback, the collective table applies).
- collective.allgather_busbw: [[message_bytes, bus_GBps], ...] (log-interpolated);
  collective.latency_us: fixed cost of one collective inside a node;
  collective.allreduce_small_us: a scalar all-reduce inside a node (the loss exchange,
  and on CUDA the write-back fence's token).
- network: inter-node figures (latency_us, gbps per node); unused on one node.
- compute.node_spread (optional, both kinds; DEFAULT_NODE_SPREAD when absent): one
  standard deviation of a node's step time over its mean, across the nodes of a job
  and its steps; every step waits for the slowest node (zoplan.sim.nodes).
- compute, CUDA (gpu_forward_terms): GEMM rates per precision, peak_tflops (fp16 and
  bf16: one tensor-core rate), tf32_tflops (fp32 with TF32 allowed, Workload.tf32) and
  fp32_tflops (fp32 without TF32), each reached at m / (m + m_half_tokens) for a GEMM of
  m token rows; overhead_us: the host time of one block forward's launches. Memory-bound
  work is bytes over device.hbm_gbps x hbm_fraction: the weights' floor of a forward, attention (the fused
  kernel's Q, K, V and output, when above its FLOPs), element-wise operators, and the zo
  passes. z: one generator launch per chunk of a tensor (Z_CHUNK_CUDA elements,
  zoplan.execrules.z_draw_calls), z_launch_us of host time each, plus z_ns_per_elem of
  device time per element (arithmetic-bound; the stochastic update's noise and kernels
  are priced with the same two figures, zoplan.sim.taskwork).
- compute, CPU: forward time of a block = overhead_us + max(flops / (peak_tflops *
  m / (m + m_half_tokens)), weight bytes / mem_gbps) (forward_terms); zo_ns_per_param:
  deferred update + perturbation cost per block parameter.
  peak_tflops is for one rank using all host cores; with k local
  ranks each gets peak / k * compute.rank_scaling (how well k ranks share the cores).
  compute.zo_rank_scaling (optional, CPU): the same for the zo maths (z generation
  scales with threads unlike GEMMs); defaults to compute.rank_scaling.
- compute, optional terms of measured CPU profiles (`zoplan profile`):
  attn_tflops prices attention FLOPs apart from the GEMMs (flash attention on the CPU
  runs well below the GEMM rate), and elem_ns the element-wise operators (norms, bias
  broadcasts, activations, the loss) per output element (zoplan.models *_elems_*);
  rope_overhead_us is what a Llama-family block forward (Llama, Qwen3) dispatches
  beyond an OPT block (more operators: RMS norms, gated MLP, rotary embedding).
  The z model replaces zo_ns_per_param: one z draw costs z_call_us (with a thread
  pool) + the busiest thread's chunks x z_chunk_us + its elements x z_ns_per_elem
  (z chunks are spread over a rank's
  cores // local_ranks threads, zoplan.execrules), times 1 / z_rank_scaling with several
  ranks; each perturb or update pass costs zo_pass_ns per element. With several ranks
  the attention and element-wise terms share the host by compute.mem_rank_scaling
  (memory-bound work shares cores worse than GEMMs), the GEMMs by rank_scaling.
  compute.rank_jitter (CPU and CUDA): how far the slowest of several ranks running at
  once is above their mean (zoplan.sim.costs.rank_factors spreads the ranks' compute
  speeds by it; on a GPU node the slowest GPU then paces every all-gather).
- CUDA, the priced physics (docs/costs.md), each optional and neutral where absent:
  device.hbm_fraction (memory-bound kernels reach this share of hbm_gbps);
  compute.launch_us (host time of one launch or event from Python: the host lane, with
  z_launch_us per z chunk and overhead_us per layer call); compute.overlap_slowdown (a
  GEMM and a memory-bound kernel on two streams each run this much slower while both
  run); host.sockets + host.socket_link_gbps (the store's pages spread over the
  sockets: a GPU reads (sockets - 1) / sockets of its bytes across the socket link);
  host.batch_us (a rank assembles its batch on the host before each step);
  host.disk_write_gbps (a snapshot's write; reported, not part of a step);
  compute.slow_node_fraction + slow_node_penalty (CPU too: the heavy tail of node
  speeds, zoplan.sim.nodes).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zoplan.errors import ZoError
from zoplan.execrules import (
    threads_per_rank,
    z_draw_calls,
    z_makespan,
    z_uses_pool,
)
from zoplan.hwcheck import PROFILE_SCHEMA_VERSION, Z_MODEL, validate
from zoplan.io import dumps_canonical, load_json, sha256_json
from zoplan.models import DTYPE_BYTES, LEARNED_POSITIONS
from zoplan.workload import HALF_DTYPES

GIB = 2**30

# A node's step-time spread where a profile gives none: an ASSUMPTION, not a
# measurement. Sinha et al. ("Not All GPUs Are Created Equal", SC'22, arXiv 2208.11035)
# measured an 8% average (22% at most) performance variation among the GPUs of one SKU
# in each of five large clusters: a spread from slowest to fastest, which over hundreds
# of samples is some 4-6 standard deviations, so about 1.5-2% one standard deviation.
# A node of 8 runs at its slowest GPU's pace (the all-gather of every block joins
# them), which narrows the spread between nodes; hosts, links and the network widen it.
# 2% (one standard deviation) is assumed; `zoplan calibrate --fit` on a trace of
# several nodes measures it (compute.node_spread).
DEFAULT_NODE_SPREAD = 0.02

# Bytes an element-wise operator moves per output element, in units of the compute
# dtype: it reads its input and writes its output (a binary one reads a second input:
# a floor). Memory-bound GPU work is bytes over HBM bandwidth (hardware.md, "Costs that
# are easy to miss on GPUs").
ELEM_RW = 2


def forward_terms(figures: dict, *, flops: float, attn_flops: float, elems: float,
                  tokens: int, family: str = "opt") -> tuple[float, float, float]:
    """(dispatch, GEMMs, attention + element-wise work) in seconds of one block forward
    on one CPU rank alone, from a profile's compute figures (or a fit's): overhead_us (and
    rope_overhead_us for a block of another family than OPT, where measured); the
    GEMM FLOPs at peak_tflops x m / (m + m_half_tokens); attention at attn_tflops and
    elem_ns per element-wise output where the figures have them (measured CPU
    profiles), else attention counts as GEMM FLOPs and element-wise work as free."""
    eff = tokens / (tokens + figures["m_half_tokens"]) if tokens > 0 else 1.0
    attn_rate = figures.get("attn_tflops")
    gemm = (flops if attn_rate else flops + attn_flops) / (figures["peak_tflops"] * 1e12 * eff)
    rest = attn_flops / (attn_rate * 1e12) if attn_rate else 0.0
    rest += elems * figures.get("elem_ns", 0.0) * 1e-9
    dispatch = figures["overhead_us"] + (figures.get("rope_overhead_us", 0.0)
                                         if family not in LEARNED_POSITIONS else 0.0)
    return dispatch * 1e-6, gemm, rest


def gpu_forward_terms(figures: dict, *, rate_tflops: float, hbm_gbps: float, flops: float,
                      attn_flops: float, attn_bytes: float, elem_bytes: float,
                      weight_bytes: float, tokens: int) -> tuple[float, float, float]:
    """(launches, GEMMs, attention + element-wise work) in seconds of one forward on a
    GPU, a roofline per part: the GEMMs at the precision's rate x m / (m + m_half_tokens)
    (m token rows), never faster than reading the weights at HBM bandwidth; attention's
    FLOPs at the same rate (the fused kernel runs on the tensor cores), never faster
    than its bytes at HBM bandwidth; element-wise operators are memory-bound (bytes over
    HBM bandwidth). The launches cost overhead_us (figures: the compute section, or a
    fit's figures with m_half_tokens and overhead_us)."""
    eff = tokens / (tokens + figures["m_half_tokens"]) if tokens > 0 else 1.0
    rate, hbm = rate_tflops * 1e12 * eff, hbm_gbps * 1e9
    gemm = max(flops / rate, weight_bytes / hbm)
    rest = max(attn_flops / rate, attn_bytes / hbm) + elem_bytes / hbm
    return figures["overhead_us"] * 1e-6, gemm, rest


def gpu_block_bytes(*, attn_dim: int, kv_dim: int, elems_per_token: float, tokens: int,
                    dtype_bytes: int) -> tuple[float, float]:
    """(attention, element-wise) HBM bytes of one block forward over `tokens` tokens on a
    GPU: the fused attention kernel (SDPA, zoexec.model.families' default) reads Q, K and V and
    writes its output once; each element-wise output moves ELEM_RW dtype words."""
    attn = tokens * (2 * attn_dim + 2 * kv_dim) * dtype_bytes
    return float(attn), tokens * elems_per_token * ELEM_RW * dtype_bytes


@dataclass(frozen=True, kw_only=True)
class HardwareProfile:
    """A validated profile. Sections are kept as plain dicts of figures."""

    name: str
    gpus_per_node: int
    device: dict
    host: dict
    pcie: dict
    fabric: dict
    collective: dict
    network: dict
    compute: dict
    sources: dict
    extra: dict = field(default_factory=dict, compare=False)

    # ---- derived figures (properties, never stored twice) ------------------------
    @property
    def is_cpu(self) -> bool:
        return self.device["kind"] == "cpu"

    @property
    def node_spread(self) -> float:
        """A node's step-time spread (compute.node_spread, else DEFAULT_NODE_SPREAD)."""
        return float(self.compute.get("node_spread", DEFAULT_NODE_SPREAD))

    @property
    def device_word(self) -> str:
        """What a device of this profile is called in output: "GPU" or "CPU rank"."""
        return "CPU rank" if self.is_cpu else "GPU"

    @property
    def device_memory_bytes(self) -> float:
        return (self.device["memory_gib"] - self.device["reserved_gib"]) * GIB

    @property
    def host_memory_bytes(self) -> float:
        return self.host["memory_gib"] * GIB

    @property
    def fabric_groups(self) -> list[list[int]]:
        return self.fabric.get("groups") or [[r] for r in range(self.gpus_per_node)]

    def fabric_group_of(self, local_rank: int) -> list[int]:
        for group in self.fabric_groups:
            if local_rank in group:
                return group
        return [local_rank]

    def max_slices(self, local_ranks: int) -> int:
        """Largest slice group the fast fabric allows among the first local ranks."""
        if self.fabric["kind"] in ("host", "shm"):
            return local_ranks
        sizes = [len([r for r in g if r < local_ranks]) for g in self.fabric_groups]
        return max([s for s in sizes if s] or [1])

    def allgather_busbw_gbps(self, message_bytes: float) -> float:
        """Bus bandwidth for an all-gather whose total output is message_bytes."""
        return interpolate_log(self.collective["allgather_busbw"], message_bytes)

    def gemm_tflops(self, compute_dtype: str = "fp32", tf32: bool = True) -> float:
        """The GEMM rate of the workload's precision: CPU profiles have one
        (peak_tflops); on GPUs fp16 and bf16 run at peak_tflops, fp32 at tf32_tflops
        when TF32 is allowed (Workload.tf32), else at fp32_tflops."""
        c = self.compute
        if self.is_cpu or compute_dtype in HALF_DTYPES:
            return c["peak_tflops"]
        return c["tf32_tflops"] if tf32 else c["fp32_tflops"]

    def gemm_rate_key(self, compute_dtype: str = "fp32", tf32: bool = True) -> str:
        """The compute figure gemm_tflops reads (what a refit scales)."""
        if self.is_cpu or compute_dtype in HALF_DTYPES:
            return "peak_tflops"
        return "tf32_tflops" if tf32 else "fp32_tflops"

    def forward_time_s(self, *, flops: float, weight_bytes: float, tokens: int,
                       local_ranks: int = 1, attn_flops: float = 0.0,
                       elems: float = 0.0, overhead_share: float = 1.0,
                       family: str = "opt", attn_bytes: float = 0.0,
                       compute_dtype: str = "fp32", tf32: bool = True) -> float:
        """One forward call: `flops` of GEMMs over `tokens` tokens, `attn_flops` of
        attention and `elems` element-wise outputs. CPU (forward_terms): attention and
        element-wise work priced on their own where the profile has compute.attn_tflops
        / compute.elem_ns, else attention counts as GEMM FLOPs and element-wise work as
        free. GPU (gpu_forward_terms): the precision's GEMM rate, attention and
        element-wise bytes (`attn_bytes`, elems x ELEM_RW words) at HBM bandwidth.
        `overhead_share`: the call's operators as a share of a block forward's
        (compute.overhead_us is the dispatch cost of one block forward)."""
        c = self.compute
        if not self.is_cpu:   # the dispatch is host time (forward_issue_s, the host lane)
            dsize = DTYPE_BYTES[compute_dtype]
            _, gemm, rest = gpu_forward_terms(
                c, rate_tflops=self.gemm_tflops(compute_dtype, tf32),
                hbm_gbps=self.hbm_gbps, flops=flops, attn_flops=attn_flops,
                attn_bytes=attn_bytes, elem_bytes=elems * ELEM_RW * dsize,
                weight_bytes=weight_bytes, tokens=tokens)
            return gemm + rest
        share = self.compute_share(local_ranks)
        mem_share = self.compute_share(local_ranks, key="mem_rank_scaling")
        dispatch, gemm, rest = forward_terms(c, flops=flops, attn_flops=attn_flops,
                                             elems=elems, tokens=tokens, family=family)
        t = max(gemm / share, weight_bytes / (c["mem_gbps"] * 1e9)) + rest / mem_share
        return overhead_share * dispatch + t

    # ---- the zo maths: z draws and element-wise passes --------------------------------
    @property
    def has_z_model(self) -> bool:
        """Whether a CPU profile prices the zo maths per z draw and pass (measured by
        `zoplan profile`) rather than by the one figure compute.zo_ns_per_param."""
        return self.is_cpu and "z_ns_per_elem" in self.compute

    @property
    def update_figures(self) -> tuple[str, ...]:
        """The compute figures that price the update task (what a refit scales)."""
        if not self.is_cpu:
            return ("z_launch_us", "z_ns_per_elem")
        return tuple(p.split(".")[1] for p in Z_MODEL) if self.has_z_model else ("zo_ns_per_param",)

    def zo_time_s(self, num_params: int, local_ranks: int = 1) -> float:
        """The update task's zo maths (2 z draws + 2 passes) by compute.zo_ns_per_param
        (CPU profiles without the z model)."""
        share = self.compute_share(local_ranks, key="zo_rank_scaling")
        return num_params * self.compute["zo_ns_per_param"] * 1e-9 / share

    def z_time_s(self, tensor_numels: list[int], local_ranks: int = 1,
                 elem_bytes: int = 4) -> float:
        """One z draw over these tensors. GPU: the device's time, z_ns_per_elem per
        element (Philox normal draws are arithmetic-bound: hardware.md), never below
        writing `elem_bytes` per element at the achieved HBM bandwidth; its launches are
        host time (z_issue_s). CPU
        (has_z_model): the rank's threads split the chunks (zoplan.execrules.balance), so
        the busiest thread sets the time; handing the chunks to a thread pool costs
        z_call_us (one thread draws them itself)."""
        c = self.compute
        if not self.is_cpu:
            return max(sum(tensor_numels) * c["z_ns_per_elem"] * 1e-9,
                       self.hbm_time_s(sum(tensor_numels) * elem_bytes))
        threads = threads_per_rank(self.host["cores"], local_ranks)
        elems, chunks = z_makespan(tensor_numels, threads)
        scale = c.get("z_rank_scaling", 1.0) if local_ranks > 1 else 1.0
        call = c["z_call_us"] * 1e-6 if z_uses_pool(tensor_numels, threads) else 0.0
        return (call + chunks * c.get("z_chunk_us", 0.0) * 1e-6
                + elems * c["z_ns_per_elem"] * 1e-9 / scale)

    def pass_time_s(self, num_elems: float, local_ranks: int = 1) -> float:
        """One element-wise pass of the zo maths (perturb or update) over `num_elems`,
        on a CPU profile with the z model (compute.zo_pass_ns per element)."""
        share = self.compute_share(local_ranks, key="mem_rank_scaling")
        return num_elems * self.compute["zo_pass_ns"] * 1e-9 / share

    def z_issue_s(self, tensor_numels: list[int]) -> float:
        """Host time to issue one z draw on a GPU: one seeded generator launch per chunk
        of Z_CHUNK_CUDA elements of each tensor (zoplan.execrules.z_draw_calls) at
        compute.z_launch_us."""
        return z_draw_calls(tensor_numels, "cuda") * self.compute["z_launch_us"] * 1e-6

    @property
    def hbm_gbps(self) -> float:
        """What memory-bound GPU kernels reach: device.hbm_gbps x device.hbm_fraction
        (1 where the profile has none: a measured hbm_gbps is already achieved)."""
        return self.device["hbm_gbps"] * self.device.get("hbm_fraction", 1.0)

    def hbm_time_s(self, num_bytes: float) -> float:
        """Memory-bound GPU work: bytes over the achieved HBM bandwidth (hbm_gbps)."""
        return num_bytes / (self.hbm_gbps * 1e9)

    # ---- the host lane and the shared GPU (CUDA; neutral where a profile has none) ----
    @property
    def launch_s(self) -> float:
        """Host time of one kernel launch or CUDA event record from Python
        (compute.launch_us; 0 on CPU profiles and where absent)."""
        return self.compute.get("launch_us", 0.0) * 1e-6 if not self.is_cpu else 0.0

    def forward_issue_s(self, overhead_share: float = 1.0) -> float:
        """Host time to call one block forward (its share for embed and head) on a GPU:
        compute.overhead_us, the launches of one HF layer call."""
        return overhead_share * self.compute["overhead_us"] * 1e-6

    @property
    def overlap_slowdown(self) -> float:
        """How much a GEMM and a memory-bound kernel on another stream slow each other
        while both run (compute.overlap_slowdown; 0 where absent)."""
        return self.compute.get("overlap_slowdown", 0.0) if not self.is_cpu else 0.0

    @property
    def remote_share(self) -> float:
        """Share of the node store's bytes a GPU reads from the other socket(s): the
        store's pages spread over host.sockets sockets (0 without host.socket_link_gbps)."""
        if "socket_link_gbps" not in self.host:
            return 0.0
        return (self.host["sockets"] - 1) / self.host["sockets"]

    # ---- host links -------------------------------------------------------------------
    @property
    def duplex_gbps(self) -> float:
        """Both directions of one rank's host link together: pcie.duplex_gbps (CPU), or
        on GPUs the two duplex figures' sum, never below one direction alone (it bounds
        any mix of the two directions)."""
        p = self.pcie
        if self.is_cpu:
            return p["duplex_gbps"]
        return max(p["h2d_duplex_gbps"] + p["d2h_duplex_gbps"], p["h2d_gbps"], p["d2h_gbps"])

    def duplex_rates_gbps(self, link: str) -> tuple[float, float] | None:
        """(H2D, D2H) rates of a GPU's link ("gpu") or a switch uplink ("uplink") while
        both directions run; None where the profile has no such figures (CPU ranks copy
        one way at a time; uplinks without uplink_*_duplex_gbps)."""
        p = self.pcie
        if self.is_cpu:
            return None
        if link == "gpu":
            return p["h2d_duplex_gbps"], p["d2h_duplex_gbps"]
        if "uplink_h2d_duplex_gbps" in p:
            return p["uplink_h2d_duplex_gbps"], p["uplink_d2h_duplex_gbps"]
        return None

    def compute_share(self, local_ranks: int, key: str = "rank_scaling") -> float:
        """Fraction of the device's compute one rank gets (1 on GPUs); `key` names the
        scaling figure (compute.zo_rank_scaling falls back to compute.rank_scaling)."""
        if not self.is_cpu or local_ranks <= 1:
            return 1.0
        return self.compute.get(key, self.compute["rank_scaling"]) / local_ranks

    @property
    def sha256(self) -> str:
        return sha256_json(self.to_dict())

    def to_dict(self) -> dict:
        data = {"schema_version": PROFILE_SCHEMA_VERSION, "name": self.name,
                "gpus_per_node": self.gpus_per_node, "device": self.device, "host": self.host, "pcie": self.pcie,
                "fabric": self.fabric, "collective": self.collective,
                "network": self.network, "compute": self.compute, "sources": self.sources}
        data.update(self.extra)
        return data

    def to_json(self) -> str:
        return dumps_canonical(self.to_dict())

    @classmethod
    def from_dict(cls, data: Any, *, origin: str = "profile") -> HardwareProfile:
        return cls(**validate(data, origin))


def interpolate_log(table: list, x: float) -> float:
    """Piecewise-linear interpolation of y over log(x); clamped at the ends."""
    xs = [float(p[0]) for p in table]
    ys = [float(p[1]) for p in table]
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = bisect.bisect_right(xs, x)
    lx0, lx1 = math.log(xs[i - 1]), math.log(xs[i])
    t = (math.log(x) - lx0) / (lx1 - lx0)
    return ys[i - 1] + t * (ys[i] - ys[i - 1])



# ---- loading ------------------------------------------------------------------------
PROFILES_DIR = Path(__file__).resolve().parent / "hwprofiles"   # hwprofiles/ in the repository
DEFAULT_PROFILE = "dgx-a100-80gb"


def shipped_profiles() -> dict[str, Path]:
    return {p.stem: p for p in sorted(PROFILES_DIR.glob("*.json"))}


GUESSED_PROFILES = ("cpu",)   # shipped profiles of figures assumed, none measured


def is_shipped_guess(profile: HardwareProfile) -> bool:
    """Whether `profile` is a shipped profile of assumed figures (the `cpu` one), byte
    for byte: planning on it needs a warning (a measured profile replaces it)."""
    path = shipped_profiles().get(profile.name)
    if profile.name not in GUESSED_PROFILES or path is None:
        return False
    return profile.sha256 == load_profile(path).sha256


def load_profile(name_or_path: str | Path) -> HardwareProfile:
    """A shipped profile name (see `zoplan profiles`) or a path to a profile JSON."""
    path = Path(name_or_path)
    shipped = shipped_profiles()
    if str(name_or_path) in shipped:
        path = shipped[str(name_or_path)]
    elif not path.exists():
        names = ", ".join(shipped) or "none"
        raise ZoError(f"unknown profile {str(name_or_path)!r}: no such file and not a "
                      f"shipped profile ({names})")
    return HardwareProfile.from_dict(load_json(path, what="profile"), origin=f"profile {path}")
