"""GPT-NeoX (Pythia, GPT-NeoX-20B; model_type "gpt_neox"): fused qkv, parallel residual.

- embeddings: gpt_neox.embed_in; rotary (cos, sin) from gpt_neox.rotary_emb over the
  first rotary_pct of each head (partial rotary: transformers' own code);
- layers: gpt_neox.layers (GPTNeoXLayer): ONE query_key_value projection whose output
  interleaves q, k, v per head; with use_parallel_residual (the default) attention and
  MLP both read the block's input and are added together (x + attn(ln1 x) + mlp(ln2 x)),
  else one after the other; LayerNorms and biases, GELU MLP;
- after the last block: gpt_neox.final_layer_norm; the head (lm_head, "embed_out" in
  checkpoints of older transformers) is not tied.
Checkpoints may carry attention.bias / attention.masked_bias mask buffers (ignored).
"""

from __future__ import annotations

import functools

from zoexec.model.adapter import Adapter, final_norm, refuse_rope_scaling_per_layer, rotary_embed

ADAPTER = Adapter(model_type="gpt_neox", body="gpt_neox", layer_class="GPTNeoXLayer",
                  embed=functools.partial(rotary_embed, embedding="embed_in"),
                  final=final_norm("final_layer_norm"), refuse=refuse_rope_scaling_per_layer,
                  renames={"lm_head.weight": "embed_out.weight"},
                  ignored=(".attention.bias", ".attention.masked_bias"))
