"""What one node of zoexec allocates on its host, term by term, with labels (the device
of one rank: zoplan.memory, whose terms and sizes it reads): the block store (shared),
a resident master per CUDA rank, each rank process's own memory, on CPU profiles every
rank's "device" bytes; or, if larger, the set-up peak while local rank 0 fills the
store block by block (node_host_memory).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from zoplan.layout import Layout
from zoplan.memory import GIB, Term, _sizes, _sum, rank_memory, store_stride
from zoplan.models import ModelSpec
from zoplan.workload import Workload

# Host memory of one rank process besides the block store [D]: a torch process with the
# CUDA runtime, NCCL and pinned staging buffers typically holds ~1-2 GiB resident; a
# CPU-only torch + gloo process ~0.2-0.4 GiB. Assumed, not measured.
HOST_OVERHEAD_BYTES_PER_RANK = {"cuda": int(1.5 * GIB), "cpu": int(0.3 * GIB)}


@dataclass(frozen=True, kw_only=True)
class HostMemory:
    """The host bytes of one node: `steady` (while training) and `setup` (while the
    builder makes the model and fills the store), both wholes."""

    steady: tuple[Term, ...]
    setup: tuple[Term, ...]

    @property
    def total_bytes(self) -> int:
        return max(_sum(self.steady), _sum(self.setup))

    def peak_terms(self) -> list[Term]:
        return list(self.setup if _sum(self.setup) > _sum(self.steady) else self.steady)

    def dominant(self) -> Term:
        return max(self.peak_terms(), key=lambda t: t.bytes)


def node_host_memory(*, model: ModelSpec, workload: Workload, layout: Layout,
                     device_kind: str, random_init: bool = True,
                     resident_blocks: int = 0) -> HostMemory:
    """The host bytes of one node of `layout`. Steady: the store once, each local rank's
    process, and its resident master (CUDA; on the CPU every rank's "device" bytes are
    host memory, the master among them). Set-up (zoexec.store.node.load_node_model): the
    store while the builder fills it block by block from a blueprint (resident parts
    and one template block, in fp32 for a random init, else in the compute precision,
    beside the resident master), the other local ranks' skeletons (modules bound to
    zeros, a copy of the handed-over master) and the handover file. The store keeps
    every block, resident ones included (they are loaded through it, and snapshots
    are written from it); on CPU profiles the ranks' resident shards are host memory
    on top (`resident_blocks`). Cached; on CUDA on the node's local ranks and slices
    alone, all of the layout its bytes depend on there (a search prices thousands of
    layouts over a few nodes' shapes)."""
    if device_kind == "cuda":
        layout, resident_blocks = Layout(ddp=layout.local_ranks, slices=layout.slices), 0
    return _node_host(model, workload, layout, device_kind, random_init, resident_blocks)


@functools.lru_cache(maxsize=4096)
def _node_host(model: ModelSpec, workload: Workload, layout: Layout, device_kind: str,
               random_init: bool, resident_blocks: int) -> HostMemory:
    n, r, p, c = _sizes(model, workload)
    ranks = layout.local_ranks
    stride = store_stride(n, slices=layout.slices, local_ranks=ranks)
    store = Term(key="blocks", bytes=model.num_layers * stride * p,
                 label=f"{model.num_layers} blocks")
    overhead = HOST_OVERHEAD_BYTES_PER_RANK[device_kind]
    procs = Term(key="rank_processes", bytes=ranks * overhead,
                 label=f"{ranks} x {overhead / GIB:g} GiB rank processes")
    steady = [store, procs]
    if device_kind == "cuda":
        steady.append(Term(key="resident_masters", bytes=ranks * r * p,
                           label=f"{ranks} x resident master ({workload.param_dtype})"))
    else:
        device = rank_memory(model=model, workload=workload, layout=layout,
                             device_kind=device_kind,
                             resident_blocks=resident_blocks).allocated_bytes
        steady.append(Term(key="rank_buffers", bytes=ranks * device,
                           label=f"{ranks} x rank buffers"))
    made = 4 if random_init else c
    filled = [store, procs,   # the last block written: the builder's blueprint is still there
              Term(key="builder_model", bytes=r * (made + p) + n * made,
                   label="the builder's blueprint (resident parts, one block) and master")]
    if ranks > 1:
        filled.append(Term(key="skeletons", bytes=(ranks - 1) * (r + n) * c,
                           label=f"{ranks - 1} x skeleton of the other local ranks"))
    handed = [store, procs,   # the resident handover: modules bound to compute-dtype copies
              Term(key="builder_parts", bytes=r * (c + p) + n * c,
                   label="the builder's resident parts, working block and master"),
              Term(key="resident_handover", bytes=r * p, label="resident handover file"),
              Term(key="skeletons", bytes=(ranks - 1) * (r * (2 * c + p) + n * c),
                   label=f"{ranks - 1} x skeleton of the other local ranks, rebinding")]
    setup = max(filled, handed, key=_sum) if ranks > 1 else filled
    return HostMemory(steady=tuple(steady), setup=tuple(setup))
