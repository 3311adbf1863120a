"""Gemma 1 and Gemma 2: scaled embeddings, (1 + w) RMSNorms, a tied head.

Gemma ("gemma"):
- embeddings: model.embed_tokens is GemmaTextScaledWordEmbedding, which multiplies by
  sqrt(hidden) itself (in the weights' dtype, as transformers does: sqrt(3072) becomes
  55.5 in bf16); rotary as Llama;
- layers: model.layers (GemmaDecoderLayer: RMSNorm scales by 1 + weight, GeGLU MLP,
  head_dim independent of hidden);
- after the last block: model.norm; the head is tied to the embeddings.
Gemma 2 ("gemma2") adds, all inside Gemma2DecoderLayer except the last:
- sandwich norms (a norm after attention and after the MLP as well as before);
- attention logits soft-capped (tanh) and scaled by query_pre_attn_scalar: sdpa has
  no soft cap, so Gemma 2 runs "eager" attention (transformers refuses sdpa too);
- alternate layers slide over a window (4096): run while a sequence fits in it
  (adapter.one_mask), refused beyond it;
- the logits soft-capped by final_logit_softcapping (Adapter.logit_softcap).
Gemma 3 is not supported: its local and global layers use different rotary bases,
which one working block cannot reproduce.
"""

from __future__ import annotations

from zoexec.model.adapter import Adapter, final_norm, refuse_rope_scaling_per_layer, rotary_embed

GEMMA = Adapter(model_type="gemma", body="model", layer_class="GemmaDecoderLayer",
                embed=rotary_embed, final=final_norm("norm"),
                refuse=refuse_rope_scaling_per_layer)

GEMMA2 = Adapter(model_type="gemma2", body="model", layer_class="Gemma2DecoderLayer",
                 embed=rotary_embed, final=final_norm("norm"),
                 refuse=refuse_rope_scaling_per_layer, attn_implementations=("eager",),
                 logit_softcap="final_logit_softcapping")
