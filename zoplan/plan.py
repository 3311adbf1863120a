"""plan.json: the planner's output and the executor's input, versioned and checked.

Keys (all required unless marked optional):
  schema_version            PLAN_SCHEMA_VERSION
  tool                      {"name": "zoplan", "version"}
  model                     {"name", "spec": ModelSpec.to_dict(), "sha256"}
  profile                   {"name", "sha256", "device_kind", "gpus_per_node"}
  workload                  Workload.to_dict(): batch, seq, param_dtype, compute_dtype,
                            update (master, stochastic, plain), tf32; optional lengths
                            (zoplan.lengths.RowLengths: the data's row lengths) and
                            priced_seq (derived: the width the step is priced at); LoRA plans also
                            tuning "lora", lora_r, lora_alpha, lora_targets (absent:
                            full tuning; zoplan.lora)
  layout                    Layout.to_dict(): pertp, ddp, nodes, slices, prefetch,
                            slice_update (optional, default false)
  ranks                     the rank table, compact: {"rule": "layout", "exceptions": []}
                            (every rank's row is Layout.rank_table()'s: rank, node,
                            local_rank, role, data_shard, slice_group, slice_index;
                            Plan.rank_row, Plan.ranks; no exceptions in this version),
                            so a plan's size does not grow with its ranks. Version 1
                            plans (the whole table as a list) are still read.
  blocks                    [{"block", "placement", "bytes"}] per block; placement
                            "host" (in the node's host store, streamed every step) or
                            "resident" (sharded over the slice group's devices: each
                            rank keeps 1/slices of it, no PCIe; Plan.resident_blocks)
  predicted                 step_time_s, tokens_per_s, gpu_mem_bytes (per GPU),
                            host_mem_bytes (per node), bottleneck, lower_bound_s,
                            utilisation {resource: fraction}, spans [Span.to_dict()]
                            (one step; for large worlds only the simulated ranks)
                            (optional: node_step_s, straggler_s: one node's simulated
                            step and the wait for the slowest node; resident_blocks;
                            memory.gpu_headroom_bytes and the resident margin)
  baselines                 {"zo2": {"step_time_s", ...}, "unsliced": {"step_time_s", ...},
                            optional "offloaded" (every block offloaded), "all_devices"
                            (the best on every device --gpus gave)}
  candidates                ranked list: {"layout", "step_time_s", "tokens_per_s",
                            "gpu_mem_bytes", "host_mem_bytes", "bottleneck"}
  pruned (optional)         [{"layout", "reason"}]
  notes (optional)          {name: text}: what the plan's numbers do not say (ddp)
  scaling (optional)        {"nodes", "one_node_step_s", "efficiency", "sweep": [...]}
  sensitivity (optional)    the step, memory and ZO2 ratio with the profile's assumed
                            figures across their plausible ranges, each figure's effect,
                            and whether the winner stays the winner
                            (zoplan.search.sensitivity; docs/planner.md)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError

from zoplan import __version__
from zoplan.errors import ZoError
from zoplan.io import atomic_write_text, dumps_canonical, load_json
from zoplan.layout import Layout
from zoplan.lora import check_targets
from zoplan.models import ModelSpec, check_shape
from zoplan.trace import MAX_SECONDS, Checked, Rank, Seconds, Span, SpanRecord, schema_problem
from zoplan.workload import Workload

PLAN_SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)   # version 1: the rank table as a list
RANK_RULE = "layout"
_REQUIRED = ("schema_version", "tool", "model", "profile", "workload", "layout", "ranks",
             "blocks", "predicted", "baselines", "candidates")
MAX_BYTES = 1e19             # any memory figure: ten exabytes
MAX_TOKENS_PER_S = 1e15
MAX_GPUS_PER_NODE = 1024     # zoplan.hardware's bound of a profile's node


@dataclass(frozen=True)
class Plan:
    """A validated plan. `data` is the JSON object; typed views are properties."""

    data: dict[str, Any]

    @property
    def layout(self) -> Layout:
        return Layout.from_dict(self.data["layout"])

    @property
    def workload(self) -> Workload:
        return Workload.from_dict(self.data["workload"])

    @property
    def model(self) -> ModelSpec:
        return ModelSpec.from_dict(self.data["model"]["spec"])

    @property
    def ranks(self) -> list[dict[str, Any]]:
        """Every rank's row (built from the layout: as long as the world)."""
        if isinstance(self.data["ranks"], list):
            table: list[dict[str, Any]] = self.data["ranks"]
            return table
        return self.layout.rank_table()

    def rank_row(self, rank: int) -> dict[str, Any]:
        """One rank's row of the table, without building the others."""
        lay = self.layout
        if not 0 <= rank < lay.world_size:
            raise ZoError(f"rank {rank}: the plan has {_indices('rank', lay.world_size)}")
        if isinstance(self.data["ranks"], list):
            row: dict[str, Any] = self.data["ranks"][rank]
            return row
        return _row(lay, rank)

    @property
    def resident_blocks(self) -> tuple[int, ...]:
        """Blocks kept on the devices as shards of their slice group (not streamed)."""
        return tuple(b["block"] for b in self.data["blocks"] if b["placement"] == "resident")

    @property
    def predicted(self) -> dict[str, Any]:
        predicted: dict[str, Any] = self.data["predicted"]
        return predicted

    @property
    def step_time_s(self) -> float:
        return float(self.data["predicted"]["step_time_s"])

    @property
    def device_kind(self) -> str:
        kind: str = self.data["profile"]["device_kind"]
        return kind

    def spans(self) -> list[Span]:
        return [Span.from_dict(s) for s in self.data["predicted"]["spans"]]

    def check_trace(self, meta: dict[str, Any], spans: list[Span], *, origin: str) -> None:
        """Raise ZoError where a trace (zoplan.trace.read_trace) cannot be of a run of
        this plan: another world size or layout, ranks or blocks the plan has not."""
        layout, num_blocks = self.layout, self.model.num_layers
        world = layout.world_size
        if meta.get("world_size") not in (None, world):
            raise ZoError(f"{origin} was recorded with {meta['world_size']} ranks; plan "
                          f"has {world}")
        if meta.get("layout") and Layout.from_dict(meta["layout"]) != layout:
            raise ZoError(f"{origin} ran layout {Layout.from_dict(meta['layout']).label()}, the plan "
                          f"is {layout.label()}: give a trace of a run of this plan")
        top_rank = max((s.rank for s in spans), default=0)
        if top_rank >= world:
            raise ZoError(f"{origin} has spans of rank {top_rank}; plan has "
                          f"{_indices('rank', world)}")
        top_block = max((s.block for s in spans), default=-1)
        if top_block >= num_blocks:
            raise ZoError(f"{origin} has spans of block {top_block}; model {self.model.name} "
                          f"has {_indices('block', num_blocks)}")

    def to_json(self) -> str:
        return dumps_canonical(self.data)

    def save(self, path: Path | str) -> None:
        atomic_write_text(path, self.to_json(), what="the plan to")

    @classmethod
    def from_dict(cls, data: Any, *, origin: str = "plan") -> Plan:
        validate_plan(data, origin)
        return cls(data)

    @classmethod
    def load(cls, path: Path | str) -> Plan:
        return cls.from_dict(load_json(path, what="plan"), origin=f"plan {path}")


