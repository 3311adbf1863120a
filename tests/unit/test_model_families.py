"""Every family's adapter (zoexec/model/<family>.py) against transformers' own model:
the offloaded block-wise forward (one working block bound to each flat buffer in turn)
gives the logits and the loss of AutoModelForCausalLM.from_config(...) holding the same
weights, in fp32 (tight) and bf16 (loose tolerance; measured equal bit for bit here),
and an export reloads with from_pretrained to the same forward and weights. The tiny
configs are built here (no downloads); the weights are the seeded init plus noise, so
norms and biases are not at their initial 1 and 0 and the soft caps bite."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM

from zoexec.model.export import export_weights, hf_tensors
from zoexec.model.families import (
    bind_block,
    bind_resident,
    build_hf_model,
    check_matches,
    resident_flat,
)
from zoexec.store.loading import build_parts
from zoplan.errors import ZoError
from zoplan.models import get_model, spec_from_hf_config

SMALL = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 96,
         "max_position_embeddings": 64}
ROTARY = {**SMALL, "intermediate_size": 96, "num_key_value_heads": 2, "head_dim": 16}
CONFIGS = {
    "gpt2": {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "n_inner": 160,
             "vocab_size": 96, "n_positions": 64},
    "gptneox": {"model_type": "gpt_neox", **SMALL, "intermediate_size": 160, "rotary_pct": 0.25},
    "gptneox-serial": {"model_type": "gpt_neox", **SMALL, "intermediate_size": 160,
                       "use_parallel_residual": False, "attention_bias": False},
    # every layer slides over 8 tokens: the 24-token rows see the window
    "mistral": {"model_type": "mistral", **ROTARY, "sliding_window": 8},
    "qwen2": {"model_type": "qwen2", **ROTARY, "tie_word_embeddings": True},
    "gemma": {"model_type": "gemma", **ROTARY, "num_key_value_heads": 1, "head_dim": 32},
    # soft caps small enough to bend these logits; the window holds the whole row
    "gemma2": {"model_type": "gemma2", **ROTARY, "sliding_window": 32, "query_pre_attn_scalar": 24,
               "attn_logit_softcapping": 0.5, "final_logit_softcapping": 0.3},
    "llama-biases": {"model_type": "llama", **ROTARY, "attention_bias": True, "mlp_bias": True},
}
PRECISIONS = {"fp32": (torch.float32, 1e-5, 1e-5), "bf16": (torch.bfloat16, 2e-2, 2e-2)}


def trained_looking(name: str, precision: str = "fp32", seed: int = 1):
    """build_parts of CONFIGS[name] with noise on every block and resident weight."""
    parts, flats = build_parts(CONFIGS[name], seed=seed, param_dtype=precision,
                               compute_dtype=precision)
    gen = torch.Generator().manual_seed(seed)
    for flat in flats:
        flat.add_((torch.randn(flat.shape, generator=gen) * 0.05).to(flat.dtype))
    resident = resident_flat(parts)
    resident.add_((torch.randn(resident.shape, generator=gen) * 0.05).to(resident.dtype))
    bind_resident(parts, resident)
    return parts, flats


def blockwise(parts, flats, ids):
    """Logits and mean loss of the offloaded forward: one working block, each flat
    buffer bound in turn."""
    with torch.no_grad():
        hidden, ctx = parts.embed(ids)
        for flat in flats:
            bind_block(parts, flat.to(parts.dtype, copy=True))
            hidden = parts.block_forward(hidden, ctx)
        return parts.logits(hidden), parts.head_loss(hidden, ids)


def transformers_twin(parts, flats, dtype):
    """transformers' own model of the same config holding the same weights."""
    config = parts.config
    hf = AutoModelForCausalLM.from_config(config, dtype=dtype,
                                          attn_implementation=config._attn_implementation)
    missing, unexpected = hf.load_state_dict(dict(hf_tensors(parts, flats)), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    assert ("lm_head.weight" in missing) == config.tie_word_embeddings
    return hf.eval()


def _ids(vocab, *, seq=24, seed=0):
    return torch.randint(0, vocab, (2, seq), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("name", CONFIGS)
def test_blockwise_forward_equals_transformers(name, precision):
    dtype, rtol, atol = PRECISIONS[precision]
    parts, flats = trained_looking(name, precision)
    hf = transformers_twin(parts, flats, dtype)
    ids = _ids(parts.config.vocab_size)
    logits, loss = blockwise(parts, flats, ids)
    with torch.no_grad():
        out = hf(ids, labels=ids)
    assert logits.dtype == dtype
    torch.testing.assert_close(logits, out.logits, rtol=rtol, atol=atol)
    torch.testing.assert_close(loss.float(), out.loss.float(), rtol=rtol, atol=atol)


@pytest.mark.parametrize("name", CONFIGS)
def test_export_round_trips_through_from_pretrained(name, tmp_path):
    parts, flats = trained_looking(name)
    export_weights(parts, flats, tmp_path / "out")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert type(model).__name__ == type(parts.resident).__name__
    ids = _ids(parts.config.vocab_size, seed=4)
    logits, _ = blockwise(parts, flats, ids)
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(ids).logits, logits, rtol=1e-5, atol=1e-5)
    again, flats2 = build_parts(CONFIGS[name], init=str(tmp_path / "out"))
    assert all(torch.equal(a, b) for a, b in zip(flats, flats2, strict=True))
    assert torch.equal(resident_flat(again), resident_flat(parts))


@pytest.mark.parametrize("name", CONFIGS)
def test_planner_sizes_are_the_adapters(name):
    """zoplan's catalogue formulas (block and resident tensors, in order) are the
    tensors zoexec's adapter streams, and build_hf_model makes the same init."""
    spec = spec_from_hf_config(CONFIGS[name], name=name)
    parts, flats = build_parts(CONFIGS[name], seed=3)
    assert spec.block_tensor_numels() == [s.numel for s in parts.block_specs]
    assert spec.resident_tensor_numels() == [s.numel for s in parts.resident_specs]
    reference = build_hf_model(CONFIGS[name], seed=3).state_dict()
    for key, tensor in hf_tensors(parts, flats):
        assert torch.equal(tensor, reference[key]), key


def test_a_window_shorter_than_the_row_is_refused_for_mixed_layers():
    """Qwen2 with its later layers sliding: one working block runs every layer, so a
    row longer than the window (the masks differ by layer) is refused, a shorter one
    runs and equals transformers."""
    config = {"model_type": "qwen2", **ROTARY, "num_hidden_layers": 3, "use_sliding_window": True,
              "sliding_window": 16, "max_window_layers": 1}
    parts, flats = build_parts(config, seed=0)
    with pytest.raises(ZoError, match=r"2 of 3 layers use a 16-token sliding window.*24 tokens"):
        parts.embed(_ids(96, seq=24))
    hf = transformers_twin(parts, flats, torch.float32)
    ids = _ids(96, seq=16)
    with torch.no_grad():
        torch.testing.assert_close(blockwise(parts, flats, ids)[0], hf(ids).logits)


@pytest.mark.parametrize(("config", "message"), [
    ({"model_type": "gemma3_text", **ROTARY}, "rotary bases that differ between local and global"),
    ({"model_type": "bert", **SMALL}, "no adapter for this family"),
    ({**CONFIGS["gpt2"], "scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx"),
])
def test_an_unsupported_model_names_what_it_lacks(config, message):
    with pytest.raises(ZoError, match=message):
        build_parts(config)
    if config["model_type"] != "gpt2":
        with pytest.raises(ZoError, match=message):
            spec_from_hf_config(config, name="x")


def test_a_model_folder_must_hold_the_plans_model(tmp_path):
    """check_matches: a model folder's config against the plan's ModelSpec (its family,
    layers, hidden size and vocabulary); random weights are not checked."""
    config = AutoConfig.for_model("llama", **ROTARY)
    check_matches(spec_from_hf_config({"model_type": "llama", **ROTARY}, name="m"), config, tmp_path)
    deeper = spec_from_hf_config({"model_type": "llama", **ROTARY, "num_hidden_layers": 3}, name="m")
    with pytest.raises(ZoError, match=r"holds \(family, layers, hidden, vocab\) = \('llama', 2, 64, 96\)"):
        check_matches(deeper, config, tmp_path)
    check_matches(deeper, config, "random")


def test_gemma2_refuses_sdpa_which_has_no_soft_cap():
    with pytest.raises(ZoError, match="'sdpa' for gemma2: use one of auto, eager"):
        build_parts(CONFIGS["gemma2"], attn_implementation="sdpa")


@pytest.mark.parametrize(("name", "rename"), [
    ("gpt2", lambda k: k.removeprefix("transformer.")),                # a base model's names
    ("gptneox", lambda k: "embed_out.weight" if k == "lm_head.weight" else k),   # older head name
])
def test_checkpoints_with_older_names_load(name, rename, tmp_path):
    parts, flats = trained_looking(name)
    export_weights(parts, flats, tmp_path / "m")
    path = tmp_path / "m" / "model.safetensors"
    tensors = {rename(k): v for k, v in load_file(str(path)).items()}
    if name == "gpt2":   # mask buffers older GPT-2 checkpoints carry: not weights
        tensors["h.0.attn.bias"] = torch.ones(1, 1, 64, 64)
        tensors["h.0.attn.masked_bias"] = torch.tensor(-1e4)
    save_file(tensors, str(path))
    again, flats2 = build_parts(CONFIGS[name], init=str(tmp_path / "m"))
    assert all(torch.equal(a, b) for a, b in zip(flats, flats2, strict=True))
    assert torch.equal(resident_flat(again), resident_flat(parts))


@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-gptneox", "tiny-mistral", "tiny-qwen2",
                                  "tiny-gemma", "tiny-gemma2"])
def test_catalogue_tiny_models_build(name):
    spec = get_model(name)
    parts, flats = build_parts(spec, seed=0)
    assert parts.block_numel == spec.block_params and len(flats) == spec.num_layers
    assert parts.resident_numel == spec.resident_params
    assert AutoConfig.for_model(spec.family).model_type == spec.family
