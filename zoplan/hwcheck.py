"""The schema of a hardware profile and its validation: which figures each section and
device kind has, each figure's plausible range by its unit, the checks of groups, the
collective table, the speed check and the source notes. zoplan.hardware builds a
HardwareProfile from what `validate` returns.
"""

from __future__ import annotations

import math
from typing import Any

from zoplan.errors import ZoError
from zoplan.execrules import SPEED_CHECK_KINDS
from zoplan.hwsections import Figures, field_names

PROFILE_SCHEMA_VERSION = 1
DEVICE_KINDS = ("cuda", "cpu")
FABRIC_KINDS = ("nvswitch", "bridge", "host", "shm")

# CUDA: what zoexec's zo passes reached in the profile stage, by pass and store (16-bit or
# fp32 store, 16-bit z): the resident parts' passes are priced at them
# (zoplan.pricing.schedules.resident_pass); all four or none.
STAGE_PASSES = ("device.update16_gbps", "device.perturb16_gbps", "device.update32_gbps",
                "device.perturb32_gbps")
# Section -> the numeric fields every profile must have (all > 0 unless listed in NONNEG).
_REQUIRED = {
    "device": ("memory_gib", "reserved_gib"),
    "host": ("memory_gib", "mem_bw_gbps", "cores"),
    "pcie": ("h2d_gbps", "d2h_gbps", "switch_uplink_gbps"),
    "fabric": ("p2p_gbps",),
    "collective": ("latency_us", "allreduce_small_us"),
    "network": ("gbps", "latency_us"),
    "compute": ("peak_tflops", "m_half_tokens", "overhead_us", "rank_scaling"),
}
# Figures of one device kind only: required, and optional (checked when present). A
# profile of the other kind must not carry them (it would be silently ignored).
_REQUIRED_BY_KIND = {
    "cpu": ("pcie.duplex_gbps", "compute.mem_gbps", "compute.zo_ns_per_param"),
    "cuda": ("device.hbm_gbps", "pcie.h2d_duplex_gbps", "pcie.d2h_duplex_gbps",
             "compute.tf32_tflops", "compute.fp32_tflops", "compute.z_launch_us",
             "compute.z_ns_per_elem"),
}
_OPTIONAL_BY_KIND = {
    "cpu": ("compute.zo_rank_scaling", "compute.attn_tflops", "compute.elem_ns",
            "compute.z_ns_per_elem", "compute.z_call_us", "compute.zo_pass_ns",
            "compute.z_rank_scaling", "compute.mem_rank_scaling", "compute.z_chunk_us",
            "compute.rank_jitter", "compute.rope_overhead_us", "compute.node_spread",
            "compute.slow_node_fraction", "compute.slow_node_penalty"),
    "cuda": ("pcie.uplink_h2d_duplex_gbps", "pcie.uplink_d2h_duplex_gbps",
             "compute.node_spread", "compute.rank_jitter", "compute.slow_node_fraction",
             "compute.slow_node_penalty", "device.hbm_fraction", "compute.launch_us",
             "compute.overlap_slowdown", "compute.overlap_gemm_slowdown",
             "compute.overlap_side_slowdown", "host.sockets", "host.socket_link_gbps", "host.batch_us",
             "host.disk_write_gbps", "device.context_gib", "device.allocator_slack_gib",
             "pcie.pageable_h2d_gbps", "pcie.pageable_d2h_gbps") + STAGE_PASSES,
}
_NONNEG = {"device.reserved_gib", "device.context_gib", "device.allocator_slack_gib", "compute.overhead_us", "compute.m_half_tokens",
           "compute.elem_ns", "compute.rope_overhead_us", "compute.z_call_us", "compute.z_chunk_us",
           "compute.rank_jitter", "compute.z_launch_us", "compute.node_spread",
           "compute.launch_us", "compute.overlap_slowdown", "compute.overlap_gemm_slowdown",
           "compute.overlap_side_slowdown", "host.batch_us",
           "compute.slow_node_fraction", "compute.slow_node_penalty"}
# The GPU figures of the priced physics (docs/costs.md): each, where a profile has it,
# must say where it came from (a source note of its own).
NEEDS_SOURCE = ("device.hbm_fraction", "compute.launch_us", "compute.overlap_slowdown",
                "compute.overlap_gemm_slowdown", "compute.overlap_side_slowdown",
                "host.sockets", "host.socket_link_gbps",
                "host.batch_us", "host.disk_write_gbps", "compute.slow_node_fraction",
                "compute.slow_node_penalty", "device.context_gib", "device.allocator_slack_gib",
                "pcie.pageable_h2d_gbps", "pcie.pageable_d2h_gbps") + STAGE_PASSES
