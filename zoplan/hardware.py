"""HardwareProfile: the machine the planner simulates, loaded from JSON and validated.

A profile describes ONE node type (a cluster is `nodes` copies of it joined by a
network; how many comes from the job, `zoplan optimize --gpus`, never from the
profile: a `max_nodes` key of older profiles is read and ignored). Every figure is
data with its unit in the name and a source note in `sources` (dotted path -> note,
"[S]" spec, "[M]" measured, "[D]" derived); shipped
profiles live in hwprofiles/, `zoplan profile` writes measured ones. Some figures belong
to one device kind only (zoplan.hwcheck: _REQUIRED_BY_KIND, _OPTIONAL_BY_KIND); a figure of
the other kind is refused. The sections are typed (zoplan.hwsections: a frozen dataclass
each), and only zoplan.pricing reads them: HardwareProfile.figures() refuses any other
module of the planner, whatever the spelling (FIGURE_READERS; docs/code.md).

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

import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from zoplan.errors import ZoError
from zoplan.hwcheck import PROFILE_SCHEMA_VERSION, validate
from zoplan.hwcheck import Z_MODEL as Z_MODEL  # the CPU z model's figures, for pricing
from zoplan.hwsections import SECTIONS, Figures, Groups
from zoplan.io import dumps_canonical, load_json, sha256_json
from zoplan.origins import Origin, check_origins, figure_origins

GIB = 2**30
# Who may read a profile's figures (the modules of the planner under these names; code
# outside the planner, tests and benchmarks, may too): its typed figures, only the
# prices; its JSON form (to_dict, to_json), the modules that write, edit or show the file.
FIGURE_READERS = ("zoplan.pricing",)
DATA_READERS = ("zoplan.hardware", "zoplan.pricing", "zoplan.profiling", "zoplan.calibrate",
                "zoplan.search.sensitivity", "zoplan.views")
T = TypeVar("T")


class FigureReadError(PermissionError):
    """A module of the planner outside FIGURE_READERS (DATA_READERS) read a profile's
    figures: a cost term outside zoplan.pricing, a programmer's error."""


def _gate(value: Callable[[], T], readers: tuple[str, ...], what: str) -> Callable[[], T]:
    """`value()` for a caller in `readers` (or outside the planner); FigureReadError for
    any other module of the planner, however it reached the reader (attribute, getattr,
    a helper of its own): the check is on the calling frame's module (each module's
    answer kept: pricing reads a figure some ten thousand times a search)."""
    allowed = _ALLOWED.setdefault(readers, {})

    def read() -> T:
        caller = str(sys._getframe(1).f_globals.get("__name__", ""))
        ok = allowed.get(caller)
        if ok is None:
            ok = allowed[caller] = may_read(caller, readers)
        if not ok:
            raise FigureReadError(f"{caller} read a hardware profile's {what}: only "
                                  f"{', '.join(readers)} may (docs/code.md, the layers)")
        return value()
    return read


_ALLOWED: dict[tuple[str, ...], dict[str, bool]] = {}   # readers -> module -> may it read


def may_read(module: str, readers: tuple[str, ...]) -> bool:
    """Whether `module` may read what `readers` may: one of them or under one (a
    dotted prefix: a module named "pricing" plus more letters is not under pricing), or
    a module outside the planner (tests, benchmarks, scripts)."""
    planner = module == "zoplan" or module.startswith("zoplan.")
    return not planner or any(module == r or module.startswith(r + ".") for r in readers)


