"""Hand-built plans: a valid plan.json for a model and a fixed layout, without a search.

For tests, benchmarks and the GPU check, where the layout is given and no prediction is
needed. The `predicted` memory figures are zoplan.memory's (the rank's device bytes
at its peak, the node's host bytes), with a nominal step time and no spans; `zoplan
optimize` writes the real thing.
"""

from __future__ import annotations

from zoplan.hostmemory import node_host_memory
from zoplan.io import sha256_json
from zoplan.layout import Layout
from zoplan.memory import rank_memory
from zoplan.models import ModelSpec, get_model
from zoplan.plan import PLAN_SCHEMA_VERSION, Plan, compact_ranks, tool_info
from zoplan.workload import Workload


def hand_plan(*, model: str | ModelSpec, layout: Layout, workload: Workload,
              device_kind: str = "cpu", profile_name: str = "hand-built",
              step_time_s: float = 1.0, resident: tuple[int, ...] = ()) -> Plan:
    """A validated Plan running `model` with `layout` and `workload` as given;
    `resident`: the blocks kept on the devices as shards of their slice group."""
    spec = get_model(model) if isinstance(model, str) else model
    resident = tuple(sorted(set(resident)))
    placed = len([b for b in resident if 0 <= b < spec.num_layers])
    device_mem = rank_memory(model=spec, workload=workload, layout=layout,
                             device_kind=device_kind, resident_blocks=placed).total_bytes
    host_mem = node_host_memory(model=spec, workload=workload, layout=layout,
                                device_kind=device_kind, resident_blocks=placed).total_bytes
    predicted = {"step_time_s": step_time_s,
                 "tokens_per_s": workload.tokens_per_step / step_time_s,
                 "gpu_mem_bytes": device_mem, "host_mem_bytes": host_mem,
                 "bottleneck": "unknown (hand-built plan)", "lower_bound_s": 0.0,
                 "utilisation": {}, "spans": []}
    profile = {"name": profile_name, "sha256": sha256_json(profile_name),
               "device_kind": device_kind, "gpus_per_node": layout.local_ranks}
    data = {"schema_version": PLAN_SCHEMA_VERSION, "tool": tool_info(),
            "model": {"name": spec.name, "spec": spec.to_dict(), "sha256": sha256_json(spec.to_dict())},
            "profile": profile, "workload": workload.to_dict(), "layout": layout.to_dict(),
            "ranks": compact_ranks(),
            "blocks": [{"block": b, "placement": "resident" if b in resident else "host",
                        "bytes": spec.block_bytes(workload.param_dtype)}
                       for b in range(spec.num_layers)],
            "predicted": predicted,
            "baselines": {"zo2": {"step_time_s": step_time_s}, "unsliced": {"step_time_s": step_time_s}},
            "candidates": [{"layout": layout.to_dict(), "step_time_s": step_time_s,
                            "tokens_per_s": predicted["tokens_per_s"], "gpu_mem_bytes": device_mem,
                            "host_mem_bytes": host_mem, "bottleneck": predicted["bottleneck"]}]}
    return Plan.from_dict(data, origin="hand-built plan")
