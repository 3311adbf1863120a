"""Device, backend, process groups, lanes and clocks of one zoexec rank.

`select_device` is the ONE place that picks the device and the backend: NCCL + CUDA
streams where the plan is for CUDA GPUs, gloo on the CPU. Nothing else in zoexec calls
`.cuda()`, names a backend or creates a stream; the rest of the code moves tensors with
`.to(env.device)` and runs its tasks through the `Lanes` made here.

What this module decides for a CUDA rank (a CPU rank keeps torch's defaults):
- which GPU: devicemap.cuda_index (the local rank among the visible GPUs, or the one
  GPU a per-task binding leaves the process);
- TF32: whether fp32 matmuls and convolutions may use TF32 tensor cores (the plan's
  workload.tf32; `init_distributed(tf32=...)`);
- where its threads run: the CPUs of its GPU's socket (numa.bind_near_pci; recorded
  as DistEnv.cpus);
- page-locking of host buffers it maps (`pin_host_memory`): a failure clears CUDA's
  last error, is said on every rank and leaves copies pageable.

Groups (built identically on every rank, `new_group` being collective):
- world: the default group (loss all-reduce, PertP exchange + DDP mean).
- slice: the rank's slice group (all-gather of a block), None when slices == 1.
- node: the node's local ranks (CUDA write-back fence; the CPU uses zoexec.store.fence), None
  with one local rank.
- host_world / host_node: gloo twins used for host-side coordination (store name,
  store attach barriers, clock epoch, trace gather); the same groups on a CPU run.

Lanes: a rank's engines (compute, h2d, collective, d2h; zoplan.trace.LANES). On CUDA
each lane is a stream; a task waits on the events of the tasks it depends on and is
timed with CUDA events, converted to host time at the end of the step. On the CPU a
task runs at once, in program order, timed with the host clock (CLOCK_MONOTONIC, which
all processes of one host share).
"""

from __future__ import annotations

import ctypes
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from zoexec.runtime import numa
from zoexec.runtime.devicemap import ENV_VISIBLE, cuda_index, visible_env
from zoexec.runtime.hostmem import filesystem_type, mapped_file
from zoplan.errors import ZoError
from zoplan.execrules import threads_per_rank, usable_cores
from zoplan.layout import Layout
from zoplan.trace import KIND_LANE, LANE_COMPUTE, LANES, NO_BLOCK, NoSpans, Span

TIMEOUT_S = float(os.environ.get("ZOEXEC_TIMEOUT_S", "600"))


@dataclass(frozen=True, kw_only=True)
class RankPlace:
    """Where a rank sits: from the launcher's arguments or torchrun's environment."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    init_file: str = ""       # local spawns: the rendezvous file (file://), no TCP listener

    @property
    def node(self) -> int:
        return self.rank // self.local_world_size


@dataclass(kw_only=True, eq=False)
class DistEnv:
    place: RankPlace
    layout: Layout
    device: torch.device
    backend: str
    world: Any = None
    slice: Any = None
    node: Any = None
    host_world: Any = None
    host_node: Any = None
    cpus: str = ""             # CPU list the rank's threads were bound to ('' unchanged)

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def rank(self) -> int:
        return self.place.rank

    @property
    def local_rank(self) -> int:
        return self.place.local_rank


# ---- device and backend: the one function -------------------------------------------------
def select_device(device_kind: str, local_rank: int, *,
                  local_world_size: int) -> tuple[torch.device, str]:
    """(device, backend) of a rank: a CUDA GPU (devicemap.cuda_index) + NCCL, made the
    process's current device, or the CPU + gloo."""
    if device_kind == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ZoError("the plan is for CUDA GPUs but this process sees none "
                          f"({ENV_VISIBLE}={visible_env() or 'unset'})")
        index = cuda_index(local_rank, local_world_size=local_world_size, num_visible=count,
                           visible_env=visible_env())
        torch.cuda.set_device(index)
        return torch.device("cuda", index), "nccl"
    if device_kind != "cpu":
        raise ZoError(f"profile.device_kind {device_kind!r} is neither 'cuda' nor 'cpu'")
    return torch.device("cpu"), "gloo"


