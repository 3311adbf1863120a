"""HardwareProfile: the machine the planner simulates, loaded from JSON and validated.

A profile describes ONE node type (a cluster is `nodes` copies of it joined by a
network; how many comes from the job, `zoplan optimize --gpus`, never from the
profile: a `max_nodes` key of older profiles is read and ignored). Every figure is
data with its unit in the name and a source note in `sources` (dotted path -> note,
"[S]" spec, "[M]" measured, "[D]" derived); shipped
profiles live in hwprofiles/, `zoplan profile` writes measured ones. Some figures belong
to one device kind only (zoplan.hwcheck: _REQUIRED_BY_KIND, _OPTIONAL_BY_KIND); a figure of
the other kind is refused.

What each figure means (units: GB/s = 1e9 bytes/s, one direction); what it costs is
zoplan.pricing's (a function per term, named below):
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
  and its steps; every step waits for the slowest node (zoplan.pricing.stragglers).
- compute, CUDA (zoplan.pricing.compute.gpu_forward_terms): GEMM rates per precision, peak_tflops (fp16 and
  bf16: one tensor-core rate), tf32_tflops (fp32 with TF32 allowed, Workload.tf32) and
  fp32_tflops (fp32 without TF32), each reached at m / (m + m_half_tokens) for a GEMM of
  m token rows; overhead_us: the host time of one block forward's launches. Memory-bound
  work is bytes over device.hbm_gbps x hbm_fraction: the weights' floor of a forward, attention (the fused
  kernel's Q, K, V and output, when above its FLOPs), element-wise operators, and the zo
  passes. z: one generator launch per chunk of a tensor (Z_CHUNK_CUDA elements,
  zoplan.execrules.z_draw_calls), z_launch_us of host time each, plus z_ns_per_elem of
  device time per element (arithmetic-bound; the stochastic update's noise and kernels
  are priced with the same two figures, zoplan.pricing.zo).
- compute, CPU: forward time of a block = overhead_us + max(flops / (peak_tflops *
  m / (m + m_half_tokens)), weight bytes / mem_gbps) (zoplan.pricing.compute.cpu_forward_terms); zo_ns_per_param:
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
  once is above their mean (zoplan.pricing.stragglers.rank_factors spreads the ranks' compute
  speeds by it; on a GPU node the slowest GPU then paces every all-gather).
- CUDA, the priced physics (docs/costs.md), each optional and neutral where absent:
  device.hbm_fraction (memory-bound kernels reach this share of hbm_gbps);
  device.update16_gbps, perturb16_gbps, update32_gbps, perturb32_gbps (all four or
  none: what zoexec's apply_update and perturb_into reached in the profile stage with a
  16-bit and an fp32 store, 16-bit z; the resident parts' passes are priced at them,
  zoplan.pricing.schedules.resident_pass);
  compute.launch_us (host time of one launch or event from Python: the host lane, with
  z_launch_us per z chunk and overhead_us per layer call); compute.overlap_slowdown (an
  all-gather's kernels and the compute stream each run this much slower while both
  run), compute.overlap_gemm_slowdown and overlap_side_slowdown (the compute stream
  beside the slice update's passes, and those passes beside the compute stream:
  zoplan.pricing.overlap); host.sockets + host.socket_link_gbps (the store's pages spread over the
  sockets: a GPU reads (sockets - 1) / sockets of its bytes across the socket link);
  host.batch_us (a rank assembles its batch on the host before each step);
  host.disk_write_gbps (a snapshot's write; reported, not part of a step);
  compute.slow_node_fraction + slow_node_penalty (CPU too: the heavy tail of node
  speeds, zoplan.pricing.stragglers).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zoplan.errors import ZoError
from zoplan.hwcheck import PROFILE_SCHEMA_VERSION, validate
from zoplan.hwcheck import Z_MODEL as Z_MODEL  # the CPU z model's figures, for pricing
from zoplan.io import dumps_canonical, load_json, sha256_json
from zoplan.origins import Origin, check_origins, figure_origins

GIB = 2**30
SECTIONS = ("device", "host", "pcie", "fabric", "collective", "network", "compute")


@dataclass(frozen=True, kw_only=True)
class HardwareProfile:
    """A validated profile: data, no prices (zoplan.pricing prices its figures).
    Sections are kept as plain dicts of figures."""

    name: str
    gpus_per_node: int
    device: dict[str, Any]
    host: dict[str, Any]
    pcie: dict[str, Any]
    fabric: dict[str, Any]
    collective: dict[str, Any]
    network: dict[str, Any]
    compute: dict[str, Any]
    sources: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    # ---- derived facts (properties, never stored twice) -------------------------------
    @property
    def is_cpu(self) -> bool:
        return bool(self.device["kind"] == "cpu")

    @property
    def device_word(self) -> str:
        """What a device of this profile is called in output: "GPU" or "CPU rank"."""
        return "CPU rank" if self.is_cpu else "GPU"

    @property
    def device_memory_bytes(self) -> float:
        return float((self.device["memory_gib"] - self.device["reserved_gib"]) * GIB)

    @property
    def host_memory_bytes(self) -> float:
        return float(self.host["memory_gib"] * GIB)

    @property
    def fabric_groups(self) -> list[list[int]]:
        groups: list[list[int]] = self.fabric.get("groups") or [[r] for r in range(self.gpus_per_node)]
        return groups

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

    def __hash__(self) -> int:
        """By content (its canonical JSON, hashed once): the planner's caches key on it."""
        cached: int | None = self.__dict__.get("_hash")
        if cached is None:
            cached = hash(self.to_json())
            object.__setattr__(self, "_hash", cached)
        return cached

    @property
    def sha256(self) -> str:
        return sha256_json(self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"schema_version": PROFILE_SCHEMA_VERSION, "name": self.name,
                                "gpus_per_node": self.gpus_per_node}
        data.update({section: getattr(self, section) for section in SECTIONS})
        data["sources"] = self.sources
        data.update(self.extra)
        return data

    def to_json(self) -> str:
        return dumps_canonical(self.to_dict())

    @classmethod
    def from_dict(cls, data: Any, *, origin: str = "profile") -> HardwareProfile:
        fields = validate(data, origin)
        check_origins(fields["extra"].get("origins"), fields, origin)
        return cls(**fields)

    # ---- where each figure comes from (zoplan.origins) --------------------------------
    @property
    def origins(self) -> dict[str, Origin]:
        """Every figure's origin: measured, public or assumed (zoplan.origins)."""
        sections = {section: getattr(self, section) for section in SECTIONS}
        return figure_origins(sections, self.sources, self.extra.get("origins"))

    def assumed_figures(self) -> list[str]:
        """The figures of this profile that are assumed, in a fixed order."""
        return [path for path, o in self.origins.items() if o.kind == "assumed"]


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