class HardwareProfile:
    """A validated profile: data, no prices (zoplan.pricing prices its figures).

    Public: its name, node size, source notes and the structural facts every layer
    needs (the device kind, memory to fit in, which ranks share a switch or a fabric).
    Its figures, typed (zoplan.hwsections.Figures), are `figures()`, which only
    zoplan.pricing may call; its JSON form `to_dict()` and `to_json()` and its extra
    top-level keys `extra()` (measurements, provenance, the speed check), only
    DATA_READERS: any other module of the planner that calls them, by whatever
    spelling, gets a FigureReadError."""

    name: str
    gpus_per_node: int
    sources: dict[str, Any]
    extra: Callable[[], dict[str, Any]]   # the optional top-level keys (measurements, ...)
    figures: Callable[[], Figures]
    to_dict: Callable[[], dict[str, Any]]
    to_json: Callable[[], str]

    def __init__(self, *, name: str, gpus_per_node: int, figures: Figures,
                 sources: dict[str, Any], extra: dict[str, Any] | None = None) -> None:
        extra = dict(extra or {})
        data = _data_of(name, gpus_per_node, figures, sources, extra)
        text = dumps_canonical(data)
        device, fabric = figures.device, figures.fabric
        for key, value in (
                ("name", name), ("gpus_per_node", gpus_per_node), ("sources", sources),
                ("extra", _gate(lambda: extra, DATA_READERS, "extra keys (measurements)")),
                ("device_kind", device.kind),
                ("device_memory_gib", device.memory_gib), ("reserved_gib", device.reserved_gib),
                ("concurrent_engines", device.concurrent_engines is not False),
                ("host_memory_gib", figures.host.memory_gib), ("fabric_kind", fabric.kind),
                ("switch_groups", _lists(figures.pcie.switch_groups)),
                ("_fabric_groups", _lists(fabric.groups)),
                ("_hash", hash(text)),
                ("_same", sha256_json({k: v for k, v in data.items() if k not in extra})),
                ("_sha256", _once(lambda: sha256_json(data))),
                ("_origins", _once(lambda: figure_origins(figures.to_sections(), sources,
                                                          extra.get("origins")))),
                ("_with", lambda changes: _changed(self, figures, extra, changes)),
                ("figures", _gate(lambda: figures, FIGURE_READERS, "figures")),
                ("to_dict", _gate(lambda: _data_of(name, gpus_per_node, figures, sources, extra),
                                  DATA_READERS, "figures (to_dict)")),
                ("to_json", _gate(lambda: text, DATA_READERS, "figures (to_json)"))):
            object.__setattr__(self, key, value)

    def __setattr__(self, key: str, value: object) -> None:
        raise AttributeError(f"a HardwareProfile is frozen: {key} cannot be set")

    def __eq__(self, other: object) -> bool:
        """The same figures, name, node size and notes (extra keys apart)."""
        if not isinstance(other, HardwareProfile):
            return NotImplemented
        return bool(self._same == other._same)

    def __hash__(self) -> int:
        """By content (its canonical JSON, hashed once): the planner's caches key on it."""
        return int(self._hash)

    def __repr__(self) -> str:
        return f"HardwareProfile(name={self.name!r}, gpus_per_node={self.gpus_per_node})"

    # ---- the structure (set once, in __init__) ----------------------------------------
    device_kind: str
    device_memory_gib: float
    reserved_gib: float
    concurrent_engines: bool          # False: a rank's tasks run one at a time
    host_memory_gib: float
    fabric_kind: str
    switch_groups: list[list[int]]    # ranks sharing one switch uplink (none: [])
    _fabric_groups: list[list[int]]
    _hash: int
    _same: str
    _sha256: Callable[[], str]
    _origins: Callable[[], dict[str, Origin]]
    _with: Callable[[Mapping[str, float]], HardwareProfile]

    # ---- derived facts (properties, never stored twice) -------------------------------
    @property
    def is_cpu(self) -> bool:
        return self.device_kind == "cpu"

    @property
    def device_word(self) -> str:
        """What a device of this profile is called in output: "GPU" or "CPU rank"."""
        return "CPU rank" if self.is_cpu else "GPU"

    @property
    def device_memory_bytes(self) -> float:
        return float((self.device_memory_gib - self.reserved_gib) * GIB)

    @property
    def host_memory_bytes(self) -> float:
        return float(self.host_memory_gib * GIB)

    @property
    def fabric_groups(self) -> list[list[int]]:
        return self._fabric_groups or [[r] for r in range(self.gpus_per_node)]

    def fabric_group_of(self, local_rank: int) -> list[int]:
        for group in self.fabric_groups:
            if local_rank in group:
                return group
        return [local_rank]

    def max_slices(self, local_ranks: int) -> int:
        """Largest slice group the fast fabric allows among the first local ranks."""
        if self.fabric_kind in ("host", "shm"):
            return local_ranks
        sizes = [len([r for r in g if r < local_ranks]) for g in self.fabric_groups]
        return max([s for s in sizes if s] or [1])

    @property
    def sha256(self) -> str:
        return self._sha256()

    @classmethod
    def from_dict(cls, data: Any, *, origin: str = "profile") -> HardwareProfile:
        fields = validate(data, origin)
        check_origins(fields["extra"].get("origins"), fields["figures"].to_sections(), origin)
        return cls(**fields)

    def with_figures(self, changes: Mapping[str, float]) -> HardwareProfile:
        """This profile with these figures ("section.key" -> value) changed, unchecked:
        the caller checks what it changes (zoplan.pricing.memory.with_device_memory)."""
        return self._with(changes)

    # ---- where each figure comes from (zoplan.origins) --------------------------------
    @property
    def origins(self) -> dict[str, Origin]:
        """Every figure's origin: measured, public or assumed (zoplan.origins)."""
        return self._origins()

    def assumed_figures(self) -> list[str]:
        """The figures of this profile that are assumed, in a fixed order."""
        return [path for path, o in self.origins.items() if o.kind == "assumed"]


def _once(make: Callable[[], T]) -> Callable[[], T]:
    """`make()`, computed on the first call and kept."""
    kept: list[T] = []

    def get() -> T:
        if not kept:
            kept.append(make())
        return kept[0]
    return get


def _changed(profile: HardwareProfile, figures: Figures, extra: dict[str, Any],
             changes: Mapping[str, float]) -> HardwareProfile:
    sections = figures.to_sections()
    for path, value in changes.items():
        section, key = path.split(".")
        sections[section][key] = value
    return HardwareProfile(name=profile.name, gpus_per_node=profile.gpus_per_node,
                           figures=Figures.from_sections(sections), sources=profile.sources,
                           extra=extra)


def _lists(groups: Groups | None) -> list[list[int]]:
    return [list(g) for g in groups or ()]


def _data_of(name: str, gpus_per_node: int, figures: Figures, sources: dict[str, Any],
             extra: dict[str, Any]) -> dict[str, Any]:
    """A profile's JSON form (a fresh copy of every mutable part)."""
    data: dict[str, Any] = {"schema_version": PROFILE_SCHEMA_VERSION, "name": name,
                            "gpus_per_node": gpus_per_node}
    data.update(figures.to_sections())
    data["sources"] = dict(sources)
    data.update(extra)
    assert tuple(k for k in data if k in SECTIONS) == SECTIONS
    return data


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
