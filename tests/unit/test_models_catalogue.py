"""ModelSpec's parameter counts match transformers' own classes (built on the meta device)."""

from __future__ import annotations

import pytest
import torch
import transformers

from zoplan.catalogue import CATALOGUE_CONFIGS
from zoplan.models import get_model


def build_meta(config: dict):
    cfg = dict(config)
    hf_config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(hf_config)


def decoder_layers(model, family: str):
    from zoexec.model.families import ADAPTERS

    return ADAPTERS[family].get_layers(model)


@pytest.mark.parametrize("name", sorted(CATALOGUE_CONFIGS))
def test_param_counts_match_transformers(name):
    spec = get_model(name)
    model = build_meta(CATALOGUE_CONFIGS[name])
    # parameters() yields a tied weight once: the tied head is counted once
    total = sum(p.numel() for p in model.parameters())
    layers = decoder_layers(model, spec.family)
    block = sum(p.numel() for p in layers[0].parameters())
    matmul = sum(p.numel() for p in layers[0].parameters() if p.dim() == 2)
    assert len(layers) == spec.num_layers
    assert total == spec.total_params, f"{name}: HF {total:,} vs spec {spec.total_params:,}"
    assert block == spec.block_params, f"{name}: HF {block:,} vs spec {spec.block_params:,}"
    assert matmul == spec.matmul_params_per_block
    head_tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert head_tied == spec.tied_head
