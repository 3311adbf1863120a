"""zoplan.memory, the one memory model, against what zoexec really allocates.

A one-rank plan runs in this process under zoexec.runtime.memtrack.AllocationTracker, which
counts the live tensor storages torch's operators create. On the CPU the rank's
"device" is host memory, so the tracker counts only what a CUDA rank would hold on its
GPU: it starts once the node's model is built and the store filled (the build and the
shared store are host memory on every device), adopting the tensors that set-up moves
to the device (the resident and block modules' weights, the resident master), and stops
before the final weights are exported (host copies). Every phase of the step is
compared, not only the peak.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import zoexec.launch.rank as rank
import zoexec.train.engine as engine
from zoexec.config import RunConfig
from zoexec.launch.preflight import CUDA_CONTEXT_BYTES, _check_memory, check_gpu_memory
from zoexec.launch.spawn import run_in_process
from zoexec.maths.estimators import Directions
from zoexec.maths.zo import apply_update, apply_update_stochastic, perturb_into
from zoexec.model.families import TensorSpec, make_specs
from zoexec.model.precision import SAMPLE
from zoexec.run.loop import TrainLoop
from zoexec.runtime.memtrack import AllocationTracker, kernel_peak_bytes
from zoexec.store.loading import build_parts
from zoplan.errors import ZoError
from zoplan.estimators import EstimatorSpec
from zoplan.execrules import SR_SCRATCH
from zoplan.handplan import hand_plan
from zoplan.hardware import load_profile
from zoplan.hostmemory import node_host_memory
from zoplan.layout import Layout
from zoplan.memory import (
    ALIGN_ELEMENTS,
    LOST_UPDATE_SAMPLE,
    NCCL_COMM_BYTES_PAIR,
    estimator_transient,
    kernel_scratch_terms,
    nccl_groups,
    rank_memory,
    store_stride,
)
from zoplan.models import get_model, spec_from_hf_config
from zoplan.pricing.memory import estimate_memory
from zoplan.workload import Workload

TOLERANCE = 0.05
PHASES = {"_allocate": "setup", "_embed": "embed", "_update_block": "update",
          "_forward_block": "forward", "_head": "head"}


def _workload(update: str, dtype: str = "bf16", *, batch: int = 2, seq: int = 64):
    from zoplan.workload import Workload

    return Workload.for_update(batch=batch, seq=seq, compute_dtype=dtype, update=update)


def tracked_run(monkeypatch, model: str, workload, layout: Layout,
                resident: tuple[int, ...] = ()) -> AllocationTracker:
    """Two steps of a one-rank plan (the second applies the first's update) under the
    tracker, with a phase per Trainer stage."""
    tracker = AllocationTracker(counting=False)
    load, finish = rank.load_node_model, TrainLoop.finish

    def load_then_track(cfg, env, run_id):
        parts, store = load(cfg, env, run_id)
        tracker.start()
        moved = [*parts.resident.parameters(), *parts.block.parameters()]
        tracker.adopt(moved + ([parts.resident_master] if parts.resident_master is not None else []))
        return parts, store

    def stop_then_finish(self, *args, **kwargs):
        tracker.stop()
        return finish(self, *args, **kwargs)

    monkeypatch.setattr(rank, "load_node_model", load_then_track)
    monkeypatch.setattr(TrainLoop, "finish", stop_then_finish)
    for name, phase in PHASES.items():
        method = getattr(engine.Trainer, name)

        def in_phase(self, *args, _method=method, _phase=phase, **kwargs):
            with tracker.phase(_phase):
                return _method(self, *args, **kwargs)
        monkeypatch.setattr(engine.Trainer, name, in_phase)
    plan = hand_plan(model=model, layout=layout, workload=workload, resident=resident)
    cfg = RunConfig.make(plan=plan.data, steps=2, lr=1e-3, weight_decay=0.1, quiet=True,
                    speed_checks=False)
    with tracker:
        run_in_process(cfg)
    return tracker


# ---- the model against the executor --------------------------------------------------------
def _assert_phases_match(tracker: AllocationTracker, modelled) -> None:
    """The model's peak and every phase's bytes within TOLERANCE of the tracked ones."""
    table = {p: (tracker.phase_peaks.get(p, 0), modelled.phase_bytes(p)) for p in modelled.phases}
    assert modelled.allocated_bytes == pytest.approx(tracker.peak_bytes, rel=TOLERANCE), table
    for phase, (measured, predicted) in table.items():
        assert predicted == pytest.approx(measured, rel=TOLERANCE), (phase, table)



@pytest.mark.parametrize("model,update,dtype,prefetch", [
    ("tiny-opt", "master", "fp32", 2),
    ("tiny-llama", "master", "fp32", 1),
    ("tiny-opt", "stochastic", "bf16", 2),
    ("tiny-llama", "stochastic", "bf16", 4),
    ("tiny-qwen3", "plain", "bf16", 2),
    ("tiny-qwen3", "master", "bf16", 3),
])
def test_the_model_is_what_a_rank_allocates(monkeypatch, model, update, dtype, prefetch):
    """Live tensors: the CPU kernels' own scratch is checked apart (kernel_peak_bytes)."""
    workload, layout = _workload(update, dtype), Layout(prefetch=prefetch)
    tracker = tracked_run(monkeypatch, model, workload, layout)
    _assert_phases_match(tracker, rank_memory(model=get_model(model), workload=workload,
                                              layout=layout, device_kind="cpu",
                                              kernel_scratch=False))


@pytest.mark.parametrize("model,update,dtype,estimator", [
    ("tiny-llama", "stochastic", "bf16", dict(estimator="lowrank", lowrank_rank=4)),
    ("tiny-opt", "master", "fp32", dict(estimator="lowrank", directions=2)),
    ("tiny-opt", "stochastic", "bf16", dict(estimator="sparse")),
    ("tiny-qwen3", "master", "fp32", dict(estimator="sparse")),
    ("tiny-llama", "master", "fp32", dict(directions=2)),
])
def test_the_estimators_are_what_a_rank_allocates(monkeypatch, model, update, dtype, estimator):
    """The estimators' draws (zoplan.memory.estimator_transient, the lowrank tile) and
    the streams of several directions, phase by phase."""
    base = _workload(update, dtype, batch=4)
    workload = dataclasses.replace(base, **estimator)
    layout = Layout(prefetch=2)
    tracker = tracked_run(monkeypatch, model, workload, layout)
    _assert_phases_match(tracker, rank_memory(model=get_model(model), workload=workload,
                                              layout=layout, device_kind="cpu",
                                              kernel_scratch=False))


@pytest.mark.parametrize("update,dtype", [("master", "fp32"), ("stochastic", "bf16"),
                                          ("master", "bf16")])
def test_resident_shards_are_what_a_rank_allocates(monkeypatch, update, dtype):
    """Resident blocks (plan placement "resident"): a shard of stride / slices elements
    of the stored dtype per block (fp32 masters: twice the 16-bit bytes), from set-up on,
    as zoexec's Trainer._allocate_shards makes them; nothing else changes."""
    workload, layout, resident = _workload(update, dtype), Layout(prefetch=2), (0, 1)
    tracker = tracked_run(monkeypatch, "tiny-opt", workload, layout, resident)
    modelled = rank_memory(model=get_model("tiny-opt"), workload=workload, layout=layout,
                           device_kind="cpu", kernel_scratch=False, resident_blocks=2)
    shards = next(t for t in modelled.held if t.key == "resident_shards")
    spec = get_model("tiny-opt")
    assert shards.bytes == 2 * store_stride(spec.block_params, slices=1, local_ranks=1) * (
        4 if update == "master" else 2)
    table = {p: (tracker.phase_peaks.get(p, 0), modelled.phase_bytes(p)) for p in modelled.phases}
    assert modelled.allocated_bytes == pytest.approx(tracker.peak_bytes, rel=TOLERANCE), table
    for phase, (measured, predicted) in table.items():
        assert predicted == pytest.approx(measured, rel=TOLERANCE), (phase, table)


@pytest.mark.parametrize("family", ["opt", "llama", "qwen3"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("shape", [
    # hidden, heads, head_dim, kv heads, ffn, vocab, batch, seq
    (128, 4, 32, 2, 384, 512, 2, 64),     # MLP-bound
    (256, 8, 64, 4, 256, 2048, 2, 32),    # attention-bound, head-bound
    (192, 4, 64, 1, 200, 96, 3, 32),      # 4 query heads per kv head, a small vocabulary
])
def test_block_and_head_formulas_are_what_the_forward_holds(family, dtype, shape):
    hidden, heads, head_dim, kv, ffn, vocab, batch, seq = shape
    config = _one_block(family, hidden, heads, head_dim, kv, ffn, vocab, seq)
    spec = spec_from_hf_config(config, name="one-block")
    parts, _ = build_parts(config, param_dtype=dtype, compute_dtype=dtype)
    ids = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        hidden_states, ctx = parts.embed(ids)
        with AllocationTracker() as block:
            out = parts.block_forward(hidden_states, ctx)
        with AllocationTracker() as head:
            parts.head_loss(out, ids)
    tokens = batch * seq
    assert spec.block_activation_bytes(tokens, seq, dtype) == pytest.approx(block.peak_bytes, rel=0.01)
    assert spec.head_activation_bytes(tokens, dtype) == pytest.approx(head.peak_bytes, rel=0.02)


def _one_block(family, hidden, heads, head_dim, kv, ffn, vocab, seq) -> dict:
    common = {"model_type": family, "num_hidden_layers": 1, "hidden_size": hidden,
              "num_attention_heads": heads, "vocab_size": vocab,
              "max_position_embeddings": max(seq, 64)}
    if family == "opt":
        return {**common, "ffn_dim": ffn, "word_embed_proj_dim": hidden,
                "do_layer_norm_before": True, "tie_word_embeddings": True}
    return {**common, "intermediate_size": ffn, "num_key_value_heads": kv, "head_dim": head_dim,
            "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": False}


@pytest.mark.parametrize("update", ["master", "stochastic", "plain"])
def test_the_cpu_kernels_scratch_is_what_the_model_says(update):
    """16-bit z meeting fp32 in an update: scratch inside the CPU kernels, which the
    tracker cannot see. The model's update phase with and without it differ by it."""
    spec, workload = get_model("tiny-llama"), _workload(update)
    n = spec.block_params
    theta = torch.ones(n, dtype=torch.float32 if update == "master" else torch.bfloat16)
    z, out = torch.ones(n, dtype=torch.bfloat16), torch.empty(n, dtype=torch.bfloat16)
    specs = [TensorSpec(name=str(i), shape=(size,), numel=size, offset=offset, decay=True)
             for i, (offset, size) in enumerate(_offsets(spec.block_tensor_numels()))]
    scratch = [torch.empty(max(spec.block_tensor_numels())) for _ in range(SR_SCRATCH)]

    def update_then_perturb():
        if update == "stochastic":
            apply_update_stochastic(theta, z, lr=1e-3, g=1.0, weight_decay=0.1, specs=specs,
                                    seed=1, block=0, scratch=scratch)
        else:
            apply_update(theta, z, lr=1e-3, g=1.0, weight_decay=0.1, decay_mask_or_specs=specs)
        perturb_into(out, theta, z, 1e-3)

    measured = kernel_peak_bytes(update_then_perturb)
    terms = kernel_scratch_terms(workload, "cpu", spec.block_tensor_numels(), n, "update")
    assert sum(t.bytes for t in terms) == pytest.approx(measured, abs=1024), (terms, measured)
    assert all(t.kernel for t in terms)
    assert not kernel_scratch_terms(workload, "cuda", spec.block_tensor_numels(), n, "update")
    shape = dict(model=spec, workload=workload, layout=Layout(), device_kind="cpu")
    without = rank_memory(**shape, kernel_scratch=False)
    assert not any(t.kernel for phase in without.transients.values() for t in phase)
    if update == "master":   # role "+-": the second perturbation between the forwards
        assert [t.bytes for t in rank_memory(**shape).transients["forward"]] == [measured]


def _offsets(numels: list[int]) -> list[tuple[int, int]]:
    starts = [sum(numels[:i]) for i in range(len(numels))]
    return list(zip(starts, numels))


def test_the_store_stride_splits_into_aligned_slices_and_shares():
    """zoplan.memory.store_stride is the store's layout (zoexec.store.node uses it): every
    slice and write-back share of a block starts on an ALIGN_ELEMENTS boundary."""
    assert LOST_UPDATE_SAMPLE == SAMPLE
    for numel in (1, 63, 64, 1000, 198_272, 10**7 + 3):
        for slices, local in ((1, 1), (2, 4), (4, 4), (3, 6), (8, 8)):
            stride = store_stride(numel, slices=slices, local_ranks=local)
            assert numel <= stride < numel + math.lcm(slices, local) * ALIGN_ELEMENTS
            for parts in (slices, local):
                assert stride % parts == 0 and (stride // parts) % ALIGN_ELEMENTS == 0


# ---- the tracker ------------------------------------------------------------------------
def test_the_tracker_counts_new_storages_until_they_die(tmp_path):
    path, before = tmp_path / "mapped", torch.ones(300)
    with AllocationTracker() as tracker:
        a = torch.zeros(1000)                     # 4000 bytes
        view = a[:10] * 1                         # a new 40-byte result
        alias = a[100:]                           # a view: nothing new
        a.add_(1)                                 # in place: nothing new
        before[:10].mul_(2)                       # a view of an older tensor: not counted
        mapped = torch.from_file(str(path), shared=True, size=500)   # excluded
        assert tracker.current_bytes == 4040
        del a
        assert tracker.current_bytes == 4040      # the view keeps the storage alive
        del alias, view
        assert tracker.current_bytes == 0
    assert tracker.peak_bytes == 4040 and mapped.numel() == 500


def test_the_tracker_adopts_what_set_up_moves():
    kept = torch.ones(256)
    with AllocationTracker(counting=False) as tracker:
        torch.ones(1000)
        tracker.start()
        tracker.adopt([kept, kept[:10]])
        assert tracker.current_bytes == 1024
        del kept
    assert tracker.current_bytes == 0 and tracker.peak_bytes == 1024


@pytest.mark.parametrize("estimator,dtype", [("lowrank", torch.float32), ("sparse", torch.float32),
                                             ("sparse", torch.bfloat16)])
def test_an_estimators_draw_allocates_what_the_model_says(estimator, dtype):
    """Directions.fill of a Llama-shaped block (hidden 512, ffn 1536) under the tracker:
    its temporaries are zoplan.memory.estimator_transient's (the lowrank tile is held,
    apart)."""
    model = dataclasses.replace(get_model("tiny-llama"), hidden=512, ffn=1536)
    shapes = model.block_tensor_shapes()
    specs = make_specs([(str(i), torch.empty(s, device="meta")) for i, s in enumerate(shapes)])
    est = EstimatorSpec(estimator=estimator, lowrank_rank=8 if estimator == "lowrank" else 2)
    workload = Workload(batch=2, seq=8, param_dtype="fp32" if dtype == torch.float32 else "bf16",
                        compute_dtype="fp32" if dtype == torch.float32 else "bf16",
                        **est.to_dict())
    theta = torch.randn(specs[-1].stop).to(dtype)
    out = torch.empty(specs[-1].stop, dtype=dtype)
    dirs = Directions(est, run_seed=0, device="cpu", shapes=shapes)
    with AllocationTracker() as tracker:
        dirs.fill(out, seed=1, step=0, block=0, specs=specs, theta=theta)
    want = _sum_bytes(estimator_transient(workload, shapes, "cpu"))
    assert want > 0 and tracker.peak_bytes == pytest.approx(want, rel=TOLERANCE)


def _sum_bytes(terms) -> int:
    return sum(t.bytes for t in terms)


# ---- the model's terms -------------------------------------------------------------------
def test_one_nccl_communicator_per_group_of_two_or_more():
    assert nccl_groups(Layout()) == []
    assert nccl_groups(Layout(ddp=2)) == [2]                 # the node group is the world
    assert nccl_groups(Layout(pertp=2, ddp=4, slices=4)) == [8, 4]
    assert nccl_groups(Layout(ddp=8, slices=8)) == [8]       # so is the slice group
    assert nccl_groups(Layout(ddp=16, nodes=2, slices=1)) == [16, 8]
    spec, workload = get_model("tiny-opt"), _workload("stochastic")
    gpu = rank_memory(model=spec, workload=workload, layout=Layout(ddp=2), device_kind="cuda")
    cpu = rank_memory(model=spec, workload=workload, layout=Layout(ddp=2), device_kind="cpu")
    assert [(t.key, t.bytes) for t in gpu.outside] == [("nccl", NCCL_COMM_BYTES_PAIR)]
    assert not cpu.outside and not rank_memory(model=spec, workload=workload, layout=Layout(),
                                                device_kind="cuda").outside
    assert "cublas_workspace" in {t.key for t in gpu.held} - {t.key for t in cpu.held}


def test_resident_parts_are_kept_in_the_stored_precision_once_and_twice_in_compute():
    spec, layout = get_model("llama-3-8b"), Layout(pertp=2, ddp=4, slices=4)
    for update, clean in (("master", 4), ("stochastic", 2)):
        mem = rank_memory(model=spec, workload=_workload(update), layout=layout, device_kind="cuda")
        held = {t.key: t.bytes for t in mem.held}
        r = spec.resident_params
        assert (held["resident_clean"], held["resident_work"], held["resident_z"]) == (r * clean, 2 * r, 2 * r)
        assert ("rounding_scratch" in held) == (update == "stochastic")


def test_the_head_costs_eight_bytes_per_token_and_vocabulary_entry():
    spec = get_model("llama-3-8b")
    tokens = 4 * 2048
    for dtype in ("bf16", "fp32"):
        assert spec.head_activation_bytes(tokens, dtype) == tokens * (8 * spec.vocab + 8)


def test_the_set_up_peak_can_be_the_peak():
    """A short sequence on a large vocabulary: the resident module's own copy, beside
    the resident parts' three flat copies, outweighs a step's activations."""
    spec, workload = get_model("llama-3-8b"), _workload("stochastic", batch=1, seq=128)
    mem = rank_memory(model=spec, workload=workload, layout=Layout(), device_kind="cuda")
    assert mem.peak_phase == "setup"
    assert {"module_resident", "resident_work"} <= {t.key for t in mem.peak_terms()}


def test_the_cpu_host_holds_every_ranks_device_bytes():
    spec, workload, layout = get_model("tiny-opt"), _workload("master", "fp32"), Layout(ddp=2)
    host = node_host_memory(model=spec, workload=workload, layout=layout, device_kind="cpu")
    rank = rank_memory(model=spec, workload=workload, layout=layout, device_kind="cpu")
    steady = {t.key: t.bytes for t in host.steady}
    assert steady["rank_buffers"] == 2 * rank.allocated_bytes
    assert steady["blocks"] == spec.num_layers * store_stride(spec.block_params, slices=1, local_ranks=2) * 4


# ---- who uses it ---------------------------------------------------------------------------
def test_the_planner_and_hand_plans_take_their_bytes_from_the_model():
    from pathlib import Path

    profile = load_profile(str(Path(__file__).resolve().parents[1] / "fixtures" / "node4-nvswitch.json"))
    spec, workload, layout = get_model("opt-1.3b"), _workload("stochastic", batch=8, seq=256), Layout(ddp=4, slices=4)
    estimate = estimate_memory(model=spec, profile=profile, workload=workload, layout=layout)
    rank = rank_memory(model=spec, workload=workload, layout=layout, device_kind="cuda")
    host = node_host_memory(model=spec, workload=workload, layout=layout, device_kind="cuda")
    assert estimate.gpu_bytes == rank.total_bytes and estimate.host_bytes == host.total_bytes
    plan = hand_plan(model=spec, layout=layout, workload=workload, device_kind="cuda")
    assert plan.data["predicted"]["gpu_mem_bytes"] == rank.total_bytes
    assert plan.data["predicted"]["host_mem_bytes"] == host.total_bytes


def _config(device_kind: str, layout: Layout = Layout(), resident: tuple = ()) -> RunConfig:
    """A plan whose stored predictions are zero: the checks must use zoplan.memory."""
    plan = hand_plan(model="tiny-opt", layout=layout, workload=_workload("stochastic"),
                     device_kind=device_kind, resident=resident)
    plan.data["predicted"].update(gpu_mem_bytes=0, host_mem_bytes=0)
    return RunConfig.make(plan=plan.data)


def _gpu(monkeypatch, free: int, total: int) -> None:
    """A faked CUDA device: (free, total) bytes as the driver would say."""
    monkeypatch.setattr("zoexec.launch.preflight.device_memory_free",
                        lambda kind, index: (free, total))


def test_preflight_checks_a_gpu_against_the_model_and_names_the_largest_term(monkeypatch):
    cfg = _config("cuda", Layout(ddp=2))
    need = rank_memory(model=get_model("tiny-opt"), workload=cfg.workload, layout=cfg.layout,
                       device_kind="cuda").total_bytes
    _gpu(monkeypatch, need, need + CUDA_CONTEXT_BYTES)
    check_gpu_memory(cfg, 0)
    _gpu(monkeypatch, need - 1, need + CUDA_CONTEXT_BYTES)
    with pytest.raises(ZoError, match=r"per GPU, GPU 0 has .* free of .* \(other processes .*"
                                      r"largest: NCCL buffers \(1 communicator, \[D\]\), "
                                      r"0\.5 GiB; peak in "):
        check_gpu_memory(cfg, 0)


def test_preflight_counts_the_cuda_context_against_the_gpu_total(monkeypatch):
    """A GPU whose total holds the plan but not the plan and the CUDA context is refused
    even when the driver's free figure (read after this rank's context) looks enough."""
    cfg = _config("cuda", Layout(ddp=2))
    need = rank_memory(model=get_model("tiny-opt"), workload=cfg.workload, layout=cfg.layout,
                       device_kind="cuda").total_bytes
    _gpu(monkeypatch, need + CUDA_CONTEXT_BYTES, need + CUDA_CONTEXT_BYTES - 1)
    with pytest.raises(ZoError, match=r"and the CUDA context about 0\.8 GiB, GPU 0 has"):
        check_gpu_memory(cfg, 0)


def test_preflight_counts_the_resident_shards(monkeypatch):
    """A plan with resident blocks needs their shards on the GPU: a device that holds the
    offloaded plan's bytes but not the shards is refused."""
    cfg = _config("cuda", Layout(ddp=2), resident=(0, 1))
    shape = dict(model=get_model("tiny-opt"), workload=cfg.workload, layout=cfg.layout,
                 device_kind="cuda")
    offloaded = rank_memory(**shape).total_bytes
    need = rank_memory(**shape, resident_blocks=2).total_bytes
    assert need > offloaded
    _gpu(monkeypatch, need - 1, 2 * need + CUDA_CONTEXT_BYTES)
    with pytest.raises(ZoError, match="per GPU"):
        check_gpu_memory(cfg, 0)
    _gpu(monkeypatch, need, need + CUDA_CONTEXT_BYTES)
    check_gpu_memory(cfg, 0)


def test_preflight_checks_the_host_against_the_model(monkeypatch):
    cfg = _config("cpu", Layout(ddp=2))
    host = node_host_memory(model=get_model("tiny-opt"), workload=cfg.workload,
                            layout=cfg.layout, device_kind="cpu")

    class Memory:
        available = host.total_bytes - 1

    monkeypatch.setattr("zoexec.launch.preflight.psutil.virtual_memory", lambda: Memory)
    with pytest.raises(ZoError, match=r"of host memory per node, .* is available \(largest: "
                                      r"2 x 0\.3 GiB rank processes"):
        _check_memory(cfg)
    Memory.available = host.total_bytes
    _check_memory(cfg)