_OPTIONAL_TOP = {"description", "provenance", "measurements", "notes", "speed_check",
                 "origins"}   # origins: zoplan.origins (checked there)
Z_MODEL = ("compute.z_ns_per_elem", "compute.z_call_us", "compute.zo_pass_ns")   # CPU
_SLOW_NODES = ("compute.slow_node_fraction", "compute.slow_node_penalty")
_TOGETHER: dict[str, list[tuple[str, ...]]] = {
    "cuda": [("pcie.uplink_h2d_duplex_gbps", "pcie.uplink_d2h_duplex_gbps"),
             ("pcie.pageable_h2d_gbps", "pcie.pageable_d2h_gbps"),
             ("host.sockets", "host.socket_link_gbps"), _SLOW_NODES, STAGE_PASSES],
    "cpu": [Z_MODEL, _SLOW_NODES]}   # figures that come all together or not at all


# ---- validation ---------------------------------------------------------------------
def _fail(origin: str, message: str) -> ZoError:
    return ZoError(f"{origin}: {message}")


# Plausible range of every figure, by its unit (the suffix of its name, house rule 5):
# a figure outside it is a typo or a broken measurement (a bandwidth of 1e308 GB/s, a
# GEMM rate of 1e-300 TFLOP/s) and is refused, not planned with. (low, high, unit).
_BANDWIDTH = (1e-3, 1e5, "GB/s")
_RANGES_BY_SUFFIX = (
    ("gbps", _BANDWIDTH), ("_us", (0.01, 1e6, "us")), ("tflops", (1e-4, 1e5, "TFLOP/s")),
    ("_gib", (0.01, 1e6, "GiB")), (("_ns", "_ns_per_param", "_ns_per_elem"), (1e-6, 1e4, "ns")),
    ("scaling", (0.01, 100.0, "x")),               # how k ranks share the host
)
_RANGES_BY_KEY = {"cores": (1, 100_000, "cores"), "m_half_tokens": (0.01, 1e7, "tokens"),
                  "rank_jitter": (1e-6, 10.0, "x"), "node_spread": (0.0, 1.0, "x"),
                  "hbm_fraction": (0.05, 1.0, "x"), "overlap_slowdown": (0.0, 1.0, "x"),
                  "overlap_gemm_slowdown": (0.0, 1.0, "x"),
                  "overlap_side_slowdown": (0.0, 10.0, "x"),   # a kernel beside GEMMs: x2.5 measured
                  "sockets": (1, 16, "sockets"), "slow_node_fraction": (0.0, 1.0, "x"),
                  "slow_node_penalty": (0.0, 1.0, "x")}
_INTEGER = {"host.cores", "host.sockets"}
_MESSAGE_BYTES = (1.0, 2.0**50, "bytes")           # all-gather table sizes
_SPEED_CHECK_S = (1e-7, 1e4, "s")
MAX_GPUS_PER_NODE = 1024
MAX_NODES = 100_000


def _range_of(path: str) -> tuple[float, float, str]:
    key = path.split(".")[-1]
    if key in _RANGES_BY_KEY:
        return _RANGES_BY_KEY[key]
    for suffix, bounds in _RANGES_BY_SUFFIX:
        if key.endswith(suffix):
            return bounds
    raise AssertionError(f"no plausible range for profile figure {path}")


