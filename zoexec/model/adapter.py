"""What a model family declares so that zoexec can take it apart into blocks.

An `Adapter` names where the decoder layers sit in the HF *ForCausalLM (`body` and
`layers`: "model.layers", "transformer.h", ...), the decoder-layer class, how the
hidden states entering block 0 and the context every block needs are made (`embed`:
token embeddings, learned or rotary positions, the causal mask), what runs between the
last block and the LM head (`final`: the final norm, OPT's project_out), what happens
to the logits (Gemma 2's soft-capping), what a config may ask that the block pipeline
cannot reproduce (`refuse`), which attention kernels give the HF model's own forward,
and the names older checkpoints give some tensors. Everything inside a block (norms,
q/k/v biases, fused qkv, Conv1D weights, parallel residuals, sandwich norms, attention
soft-capping) is the transformers layer module's own code: the adapter never rewrites
a layer, it feeds it what the HF model's forward feeds it.

One family per file beside this one (opt.py, llama.py, ...); families.py holds the
registry and the common core. The helpers here are the pieces several families share.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from zoplan.errors import ZoError

if TYPE_CHECKING:
    from transformers import PretrainedConfig

ATTN_IMPLEMENTATIONS = ("sdpa", "eager")
# What every decoder layer is called with besides the hidden states (keywords: the
# attention mask, position ids, rotary (cos, sin)...): whatever the family's layer takes.
Context = dict[str, Any]


def _nothing(config: PretrainedConfig) -> str | None:
    del config
    return None


def _identity(body: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    del body
    return hidden


@dataclass(frozen=True, kw_only=True)
class Adapter:
    """One model family (an HF `model_type`); see the module docstring."""

    model_type: str
    body: str                       # attribute path of the decoder in the *ForCausalLM
    layer_class: str                # the decoder-layer class in the family's modeling module
    embed: Callable[[nn.Module, PretrainedConfig, torch.Tensor], tuple[torch.Tensor, Context]]
    final: Callable[[nn.Module, torch.Tensor], torch.Tensor] = _identity
    layers: str = "layers"          # the ModuleList of decoder layers in `body`
    refuse: Callable[[PretrainedConfig], str | None] = _nothing
    attn_implementations: tuple[str, ...] = ATTN_IMPLEMENTATIONS
    logit_softcap: str = ""         # config key of a tanh soft cap on the logits
    renames: dict[str, str] = field(default_factory=dict)   # our name -> older checkpoints' name
    ignored: tuple[str, ...] = ()   # checkpoint tensor suffixes that are not weights

    def __post_init__(self) -> None:
        if not self.model_type or not self.body or not self.layer_class:
            raise ValueError(f"adapter {self.model_type!r}: model_type, body and layer_class "
                             f"are required")
        bad = set(self.attn_implementations) - set(ATTN_IMPLEMENTATIONS)
        if not self.attn_implementations or bad:
            raise ValueError(f"attn_implementations {self.attn_implementations!r}: use "
                             f"{', '.join(ATTN_IMPLEMENTATIONS)}")

    @property
    def layer_prefix(self) -> str:
        """State-dict prefix of decoder layer i's tensors, before "i."."""
        return f"{self.body}.{self.layers}."

    def decoder(self, model: nn.Module) -> nn.Module:
        return model.get_submodule(self.body)

    def get_layers(self, model: nn.Module) -> nn.ModuleList:
        return getattr(self.decoder(model), self.layers)

    def set_layers(self, model: nn.Module, layers: nn.ModuleList) -> None:
        setattr(self.decoder(model), self.layers, layers)

    def logits(self, model: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        """The final norm (and the like), the LM head and any soft cap, as the HF
        model's forward applies them."""
        return self._capped(model, model.lm_head(self.final(self.decoder(model), hidden)))

    def token_logits(self, model: nn.Module, hidden: torch.Tensor,
                     tokens: torch.Tensor) -> torch.Tensor:
        """logits(hidden[i])[tokens[i]] for each of the N rows of `hidden` [N, h] and
        `tokens` [N, C], from the LM head's rows of those tokens alone (N x C x h work,
        not N x vocab x h: the whole logits are never made). An LM head other than a
        plain nn.Linear (an adapter around it) takes the whole logits and gathers."""
        head = model.lm_head
        if type(head) is not nn.Linear:
            return self.logits(model, hidden).gather(1, tokens)
        final = self.final(self.decoder(model), hidden)
        rows = head.weight[tokens]                                 # [N, C, h]
        out = torch.bmm(rows, final.unsqueeze(-1)).squeeze(-1)     # [N, C]
        if head.bias is not None:
            out = out + head.bias[tokens]
        return self._capped(model, out)

    def _capped(self, model: nn.Module, logits: torch.Tensor) -> torch.Tensor:
        cap = getattr(model.config, self.logit_softcap, None) if self.logit_softcap else None
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits


# ---- pieces the families share ------------------------------------------------------
def positions(input_ids: torch.Tensor) -> torch.Tensor:
    """Position ids 0..seq-1 as the HF models make them without a cache: [1, seq]."""
    return torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)


