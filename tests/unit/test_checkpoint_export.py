"""zoexec.model.export.export_weights writes what save_pretrained writes: config,
generation config (the source's, else derived), safetensors sharded by size with HF's
names and index, and the source folder's tokenizer; it reloads with from_pretrained
to the same weights."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from zoexec.fields import parse_size
from zoexec.model.export import (
    WEIGHTS_INDEX,
    export_weights,
    hf_tensors,
    plan_shards,
    write_safetensors,
)
from zoexec.store.loading import build_parts
from zoplan.errors import ZoError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from tiny_model import make_model_dir  # noqa: E402


@pytest.fixture(scope="module")
def tiny():
    return build_parts("tiny-llama", init="random", seed=5)


def _loaded(folder: Path) -> dict:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).state_dict()


def test_sharded_export_reloads_to_equal_weights(tiny, tmp_path):
    parts, flats = tiny
    export_weights(parts, flats, tmp_path / "m", max_shard_bytes=400_000)
    files = sorted(p.name for p in (tmp_path / "m").glob("model*.safetensors"))
    count = len(files)
    assert count > 2 and files == [f"model-{i:05d}-of-{count:05d}.safetensors"
                                   for i in range(1, count + 1)]
    assert not (tmp_path / "m" / "model.safetensors").exists()
    index = json.loads((tmp_path / "m" / WEIGHTS_INDEX).read_text())
    reference = dict(hf_tensors(parts, flats))
    assert set(index["weight_map"]) == set(reference)
    assert index["metadata"]["total_size"] == sum(t.numel() * 4 for t in reference.values())
    for name in files:   # no shard past the limit unless it holds one tensor
        with safe_open(str(tmp_path / "m" / name), "pt") as handle:
            keys = list(handle.keys())
            size = sum(handle.get_tensor(k).numel() * 4 for k in keys)
        assert size <= 400_000 or len(keys) == 1, (name, size, keys)
    loaded = _loaded(tmp_path / "m")
    for name, tensor in reference.items():
        assert torch.equal(loaded[name], tensor), name


def test_zoexec_reads_a_sharded_export_back(tiny, tmp_path):
    """What a resume from a sharded snapshot loads: the store's blocks and the resident
    weights equal to the ones exported."""
    parts, flats = tiny
    export_weights(parts, flats, tmp_path / "m", max_shard_bytes=300_000)
    assert (tmp_path / "m" / WEIGHTS_INDEX).is_file()
    again, again_flats = build_parts("tiny-llama", init=str(tmp_path / "m"))
    assert all(torch.equal(a, b) for a, b in zip(again_flats, flats, strict=True))
    mine, theirs = dict(hf_tensors(parts, flats)), dict(hf_tensors(again, again_flats))
    assert all(torch.equal(mine[k], theirs[k]) for k in mine) and set(mine) == set(theirs)


def test_one_file_under_the_limit_and_the_hf_config(tiny, tmp_path):
    parts, flats = tiny
    export_weights(parts, flats, tmp_path / "m", state={"step": 3})
    names = sorted(p.name for p in (tmp_path / "m").iterdir())
    assert names == ["config.json", "generation_config.json", "model.safetensors", "state.json"]
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["dtype"] == "float32"
    generation = json.loads((tmp_path / "m" / "generation_config.json").read_text())
    assert generation["bos_token_id"] == parts.config.bos_token_id
    assert generation["eos_token_id"] == parts.config.eos_token_id


def test_the_source_folder_tokenizer_and_generation_config_come_along(tmp_path):
    source = make_model_dir(tmp_path / "src", "tiny-opt", words=["hello", "world"],
                            chat_template="{{ messages[0]['content'] }}")
    generation = json.loads((source / "generation_config.json").read_text())
    generation["max_new_tokens"] = 7
    (source / "generation_config.json").write_text(json.dumps(generation))
    (source / "vocab.tiktoken").write_text("x")
    parts, flats = build_parts("tiny-opt", init=str(source))
    export_weights(parts, flats, tmp_path / "out", extra_files=source)
    out = tmp_path / "out"
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "vocab.tiktoken"):
        assert (out / name).read_bytes() == (source / name).read_bytes(), name
    assert json.loads((out / "generation_config.json").read_text())["max_new_tokens"] == 7


def test_without_a_source_generation_config_it_is_derived(tmp_path):
    source = make_model_dir(tmp_path / "src", "tiny-opt", generation_config=False)
    parts, flats = build_parts("tiny-opt", init=str(source))
    export_weights(parts, flats, tmp_path / "out", extra_files=source)
    generation = json.loads((tmp_path / "out" / "generation_config.json").read_text())
    assert (generation["bos_token_id"], generation["pad_token_id"], generation["eos_token_id"]) == (0, 1, 2)


def test_plan_shards_like_huggingface_hub(tiny):
    from huggingface_hub import split_torch_state_dict_into_shards

    sizes = [("a", 4), ("b", 4), ("c", 3), ("big", 20), ("d", 1), ("e", 9)]
    assert plan_shards(sizes, 10) == [["a", "b"], ["big"], ["c", "d"], ["e"]]
    assert plan_shards(sizes, 100) == [["a", "b", "c", "big", "d", "e"]]
    state = {k: t.clone() for k, t in hf_tensors(*tiny)}   # standalone: hub groups views by storage
    for limit in (100_000, 400_000, 10**9):
        theirs = split_torch_state_dict_into_shards(state, max_shard_size=limit)
        mine = plan_shards([(k, t.numel() * t.element_size()) for k, t in state.items()], limit)
        assert mine == list(theirs.filename_to_tensors.values()), limit


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_safetensors_files_read_back(tmp_path, dtype):
    from safetensors.torch import load_file

    tensors = [("w", torch.randn(3, 5)), ("b", torch.randn(7)), ("s", torch.tensor(1.5))]
    write_safetensors(tensors, tmp_path, dtype=dtype)
    loaded = load_file(str(tmp_path / "model.safetensors"))
    assert all(torch.equal(loaded[name], t.to(dtype)) for name, t in tensors)


def test_parse_size():
    assert [parse_size(t) for t in ("5GB", "500MB", "1.5gb", "10KB", "123")] == \
        [5 * 10**9, 5 * 10**8, 1_500_000_000, 10_000, 123]
    for bad in ("0", "5 GiB", "lots", "-1GB"):
        with pytest.raises(ZoError, match="--max-shard-size"):
            parse_size(bad)