def _indices(what: str, count: int) -> str:
    return f"{what}s 0-{count - 1}" if count > 1 else f"{what} 0"


def tool_info() -> dict[str, Any]:
    return {"name": "zoplan", "version": __version__}


def compact_ranks() -> dict[str, Any]:
    """The rank table of a plan: every row follows the layout, no exceptions."""
    return {"rule": RANK_RULE, "exceptions": []}


def _row(layout: Layout, rank: int) -> dict[str, Any]:
    return {"rank": rank, "node": layout.node_of(rank), "local_rank": layout.local_rank_of(rank),
            "role": layout.role_of(rank), "data_shard": layout.data_shard_of(rank),
            "slice_group": layout.slice_group_of(rank), "slice_index": layout.slice_index_of(rank)}


# ---- the schema: every figure typed, finite and within bounds ---------------------------------
Bytes = Annotated[float, Field(ge=0, le=MAX_BYTES)]
StepSeconds = Annotated[float, Field(gt=0, le=MAX_SECONDS)]
TokensPerS = Annotated[float, Field(ge=0, le=MAX_TOKENS_PER_S)]
Share = Annotated[float, Field(ge=0, le=1e3)]       # a busy fraction (may pass 1 a little)
Count = Annotated[int, Field(ge=0)]                   # blocks: an index or a number of them
Headroom = Annotated[float, Field(ge=-MAX_BYTES, le=MAX_BYTES)]   # bytes left (negative: short)


