"""The node's model, built once and shared by the node's ranks: local rank 0 (the
builder) fills the node's block store (shared memory) block by block, straight from
the seeded random init or the checkpoint (zoexec.store.loading), and a handover file of the
resident weights; the other local ranks build a skeleton (resident modules and one
working block, no weights) and map them. Also the node's read stamps of the CPU
write-back fence, and what a rank's memory looks like at the end of a run.

Waiting for the builder: the other local ranks wait for its "filled" message on the
host (gloo) node group, at most loading.fill_timeout_s of the bytes to fill (today's
timeout plus the bytes at a slow fill rate); a builder that dies ends their wait at
once. Then a monitored barrier (the builder times its peers' mapping) and, once every
node has its model, a monitored barrier of the world with the same timeout.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection
from datetime import timedelta
from pathlib import Path
from typing import TypedDict, Unpack

import psutil
import torch
import torch.distributed as dist

from zoexec.config import RunConfig
from zoexec.model.families import ModelParts, bind_resident
from zoexec.runtime import groups as zgroups
from zoexec.runtime import pinning as zpinning
from zoexec.runtime.errors import PeerGone
from zoexec.runtime.hostmem import mapping_pss_bytes
from zoexec.store.blocks import (
    BlockStore,
    attach_store,
    create_store,
    store_path,
)
from zoexec.store.fence import ReadFlags
from zoexec.store.loading import LoadProgress, ModelSource, fill_timeout_s, open_source
from zoplan.errors import first_line
from zoplan.execrules import fence_needed
from zoplan.layout import Layout
from zoplan.memory import store_stride
from zoplan.plan import Plan


class StoreShape(TypedDict):
    """The shape of a shared file (create_store's and attach_store's keywords)."""

    num_blocks: int
    block_numel: int
    stride: int
    dtype: torch.dtype


def load_node_model(cfg: RunConfig, env: zgroups.DistEnv,
                    run_id: str) -> tuple[ModelParts, BlockStore]:
    """(parts, store). Local rank 0 fills the node's block store block by block and
    hands its resident weights over; the other local ranks build a skeleton and take
    the weights from shared memory, so a node makes (and holds) the model once."""
    spec = cfg.model_spec
    builder = env.local_rank == 0
    wl = cfg.workload
    source = open_source(spec, init=cfg.weights, param_dtype=wl.param_dtype,
                         compute_dtype=wl.compute_dtype, seed=cfg.optim.seed, weights=builder)
    lay = env.layout
    stride = store_stride(source.block_numel, slices=lay.slices, local_ranks=lay.local_ranks)
    shape = StoreShape(num_blocks=source.num_blocks, block_numel=source.block_numel,
                       stride=stride, dtype=source.param_dtype)
    item = torch.empty(0, dtype=source.param_dtype).element_size()
    nbytes = (source.num_blocks * stride + source.resident_numel) * item
    timeout_s = fill_timeout_s(nbytes, base_s=env.timeout_s)
    progress = _progress(cfg, env, source)
    store = share_on_node(env, store_path(run_id, env.place.node, directory=env.shm_dir),
                          (lambda store: source.fill(store, progress)) if builder else None,
                          what=f"the node's block store ({nbytes / 2**30:.2f} GiB)",
                          timeout_s=timeout_s, **shape)
    parts = source.finish(first_block=store.weights(0))
    if lay.local_ranks > 1:
        _share_resident(env, run_id, parts, builder)
    if env.place.world_size > 1:
        monitored_barrier(env, env.host_world, timeout_s=timeout_s,
                          what=f"every node to load its model ({nbytes / 2**30:.2f} GiB each)")
    store.pinned = zpinning.pin_host_memory(env, store.flat,
                                            rank_copy_spans(store, env.layout, env.rank,
                                                            resident=Plan(cfg.plan).resident_blocks))
    return parts, store


def store_staging(env: zgroups.DistEnv, store: BlockStore) -> zpinning.Staging | None:
    """The pinned staging ring a CUDA rank's copies take when its pieces of the store
    could not be page-locked (zoexec.runtime.pinning.Staging); None otherwise (a pinned
    store, or the CPU, which copies directly)."""
    if not env.is_cuda or store.pinned:
        return None
    return zpinning.Staging(dtype=store.flat.dtype)


def rank_copy_spans(store: BlockStore, layout: Layout, rank: int, *,
                    resident: Collection[int]) -> list[zpinning.Span]:
    """The byte spans of the node's store that `rank` copies (what it page-locks): its
    slice of every block (h2d, or its resident shard read once and written at a save)
    and its share of every offloaded block (d2h write-back)."""
    item = store.flat.element_size()
    slices, local = layout.slices, layout.local_ranks
    offloaded = [b for b in range(store.num_blocks) if b not in set(resident)]
    return zpinning.copy_spans(store.flat.data_ptr(), item, stride=store.stride,
                               blocks=range(store.num_blocks),
                               reads=(layout.slice_index_of(rank), slices),
                               writes=(layout.local_rank_of(rank), local), written_blocks=offloaded)


def _progress(cfg: RunConfig, env: zgroups.DistEnv, source: ModelSource) -> LoadProgress | None:
    """Rank 0's loading progress on stderr (None elsewhere and with cfg.logging.progress False)."""
    if env.rank != 0 or not cfg.logging.progress:
        return None
    what = "initialising blocks" if source.checkpoint is None else "loading blocks"
    return LoadProgress(total=source.num_blocks, what=what)


