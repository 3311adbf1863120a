"""The common core of the model families: the resident parts plus ONE working decoder
block bound to flat buffers; what differs between families is in one adapter file each
(adapter.py says what an adapter declares; opt.py, llama.py, qwen3.py, qwen2.py,
mistral.py, gemma.py, gpt2.py, gptneox.py), registered in ADAPTERS here.

A model is split into
- `resident`: the HF *ForCausalLM module with its decoder layers removed; it keeps the
  token (and learned position) embeddings, OPT's project_in/out, the final norm, the LM
  head (tied to the embeddings where the config says so) and the rotary embedding. It
  lives on the compute device in the compute dtype and is trained too (z block id -1).
- the decoder blocks: one flat 1-D tensor per block (param dtype) holding its tensors in
  `block_specs` order, and ONE decoder-layer module, `block`, whose parameters are made
  views into whichever flat buffer is bound (`bind_block`), so a rank needs a single
  module however many blocks it streams.

The forward runs the transformers 5.x layer modules themselves with the inputs their
*Model.forward builds (the adapter's `embed`: a causal mask from transformers' own
mask functions, position ids, rotary (cos, sin) where the family has them).
Attention is "sdpa" where the family allows it ("auto"), for the HF reference model as
well: with no padding the causal mask is then None (sdpa's is_causal), so the block
context does not depend on the batch size ("eager" also works; its mask is
[batch, 1, seq, seq]; Gemma 2 runs eager only). Dropout is off (eval mode); no KV cache.
The loss is transformers' ForCausalLMLoss (fp32 logits, shift by one, mean). One
working block runs every layer, so a layer must not behave by its index: configs that
would (GPT-2's scale_attn_by_inverse_layer_idx, Gemma 3's per-layer rotary bases) are
refused, and a model mixing sliding-window and full layers runs only sequences that fit
in the window (adapter.one_mask).

Building never makes the whole model in one place: a Blueprint (the *ForCausalLM
without decoder layers + one template decoder layer, uninitialised) is filled block by
block (zoexec.store.loading). A random init is defined per block: block b is the model
class's own _init_weights applied to one decoder layer from seed init_seed(seed, b),
the resident parts likewise from init_seed(seed, -1), so build_parts, build_hf_model
and the node's store hold the same weights. The resident modules are bound to
`resident_master` (param dtype) cast to the compute dtype.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import torch
from torch import nn

from zoexec.data.batch import IGNORE, shifted
from zoexec.maths.zo import RESIDENT_BLOCK, mix_seed
from zoexec.model import gemma, gpt2, gptneox, llama, mistral, opt, qwen2, qwen3
from zoexec.model.adapter import Adapter, Context
from zoplan.errors import ZoError
from zoplan.modeldir import weight_files
from zoplan.models import UNSUPPORTED, ModelSpec

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

    # the model asked for: a catalogue name, a ModelSpec, an HF config or its dict
    ModelGiven: TypeAlias = str | ModelSpec | PretrainedConfig | Mapping[str, Any]

TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
ADAPTERS: dict[str, Adapter] = {a.model_type: a for a in (
    opt.ADAPTER, llama.ADAPTER, qwen3.ADAPTER, qwen2.ADAPTER, mistral.ADAPTER,
    gemma.GEMMA, gemma.GEMMA2, gpt2.ADAPTER, gptneox.ADAPTER)}


def torch_dtype(name: str | torch.dtype) -> torch.dtype:
    """torch dtype of a precision name ("fp32", "fp16", "bf16"); dtypes pass through."""
    if isinstance(name, torch.dtype):
        return name
    try:
        return TORCH_DTYPES[name]
    except KeyError:
        raise ZoError(f"unknown precision {name!r}; use one of {', '.join(TORCH_DTYPES)}") from None


@dataclass(frozen=True, kw_only=True)
class TensorSpec:
    """One tensor inside a flat buffer; `decay` is False for biases and norm weights."""

    name: str
    shape: tuple[int, ...]
    numel: int
    offset: int
    decay: bool

    @property
    def stop(self) -> int:
        return self.offset + self.numel


def make_specs(named: list[tuple[str, torch.Tensor]]) -> list[TensorSpec]:
    """Consecutive specs for named tensors; decay applies to matrices (ndim >= 2) only,
    i.e. not to biases nor to LayerNorm/RMSNorm weights (MeZO's rule)."""
    specs, offset = [], 0
    for name, tensor in named:
        specs.append(TensorSpec(name=name, shape=tuple(tensor.shape), numel=tensor.numel(),
                                offset=offset, decay=tensor.dim() >= 2))
        offset += tensor.numel()
    return specs


@dataclass(kw_only=True, eq=False)
class ModelParts:
    """Resident modules + one working block; see the module docstring."""

    family: str
    adapter: Adapter
    config: PretrainedConfig
    dtype: torch.dtype
    resident: nn.Module
    block: nn.Module
    block_specs: list[TensorSpec]
    block_numel: int
    num_blocks: int = 0
    param_dtype: torch.dtype = torch.float32
    resident_specs: list[TensorSpec] = field(default_factory=list)
    resident_numel: int = 0
    resident_master: torch.Tensor | None = None   # flat resident weights, param dtype

    # ---- the forward, piece by piece ---------------------------------------------
    def embed(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, Context]:
        """Hidden states entering block 0 and the ctx every block needs (a kwargs dict)."""
        return self.adapter.embed(self.adapter.decoder(self.resident), self.config, input_ids)

    def block_forward(self, hidden: torch.Tensor, ctx: Context) -> torch.Tensor:
        """Run the working block (whatever flat buffer is bound) on `hidden`."""
        return self.block(hidden, **ctx)

    def head_loss(self, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Final norm (+ OPT's project_out) + LM head + mean next-token CE over the
        labelled positions (float64 scalar: the sum over the count, as the engine
        divides the world's sums)."""
        total, count = self.head_loss_sum(hidden, labels)
        return total.double() / count

    def head_loss_sum(self, hidden: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
        """(sum of the next-token CE over the labelled positions (fp32 scalar), their
        count). `labels` [B, S]: the token each position holds, -100 where it is not
        predicted (HF's convention: the shift happens here)."""
        return causal_lm_loss_sum(self.logits(hidden), labels)

    def head_row_losses(self, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Per row: [sum of the next-token CE over its labelled positions, their count]
        (float64 [B, 2]), for evaluation (a candidate's log-likelihood is -its sum)."""
        return causal_lm_row_losses(self.logits(hidden), labels)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The final norm, the LM head and any soft cap (the adapter's)."""
        return self.adapter.logits(self.resident, hidden)

    def token_logits(self, hidden: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """The logits of `tokens` [N, C] alone at each of the N positions of `hidden`
        (Adapter.token_logits: the LM head's rows of those tokens, no whole logits)."""
        return self.adapter.token_logits(self.resident, hidden, tokens)

    @property
    def layer_prefix(self) -> str:
        return self.adapter.layer_prefix

    def to(self, device: torch.device | str) -> ModelParts:
        """Move resident and block modules (rebind flat buffers afterwards)."""
        self.resident.to(device)
        self.block.to(device)
        return self


def causal_lm_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(sum of next-token CE over the labelled positions, count): transformers'
    ForCausalLMLoss ops with reduction "sum" (its mean is this sum over the count)."""
    logits = logits.float()    # rebinding frees 16-bit logits before the log-softmax
    target = shifted(labels).contiguous()
    per_token = nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), target.view(-1),
                                            ignore_index=IGNORE, reduction="none")
    return per_token.double().sum(), int((target != IGNORE).sum())


def causal_lm_row_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """[sum of next-token CE over each row's labelled positions, their count] per row."""
    logits = logits.float()
    target = shifted(labels).contiguous()
    per_token = nn.functional.cross_entropy(logits.transpose(1, 2), target,
                                            ignore_index=IGNORE, reduction="none")
    return torch.stack([per_token.double().sum(dim=1),
                        (target != IGNORE).sum(dim=1).double()], dim=1)


# ---- binding flat buffers -------------------------------------------------------------
def _bind(params: list[nn.Parameter], specs: list[TensorSpec], flat: torch.Tensor,
          numel: int, what: str) -> None:
    assert flat.dim() == 1 and flat.numel() == numel, (what, tuple(flat.shape), numel)
    for param, spec in zip(params, specs):
        param.data = flat[spec.offset:spec.stop].view(spec.shape)


def bind_block(parts: ModelParts, flat: torch.Tensor) -> None:
    """Make the working block's parameters views into `flat` (no copy): writing `flat`
    changes the block's weights. `flat` is 1-D, block_numel long, compute dtype."""
    assert flat.dtype == parts.dtype, (flat.dtype, parts.dtype)
    _bind(list(parts.block.parameters()), parts.block_specs, flat, parts.block_numel, "block")


def bind_resident(parts: ModelParts, flat: torch.Tensor) -> None:
    """Make the resident parameters views into `flat` (resident_specs order; a tied
    head shares the embedding's view)."""
    assert flat.dtype == parts.dtype, (flat.dtype, parts.dtype)
    _bind(list(parts.resident.parameters()), parts.resident_specs, flat,
          parts.resident_numel, "resident")


def resident_flat(parts: ModelParts) -> torch.Tensor:
    """A new flat copy of the resident weights (resident_specs order, compute dtype)."""
    params = list(parts.resident.parameters())
    if not params:
        return torch.empty(0, dtype=parts.dtype)
    return torch.cat([p.detach().reshape(-1) for p in params])


def resident_param_specs(parts: ModelParts) -> list[tuple[str, torch.Tensor, bool]]:
    """(name, tensor, decay) of each resident parameter (a tied head counted once);
    names are the HF state-dict keys, order = resident_specs = z tensor index."""
    return [(spec.name, param, spec.decay) for spec, param in
            zip(parts.resident_specs, parts.resident.parameters())]


# ---- building --------------------------------------------------------------------------
INIT_TAG = 0x696E6974   # "init": keeps random-init seeds apart from step seeds (zo.step_seed)


def init_seed(seed: int, block: int) -> int:
    """The seed of block `block`'s random initialisation in a run seeded `seed`
    (block RESIDENT_BLOCK = -1: the resident parts)."""
    return mix_seed(seed, INIT_TAG, block)


def _config_from(spec_or_config: ModelGiven, init: str) -> PretrainedConfig:
    """The HF config: the model directory's when `init` is one, else from the spec."""
    from transformers import AutoConfig, PretrainedConfig

    if init != "random":
        path = Path(init)
        if not (path / "config.json").is_file():
            raise ZoError(f"init {init!r} is neither 'random' nor a model directory "
                          f"with a config.json")
        return AutoConfig.from_pretrained(path, local_files_only=True)
    if isinstance(spec_or_config, PretrainedConfig):
        return copy.deepcopy(spec_or_config)
    if isinstance(spec_or_config, str):
        from zoplan.models import get_model

        spec_or_config = get_model(spec_or_config)
    data = dict(spec_or_config.hf_config if isinstance(spec_or_config, ModelSpec) else spec_or_config)
    model_type = data.pop("model_type", None)
    if model_type is None:
        raise ZoError("model config has no 'model_type'")
    return AutoConfig.for_model(model_type, **data)


def adapter_for(config: PretrainedConfig) -> Adapter:
    """The family's adapter; a ZoError naming what the model needs that zoexec lacks."""
    family = config.model_type
    adapter = ADAPTERS.get(family)
    if adapter is None:
        lacks = UNSUPPORTED.get(family, "no adapter for this family in zoexec/model/")
        raise ZoError(f"model_type {family!r} is not supported ({lacks}); supported: "
                      f"{', '.join(ADAPTERS)}")
    reason = adapter.refuse(config)
    if reason:
        raise ZoError(f"model_type {family!r}: {reason} is not supported")
    return adapter


def attn_for(adapter: Adapter, attn_implementation: str) -> str:
    """The attention kernel to run: "auto" is the family's first; one the family
    cannot run (a ZoError) would not give the HF model's forward."""
    if attn_implementation == "auto":
        return adapter.attn_implementations[0]
    if attn_implementation not in adapter.attn_implementations:
        choices = ", ".join(("auto", *adapter.attn_implementations))
        raise ZoError(f"attn_implementation {attn_implementation!r} for {adapter.model_type}: "
                      f"use one of {choices}")
    return attn_implementation


@dataclass(kw_only=True, eq=False)
class Blueprint:
    """A model without its decoder blocks: the HF config, `resident` (the *ForCausalLM
    with no decoder layers) and `template` (one decoder layer of the family), made
    without initialising their weights. Nothing here holds more than one block."""

    config: PretrainedConfig
    adapter: Adapter
    resident: nn.Module
    template: nn.Module
    block_specs: list[TensorSpec]

    @property
    def family(self) -> str:
        return self.adapter.model_type

    @property
    def layer_prefix(self) -> str:
        return self.adapter.layer_prefix

    @property
    def num_blocks(self) -> int:
        return int(self.config.num_hidden_layers)

    @property
    def block_numel(self) -> int:
        return self.block_specs[-1].stop

    def resident_specs(self) -> list[TensorSpec]:
        return make_specs(list(self.resident.named_parameters()))


def make_blueprint(config: PretrainedConfig, *, dtype: torch.dtype = torch.float32, attn_implementation: str = "auto",
                   tie: bool = True) -> Blueprint:
    """The resident model and a template decoder layer of `config` in `dtype` (rotary
    frequencies fp32), weights left uninitialised (transformers' no_init_weights).
    `tie` False: the LM head is tied later, by init_resident_random (init_weights
    initialises embedding and head apart, then ties them, as from_config does)."""
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights
    from transformers.modeling_utils import local_torch_dtype

    adapter = adapter_for(config)
    attn_implementation = attn_for(adapter, attn_implementation)
    config = copy.deepcopy(config)
    config._attn_implementation = attn_implementation
    bare = copy.deepcopy(config)
    bare.num_hidden_layers = 0
    if getattr(bare, "layer_types", None):
        bare.layer_types = []
    with no_init_weights():
        resident = AutoModelForCausalLM.from_config(bare, attn_implementation=attn_implementation,
                                                    dtype=dtype)
        layer_cls = getattr(sys.modules[type(resident).__module__], adapter.layer_class)
        with local_torch_dtype(dtype):
            template = layer_cls(config, layer_idx=0)
    # built without layers, the resident model knows the real count (GPT-2 scales its
    # init by it) and layer types from here on
    bare.num_hidden_layers = config.num_hidden_layers
    if getattr(config, "layer_types", None):
        bare.layer_types = list(config.layer_types)
    if tie:
        resident.tie_weights()     # init_weights (which ties) was skipped
    elif resident.config.tie_word_embeddings:
        head = resident.get_output_embeddings()    # to be tied by init_weights: no storage meanwhile
        head.weight = nn.Parameter(torch.empty_like(head.weight, device="meta"), requires_grad=False)
    resident.eval().requires_grad_(False)
    template.eval().requires_grad_(False)
    return Blueprint(config=config, adapter=adapter, resident=resident, template=template,
                     block_specs=make_specs(list(template.named_parameters())))


def init_resident_random(model: nn.Module, seed: int) -> None:
    """The model class's own initialisation (PreTrainedModel.init_weights: _init_weights
    on every module, then the tie) of a *ForCausalLM whose decoder layers are removed,
    drawn from the resident seed. Once per model: init_weights marks what it did."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(init_seed(seed, RESIDENT_BLOCK))
        model.init_weights()


def init_layer_random(model: nn.Module, layer: nn.Module, seed: int, block: int) -> None:
    """Decoder layer `layer` gets block `block`'s random weights: the model class's
    _init_weights on each of its modules (as init_weights would), from block's seed."""
    from transformers.initialization import guard_torch_init_functions

    with torch.random.fork_rng(devices=[]), guard_torch_init_functions():
        torch.manual_seed(init_seed(seed, block))
        layer.apply(model._init_weights)


def init_model_random(model: nn.Module, seed: int) -> None:
    """Every weight of a full *ForCausalLM, block by block (init_resident_random and
    init_layer_random: the same weights as a blueprint filled block by block)."""
    adapter = adapter_for(model.config)
    layers = adapter.get_layers(model)
    adapter.set_layers(model, nn.ModuleList())
    try:
        init_resident_random(model, seed)
    finally:
        adapter.set_layers(model, layers)
    for block, layer in enumerate(layers):
        init_layer_random(model, layer, seed, block)


def write_params(module: nn.Module, out: torch.Tensor) -> torch.Tensor:
    """Copy the module's parameters into the flat `out` (named_parameters order,
    converted to out's dtype); returns `out`."""
    offset = 0
    for param in module.parameters():
        out[offset:offset + param.numel()].copy_(param.detach().reshape(-1))
        offset += param.numel()
    assert offset == out.numel(), (offset, out.numel())
    return out


def release_params(module: nn.Module, dtype: torch.dtype) -> None:
    """Free the module's own parameter storage (they become empty tensors of `dtype`,
    to be bound to flat buffers)."""
    for param in module.parameters():
        param.data = torch.empty(0, dtype=dtype)


def build_hf_model(spec_or_config: ModelGiven, *, init: str | Path = "random", seed: int = 0,
                   dtype: str | torch.dtype = "fp32", attn_implementation: str = "auto") -> PreTrainedModel:
    """The full HF *ForCausalLM in eval mode without grads: random weights made block by
    block in fp32 (init_model_random: the weights build_parts and the node's store get)
    and then cast (same seed, same weights, whatever the precision), or the local
    directory's weights (from_pretrained(local_files_only=True)); never downloads."""
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    config = _config_from(spec_or_config, str(init))
    attn_implementation = attn_for(adapter_for(config), attn_implementation)
    if str(init) == "random":
        with no_init_weights():
            model = AutoModelForCausalLM.from_config(
                config, attn_implementation=attn_implementation, dtype=torch.float32)
        init_model_random(model, seed)
        model = cast_keeping_fp32_buffers(model, torch_dtype(dtype))
    else:
        weight_files(init)   # every shard inside the folder (transformers would open any)
        try:
            model = AutoModelForCausalLM.from_pretrained(
                str(init), local_files_only=True, attn_implementation=attn_implementation,
                dtype=torch_dtype(dtype))
        except OSError as exc:
            raise ZoError(f"cannot load the model in {init}: {exc}") from None
    return model.eval().requires_grad_(False)


FP32_BUFFERS = ("inv_freq", "original_inv_freq")   # rotary frequencies: HF keeps them fp32


def cast_keeping_fp32_buffers(module: nn.Module, dtype: torch.dtype) -> nn.Module:
    """module.to(dtype), but the rotary embedding's frequency buffers stay fp32, as
    transformers keeps them (in bf16, cos(position x inv_freq) would be off by up to
    ~1.8 at position 2047)."""
    keep = {name: buf.detach().clone() for name, buf in module.named_buffers()
            if name.rsplit(".", 1)[-1] in FP32_BUFFERS and buf.dtype == torch.float32}
    module = module.to(dtype)
    for name, value in keep.items():
        owner_name, _, attr = name.rpartition(".")
        owner = module.get_submodule(owner_name) if owner_name else module
        setattr(owner, attr, value.to(getattr(owner, attr).device))
    return module


def check_matches(spec: object, config: PretrainedConfig, init: str | Path) -> None:
    """A model directory must hold the model the plan was made for (a ModelSpec)."""
    if str(init) == "random" or not isinstance(spec, ModelSpec):
        return
    mine = (spec.family, spec.num_layers, spec.hidden, spec.vocab)
    theirs = (config.model_type, config.num_hidden_layers, config.hidden_size, config.vocab_size)
    if mine != theirs:
        raise ZoError(f"model directory {init} holds (family, layers, hidden, vocab) = "
                      f"{theirs}, the plan's model {spec.name} is {mine}")


def parts_from_blueprint(bp: Blueprint, *, param_dtype: torch.dtype, compute_dtype: torch.dtype,
                         master: torch.Tensor | None, first_block: torch.Tensor | None) -> ModelParts:
    """ModelParts over a blueprint: the resident modules in the compute dtype bound to
    `master` (the flat resident weights in the param dtype, resident_specs order; None:
    zeros, weights to come) cast to it, the working block bound to a compute-dtype copy
    of `first_block` (None: zeros). The blueprint's own weights are released first."""
    specs = bp.resident_specs()
    numel = sum(s.numel for s in specs)
    resident, block = bp.resident, bp.template
    release_params(resident, compute_dtype)
    release_params(block, compute_dtype)
    resident = cast_keeping_fp32_buffers(resident, compute_dtype)
    block = block.to(compute_dtype)
    parts = ModelParts(family=bp.family, adapter=bp.adapter, config=bp.config, dtype=compute_dtype, resident=resident,
                       block=block, block_specs=bp.block_specs, block_numel=bp.block_numel,
                       num_blocks=bp.num_blocks, param_dtype=param_dtype, resident_specs=specs,
                       resident_numel=numel, resident_master=master)
    flat = (torch.zeros(numel, dtype=compute_dtype) if master is None
            else master.to(compute_dtype, copy=True))
    bind_resident(parts, flat)
    work = (torch.zeros(bp.block_numel, dtype=compute_dtype) if first_block is None
            else first_block.to(compute_dtype, copy=True))
    bind_block(parts, work)
    return parts


def param_addresses(model: nn.Module) -> list[tuple[str, nn.Parameter, int, int]]:
    """(name, parameter, block, tensor index) of every trainable parameter of a full HF
    *ForCausalLM, in the z addressing of zo.py: layer i -> block i with its tensors in
    module order; everything else -> block -1 in named_parameters order (tied once)."""
    prefix = adapter_for(model.config).layer_prefix
    counters: dict[int, int] = {}
    out = []
    for name, param in model.named_parameters():
        block = -1
        if name.startswith(prefix):
            block = int(name[len(prefix):].split(".", 1)[0])
        index = counters.get(block, 0)
        counters[block] = index + 1
        out.append((name, param, block, index))
    return out
