"""GPT-2 (model_type "gpt2"): learned positions, LayerNorm, Conv1D weights.

- embeddings: transformer.wte plus the learned positions transformer.wpe;
- layers: transformer.h (GPT2Block): c_attn is ONE fused q/k/v projection, and every
  projection is a Conv1D whose weight is [in, out], transposed relative to nn.Linear's
  [out, in] (the block runs HF's own Conv1D, so only a converter that reads other
  formats, such as GGUF, must transpose); biases everywhere, GELU MLP;
- after the last block: transformer.ln_f; the head is tied to wte.
Checkpoints saved by older transformers carry attn.bias / attn.masked_bias mask
buffers (ignored) and no "transformer." prefix (a base model's names, read as such).
Refused: scale_attn_by_inverse_layer_idx (each layer would scale its attention
differently: one working block runs every layer) and cross-attention.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from zoexec.model.adapter import Adapter, Context, causal_mask, final_norm, positions

if TYPE_CHECKING:
    from transformers import PretrainedConfig


def embed(body: nn.Module, config: PretrainedConfig,
          input_ids: torch.Tensor) -> tuple[torch.Tensor, Context]:
    """What GPT2Model.forward gives its first block (no token types)."""
    inputs_embeds = body.wte(input_ids)
    position_ids = positions(input_ids)
    mask = causal_mask(config, inputs_embeds)
    hidden = inputs_embeds + body.wpe(position_ids)
    return hidden, {"attention_mask": mask, "position_ids": position_ids}


def refuse(config: PretrainedConfig) -> str | None:
    if getattr(config, "scale_attn_by_inverse_layer_idx", False):
        return "scale_attn_by_inverse_layer_idx (a different attention scale per layer)"
    if getattr(config, "add_cross_attention", False):
        return "add_cross_attention (an encoder-decoder GPT-2)"
    return None


ADAPTER = Adapter(model_type="gpt2", body="transformer", layers="h", layer_class="GPT2Block",
                  embed=embed, final=final_norm("ln_f"), refuse=refuse,
                  ignored=(".attn.bias", ".attn.masked_bias"))
