"""zoexec.model.prefix on one process, tiny models with random weights: the block
pipeline with a prefix computes what PEFT's prefix tuning does with the folder
save_prefixes writes (OPT: learned positions; Llama: rotary, grouped-query attention;
Qwen3), the initial prefix makes the model behave as if its seeded tokens preceded the
input, and a folder round-trips (a changed one is refused)."""

from __future__ import annotations

import json

import pytest
import torch

from zoexec.model.families import bind_block, build_hf_model
from zoexec.model.prefix import (
    PrefixCache,
    init_prefix,
    load_prefixes,
    prefix_embed,
    prefix_spec,
    save_prefixes,
)
from zoexec.model.saved import folder_checksums
from zoexec.store.loading import build_parts
from zoplan.errors import ZoError

SEED, TOKENS = 5, 3


def _pipeline_logits(parts, flats, prefixes, spec, ids) -> torch.Tensor:
    cache = PrefixCache(spec)
    with torch.no_grad():
        hidden, ctx = prefix_embed(parts, ids, cache)
        for block, flat in enumerate(flats):
            bind_block(parts, flat)
            cache.bind(prefixes[block])
            hidden = parts.block_forward(hidden, ctx)
        return parts.logits(hidden)


@pytest.mark.parametrize("model", ["tiny-opt", "tiny-llama", "tiny-qwen3"])
def test_the_pipeline_with_a_prefix_is_pefts_prefix_tuning(model, tmp_path):
    from peft import PeftModel

    parts, flats = build_parts(model, seed=SEED)
    spec = prefix_spec(parts, tokens=TOKENS)
    gen = torch.Generator().manual_seed(0)
    prefixes = torch.randn(len(flats), spec.numel, generator=gen)
    save_prefixes(tmp_path / "final", prefixes, spec, base=model,
                  state=lambda tmp: {"step": 0, "files": folder_checksums(tmp)})
    ids = torch.randint(4, 60, (2, 7), generator=gen)
    ours = _pipeline_logits(parts, flats, prefixes, spec, ids)
    peft_model = PeftModel.from_pretrained(build_hf_model(model, seed=SEED), str(tmp_path / "final"))
    with torch.no_grad():
        theirs = peft_model(input_ids=ids).logits
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)
    assert torch.equal(load_prefixes(tmp_path / "final", spec, num_blocks=len(flats)), prefixes)


@pytest.mark.parametrize("model", ["tiny-opt", "tiny-llama"])
def test_the_initial_prefix_is_the_base_on_seeded_tokens_before_the_input(model):
    """MeZO's init by real activations: the prefix is the keys and values of P tokens
    drawn with the seed, so the prefixed model's logits are the base's on those P
    tokens followed by the input (at the input's positions)."""
    parts, flats = build_parts(model, seed=SEED)
    spec = prefix_spec(parts, tokens=TOKENS)
    prefixes = init_prefix(parts, spec, seed=SEED, blocks=iter(flats),
                           out=torch.zeros(len(flats), spec.numel))
    again = init_prefix(parts, spec, seed=SEED, blocks=iter(flats),
                        out=torch.zeros(len(flats), spec.numel))
    assert torch.equal(prefixes, again) and prefixes.abs().sum() > 0
    ids = torch.randint(4, 60, (2, 6), generator=torch.Generator().manual_seed(1))
    ours = _pipeline_logits(parts, flats, prefixes, spec, ids)
    from zoexec.maths.zo import mix_seed
    from zoexec.model.prefix import PREFIX_TAG

    gen = torch.Generator().manual_seed(mix_seed(SEED, PREFIX_TAG, 0))
    tokens = torch.randint(0, parts.config.vocab_size, (1, TOKENS), generator=gen)
    hf = build_hf_model(model, seed=SEED)
    with torch.no_grad():
        full = hf(input_ids=torch.cat([tokens.expand(2, -1), ids], dim=1)).logits
    torch.testing.assert_close(ours, full[:, TOKENS:], rtol=1e-4, atol=1e-4)


def test_a_prefix_folder_that_is_not_the_plans_is_refused(tmp_path):
    parts, flats = build_parts("tiny-opt", seed=SEED)
    spec = prefix_spec(parts, tokens=TOKENS)
    save_prefixes(tmp_path / "p", torch.zeros(len(flats), spec.numel), spec, base="b",
                  state=lambda tmp: {"step": 1, "files": folder_checksums(tmp)})
    with pytest.raises(ZoError, match="a prefix of 3 tokens over 4 layers, the plan's is 4"):
        load_prefixes(tmp_path / "p", prefix_spec(parts, tokens=4), num_blocks=len(flats))
    with (tmp_path / "p" / "adapter_model.safetensors").open("r+b") as handle:
        handle.seek(-1, 2)
        handle.write(b"\x01")
    with pytest.raises(ZoError, match="adapter_model.safetensors changed"):
        load_prefixes(tmp_path / "p", spec, num_blocks=len(flats))
    config = json.loads((tmp_path / "p" / "adapter_config.json").read_text())
    assert (config["peft_type"], config["num_virtual_tokens"], config["prefix_projection"]) == \
        ("PREFIX_TUNING", 3, False)
    parts_g, _ = build_parts("tiny-gpt2", seed=SEED)
    with pytest.raises(ZoError, match="--tuning prefix: not for gpt2 models"):
        prefix_spec(parts_g, tokens=2)
