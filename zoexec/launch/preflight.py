"""Before anything starts: the plan checked against the machine (world size, devices,
host and GPU memory, model directory, output folders) and the data read through as
the ranks will read it. A mismatch is a ZoError with the numbers: one
red line, exit 2, nothing written."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TypedDict

import psutil

from zoexec.config import RunConfig
from zoexec.data.sources import check_task_data, make_eval_set
from zoexec.data.text import check_data
from zoexec.run.verify import check_safetensors, free_bytes
from zoexec.runtime.device import device_count, device_memory_free
from zoexec.runtime.devicemap import ENV_VISIBLE, cuda_index, visible_env
from zoexec.runtime.groups import place_from_env
from zoplan.errors import ZoError
from zoplan.hostmemory import HostMemory, node_host_memory
from zoplan.io import need_folder, need_input
from zoplan.layout import Layout
from zoplan.memory import RankMemory, fmt_bytes, rank_memory
from zoplan.modeldir import weight_files
from zoplan.models import ModelSpec, get_model
from zoplan.plan import Plan
from zoplan.trace import SPAN_BUFFER
from zoplan.workload import Workload

# The CUDA context of a process (the driver's and the runtime's state, the kernels'
# code, cuBLAS/cuDNN handles): 0.5-1 GiB on current GPUs and drivers, outside torch's
# allocator and outside zoplan.memory's figure (NVIDIA's CUDA C++ best practices on
# lazy loading; PyTorch's CUDA semantics notes). The middle of that range is counted.
CUDA_CONTEXT_BYTES = 768 << 20


def preflight(cfg: RunConfig, *, world_size: int | None = None, local_world_size: int | None = None) -> None:
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
    if cfg.task.data != "synthetic":   # a file or a save_to_disk folder
        need_input(cfg.task.data, what="data file")
    for what, where in (("--out", cfg.checkpoint.out), ("--trace", cfg.logging.trace)):
        if where:
            _check_output_folder(what, Path(where))
    _check_trace_room(cfg)
    _check_data(cfg)


def _check_output_folder(option: str, path: Path) -> None:
    """--out / --trace: a folder there, or one the OS lets this process create: the
    nearest existing folder above it is a folder that takes a new one (tried with an
    empty folder, removed at once; a name too long or a file system that refuses, such
    as /proc or /sys, fails here)."""
    try:
        if path.exists() and not path.is_dir():
            raise ZoError(f"{option} {path} exists and is not a directory")
        above = path
        while not above.exists():
            above = above.parent
        if not above.is_dir():
            raise ZoError(f"{option} {path}: {above} is a file, not a folder")
        os.rmdir(tempfile.mkdtemp(prefix=".zoexec-check-", dir=above))
    except OSError as exc:
        raise ZoError(f"{option} {path}: cannot create a folder there "
                      f"({exc.strerror or exc})") from None


def _check_data(cfg: RunConfig) -> None:
    """The data read as every rank will read it (zoexec.data.sources.check_task_data):
    a bad row, ids outside the vocabulary, text without a tokenizer or too few tokens
    for one batch fail here, before any rank starts. A prompt task reads and tokenises
    only the rows its --steps batches use (and the held-out rows), so start-up follows
    the work, not the file's size; packed text the documents those batches' rows hold
    (zoexec.data.packed, shared with the ranks through the launch's private folder)."""
    workload = cfg.workload
    vocab, tokenizer = cfg.model_spec.vocab, cfg.tokenizer_dir
    if cfg.task.data == "synthetic":
        check_data(cfg.task.data, vocab=vocab, batch=workload.batch, seq=workload.seq)
    else:   # the task's rows (zoexec.data.sources), then the held-out set
        check_task_data(cfg.task.data, cfg.task, vocab=vocab, batch=workload.batch,
                        seq=workload.seq, tokenizer_dir=tokenizer, steps=cfg.optim.steps)
    if cfg.task.eval_data:
        make_eval_set(cfg.task.eval_data, cfg.task, vocab=vocab,
                      seq=workload.seq, tokenizer_dir=tokenizer,
                      train_path=None if cfg.task.data == "synthetic" else cfg.task.data)


def _check_devices(cfg: RunConfig) -> None:
    """The CUDA GPUs this process may use against the plan's ranks per node. A rank
    started by torchrun or srun (RANK set) runs alone in its process: it needs a GPU of
    its own among those it sees, or exactly one (per-task binding; the rule is
    zoexec.runtime.devicemap.cuda_index). The ranks a local launch spawns see what this
    process sees: it needs one visible GPU per rank, unless --backend gloo lets them
    share one (NCCL refuses two ranks on a GPU)."""
    if cfg.device_kind != "cuda":
        return
    need, have = cfg.layout.local_ranks, device_count(cfg.device_kind)
    visible = visible_env()
    shown = "unset" if visible is None else repr(visible)
    if have == 0:
        raise ZoError(f"the plan needs {need} CUDA GPU(s) per node but this process sees "
                      f"none ({ENV_VISIBLE}={shown}; plan profile device_kind is 'cuda')")
    place = place_from_env()
    if place is not None:
        cuda_index(place.local_rank, local_world_size=need, num_visible=have,
                   visible_env=visible)
    elif have < need and cfg.runtime.backend != "gloo":   # gloo: ranks may share a GPU
        raise ZoError(f"the plan needs {need} CUDA GPU(s) per node but this process sees "
                      f"{have} ({ENV_VISIBLE}={shown}); the ranks it starts share them (--backend gloo "
                      f"lets ranks share a GPU)")


def _check_memory(cfg: RunConfig) -> None:
    """Host memory here against zoplan.memory's node figure (the store once, each local
    rank's process and resident master, on the CPU every rank's buffers, or the
    builder's set-up peak), or the plan's predicted figure where that is larger; GPU
    memory is checked by each rank on its own GPU (check_gpu_memory), so that the
    launcher never creates a CUDA context."""
    host = node_host_memory(**_memory_shape(cfg), random_init=cfg.weights == "random")
    stored = float(cfg.plan["predicted"].get("host_mem_bytes") or 0)
    traced = trace_memory_bytes(cfg)
    need, available = max(host.total_bytes, stored) + traced, psutil.virtual_memory().available
    if need > available:
        kept = f"; with --trace {fmt_bytes(traced)} of spans held" if traced else ""
        raise ZoError(f"the plan needs {fmt_bytes(need)} of host memory per node, "
                      f"{fmt_bytes(available)} is available ({_why(host, stored)}{kept})")


# a span as a line of rank{r}.jsonl: 96-140 bytes; a held Span object with its numbers:
# 174 bytes (tracemalloc over 4,096 spans); both rounded up (docs/run-folder.md)
SPAN_LINE_BYTES = 160
SPAN_HELD_BYTES = 256


def trace_memory_bytes(cfg: RunConfig) -> int:
    """What a traced run keeps in host memory per node: each local rank holds at most
    zoplan.trace.SPAN_BUFFER spans before it appends them to its own file (nothing is
    gathered); 0 without --trace."""
    if not cfg.logging.trace:
        return 0
    return cfg.layout.local_ranks * SPAN_BUFFER * SPAN_HELD_BYTES


def trace_disk_bytes(cfg: RunConfig) -> int:
    """The span files of a traced run: the plan's spans a step times the steps, as lines."""
    spans = len(cfg.plan["predicted"].get("spans") or ()) or 1
    return spans * cfg.optim.steps * SPAN_LINE_BYTES


def _check_trace_room(cfg: RunConfig) -> None:
    """--trace: the span files fit where they go (a full disk found now, with the path
    and the free space, not after hours of training)."""
    if not cfg.logging.trace:
        return
    need, free = trace_disk_bytes(cfg), free_bytes(Path(cfg.logging.trace))
    if free is not None and need > free:
        raise ZoError(f"--trace {cfg.logging.trace}: the spans of {cfg.optim.steps} steps need "
                      f"about {fmt_bytes(need)}, its file system has {fmt_bytes(free)} free")


def check_gpu_memory(cfg: RunConfig, device_index: int | None) -> None:
    """zoplan.memory's device bytes of a rank (torch's peak, NCCL's communicators, the
    cuBLAS workspace), or the plan's predicted figure where that is larger, against the
    rank's CUDA device `device_index` (zoexec.runtime.devicemap; no-op on the CPU): with
    the CUDA context (CUDA_CONTEXT_BYTES) they fit its total memory, and they fit the
    memory free now (the driver's figure: other processes' use and this rank's own
    context already taken out of it)."""
    if device_index is None:
        return
    memory = device_memory_free(cfg.device_kind, device_index)
    if memory is None:
        return
    free, total = memory
    rank = rank_memory(**_memory_shape(cfg))
    stored = float(cfg.plan["predicted"].get("gpu_mem_bytes") or 0)
    need = max(rank.total_bytes, stored)
    why = f"{_why(rank, stored)}; peak in {rank.peak_phase}"
    if need + CUDA_CONTEXT_BYTES > total:
        raise ZoError(f"the plan needs {fmt_bytes(need)} per GPU and the CUDA context about "
                      f"{fmt_bytes(CUDA_CONTEXT_BYTES)}, GPU {device_index} has "
                      f"{fmt_bytes(total)} ({why})")
    if need > free:
        raise ZoError(f"the plan needs {fmt_bytes(need)} per GPU, GPU {device_index} has "
                      f"{fmt_bytes(free)} free of {fmt_bytes(total)} (other processes and "
                      f"this rank's CUDA context hold the rest; {why})")


class _MemoryShape(TypedDict):
    """What zoplan.memory's rank figure and zoplan.hostmemory's node figure are given."""

    model: ModelSpec
    workload: Workload
    layout: Layout
    device_kind: str
    resident_blocks: int


def _memory_shape(cfg: RunConfig) -> _MemoryShape:
    return _MemoryShape(model=cfg.model_spec, workload=cfg.workload, layout=cfg.layout,
                        device_kind=cfg.device_kind,
                        resident_blocks=len(Plan(cfg.plan).resident_blocks))


def _why(memory: RankMemory | HostMemory, stored: float) -> str:
    """The largest term of zoplan.memory's figure (and the plan's, if that is larger)."""
    term = memory.dominant()
    largest = f"largest: {term.label}, {fmt_bytes(term.bytes)}"
    if stored > memory.total_bytes:
        return f"the plan's prediction; zoplan.memory gives {fmt_bytes(memory.total_bytes)}, {largest}"
    return largest


def _check_model(cfg: RunConfig) -> None:
    """--model-path: a directory with a config.json whose shape matches the plan's."""
    if cfg.weights == "random":
        return
    path = need_folder(cfg.weights, what="model path")
    if not (path / "config.json").is_file():
        raise ZoError(f"model path {path} has no config.json")
    for shard in weight_files(path):   # safetensors weights, every shard there and whole
        problem = check_safetensors(shard)
        if problem:
            raise ZoError(f"model path {path}: {problem}")
    have, want = get_model(str(path)), cfg.model_spec
    for key in ("family", "num_layers", "hidden", "vocab"):
        if getattr(have, key) != getattr(want, key):
            raise ZoError(f"model in {path} has {key} {getattr(have, key)} but the plan was "
                          f"made for {getattr(want, key)} ({want.name})")
