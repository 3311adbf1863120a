"""The estimators (lowrank, sparse, several directions a step) under every layout, on
the CPU with gloo: each one-rank run equals its plain definition
(zoexec.reference.estimator_reference_train, each direction written from its formula);
PertP, the update on the slice, slices, resident placements and DDP groups with their
own direction give the same losses and weights bit for bit (no layout here sums one
direction's loss over shards: DDP ranks own whole directions), in fp32, with 16-bit
stochastic updates and with LoRA; a resume from a snapshot replays the log (lowrank
across a redraw of V, sparse's masks, each direction's g) and ends where the run did.

A broken update shows: the wrong sign, a mask taken from other weights, the seed of
another step or V of another period in the deferred update (or in the slice's) makes
the run differ from the plain definition or from its twin layout (docs/estimators.md
lists the mutations this module was seen to fail on).
"""

from __future__ import annotations

import json
import shutil
import uuid

import pytest
import torch
from safetensors.torch import load_file

from zoexec.config import RunConfig
from zoexec.data.text import SyntheticTask
from zoexec.launch.spawn import run_in_process, spawn_local
from zoexec.maths.zo import apply_update, step_seed
from zoexec.model.export import export_weights
from zoexec.model.families import build_hf_model
from zoexec.model.lora import init_adapters, lora_spec
from zoexec.options import build_config
from zoexec.reference import estimator_reference_train, peft_lora_model, plain_direction
from zoexec.run.folder import RunDir
from zoexec.store.loading import build_parts
from zoplan.errors import ZoError
from zoplan.handplan import hand_plan
from zoplan.io import sha256_json
from zoplan.layout import Layout
from zoplan.workload import Workload

MODEL, SEED, STEPS, LR, EPS = "tiny-opt", 3, 3, 1e-3, 1e-3
ESTIMATORS = {
    "lowrank": dict(estimator="lowrank", lowrank_rank=2, lowrank_every=2),   # V redrawn at step 2
    "sparse": dict(estimator="sparse", sparse_share=0.3),
    "q2": dict(directions=2),
    "lowrank-q4": dict(estimator="lowrank", lowrank_rank=3, lowrank_every=2, directions=4),
}
KINDS = {
    "fp32": dict(param_dtype="fp32", compute_dtype="fp32"),
    "bf16": dict(param_dtype="bf16", compute_dtype="bf16", update="stochastic"),
    "lora": dict(param_dtype="fp32", compute_dtype="fp32", tuning="lora", lora_r=4),
}
SU = dict(slices=2, slice_update=True)
# name: (estimator, storage, layout, resident blocks, the run it equals bit for bit)
RUNS = {
    "lowrank": ("lowrank", "fp32", Layout(), (), None),
    "lowrank-pertp2-s2-su": ("lowrank", "fp32", Layout(pertp=2, prefetch=1, **SU), (1, 2), "lowrank"),
    "lowrank-bf16": ("lowrank", "bf16", Layout(), (), None),
    "lowrank-bf16-pertp2-s2-su": ("lowrank", "bf16", Layout(pertp=2, **SU), (0, 3), "lowrank-bf16"),
    "lowrank-lora": ("lowrank", "lora", Layout(), (), None),
    "lowrank-lora-pertp2-s2": ("lowrank", "lora", Layout(pertp=2, slices=2), (1,), "lowrank-lora"),
    "sparse": ("sparse", "fp32", Layout(), (), None),
    "sparse-pertp2-s2-su": ("sparse", "fp32", Layout(pertp=2, prefetch=1, **SU), (1, 2), "sparse"),
    "sparse-bf16": ("sparse", "bf16", Layout(), (), None),
    "sparse-bf16-pertp2-s2-su": ("sparse", "bf16", Layout(pertp=2, **SU), (0, 3), "sparse-bf16"),
    "sparse-lora": ("sparse", "lora", Layout(), (), None),
    "sparse-lora-pertp2-s2": ("sparse", "lora", Layout(pertp=2, slices=2), (1,), "sparse-lora"),
    "q2": ("q2", "fp32", Layout(), (), None),
    "q2-pertp2xddp2-s2-su": ("q2", "fp32", Layout(pertp=2, ddp=2, **SU), (2,), "q2"),
    "lowrank-q4": ("lowrank-q4", "fp32", Layout(), (), None),
    "lowrank-q4-ddp2-s2": ("lowrank-q4", "fp32", Layout(ddp=2, slices=2), (0,), "lowrank-q4"),
}
# Several directions over DDP groups that own them is no plain ddp2 run of its own (q2
# there): lowrank-q4-ddp2-s2 and q2-pertp2xddp2-s2-su split the directions over DDP
# groups, and lowrank-q4-ddp2-s2's resume replays each direction's g.
RESUMED = ("lowrank-pertp2-s2-su", "sparse-pertp2-s2-su", "lowrank-q4-ddp2-s2")   # snapshots every step


