"""Prefix tuning on the working decoder block, in PEFT's format (zoplan.prefix).

Each block's attention sees `tokens` (P) prefix keys and values before the input's, as
PEFT's prefix tuning feeds them (peft PrefixTuningConfig, prefix_projection False): a
key/value cache of P entries per layer, the input's tokens at positions P..P+L-1,
attending to every prefix entry and to the input causally. zoexec gives the working
block that cache through the one method transformers' attention modules call on one,
`update(key_states, value_states, layer_idx)` (PrefixCache: it returns the prefix joined
to the input's keys and values and keeps nothing), and the positions and mask through
the family's own embed run over P placeholder tokens and the input, cut after the P
(prefix_embed): the input's hidden states, positions and mask rows are then the ones
the HF model makes with a P-entry cache. Families whose attention takes a cache that
way: PREFIX_FAMILIES; others are refused with one line.

A block's prefix, in ONE flat fp32 buffer per block (z order: zo.z_block with the
block's specs): the keys [P, kv_dim], then the values [P, kv_dim] (kv_dim = key/value
heads x head dim; position p's key of head h at [p, h*head_dim:(h+1)*head_dim]).
Initialisation as MeZO's prefix runs (`--prefix_init_by_real_act`): the keys and values
the base computes for P tokens drawn uniformly from the vocabulary (seeded by the run
seed), block by block, so a fresh prefix makes the model behave as if those P tokens
preceded every input.

Saved prefixes (a snapshot, final/, best/) are a PEFT prefix-tuning folder:
adapter_model.safetensors with "prompt_embeddings" [P, num_layers * 2 * kv_dim] (row p:
layer 0's key, its value, layer 1's key, ...: peft PeftModel.get_prompt's layout),
adapter_config.json (PrefixTuningConfig: num_virtual_tokens P, token_dim kv_dim,
num_attention_heads = key/value heads, num_layers), the base's tokenizer and state.json
(the step, what ties it to the run and the sha256 of every other file, as a LoRA
folder's), so peft.PeftModel.from_pretrained(base, folder) loads them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from zoexec.maths.zo import mix_seed
from zoexec.model.adapter import Context
from zoexec.model.export import SaveState
from zoexec.model.families import ModelParts, TensorSpec, bind_block, make_specs
from zoexec.model.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS, _read_json, write_peft_folder
from zoplan.errors import ZoError

PREFIX_TAG = 0x50726678            # "Prfx": the prefix's init seeds, apart from others
PREFIX_FAMILIES = ("opt", "llama", "mistral", "qwen2", "qwen3")
PROMPT_KEY = "prompt_embeddings"   # PEFT's key of a prompt-learning adapter's weights
CTX_KEYS = {"attention_mask", "position_ids", "position_embeddings"}


@dataclass(frozen=True, kw_only=True)
class PrefixSpec:
    """The prefix of one block: its tokens, the key/value heads and head size, and the
    specs of its two tensors (keys, values) in the flat buffer."""

    tokens: int
    kv_heads: int
    head_dim: int
    specs: tuple[TensorSpec, ...]

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def numel(self) -> int:
        return self.specs[-1].stop


def prefix_spec(parts: ModelParts, *, tokens: int) -> PrefixSpec:
    """The prefix of `parts`' blocks; ZoError for a family whose attention takes no
    cache the way PrefixCache gives it."""
    if parts.family not in PREFIX_FAMILIES:
        raise ZoError(f"--tuning prefix: not for {parts.family} models (zoexec feeds the prefix "
                      f"to the attention of {', '.join(PREFIX_FAMILIES)})")
    config = parts.config
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    shape = torch.empty(tokens, kv_heads * head_dim, device="meta")
    return PrefixSpec(tokens=tokens, kv_heads=kv_heads, head_dim=head_dim,
                      specs=tuple(make_specs([("prefix_key", shape), ("prefix_value", shape)])))


class PrefixCache:
    """The cache a working block's attention is given: its `update` returns the bound
    prefix's keys and values joined before the input's (the batch's rows share them),
    and keeps nothing. `capture` instead records the input's own keys and values and
    returns them unchanged (the initialisation)."""

    def __init__(self, spec: PrefixSpec) -> None:
        self.spec = spec
        self.key: torch.Tensor | None = None     # [1, kv_heads, P, head_dim] once bound
        self.value: torch.Tensor | None = None
        self.captured: tuple[torch.Tensor, torch.Tensor] | None = None
        self.capture = False

    def bind(self, flat: torch.Tensor) -> None:
        """The prefix: views into `flat` (a block's prefix, spec layout), [1, kv_heads, P,
        head_dim] as the attention holds keys."""
        s = self.spec
        k, v = s.specs
        self.key = flat[k.offset:k.stop].view(1, s.tokens, s.kv_heads, s.head_dim).transpose(1, 2)
        self.value = flat[v.offset:v.stop].view(1, s.tokens, s.kv_heads, s.head_dim).transpose(1, 2)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor,
               layer_idx: int | None = None,
               cache_kwargs: dict[str, Any] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        del layer_idx, cache_kwargs
        if self.capture:
            self.captured = (key_states, value_states)
            return key_states, value_states
        if self.key is None or self.value is None:
            raise RuntimeError("PrefixCache.update before bind: no prefix to join")
        rows = key_states.shape[0]
        key = self.key.to(key_states.dtype).expand(rows, -1, -1, -1)
        value = self.value.to(value_states.dtype).expand(rows, -1, -1, -1)
        return torch.cat([key, key_states], dim=2), torch.cat([value, value_states], dim=2)


def prefix_embed(parts: ModelParts, input_ids: torch.Tensor,
                 cache: PrefixCache) -> tuple[torch.Tensor, Context]:
    """The input's hidden states and the ctx of a block with a P-entry prefix: the
    family's embed over P placeholder tokens and the input (positions 0..P+L-1, the
    causal mask over both), cut after the P; the cache joins the prefix's keys."""
    p = cache.spec.tokens
    ids = torch.cat([input_ids.new_zeros(input_ids.shape[0], p), input_ids], dim=1)
    hidden, ctx = parts.embed(ids)
    unknown = set(ctx) - CTX_KEYS
    if unknown:
        raise ZoError(f"--tuning prefix: a {parts.family} block takes {sorted(unknown)}, which "
                      f"the prefix cannot cut")
    mask = ctx.get("attention_mask")
    if mask is None:   # sdpa without padding: is_causal, made explicit (a bool mask)
        full = ids.shape[1]
        mask = torch.ones(full, full, dtype=torch.bool, device=ids.device).tril()[None, None]
    out: Context = {"attention_mask": mask[..., p:, :], "past_key_values": cache}
    if "position_ids" in ctx:
        out["position_ids"] = ctx["position_ids"][:, p:]
    if "position_embeddings" in ctx:
        out["position_embeddings"] = tuple(t[:, p:] for t in ctx["position_embeddings"])
    return hidden[:, p:], out


