"""Llama (2, 3, SmolLM and the like): rotary positions, RMSNorm, a gated SiLU MLP.

- embeddings: model.embed_tokens; rotary (cos, sin) from model.rotary_emb (its
  rope_parameters: default, llama3, linear, dynamic... are transformers' own code);
- layers: model.layers (LlamaDecoderLayer; attention_bias and mlp_bias as the config
  says; grouped-query attention);
- after the last block: model.norm; the head tied or not as tie_word_embeddings says.
"""

from __future__ import annotations

from zoexec.model.adapter import Adapter, final_norm, refuse_rope_scaling_per_layer, rotary_embed

ADAPTER = Adapter(model_type="llama", body="model", layer_class="LlamaDecoderLayer",
                  embed=rotary_embed, final=final_norm("norm"),
                  refuse=refuse_rope_scaling_per_layer)
