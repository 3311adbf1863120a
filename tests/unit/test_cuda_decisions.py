"""The CUDA path's decisions, on the CPU with the CUDA runtime faked: the backend of a
job of one rank, NCCL's NVLS default, page-locking in calls of at most 64 GiB and only
the pieces of the store a rank copies, the pinned staging path when locking fails (the
staged run equals the direct one), and the profiler measuring what runs do (forwards
under no_grad, copies from a registered tmpfs mapping)."""

from __future__ import annotations

import os
from types import SimpleNamespace

import torch
from safetensors.torch import load_file

from tests.fixtures.host_reads import HostReads
from zoexec.config import RunConfig
from zoexec.launch.spawn import run_in_process
from zoexec.profiler import blocks as pblocks
from zoexec.profiler import cuda as pcuda
from zoexec.runtime import device as zdevice
from zoexec.runtime import groups as zgroups
from zoexec.runtime import lanes as zlanes
from zoexec.runtime import numa
from zoexec.runtime import pinning as zpinning
from zoexec.runtime.hostmem import mapped_file
from zoexec.store import node as znode
from zoexec.store.blocks import SHM_DIR, create_store
from zoexec.train import engine
from zoplan.handplan import hand_plan
from zoplan.layout import Layout
from zoplan.workload import Workload

GIB, PAGE = 1 << 30, numa.PAGE_BYTES


class FakeCudart:
    """cudaHostRegister / Unregister recorded; call number `fail_at` (1-based) fails."""

    def __init__(self, *, fail_at: int = 0) -> None:
        self.fail_at, self.calls, self.pending = fail_at, [], 0

    def cudaHostRegister(self, ptr, size, flags):
        self.calls.append(("register", ptr, size))
        err = 2 if len([c for c in self.calls if c[0] == "register"]) == self.fail_at else 0
        self.pending = err
        return err

    def cudaHostUnregister(self, ptr):
        self.calls.append(("unregister", ptr))
        return 0

    def cudaGetErrorString(self, err):
        return "cudaErrorMemoryAllocation"

    def cudaGetLastError(self):
        err, self.pending = self.pending, 0
        return err


# ---- the backend and NCCL's environment ---------------------------------------------------------
def _init(monkeypatch, *, world: int) -> list:
    """init_distributed of rank 0 of `world` ranks on a faked GPU: the init call's args."""
    calls: list = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: None)
    monkeypatch.setattr(zgroups, "bind_near_gpu", lambda device: "")
    monkeypatch.setattr(zgroups, "set_tf32", lambda device, tf32: None)
    monkeypatch.setattr(zgroups.dist, "init_process_group", lambda *a, **k: calls.append((a, k)))
    monkeypatch.setattr(zgroups, "_build_groups", lambda env: None)
    place = zgroups.RankPlace(rank=0, local_rank=0, world_size=world, local_world_size=world)
    env = zgroups.init_distributed(place=place, layout=Layout(ddp=world), device_kind="cuda")
    assert env.device == torch.device("cuda", 0)
    return calls


def test_a_one_rank_cuda_job_starts_no_nccl(monkeypatch):
    monkeypatch.delenv("NCCL_NVLS_ENABLE", raising=False)
    (args, kwargs), = _init(monkeypatch, world=1)
    assert args == ("gloo",) and kwargs["device_id"] is None
    assert "NCCL_NVLS_ENABLE" not in zgroups.os.environ     # no NCCL: nothing set
    (args, kwargs), = _init(monkeypatch, world=4)
    assert args == ("nccl",) and kwargs["device_id"] == torch.device("cuda", 0)


def test_nvls_is_off_by_default_and_the_user_can_turn_it_on(monkeypatch):
    monkeypatch.delenv("NCCL_NVLS_ENABLE", raising=False)
    _init(monkeypatch, world=4)
    assert zgroups.os.environ["NCCL_NVLS_ENABLE"] == "0"
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    assert zdevice.nccl_defaults("nccl") == {}
    _init(monkeypatch, world=4)
    assert zgroups.os.environ["NCCL_NVLS_ENABLE"] == "1"
    assert zdevice.nccl_defaults("gloo", environ={}) == {}


