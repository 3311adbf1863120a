"""Task graph of one steady-state training step for one layout, on ONE node
(StepGraph: the part of networkx's DiGraph interface the simulator reads).

All nodes of a job are identical (DDP across nodes, each node holds its own host copy),
so the graph covers the local ranks of node 0; the inter-node part of the scalar
all-reduce is added analytically to the all-reduce task (see `internode_allreduce_s`).

Per rank r and block b (execution semantics of docs/execution.md):
    h2d(b)  upload r's slice (1/slices of the block) from the node's host store
    slice_update(b)  Layout.slice_update (slices > 1): step t-1's deferred update of r's
              own slice (z for 1/slices of the block), before the all-gather
    allgather(b)  slice group exchanges slices (absent when slices == 1)
    update(b)  deferred update of step t-1 + perturbation of step t (with slice_update:
              the perturbation alone; a resident block without it also copies r's slice
              of the updated block back into its shard)
    forward(b)  "+-": both perturbations; "+" / "-": one
    d2h(b)  write back r's 1/local_ranks share of the updated block
    fence(b)  CUDA, 1 < local ranks and slices < local ranks: a node all-reduce of a
              token once the block is ready (zoexec's Trainer._fence), on the collective
              engine; simulated but not a span (the executor does not trace it)
plus embed (before block 0), head (after the last block) and allreduce (ends the step).
A resident block (StepCosts.resident: kept as shards on the slice group's devices) has
no h2d, d2h or fence: [slice_update], [allgather], update, forward. A LoRA step
(StepCosts.read_only: the base is frozen) has no d2h and no fence for any block: a
buffer is released by the block's forward.

Edges carry `why`:
    "data"    data flow (h2d -> [slice_update] -> allgather -> update -> forward -> d2h;
              last forward -> head)
    "buffer"  the task that fills a block buffer (h2d; the all-gather of a resident
              block) waits until the block `prefetch` buffer-using blocks earlier has
              released it (d2h; the forward of a resident block): `prefetch` buffers
    "fence"   d2h(b) waits for EVERY local rank's h2d(b) (write-back fence): directly
              (CPU), or through the fence collective (CUDA)
    "order"   program order on one engine (an engine does one thing at a time)
The slice update runs where the executor issues it: on a CUDA rank's collective stream,
right before the block's all-gather (it overlaps the compute stream's work; what the
two streams share is priced by zoplan.pricing.overlap), on a CPU rank in its serial order.
Collectives (allgather, allreduce) are one node per member rank with a shared `group`;
the simulator starts a group when all members have reached it.

Each node carries the work of the task: `dur_s` (compute time, or the fixed latency of
a collective), `issue` ((start, end) of its issue on the rank's host lane, CUDA:
zoplan.pricing.host; (0, 0) on CPUs) and `flows` ((bytes, route of link names, private cap in bytes/s), ...):
transfers whose rate the simulator decides by max-min fair sharing of the links. The
graph's `links` give each link's capacity, `contended` the capacity of a direction link
while the opposite direction of the same PCIe link or switch uplink is busy.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from zoplan.sim.costs import StepCosts
from zoplan.trace import KIND_LANE, NO_BLOCK, task_id

Attrs = dict[str, Any]            # a node's or an edge's attributes
Node = tuple[str, Attrs]
Edge = tuple[str, str, Attrs]
SERIAL_LANE = "serial"   # engine name of a rank whose tasks run one at a time (CPU)

_DATA, _BUFFER, _FENCE, _ORDER = ({"why": w} for w in ("data", "buffer", "fence", "order"))
FENCE = "fence"   # the CUDA write-back fence's collective: simulated, not a span of the trace
LANE_OF = {**KIND_LANE, FENCE: KIND_LANE["allgather"]}   # the executor's collective stream


SLICE_UPDATE = "slice_update"


def rank_order(costs: StepCosts, num_blocks: int) -> list[tuple[str, int]]:
    """(kind, block) of one rank's tasks in program order (the CPU's serial order)."""
    kinds = {resident: block_kinds(costs, resident) for resident in (False, True)}
    order = [("embed", NO_BLOCK)]
    order += [(kind, b) for b in range(num_blocks) for kind in kinds[costs.is_resident(b)]]
    return order + [("head", NO_BLOCK), ("allreduce", NO_BLOCK)]


def block_kinds(costs: StepCosts, resident: bool) -> list[str]:
    """The kinds of a block's tasks on one rank in program order (a resident block's,
    or an offloaded one's)."""
    kinds = [] if resident else ["h2d"]
    kinds += [SLICE_UPDATE] if costs.split_update else []
    kinds += ["allgather"] if costs.layout.slices > 1 else []
    kinds += [FENCE] if costs.fence_s and not resident else []
    return kinds + ["update", "forward"] + ([] if resident or costs.read_only else ["d2h"])


