"""Qwen2 and Qwen2.5 (model_type "qwen2"): Llama's block with biases on q, k and v.

- embeddings, rotary, final norm: as Llama; small models tie the head;
- layers: model.layers (Qwen2DecoderLayer: q_proj, k_proj, v_proj carry biases, o_proj
  none); use_sliding_window with max_window_layers makes the later layers slide: run
  while a sequence fits in the window (adapter.one_mask), refused beyond it.
"""

from __future__ import annotations

from zoexec.model.adapter import Adapter, final_norm, refuse_rope_scaling_per_layer, rotary_embed

ADAPTER = Adapter(model_type="qwen2", body="model", layer_class="Qwen2DecoderLayer",
                  embed=rotary_embed, final=final_norm("norm"),
                  refuse=refuse_rope_scaling_per_layer)
