"""Weights made or read block by block (zoexec.store.loading): per-block random init, the same
weights from every path (build_parts, build_hf_model, the node's store), safetensors
checkpoints (sharded, converted, tied heads) and their refusals, loading progress."""

from __future__ import annotations

import io
import json
import uuid

import pytest
import torch
from safetensors.torch import load_file, save_file

from zoexec.config import RunConfig
from zoexec.model.export import export_weights, hf_tensors
from zoexec.model.families import build_hf_model
from zoexec.runtime import groups as zgroups
from zoexec.store import loading
from zoexec.store.loading import LoadProgress, build_parts, fill_timeout_s, open_source
from zoexec.store.node import load_node_model
from zoplan.errors import ZoError
from zoplan.handplan import hand_plan
from zoplan.layout import Layout
from zoplan.models import get_model
from zoplan.workload import Workload

FAMILIES = ["tiny-opt", "tiny-llama", "tiny-qwen3"]


def _load_one_rank(model, *, init="random", seed=0, param_dtype="fp32", compute_dtype="fp32",
                   progress=False):
    """load_node_model as the builder of a one-rank node does it (no process group)."""
    workload = Workload(batch=1, seq=8, param_dtype=param_dtype, compute_dtype=compute_dtype)
    plan = hand_plan(model=model, layout=Layout(), workload=workload)
    cfg = RunConfig.make(plan=plan.data, load_from=str(init), seed=seed, quiet=not progress)
    env = zgroups.DistEnv(place=zgroups.RankPlace(rank=0, local_rank=0, world_size=1, local_world_size=1),
                          layout=Layout(), device=torch.device("cpu"), backend="gloo")
    return load_node_model(cfg, env, f"t{uuid.uuid4().hex[:10]}")


def _store_blocks(store):
    return [store.weights(b).clone() for b in range(store.num_blocks)]


def _save_sharded(model, folder, *, seed=0, shard="60KB"):
    hf = build_hf_model(model, seed=seed)
    hf.save_pretrained(folder, max_shard_size=shard)
    return folder


# ---- random init ------------------------------------------------------------------------------
def test_a_block_depends_only_on_the_seed_and_its_index():
    """Block b's weights come from its own seed: a model of 2 layers has the first 2
    blocks (and the resident parts) of the same model with 4 layers."""
    config = dict(get_model("tiny-llama").hf_config)
    small, few = build_parts(dict(config, num_hidden_layers=2), seed=7)
    big, many = build_parts(config, seed=7)
    assert all(torch.equal(a, b) for a, b in zip(few, many[:2]))
    assert torch.equal(small.resident_master, big.resident_master)
    assert not torch.equal(many[0], many[1])


@pytest.mark.parametrize("name", FAMILIES)
def test_every_path_builds_the_same_weights(name):
    """build_parts (oracle), build_hf_model (HF reference) and the node's store filled
    block by block hold bit-identical weights."""
    parts, flats = build_parts(name, seed=5)
    reference = build_hf_model(name, seed=5).state_dict()
    mine = dict(hf_tensors(parts, flats))
    for key, tensor in mine.items():
        assert torch.equal(tensor, reference[key]), key
    assert set(reference) - set(mine) <= {"lm_head.weight"}
    node_parts, store = _load_one_rank(name, seed=5)
    assert all(torch.equal(a, b) for a, b in zip(_store_blocks(store), flats, strict=True))
    assert torch.equal(node_parts.resident_master, parts.resident_master)


def test_random_init_is_the_model_classes_own():
    """Matrices ~ N(0, 0.02), norms 1, biases 0, OPT's padding embedding row 0."""
    parts, flats = build_parts("tiny-opt", seed=1)
    tensors = dict(hf_tensors(parts, flats))
    for key, tensor in tensors.items():
        if key.endswith(("fc1.weight", "q_proj.weight", "embed_tokens.weight")):
            assert 0.018 < tensor.std().item() < 0.022, key
        elif "layer_norm.weight" in key:
            assert torch.equal(tensor, torch.ones_like(tensor)), key
        elif key.endswith(".bias"):
            assert torch.equal(tensor, torch.zeros_like(tensor)), key
    pad = parts.config.pad_token_id
    assert tensors["model.decoder.embed_tokens.weight"][pad].abs().sum() == 0
    llama, _ = build_parts("tiny-llama", seed=1)
    assert 0.018 < llama.resident.lm_head.weight.std().item() < 0.022