def test_the_all_gather_is_the_one_this_torch_has():
    """torch 2.13 has all_gather_single (all_gather_into_tensor deprecated); torch 2.11,
    the GPU machine's, only all_gather_into_tensor."""
    both = SimpleNamespace(all_gather_single="single", all_gather_into_tensor="into")
    assert zgroups.all_gather_call(both) == "single"
    assert zgroups.all_gather_call(SimpleNamespace(all_gather_into_tensor="into")) == "into"


# ---- page-locking ---------------------------------------------------------------------------------
def _env(world: int = 1) -> zgroups.DistEnv:
    place = zgroups.RankPlace(rank=0, local_rank=0, world_size=world, local_world_size=world)
    return zgroups.DistEnv(place=place, layout=Layout(ddp=world),
                           device=torch.device("cuda", 0), backend="nccl")


def test_a_store_of_130_gib_is_locked_in_calls_of_at_most_64_gib(monkeypatch):
    fake = FakeCudart()
    monkeypatch.setattr(torch.cuda, "cudart", lambda: fake)
    base = 1 << 40                                   # spans only: the fake touches no memory
    anchor = torch.zeros(PAGE, dtype=torch.uint8)
    assert zpinning.pin_tensor(anchor, [(base, 130 * GIB)]) is True
    assert [c[2] for c in fake.calls] == [64 * GIB, 64 * GIB, 2 * GIB]
    assert [c[1] for c in fake.calls] == [base, base + 64 * GIB, base + 128 * GIB]
    assert zpinning.unpin_host_memory(anchor) is True
    assert [c[1] for c in fake.calls[3:]] == [base, base + 64 * GIB, base + 128 * GIB]


def test_a_failed_call_undoes_the_calls_before_it_and_clears_the_error(monkeypatch, capsys):
    fake = FakeCudart(fail_at=2)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: fake)
    anchor = torch.zeros(PAGE, dtype=torch.uint8)
    assert zpinning.pin_tensor(anchor, [(1 << 40, 100 * GIB)], who="rank 3") is False
    assert fake.calls[-1] == ("unregister", 1 << 40) and fake.pending == 0
    err = capsys.readouterr().err
    assert "rank 3" in err and "call 2 of 2" in err and "staging" in err
    assert zpinning.unpin_host_memory(anchor) is False


def test_spans_merge_into_whole_pages():
    assert zpinning.merge_spans([(PAGE + 5, 10), (PAGE + 100, 10), (3 * PAGE, PAGE)]) == [
        (PAGE, PAGE), (3 * PAGE, PAGE)]
    assert zpinning.merge_spans([(0, PAGE), (PAGE, PAGE)]) == [(0, 2 * PAGE)]   # touching
    assert zpinning.register_calls([(0, 10)], limit=4) == [(0, 4), (4, 4), (8, 2)]


