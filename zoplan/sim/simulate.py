"""SimPy simulation of a step graph: engines that do one thing at a time, and shared
links whose bandwidth concurrent transfers share max-min fairly.

Engines: one SimPy process per engine of the graph (per rank: compute, h2d, collective,
d2h on CUDA; one serial engine per rank on CPU profiles). A process walks its tasks in
program order; a task starts when its dependencies are done and its rank's host has
begun issuing it (a copy or collective: finished issuing it), and ends no sooner than
its issue (the node's `issue` window, zoplan.pricing.host). A collective starts when
its last member reaches it and ends for all members at once.

Links (`FairShareNetwork`): a transfer is a set of flows, each crossing a route of links
and optionally capped on its own (the collective table). A direction link of a PCIe
link or switch uplink may have a lower capacity while its opposite direction carries a
flow (duplex: an A100's H2D drops to 11-13 GB/s while D2H runs, D2H stays near 24).
At every instant the rates are
the max-min fair allocation (progressive filling): raise all rates together, freeze the
flows of a link when it saturates (or a flow when it reaches its own cap), repeat. When a
flow starts or ends, only the flows of its component (the links that routes join, e.g.
one GPU's NVLink ports, or every PCIe link + host memory) are re-rated, once per instant
however many flows changed (the recompute is an event of lower priority than everything
else scheduled at that time). The next completion is
one timer; a rate change re-arms it and the stale timer is ignored (SimPy cannot cancel).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Generator, Iterable
from dataclasses import dataclass, field
from typing import Any

import simpy
from simpy.events import Event

from zoplan.sim.graph import Attrs, StepGraph
from zoplan.trace import Span

# one flow of a transfer: (bytes, link indices, its own cap in bytes/s)
FlowSpec = tuple[float, tuple[int, ...], float]
# a SimPy process: yields events, is sent their values (unused)
_Process = Generator[Any, Any, None]

_LATE = 2            # priority after simpy's NORMAL (1) and URGENT (0): end of the instant
_REL_TOL = 1e-9      # a flow within 1e-9 of its size (+ 1e-3 bytes) of its end is done
_ABS_TOL_BYTES = 1e-3


@dataclass(frozen=True, kw_only=True)
class SimResult:
    step_time_s: float
    spans: tuple[Span, ...]
    link_bytes: dict[str, float]
    times: dict[str, tuple[float, float]] = field(default_factory=dict, compare=False,
                                                  repr=False)  # name -> (start, end)


class _Flow:
    __slots__ = ("size", "remaining", "links", "cap", "rate", "batch", "done")

    def __init__(self, size: float, links: tuple[int, ...], cap: float,
                 batch: list[Any]) -> None:   # batch: [flows left, the event to fire]
        self.size = self.remaining = size
        self.links, self.cap, self.batch = links, cap, batch
        self.rate = 0.0
        self.done = False


class FairShareNetwork:
    """Links with capacities (bytes/s) shared max-min fairly by the active flows.

    `component_of` maps each link to its static component: links that some route joins
    (directly or through other links) share a component, and only the flows of a
    component whose flows changed are re-rated. Flows of one component that happen not to
    share a link at the moment get the same rates as if rated apart (max-min fairness
    decomposes), so this is exact, and cheaper than finding the connected flows."""

    def __init__(self, env: simpy.Environment, capacities: list[float],
                 component_of: list[int] | None = None,
                 contended: dict[int, tuple[int, float]] | None = None) -> None:
        """`contended`: link -> (opposite link, capacity while that one carries a
        flow); both must be in one component (link_components(..., pairs))."""
        self.env = env
        self.base = list(capacities)
        self.cap = list(capacities)      # capacities now (contended links may drop)
        self.component_of = component_of or [0] * len(capacities)
        self.contended = dict(contended or {})
        self.watchers: dict[int, list[int]] = {}   # opposite link -> links it lowers
        for link, (other, _) in sorted(self.contended.items()):
            self.watchers.setdefault(other, []).append(link)
        self.busy = [0] * len(capacities)           # active flows per link
        self.active: list[_Flow] = []
        self.by_component: dict[int, list[_Flow]] = {}
        self.link_bytes = [0.0] * len(capacities)
        self._t = 0.0           # progress of the active flows is known up to this time
        self._dirty: set[int] = set()
        self._pending = False
        self._gen = 0

    def transfer(self, flows: Iterable[FlowSpec]) -> Event:
        """Start `flows` ((bytes, link indices, cap_Bps), ...) now; the returned event
        fires when the last of them is done."""
        done = Event(self.env)
        batch: list[Any] = [0, done]
        self._advance()
        for size, links, cap in flows:
            if size <= 0:
                continue
            flow = _Flow(float(size), links, cap, batch)
            batch[0] += 1
            self._occupy(links, +1)
            self.active.append(flow)
            comp = self.component_of[links[0]] if links else -1 - id(flow)
            self.by_component.setdefault(comp, []).append(flow)
            self._dirty.add(comp)
        if batch[0] == 0:
            done.succeed()
        else:
            self._request_recompute()
        return done

    def _occupy(self, links: tuple[int, ...], delta: int) -> None:
        """Count a flow on its links; a link that becomes busy or idle sets the
        capacity of the links it contends with (re-rated at this instant's recompute)."""
        busy, watchers = self.busy, self.watchers
        for link in links:
            before = busy[link]
            busy[link] += delta
            if (before == 0) == (busy[link] == 0):
                continue
            for other in watchers.get(link, ()):
                self.cap[other] = (self.contended[other][1] if busy[link]
                                   else self.base[other])
                self._dirty.add(self.component_of[other])

    # ---- time keeping -----------------------------------------------------------
    def _advance(self) -> None:
        dt = self.env.now - self._t
        if dt > 0:
            for flow in self.active:
                flow.remaining -= flow.rate * dt
            self._t = self.env.now

    def _request_recompute(self) -> None:
        if not self._pending:
            self._pending = True
            event = Event(self.env)
            event._ok, event._value = True, None
            event.callbacks.append(self._recompute)
            self.env.schedule(event, _LATE)

    def _recompute(self, _event: Event) -> None:
        self._pending = False
        self._advance()
        for comp in sorted(self._dirty):
            flows = self.by_component.get(comp)
            if flows:
                fill_rates(flows, self.cap)
        self._dirty.clear()
        self._arm_timer()

    def _arm_timer(self) -> None:
        self._gen += 1
        soonest = math.inf
        for flow in self.active:
            if flow.rate > 0:
                left = flow.remaining / flow.rate
                if left < soonest:
                    soonest = left
        if soonest < math.inf:
            timer = self.env.timeout(max(soonest, 0.0))
            timer.callbacks.append(functools.partial(self._on_timer, self._gen))

    def _on_timer(self, gen: int, _event: Event) -> None:
        if gen != self._gen:
            return  # rates changed since this timer was armed
        self._advance()
        finished = [f for f in self.active
                    if f.rate > 0 and f.remaining <= _REL_TOL * f.size + _ABS_TOL_BYTES]
        if not finished:  # rounding: the flow the timer was armed for ends now
            finished = [min((f for f in self.active if f.rate > 0),
                            key=lambda f: f.remaining / f.rate)]
        for flow in finished:
            self._finish(flow)
        self.active = [f for f in self.active if not f.done]
        self._request_recompute()

    def _finish(self, flow: _Flow) -> None:
        flow.done = True
        comp = self.component_of[flow.links[0]] if flow.links else -1 - id(flow)
        self.by_component[comp].remove(flow)
        self._dirty.add(comp)
        for link in flow.links:
            self.link_bytes[link] += flow.size
        self._occupy(flow.links, -1)
        flow.batch[0] -= 1
        if flow.batch[0] == 0:
            flow.batch[1].succeed()


def link_components(num_links: int, routes: Iterable[tuple[int, ...]]) -> list[int]:
    """Static component of each link: union of the links of every route (a pair of
    links that contend, given as a route of two, joins their components too)."""
    parent = list(range(num_links))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i
    for route in routes:
        for link in route[1:]:
            a, b = root(route[0]), root(link)
            if a != b:
                parent[max(a, b)] = min(a, b)
    return [root(i) for i in range(num_links)]


def fill_rates(flows: list[_Flow], cap: list[float]) -> None:
    """Max-min fair rates by progressive filling. `flows` must be closed under link
    sharing (every flow on a link they use is in the list). One flow alone (the most
    common case) takes its rate alone at once: the same figure the filling reaches.
    Several are filled by fair_rates, cached on what the rates depend on (each flow's
    links and cap, the links' capacities now): a step repeats the same few sets of
    concurrent flows block after block (a 65,536-GPU search: 7,410 fills, 278 sets)."""
    if len(flows) == 1 and _fill_one(flows[0], cap):
        return
    rates = fair_rates(tuple((f.links, f.cap) for f in flows), tuple(cap))
    for flow, rate in zip(flows, rates):
        flow.rate = rate


def _fill_one(flow: _Flow, cap: list[float]) -> bool:
    """A lone flow's rate: the least of its cap and its links' capacities, as the first
    round of fair_rates sets it (False, nothing set, when its route crosses a link
    twice: that link's share is halved, left to the general path)."""
    links = flow.links
    if len(links) > 1 and len(set(links)) < len(links):
        return False
    level = flow.cap
    for link in links:
        share = float(cap[link])   # a float, as the general path's share (capacity / count)
        if share < level:
            level = share
    flow.rate = max(level, 0.0)
    return True


@functools.lru_cache(maxsize=4096)
def fair_rates(flows: tuple[tuple[tuple[int, ...], float], ...],
               cap: tuple[float, ...]) -> tuple[float, ...]:
    """Max-min fair rate of each flow ((links, cap) each; `cap`: every link's capacity)
    by progressive filling: every round raises the unfrozen flows to the least of their
    caps and their links' fair shares (capacity left / flows left), then freezes the
    flows at a cap or on a link that saturates at that level."""
    left: dict[int, float] = {}
    count: dict[int, int] = {}
    for links, _ in flows:
        for link in links:
            if link in count:
                count[link] += 1
            else:
                left[link], count[link] = cap[link], 1
    rates = [0.0] * len(flows)
    unfrozen = list(range(len(flows)))
    while unfrozen:
        shares = {link: left[link] / n for link, n in count.items() if n}
        level = min([flows[i][1] for i in unfrozen])
        if shares:
            level = min(level, min(shares.values()))
        level = max(level, 0.0)
        limit = level * (1 + 1e-12)
        saturated = {link for link, share in shares.items() if share <= limit}
        rest = []
        for i in unfrozen:
            links, flow_cap = flows[i]
            if flow_cap <= limit or not saturated.isdisjoint(links):
                rates[i] = level
                for link in links:
                    left[link] -= level
                    count[link] -= 1
            else:
                rest.append(i)
        unfrozen = rest
    return tuple(rates)


# ---- the simulation -----------------------------------------------------------------
class _Group:
    __slots__ = ("size", "arrived", "start", "done", "dur", "flows")

    def __init__(self, env: simpy.Environment, dur: float) -> None:
        self.size, self.arrived, self.start = 0, 0, 0.0
        self.done = Event(env)
        self.dur = dur
        self.flows: list[FlowSpec] = []


class _Sim:
    """The graph flattened into lists (index = node position), run with SimPy."""

    def __init__(self, graph: StepGraph) -> None:
        self.env = simpy.Environment()
        nodes = graph.nodes
        names = list(nodes)
        index = {n: i for i, n in enumerate(names)}
        self.names = names
        self.attrs: list[Attrs] = [nodes[n] for n in names]
        self.deps: list[list[int]] = [[] for _ in names]
        for u, v, why in graph.edge_values("why"):
            if why != "order":   # the engine's program order already holds it
                self.deps[index[v]].append(index[u])
        links = graph.graph["links"]
        self.link_names = list(links)
        link_index = {name: i for i, name in enumerate(self.link_names)}
        routes: dict[tuple[str, ...], tuple[int, ...]] = {}
        self.flows: list[list[FlowSpec]] = [[(f.num_bytes, _route(routes, link_index, f.route), f.cap_Bps)
                       for f in a["flows"]] for a in self.attrs]
        contended = {link_index[name]: (link_index[other], cap)
                     for name, (other, cap) in graph.graph.get("contended", {}).items()
                     if name in link_index and other in link_index}
        pairs: list[tuple[int, ...]] = [(a, b) for a, (b, _) in contended.items()]
        self.net = FairShareNetwork(self.env, [links[n] for n in self.link_names],
                                    link_components(len(links), list(routes.values()) + pairs),
                                    contended)
        self.dur = [a["dur_s"] for a in self.attrs]
        self.issue = [a.get("issue", (0.0, 0.0)) for a in self.attrs]
        self.staged = [a.get("staged", False) for a in self.attrs]
        self.finished = [False] * len(names)
        self.waiters: dict[int, Event] = {}   # task -> event, made only when waited for
        self.start = [0.0] * len(names)
        self.end = [0.0] * len(names)
        self.group_of = self._groups()
        self._engines = self._engine_lists()

    def _groups(self) -> list[_Group | None]:
        groups: dict[tuple[str, int, int], _Group] = {}
        out: list[_Group | None] = []
        for i, a in enumerate(self.attrs):
            key = a["group"]
            if key is None:
                out.append(None)
                continue
            group = groups.get(key)
            if group is None:
                group = groups[key] = _Group(self.env, a["dur_s"])
            group.size += 1
            group.flows.extend(self.flows[i])
            out.append(group)
        return out

    def _engine_lists(self) -> list[list[int]]:
        by_engine: dict[str, list[tuple[int, int]]] = {}
        for i, a in enumerate(self.attrs):
            by_engine.setdefault(a["engine"], []).append((a["seq"], i))
        return [[i for _, i in sorted(v)] for _, v in sorted(by_engine.items())]

    def run(self) -> None:
        for tasks in self._engines:
            self.env.process(self._engine(tasks))
        self.env.run()

    def _engine(self, tasks: list[int]) -> _Process:
        env, finished, deps, dur, flows = (self.env, self.finished, self.deps, self.dur,
                                           self.flows)
        group_of, issue, staged, waiters = self.group_of, self.issue, self.staged, self.waiters
        for i in tasks:
            for j in deps[i]:
                if not finished[j]:
                    yield self._waiter(j)
            group = group_of[i]
            issue_start, issue_end = issue[i]
            # the host lane: a task starts once its issue starts (a copy or a collective
            # once it is issued, a copy the host stages as it issues it at once) and
            # ends no sooner than its issue
            ready = issue_end if (flows[i] and not staged[i]) or group is not None \
                else issue_start
            if env.now < ready:
                yield env.timeout(ready - env.now)
            if group is None:
                start = env.now
                if dur[i] > 0:
                    yield env.timeout(dur[i])
                if flows[i]:
                    yield self.net.transfer(flows[i])
                if env.now < issue_end:
                    yield env.timeout(issue_end - env.now)
            else:
                yield from self._collective(group)
                start = group.start
            self.start[i], self.end[i] = start, env.now
            finished[i] = True
            waiter = waiters.pop(i, None)
            if waiter is not None:
                waiter.succeed()

    def _waiter(self, task: int) -> Event:
        waiter = self.waiters.get(task)
        if waiter is None:
            waiter = self.waiters[task] = Event(self.env)
        return waiter

    def _collective(self, group: _Group) -> _Process:
        """The last member to arrive runs the collective; the others wait for it."""
        group.arrived += 1
        if group.arrived < group.size:
            yield group.done
            return
        group.start = self.env.now
        if group.dur > 0:
            yield self.env.timeout(group.dur)
        if group.flows:
            yield self.net.transfer(group.flows)
        group.done.succeed()

    def spans(self) -> tuple[Span, ...]:
        """The spans of the recorded tasks (a node with `record` false, the CUDA fence,
        is simulated but the executor does not trace it)."""
        return tuple(Span(kind=a["kind"], rank=a["rank"], block=a["block"], lane=a["lane"],
                          start_s=self.start[i], dur_s=self.end[i] - self.start[i])
                     for i, a in enumerate(self.attrs) if a.get("record", True))

    def times(self) -> dict[str, tuple[float, float]]:
        """(start, end) of every task by name, recorded or not."""
        return {name: (self.start[i], self.end[i]) for i, name in enumerate(self.names)}


def _route(cache: dict[tuple[str, ...], tuple[int, ...]], link_index: dict[str, int],
           route: tuple[str, ...]) -> tuple[int, ...]:
    if route not in cache:
        cache[route] = tuple(link_index[name] for name in route)
    return cache[route]


def simulate(graph: StepGraph, *, record_spans: bool = True) -> SimResult:
    """Run one step of `graph` (zoplan.sim.graph.build_step_graph); spans of every task."""
    sim = _Sim(graph)
    sim.run()
    unfinished = [sim.names[i] for i, done in enumerate(sim.finished) if not done]
    assert not unfinished, f"simulation deadlocked at {unfinished[:3]}"
    return SimResult(step_time_s=max(sim.end, default=0.0),
                     spans=sim.spans() if record_spans else (),
                     link_bytes=dict(zip(sim.link_names, sim.net.link_bytes)),
                     times=sim.times() if record_spans else {})
