"""LoRA runs on the CPU with gloo: every layout and placement trains the same adapters
(bit for bit without DDP; DDP to its summation-order tolerance, as
test_zoexec_layouts.py explains), equal to the peft-wrapped plain MeZO loop
(zoexec.reference.lora_reference_train) to float tolerance; nothing is written back
(no d2h span); final/ is a PEFT adapter folder that PeftModel.from_pretrained loads and
generates with, `zoexec export --merge` merges; a resume replays the log over the
adapters and ends where an uninterrupted run does."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from zoexec.cli import app
from zoexec.data.text import SyntheticTask
from zoexec.model.export import export_weights
from zoexec.model.families import build_hf_model
from zoexec.options import build_config
from zoexec.reference import lora_reference_train
from zoexec.store.loading import build_parts
from zoplan.errors import ZoError
from zoplan.handplan import hand_plan
from zoplan.layout import Layout
from zoplan.workload import Workload

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from frozen_base import killed_and_resumed, layout_runs  # noqa: E402

MODEL, SEED, STEPS, LR, EPS = "tiny-opt", 3, 3, 1e-3, 1e-2
WORKLOAD = Workload(batch=4, seq=16, param_dtype="fp32", compute_dtype="fp32", tuning="lora")
LOSS_RTOL, G_ATOL, A_ATOL = 1e-5, 5e-3, 5e-6
LAYOUTS = {   # name: (layout, resident blocks)
    "one": (Layout(), ()),
    "pertp2": (Layout(pertp=2), ()),
    "ddp2": (Layout(ddp=2, prefetch=3), ()),
    "pertp2xddp2": (Layout(pertp=2, ddp=2), ()),
    "one-resident": (Layout(), (0, 2)),
    "pertp2-s2-resident": (Layout(pertp=2, slices=2, prefetch=1), (1, 2, 3)),
}


SETTINGS = dict(model=MODEL, workload=WORKLOAD, steps=STEPS, seed=SEED, lr=LR, eps=EPS)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return layout_runs(tmp_path_factory.mktemp("lora"), LAYOUTS, **SETTINGS)


@pytest.mark.parametrize("name", [n for n in LAYOUTS if n != "one"])
def test_every_layout_trains_the_same_adapters(runs, name):
    ref, got = runs["one"], runs[name]
    exact = LAYOUTS[name][0].ddp == 1
    for a, b in zip(ref["losses"], got["losses"], strict=True):
        for key in ("loss_plus", "loss_minus"):
            assert b[key] == pytest.approx(a[key], rel=0 if exact else LOSS_RTOL), (key, a, b)
        assert b["g"] == pytest.approx(a["g"], abs=0 if exact else G_ATOL)
    assert got["weights"].keys() == ref["weights"].keys()
    for key, tensor in ref["weights"].items():
        if exact:
            assert torch.equal(got["weights"][key], tensor), key
        else:
            torch.testing.assert_close(got["weights"][key], tensor, rtol=0, atol=A_ATOL)


def test_one_rank_equals_the_peft_reference_loop(runs):
    from peft import get_peft_model_state_dict

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = build_hf_model(MODEL, seed=SEED)
        task = SyntheticTask(vocab=model.config.vocab_size, seed=SEED)
        wrapped, history = lora_reference_train(
            model, lambda s: task.batch(s, WORKLOAD.batch, WORKLOAD.seq), seed=SEED, lr=LR,
            eps=EPS, weight_decay=0.0, steps=STEPS, r=8, alpha=16, targets=("q_proj", "v_proj"))
    finally:
        torch.set_num_threads(threads)
    for (lp, lm, g), rec in zip(history, runs["one"]["losses"], strict=True):
        assert rec["loss_plus"] == pytest.approx(lp, rel=1e-6)
        assert rec["loss_minus"] == pytest.approx(lm, rel=1e-6)
        assert rec["g"] == pytest.approx(g, rel=1e-3, abs=1e-3)
    want = get_peft_model_state_dict(wrapped)
    got = runs["one"]["weights"]
    assert got.keys() == want.keys()
    moved = 0.0
    for key, tensor in want.items():
        torch.testing.assert_close(got[key], tensor, rtol=0, atol=1e-6)
        moved = max(moved, float(tensor.abs().max()) if ".lora_B." in key else 0.0)
    assert moved > 1e-4   # B starts at zero: the updates reached it


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_nothing_is_written_back(runs, name):
    _, spans = runs[name]["trace"]
    kinds = {s.kind for s in spans}
    assert "d2h" not in kinds and {"update", "forward", "head"} <= kinds


def _merge_by_hub_id(final: Path, base: Path, merged: Path, monkeypatch) -> None:
    """`export --base ORG/NAME`: the base read from the local Hub cache (a fake one
    holding a copy of `base`) merges to the same bytes as the folder; an id the cache
    lacks is one line naming where it looked."""
    cache = base.parent / "hub"
    repo = cache / "models--org--base"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("c0ffee")
    shutil.copytree(base, repo / "snapshots" / "c0ffee")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    out = base.parent / "merged-by-id"
    from transformers.utils import logging as hf_logging

    hf_logging.enable_progress_bar()   # the merge turns them off for its one line, not for good
    result = CliRunner().invoke(app, ["export", "--merge", str(final), "--base", "org/base", "-o",
                                      str(out), "--accept-other-base"])
    assert hf_logging.is_progress_bar_enabled(), "the merge left transformers' bars off"
    assert result.exit_code == 0 and str(repo / "snapshots" / "c0ffee") in result.output, \
        result.output
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in merged.iterdir())
    for path in merged.iterdir():
        assert (out / path.name).read_bytes() == path.read_bytes(), path.name
    missing = CliRunner().invoke(app, ["export", "--merge", str(final), "--base", "org/other",
                                       "-o", str(base.parent / "none")])
    assert missing.exit_code == 2 and missing.output.count("\n") == 1, missing.output
    assert "--base org/other: no such folder" in missing.output
    assert str(cache / "models--org--other") in missing.output
    assert not (base.parent / "none").exists()


def test_final_is_a_peft_folder_that_loads_generates_and_merges(runs, tmp_path, monkeypatch):
    from peft import PeftModel, get_peft_model_state_dict

    final = runs["one"]["final"]
    config = json.loads((final / "adapter_config.json").read_text())
    assert (config["peft_type"], config["task_type"], config["r"], config["lora_alpha"]) == \
        ("LORA", "CAUSAL_LM", 8, 16)
    assert sorted(config["target_modules"]) == ["q_proj", "v_proj"]
    assert (final / "adapter_model.safetensors").stat().st_size < 200_000   # adapters only
    base = build_hf_model(MODEL, seed=SEED)
    peft_model = PeftModel.from_pretrained(base, str(final))
    loaded = get_peft_model_state_dict(peft_model)   # PEFT took our tensors, every one
    assert loaded.keys() == runs["one"]["weights"].keys()
    for key, tensor in runs["one"]["weights"].items():
        assert torch.equal(loaded[key], tensor), key
    ids = torch.tensor([[5, 6, 7, 8]])
    out = peft_model.generate(input_ids=ids, max_new_tokens=3, do_sample=False)
    assert out.shape == (1, 7)
    parts, flats = build_parts(MODEL, seed=SEED)
    export_weights(parts, flats, tmp_path / "base")
    merge = ["export", "--merge", str(final), "--base", str(tmp_path / "base"), "-o",
             str(tmp_path / "merged")]
    refused = CliRunner().invoke(app, merge)   # a random-init run records no base to check
    assert refused.exit_code == 2 and "--accept-other-base" in refused.output, refused.output
    result = CliRunner().invoke(app, [*merge, "--accept-other-base"])
    assert result.exit_code == 0, result.output
    _merge_by_hub_id(final, tmp_path / "base", tmp_path / "merged", monkeypatch)
    umask = os.umask(0)
    os.umask(umask)
    for folder in (final, tmp_path / "merged"):   # one mode for every file saved: the umask's
        modes = {p.name: p.stat().st_mode & 0o777 for p in folder.iterdir()}
        assert set(modes.values()) == {0o666 & ~umask}, modes
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged"))
    torch.testing.assert_close(merged(ids).logits, peft_model(input_ids=ids).logits,
                               rtol=1e-4, atol=1e-4)


def test_a_killed_run_resumes_to_the_same_adapters(runs, tmp_path):
    """Stopped by a fault at step 2 after the snapshot of step 1; the resume loads the
    snapshot's adapters (sha256 checked), replays nothing more and runs step 2."""
    resumed = killed_and_resumed(tmp_path, model=MODEL, workload=WORKLOAD, steps=STEPS,
                                 seed=SEED, lr=LR, eps=EPS)
    assert resumed.weights == "random"   # the base: the run's start
    out = tmp_path / "out"
    got = load_file(str(out / "final" / "adapter_model.safetensors"))
    for key, tensor in runs["one"]["weights"].items():
        assert torch.equal(got[key], tensor), key