def set_tf32(device: torch.device, tf32: bool) -> None:
    """CUDA: let fp32 matmuls (cuBLAS) and convolutions (cuDNN) use TF32 tensor cores,
    or keep them in full fp32. The CPU is left as torch has it: float32 matmul
    precision also steers CPU kernels there."""
    if device.type != "cuda":
        return
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")


def bind_near_gpu(device: torch.device) -> str:
    """CUDA: move the rank's threads to the CPUs of its GPU's socket (its PCI
    device's local_cpulist), so that its host work and staging run beside the GPU.
    Returns the CPU list ('' where nothing changed); the CPU path is left alone."""
    if device.type != "cuda":
        return ""
    props = torch.cuda.get_device_properties(device.index)
    address = numa.pci_address(*(getattr(props, f"pci_{part}_id", None)
                                 for part in ("domain", "bus", "device")))
    if address is None:
        numa.say_once("bind", "this torch does not give the GPU's PCI address; the rank's "
                      "threads are not bound near it")
        return ""
    return numa.bind_near_pci(address)


def device_count(device_kind: str) -> int:
    """How many devices of the plan's kind this process sees (CPU: unlimited)."""
    if device_kind == "cuda":
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    return 1 << 30


def device_memory_bytes(device_kind: str, index: int) -> int | None:
    """Total memory of CUDA device `index` (None on the CPU)."""
    if device_kind != "cuda":
        return None
    return int(torch.cuda.get_device_properties(index).total_memory)


def device_memory_peak(env: DistEnv) -> dict:
    """Peak memory the rank's GPU allocator held (empty on the CPU)."""
    if not env.is_cuda:
        return {}
    return {"gpu_peak_allocated": int(torch.cuda.max_memory_allocated(env.device)),
            "gpu_peak_reserved": int(torch.cuda.max_memory_reserved(env.device))}


# ---- page-locked host memory ------------------------------------------------------------------
_pinned: dict[tuple[int, int], int] = {}   # (data_ptr, nbytes) -> registered page start
CUDA_HOST_REGISTER_PORTABLE = 1


def pin_host_memory(env: DistEnv, tensor: torch.Tensor) -> bool:
    """Page-lock a host tensor that this process mapped (cudaHostRegister, portable)
    when the rank runs on CUDA, so H2D/D2H copies are asynchronous DMA. The whole pages
    that hold it are registered (page-aligned start and length; the store is an mmap,
    aligned already). False on the CPU and where registering fails: then CUDA's last
    error is cleared (or the next kernel launch would raise it), the rank says so on
    stderr, and copies are staged through pageable memory (correct, slower). A store
    that is a regular file rather than tmpfs may be refused: Linux 6.5+ does not let
    long-term pins hold shared file pages that need writeback."""
    if not env.is_cuda or tensor.numel() == 0:
        return False
    nbytes = tensor.numel() * tensor.element_size()
    start, length = numa.page_span(tensor.data_ptr(), nbytes)
    cudart = torch.cuda.cudart()
    err = cudart.cudaHostRegister(start, length, CUDA_HOST_REGISTER_PORTABLE)
    if int(err) != 0:
        _clear_cuda_error(cudart)
        print(f"zoexec: warning: rank {env.rank} (local {env.local_rank}): cudaHostRegister "
              f"of {nbytes} bytes of host memory failed with {_cuda_error_text(cudart, err)}"
              f"{_backing_note(start)}; transfers use pageable memory", file=sys.stderr)
        return False
    _pinned[(tensor.data_ptr(), nbytes)] = start
    return True


def unpin_host_memory(tensor: torch.Tensor) -> bool:
    """Undo pin_host_memory for this tensor; nothing (False) if it was not pinned."""
    start = _pinned.pop((tensor.data_ptr(), tensor.numel() * tensor.element_size()), None)
    if start is None:
        return False
    cudart = torch.cuda.cudart()
    err = cudart.cudaHostUnregister(start)
    if int(err) != 0:
        _clear_cuda_error(cudart)
        print(f"zoexec: warning: cudaHostUnregister failed with "
              f"{_cuda_error_text(cudart, err)}", file=sys.stderr)
        return False
    return True


