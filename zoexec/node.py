"""The node's model, built once and shared by the node's ranks: local rank 0 builds it
and fills the node's block store (shared memory) and a handover file of the resident
weights; the other local ranks map them. Also the node's read stamps of the CPU
write-back fence, and what a rank's memory looks like at the end of a run."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import torch

from zoexec import dist as zdist
from zoexec.config import RunConfig
from zoexec.fence import ReadFlags
from zoexec.models import bind_resident, build_parts, resident_flat
from zoexec.store import (
    BlockStore,
    attach_store,
    create_store,
    fill_store,
    mapping_pss_bytes,
    store_path,
    stride_for,
)
from zoplan.layout import Layout
from zoplan.models import ModelSpec


def _build_model(cfg: RunConfig, spec: ModelSpec, *, skeleton: bool = False):
    """build_parts for the plan's model; `skeleton`: a one-block random model of the
    same shape (resident structure + block template) whose weights come from the node."""
    wl = cfg.workload
    kw = dict(param_dtype=wl.param_dtype, compute_dtype=wl.compute_dtype, seed=cfg.seed)
    if not skeleton:
        return build_parts(spec, init=cfg.init, **kw)
    if cfg.init == "random":
        config = dict(spec.hf_config)
    else:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(cfg.init, local_files_only=True).to_dict()
    config.update(num_hidden_layers=1)
    if config.get("layer_types"):
        config["layer_types"] = config["layer_types"][:1]
    return build_parts(config, init="random", **kw)


def load_node_model(cfg: RunConfig, env: zdist.DistEnv, run_id: str):
    """(parts, store). Local rank 0 builds the model and fills the node's block store
    and a resident handover file; the other local ranks build a one-block skeleton and
    take the weights from shared memory, so a node builds (and holds) the model once."""
    spec = ModelSpec.from_dict(cfg.plan["model"]["spec"])
    builder = env.local_rank == 0
    parts, flats = _build_model(cfg, spec, skeleton=not builder)
    lay = env.layout
    stride = stride_for(parts.block_numel, slices=lay.slices, local_ranks=lay.local_ranks)

    def fill_blocks(store: BlockStore) -> None:
        fill_store(store, flats)

    store = share_on_node(env, store_path(run_id, env.place.node), fill_blocks if builder else None,
                          num_blocks=spec.num_layers, block_numel=parts.block_numel,
                          stride=stride, dtype=parts.param_dtype)
    flats.clear()   # the node's copy is the store now
    if lay.local_ranks > 1:
        _share_resident(env, run_id, parts, builder)
    store.pinned = zdist.pin_host_memory(env, store.flat)
    return parts, store


def _share_resident(env: zdist.DistEnv, run_id: str, parts, builder: bool) -> None:
    """Hand local rank 0's resident weights to the other local ranks."""
    blocks = store_path(run_id, env.place.node)
    path = blocks.with_name(f"{blocks.name}-resident")
    numel = parts.resident_numel

    def fill(handover: BlockStore) -> None:
        handover.flat.copy_(resident_flat(parts))

    handover = share_on_node(env, path, fill if builder else None, num_blocks=1,
                             block_numel=numel, stride=numel, dtype=parts.dtype)
    if not builder:
        bind_resident(parts, handover.flat.clone())


def fence_needed(layout: Layout) -> bool:
    """Whether d2h needs the write-back fence (the all-gather orders it otherwise)."""
    return 1 < layout.local_ranks and layout.slices < layout.local_ranks


def share_read_flags(env: zdist.DistEnv, run_id: str, *, num_blocks: int) -> ReadFlags | None:
    """The node's read stamps of the CPU write-back fence (None on CUDA, or when no
    fence is needed): a zeroed [local_ranks, num_blocks] int64 shm file, shared and
    unlinked like the block store."""
    lay = env.layout
    if env.is_cuda or not fence_needed(lay):
        return None
    blocks = store_path(run_id, env.place.node)
    shared = share_on_node(env, blocks.with_name(f"{blocks.name}-fence"),
                           (lambda _: None) if env.local_rank == 0 else None,
                           num_blocks=lay.local_ranks, block_numel=num_blocks,
                           stride=num_blocks, dtype=torch.int64)
    return ReadFlags(stamps=shared.flat.view(lay.local_ranks, num_blocks),
                     local_rank=env.local_rank, first_rank=env.rank - env.local_rank,
                     timeout_s=zdist.TIMEOUT_S)


def share_on_node(env: zdist.DistEnv, path: Path, fill, **shape) -> BlockStore:
    """The builder (fill not None, local rank 0) creates and fills a shared file, the
    other local ranks map it, then the name is unlinked (mappings live on)."""
    store = None
    try:
        if fill is not None:
            store = create_store(path, **shape)
            fill(store)
        zdist.host_barrier(env, node_only=True)
        if store is None:
            store = attach_store(path, **shape)
        store.inode = path.stat().st_ino
        zdist.host_barrier(env, node_only=True)
    finally:
        if fill is not None:
            path.unlink(missing_ok=True)
    return store


def close_store(store: BlockStore | None) -> None:
    if store is not None and store.pinned:
        zdist.unpin_host_memory(store.flat)
        store.pinned = False


def host_memory_probe(store: BlockStore, env: zdist.DistEnv) -> dict:
    """This process's memory, its share of the store and its GPU peak (bytes)."""
    info = psutil.Process().memory_full_info()
    store_pss, store_rss = mapping_pss_bytes(store.path)
    return {"rank": env.rank, "pid": os.getpid(), "rss": info.rss, "pss": info.pss,
            "uss": info.uss, "store_pss": store_pss, "store_rss": store_rss,
            "store_bytes": store.nbytes, "store_inode": store.inode,
            "store_path": str(store.path), "store_pinned": store.pinned,
            **zdist.device_memory_peak(env)}
