"""The executor's device runtime with the CUDA runtime faked: which GPU a rank takes,
the topology rows of those GPUs, TF32, page-locking and its failure, and the NUMA
placement of the block store and of a rank's threads (fake sysfs, fake syscalls)."""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import subprocess
from types import SimpleNamespace

import pytest
import torch

from zoexec.config import RuntimeOptions
from zoexec.launch import preflight as zpreflight
from zoexec.profiler.cuda import nvlink_matrix
from zoexec.runtime import device as zdevice
from zoexec.runtime import devicemap, numa
from zoexec.runtime import groups as zgroups
from zoexec.runtime import pinning as zpinning
from zoexec.runtime.devicemap import cuda_index, topo_gpu_matrix, visible_physical
from zoexec.runtime.hostmem import filesystem_type
from zoexec.store.blocks import create_store
from zoplan.errors import ZoError
from zoplan.layout import Layout

PAGE = numa.PAGE_BYTES


# ---- which GPU a local rank uses ---------------------------------------------------------------
@pytest.mark.parametrize("rank,ranks,visible,index", [
    (3, 4, 4, 3), (3, 4, 8, 3),      # every rank sees them all
    (3, 4, 1, 0), (0, 1, 1, 0),      # per-task binding: one GPU each
    (0, 1, 8, 0)])
def test_cuda_index_rule(rank, ranks, visible, index):
    assert cuda_index(rank, local_world_size=ranks, num_visible=visible,
                      visible_env="0,1") == index


@pytest.mark.parametrize("visible,env", [(2, "4,5"), (3, None), (0, "")])
def test_cuda_index_names_the_numbers_when_ranks_would_share(visible, env):
    with pytest.raises(ZoError) as err:
        cuda_index(1, local_world_size=4, num_visible=visible, visible_env=env)
    text = str(err.value)
    assert f"{visible} CUDA GPU(s) visible" in text and "4 local ranks" in text
    assert ("unset" if env is None else repr(env)) in text


def _fake_cuda(monkeypatch, count: int) -> list[int]:
    chosen: list[int] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    return chosen


def test_select_device_per_task_binding_and_subsets(monkeypatch):
    chosen = _fake_cuda(monkeypatch, 1)
    assert zdevice.select_device("cuda", 3, local_world_size=4, world_size=4) == (torch.device("cuda", 0), "nccl")
    chosen = _fake_cuda(monkeypatch, 4)
    assert zdevice.select_device("cuda", 3, local_world_size=4, world_size=4)[0] == torch.device("cuda", 3)
    assert chosen == [3]
    _fake_cuda(monkeypatch, 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "6,7")
    with pytest.raises(ZoError, match=r"2 CUDA GPU\(s\) visible.*'6,7'.*4 local ranks"):
        zdevice.select_device("cuda", 1, local_world_size=4, world_size=4)
    assert zdevice.select_device("cpu", 5, local_world_size=8, world_size=8) == (torch.device("cpu"), "gloo")


def _cfg(local_ranks: int):
    return SimpleNamespace(device_kind="cuda", layout=Layout(ddp=local_ranks),
                           runtime=RuntimeOptions())


def test_preflight_devices_per_rank_or_for_the_spawned_ranks(monkeypatch):
    monkeypatch.setattr(zpreflight, "device_count", lambda kind: 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ZoError, match=r"needs 4 CUDA GPU\(s\) per node.*sees 1 .*'3'"):
        zpreflight._check_devices(_cfg(4))        # a local launch: its ranks share one GPU
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "2")
    zpreflight._check_devices(_cfg(4))            # torchrun/srun rank with a GPU of its own
    monkeypatch.setattr(zpreflight, "device_count", lambda kind: 2)
    with pytest.raises(ZoError, match="2 CUDA GPU"):
        zpreflight._check_devices(_cfg(4))
    monkeypatch.setattr(zpreflight, "device_count", lambda kind: 0)
    with pytest.raises(ZoError, match="sees none"):
        zpreflight._check_devices(_cfg(4))