def _number(origin: str, path: str, value: Any,
            bounds: tuple[float, float, str] | None = None) -> float:
    """A finite figure within its plausible range; a figure that may be 0 (_NONNEG: only
    added or multiplied, never divided by) within 0..high."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _fail(origin, f"{path} must be a number, got {value!r}")
    if path in _INTEGER and not isinstance(value, int):
        raise _fail(origin, f"{path} must be a whole number, got {value!r}")
    if path in _NONNEG and value < 0:
        raise _fail(origin, f"{path} must be >= 0, got {value:g}")
    if path not in _NONNEG and value <= 0:
        raise _fail(origin, f"{path} must be > 0, got {value:g}")
    low, high, unit = bounds or _range_of(path)
    low = 0.0 if path in _NONNEG else low
    if not low <= value <= high:
        raise _fail(origin, f"{path} is {value:g} {unit}, outside the plausible "
                            f"{low:g}..{high:g} {unit}")
    return float(value)


def _integer(origin: str, name: str, value: Any, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= high:
        raise _fail(origin, f"{name} must be a whole number in 1..{high}, got {value!r}")
    return value


def validate(data: Any, origin: str) -> dict[str, Any]:
    """The keyword arguments of a HardwareProfile from a profile's JSON data (its
    sections as typed Figures), every figure checked (a ZoError naming the file, the
    figure and its value otherwise)."""
    if not isinstance(data, dict):
        raise _fail(origin, "profile must be a JSON object")
    version = data.get("schema_version")
    if version != PROFILE_SCHEMA_VERSION:
        raise _fail(origin, f"schema_version {version!r} is not supported "
                            f"(expected {PROFILE_SCHEMA_VERSION})")
    known = set(_REQUIRED) | {"schema_version", "name", "gpus_per_node", "max_nodes",
                              "sources"} | _OPTIONAL_TOP
    unknown = sorted(set(data) - known)
    if unknown:
        raise _fail(origin, f"unknown key(s) {', '.join(unknown)}")
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise _fail(origin, "name must be a non-empty string")
    gpn = _integer(origin, "gpus_per_node", data.get("gpus_per_node"), MAX_GPUS_PER_NODE)
    if "max_nodes" in data:   # older profiles: checked, then ignored (module docstring)
        _integer(origin, "max_nodes", data["max_nodes"], MAX_NODES)
    sections = {}
    for section, fields in _REQUIRED.items():
        block = data.get(section)
        if block is None:
            raise _fail(origin, f"missing section {section!r}")
        if not isinstance(block, dict):
            raise _fail(origin, f"section {section!r} must be an object of figures, got "
                                f"{type(block).__name__}")
        for key in fields:
            if key not in block:
                raise _fail(origin, f"{section}.{key} is missing")
            _number(origin, f"{section}.{key}", block[key])
        unknown = sorted(set(block) - set(field_names(section)))
        if unknown:
            raise _fail(origin, f"{section}.{unknown[0]} is not a figure of a profile "
                                f"({section} has {', '.join(field_names(section))})")
        sections[section] = dict(block)
    _check_kinds(origin, sections)
    _check_kind_figures(origin, sections)
    device = sections["device"]
    if device["reserved_gib"] >= device["memory_gib"]:
        raise _fail(origin, f"device.reserved_gib ({device['reserved_gib']:g} GiB) leaves "
                            f"nothing of device.memory_gib ({device['memory_gib']:g} GiB)")
    _check_groups(origin, sections, gpn)
    _check_table(origin, sections["collective"].get("allgather_busbw"))
    sources = data.get("sources")
    if not isinstance(sources, dict):
        raise _fail(origin, "sources must map each figure to a note")
    _check_sources(origin, sections, sources)
    _check_speed_check(origin, data.get("speed_check"))
    extra = {k: data[k] for k in _OPTIONAL_TOP if k in data}
    return {"name": name, "gpus_per_node": gpn, "sources": dict(sources), "extra": extra,
            "figures": Figures.from_sections(sections)}


def _check_kinds(origin: str, sections: dict[str, dict[str, Any]]) -> None:
    kind = sections["device"].get("kind")
    if kind not in DEVICE_KINDS:
        raise _fail(origin, f"device.kind must be one of {', '.join(DEVICE_KINDS)}, got {kind!r}")
    fabric = sections["fabric"].get("kind")
    if fabric not in FABRIC_KINDS:
        raise _fail(origin, f"fabric.kind must be one of {', '.join(FABRIC_KINDS)}, got {fabric!r}")
    if not isinstance(sections["device"].get("concurrent_engines", True), bool):
        raise _fail(origin, "device.concurrent_engines must be true or false")
    if not isinstance(sections["pcie"].get("pinned", True), bool):
        raise _fail(origin, "pcie.pinned must be true or false")
    if kind == "cuda" and sections["pcie"].get("pinned", True) is False \
            and "pageable_h2d_gbps" not in sections["pcie"]:
        raise _fail(origin, "pcie.pinned is false: the copies are staged by the host, "
                    "priced at pcie.pageable_h2d_gbps and pageable_d2h_gbps, which it lacks")
    if not isinstance(sections["device"].get("model", ""), str):
        raise _fail(origin, "device.model must be a string")


def _check_kind_figures(origin: str, sections: dict[str, dict[str, Any]]) -> None:
    """The figures of the profile's device kind: required ones present, optional ones
    valid, those that come together complete, and none of the other kind's."""
    kind = sections["device"]["kind"]
    present = {f"{sec}.{key}" for sec, block in sections.items() for key in block}
    for path in _REQUIRED_BY_KIND[kind]:
        if path not in present:
            raise _fail(origin, f"{path} is missing (a figure every {kind} profile has)")
    own = set(_REQUIRED_BY_KIND[kind]) | set(_OPTIONAL_BY_KIND[kind])
    for other in DEVICE_KINDS:
        for path in sorted(set(_REQUIRED_BY_KIND[other]) | set(_OPTIONAL_BY_KIND[other])):
            if path in present and path not in own:
                raise _fail(origin, f"{path} is a figure of {other} profiles, not of this "
                                    f"{kind} profile (device.kind {kind!r})")
    for path in own & present:
        section, key = path.split(".")
        _number(origin, path, sections[section][key])
    for group in _TOGETHER[kind]:
        have = [p for p in group if p in present]
        if have and len(have) != len(group):
            missing = sorted(set(group) - set(have))
            raise _fail(origin, f"{', '.join(missing)} missing: give all of "
                                f"{', '.join(group)} or none")


