"""zoexec on the CPU with gloo: every layout computes the same maths as the in-process
ZO2 oracle (zoexec.reference.zo2_reference_train), the node's blocks are stored once
in shared memory, traces have the plan's task structure, nothing leaks in /dev/shm,
and training lowers the loss. Placements (plan blocks resident on their slice group as
shards, some or all) and the update on the slice (Layout.slice_update) change neither
losses nor weights, in fp32 and with 16-bit stochastic updates, and a mixed run resumed
from a snapshot ends where an uninterrupted one does.

All layouts run in one module-scoped fixture: ranks are forked from one forkserver that
imported torch and transformers once, so a layout costs a fork, a tiny model and 3 steps.

Tolerances: layouts without DDP run the same ops on the same rows in the same order as
one rank, so losses and weights are bit-identical. With DDP each shard's loss is a mean
over fewer tokens and the pair is averaged over shards: the loss differs by float32
summation order (~1e-7 relative); g = (l+ - l-) / 2eps amplifies that by 1/(2 eps) = 500,
so g agrees to ~1e-3 and the weights to lr * |dg| * |z| ~ 1e-5 after 3 steps.
"""

from __future__ import annotations

import glob
import json
import shutil
import uuid

import pytest
import torch
from safetensors.torch import load_file

from zoexec.config import RunConfig
from zoexec.data.text import SyntheticTask
from zoexec.launch.spawn import RankFailure, run_in_process, spawn_local
from zoexec.maths import zo
from zoexec.model.export import export_weights
from zoexec.reference import zo2_reference_train
from zoexec.run.folder import RunDir
from zoexec.store.blocks import SHM_DIR
from zoexec.store.loading import build_parts
from zoplan.handplan import hand_plan
from zoplan.io import sha256_json
from zoplan.layout import Layout
from zoplan.trace import read_trace
from zoplan.workload import Workload

MODEL, SEED, STEPS, LR, EPS = "tiny-opt", 3, 3, 1e-3, 1e-3
WORKLOAD = Workload(batch=4, seq=16, param_dtype="fp32", compute_dtype="fp32")
LOSS_RTOL, G_ATOL, W_ATOL = 1e-5, 5e-3, 5e-5
LAYOUTS = {
    "zo2": Layout(),
    "pertp2": Layout(pertp=2),
    "pertp2-s2": Layout(pertp=2, slices=2, prefetch=1),
    "ddp2": Layout(ddp=2, prefetch=3),
    "ddp2-s2": Layout(ddp=2, slices=2),
    "pertp2xddp2-s2": Layout(pertp=2, ddp=2, slices=2),
    "pertp2xddp2-s4": Layout(pertp=2, ddp=2, slices=4, prefetch=1),
}
# PertP 2 x DDP 2 without slices is no run of its own (4 ranks on a 2-core CI): its
# PertP and DDP groups are those of pertp2xddp2-s2 and -s4, the unsliced block path is
# pertp2's and ddp2's.


def _config(tmp, name, layout, *, workload=WORKLOAD, resident=(), **kw) -> RunConfig:
    plan = hand_plan(model=MODEL, layout=layout, workload=workload, resident=resident)
    return RunConfig.make(plan=plan.data, plan_path=f"{name}.json", steps=STEPS, seed=SEED, lr=LR,
                     eps=EPS, threads=1, quiet=True, out=str(tmp / name / "out"),
                     trace=str(tmp / name / "trace"), run_id=f"t{uuid.uuid4().hex[:10]}", **kw)


def _leftovers(run_id: str) -> list[str]:
    return glob.glob(f"{SHM_DIR}/zoexec-{run_id}*")


def _losses(out) -> list[dict]:
    return [json.loads(line) for line in (out / "losses.jsonl").read_text().splitlines()]