# ---- the topology of the visible GPUs -----------------------------------------------------------
TOPO = ("\x1b[4m\tGPU0\tGPU1\tGPU2\tGPU3\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
        "GPU0\t X \tNV2\tPIX\tSYS\tNODE\t0-15\t0\t\tN/A\n"
        "GPU1\tNV2\t X \tNODE\tPXB\tSYS\t0-15\t0\t\tN/A\n"
        "GPU2\tPIX\tNODE\t X \tNV1\tSYS\t16-31\t1\t\tN/A\n"
        "GPU3\tSYS\tPXB\tNV1\t X \tPIX\t16-31\t1\t\tN/A\n"
        "NIC0\tNODE\tSYS\tSYS\tPIX\t X \n\nLegend:\n\n  X    = Self\n  SYS  = PCIe + SMP\n")


@pytest.mark.parametrize("env,count,physical", [
    (None, 3, [0, 1, 2]), ("3,1", 2, [3, 1]), ("3,1,0", 2, [3, 1]), (" 2 , 0 ,3", 3, [2, 0, 3]),
    ("1,-1,2", 1, [1]), ("1,-1,2", 2, None), ("GPU-8f2a,GPU-11c0", 1, None),
    ("MIG-3e1b", 1, None), ("0,GPU-8f2a", 1, [0]), ("0,GPU-8f2a", 2, None), ("", 0, [])])
def test_visible_physical(env, count, physical):
    assert visible_physical(env, count) == physical


def test_topology_rows_are_those_of_the_visible_gpus(monkeypatch):
    calls = []

    def run(cmd, **kw):
        calls.append(cmd)
        return SimpleNamespace(stdout=TOPO)
    monkeypatch.setattr(subprocess, "run", run)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0,3")
    assert nvlink_matrix(3) == [["X", "PIX", "NV1"], ["PIX", "X", "SYS"], ["NV1", "SYS", "X"]]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert nvlink_matrix(2) == [["X", "NV2"], ["NV2", "X"]]
    assert nvlink_matrix(5) is None                       # more devices than topo lists
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8f2a,GPU-11c0")
    calls.clear()
    assert nvlink_matrix(2) is None and calls == []       # UUIDs: not mapped, not asked
    assert topo_gpu_matrix("no such output", [0]) is None


# ---- TF32 ---------------------------------------------------------------------------------------
@pytest.fixture
def tf32_flags():
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.get_float32_matmul_precision())

    def read():
        return (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
                torch.get_float32_matmul_precision())
    yield read
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
    torch.set_float32_matmul_precision(saved[2])


def _init(monkeypatch, device: torch.device, **kw) -> zgroups.DistEnv:
    """init_distributed with the device choice, the process group and the groups faked."""
    monkeypatch.setattr(zgroups, "select_device",
                        lambda kind, rank, *, local_world_size, world_size, **_: (device, "nccl"))
    monkeypatch.setattr(zgroups.dist, "init_process_group", lambda *a, **k: None)
    monkeypatch.setattr(zgroups, "_build_groups", lambda env: None)
    monkeypatch.setattr(numa, "bind_near_pci", lambda address, **k: "0-7")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: SimpleNamespace(
        pci_domain_id=0, pci_bus_id=0x18, pci_device_id=0))
    place = zgroups.RankPlace(rank=0, local_rank=0, world_size=1, local_world_size=1)
    return zgroups.init_distributed(place=place, layout=Layout(), device_kind="cuda", **kw)


def test_tf32_follows_the_plan_on_cuda_and_the_cpu_is_untouched(monkeypatch, tf32_flags):
    cuda = torch.device("cuda", 0)
    _init(monkeypatch, cuda, tf32=False)
    assert tf32_flags() == (False, False, "highest")
    env = _init(monkeypatch, torch.device("cpu"), tf32=True)
    assert tf32_flags() == (False, False, "highest") and env.cpus == ""   # the CPU: untouched
    env = _init(monkeypatch, cuda)                        # the default: TF32 allowed
    assert tf32_flags() == (True, True, "high") and env.cpus == "0-7"
    env = _init(monkeypatch, torch.device("cpu"), tf32=False)
    assert tf32_flags() == (True, True, "high")


