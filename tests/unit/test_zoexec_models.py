"""Block-wise model adapters (zoexec.model.families) against the HF models themselves, fp32 on CPU."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from zoexec.model.export import export_weights
from zoexec.model.families import (
    bind_block,
    bind_resident,
    build_hf_model,
    resident_flat,
    resident_param_specs,
)
from zoexec.store.loading import build_parts
from zoplan.errors import ZoError
from zoplan.models import get_model, spec_from_hf_config

# OPT-350m's shape in miniature: post-LN (no final norm), project_in/out 32 <-> 64.
OPT_POST_LN = {"model_type": "opt", "num_hidden_layers": 2, "hidden_size": 64, "ffn_dim": 128,
               "num_attention_heads": 4, "vocab_size": 128, "max_position_embeddings": 64,
               "word_embed_proj_dim": 32, "do_layer_norm_before": False,
               "tie_word_embeddings": True}
MODELS = ["tiny-opt", "tiny-llama", "tiny-qwen3", "opt-post-ln"]
RTOL = 1e-5


def _spec(name):
    return spec_from_hf_config(OPT_POST_LN, name=name) if name == "opt-post-ln" else get_model(name)


def _ids(spec, *, batch=2, seq=12, seed=0):
    return torch.randint(0, spec.vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def blockwise_logits_loss(parts, flats, ids):
    hidden, ctx = parts.embed(ids)
    for flat in flats:
        bind_block(parts, flat.to(parts.dtype, copy=True))
        hidden = parts.block_forward(hidden, ctx)
    return parts.logits(hidden), parts.head_loss(hidden, ids)


@pytest.mark.parametrize("name", MODELS)
def test_blockwise_forward_equals_hf_loss(name):
    spec = _spec(name)
    parts, flats = build_parts(spec, seed=3)
    ids = _ids(spec)
    _, loss = blockwise_logits_loss(parts, flats, ids)
    with torch.no_grad():
        ref = build_hf_model(spec, seed=3)(ids, labels=ids).loss
    assert loss.dtype == torch.float64 and loss.dim() == 0    # the sum over the count
    torch.testing.assert_close(loss.float(), ref, rtol=RTOL, atol=0)
    assert len(flats) == spec.num_layers
    assert parts.block_numel == spec.block_params == flats[0].numel()
    assert parts.resident_numel == spec.resident_params


def test_specs_offsets_and_decay_rule():
    parts, _ = build_parts("tiny-llama", seed=0)
    specs = parts.block_specs
    assert specs[0].offset == 0 and specs[-1].stop == parts.block_numel
    assert all(a.stop == b.offset for a, b in zip(specs, specs[1:]))
    no_decay = {s.name for s in specs if not s.decay}
    assert no_decay == {"input_layernorm.weight", "post_attention_layernorm.weight"}
    names = {n: d for n, _, d in resident_param_specs(parts)}
    assert names == {"model.embed_tokens.weight": True, "model.norm.weight": False,
                     "lm_head.weight": True}


def test_tied_head_counted_once_and_shares_binding():
    parts, _ = build_parts("tiny-qwen3", seed=0)
    assert [n for n, _, _ in resident_param_specs(parts)] == ["model.embed_tokens.weight",
                                                              "model.norm.weight"]
    flat = resident_flat(parts)
    bind_resident(parts, flat)
    flat[:10].fill_(7.0)
    assert parts.resident.lm_head.weight[0, :10].eq(7.0).all()


def test_bind_block_aliases_the_flat_buffer():
    spec = get_model("tiny-opt")
    parts, flats = build_parts(spec, seed=1)
    work = flats[0].clone()
    bind_block(parts, work)
    ptrs = {p.data_ptr() for p in parts.block.parameters()}
    lo, hi = work.data_ptr(), work.data_ptr() + work.numel() * work.element_size()
    assert all(lo <= ptr < hi for ptr in ptrs)
    hidden, ctx = parts.embed(_ids(spec))
    with torch.no_grad():
        before = parts.block_forward(hidden, ctx)
        work.mul_(1.5)
        changed = parts.block_forward(hidden, ctx)
        work.div_(1.5)
        again = parts.block_forward(hidden, ctx)
    assert not torch.allclose(before, changed)
    torch.testing.assert_close(before, again)


def test_same_seed_same_weights_other_seed_other_weights():
    _, a = build_parts("tiny-llama", seed=5)
    _, b = build_parts("tiny-llama", seed=5)
    _, c = build_parts("tiny-llama", seed=6)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[0], c[0])


def test_param_dtype_bf16_compute_fp32():
    parts, flats = build_parts("tiny-llama", seed=0, param_dtype="bf16", compute_dtype="fp32")
    assert flats[0].dtype == torch.bfloat16 and parts.dtype == torch.float32
    assert next(parts.resident.parameters()).dtype == torch.float32
    _, loss = blockwise_logits_loss(parts, flats, _ids(get_model("tiny-llama")))
    assert torch.isfinite(loss)


@pytest.mark.parametrize("name", ["tiny-llama", "opt-post-ln", "tiny-qwen3"])
def test_export_round_trips_through_from_pretrained(name, tmp_path):
    spec = _spec(name)
    parts, flats = build_parts(spec, seed=2)
    for flat in flats:                         # trained-looking weights, not the init
        flat.add_(0.01)
    export_weights(parts, flats, tmp_path / "out")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out", attn_implementation="sdpa")
    ids = _ids(spec, seed=4)
    logits, _ = blockwise_logits_loss(parts, flats, ids)
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(ids).logits, logits, rtol=RTOL, atol=1e-5)
    again, flats2 = build_parts(spec, init=str(tmp_path / "out"))
    assert all(torch.equal(x, y) for x, y in zip(flats, flats2))
    torch.testing.assert_close(resident_flat(again), resident_flat(parts), rtol=0, atol=0)


def test_user_errors_are_zoerrors(tmp_path):
    with pytest.raises(ZoError, match="neither 'random' nor a model directory"):
        build_parts("tiny-opt", init=str(tmp_path / "missing"))
    sliding = dict(get_model("tiny-qwen3").hf_config, use_sliding_window=True, sliding_window=8,
                   max_window_layers=1)
    parts, _ = build_parts(sliding)       # runs rows that fit in the window, refuses longer ones
    with pytest.raises(ZoError, match="3 of 4 layers use a 8-token sliding window"):
        parts.embed(_ids(get_model("tiny-qwen3")))
    with pytest.raises(ZoError, match="unknown precision"):
        build_parts("tiny-opt", param_dtype="fp8")


def test_model_directory_must_match_the_plans_model(tmp_path):
    parts, flats = build_parts("tiny-llama", seed=0)
    export_weights(parts, flats, tmp_path / "m")
    with pytest.raises(ZoError, match=r"holds \(family, layers, hidden, vocab\) = \('llama', 4, 128, 512\)"):
        build_parts(get_model("tiny-qwen3"), init=str(tmp_path / "m"))
    build_parts(get_model("tiny-llama"), init=str(tmp_path / "m"))


@pytest.mark.parametrize("name", MODELS)
def test_planner_tensor_numels_match_zoexec_specs(name):
    """The planner prices z per tensor chunk (zoplan.models *_tensor_numels): the
    tensors must be zoexec's, in zoexec's order."""
    spec = _spec(name)
    parts, _ = build_parts(spec, seed=0)
    assert spec.block_tensor_numels() == [s.numel for s in parts.block_specs]
    assert spec.resident_tensor_numels() == [s.numel for s in parts.resident_specs]