INIT_FROM_DIR = "ddp2-s2"     # this layout loads the same initial weights with --model-path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("layouts")
    parts, flats = build_parts(MODEL, seed=SEED)
    export_weights(parts, flats, tmp / "init")
    out = {}
    for name, layout in LAYOUTS.items():
        cfg = _config(tmp, name, layout, model_path=str(tmp / "init") if name == INIT_FROM_DIR else None)
        spawn_local(cfg)
        out[name] = {"cfg": cfg, "leftovers": _leftovers(cfg.run_id),
                     "losses": _losses(tmp / name / "out"),
                     "weights": load_file(str(tmp / name / "out" / "final" / "model.safetensors")),
                     "trace": read_trace(tmp / name / "trace")}
    return out


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    """zo2_reference_train in this process: (history, exported weights, initial weights),
    on one thread like the ranks (a matmul's summation order may depend on threads)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _oracle(tmp_path_factory)
    finally:
        torch.set_num_threads(threads)


def _oracle(tmp_path_factory):
    parts, flats = build_parts(MODEL, seed=SEED)
    initial = [f.clone() for f in flats]
    task = SyntheticTask(vocab=parts.config.vocab_size, seed=SEED)
    history = zo2_reference_train(parts, flats, lambda s: task.batch(s, WORKLOAD.batch, WORKLOAD.seq),
                                  seed=SEED, lr=LR, eps=EPS, weight_decay=0.0, steps=STEPS)
    out = tmp_path_factory.mktemp("oracle")
    export_weights(parts, flats, out)
    fc1 = next(s for s in parts.block_specs if s.name == "fc1.weight")
    before = [f[fc1.offset:fc1.stop].view(fc1.shape) for f in initial]
    return history, load_file(str(out / "model.safetensors")), before


def test_one_rank_equals_the_in_process_oracle(runs, oracle):
    history, weights, fc1_before = oracle
    losses = runs["zo2"]["losses"]
    assert [(r["loss_plus"], r["loss_minus"], r["g"]) for r in losses] == list(history)
    got = runs["zo2"]["weights"]
    assert got.keys() == weights.keys()
    for key in weights:
        assert torch.equal(got[key], weights[key]), key
    # the updates (and the final flush) did change every block's weights
    for b, before in enumerate(fc1_before):
        moved = (got[f"model.decoder.layers.{b}.fc1.weight"] - before).abs().max()
        assert moved > 1e-4, f"block {b}'s fc1 did not move"


@pytest.mark.parametrize("name", [n for n in LAYOUTS if n != "zo2"])
def test_layout_gives_the_same_losses_and_weights(runs, name):
    ref, got = runs["zo2"], runs[name]
    exact = LAYOUTS[name].ddp == 1
    for a, b in zip(ref["losses"], got["losses"], strict=True):
        assert a["seed"] == b["seed"] and a["step"] == b["step"]
        for key in ("loss_plus", "loss_minus"):
            assert b[key] == pytest.approx(a[key], rel=0 if exact else LOSS_RTOL), (key, a, b)
        assert b["g"] == pytest.approx(a["g"], abs=0 if exact else G_ATOL)
    for key, tensor in ref["weights"].items():
        if exact:
            assert torch.equal(got["weights"][key], tensor), key
        else:
            torch.testing.assert_close(got["weights"][key], tensor, rtol=0, atol=W_ATOL)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_trace_has_the_plans_task_structure(runs, name):
    meta, spans = runs[name]["trace"]
    lay, blocks = LAYOUTS[name], 4
    assert meta["steps"] == STEPS and meta["world_size"] == lay.world_size
    assert len(meta["plan_sha256"]) == 64
    per_block = 4 + (lay.slices > 1)
    assert len(spans) == STEPS * lay.world_size * (3 + per_block * blocks)
    keys = {(s.kind, s.rank, s.block, s.step) for s in spans}
    assert len(keys) == len(spans)
    assert ("allgather", lay.world_size - 1, blocks - 1, STEPS - 1) in keys or lay.slices == 1
    for rank in range(lay.world_size):          # CPU: one task at a time, in plan order
        mine = sorted((s for s in spans if s.rank == rank), key=lambda s: s.start_s)
        assert all(a.end_s <= b.start_s + 1e-6 for a, b in zip(mine, mine[1:]))
        assert [s.kind for s in mine[:3]] == ["embed", "h2d", "allgather" if lay.slices > 1 else "update"]


def _fence_violations(spans, lay) -> list:
    """(step, block, rank) where a rank's d2h started before some rank of its node
    had finished its h2d of that block (one host: the spans share CLOCK_MONOTONIC)."""
    h2d_end = {(s.step, s.block, s.rank): s.end_s for s in spans if s.kind == "h2d"}
    bad = []
    for s in (s for s in spans if s.kind == "d2h"):
        first = s.rank - s.rank % lay.local_ranks
        peers = range(first, first + lay.local_ranks)
        if any(h2d_end[(s.step, s.block, r)] > s.start_s for r in peers):
            bad.append((s.step, s.block, s.rank))
    return bad


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_write_back_waits_for_every_local_read(runs, name):
    assert _fence_violations(runs[name]["trace"][1], LAYOUTS[name]) == []


def test_a_delayed_read_holds_back_the_other_ranks_write_back(runs, tmp_path):
    """pertp2 (2 local ranks, slices 1: the CPU read-stamp fence) with rank 1 sleeping
    before each h2d of block 1: rank 0 must not write block 1 back before rank 1 read
    it, and the run computes exactly what the undelayed one did."""
    cfg = _config(tmp_path, "delay", LAYOUTS["pertp2"], delay_h2d=(1, 1, 0.2))
    spawn_local(cfg)
    meta, spans = read_trace(tmp_path / "delay" / "trace")
    assert _fence_violations(spans, LAYOUTS["pertp2"]) == []
    losses = _losses(tmp_path / "delay" / "out")
    keys = ("step", "seed", "loss_plus", "loss_minus", "g")
    assert [[r[k] for k in keys] for r in losses] == [[r[k] for k in keys]
                                                      for r in runs["pertp2"]["losses"]]
    weights = load_file(str(tmp_path / "delay" / "out" / "final" / "model.safetensors"))
    for key, tensor in runs["pertp2"]["weights"].items():
        assert torch.equal(weights[key], tensor), key
    assert _leftovers(cfg.run_id) == []


def test_store_is_shared_once_per_node_and_removed(runs):
    for name, run in runs.items():
        assert run["leftovers"] == [], name
        memory = run["trace"][0]["host_memory"]
        assert len({m["store_inode"] for m in memory}) == 1, name   # one file per node
        assert len({m["pid"] for m in memory}) == len(memory)
        store = memory[0]["store_bytes"]
        total_pss = sum(m["store_pss"] for m in memory)
        # ranks map the store (a sliced rank touches only its slice); pages exist once,
        # so the ranks' PSS of the mapping adds up to one copy of the blocks
        assert all(0 < m["store_rss"] <= store + 2**16 for m in memory), name
        assert 0.9 * store <= total_pss <= 1.1 * store, (name, total_pss, store)


def test_a_failing_rank_stops_the_others_with_its_reason(tmp_path):
    cfg = _config(tmp_path, "fail", LAYOUTS["pertp2-s2"], fail_at=(1, 1))
    with pytest.raises(RankFailure, match=r"^rank 1 failed: RuntimeError: injected fault at step 1"):
        spawn_local(cfg)
    assert _leftovers(cfg.run_id) == []
    # the log keeps the step that completed before the fault, and no final weights exist
    log = (tmp_path / "fail" / "out" / "losses.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in log] == [1]
    assert not (tmp_path / "fail" / "out" / "final").exists()


def test_training_the_synthetic_task_lowers_the_loss():
    """200 steps on tiny-opt: ln(512) = 6.24 at the start; MeZO brings it to ~4.9. A sign
    error in the update would raise it, a missing update leave it at ~6.2."""
    plan = hand_plan(model=MODEL, layout=Layout(),
                     workload=Workload(batch=8, seq=32, param_dtype="fp32", compute_dtype="fp32"))
    records = run_in_process(RunConfig.make(plan=plan.data, steps=200, seed=0, lr=2e-3, eps=EPS,
                                       threads=1, quiet=True))
    first = sum(r.loss for r in records[:10]) / 10
    last = sum(r.loss for r in records[-20:]) / 20
    assert first > 6.0 and last < first - 0.8, (first, last)


# ---- placements and the update on the slice ----------------------------------------------
BF16 = Workload(batch=4, seq=16, param_dtype="bf16", compute_dtype="bf16", update="stochastic")
SU = dict(slices=2, slice_update=True)
# name: (layout, resident blocks, workload, the offloaded run it must equal bit for bit)
PLACEMENTS = {
    "mixed-pertp2": (Layout(pertp=2), (0, 2), WORKLOAD, "pertp2"),
    "resident-pertp2-s2": (Layout(pertp=2, slices=2, prefetch=1), (0, 1, 2, 3), WORKLOAD,
                           "pertp2-s2"),
    "mixed-pertp2-s2-su": (Layout(pertp=2, **SU), (1, 2), WORKLOAD, "pertp2-s2"),
    "mixed-pertp2xddp2-s2-su": (Layout(pertp=2, ddp=2, **SU), (0, 3), WORKLOAD, "pertp2xddp2-s2"),
    "bf16": (Layout(), (), BF16, None),
    "bf16-mixed-pertp2-s2-su": (Layout(pertp=2, **SU), (1, 2), BF16, "bf16"),
}
# A run with every block offloaded and the update on the slice is no run of its own:
# mixed-pertp2-s2-su offloads blocks 0 and 3 and keeps 1 and 2 resident, both with the
# slice update, and equals pertp2-s2 bit for bit.
RESUMED = "mixed-pertp2-s2-su"   # snapshots every step; resumed from the first one


@pytest.fixture(scope="module")
def placed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("placements")
    rng = torch.Generator().manual_seed(SEED)
    rows = [torch.randint(0, 500, (int(n),), generator=rng).tolist()
            for n in torch.randint(5, 16, (6,), generator=rng)]
    (tmp / "eval.jsonl").write_text("".join(json.dumps({"input_ids": r}) + "\n" for r in rows))
    out = {}
    for name, (layout, resident, workload, _) in PLACEMENTS.items():
        evaluated = dict(eval_data=str(tmp / "eval.jsonl"), eval_every=2) if workload is WORKLOAD else {}
        cfg = _config(tmp, name, layout, workload=workload, resident=resident,
                      **({'save_steps': 1} if name == RESUMED else {}), **evaluated)
        (run_in_process if layout.world_size == 1 else spawn_local)(cfg)
        out[name] = {"cfg": cfg, "leftovers": _leftovers(cfg.run_id),
                     "out": tmp / name / "out", "losses": _losses(tmp / name / "out"),
                     "weights": load_file(str(tmp / name / "out" / "final" / "model.safetensors")),
                     "trace": read_trace(tmp / name / "trace")}
    return out


def _assert_same_run(got: dict, ref: dict, *, exact: bool) -> None:
    keys = ("step", "seed", "loss_plus", "loss_minus", "g")
    if exact:
        assert [[r[k] for k in keys] for r in got["losses"]] == [[r[k] for k in keys]
                                                                 for r in ref["losses"]]
    else:
        for a, b in zip(ref["losses"], got["losses"], strict=True):
            assert b["loss_plus"] == pytest.approx(a["loss_plus"], rel=LOSS_RTOL), (a, b)
            assert b["g"] == pytest.approx(a["g"], abs=G_ATOL), (a, b)
    assert got["weights"].keys() == ref["weights"].keys()
    for key, tensor in ref["weights"].items():
        if exact:
            assert torch.equal(got["weights"][key], tensor), key
        else:
            torch.testing.assert_close(got["weights"][key], tensor, rtol=0, atol=W_ATOL)


@pytest.mark.parametrize("name", [n for n, v in PLACEMENTS.items() if v[3]])
def test_placement_and_slice_update_give_the_same_losses_and_weights(runs, placed, name):
    """Bit for bit the offloaded run of the same axes (same reductions), and the one-rank
    reference (bit for bit without DDP, as the layouts above)."""
    layout, _, workload, twin = PLACEMENTS[name]
    ref = (placed if twin in placed else runs)[twin]
    _assert_same_run(placed[name], ref, exact=True)
    one_rank = placed["bf16"] if workload is BF16 else runs["zo2"]
    _assert_same_run(placed[name], one_rank, exact=layout.ddp == 1)
    assert placed[name]["leftovers"] == []


def test_evaluation_is_the_same_under_every_placement(placed):
    """Trainer.evaluate mid-run (after step 1: the pending update flushed first) and at
    the end, through resident shards, slice updates and offloaded blocks alike."""
    scores = {name: [json.loads(line) for line in
                     (run["out"] / "metrics.jsonl").read_text().splitlines() if "eval_loss" in line]
              for name, run in placed.items() if PLACEMENTS[name][2] is WORKLOAD}
    first = scores["mixed-pertp2-s2-su"]
    assert [r["step"] for r in first] == [2, 3], first
    for name, got in scores.items():   # DDP: its weights differ by summation order
        losses, want = [r["eval_loss"] for r in got], [r["eval_loss"] for r in first]
        assert [r["step"] for r in got] == [2, 3], (name, got)
        if PLACEMENTS[name][0].ddp == 1:
            assert losses == want, name
        else:
            assert losses == pytest.approx(want, rel=LOSS_RTOL), name


def test_16_bit_stochastic_updates_move_the_weights_by_the_logged_steps(placed):
    """The bf16 run's blocks moved from their initial weights by what its log says:
    theta_T - theta_0 = -lr sum_t g_t z_t (z regenerated from each logged seed), up to
    the stochastic rounding's noise (unbiased, about an ulp a step). A sign error, a
    lost step or a z of the wrong seed is far from it; the noise is small beside it."""
    run = placed["bf16"]
    parts, initial = build_parts(MODEL, seed=SEED, param_dtype="bf16", compute_dtype="bf16")
    got, want = [], []
    for b, theta in enumerate(initial):
        expected = torch.zeros(parts.block_numel, dtype=torch.float64)
        for record in run["losses"]:
            z = zo.z_block(record["seed"], b, parts.block_specs).double()
            expected[:z.numel()] -= LR * record["g"] * z
        for spec in parts.block_specs:
            final = run["weights"][f"model.decoder.layers.{b}.{spec.name}"].double().flatten()
            got.append(final - theta[spec.offset:spec.stop].double())
            want.append(expected[spec.offset:spec.stop])
    got, want = torch.cat(got), torch.cat(want)
    cosine = float(got @ want / (got.norm() * want.norm()))
    error = float((got - want).norm() / want.norm())
    assert cosine > 0.9 and error < 0.5, (cosine, error)


def _expected_kinds(layout: Layout, resident: tuple, blocks: int) -> dict:
    """(kind, block) -> count of one rank's tasks in one step (zoplan.sim.graph's order)."""
    kinds = {("embed", -1): 1, ("head", -1): 1, ("allreduce", -1): 1}
    for b in range(blocks):
        names = [] if b in resident else ["h2d"]
        names += ["slice_update"] if layout.slice_update and layout.slices > 1 else []
        names += ["allgather"] if layout.slices > 1 else []
        names += ["update", "forward"] + ([] if b in resident else ["d2h"])
        kinds.update({(k, b): 1 for k in names})
    return kinds


@pytest.mark.parametrize("name", list(PLACEMENTS))
def test_placement_traces_have_the_plans_tasks(placed, name):
    """Resident blocks have no h2d or d2h; with slice_update every block has its slice
    update before the all-gather; each rank's tasks run in the planner's order."""
    layout, resident, _, _ = PLACEMENTS[name]
    meta, spans = placed[name]["trace"]
    expect = _expected_kinds(layout, resident, 4)
    for rank in range(layout.world_size):
        for step in range(STEPS):
            mine = sorted((s for s in spans if s.rank == rank and s.step == step),
                          key=lambda s: s.start_s)
            got = {}
            for s in mine:
                got[(s.kind, s.block)] = got.get((s.kind, s.block), 0) + 1
            assert got == expect, (rank, step)
            order = [(s.kind, s.block) for s in mine]
            if layout.slice_update and layout.slices > 1:
                assert all(order.index(("slice_update", b)) < order.index(("allgather", b))
                           for b in range(4))
    assert _fence_violations([s for s in spans if s.kind in ("h2d", "d2h")], layout) == []


def test_a_mixed_run_resumed_from_a_snapshot_ends_with_the_same_weights(placed, tmp_path):
    """The run of RESUMED (snapshots after steps 1 and 2) resumed from step 1's snapshot
    with step 2's update replayed from the log: the resident shards are in the snapshot,
    loaded into the shards and updated by the replay."""
    run = placed[RESUMED]
    folder = tmp_path / "resumed"
    shutil.copytree(run["out"], folder)
    shutil.rmtree(folder / "final")
    snapshots = sorted((folder / "snapshots").iterdir())
    assert [p.name for p in snapshots] == ["checkpoint-1", "checkpoint-2"], snapshots
    shutil.rmtree(snapshots[-1])
    log = folder / "losses.jsonl"
    log.write_text("".join(log.read_text().splitlines(keepends=True)[:2]))
    start = RunDir(folder).resume_plan(plan_sha256=sha256_json(run["cfg"].plan), given={})
    cfg = run["cfg"].replaced(load_from=start.init, start_step=start.start_step,
                              replay=start.replay, resumed=True, out=str(folder), trace=None,
                              run_id=f"t{uuid.uuid4().hex[:10]}")
    assert cfg.start_step == 2 and len(cfg.replay) == 1 and cfg.weights.endswith("checkpoint-1")
    spawn_local(cfg)
    weights = load_file(str(folder / "final" / "model.safetensors"))
    for key, tensor in run["weights"].items():
        assert torch.equal(weights[key], tensor), key