def test_resident_modules_are_the_master_in_the_compute_dtype():
    parts, _ = build_parts("tiny-llama", seed=0, param_dtype="bf16", compute_dtype="fp32")
    assert parts.resident_master.dtype == torch.bfloat16
    flat = torch.cat([p.reshape(-1) for p in parts.resident.parameters()])
    assert torch.equal(flat, parts.resident_master.float())
    assert parts.resident.model.rotary_emb.inv_freq.dtype == torch.float32


# ---- checkpoints ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["tiny-opt", "tiny-llama"])
def test_a_sharded_checkpoint_fills_the_store_converted(name, tmp_path, monkeypatch):
    monkeypatch.setattr(loading, "READ_ELEMENTS", 5000)     # big tensors read in row chunks
    folder = _save_sharded(name, tmp_path / "ckpt", seed=3)
    assert len(list(folder.glob("*.safetensors"))) > 3
    parts, flats = build_parts(name, seed=3)
    _, store = _load_one_rank(name, init=folder)
    assert all(torch.equal(a, b) for a, b in zip(_store_blocks(store), flats, strict=True))
    half, store16 = _load_one_rank(name, init=folder, param_dtype="bf16", compute_dtype="bf16")
    for got, want in zip(_store_blocks(store16), flats, strict=True):
        assert got.dtype == torch.bfloat16 and torch.equal(got, want.to(torch.bfloat16))
    assert torch.equal(half.resident_master, parts.resident_master.to(torch.bfloat16))


def test_a_tied_head_may_be_in_the_checkpoint_or_not(tmp_path):
    parts, flats = build_parts("tiny-qwen3", seed=2)
    export_weights(parts, flats, tmp_path / "m")                   # no lm_head.weight
    tensors = load_file(str(tmp_path / "m" / "model.safetensors"))
    assert "lm_head.weight" not in tensors
    again, flats2 = build_parts("tiny-qwen3", init=str(tmp_path / "m"))
    assert torch.equal(again.resident_master, parts.resident_master)
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    save_file(tensors, str(tmp_path / "m" / "model.safetensors"))
    with_head, _ = build_parts("tiny-qwen3", init=str(tmp_path / "m"))
    assert torch.equal(with_head.resident_master, parts.resident_master)
    assert with_head.resident.lm_head.weight is with_head.resident.model.embed_tokens.weight


def test_a_base_model_checkpoint_without_the_model_prefix_loads(tmp_path):
    parts, flats = build_parts("tiny-opt", seed=4)
    export_weights(parts, flats, tmp_path / "m")
    path = tmp_path / "m" / "model.safetensors"
    tensors = load_file(str(path))
    save_file({k.removeprefix("model."): v for k, v in tensors.items()}, str(path))
    _, flats2 = build_parts("tiny-opt", init=str(tmp_path / "m"))
    assert all(torch.equal(a, b) for a, b in zip(flats, flats2))


def _exported(tmp_path, name="tiny-llama"):
    parts, flats = build_parts(name, seed=0)
    export_weights(parts, flats, tmp_path / "m")
    return tmp_path / "m", tmp_path / "m" / "model.safetensors"


def test_a_bin_only_checkpoint_is_refused(tmp_path):
    folder, path = _exported(tmp_path)
    path.unlink()
    (folder / "pytorch_model.bin").write_bytes(b"not read")
    with pytest.raises(ZoError, match=r"only pytorch_model\*\.bin weights; convert them to safetensors"):
        build_parts("tiny-llama", init=str(folder))
    (folder / "pytorch_model.bin").unlink()
    with pytest.raises(ZoError, match="has neither model.safetensors nor model.safetensors.index.json"):
        build_parts("tiny-llama", init=str(folder))


def test_a_missing_shard_is_named(tmp_path):
    folder = _save_sharded("tiny-llama", tmp_path / "ckpt")
    shards = sorted(folder.glob("model-*.safetensors"))
    shards[1].unlink()
    with pytest.raises(ZoError, match=rf"1 of the {len(shards)} shards .* missing, the first {shards[1].name}"):
        build_parts("tiny-llama", init=str(folder))