def _share_resident(env: zgroups.DistEnv, run_id: str, parts: ModelParts, builder: bool) -> None:
    """Hand local rank 0's resident weights (resident_master, param dtype) to the other
    local ranks; they bind their modules to its compute-dtype cast, as rank 0 did."""
    blocks = store_path(run_id, env.place.node, directory=env.shm_dir)
    path = blocks.with_name(f"{blocks.name}-resident")
    numel = parts.resident_numel

    def fill(handover: BlockStore) -> None:
        handover.flat.copy_(parts.resident_master)

    handover = share_on_node(env, path, fill if builder else None,
                             what="local rank 0's resident weights", num_blocks=1,
                             block_numel=numel, stride=numel, dtype=parts.param_dtype)
    if not builder:
        parts.resident_master = handover.flat.clone()
        bind_resident(parts, parts.resident_master.to(parts.dtype, copy=True))


def share_read_flags(env: zgroups.DistEnv, run_id: str, *, num_blocks: int) -> ReadFlags | None:
    """The node's read stamps of the CPU write-back fence (None on CUDA, or when no
    fence is needed): a zeroed [local_ranks, num_blocks] int64 shm file, shared and
    unlinked like the block store."""
    lay = env.layout
    if env.is_cuda or not fence_needed(lay):
        return None
    blocks = store_path(run_id, env.place.node, directory=env.shm_dir)
    shared = share_on_node(env, blocks.with_name(f"{blocks.name}-fence"),
                           (lambda _: None) if env.local_rank == 0 else None,
                           num_blocks=lay.local_ranks, block_numel=num_blocks,
                           stride=num_blocks, dtype=torch.int64)
    return ReadFlags(stamps=shared.flat.view(lay.local_ranks, num_blocks),
                     local_rank=env.local_rank, first_rank=env.rank - env.local_rank,
                     timeout_s=env.timeout_s)


def share_on_node(env: zgroups.DistEnv, path: Path, fill: Callable[[BlockStore], None] | None, *,
                  what: str = "a shared file", timeout_s: float | None = None,
                  **shape: Unpack[StoreShape]) -> BlockStore:
    """The builder (fill not None, local rank 0) creates and fills a shared file, the
    other local ranks wait for it (at most timeout_s, default env.timeout_s) and map
    it, then the name is unlinked (mappings live on). `what`: the file, for errors."""
    timeout_s = env.timeout_s if timeout_s is None else timeout_s
    store = None
    try:
        if fill is not None:
            store = create_store(path, **shape)
            fill(store)
        wait_for_builder(env, timeout_s=timeout_s, what=what)
        if store is None:
            store = attach_store(path, **shape)
        store.inode = path.stat().st_ino
        if env.layout.local_ranks > 1:
            monitored_barrier(env, env.host_node, timeout_s=timeout_s,
                              what=f"the node's ranks to map {what}")
    finally:
        if fill is not None:
            path.unlink(missing_ok=True)
    return store


def wait_for_builder(env: zgroups.DistEnv, *, timeout_s: float, what: str) -> None:
    """Local rank 0 tells the node's other ranks that `what` is ready (a message on the
    host node group); they wait for it at most `timeout_s`. A no-op alone on a node."""
    lay = env.layout
    if lay.local_ranks == 1:
        return
    first = env.rank - env.local_rank
    token = torch.zeros(1)
    wait = timedelta(seconds=timeout_s)
    try:
        if env.local_rank == 0:
            for peer in range(first + 1, first + lay.local_ranks):
                dist.isend(token, dst=peer, group=env.host_node).wait(timeout=wait)
        else:
            dist.irecv(token, src=first, group=env.host_node).wait(timeout=wait)
    except RuntimeError as exc:
        whom = ("the node's other ranks to take" if env.local_rank == 0
                else "local rank 0 to fill")
        cause = first_line(exc)
        ending = "gave up" if "timed out" in cause.lower() else "lost it"
        raise PeerGone(f"rank {env.rank} (node {env.place.node}) waited for {whom} {what} "
                       f"and {ending} (timeout {timeout_s:g} s): {cause}") from None


def monitored_barrier(env: zgroups.DistEnv, group: dist.ProcessGroup | None, *, timeout_s: float,
                      what: str) -> None:
    """torch.distributed.monitored_barrier on a host (gloo) group: its first rank
    reports a rank that did not arrive within `timeout_s`; a PeerGone (a ZoError)
    saying `what`."""
    try:
        dist.monitored_barrier(group=group, timeout=timedelta(seconds=timeout_s))
    except RuntimeError as exc:
        raise PeerGone(f"rank {env.rank} waited for {what} and gave up (timeout "
                       f"{timeout_s:g} s): {first_line(exc)}") from None


def close_store(store: BlockStore | None) -> None:
    if store is not None and store.pinned:
        zpinning.unpin_host_memory(store.flat)
        store.pinned = False


def host_memory_probe(store: BlockStore, env: zgroups.DistEnv) -> dict[str, int | str | bool | None]:
    """This process's memory, its share of the store and its GPU peak (bytes)."""
    info = psutil.Process().memory_full_info()
    store_pss, store_rss = mapping_pss_bytes(store.path)
    return {"rank": env.rank, "pid": os.getpid(), "rss": info.rss, "pss": info.pss,
            "uss": info.uss, "store_pss": store_pss, "store_rss": store_rss,
            "store_bytes": store.nbytes, "store_inode": store.inode,
            "store_path": str(store.path), "store_pinned": store.pinned,
            **zgroups.device_memory_peak(env)}