def _check_groups(origin: str, sections: dict[str, dict[str, Any]], gpn: int) -> None:
    for path, groups in (("pcie.switch_groups", sections["pcie"].get("switch_groups")),
                         ("fabric.groups", sections["fabric"].get("groups"))):
        if groups is None:
            continue
        if not isinstance(groups, list) or not all(isinstance(g, list) and g for g in groups):
            raise _fail(origin, f"{path} must be a list of non-empty lists of local ranks")
        seen: set[int] = set()
        for group in groups:
            for rank in group:
                if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < gpn:
                    raise _fail(origin, f"{path} names rank {rank!r}, outside 0..{gpn - 1}")
                if rank in seen:
                    raise _fail(origin, f"{path} names rank {rank} twice")
                seen.add(rank)


def _check_table(origin: str, table: Any) -> None:
    path = "collective.allgather_busbw"
    if not isinstance(table, list) or not table:
        raise _fail(origin, f"{path} must be a non-empty list of [bytes, GB/s] pairs")
    last = 0.0
    for point in table:
        if not isinstance(point, list) or len(point) != 2:
            raise _fail(origin, f"{path} entries must be [bytes, GB/s], got {point!r}")
        size = _number(origin, f"{path} size", point[0], _MESSAGE_BYTES)
        _number(origin, f"{path} bandwidth", point[1], _BANDWIDTH)
        if size <= last:
            raise _fail(origin, f"{path} sizes must increase, got {size:g} after {last:g}")
        last = size


def _check_speed_check(origin: str, check: Any) -> None:
    """The speed check `zoplan profile` stores (zoexec.profiler.probe.SpeedProbe.check):
    a median time of each reference shape."""
    if check is None:
        return
    if not (isinstance(check, dict) and all(isinstance(check.get(k), dict)
                                            for k in SPEED_CHECK_KINDS)):
        raise _fail(origin, f"speed_check must have {', '.join(SPEED_CHECK_KINDS)} entries "
                            f"with median_s (zoexec.profiler.probe.SpeedProbe.check)")
    for kind in SPEED_CHECK_KINDS:
        _number(origin, f"speed_check.{kind}.median_s", check[kind].get("median_s"),
                _SPEED_CHECK_S)


def _check_sources(origin: str, sections: dict[str, dict[str, Any]],
                   sources: dict[str, Any]) -> None:
    paths = [f"{section}.{key}" for section, fields in _REQUIRED.items() for key in fields]
    paths += list(_REQUIRED_BY_KIND[sections["device"]["kind"]])
    present = {f"{sec}.{key}" for sec, block in sections.items() for key in block}
    for path in [p for p in NEEDS_SOURCE if p in present]:
        if not isinstance(sources.get(path), str):
            raise _fail(origin, f"{path} has no source note of its own in `sources`")
    for path in paths:
        section = path.split(".")[0]
        if not (isinstance(sources.get(path), str) or isinstance(sources.get(section), str)):
            raise _fail(origin, f"{path} has no source note in `sources`")