def test_a_tuning_option_that_is_not_the_plans_is_refused(tmp_path):
    plan = hand_plan(model=MODEL, layout=Layout(), workload=WORKLOAD)
    plan.save(tmp_path / "plan.json")
    with pytest.raises(ZoError, match="--lora-r 4: must be 8, the plan's"):
        build_config(plan=tmp_path / "plan.json", lora_r=4)
    full = hand_plan(model=MODEL, layout=Layout(),
                     workload=Workload(batch=4, seq=16, param_dtype="fp32", compute_dtype="fp32"))
    full.save(tmp_path / "full.json")
    with pytest.raises(ZoError, match="--tuning lora: must be full, the plan's"):
        build_config(plan=tmp_path / "full.json", tuning="lora")


# ---- a LoRA run over a model folder with a tokenizer: what a PEFT user does next --------
def test_a_lora_run_of_a_model_folder_works_on_the_first_try(tmp_path):
    """final/, best/ and the snapshots carry the base's tokenizer; the summary's loading
    line runs as printed; `zoexec eval final/` (the base from adapter_config.json, or
    --base) gives the run's last evaluation, best/ its best; export --merge says what it
    read and wrote."""
    import re

    from frozen_base import micro_task
    from transformers import AutoTokenizer

    micro = micro_task(tmp_path, Workload(batch=8, seq=48, param_dtype="fp32",
                                          compute_dtype="fp32", tuning="lora"))
    base, test, task = micro.base, micro.test, micro.task
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [
        "run", str(micro.plan), "--model-path", str(base), "--data", str(micro.train), *task,
        "--eval-data", str(test),
        "--eval-every", "2", "--steps", "4", "--lr", "5e-2", "--eps", "1e-2", "--out", str(out),
        "--save-every", "2", "--save-best", "eval_loss:max", "--threads", "1"])
    assert result.exit_code == 0, result.output
    snapshots = sorted((out / "snapshots").glob("checkpoint-*"))
    assert snapshots
    for folder in (out / "final", out / "best", *snapshots):
        assert AutoTokenizer.from_pretrained(folder)("It was great")["input_ids"], folder
    # the summary's loading line, run as printed
    line = re.search(r"load: (PeftModel\.from_pretrained\(.*\))$", result.output, re.M)
    assert line, result.output
    from peft import PeftModel  # noqa: F401 - the names the line uses
    from transformers import AutoModelForCausalLM  # noqa: F401

    loaded = eval(line[1])   # noqa: S307 - the printed line itself is what is tested
    assert type(loaded).__name__ == "PeftModelForCausalLM"
    evals = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [e for e in evals if "eval_loss" in e]
    state = json.loads((out / "best" / "state.json").read_text())   # a resume reads it back
    assert (state["metric"], state["value"]) == ("eval_loss", max(e["eval_loss"] for e in evals))
    for folder, extra, want in ((out / "final", [], evals[-1]),
                                (out / "final", ["--base", str(base)], evals[-1]),
                                (out / "best", [], max(evals, key=lambda e: e["eval_loss"]))):
        result = CliRunner().invoke(app, ["eval", str(folder), "--data", str(test), *task,
                                          "--batch", "8", "--seq", "48", *extra, "--json"])
        assert result.exit_code == 0, result.output
        shown = json.loads(result.output.strip().splitlines()[-1])
        assert shown["eval_accuracy"] == want["eval_accuracy"], (folder, shown, want)
        assert shown["eval_loss"] == pytest.approx(want["eval_loss"], rel=1e-6), (folder, shown)
    result = CliRunner().invoke(app, ["export", "--merge", str(out / "final"), "--base", str(base),
                                      "-o", str(tmp_path / "merged")])
    assert result.exit_code == 0, result.output
    assert f"read LoRA adapters {out / 'final'} and the base model {base} (unchanged)" in \
        result.output and f"wrote {tmp_path / 'merged'}: a plain HF model folder" in result.output


def test_eval_of_adapters_without_a_base_names_base(tmp_path):
    final = tmp_path / "final"
    final.mkdir()
    from peft import LoraConfig

    LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj"], task_type="CAUSAL_LM",
               base_model_name_or_path=str(tmp_path / "gone")).save_pretrained(str(final))
    (final / "adapter_model.safetensors").write_bytes(b"")
    result = CliRunner().invoke(app, ["eval", str(final), "--data", str(tmp_path / "d.jsonl")])
    assert result.exit_code == 2, result.output
    assert "give --base DIR" in result.output and "Traceback" not in result.output