class _View:
    """A mapping of names (nodes) or (u, v) pairs (edges) to attribute dicts, read the
    way networkx reads its views: iterate, index, or call with data=True / a key."""

    def __init__(self, items: dict[Any, Attrs]) -> None:
        self._items = items

    def __iter__(self) -> Iterator[Any]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __getitem__(self, key: Any) -> Attrs:
        return self._items[key]

    def __call__(self, data: bool | str = False) -> list[Any]:
        flat = [(*k, a) if isinstance(k, tuple) else (k, a) for k, a in self._items.items()]
        if data is True:
            return flat
        if data:
            return [(*row[:-1], row[-1].get(data)) for row in flat]
        return [row[:-1] if len(row) > 2 else row[0] for row in flat]


class StepGraph:
    """A directed graph of one step's tasks: the subset of networkx's DiGraph the
    simulator and the tests read (nodes, edges, in_edges, has_edge, number_of_nodes,
    the `graph` attributes), built without networkx: a search builds dozens of them
    and networkx's import alone is a fifth of the planner's start-up. Edges iterate
    in networkx's order (by source in node order, then by target as first added); an
    edge added twice keeps its place and takes the later attributes."""

    def __init__(self, **graph: Any) -> None:
        self.graph = graph
        self._nodes: dict[str, Attrs] = {}
        self._succ: dict[str, dict[str, Attrs]] = {}
        self._pred: dict[str, dict[str, Attrs]] = {}

    def add_nodes_from(self, nodes: Iterable[Node]) -> None:
        for name, attrs in nodes:
            self._add_node(name).update(attrs)

    def _add_node(self, name: str) -> Attrs:
        if name not in self._nodes:
            self._nodes[name], self._succ[name], self._pred[name] = {}, {}, {}
        return self._nodes[name]

    def add_edges_from(self, edges: Iterable[Edge]) -> None:
        succ = self._succ
        for u, v, attrs in edges:
            if u not in succ:
                self._add_node(u)
            if v not in succ:
                self._add_node(v)
            data = succ[u].get(v)
            if data is None:
                data = self._succ[u][v] = self._pred[v][u] = {}
            data.update(attrs)

    @property
    def nodes(self) -> _View:
        return _View(self._nodes)

    @property
    def edges(self) -> _View:
        return _View({(u, v): d for u, out in self._succ.items() for v, d in out.items()})

    def edge_values(self, key: str) -> Iterator[tuple[str, str, Any]]:
        """(u, v, the edge's `key` attribute or None) of every edge, in the edges'
        order: edges(data=key) without building the views."""
        for u, out in self._succ.items():
            for v, d in out.items():
                yield u, v, d.get(key)

    def in_edges(self, node: str, data: bool = False) -> list[Any]:
        return [(u, node, d) if data else (u, node) for u, d in self._pred[node].items()]

    def has_edge(self, u: str, v: str) -> bool:
        return v in self._succ.get(u, {})

    def number_of_nodes(self) -> int:
        return len(self._nodes)


def build_step_graph(costs: StepCosts, *, num_blocks: int | None = None) -> StepGraph:
    """The graph of one step on node 0 (`num_blocks` < the model's blocks gives the
    reduced graphs the search extrapolates from)."""
    num_blocks = costs.num_blocks if num_blocks is None else num_blocks
    graph = StepGraph(links=dict(costs.links), contended=dict(costs.contended),
                      concurrent=costs.concurrent, num_blocks=num_blocks,
                      local_ranks=costs.local_ranks)
    order = rank_order(costs, num_blocks)
    nodes: list[Node] = []
    edges: list[Edge] = []
    for lr in range(costs.local_ranks):
        nodes += _rank_nodes(costs, lr, order)
        edges += _order_edges(costs, lr, order)   # first: a data edge's label wins
        edges += _rank_edges(costs, lr, num_blocks)
    graph.add_nodes_from(nodes)
    graph.add_edges_from(edges)
    return graph


def _engine_of(costs: StepCosts, rank: int, kind: str) -> str:
    return f"r{rank}/{LANE_OF[kind] if costs.concurrent else SERIAL_LANE}"


