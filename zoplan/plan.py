"""plan.json: the planner's output and the executor's input, versioned and checked.

Keys (all required unless marked optional):
  schema_version            PLAN_SCHEMA_VERSION
  tool                      {"name": "zoplan", "version"}
  model                     {"name", "spec": ModelSpec.to_dict(), "sha256"}
  profile                   {"name", "sha256", "device_kind", "gpus_per_node"}
  workload                  Workload.to_dict(): batch, seq, param_dtype, compute_dtype,
                            update (master, stochastic, plain), tf32
  layout                    Layout.to_dict(): pertp, ddp, nodes, slices, prefetch
  ranks                     Layout.rank_table(): rank, node, local_rank, role,
                            data_shard, slice_group, slice_index
  blocks                    [{"block", "placement": "host", "bytes"}] per block
  predicted                 step_time_s, tokens_per_s, gpu_mem_bytes (per GPU),
                            host_mem_bytes (per node), bottleneck, lower_bound_s,
                            utilisation {resource: fraction}, spans [Span.to_dict()]
                            (one step; for large worlds only the simulated ranks)
  baselines                 {"zo2": {"step_time_s", ...}, "unsliced": {"step_time_s", ...}}
  candidates                ranked list: {"layout", "step_time_s", "tokens_per_s",
                            "gpu_mem_bytes", "host_mem_bytes", "bottleneck"}
  pruned (optional)         [{"layout", "reason"}]
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zoplan import __version__
from zoplan.errors import ZoError
from zoplan.io import atomic_write_text, dumps_canonical, load_json
from zoplan.layout import Layout
from zoplan.models import ModelSpec
from zoplan.trace import Span
from zoplan.workload import Workload

PLAN_SCHEMA_VERSION = 1
_REQUIRED = ("schema_version", "tool", "model", "profile", "workload", "layout", "ranks",
             "blocks", "predicted", "baselines", "candidates")
_PREDICTED = ("step_time_s", "tokens_per_s", "gpu_mem_bytes", "host_mem_bytes",
              "bottleneck", "spans")


@dataclass(frozen=True)
class Plan:
    """A validated plan. `data` is the JSON object; typed views are properties."""

    data: dict

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
    def ranks(self) -> list[dict]:
        return self.data["ranks"]

    @property
    def predicted(self) -> dict:
        return self.data["predicted"]

    @property
    def step_time_s(self) -> float:
        return float(self.data["predicted"]["step_time_s"])

    @property
    def device_kind(self) -> str:
        return self.data["profile"]["device_kind"]

    def spans(self) -> list[Span]:
        return [Span.from_dict(s) for s in self.data["predicted"]["spans"]]

    def to_json(self) -> str:
        return dumps_canonical(self.data)

    def save(self, path: Path | str) -> None:
        atomic_write_text(path, self.to_json())

    @classmethod
    def from_dict(cls, data: Any, *, origin: str = "plan") -> Plan:
        validate_plan(data, origin)
        return cls(data)

    @classmethod
    def load(cls, path: Path | str) -> Plan:
        return cls.from_dict(load_json(path, what="plan"), origin=f"plan {path}")


def tool_info() -> dict:
    return {"name": "zoplan", "version": __version__}


def validate_plan(data: Any, origin: str) -> None:
    """Raise ZoError naming the first problem found in a plan object."""
    if not isinstance(data, dict):
        raise ZoError(f"{origin}: not a JSON object")
    version = data.get("schema_version")
    if version != PLAN_SCHEMA_VERSION:
        raise ZoError(f"{origin}: schema_version {version!r} is not supported "
                      f"(expected {PLAN_SCHEMA_VERSION})")
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise ZoError(f"{origin}: missing key(s) {', '.join(missing)}")
    try:
        layout = Layout(**data["layout"])
        Workload.from_dict(data["workload"])
        spec = ModelSpec(**data["model"]["spec"])
    except (TypeError, ValueError, KeyError) as exc:
        raise ZoError(f"{origin}: {exc}") from None
    if data["ranks"] != layout.rank_table():
        raise ZoError(f"{origin}: the rank table does not match layout "
                      f"{layout.label()} ({layout.world_size} ranks)")
    if len(data["blocks"]) != spec.num_layers:
        raise ZoError(f"{origin}: {len(data['blocks'])} block placements for a model "
                      f"of {spec.num_layers} blocks")
    predicted = data["predicted"]
    if not isinstance(predicted, dict) or any(k not in predicted for k in _PREDICTED):
        raise ZoError(f"{origin}: predicted needs {', '.join(_PREDICTED)}")
    if not (isinstance(predicted["step_time_s"], (int, float)) and predicted["step_time_s"] > 0):
        raise ZoError(f"{origin}: predicted.step_time_s must be > 0")
    for key in ("name", "sha256", "device_kind", "gpus_per_node"):
        if key not in data["profile"]:
            raise ZoError(f"{origin}: profile.{key} is missing")
    if data["workload"]["batch"] % layout.ddp:
        raise ZoError(f"{origin}: batch ({data['workload']['batch']}) is not divisible "
                      f"by ddp ({layout.ddp})")