def init_prefix(parts: ModelParts, spec: PrefixSpec, *, seed: int, blocks: Iterable[torch.Tensor],
                out: torch.Tensor) -> torch.Tensor:
    """Every block's initial prefix into `out` [blocks, numel] (fp32): the keys and
    values the base computes for P tokens drawn from the vocabulary with the seed
    (MeZO's init by real activations). `blocks`: each block's weights in turn, flat
    (bound as the working block, the forward run on them)."""
    gen = torch.Generator(device="cpu").manual_seed(mix_seed(seed, PREFIX_TAG, 0))
    ids = torch.randint(0, parts.config.vocab_size, (1, spec.tokens), generator=gen)
    cache = PrefixCache(spec)
    cache.capture = True
    k, v = spec.specs
    with torch.no_grad():
        hidden, ctx = parts.embed(ids.to(out.device))
        for index, weights in enumerate(blocks):
            bind_block(parts, weights)
            hidden = parts.block_forward(hidden, {**ctx, "past_key_values": cache})
            if cache.captured is None:
                raise ZoError(f"--tuning prefix: a {parts.family} block's attention took no "
                              f"cache (its keys and values cannot be captured)")
            key, value = (t[0].transpose(0, 1).reshape(spec.tokens, spec.kv_dim)
                          for t in cache.captured)
            cache.captured = None
            out[index, k.offset:k.stop] = key.reshape(-1).float()
            out[index, v.offset:v.stop] = value.reshape(-1).float()
    return out


# ---- PEFT's folder -----------------------------------------------------------------------
def prompt_embeddings(prefixes: torch.Tensor, spec: PrefixSpec) -> torch.Tensor:
    """[P, blocks * 2 * kv_dim]: the [blocks, numel] prefixes in PEFT's layout."""
    blocks = prefixes.shape[0]
    per = prefixes.view(blocks, 2, spec.tokens, spec.kv_dim)          # block, k/v, p, d
    return per.permute(2, 0, 1, 3).reshape(spec.tokens, blocks * 2 * spec.kv_dim).contiguous()