def _cuda_error_text(cudart, err) -> str:
    try:
        return f"cudaError {int(err)} ({cudart.cudaGetErrorString(err)})"
    except (AttributeError, TypeError, RuntimeError):
        return f"cudaError {int(err)}"


def _backing_note(addr: int) -> str:
    path = mapped_file(addr)
    kind = filesystem_type(path) if path is not None else None
    if kind in (None, "tmpfs"):
        return ""
    return (f" (it maps {path}, a file on {kind}, not tmpfs: put ZOEXEC_SHM_DIR on a "
            f"tmpfs with room to page-lock it)")


def _clear_cuda_error(cudart) -> int:
    """Read (and so reset) the CUDA runtime's last error of this thread. torch's cudart
    module binds no cudaGetLastError (up to 2.x); then the runtime library this process
    loaded is asked through ctypes. Returns the error read, -1 if none could be."""
    get = getattr(cudart, "cudaGetLastError", None) or _runtime_get_last_error()
    if get is None:
        print("zoexec: warning: cannot reach cudaGetLastError; the next CUDA launch may "
              "report the failed registration", file=sys.stderr)
        return -1
    return int(get())


def _runtime_get_last_error():
    """cudaGetLastError of the libcudart already loaded in this process, or None."""
    candidates: list[str | None] = [None]   # the global namespace first
    try:
        for line in Path("/proc/self/maps").read_text().splitlines():
            name = line.split(maxsplit=5)[-1]
            if "/libcudart" in name and name not in candidates:
                candidates.append(name)
    except OSError:
        pass
    for name in candidates:
        try:
            return ctypes.CDLL(name).cudaGetLastError
        except (OSError, AttributeError):
            continue
    return None


def free_port() -> int:
    """A TCP port free on this host right now (for the spawned ranks' rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def place_from_env() -> RankPlace | None:
    """The place torchrun gives a rank (RANK, LOCAL_RANK, WORLD_SIZE, ...), or None."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    world = int(os.environ["WORLD_SIZE"])
    return RankPlace(rank=int(os.environ["RANK"]), local_rank=int(os.environ.get("LOCAL_RANK", 0)),
                     world_size=world,
                     local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", world)),
                     master_addr=os.environ.get("MASTER_ADDR", "127.0.0.1"),
                     master_port=int(os.environ.get("MASTER_PORT", 29500)))


# ---- process groups --------------------------------------------------------------------
def init_distributed(*, place: RankPlace, layout: Layout, device_kind: str,
                     tf32: bool = True) -> DistEnv:
    """Join the job: pick device/backend, set TF32 (`tf32`: the plan's workload.tf32)
    and bind the threads near the GPU (CUDA only), init the default group, build the
    groups. Threads are bound before the backends start theirs, which inherit it."""
    device, backend = select_device(device_kind, place.local_rank,
                                    local_world_size=place.local_world_size)
    set_tf32(device, tf32)
    cpus = bind_near_gpu(device)
    dist.init_process_group(
        backend, init_method=rendezvous(place),
        rank=place.rank, world_size=place.world_size, timeout=timedelta(seconds=TIMEOUT_S),
        device_id=device if device.type == "cuda" else None)
    env = DistEnv(place=place, layout=layout, device=device, backend=backend,
                  world=dist.group.WORLD, cpus=cpus)
    _build_groups(env)
    return env


def rendezvous(place: RankPlace) -> str:
    """The init method. Ranks a local launch spawned (place.init_file) meet through a
    file in the launcher's private temporary folder, and their own sockets (gloo pairs,
    NCCL's bootstrap) listen on the loopback interface only (GLOO_SOCKET_IFNAME /
    NCCL_SOCKET_IFNAME, unless set): nothing of the job is reachable from the network.
    (A tcp:// rendezvous would make rank 0 a TCPStore server listening on every
    interface.) Otherwise (torchrun) the master's address and port."""
    if not place.init_file:
        return f"tcp://{place.master_addr}:{place.master_port}"
    loopback = loopback_interface()
    if loopback is not None:
        for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
            os.environ.setdefault(name, loopback)
    return f"file://{place.init_file}"