def _workload(name: str) -> Workload:
    estimator, kind = RUNS[name][:2]
    return Workload(batch=4, seq=16, **KINDS[kind], **ESTIMATORS[estimator])


def _config(tmp, name: str, **kw) -> RunConfig:
    _, _, layout, resident, _ = RUNS[name]
    plan = hand_plan(model=MODEL, layout=layout, workload=_workload(name), resident=resident)
    eps = 1e-2 if RUNS[name][1] == "lora" else EPS
    return RunConfig.make(plan=plan.data, plan_path=f"{name}.json", steps=STEPS, seed=SEED, lr=LR,
                          eps=eps, threads=1, quiet=True, out=str(tmp / name / "out"),
                          run_id=f"t{uuid.uuid4().hex[:10]}", **kw)


def _losses(out) -> list[dict]:
    return [json.loads(line) for line in (out / "losses.jsonl").read_text().splitlines()]


def _weights(final) -> dict:
    name = "adapter_model.safetensors" if (final / "adapter_model.safetensors").exists() \
        else "model.safetensors"
    return load_file(str(final / name))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("estimators")
    out = {}
    for name, (_, _, layout, _, _) in RUNS.items():
        cfg = _config(tmp, name, **({"save_steps": 1} if name in RESUMED else {}))
        (run_in_process if layout.world_size == 1 else spawn_local)(cfg)
        folder = tmp / name / "out"
        out[name] = {"cfg": cfg, "out": folder, "losses": _losses(folder),
                     "weights": _weights(folder / "final")}
    return out


def _assert_same(got: dict, ref: dict) -> None:
    keys = ("step", "seed", "loss_plus", "loss_minus", "g", "gs")
    assert [[r.get(k) for k in keys] for r in got["losses"]] == \
        [[r.get(k) for k in keys] for r in ref["losses"]]
    assert got["weights"].keys() == ref["weights"].keys()
    for key, tensor in ref["weights"].items():
        assert torch.equal(got["weights"][key], tensor), key


@pytest.mark.parametrize("name", [n for n, v in RUNS.items() if v[4]])
def test_every_layout_runs_the_same_estimator(runs, name):
    _assert_same(runs[name], runs[RUNS[name][4]])