# ---- page-locking -------------------------------------------------------------------------------
class FakeCudart:
    """The few cudart calls pin_host_memory makes; `fail` makes cudaHostRegister fail."""

    def __init__(self, *, fail: int = 0, last_error: bool = True) -> None:
        self.fail, self.calls, self.pending = fail, [], 0
        if last_error:
            self.cudaGetLastError = self._get_last_error

    def cudaHostRegister(self, ptr, size, flags):
        self.calls.append(("register", ptr, size, flags))
        self.pending = self.fail
        return self.fail

    def cudaHostUnregister(self, ptr):
        self.calls.append(("unregister", ptr))
        return 0

    def cudaGetErrorString(self, err):
        return "cudaErrorHostMemoryAlreadyRegistered" if err == 712 else "cudaErrorUnknown"

    def _get_last_error(self):
        err, self.pending = self.pending, 0
        return err


def _cuda_env(rank: int = 0, local_rank: int = 0) -> zgroups.DistEnv:
    place = zgroups.RankPlace(rank=rank, local_rank=local_rank, world_size=8, local_world_size=4)
    return zgroups.DistEnv(place=place, layout=Layout(ddp=4, nodes=2),
                           device=torch.device("cuda", local_rank), backend="nccl")


def test_failed_pin_clears_the_error_and_warns_on_every_rank(monkeypatch, capsys):
    fake = FakeCudart(fail=712)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: fake)
    buf = torch.zeros(3000, dtype=torch.float32)
    assert zpinning.pin_host_memory(_cuda_env(rank=5, local_rank=1), buf) is False
    assert fake.pending == 0                              # the next launch sees no error
    err = capsys.readouterr().err
    assert "rank 5 (local 1)" in err and "call 1 of 1" in err
    assert "cudaError 712 (cudaErrorHostMemoryAlreadyRegistered)" in err
    assert zpinning.unpin_host_memory(buf) is False          # never pinned: nothing undone
    assert [c[0] for c in fake.calls] == ["register"]


def test_failed_pin_of_a_regular_file_store_says_why(tmp_path, monkeypatch, capsys):
    kind = filesystem_type(tmp_path / "x")
    if kind in (None, "tmpfs"):
        pytest.skip(f"{tmp_path} is on {kind}")
    monkeypatch.setattr(torch.cuda, "cudart", lambda: FakeCudart(fail=1))
    store = create_store(tmp_path / "blocks", num_blocks=1, block_numel=PAGE, stride=PAGE,
                         dtype=torch.uint8)
    assert zpinning.pin_host_memory(_cuda_env(), store.flat) is False
    assert f"blocks, a file on {kind}, not tmpfs" in capsys.readouterr().err


def test_failed_pin_reaches_the_runtime_when_torch_binds_no_get_last_error(monkeypatch):
    fake = FakeCudart(fail=2, last_error=False)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: fake)
    monkeypatch.setattr(zpinning, "_runtime_get_last_error", lambda: fake._get_last_error)
    assert zpinning.pin_host_memory(_cuda_env(), torch.zeros(16)) is False
    assert fake.pending == 0


