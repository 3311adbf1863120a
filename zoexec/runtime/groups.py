"""Where a rank sits and the process groups it joins: the rendezvous (ports, files,
the loopback interface), the default group, the slice, node and host groups, barriers
and collectives of Python objects, and the timeout of every wait.

Groups (built identically on every rank, `new_group` being collective):
- world: the default group (loss all-reduce, PertP exchange + DDP mean); gloo for a
  job of one rank, even on CUDA (zoexec.runtime.device.backend_for).
- slice: the rank's slice group (all-gather of a block), None when slices == 1.
- node: the node's local ranks (CUDA write-back fence; the CPU uses zoexec.store.fence),
  None with one local rank.
- host_world / host_node: gloo twins used for host-side coordination (store name,
  store attach barriers, clock epoch, trace gather); the same groups on a gloo world.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist

from zoexec.config import RuntimeOptions
from zoexec.runtime import device as zdevice
from zoexec.runtime.device import bind_near_gpu, nccl_defaults, select_device, set_tf32
from zoplan.execrules import threads_per_rank, usable_cores
from zoplan.layout import Layout


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
    world: dist.ProcessGroup | None = None
    slice: dist.ProcessGroup | None = None
    node: dist.ProcessGroup | None = None
    host_world: dist.ProcessGroup | None = None
    host_node: dist.ProcessGroup | None = None
    cpus: str = ""             # CPU list the rank's threads were bound to ('' unchanged)
    timeout_s: float = RuntimeOptions.timeout_s   # every wait of this rank (--timeout-s)
    shm_dir: str = RuntimeOptions.shm_dir         # the node's shared files (--shm-dir)

    @property
    def is_cuda(self) -> bool:
        kind: str = self.device.type
        return kind == "cuda"

    @property
    def rank(self) -> int:
        return self.place.rank

    @property
    def local_rank(self) -> int:
        return self.place.local_rank


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
                     tf32: bool = True, runtime: RuntimeOptions | None = None) -> DistEnv:
    """Join the job: pick device/backend, set TF32 (`tf32`: the plan's workload.tf32)
    and bind the threads near the GPU (CUDA only), NCCL's defaults, init the default
    group, build the groups. Threads are bound before the backends start theirs, which
    inherit it. `runtime`: the run's --timeout-s and --shm-dir (None: their defaults)."""
    runtime = runtime or RuntimeOptions()
    device, backend = select_device(device_kind, place.local_rank,
                                    local_world_size=place.local_world_size,
                                    world_size=place.world_size, backend=runtime.backend)
    set_tf32(device, tf32)
    cpus = bind_near_gpu(device)
    nccl_defaults(backend)
    dist.init_process_group(
        backend, init_method=rendezvous(place),
        rank=place.rank, world_size=place.world_size, timeout=timedelta(seconds=runtime.timeout_s),
        device_id=device if backend == "nccl" else None)
    env = DistEnv(place=place, layout=layout, device=device, backend=backend,
                  world=dist.group.WORLD, cpus=cpus, timeout_s=runtime.timeout_s,
                  shm_dir=runtime.shm_dir)
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


def _build_groups(env: DistEnv) -> None:
    """Slice, node and host groups; every rank creates every group in the same order.
    A group whose members are the whole world is the world group itself (on NCCL each
    group is a communicator of its own, hundreds of MiB of device memory)."""
    lay, rank = env.layout, env.rank
    host_backend = None if env.backend == "gloo" else "gloo"
    timeout = timedelta(seconds=env.timeout_s)   # new_group's default is 30 minutes
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


class Work(Protocol):
    """The handle of an asynchronous collective (torch's Work, or `Works`)."""

    def wait(self) -> object: ...

    def is_completed(self) -> bool: ...


Collective = Callable[..., Work | None]   # (out, mine, *, group, async_op): a handle if async


def all_gather_call(module: Any = dist) -> Collective:   # module: torch.distributed (tests: a stand-in)
    """torch's one-tensor all-gather: all_gather_single where torch has it (2.12+, where
    all_gather_into_tensor stays, deprecated, with a FutureWarning), else
    all_gather_into_tensor (torch 2.11, the GPU machine's). The same collective."""
    call: Collective = getattr(module, "all_gather_single", None) or module.all_gather_into_tensor
    return call


def all_gather_flat(out: torch.Tensor, mine: torch.Tensor, *, group: dist.ProcessGroup | None,
                    async_op: bool = True) -> Work | None:
    """`out` <- every member's `mine`, in rank order (group size x mine's length): the
    backend's own all-gather, or one broadcast per member where the backend has none
    for these tensors (zoexec.runtime.device.gather_by_broadcasts: gloo and CUDA)."""
    if zdevice.gather_by_broadcasts(dist.get_backend(group), mine.device.type):
        return gather_by_broadcasts(out, mine, group=group, async_op=async_op)
    return all_gather_call()(out, mine, group=group, async_op=async_op)


class Works:
    """The handles of several collectives as one (`wait` waits for each)."""

    def __init__(self, works: list[Work]) -> None:
        self.works = works

    def wait(self) -> bool:
        for work in self.works:
            work.wait()
        return True

    def is_completed(self) -> bool:
        return all(work.is_completed() for work in self.works)


def gather_by_broadcasts(out: torch.Tensor, mine: torch.Tensor, *,
                         group: dist.ProcessGroup | None, async_op: bool = True) -> Works | None:
    """The all-gather as broadcasts: member i's piece of `out` (mine's length) is
    broadcast from member i, after this rank copied `mine` into its own piece (nothing
    to copy where `mine` is that piece already, as a block buffer's slice is)."""
    group = group or dist.group.WORLD
    members = dist.get_process_group_ranks(group)
    size, me = mine.numel(), dist.get_rank(group)
    if out.numel() != size * len(members):
        raise ValueError(f"all-gather into {out.numel()} elements of {len(members)} pieces "
                         f"of {size}")
    own = out[me * size:(me + 1) * size]
    if own.data_ptr() != mine.data_ptr():
        own.copy_(mine)
    works = [dist.broadcast(out[i * size:(i + 1) * size], src=member, group=group,
                            async_op=async_op) for i, member in enumerate(members)]
    return Works(works) if async_op else None


def device_memory_peak(env: DistEnv) -> dict[str, int]:
    """Peak memory the rank's GPU allocator held (empty on the CPU)."""
    return zdevice.device_memory_peak(env.device)


def set_threads(threads: int | None, local_ranks: int) -> int:
    """torch threads of a rank: `threads`, else the host's cores shared by its ranks."""
    count = threads or threads_per_rank(usable_cores(), local_ranks)
    torch.set_num_threads(count)
    return count