def loopback_interface(root: Path = Path("/sys/class/net")) -> str | None:
    """The name of the loopback network interface (IFF_LOOPBACK), None if there is none."""
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return None
    for name in names:
        try:
            if int((root / name / "flags").read_text(), 16) & 0x8:
                return name
        except (OSError, ValueError):
            continue
    return None


def set_timeout_s(seconds: float) -> None:
    """The timeout of every wait of this rank (groups, collectives, node waits); a
    spawned rank takes its launcher's ZOEXEC_TIMEOUT_S (a forkserver may have read an
    older environment)."""
    global TIMEOUT_S
    TIMEOUT_S = float(seconds)


def _build_groups(env: DistEnv) -> None:
    """Slice, node and host groups; every rank creates every group in the same order.
    A group whose members are the whole world is the world group itself (on NCCL each
    group is a communicator of its own, hundreds of MiB of device memory)."""
    lay, rank = env.layout, env.rank
    host_backend = None if env.backend == "gloo" else "gloo"
    timeout = timedelta(seconds=TIMEOUT_S)   # new_group's default is 30 minutes
    env.host_world = (dist.new_group(backend=host_backend, timeout=timeout) if host_backend
                      else env.world)
    if lay.slices == lay.world_size > 1:
        env.slice = env.world
    elif lay.slices > 1:
        for first in range(0, lay.world_size, lay.slices):
            group = dist.new_group(list(range(first, first + lay.slices)), timeout=timeout)
            if first <= rank < first + lay.slices:
                env.slice = group
    if lay.nodes == 1:
        if lay.local_ranks > 1:
            env.node, env.host_node = env.world, env.host_world
        return
    for node in range(lay.nodes):
        members = list(range(node * lay.local_ranks, (node + 1) * lay.local_ranks))
        group = dist.new_group(members, timeout=timeout) if lay.local_ranks > 1 else None
        host = (dist.new_group(members, backend=host_backend, timeout=timeout) if host_backend
                else group)
        if node == env.place.node:
            env.node, env.host_node = group, host


def shutdown(env: DistEnv | None) -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def host_barrier(env: DistEnv, *, node_only: bool = False) -> None:
    group = env.host_node if node_only else env.host_world
    if node_only and env.layout.local_ranks == 1:
        return
    dist.barrier(group=group)


def broadcast_object(env: DistEnv, value: Any) -> Any:
    """Rank 0's `value` on every rank (host group)."""
    box = [value]
    dist.broadcast_object_list(box, src=0, group=env.host_world)
    return box[0]


def gather_objects(env: DistEnv, value: Any) -> list[Any] | None:
    """Every rank's `value` on rank 0 (None elsewhere)."""
    out = [None] * env.place.world_size if env.rank == 0 else None
    dist.gather_object(value, out, dst=0, group=env.host_world)
    return out


def clock_epoch(env: DistEnv) -> tuple[float, str]:
    """The run's time origin on this rank's CLOCK_MONOTONIC, and how it was found.

    One host: every process reads the same CLOCK_MONOTONIC, so rank 0's reading is the
    epoch of all. Several hosts: each rank takes its own reading as it leaves a barrier
    (three rounds, the last kept); the offset error is one barrier's exit skew."""
    hosts = gather_objects(env, socket.gethostname())
    one_host = broadcast_object(env, hosts is not None and len(set(hosts)) == 1)
    if one_host:
        host_barrier(env)
        return float(broadcast_object(env, time.monotonic())), "common CLOCK_MONOTONIC"
    for _ in range(3):
        host_barrier(env)
        local = time.monotonic()
    return local, "barrier exit (per-host offset estimate)"


# ---- lanes ------------------------------------------------------------------------------------
@dataclass(kw_only=True, eq=False)
class Task:
    """A task handle: `done` is what later tasks wait on (a CUDA event, or None)."""

    kind: str
    block: int
    done: Any = None
    start: Any = None


