"""Building the node's model across processes: the other local ranks wait for the
builder as long as the bytes to fill need (not the process group's timeout), give up
with a ZoError saying what they waited for. (What the builder holds beyond the store:
tests/integration/test_node_memory.py, which need not run alone.)"""

from __future__ import annotations

import multiprocessing
import os
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from torch.distributed import distributed_c10d

from zoexec.config import RuntimeOptions
from zoexec.runtime import groups as zgroups
from zoexec.store.blocks import SHM_DIR
from zoexec.store.node import monitored_barrier, share_on_node
from zoplan.layout import Layout

# `serial` (scripts/test.sh runs it alone): the ranks' process groups time out after
# 1 s here (to show that the waits tested outlast them), so a rank kept off the CPU
# for a second by a test beside it (two cores, two test processes) fails its
# rendezvous or collective for that reason, not for the rule tested.
pytestmark = pytest.mark.serial


# The ranks' events, so that no outcome depends on how fast the machine runs: each rank
# sets its own when it reaches the point named, and waits (at most a minute) for its
# peer's where the test needs an order.
WAITING, DONE = "waiting", "done"


def _rank(rank: int, init: Path, path: Path, what: str, plan: dict, events: dict, out) -> None:
    """One of two local ranks; reports (rank, "ok", sum of the store) or (rank, "error",
    text). `plan`: after which of the peer's events the builder fills the store (store)
    or rank 1 enters the barrier (barrier), how long it then sleeps, each rank's wait."""
    result = (rank, "error", "did not finish")
    peer = 1 - rank
    try:
        place = zgroups.RankPlace(rank=rank, local_rank=rank, world_size=2, local_world_size=2,
                                init_file=str(init))
        env = zgroups.init_distributed(place=place, layout=Layout(pertp=2), device_kind="cpu",
                                     runtime=RuntimeOptions(timeout_s=1.0))

        def after_peer() -> None:
            events[peer, plan["after"]].wait(60)
            time.sleep(plan["sleep_s"])

        if what == "store":
            def fill(store):
                after_peer()
                store.flat.fill_(7.0)

            events[rank, WAITING].set()
            store = share_on_node(env, path, fill if rank == 0 else None, what="the test store",
                                  timeout_s=plan["timeout_s"], num_blocks=1, block_numel=64,
                                  stride=64, dtype=torch.float32)
            result = (rank, "ok", float(store.flat.sum()))
        else:
            events[rank, WAITING].set()
            if rank == 1:
                after_peer()
            monitored_barrier(env, env.host_world, timeout_s=plan["timeout_s"],
                              what="every node's test")
            result = (rank, "ok", 0.0)
    except Exception as exc:  # noqa: BLE001 - reported to the test
        result = (rank, "error", f"{type(exc).__name__}: {exc}")
    finally:
        events[rank, DONE].set()
        out.put(result)
        os._exit(0)


def _two_ranks(monkeypatch, tmp_path, what: str, **plan) -> tuple[dict, Path]:
    """Two local ranks meeting through a rendezvous file (no port to collide on)."""
    # the process groups' own timeouts: 1 s (the world's from --timeout-s, the others' torch's default)
    monkeypatch.setattr(distributed_c10d, "default_pg_timeout", timedelta(seconds=1))
    path = SHM_DIR / f"zoexec-test{uuid.uuid4().hex[:8]}-n0"
    ctx = multiprocessing.get_context("fork")
    out = ctx.SimpleQueue()
    events = {(r, e): ctx.Event() for r in range(2) for e in (WAITING, DONE)}
    procs = [ctx.Process(target=_rank, args=(r, tmp_path / "rendezvous", path, what, plan,
                                             events, out)) for r in range(2)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
    results = {}
    while not out.empty():
        rank, status, value = out.get()
        results[rank] = (status, value)
    return results, path


def test_the_others_wait_for_a_slow_builder_past_the_groups_timeout(monkeypatch, tmp_path):
    """The builder fills 2.5 s after rank 1 began to wait, past the process group's
    timeout (1 s); the wait is sized by the caller (60 s), so both ranks map the store."""
    results, path = _two_ranks(monkeypatch, tmp_path, "store", after=WAITING, sleep_s=2.5,
                               timeout_s=60.0)
    assert results == {0: ("ok", 448.0), 1: ("ok", 448.0)}, results
    assert not path.exists()


def test_a_lost_builder_is_named_in_the_error(monkeypatch, tmp_path):
    """The builder fills only once rank 1 has given up (its wait: 0.5 s)."""
    results, path = _two_ranks(monkeypatch, tmp_path, "store", after=DONE, sleep_s=0.0,
                               timeout_s=0.5)
    status, text = results[1]
    assert status == "error" and text.startswith(
        "PeerGone: rank 1 (node 0) waited for local rank 0 to fill the test store and gave up "
        "(timeout 0.5 s)"), text
    assert results[0][0] == "error", results
    assert not path.exists()


def test_the_monitored_barrier_waits_as_long_as_asked(monkeypatch, tmp_path):
    """Rank 1 arrives 2.5 s after rank 0 began to wait, past the groups' timeout."""
    results, _ = _two_ranks(monkeypatch, tmp_path, "barrier", after=WAITING, sleep_s=2.5,
                            timeout_s=60.0)
    assert results == {0: ("ok", 0.0), 1: ("ok", 0.0)}, results


def test_a_late_rank_fails_the_monitored_barrier_with_what_it_waited_for(monkeypatch, tmp_path):
    """Rank 1 arrives only once rank 0 has given up (its wait: 0.5 s)."""
    results, _ = _two_ranks(monkeypatch, tmp_path, "barrier", after=DONE, sleep_s=0.0,
                            timeout_s=0.5)
    status, text = results[0]
    assert status == "error" and text.startswith(
        "PeerGone: rank 0 waited for every node's test and gave up (timeout 0.5 s): "), text
    assert "Rank 1 failed to pass monitoredBarrier" in text, text
