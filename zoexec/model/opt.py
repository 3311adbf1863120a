"""OPT (facebook/opt-*): learned positions offset by 2, optional project_in/out.

- embeddings: embed_tokens, then project_in (OPT-350m: 512 -> hidden) plus the learned
  positions of OPTLearnedPositionalEmbedding (its offset of 2 is the module's own);
- layers: model.decoder.layers (OPTDecoderLayer: LayerNorm before or after attention
  as do_layer_norm_before says, biases everywhere, ReLU MLP);
- after the last block: final_layer_norm (absent in post-LN OPT-350m) and project_out;
- the head is tied to embed_tokens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from zoexec.model.adapter import Adapter, Context, causal_mask, positions

if TYPE_CHECKING:
    from transformers import PretrainedConfig


def embed(body: nn.Module, config: PretrainedConfig,
          input_ids: torch.Tensor) -> tuple[torch.Tensor, Context]:
    """What OPTDecoder.forward gives its first layer."""
    inputs_embeds = body.embed_tokens(input_ids)
    position_ids = positions(input_ids)
    mask = causal_mask(config, inputs_embeds)
    pos_embeds = body.embed_positions(None, 0, position_ids=position_ids)
    if body.project_in is not None:
        inputs_embeds = body.project_in(inputs_embeds)
    return inputs_embeds + pos_embeds, {"attention_mask": mask, "position_ids": position_ids}


def final(body: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    if body.final_layer_norm is not None:
        hidden = body.final_layer_norm(hidden)
    if body.project_out is not None:
        hidden = body.project_out(hidden)
    return hidden


ADAPTER = Adapter(model_type="opt", body="model.decoder", layer_class="OPTDecoderLayer",
                  embed=embed, final=final)
