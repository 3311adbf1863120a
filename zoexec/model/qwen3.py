"""Qwen3: Llama's block plus a per-head RMSNorm of q and k (q_norm, k_norm).

- embeddings, rotary, final norm: as Llama (model.embed_tokens, model.rotary_emb,
  model.norm); the small models tie the head to the embeddings;
- layers: model.layers (Qwen3DecoderLayer); layer_types may mix sliding-window and
  full attention (use_sliding_window, max_window_layers): run while a sequence fits in
  the window (adapter.one_mask), refused beyond it.
"""

from __future__ import annotations

from zoexec.model.adapter import Adapter, final_norm, refuse_rope_scaling_per_layer, rotary_embed

ADAPTER = Adapter(model_type="qwen3", body="model", layer_class="Qwen3DecoderLayer",
                  embed=rotary_embed, final=final_norm("norm"),
                  refuse=refuse_rope_scaling_per_layer)