class _Tool(Checked):
    name: str
    version: str


class _ModelRef(Checked):
    name: str
    spec: dict[Any, Any]
    sha256: str


class _ProfileRef(Checked):
    name: str
    sha256: str
    device_kind: Literal["cuda", "cpu"]
    gpus_per_node: Annotated[int, Field(ge=1, le=MAX_GPUS_PER_NODE)]


class _Block(Checked):
    block: Count
    placement: Literal["host", "resident"]
    bytes: Bytes


class _Memory(Checked):
    gpu: dict[str, Bytes] | None = None
    host: dict[str, Bytes] | None = None
    gpu_usable_bytes: Bytes | None = None
    gpu_headroom_bytes: Headroom | None = None
    resident_margin_bytes: Bytes | None = None
    resident_margin: Share | None = None
    host_bytes_limit: Bytes | None = None


class _Predicted(Checked):
    step_time_s: StepSeconds
    tokens_per_s: TokensPerS
    gpu_mem_bytes: Bytes
    host_mem_bytes: Bytes
    bottleneck: str
    spans: list[SpanRecord]
    lower_bound_s: Seconds | None = None
    serial_upper_bound_s: Seconds | None = None
    internode_allreduce_s: Seconds | None = None
    node_step_s: Seconds | None = None
    straggler_s: Seconds | None = None
    resident_blocks: Count | None = None
    utilisation: dict[str, Share] | None = None
    memory: _Memory | None = None
    simulated_ranks: list[Rank] | None = None


class _Entry(Checked):
    """A ranked candidate or a baseline (step_time_s null: no such layout)."""

    layout: dict[Any, Any] | None = None
    label: str | None = None
    update: str | None = None
    step_time_s: StepSeconds | None = None
    tokens_per_s: TokensPerS | None = None
    gpu_mem_bytes: Bytes | None = None
    host_mem_bytes: Bytes | None = None
    bottleneck: str | None = None
    bottleneck_utilisation: Share | None = None
    lower_bound_s: Seconds | None = None
    method: str | None = None
    fits: bool | None = None
    reason: str | None = None
    workload: dict[Any, Any] | None = None
    resident_blocks: Count | None = None
    gpu_headroom_bytes: Headroom | None = None


class _Pruned(Checked):
    layout: dict[Any, Any]
    reason: str
    update: str | None = None
    resident_blocks: Count | None = None


class _Ranks(Checked):
    rule: Literal["layout"]
    exceptions: list[dict[Any, Any]]


class _Sweep(Checked):
    nodes: Annotated[int, Field(ge=1)]
    gpus: Annotated[int, Field(ge=1)]
    batch: Annotated[int, Field(ge=1)]
    step_time_s: StepSeconds
    tokens_per_s: TokensPerS
    efficiency: Share


class _Scaling(Checked):
    nodes: Annotated[int, Field(ge=1)]
    one_node_step_s: StepSeconds
    efficiency: Share
    node_spread: Share | None = None
    basis: str | None = None
    sweep: list[_Sweep] = []


class PlanSchema(Checked):
    """plan.json (the keys in the module docstring). dict[Any, Any]: an object whose
    keys the schema leaves unchecked (pydantic's strict mode would check dict[str, ...])."""

    schema_version: Literal[1, 2]   # READABLE_VERSIONS (test_plan checks)
    tool: _Tool
    model: _ModelRef
    profile: _ProfileRef
    workload: dict[Any, Any]
    layout: dict[Any, Any]
    ranks: _Ranks | list[dict[Any, Any]]
    blocks: list[_Block]
    predicted: _Predicted
    baselines: dict[str, _Entry]
    candidates: list[_Entry]
    pruned: list[_Pruned] | None = None
    search: dict[Any, Any] | None = None
    notes: dict[str, str] | None = None
    scaling: _Scaling | None = None
    sensitivity: dict[Any, Any] | None = None   # optional: zoplan.search.sensitivity


