"""Which blocks stay on the devices: the resident pattern of a layout.

`zoplan optimize --placement host` offloads every block (DistZO2's choice). With
`auto` (the default) the search also prices each layout with as many resident blocks
as its devices hold beside everything else (zoplan.pricing.memory.resident_capacity, which
keeps a safety margin). More resident blocks never cost time: a resident block does what
an offloaded one does minus its PCIe traffic (its all-gather, update and forward are the
same), so the most that fit is the one count worth pricing.

Which ones: spread evenly among the offloaded ones, starting with a resident block. The
PCIe stream of the offloaded blocks is the bottleneck a resident block relieves; while
the compute engine works on a resident block (no upload to wait for) the uploads of the
next offloaded blocks run ahead into the free buffers, so every resident block gives the
PCIe link a block's compute time of slack, and spreading them gives that slack where it
is used: between offloaded blocks. Grouped together (all resident blocks first, say), the
link would idle through the resident run and then be the bottleneck through the rest. A
resident first block also lets the step's compute start without waiting for an upload.

The pattern repeats with a short period (at most MAX_PERIOD blocks: r resident in every
q, spread by rounding up), so that the search can extrapolate a step from reduced-block
simulations as it does for identical blocks (zoplan.search.evaluate); the count is the
largest such pattern that fits, which can leave up to a few blocks' worth of memory
unused when the capacity falls between two fractions r/q.
"""

from __future__ import annotations

import functools
import math

MAX_PERIOD = 8


@functools.lru_cache(maxsize=4096)
def pattern_of(num_blocks: int, resident: int, period: int) -> tuple[bool, ...]:
    """Blocks 0..num_blocks-1, `resident` in every `period` (spread by rounding up:
    position i of a period is resident when ceil((i+1) r / q) > ceil(i r / q))."""
    r, q = resident, period
    one = [math.ceil((i + 1) * r / q) > math.ceil(i * r / q) for i in range(q)]
    return tuple(one[b % q] for b in range(num_blocks))


@functools.lru_cache(maxsize=4096)
def resident_pattern(num_blocks: int, capacity: int) -> tuple[tuple[bool, ...], int]:
    """(per block: resident, period) with the most resident blocks not above
    `capacity` whose pattern repeats within MAX_PERIOD blocks; ((), 1) when none fits."""
    if capacity >= num_blocks:
        return (True,) * num_blocks, 1
    best: tuple[int, int, int] | None = None   # (count, -period, r)
    for q in range(2, MAX_PERIOD + 1):
        for r in range(1, q):
            if math.gcd(r, q) != 1:
                continue
            count = sum(pattern_of(num_blocks, r, q))
            if count <= capacity and (best is None or (count, -q) > best[:2]):
                best = (count, -q, r)
    if best is None or best[0] == 0:
        return (), 1
    count, neg_q, r = best
    return pattern_of(num_blocks, r, -neg_q), -neg_q