def test_a_rank_locks_only_the_pieces_it_copies(tmp_path):
    """Four local ranks, two slices, six blocks, block 1 resident: rank 1 reads slice 1
    of every block and writes share 1 (of 4) of the five offloaded ones; one rank alone
    locks the whole store."""
    item, stride = 2, 4 * PAGE
    store = create_store(tmp_path / "s", num_blocks=6, block_numel=stride, stride=stride,
                         dtype=torch.float16)
    lay = Layout(pertp=2, ddp=2, slices=2)
    assert (lay.local_ranks, lay.slices, lay.slice_index_of(1), lay.local_rank_of(1)) == (4, 2, 1, 1)
    spans = zpinning.merge_spans(znode.rank_copy_spans(store, lay, 1, resident=(1,)))
    base, block = store.flat.data_ptr(), stride * item
    want = []
    for b in range(6):
        reads = (base + b * block + block // 2, block // 2)
        writes = (base + b * block + block // 4, block // 4)
        want += [writes, reads] if b != 1 else [reads]
    assert spans == zpinning.merge_spans(want)
    locked = sum(n for _, n in spans)
    assert locked == 6 * block // 2 + 5 * block // 4 < store.nbytes
    alone = znode.rank_copy_spans(store, Layout(), 0, resident=())
    assert zpinning.merge_spans(alone) == [(base, store.nbytes)]


# ---- the staging path ---------------------------------------------------------------------------
class FakeEvent:
    """A recorded copy's event: the test counts waits on it."""

    waits = 0

    def synchronize(self) -> None:
        FakeEvent.waits += 1


def _staging(**kw) -> zpinning.Staging:
    return zpinning.Staging(dtype=torch.float32, pin=False, event=FakeEvent, **kw)


def test_staged_copies_go_through_a_small_ring_and_write_back_on_drain():
    staging = _staging(slot_bytes=64, num_slots=3)       # 16 values a slot
    src = torch.arange(100, dtype=torch.float32)
    dst = torch.zeros(100)
    FakeEvent.waits = 0
    staging.h2d(dst, src)                                # 7 chunks through 3 slots
    assert torch.equal(dst, src) and FakeEvent.waits == 4   # a slot is reused after its copy
    store = torch.zeros(100)
    staging.d2h(store, src * 2)
    assert store[:64].eq(src[:64] * 2).all()             # earlier chunks landed on reuse
    assert store[64:].eq(0).all()                        # the last slots' bytes still owed
    staging.drain()
    assert torch.equal(store, src * 2)


def test_the_store_takes_the_staging_path_only_where_cuda_could_not_lock_it(monkeypatch, tmp_path):
    made = []
    monkeypatch.setattr(zpinning, "Staging", lambda **kw: made.append(kw) or "staging")
    store = create_store(tmp_path / "s", num_blocks=1, block_numel=8, stride=8,
                         dtype=torch.bfloat16)
    cpu = zgroups.DistEnv(place=_env().place, layout=Layout(), device=torch.device("cpu"),
                          backend="gloo")
    assert znode.store_staging(_env(), store) == "staging"
    assert made == [{"dtype": torch.bfloat16}]
    store.pinned = True
    assert znode.store_staging(_env(), store) is None
    store.pinned = False
    assert znode.store_staging(cpu, store) is None and len(made) == 1


WORKLOAD = Workload(batch=2, seq=16, param_dtype="fp32", compute_dtype="fp32")


def _run(tmp_path, name: str) -> tuple[list, dict]:
    plan = hand_plan(model="tiny-opt", layout=Layout(prefetch=2), workload=WORKLOAD)
    out = tmp_path / name
    records = run_in_process(RunConfig.make(plan=plan.data, steps=3, seed=5, lr=1e-3, threads=1,
                                            quiet=True, out=str(out), speed_checks=False))
    return [r.loss for r in records], load_file(str(out / "final" / "model.safetensors"))


def test_a_run_through_the_staging_ring_equals_the_direct_run(monkeypatch, tmp_path):
    """The trainer's h2d and d2h through a staging ring of three 1 KiB slots (pageable
    here, events faked) give the direct run's losses and final weights, bit for bit:
    every write-back reaches the store before the next pass reads it. Every copy of
    every pass goes through the ring (4 blocks x 4 passes: 3 steps and the flush each
    way), not merely some: a direction that bypassed it would give the same weights."""
    direct = _run(tmp_path, "direct")
    rings, copies = [], {"h2d": 0, "d2h": 0}

    def counted(ring, direction):
        copy = getattr(ring, direction)

        def through(dst, src):
            copies[direction] += 1
            copy(dst, src)
        return through

    def staged(env, store):
        ring = _staging(slot_bytes=1024, num_slots=3)
        ring.h2d, ring.d2h = counted(ring, "h2d"), counted(ring, "d2h")
        rings.append(ring)
        return ring
    monkeypatch.setattr(engine, "store_staging", staged)
    FakeEvent.waits = 0
    losses, weights = _run(tmp_path, "staged")
    assert len(rings) == 1 and FakeEvent.waits > 0
    assert copies == {"h2d": 16, "d2h": 16}, copies
    assert losses == direct[0]
    assert weights.keys() == direct[1].keys()
    assert all(torch.equal(weights[k], direct[1][k]) for k in weights)


# ---- the profiler measures what runs do ------------------------------------------------------
def test_profiled_forwards_run_under_no_grad_as_runs_do(monkeypatch):
    modes = []
    real = pblocks.build_block

    def spying(*args, **kwargs):
        parts = real(*args, **kwargs)
        forward = parts.block_forward

        def block_forward(*a, **k):
            modes.append((torch.is_grad_enabled(), torch.is_inference_mode_enabled()))
            return forward(*a, **k)
        parts.block_forward = block_forward
        return parts
    monkeypatch.setattr(pblocks, "build_block", spying)
    settings = SimpleNamespace(forward_grid=[("opt", 64, 1, 8)], repeats=1)
    pblocks.forward_grid(settings, dtype="fp32", device="cpu")
    assert modes and set(modes) == {(False, False)}


def test_profiled_copies_come_from_a_registered_tmpfs_mapping(monkeypatch):
    fake = FakeCudart()
    monkeypatch.setattr(torch.cuda, "cudart", lambda: fake)
    ours = lambda: set(SHM_DIR.glob(f"zoexec-profile-{os.getpid()}-*"))
    before = ours()
    buf, registered = pcuda.host_buffer(3 * PAGE, "store")
    assert registered and fake.calls == [("register", buf.data_ptr(), 3 * PAGE)]
    assert mapped_file(buf.data_ptr()) is not None          # a file mapping, as the store
    assert ours() == before                                 # its name already gone
    assert zpinning.unpin_host_memory(buf) is True
    failing = FakeCudart(fail_at=1)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: failing)
    monkeypatch.setattr(pcuda, "_alloc_pinned", lambda n: ("alloc", n))
    assert pcuda.host_buffer(PAGE, "store") == (("alloc", PAGE), False)


def test_a_step_queues_its_work_without_reading_the_device(monkeypatch, tmp_path):
    """From begin_step (the device idle) to end_step (where the host waits for the
    step), nothing reads a tensor's value on the host: on a GPU the host then queues the
    whole step while the device works (the H200 check counted 5 waits a step before:
    the batch copied from pageable memory, transformers' packed-sequence check of the
    position ids, the loss count set as a Python number). Every task kind runs here:
    embed, update, forward, head, h2d and d2h of offloaded blocks."""
    reads = HostReads(monkeypatch)
    begin, end = zlanes.CpuLanes.begin_step, zlanes.CpuLanes.end_step
    windows = []

    def guarded_begin(lanes, step, *, record=True):
        begin(lanes, step, record=record)
        if record:
            windows.append(step)
            reads.refuse()

    def guarded_end(lanes):
        reads.allow()
        end(lanes)
    monkeypatch.setattr(zlanes.CpuLanes, "begin_step", guarded_begin)
    monkeypatch.setattr(zlanes.CpuLanes, "end_step", guarded_end)
    workload = Workload(batch=2, seq=16, param_dtype="bf16", compute_dtype="bf16",
                        update="stochastic")
    plan = hand_plan(model="tiny-opt", layout=Layout(prefetch=2), workload=workload)
    records = run_in_process(RunConfig.make(plan=plan.data, steps=3, seed=5, lr=1e-3, threads=1,
                                            quiet=True, speed_checks=False))
    assert windows == [0, 1, 2] and len(records) == 3