def validate_plan(data: Any, origin: str) -> None:
    """Raise ZoError naming the first problem found in a plan object: its shape and
    numbers (PlanSchema), then what its parts must agree on."""
    if not isinstance(data, dict):
        raise ZoError(f"{origin}: not a JSON object")
    version = data.get("schema_version")
    if version not in READABLE_VERSIONS or isinstance(version, bool):
        raise ZoError(f"{origin}: schema_version {version!r} is not supported "
                      f"(expected {PLAN_SCHEMA_VERSION}; version 1 plans are read too)")
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise ZoError(f"{origin}: missing key(s) {', '.join(missing)}")
    try:
        PlanSchema.model_validate(data)
    except ValidationError as exc:
        raise ZoError(f"{origin}: {schema_problem(exc)}") from None
    part = "layout"
    try:
        layout = Layout(**data["layout"])
        layout.check_bounds()
        part = "workload"
        workload = Workload.from_dict(data["workload"])
        workload.check_bounds()
        part = "model.spec"
        check_shape(data["model"]["spec"])
        spec = ModelSpec(**data["model"]["spec"])
        part = "workload"
        if workload.is_lora:
            check_targets(spec, workload.lora_targets)
    except (TypeError, ValueError) as exc:
        raise ZoError(f"{origin}: {part}: {exc}") from None
    _check_agreement(data, origin, layout=layout, workload=workload, spec=spec)


def _check_agreement(data: dict[str, Any], origin: str, *, layout: Layout, workload: Workload,
                     spec: ModelSpec) -> None:
    """What the plan's parts must agree on: ranks, blocks, batch, seq and spans."""
    _check_ranks(data, origin, layout)
    if len(data["blocks"]) != spec.num_layers:
        raise ZoError(f"{origin}: {len(data['blocks'])} block placements for a model "
                      f"of {spec.num_layers} blocks")
    if workload.batch % layout.ddp:
        raise ZoError(f"{origin}: batch ({workload.batch}) is not divisible "
                      f"by ddp ({layout.ddp})")
    seq = workload.seq + (workload.prefix_tokens if workload.is_prefix else 0)
    if seq > spec.max_positions:
        raise ZoError(f"{origin}: seq ({workload.seq}"
                      f"{' + prefix ' + str(workload.prefix_tokens) if workload.is_prefix else ''}"
                      f") exceeds the {spec.max_positions} positions of {spec.name}")
    if layout.local_ranks > data["profile"]["gpus_per_node"]:
        raise ZoError(f"{origin}: {layout.local_ranks} ranks per node, but the profile's "
                      f"node has {data['profile']['gpus_per_node']}")
    for i, span in enumerate(data["predicted"]["spans"]):
        if span["rank"] >= layout.world_size or span.get("block", -1) >= spec.num_layers:
            raise ZoError(f"{origin}: predicted.spans[{i}] is of rank {span['rank']}, block "
                          f"{span.get('block', -1)}; the plan has {layout.world_size} "
                          f"rank(s) and {spec.num_layers} blocks")


def _check_ranks(data: dict[str, Any], origin: str, layout: Layout) -> None:
    """Version 2: the compact form, without exceptions (zoexec derives every rank's
    row from the layout); version 1: the whole table, row by row (bounded by the
    list it came as, never built larger)."""
    ranks = data["ranks"]
    if data["schema_version"] == 1:
        if not isinstance(ranks, list) or len(ranks) != layout.world_size or any(
                row != _row(layout, r) for r, row in enumerate(ranks)):
            raise ZoError(f"{origin}: the rank table does not match layout "
                          f"{layout.label()} ({layout.world_size} ranks)")
        return
    if not isinstance(ranks, dict):
        raise ZoError(f"{origin}: ranks must be {compact_ranks()} in a version "
                      f"{PLAN_SCHEMA_VERSION} plan, got a {type(ranks).__name__}")
    if ranks["exceptions"]:
        raise ZoError(f"{origin}: ranks.exceptions must be empty: every rank follows layout "
                      f"{layout.label()} ({len(ranks['exceptions'])} exception(s) given)")