@pytest.mark.parametrize("name", ["lowrank", "sparse", "q2", "lowrank-q4"])
def test_one_rank_equals_the_plain_definition(runs, name, tmp_path):
    """estimator_reference_train (fp32, one thread like the ranks): the same losses,
    g's and weights."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        parts, flats = build_parts(MODEL, seed=SEED)
        task = SyntheticTask(vocab=parts.config.vocab_size, seed=SEED)
        history = estimator_reference_train(
            parts, flats, lambda s: task.batch(s, 4, 16), seed=SEED, lr=LR, eps=EPS,
            weight_decay=0.0, steps=STEPS, estimator=_workload(name).estimator_spec)
    finally:
        torch.set_num_threads(threads)
    export_weights(parts, flats, tmp_path)
    got = runs[name]["losses"]
    assert [(r["loss_plus"], r["loss_minus"], tuple(r.get("gs") or [r["g"]])) for r in got] \
        == history
    want = load_file(str(tmp_path / "model.safetensors"))
    for key, tensor in want.items():
        torch.testing.assert_close(runs[name]["weights"][key], tensor, rtol=0, atol=1e-7)


@pytest.mark.parametrize("name", ["lowrank-lora", "sparse-lora"])
def test_lora_adapters_move_along_the_logged_directions(runs, name):
    """LoRA written plainly: the peft-wrapped HF model (zoexec.reference.peft_lora_model)
    with the adapters of each step perturbed +-eps along its plain direction (sparse:
    the mask of the adapters as they are) gives the logged losses, and the logged
    update along the same direction gives the next step's adapters, and at the end the
    saved ones."""
    wl = _workload(name)
    est, eps = wl.estimator_spec, 1e-2
    model = build_hf_model(MODEL, seed=SEED)
    task = SyntheticTask(vocab=model.config.vocab_size, seed=SEED)
    wrapped, addresses = peft_lora_model(model, seed=SEED, r=wl.lora_r, alpha=wl.lora_alpha,
                                         targets=wl.lora_targets)
    spec = lora_spec(build_parts(MODEL, seed=SEED)[0].block, r=wl.lora_r, alpha=wl.lora_alpha,
                     targets=wl.lora_targets)
    thetas = [init_adapters(spec, seed=SEED, block=b, out=torch.empty(spec.numel))
              for b in range(4)]

    def loss(ds, scale) -> float:
        with torch.no_grad():
            for param, block, index in addresses:
                t = spec.specs[index]
                param.copy_((thetas[block] + scale * ds[block])[t.offset:t.stop].view(t.shape))
            ids = task.batch(r["step"] - 1, 4, 16)   # the log counts steps from 1
            return float(wrapped(input_ids=ids, labels=ids).loss)
    for r in runs[name]["losses"]:
        ds = [plain_direction(est, run_seed=SEED, seed=r["seed"], step=r["step"] - 1, block=b,
                              specs=spec.specs, theta=thetas[b]) for b in range(4)]
        assert (r["loss_plus"], r["loss_minus"]) == pytest.approx((loss(ds, eps), loss(ds, -eps)),
                                                                  rel=1e-6), r["step"]
        for theta, d in zip(thetas, ds, strict=True):
            apply_update(theta, d, lr=r["lr"], g=r["g"], weight_decay=0.0,
                         decay_mask_or_specs=spec.specs)
    saved = runs[name]["weights"]
    for block, theta in enumerate(thetas):
        for t in spec.specs:
            key = next(k for k in saved if k.endswith(f"layers.{block}.{t.name}"))
            torch.testing.assert_close(saved[key], theta[t.offset:t.stop].view(t.shape),
                                       rtol=0, atol=1e-7)


def test_the_estimators_differ_from_mezo_and_from_each_other(runs):
    """The settings reach the maths: the same seeds give other losses."""
    first = {name: runs[name]["losses"][0]["loss_plus"] for name in ("lowrank", "sparse", "q2")}
    assert len(set(first.values())) == 3, first


@pytest.mark.parametrize("name", RESUMED)
def test_a_resume_from_a_snapshot_ends_with_the_same_weights(runs, name, tmp_path):
    """Resumed from the snapshot after step 1, step 2's update replayed from the log
    (lowrank: V of period 0; step 3 draws period 1's), then step 3."""
    run = runs[name]
    folder = tmp_path / "resumed"
    shutil.copytree(run["out"], folder)
    shutil.rmtree(folder / "final")
    snapshots = sorted((folder / "snapshots").iterdir())
    shutil.rmtree(snapshots[-1])
    log = folder / "losses.jsonl"
    log.write_text("".join(log.read_text().splitlines(keepends=True)[:2]))
    start = RunDir(folder).resume_plan(plan_sha256=sha256_json(run["cfg"].plan), given={})
    cfg = run["cfg"].replaced(load_from=start.init, start_step=start.start_step,
                              replay=start.replay, resumed=True, out=str(folder),
                              run_id=f"t{uuid.uuid4().hex[:10]}")
    assert cfg.start_step == 2 and [u.step for u in cfg.replay] == [1]
    spawn_local(cfg)
    _assert_same({"losses": _losses(folder), "weights": _weights(folder / "final")}, run)


def test_run_json_records_the_estimator_and_a_given_one_must_be_the_plans(runs, tmp_path):
    ident = json.loads((runs["lowrank-pertp2-s2-su"]["out"] / "run.json").read_text())
    assert ident["estimator"] == {"estimator": "lowrank", "lowrank_rank": 2, "lowrank_every": 2,
                                  "directions": 1}
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(runs["lowrank"]["cfg"].plan))
    assert build_config(plan=plan, estimator="lowrank", lowrank_rank=2).zo.estimator \
        == "lowrank"
    with pytest.raises(ZoError, match=r"--estimator sparse: must be lowrank, the plan's"):
        build_config(plan=plan, estimator="sparse")
    with pytest.raises(ZoError, match=r"--sparse-share 0.5: must be left out: the plan's "
                                      r"estimator is lowrank"):
        build_config(plan=plan, sparse_share=0.5)


def test_a_log_line_without_its_directions_gs_is_refused(runs, tmp_path):
    run = runs["lowrank-q4-ddp2-s2"]
    folder = tmp_path / "altered"
    shutil.copytree(run["out"], folder)
    lines = (folder / "losses.jsonl").read_text().splitlines()
    line = json.loads(lines[1])
    del line["gs"]
    lines[1] = json.dumps(line)
    (folder / "losses.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ZoError, match=r"losses.jsonl:2: step 2 has 0 directions' g \(gs\), "
                                      r"but the run's estimator takes 4"):
        RunDir(folder).resume_plan(plan_sha256=sha256_json(run["cfg"].plan), given={})
    assert step_seed(SEED, 1) == line["seed"]
