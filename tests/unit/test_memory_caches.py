"""The planner's caches and shortcuts give what the general computation gives: the
step and transient memory terms, cached on a layout's pertp and ddp alone
(zoplan.memory._stream_terms), equal the terms computed from the whole layout, for layouts that differ in every other axis; the
counted z draws equal the chunks listed; a layout's dict equals asdict's."""

from __future__ import annotations

import dataclasses
import itertools
import random

import pytest

from zoplan import hostmemory, memory
from zoplan.execrules import chunk_bounds, z_chunk, z_draw_calls
from zoplan.layout import Layout
from zoplan.models import get_model
from zoplan.workload import Workload

WORKLOADS = [
    Workload(batch=16, seq=512, param_dtype="fp16", compute_dtype="fp16", update="stochastic"),
    Workload(batch=16, seq=512, param_dtype="fp32", compute_dtype="fp32", update="master",
             estimator="lowrank", directions=4),
    Workload(batch=16, seq=512, param_dtype="fp16", compute_dtype="fp16", update="master",
             tuning="lora"),
]


def _layouts():
    """Layouts of 8 ranks a node on 1 or 2 nodes, every pertp, slice group, prefetch
    depth and slice update."""
    for nodes, pertp, slices, prefetch, su in itertools.product(
            (1, 2), (1, 2), (1, 2, 4, 8), (1, 2, 3), (False, True)):
        yield Layout(pertp=pertp, ddp=8 * nodes // pertp, nodes=nodes, slices=slices,
                     prefetch=prefetch, slice_update=su and slices > 1)


@pytest.mark.parametrize("workload", WORKLOADS, ids=["stochastic", "lowrank-q4", "lora"])
@pytest.mark.parametrize("kind", ["cuda", "cpu"])
def test_the_terms_cached_on_part_of_a_layout_equal_those_of_the_whole_layout(workload, kind):
    model = get_model("opt-125m")
    stream_terms = memory._stream_terms.__wrapped__
    for layout in _layouts():
        shards = Layout(pertp=layout.pertp, ddp=layout.ddp)
        for kernel in (False, True):
            assert (stream_terms(model, workload, layout, kind, kernel=kernel)
                    == stream_terms(model, workload, shards, kind, kernel=kernel)), layout


def test_z_draw_calls_counts_the_chunks_chunk_bounds_lists():
    rng = random.Random(7)
    sizes = [0, 1, 2**20 - 1, 2**20, 2**20 + 1, 2**24, 2**24 + 1, 3 * 2**24]
    sizes += [rng.randrange(0, 2**27) for _ in range(200)]
    for kind in ("cpu", "cuda"):
        chunk = z_chunk(kind)
        for n in sizes:
            assert z_draw_calls([n], kind) == len(chunk_bounds(n, chunk)), (kind, n)
        assert z_draw_calls(sizes, kind) == sum(len(chunk_bounds(n, chunk)) for n in sizes)


def test_a_layouts_dict_is_asdicts():
    for layout in _layouts():
        assert layout.to_dict() == dataclasses.asdict(layout)
        assert list(layout.to_dict()) == list(dataclasses.asdict(layout))


@pytest.mark.parametrize("workload", WORKLOADS, ids=["stochastic", "lowrank-q4", "lora"])
def test_a_cuda_nodes_host_bytes_depend_on_its_ranks_and_slices_alone(workload):
    """node_host_memory prices a CUDA node's host memory on Layout(ddp=local ranks,
    slices) for every layout (cached): the same terms as from the whole layout."""
    model = get_model("opt-125m")
    whole_layout = hostmemory._node_host.__wrapped__   # the body, on the layout as given
    for layout in _layouts():
        for resident in (0, 3):
            whole = whole_layout(model, workload, layout, "cuda", True, resident)
            node = hostmemory.node_host_memory(model=model, workload=workload, layout=layout,
                                               device_kind="cuda", resident_blocks=resident)
            assert whole == node, layout