def causal_mask(config: PretrainedConfig, inputs_embeds: torch.Tensor, *,
                sliding: bool = False) -> torch.Tensor | None:
    """transformers' own causal mask (None with sdpa and no padding: is_causal), or
    its sliding-window one, for the positions 0..seq-1 of every row (`positions`).
    transformers is given no position ids: given some, it reads them back from the
    device to look for packed sequences (a host wait at every embed on a GPU), and
    0..seq-1 are the ones it assumes without them."""
    from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

    make = create_sliding_window_causal_mask if sliding else create_causal_mask
    return make(config=config, inputs_embeds=inputs_embeds, attention_mask=None,
                past_key_values=None, position_ids=None)


def one_mask(config: PretrainedConfig, inputs_embeds: torch.Tensor) -> torch.Tensor | None:
    """The mask every block uses. One working block runs every layer, so all layers
    must see the same mask: layers that all slide get the sliding-window mask, layers
    that all attend fully the causal one; a model mixing both (Qwen2/Qwen3 with
    max_window_layers, Gemma 2) only while the sequence fits in the window, where the
    two masks are equal. A longer sequence is refused, never run wrong."""
    window = getattr(config, "sliding_window", None)
    types = list(getattr(config, "layer_types", None) or [])
    sliding = sum(t == "sliding_attention" for t in types)
    if not types:                                   # Mistral: sliding_window alone decides
        return causal_mask(config, inputs_embeds, sliding=window is not None)
    if sliding == len(types):
        return causal_mask(config, inputs_embeds, sliding=True)
    seq = inputs_embeds.shape[1]
    if sliding and window is not None and seq > window:
        raise ZoError(f"{config.model_type}: {sliding} of {len(types)} layers use a "
                      f"{window}-token sliding window and the others full attention; "
                      f"a sequence of {seq} tokens would need a mask per layer: use "
                      f"sequences of at most {window} tokens")
    return causal_mask(config, inputs_embeds)


def rotary_embed(body: nn.Module, config: PretrainedConfig, input_ids: torch.Tensor, *,
                 embedding: str = "embed_tokens") -> tuple[torch.Tensor, Context]:
    """Token embeddings (a scaled embedding module scales them itself), rotary
    (cos, sin) from the body's rotary_emb, and one_mask: what LlamaModel.forward and
    its kin give every decoder layer."""
    inputs_embeds = getattr(body, embedding)(input_ids)
    position_ids = positions(input_ids)
    mask = one_mask(config, inputs_embeds)
    position_embeddings = body.rotary_emb(inputs_embeds, position_ids)
    return inputs_embeds, {"attention_mask": mask, "position_ids": position_ids,
                           "position_embeddings": position_embeddings}


def final_norm(name: str) -> Callable[[nn.Module, torch.Tensor], torch.Tensor]:
    """`final` of a family whose decoder ends in the norm module `name`."""
    def apply(body: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        return getattr(body, name)(hidden)

    apply.__name__ = f"final_{name}"
    return apply


def refuse_rope_scaling_per_layer(config: PretrainedConfig) -> str | None:
    """Rotary settings that differ between layers cannot share one working block."""
    params = getattr(config, "rope_parameters", None) or {}
    if isinstance(params, dict) and set(params) & {"full_attention", "sliding_attention"}:
        return "rotary parameters per layer type (one working block runs every layer)"
    return None
