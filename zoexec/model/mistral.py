"""Mistral (7B v0.1-v0.3 and the like): Llama's block, every layer sliding or none.

- embeddings, rotary, final norm: as Llama;
- layers: model.layers (MistralDecoderLayer, no biases); sliding_window (4096 in v0.1,
  null later) applies to every layer alike, so the one mask is the sliding-window mask
  whenever the config sets a window (adapter.one_mask), exact at any length.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zoexec.model.adapter import Adapter, final_norm, refuse_rope_scaling_per_layer, rotary_embed

if TYPE_CHECKING:
    from transformers import PretrainedConfig


def refuse(config: PretrainedConfig) -> str | None:
    if getattr(config, "layer_types", None):
        return "layer_types (alternating attention is Ministral's, not Mistral's)"
    return refuse_rope_scaling_per_layer(config)


ADAPTER = Adapter(model_type="mistral", body="model", layer_class="MistralDecoderLayer",
                  embed=rotary_embed, final=final_norm("norm"), refuse=refuse)
