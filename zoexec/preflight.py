"""Before anything starts: the plan checked against the machine (world size, devices,
host and GPU memory, model directory, data file, output folders). A mismatch is a
ZoError with the numbers: one red line, exit 2, nothing written."""

from __future__ import annotations

from pathlib import Path

import psutil

from zoexec.dist import device_count, device_memory_bytes
from zoplan.errors import ZoError
from zoplan.models import ModelSpec, get_model


def preflight(cfg, *, world_size: int | None = None, local_world_size: int | None = None) -> None:
    """Raise ZoError if the plan cannot run here as asked."""
    lay = cfg.layout
    if world_size is None and lay.nodes > 1:
        raise ZoError(f"the plan spans {lay.nodes} nodes of {lay.local_ranks} ranks; start it "
                      f"on every node with torchrun --nnodes {lay.nodes} --nproc-per-node "
                      f"{lay.local_ranks} -m zoexec.cli run ...")
    if world_size is not None and world_size != lay.world_size:
        raise ZoError(f"torchrun started {world_size} ranks but the plan's layout "
                      f"{lay.label()} has {lay.world_size}")
    if local_world_size is not None and local_world_size != lay.local_ranks:
        raise ZoError(f"torchrun started {local_world_size} ranks on this node but the plan "
                      f"puts {lay.local_ranks} on each node")
    _check_devices(cfg)
    _check_memory(cfg)
    _check_model(cfg)
    if cfg.data != "synthetic" and not Path(cfg.data).is_file():
        raise ZoError(f"data file {cfg.data} does not exist")
    for what, where in (("--out", cfg.out_dir), ("--trace", cfg.trace_dir)):
        if where and Path(where).exists() and not Path(where).is_dir():
            raise ZoError(f"{what} {where} exists and is not a directory")


def _check_devices(cfg) -> None:
    need, have = cfg.layout.local_ranks, device_count(cfg.device_kind)
    if have < need:
        raise ZoError(f"the plan needs {need} CUDA GPU(s) per node but this machine has "
                      f"{have}" + ("" if have else " (plan profile device_kind is 'cuda')"))


def _check_memory(cfg) -> None:
    """Host memory here; GPU memory is checked by each rank on its own GPU
    (check_gpu_memory), so that the launcher never creates a CUDA context."""
    pred, lay = cfg.plan["predicted"], cfg.layout
    host = float(pred.get("host_mem_bytes") or 0)
    if cfg.device_kind == "cpu":
        host += lay.local_ranks * float(pred.get("gpu_mem_bytes") or 0)
    available = psutil.virtual_memory().available
    if host > available:
        raise ZoError(f"the plan needs {host / 2**30:.2f} GiB of host memory per node, "
                      f"{available / 2**30:.2f} GiB is available")


def check_gpu_memory(cfg, local_rank: int) -> None:
    """The plan's predicted memory per GPU fits this rank's GPU (no-op on the CPU)."""
    need = float(cfg.plan["predicted"].get("gpu_mem_bytes") or 0)
    total = device_memory_bytes(cfg.device_kind, local_rank)
    if total is not None and need > total:
        raise ZoError(f"the plan needs {need / 2**30:.2f} GiB per GPU, GPU {local_rank} has "
                      f"{total / 2**30:.2f} GiB")


def _check_model(cfg) -> None:
    """--model-path: a directory with a config.json whose shape matches the plan's."""
    if cfg.init == "random":
        return
    path = Path(cfg.init)
    if not path.is_dir():
        raise ZoError(f"model path {path} is not a directory")
    if not (path / "config.json").is_file():
        raise ZoError(f"model path {path} has no config.json")
    have, want = get_model(str(path)), ModelSpec.from_dict(cfg.plan["model"]["spec"])
    for key in ("family", "num_layers", "hidden", "vocab"):
        if getattr(have, key) != getattr(want, key):
            raise ZoError(f"model in {path} has {key} {getattr(have, key)} but the plan was "
                          f"made for {getattr(want, key)} ({want.name})")
