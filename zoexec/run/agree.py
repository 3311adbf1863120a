"""Nodes agree: a job of several nodes keeps one copy of the model per node (each node's
block store and its ranks' resident parts), and every copy must stay the same bytes.
At each snapshot, at the end, and every --check-nodes-every steps, each rank checksums
its share of its node's store (block b on local rank b mod local ranks; local rank 0
the resident parts too), rank 0 compares the nodes, and a difference stops every rank
at the same step with one line naming the nodes and blocks (NodesDiverged; no snapshot
is written: no node can say which copy is right; the last snapshot stays).

Between steps the copies hold the same updates (the pending one is not applied yet on
any node), so the check needs no flush; the resident shards are written into the
store's slots first (Trainer.store_shards), as for a snapshot.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, cast

import torch

from zoexec.runtime import groups as zgroups

if TYPE_CHECKING:
    from zoexec.train.engine import Trainer

RESIDENT = "resident"


class NodesDiverged(Exception):
    """The nodes' copies of the model differ: the run stops on purpose (exit 1)."""

    on_purpose = True
    exit_code = 1


def tensor_sha256(tensor: torch.Tensor) -> str:
    """sha256 of a tensor's bytes (contiguous, on the CPU)."""
    flat = tensor.detach().reshape(-1).contiguous().to("cpu")
    return hashlib.sha256(memoryview(flat.view(torch.uint8).numpy())).hexdigest()


def local_digests(trainer: Trainer, env: zgroups.DistEnv) -> dict[int | str, str]:
    """This rank's share of its node's copy: {block: sha256} (and the resident parts'
    on local rank 0)."""
    store, local = trainer.store, env.layout.local_ranks
    out: dict[int | str, str] = {b: tensor_sha256(store.weights(b)) for b in range(store.num_blocks)
           if b % local == env.local_rank}
    if env.local_rank == 0:
        out[RESIDENT] = tensor_sha256(trainer.theta_r)
    return out


def diverged(every: list[dict[int | str, str]], *, local_ranks: int) -> str | None:
    """The nodes whose copy differs from node 0's, in a line (None: all agree)."""
    nodes: dict[int, dict[int | str, str]] = {}
    for rank, digests in enumerate(every):
        nodes.setdefault(rank // local_ranks, {}).update(digests)
    first = nodes[0]
    bad = {node: sorted((k for k in first if have.get(k) != first[k]), key=str)
           for node, have in nodes.items() if node != 0}
    bad = {node: keys for node, keys in bad.items() if keys}
    if not bad:
        return None
    parts = [f"node {node} ({', '.join(_what(k) for k in keys[:4])}"
             f"{', ...' if len(keys) > 4 else ''})" for node, keys in sorted(bad.items())]
    return f"differ from node 0's: {'; '.join(parts)}"


def _what(key: int | str) -> str:
    return "the resident parts" if key == RESIDENT else f"block {key}"


def check_nodes(trainer: Trainer, env: zgroups.DistEnv, *, step: int) -> None:
    """Collective: every node's copy compared after the step of index `step` (step + 1
    done, as its message says); NodesDiverged on every rank when one differs (a one-node
    job checks nothing)."""
    if env.layout.nodes == 1:
        return
    trainer.store_shards()
    zgroups.host_barrier(env)   # every write-back of the step is in the stores
    every = zgroups.gather_objects(env, local_digests(trainer, env))
    verdict = diverged(cast(list[dict[int | str, str]], every), local_ranks=env.layout.local_ranks) if env.rank == 0 else None
    verdict = zgroups.broadcast_object(env, verdict)
    if verdict:
        raise NodesDiverged(f"the nodes' copies of the model after step {step + 1} {verdict}: "
                            f"the run stops (a node's memory or device changed the weights; "
                            f"the last snapshot is kept)")