def test_pin_registers_whole_pages_and_unpins_only_what_it_pinned(monkeypatch):
    fake = FakeCudart()
    monkeypatch.setattr(torch.cuda, "cudart", lambda: fake)
    buf = torch.zeros(4 * PAGE, dtype=torch.uint8)
    view = buf[100:100 + PAGE]                            # starts and ends inside pages
    env = _cuda_env()
    assert zpinning.pin_host_memory(env, view) is True
    _, ptr, size, flags = fake.calls[0]
    assert ptr % PAGE == 0 and size % PAGE == 0 and flags == 1
    assert ptr <= view.data_ptr() and view.data_ptr() + PAGE <= ptr + size <= ptr + 2 * PAGE
    assert zpinning.unpin_host_memory(buf) is False          # another range: not pinned
    assert zpinning.unpin_host_memory(view) is True and fake.calls[-1] == ("unregister", ptr)
    assert zpinning.unpin_host_memory(view) is False and len(fake.calls) == 2
    cpu = zgroups.DistEnv(place=env.place, layout=env.layout, device=torch.device("cpu"),
                          backend="gloo")
    assert zpinning.pin_host_memory(cpu, buf) is False and len(fake.calls) == 2


# ---- NUMA ---------------------------------------------------------------------------------------
def _sysfs(tmp_path, *, memory: str, cpus: str | None = None, gpu: str | None = None):
    node = tmp_path / "devices/system/node"
    node.mkdir(parents=True)
    (node / "has_memory").write_text(memory + "\n")
    if cpus is not None:
        (node / "has_cpu").write_text(cpus + "\n")
    if gpu is not None:
        dev = tmp_path / "bus/pci/devices/0000:18:00.0"
        dev.mkdir(parents=True)
        (dev / "local_cpulist").write_text(gpu + "\n")
    return tmp_path