@dataclass(kw_only=True, eq=False)
class CpuLanes:
    """Tasks run at once in program order; timed with the host clock."""

    rank: int
    epoch_s: float = 0.0
    spans: Any = field(default_factory=NoSpans)   # zoplan.trace.SpanWriter or NoSpans
    _step: int = 0
    _record: bool = True

    def begin_step(self, step: int, *, record: bool = True) -> None:
        self._step, self._record = step, record

    @contextmanager
    def task(self, kind: str, block: int = NO_BLOCK, *, after: tuple = (),
             record: bool = True) -> Iterator[Task]:
        handle = Task(kind=kind, block=block)
        start = time.monotonic()
        yield handle
        end = time.monotonic()
        if record and self._record:
            self.spans.append(Span(kind=kind, rank=self.rank, start_s=start - self.epoch_s,
                                   dur_s=end - start, block=block, step=self._step))

    def end_step(self) -> None:
        """Nothing is in flight on the CPU."""


@dataclass(kw_only=True, eq=False)
class CudaLanes:
    """One CUDA stream per lane; tasks ordered by events, timed by events."""

    rank: int
    device: torch.device
    epoch_s: float = 0.0
    spans: Any = field(default_factory=NoSpans)   # zoplan.trace.SpanWriter or NoSpans
    streams: dict = field(default_factory=dict)
    _pending: list = field(default_factory=list)
    _step: int = 0
    _record: bool = True
    _ref: Any = None
    _ref_host_s: float = 0.0

    def __post_init__(self) -> None:
        self.streams = {lane: torch.cuda.Stream(device=self.device) for lane in LANES}
        torch.cuda.set_stream(self.streams[LANE_COMPUTE])

    def begin_step(self, step: int, *, record: bool = True) -> None:
        """Anchor CUDA event time to host time: the device is idle here."""
        self._step, self._record = step, record
        torch.cuda.synchronize(self.device)
        self._ref = torch.cuda.Event(enable_timing=True)
        self._ref.record(self.streams[LANE_COMPUTE])
        self._ref.synchronize()
        self._ref_host_s = time.monotonic()

    @contextmanager
    def task(self, kind: str, block: int = NO_BLOCK, *, after: tuple = (),
             record: bool = True) -> Iterator[Task]:
        stream = self.streams[KIND_LANE[kind]]
        for event in after:
            if event is not None:
                stream.wait_event(event)
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        handle = Task(kind=kind, block=block, done=end, start=start)
        with torch.cuda.stream(stream):
            start.record(stream)
            yield handle
            end.record(stream)
        if record and self._record:
            self._pending.append(handle)

    def end_step(self) -> None:
        """Wait for the step's work and turn its events into spans (host time)."""
        torch.cuda.synchronize(self.device)
        base = self._ref_host_s - self.epoch_s
        for handle in self._pending:
            start_s = base + self._ref.elapsed_time(handle.start) / 1e3
            dur_s = max(0.0, handle.start.elapsed_time(handle.done) / 1e3)
            self.spans.append(Span(kind=handle.kind, rank=self.rank, start_s=start_s,
                                   dur_s=dur_s, block=handle.block, step=self._step))
        self._pending.clear()


def make_lanes(env: DistEnv, *, epoch_s: float, spans=None):
    """The lanes of this rank's device; `spans`: where their spans go (an object with
    `append`: zoplan.trace.SpanWriter with --trace; None: nowhere, nothing kept)."""
    spans = spans if spans is not None else NoSpans()
    if env.is_cuda:
        return CudaLanes(rank=env.rank, device=env.device, epoch_s=epoch_s, spans=spans)
    return CpuLanes(rank=env.rank, epoch_s=epoch_s, spans=spans)


def set_threads(threads: int | None, local_ranks: int) -> int:
    """torch threads of a rank: `threads`, else the host's cores shared by its ranks."""
    count = threads or threads_per_rank(usable_cores(), local_ranks)
    torch.set_num_threads(count)
    return count