def test_an_index_naming_the_wrong_shard_is_refused(tmp_path):
    folder = _save_sharded("tiny-llama", tmp_path / "ckpt")
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    index["weight_map"]["model.norm.weight"] = next(f for f in files if f != index["weight_map"]["model.norm.weight"])
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ZoError, match="puts model.norm.weight in .*which does not hold it"):
        build_parts("tiny-llama", init=str(folder))


@pytest.mark.parametrize("change, message", [
    ("drop", r"does not match its config: model.layers.2.mlp.up_proj.weight is missing"),
    ("shape", r"model.layers.2.mlp.up_proj.weight has shape \[384, 64\], the config gives \[384, 128\]"),
    ("extra", r"it holds model.layers.4.mlp.up_proj.weight, which the config's model does not have"),
    ("head", r"lm_head.weight is missing"),
])
def test_tensors_must_match_the_config(tmp_path, change, message):
    folder, path = _exported(tmp_path)
    tensors = load_file(str(path))
    key = "model.layers.2.mlp.up_proj.weight"
    if change == "drop":
        del tensors[key]
    elif change == "shape":
        tensors[key] = tensors[key][:, :64].contiguous()
    elif change == "extra":
        tensors["model.layers.4.mlp.up_proj.weight"] = tensors[key].clone()
    else:
        del tensors["lm_head.weight"]
    save_file(tensors, str(path))
    with pytest.raises(ZoError, match=message):
        build_parts("tiny-llama", init=str(folder))


def test_rotary_buffers_in_a_checkpoint_are_ignored(tmp_path):
    """Older checkpoints hold the rotary embedding's inv_freq buffers: not weights,
    skipped; the model loads the weights it would load without them."""
    folder, path = _exported(tmp_path)
    plain, plain_blocks = build_parts("tiny-llama", init=str(folder))
    tensors = load_file(str(path))
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(16)
    save_file(tensors, str(path))
    parts, blocks = build_parts("tiny-llama", init=str(folder))
    assert torch.equal(parts.resident_master, plain.resident_master)
    assert len(blocks) == len(plain_blocks) and all(map(torch.equal, blocks, plain_blocks))


def test_a_skeleton_reads_nothing(tmp_path):
    """The other local ranks' skeleton needs only the config (the builder reads)."""
    folder, path = _exported(tmp_path)
    path.unlink()
    source = open_source(get_model("tiny-llama"), init=str(folder), weights=False)
    assert source.master is None and source.checkpoint is None
    assert source.block_numel == get_model("tiny-llama").block_params


# ---- progress and waiting -------------------------------------------------------------------------
def test_progress_lines_count_blocks_bytes_and_rate():
    stream = io.StringIO()
    progress = LoadProgress(total=3, what="loading blocks", period_s=0.0, stream=stream)
    for _ in range(3):
        progress.block_done(2**29)
    lines = stream.getvalue().splitlines()
    assert [line.split(",")[0] for line in lines] == [f"zoexec: loading blocks {k}/3" for k in (1, 2, 3)]
    assert lines[-1].split(", ")[1] == "1.50 GiB" and lines[-1].endswith(" GiB/s")


def test_progress_only_the_last_line_when_blocks_come_fast():
    stream = io.StringIO()
    progress = LoadProgress(total=4, what="loading blocks", period_s=3600.0, stream=stream)
    for _ in range(4):
        progress.block_done(1)
    assert stream.getvalue().count("\n") == 1 and "4/4" in stream.getvalue()


@pytest.mark.parametrize("progress", [True, False])
def test_loading_shows_progress_unless_quiet(capsys, progress):
    _load_one_rank("tiny-opt", progress=progress)
    err = capsys.readouterr().err
    assert ("zoexec: initialising blocks 4/4" in err) == progress, err


def test_the_wait_grows_with_the_bytes_to_fill():
    """The usual timeout plus the bytes at 32 MiB/s (FILL_FLOOR_BYTES_PER_S): OPT-175B's
    fp16 blocks, 347.9 GB, add 10,368.84 s, 2.9 h (a floor 1000x too slow or a wait in
    the wrong unit is far from it)."""
    assert fill_timeout_s(0, base_s=600) == 600
    assert fill_timeout_s(32 * 2**20, base_s=600) == pytest.approx(601.0)
    opt_175b_fp16 = 96 * 1_812_086_784 * 2
    assert fill_timeout_s(opt_175b_fp16, base_s=600) == pytest.approx(600 + 10_368.84)