def _rank_nodes(costs: StepCosts, lr: int, order: list[tuple[str, int]]) -> list[Node]:
    engines = {kind: _engine_of(costs, lr, kind) for kind in LANE_OF}
    work = {kind: _work(costs, lr, kind) for kind in LANE_OF}
    resident_update = {**work["update"], "dur_s": costs.resident_update_s * costs.factor(lr)}
    nodes: list[Node] = []
    seq = dict.fromkeys(engines.values(), -1)
    issued = 0.0   # the host lane: when the rank's thread has issued the tasks so far
    for kind, block in order:
        engine = engines[kind]
        seq[engine] += 1
        task = (resident_update if kind == "update" and costs.is_resident(block)
                else work[kind])
        start, issued = issued, issued + costs.issue(kind, block, lr)
        attrs = {"kind": kind, "rank": lr, "block": block, "lane": LANE_OF[kind],
                 "engine": engine, "seq": seq[engine], "record": kind != FENCE,
                 "issue": (start, issued), **task}
        if costs.staged and kind in ("h2d", "d2h"):
            attrs["staged"] = True   # the host stages it as it issues it: it starts then
        if kind == "allgather":
            attrs["group"] = ("allgather", block, lr // costs.layout.slices)
        elif kind == FENCE:
            attrs["group"] = (FENCE, block, 0)   # every local rank of the node
        nodes.append((task_id(kind, lr, block), attrs))
    return nodes


def _work(costs: StepCosts, lr: int, kind: str) -> Attrs:
    """The work of a task of this kind on this rank (the same for every block)."""
    work: Attrs = {"dur_s": 0.0, "flows": (), "group": None}
    if kind in ("embed", "update", "forward", "head"):
        work["dur_s"] = getattr(costs, f"{kind}_s") * costs.factor(lr)
    elif kind == SLICE_UPDATE:
        work["dur_s"] = costs.slice_s(lr) * costs.factor(lr)
    elif kind in ("h2d", "d2h"):
        work["flows"] = getattr(costs, kind)[lr]
    elif kind == "allgather":
        work.update(dur_s=costs.allgather_latency_s, flows=costs.allgather[lr])
    elif kind == FENCE:
        work["dur_s"] = costs.fence_s
    elif kind == "allreduce":
        work.update(dur_s=costs.allreduce_s, group=("allreduce", NO_BLOCK, 0))
    return work


def _rank_edges(costs: StepCosts, lr: int, num_blocks: int) -> list[Edge]:
    """Data, buffer and fence edges into the rank's tasks."""
    lay = costs.layout
    group = list(costs.slice_group(lr))
    outside = [m for m in range(lay.local_ranks) if m not in group]
    edges: list[Edge] = []
    for b in range(num_blocks):
        edges += _block_edges(costs, lr, b, group, outside)
    edges += _buffer_edges(costs, lr, num_blocks)
    first = f"forward/b0/r{lr}" if num_blocks else task_id("head", lr)
    last = f"forward/b{num_blocks - 1}/r{lr}" if num_blocks else task_id("embed", lr)
    edges += [(task_id("embed", lr), first, _DATA), (last, task_id("head", lr), _DATA)]
    edges += [(task_id("head", m), task_id("allreduce", lr), _DATA)
              for m in range(lay.local_ranks)]
    return edges


def _block_edges(costs: StepCosts, lr: int, b: int, group: list[int],
                 outside: list[int]) -> list[Edge]:
    """Data and fence edges of one block on one rank."""
    resident = costs.is_resident(b)
    upd, fwd = task_id("update", lr, b), task_id("forward", lr, b)
    edges: list[Edge] = [(upd, fwd, _DATA)]
    # what each member contributes to the block: its uploaded (and updated) slice
    source = {m: task_id(SLICE_UPDATE if costs.split_update else "h2d", m, b) for m in group}
    if costs.split_update and not resident:
        edges.append((task_id("h2d", lr, b), source[lr], _DATA))
    ready: str | None
    if costs.layout.slices > 1:
        ready = task_id("allgather", lr, b)
        edges += [(source[m], ready, _DATA) for m in group
                  if not (resident and not costs.split_update)]
    else:
        ready = None if resident else task_id("h2d", lr, b)
    if ready is not None:
        edges.append((ready, upd, _DATA))
    if resident or costs.read_only:
        return edges
    d2h = task_id("d2h", lr, b)
    edges.append((fwd, d2h, _DATA))
    if costs.fence_s:   # CUDA: a node collective issued once the block is ready
        fence = task_id(FENCE, lr, b)
        assert ready is not None   # not resident here: the all-gather or the h2d
        edges += [(ready, fence, _DATA), (fence, d2h, _FENCE)]
    else:   # the slice group's h2d already precede d2h via the all-gather
        edges += [(task_id("h2d", m, b), d2h, _FENCE) for m in outside]
    return edges


def _buffer_edges(costs: StepCosts, lr: int, num_blocks: int) -> list[Edge]:
    """The task that fills a buffer waits for the block `prefetch` buffer-using blocks
    earlier to release it (module docstring)."""
    using = [b for b in range(num_blocks) if costs.uses_buffer(b)]
    p = costs.layout.prefetch
    edges: list[Edge] = []
    for i in range(p, len(using)):
        before, b = using[i - p], using[i]
        released = costs.is_resident(before) or costs.read_only
        release = task_id("forward" if released else "d2h", lr, before)
        fill = task_id("allgather" if costs.is_resident(b) else "h2d", lr, b)
        edges.append((release, fill, _BUFFER))
    return edges


def _order_edges(costs: StepCosts, lr: int, order: list[tuple[str, int]]) -> list[Edge]:
    """Program order on each engine (where a data edge joins the same pair, it is added
    after these and its label wins)."""
    last_on: dict[str, tuple[str, str]] = {}
    edges: list[Edge] = []
    for kind, block in order:
        engine, node = _engine_of(costs, lr, kind), task_id(kind, lr, block)
        prev = last_on.get(engine)
        if prev is not None:
            edges.append((prev[0], node, _ORDER))
        last_on[engine] = (node, kind)
    return edges
