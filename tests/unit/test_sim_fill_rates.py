"""Max-min fair rates (zoplan.sim.simulate.fill_rates): its lone-flow fast path and its
progressive filling (fair_rates, cached or not) give, bit for bit, the rates of the
textbook progressive filling below, on random flows, routes and capacities (ties, caps
and idle links included)."""

from __future__ import annotations

import random

import pytest

from zoplan.sim.simulate import _Flow, fair_rates, fill_rates


def _textbook(flows: list[_Flow], cap: list[float]) -> None:
    """Progressive filling as first written: raise every unfrozen flow to the least of
    their caps and the links' shares, freeze the flows at a cap or on a saturated link."""
    links: dict[int, list[float]] = {}
    for flow in flows:
        for link in flow.links:
            entry = links.get(link)
            if entry is None:
                links[link] = [cap[link], 1]
            else:
                entry[1] += 1
    unfrozen = flows
    while unfrozen:
        level = min(f.cap for f in unfrozen)
        for left, count in links.values():
            if count:
                level = min(level, left / count)
        level = max(level, 0.0)
        limit = level * (1 + 1e-12)
        saturated = {link for link, (left, count) in links.items()
                     if count and left / count <= limit}
        rest = []
        for flow in unfrozen:
            if flow.cap <= limit or any(link in saturated for link in flow.links):
                flow.rate = level
                for link in flow.links:
                    entry = links[link]
                    entry[0] -= level
                    entry[1] -= 1
            else:
                rest.append(flow)
        unfrozen = rest


def _random_case(rng: random.Random, num_flows: int) -> tuple[list[tuple], list[float]]:
    """(size, links, cap) per flow and the link capacities: a few distinct capacities
    and caps so that ties happen, routes of 0-4 links that may repeat a link."""
    num_links = rng.randint(1, 8)
    cap = [rng.choice([12e9, 25e9, 25e9, 300e9, rng.uniform(1e9, 50e9)]) for _ in range(num_links)]
    flows = []
    for _ in range(num_flows):
        route = tuple(rng.randrange(num_links) for _ in range(rng.randint(0, 4)))
        limit = rng.choice([float("inf"), 20e9, rng.uniform(1e9, 40e9)])
        if not route and limit == float("inf"):
            limit = 10e9
        flows.append((rng.uniform(1, 1e9), route, limit))
    return flows, cap


def _rates(fill, spec: list[tuple], cap: list[float]) -> list[float]:
    flows = [_Flow(size, links, limit, []) for size, links, limit in spec]
    fill(flows, cap)
    return [f.rate for f in flows]


@pytest.mark.parametrize("num_flows", [1, 1, 2, 3, 8, 16])
def test_fill_rates_matches_the_textbook_filling_bit_for_bit(num_flows):
    rng = random.Random(1000 + num_flows)
    for _ in range(400):
        spec, cap = _random_case(rng, num_flows)
        want = _rates(_textbook, spec, cap)
        assert _rates(fill_rates, spec, cap) == want, (spec, cap)
        assert _rates(fill_rates, spec, cap) == want, (spec, cap)   # again: from the cache
        assert list(fair_rates.__wrapped__(tuple((links, limit) for _, links, limit in spec),
                                           tuple(cap))) == want, (spec, cap)


def test_a_lone_flow_on_a_link_it_crosses_twice_gets_half_of_it():
    """The fast path leaves a route that repeats a link to the general filling."""
    assert _rates(fill_rates, [(1.0, (0, 0), float("inf"))], [10.0]) == [5.0]