def from_prompt_embeddings(table: torch.Tensor, spec: PrefixSpec, blocks: int) -> torch.Tensor:
    """The inverse of prompt_embeddings: [blocks, numel] fp32."""
    per = table.float().view(spec.tokens, blocks, 2, spec.kv_dim).permute(1, 2, 0, 3)
    return per.reshape(blocks, spec.numel).contiguous()


def save_prefixes(folder: Path, prefixes: torch.Tensor, spec: PrefixSpec, *, base: str,
                  state: SaveState = None, tokenizer_from: Path | None = None) -> Path:
    """Write `folder` atomically as a PEFT prefix-tuning folder (module docstring);
    `state`: as zoexec.model.lora.write_peft_folder takes it."""
    from peft import PrefixTuningConfig

    if not bool(torch.isfinite(prefixes).all()):
        raise ZoError("the prefixes hold non-finite values: not saved (the run diverged; "
                      "resume from an earlier snapshot with a smaller --lr)")
    config = PrefixTuningConfig(
        task_type="CAUSAL_LM", num_virtual_tokens=spec.tokens, token_dim=spec.kv_dim,
        num_attention_heads=spec.kv_heads, num_layers=prefixes.shape[0],
        encoder_hidden_size=spec.kv_dim, prefix_projection=False,
        num_transformer_submodules=1, base_model_name_or_path=base)
    tensors = {PROMPT_KEY: prompt_embeddings(prefixes.cpu().float(), spec)}
    return write_peft_folder(folder, tensors, config, state=state, tokenizer_from=tokenizer_from)


def prefix_settings(folder: Path) -> dict[str, Any]:
    """A PEFT prefix-tuning folder's {"tokens", "layers", "base"}; ZoError for one
    zoexec does not compute (a projection, more submodules)."""
    folder = Path(folder)
    config = _read_json(folder / ADAPTER_CONFIG)
    if config.get("peft_type") != "PREFIX_TUNING":
        raise ZoError(f"{folder / ADAPTER_CONFIG}: peft_type {config.get('peft_type')!r}, not "
                      f"PREFIX_TUNING")
    if config.get("prefix_projection") or config.get("num_transformer_submodules", 1) != 1:
        raise ZoError(f"{folder / ADAPTER_CONFIG}: a prefix with a projection or for "
                      f"encoder-decoders: zoexec trains and reads plain prefixes only")
    tokens = config.get("num_virtual_tokens")
    if not isinstance(tokens, int) or tokens < 1:
        raise ZoError(f"{folder / ADAPTER_CONFIG}: num_virtual_tokens {tokens!r}")
    return {"tokens": tokens, "layers": config.get("num_layers"),
            "base": config.get("base_model_name_or_path")}


def load_prefixes(folder: Path, spec: PrefixSpec, *, num_blocks: int) -> torch.Tensor:
    """The [blocks, numel] fp32 prefixes of a folder save_prefixes (or PEFT) wrote: its
    weights file checked (zoexec.model.lora.check_adapter_file), its tokens, layers and
    table shape against `spec` (ZoError naming what differs)."""
    from safetensors.torch import load_file

    from zoexec.model.lora import check_adapter_file

    folder = Path(folder)
    settings = prefix_settings(folder)
    if (settings["tokens"], settings["layers"]) != (spec.tokens, num_blocks):
        raise ZoError(f"{folder}: a prefix of {settings['tokens']} tokens over "
                      f"{settings['layers']} layers, the plan's is {spec.tokens} over {num_blocks}")
    check_adapter_file(folder)
    tensors = load_file(str(folder / ADAPTER_WEIGHTS))
    table = tensors.get(PROMPT_KEY)
    want = (spec.tokens, num_blocks * 2 * spec.kv_dim)
    if table is None or tuple(table.shape) != want or len(tensors) != 1:
        raise ZoError(f"{folder / ADAPTER_WEIGHTS}: expected one tensor {PROMPT_KEY} of shape "
                      f"{want}, found {[(k, tuple(t.shape)) for k, t in tensors.items()]}")
    return from_prompt_embeddings(table, spec, num_blocks)


def is_prefix_folder(folder: Path | str | None) -> bool:
    """A PEFT prefix-tuning folder (its adapter_config.json says so)?"""
    if folder is None or not (Path(folder) / ADAPTER_CONFIG).is_file():
        return False
    try:
        peft_type: object = json.loads((Path(folder) / ADAPTER_CONFIG).read_text()).get("peft_type")
        return peft_type == "PREFIX_TUNING"
    except (OSError, ValueError, AttributeError):
        return False