def test_cpulists_and_memory_nodes(tmp_path):
    assert numa.parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert numa.format_cpulist([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"
    assert numa.memory_nodes(_sysfs(tmp_path, memory="0-3", cpus="0-1")) == [0, 1]
    assert numa.memory_nodes(tmp_path / "nothing") == [0]


def test_interleave_sets_the_policy_over_the_nodes(tmp_path, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(numa, "_syscall", lambda name, *args: calls.append((name, args)) or 0)
    sysfs = _sysfs(tmp_path, memory="0-1", cpus="0-1")
    assert numa.interleave(5 * PAGE + 10, 3 * PAGE, sysfs=sysfs) is True
    (name, (start, length, mode, mask, maxnode, flags)), = calls
    assert name == "mbind" and (start.value, length.value) == (5 * PAGE, 4 * PAGE)
    assert mode.value == numa.MPOL_INTERLEAVE and mask[0] == 0b11 and flags.value == 0
    assert maxnode.value == 8 * ctypes.sizeof(ctypes.c_ulong) + 1

    def refused(name, *args):
        raise OSError(1, "mbind: Operation not permitted")
    monkeypatch.setattr(numa, "_syscall", refused)
    monkeypatch.setattr(numa, "_said", set())
    assert numa.interleave(0, PAGE, sysfs=sysfs) is False
    assert numa.interleave(0, PAGE, sysfs=sysfs) is False
    assert capsys.readouterr().err.count("not interleaved over NUMA nodes 0-1") == 1


def test_one_node_is_a_no_op(tmp_path, monkeypatch):
    monkeypatch.setattr(numa, "_syscall", lambda *a: pytest.fail("no syscall on one node"))
    assert numa.interleave(0, PAGE, sysfs=_sysfs(tmp_path, memory="0", cpus="0")) is False


def test_real_mbind_call_is_well_formed_or_refused():
    """The ctypes marshalling against the real kernel: node 0 alone is always valid;
    a node this machine lacks is refused (EINVAL), never a crash."""
    region = mmap.mmap(-1, 4 * PAGE)
    view = (ctypes.c_char * len(region)).from_buffer(region)
    addr = ctypes.addressof(view)
    try:
        mask, maxnode = numa._node_mask([0])
        try:
            numa._syscall("mbind", ctypes.c_void_p(addr), ctypes.c_ulong(4 * PAGE),
                          ctypes.c_int(numa.MPOL_INTERLEAVE), mask, ctypes.c_ulong(maxnode),
                          ctypes.c_uint(0))
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.ENOSYS):
                raise
            pytest.skip(f"mbind unavailable here: {exc}")
        mask, maxnode = numa._node_mask([63])
        with pytest.raises(OSError):
            numa._syscall("mbind", ctypes.c_void_p(addr), ctypes.c_ulong(4 * PAGE),
                          ctypes.c_int(numa.MPOL_INTERLEAVE), mask, ctypes.c_ulong(maxnode),
                          ctypes.c_uint(0))
    finally:
        del view
        region.close()


def test_page_placement_counts_bytes_per_node():
    buf = torch.ones(8 * PAGE, dtype=torch.uint8)         # touched: every page present
    report = numa.page_placement(buf)
    if report["source"] in (f"unavailable: move_pages: {os.strerror(errno.EPERM)}",
                            f"unavailable: move_pages: {os.strerror(errno.ENOSYS)}"):
        pytest.skip(report["source"])
    assert sum(report["node_bytes"].values()) + report["not_present_bytes"] == buf.numel()
    assert report["not_present_bytes"] == 0 and report["pages_queried"] >= 8


def test_page_placement_samples_and_scales(monkeypatch):
    seen = []

    def move_pages(name, pid, count, pages, nodes, status, flags):
        seen.extend(pages)
        for i in range(count.value):
            status[i] = -2 if i == 0 else i % 2           # first page never touched
        return 0
    monkeypatch.setattr(numa, "_syscall", move_pages)
    buf = torch.zeros(64 * PAGE, dtype=torch.uint8)
    report = numa.page_placement(buf, max_pages=8)
    assert report["pages_queried"] == 8 and len(seen) == 8
    assert all(p % PAGE == 0 for p in seen) and len(set(seen)) == 8
    assert min(seen) <= buf.data_ptr() and max(seen) - min(seen) >= 56 * PAGE   # spread
    assert report["node_bytes"] == {"0": 24 * PAGE, "1": 32 * PAGE}
    assert report["not_present_bytes"] == 8 * PAGE
    monkeypatch.setattr(numa, "_syscall", lambda *a: (_ for _ in ()).throw(OSError(38, "no")))
    assert numa.page_placement(buf)["source"] == "unavailable: no"


def test_bind_near_pci_uses_the_allowed_cpus_of_the_gpus_socket(tmp_path, monkeypatch, capsys):
    sysfs = _sysfs(tmp_path, memory="0-1", cpus="0-1", gpu="0-3,8-11")
    bound = []
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {2, 3, 4, 5, 8})
    monkeypatch.setattr(os, "sched_setaffinity", lambda tid, cpus: bound.append((tid, cpus)))
    monkeypatch.setattr(numa, "_thread_ids", lambda: [101, 102])
    monkeypatch.setattr(numa, "_said", set())
    assert numa.bind_near_pci("0000:18:00.0", sysfs=sysfs) == "2-3,8"
    assert bound == [(101, {2, 3, 8}), (102, {2, 3, 8})]
    bound.clear()
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {4, 5})
    assert numa.bind_near_pci("0000:18:00.0", sysfs=sysfs) == "" and bound == []
    assert "none of the CPUs 4-5" in capsys.readouterr().err
    assert numa.bind_near_pci("0000:99:00.0", sysfs=sysfs) == "" and bound == []


def test_bind_near_gpu_finds_the_pci_address(monkeypatch):
    asked = []
    monkeypatch.setattr(numa, "bind_near_pci", lambda address, **k: asked.append(address) or "")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: SimpleNamespace(
        pci_domain_id=1, pci_bus_id=0xC1, pci_device_id=3))
    zdevice.bind_near_gpu(torch.device("cuda", 2))
    assert asked == ["0001:c1:03.0"]
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda index: pytest.fail("the CPU path asks nothing"))
    assert zdevice.bind_near_gpu(torch.device("cpu")) == ""


def test_devicemap_stays_torch_free():
    source = open(devicemap.__file__).read() + open(numa.__file__).read()
    assert "import torch" not in source
