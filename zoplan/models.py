"""Model catalogue: parameter bytes, FLOPs and activation sizes of each block.

Covers OPT, Llama (2 and 3), Qwen3, Qwen2/2.5, Mistral, Gemma (1 and 2), GPT-2 and
GPT-NeoX (Pythia) by name, and any Hugging Face `config.json` of those families by path
(FAMILIES; each has an adapter in zoexec/model/). Figures come from the architecture formulas below; a test checks
the parameter counts against transformers' own classes built on the meta device.
The catalogue's entries (their configs and sources) are in zoplan.catalogue.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from zoplan.catalogue import CATALOGUE_CONFIGS, Config
from zoplan.errors import ZoError
from zoplan.hubcache import cached_snapshot, is_repo_id, model_folder
from zoplan.io import load_json
from zoplan.modeldir import index_files

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
FAMILIES = ("opt", "llama", "qwen3", "qwen2", "mistral", "gemma", "gemma2", "gpt2", "gpt_neox")
LAYER_NORM = ("opt", "gpt2", "gpt_neox")    # LayerNorm (weight, bias) and a plain MLP; else RMSNorm, gated
LEARNED_POSITIONS = ("opt", "gpt2")         # position embeddings; the others turn q and k (rotary)
# Families transformers has that zoexec does not take apart, and what they would need.
UNSUPPORTED = {
    "gemma3": "a vision tower, and rotary bases that differ between local and global layers",
    "gemma3_text": "rotary bases that differ between local and global layers (one working "
                   "block runs every layer)",
}
# config.json keys that a family spells its own way (GPT-2: n_*; OPT: ffn_dim), and the
# defaults of transformers' config classes for keys a config.json may leave out.
HF_KEYS = {"gpt2": {"num_hidden_layers": "n_layer", "hidden_size": "n_embd",
                    "num_attention_heads": "n_head", "max_position_embeddings": "n_positions",
                    "intermediate_size": "n_inner"},
           "opt": {"intermediate_size": "ffn_dim"}}
HEAD_DIM_DEFAULT = {"gemma": 256, "gemma2": 256, "qwen3": 128}
TIED_DEFAULT = ("opt", "gpt2", "gemma", "gemma2")


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """Shape of a decoder-only transformer; derived sizes are properties."""

    name: str
    family: str
    num_layers: int
    hidden: int
    ffn: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab: int
    max_positions: int
    tied_head: bool
    word_embed_proj_dim: int = 0   # OPT-350m projects embeddings 512 <-> hidden
    final_norm: bool = True        # OPT-350m (post-LN) has no final layer norm
    qkv_bias: bool = False         # biases on q, k, v (Qwen2, GPT-2, GPT-NeoX, attention_bias)
    out_bias: bool = False         # a bias on the attention output projection
    mlp_bias: bool = False         # biases in the MLP (GPT-2, GPT-NeoX, Llama's mlp_bias)
    hf_config: Config = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"family {self.family!r} is not one of {', '.join(FAMILIES)}")
        for name in ("num_layers", "hidden", "ffn", "num_heads", "num_kv_heads",
                     "head_dim", "vocab", "max_positions"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) is not a multiple of "
                             f"num_kv_heads ({self.num_kv_heads})")

    # ---- parameters -------------------------------------------------------------
    @property
    def attn_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def layer_norm(self) -> bool:
        """LayerNorms (weight and bias) and a plain two-matrix MLP (OPT, GPT-2,
        GPT-NeoX); else RMSNorms (weight only) and a gated three-matrix MLP."""
        return self.family in LAYER_NORM

    @property
    def rotary(self) -> bool:
        """Rotary positions (q and k turned in every block), not position embeddings."""
        return self.family not in LEARNED_POSITIONS

    @functools.lru_cache(maxsize=256)   # noqa: B019 - specs are few and immutable
    def _block_tensors(self) -> tuple[tuple[int, bool], ...]:
        """(elements, is a matrix) of one block's tensors in the HF module's order
        (cached: the search asks for them thousands of times)."""
        return tuple((math.prod(shape), len(shape) >= 2) for shape in self.block_tensor_shapes())

    @functools.lru_cache(maxsize=256)   # noqa: B019 - specs are few and immutable
    def _resident_tensors(self) -> tuple[tuple[int, bool], ...]:
        """(elements, is a matrix) of the resident tensors in named_parameters order
        (embeddings, final norm, an untied head; cached, as _block_tensors)."""
        return tuple((math.prod(shape), len(shape) >= 2)
                     for shape in self.resident_tensor_shapes())

    def block_tensor_shapes(self) -> list[tuple[int, ...]]:
        """Shapes of one block's tensors in the HF module's order (a linear module's
        weight is [out, in], its bias [out])."""
        h, f, a, kv = self.hidden, self.ffn, self.attn_dim, self.kv_dim
        def linear(n_in: int, n_out: int, bias: bool) -> list[tuple[int, ...]]:
            weight: list[tuple[int, ...]] = [(n_out, n_in)]
            return weight + ([(n_out,)] if bias else [])
        if self.family == "opt":
            attn = [t for _ in range(4) for t in linear(h, h, True)]
            return attn + [(h,)] * 2 + linear(h, f, True) + linear(f, h, True) + [(h,)] * 2
        if self.family == "gpt2":          # ln_1, c_attn (fused q,k,v), c_proj, ln_2, c_fc, c_proj
            return ([(h,)] * 2 + linear(h, 3 * h, True) + linear(h, h, True) + [(h,)] * 2
                    + linear(h, f, True) + linear(f, h, True))
        if self.family == "gpt_neox":      # two LayerNorms first, then fused qkv, dense, MLP
            return ([(h,)] * 4 + linear(h, 3 * h, self.qkv_bias) + linear(h, h, self.out_bias)
                    + linear(h, f, True) + linear(f, h, True))
        out = (linear(h, a, self.qkv_bias) + linear(h, kv, self.qkv_bias) + linear(h, kv, self.qkv_bias)
               + linear(a, h, self.out_bias))
        if self.family == "qwen3":         # per-head RMSNorm of q and k
            out += [(self.head_dim,)] * 2
        out += linear(h, f, self.mlp_bias) + linear(h, f, self.mlp_bias) + linear(f, h, self.mlp_bias)
        return out + [(h,)] * (4 if self.family == "gemma2" else 2)   # Gemma 2: sandwich norms

    def resident_tensor_shapes(self) -> list[tuple[int, ...]]:
        """Shapes of the resident tensors in named_parameters order."""
        h, v = self.hidden, self.vocab
        norm: list[tuple[int, ...]] = [(h,)] * (2 if self.layer_norm else 1)
        wdim = self.word_embed_proj_dim or h
        head: list[tuple[int, ...]] = [] if self.tied_head else [(v, wdim)]
        if self.family == "opt":
            out: list[tuple[int, ...]] = [(v, wdim), (self.max_positions + 2, h)]
            out += norm if self.final_norm else []
            out += [(h, wdim), (wdim, h)] if wdim != h else []
            return out + head
        if self.family == "gpt2":
            return [(v, h), (self.max_positions, h)] + norm + head
        return [(v, h)] + norm + head

    @functools.cached_property
    def block_params(self) -> int:
        """Parameters of one decoder block (HF module layout)."""
        return sum(n for n, _ in self._block_tensors())

    @property
    def matmul_params_per_block(self) -> int:
        """Weights that take part in a GEMM (drives FLOPs)."""
        return sum(n for n, matrix in self._block_tensors() if matrix)

    @property
    def embed_params(self) -> int:
        """Token (and learned position) embeddings, OPT's projections."""
        h = self.hidden
        wdim = self.word_embed_proj_dim or h
        proj = 2 * wdim * h if self.family == "opt" and wdim != h else 0
        positions = {"opt": self.max_positions + 2, "gpt2": self.max_positions}.get(self.family, 0)
        return self.vocab * wdim + positions * h + proj

    @property
    def head_params(self) -> int:
        """Final norm + LM head (zero extra for a head tied to the embeddings)."""
        return self.resident_params - self.embed_params

    @functools.cached_property
    def resident_params(self) -> int:
        return sum(n for n, _ in self._resident_tensors())

    @property
    def total_params(self) -> int:
        return self.num_layers * self.block_params + self.resident_params

    def block_bytes(self, dtype: str) -> int:
        return self.block_params * dtype_bytes(dtype)

    def resident_bytes(self, dtype: str) -> int:
        return self.resident_params * dtype_bytes(dtype)

    # ---- compute ----------------------------------------------------------------
    def block_flops_per_token(self, seq: int) -> float:
        """Forward FLOPs per token of one block: 2 per GEMM weight plus attention
        scores and weighted sum (2 * 2 * seq * attn_dim, no causal skipping)."""
        return 2.0 * self.matmul_params_per_block + 4.0 * seq * self.attn_dim

    def block_gemm_flops_per_token(self) -> float:
        """The GEMM part of block_flops_per_token (2 per weight)."""
        return 2.0 * self.matmul_params_per_block

    def block_attn_flops_per_token(self, seq: int | float) -> float:
        """The attention part: scores and weighted sum over `seq` keys."""
        return 4.0 * seq * self.attn_dim

    def head_flops_per_token(self) -> float:
        return 2.0 * self.vocab * self.hidden

    # Element-wise work (outputs written by the non-GEMM operators per token, as HF's
    # modules run them on the CPU). The counts are the operators' output sizes; what
    # one element costs (compute.elem_ns) is fitted by `zoplan profile` over OPT and
    # Llama blocks, so only the relative sizes matter here.
    def block_elems_per_token(self) -> float:
        h, f = self.hidden, self.ffn
        if self.layer_norm:
            # 2 LayerNorms, 6 bias broadcasts (q,k,v,out,fc1,fc2), 2 residual adds,
            # ReLU, the query scaling and the attention output's transpose
            return 2 * h + (5 * h + f) + 2 * h + f + h + h
        qk = self.attn_dim + self.kv_dim
        # 2 RMSNorms (~4 ops each), rotary on q and k (~4 ops), 2 residual adds,
        # SiLU and the gate product, the attention output's transpose (+ qk norms)
        extra = 4 * qk if self.family == "qwen3" else 0
        return 8 * h + 4 * qk + 2 * h + 2 * f + h + extra

    def block_bias_elems_per_token(self) -> float:
        """The bias broadcasts among block_elems_per_token's outputs: q, k, v, out, fc1
        and fc2 of a LayerNorm block (OPT, GPT-2, GPT-NeoX); the other families' counts
        hold none."""
        return 5.0 * self.hidden + self.ffn if self.layer_norm else 0.0

    def embed_elems_per_token(self) -> float:
        """Token (and learned position) embedding lookups and their sum."""
        return float(self.hidden) if self.rotary else 3.0 * self.hidden

    def head_elems_per_token(self) -> float:
        """Final norm, and the loss over the vocabulary (one fused log-softmax pass)."""
        return 4.0 * self.hidden + 1.0 * self.vocab

    # ---- tensors (the z chunks of zoexec.maths.zo follow them) ---------------------------
    def block_tensor_numels(self) -> list[int]:
        """Element counts of one block's parameter tensors (HF module order)."""
        return [n for n, _ in self._block_tensors()]

    def resident_tensor_numels(self) -> list[int]:
        """Element counts of the resident tensors (embeddings, final norm, untied head)."""
        return [n for n, _ in self._resident_tensors()]

    # ---- activations: what zoexec's forward holds at its peak -------------------------
    # Measured with zoexec.runtime.memtrack.AllocationTracker (live tensor storages) on one-block
    # OPT, Llama and Qwen3 models (hidden 128-512, attention width 1-2x hidden, 1-4 query
    # heads per kv head, ffn 1-4x hidden, 32-256 tokens, fp32 and bf16; sdpa attention,
    # torch 2.13 CPU, transformers 5.23, CPython 3.11): the largest stage below is the
    # tracked peak to within 1% (tests/unit/test_memory_model.py repeats it on a grid).
    # The eager S x S attention scores of the old formula never exist: sdpa's kernels
    # keep them per tile. The other families take the stages of the closest measured
    # one (GPT-2 and GPT-NeoX: OPT's; Qwen2, Mistral, Gemma: Llama's), not measured;
    # Gemma 2 runs eager attention, whose scores are added (an estimate: three
    # [heads, seq] rows per token alive at once).
    def block_stage_bytes(self, dtype: str) -> dict[str, float]:
        """Bytes per token one block's forward holds beyond its input at the peak of
        each stage (compute precision `dtype`; RMSNorm works in fp32 whatever it is)."""
        b = dtype_bytes(dtype)
        h, f, a, kv = self.hidden, self.ffn, self.attn_dim, self.kv_dim
        if self.layer_norm:
            # LayerNorm out, q and its scaled copy, k, v, the attention output and its
            # contiguous copy; the MLP: the residual, fc1's output and the ReLU's
            return {"attention": 6 * h * b, "mlp": (h + 2 * f) * b}
        rms = 8.0   # an RMSNorm's fp32 input copy and normalised copy, per element
        stages = {
            "input_norm": rms * h + 8,
            "rotary_q": (h + 4 * a + 2 * kv) * b,      # norm out, q, k, v, q*cos, rot(q), rot(q)*sin
            "rotary_k": (h + 2 * a + 5 * kv) * b,      # q kept beside q_embed while k turns
            "post_norm": h * b + rms * h + 8,          # the residual beside the norm
            "mlp": (2 * h + 3 * f) * b,                # residual, norm out, act(gate), up, product
        }
        if self.family == "qwen3":   # per-head RMSNorm of q and k (fp32 inside)
            stages["q_norm"] = (h + a) * b + rms * a + 8 * self.num_heads
            stages["k_norm"] = (h + a + kv) * b + rms * kv + 8 * self.num_kv_heads
        return stages

    def block_activation_bytes(self, tokens: int, seq: int, dtype: str) -> int:
        """Peak bytes one block's forward over `tokens` tokens of one perturbation stream
        allocates beyond its input (block_stage_bytes' largest stage; the output is part
        of it). sdpa holds nothing of seq x seq size; eager attention (Gemma 2) does."""
        peak = max(self.block_stage_bytes(dtype).values())
        if self.family == "gemma2":
            peak = max(peak, (self.hidden + self.attn_dim + 2 * self.kv_dim) * dtype_bytes(dtype)
                       + 3 * self.num_heads * seq * 4)
        return int(tokens * peak)

    def head_activation_bytes(self, tokens: int, dtype: str) -> int:
        """Peak bytes of the head over `tokens` tokens of one stream: final norm (+ OPT's
        project_out), the logits in the compute precision, and in the loss their fp32
        copy and fp32 log-softmax. zoexec.model.families.causal_lm_loss_sum rebinds `logits` to its
        fp32 copy, so the 16-bit logits are freed before the log-softmax: the peak is
        8 bytes per token and vocabulary entry in every precision (measured), plus the
        int64 labels."""
        b = dtype_bytes(dtype)
        h, v = self.hidden, self.vocab
        width = self.word_embed_proj_dim or h
        norm: float
        if self.layer_norm:
            norm = h * b + (width * b if width != h else 0)
        else:
            norm = 8.0 * h + 8
        per_token = max(norm, (width + v) * b, 8 * v) + 8
        return int(tokens * per_token)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelSpec:
        try:
            return cls(**data)
        except (TypeError, ValueError) as exc:
            raise ZoError(f"malformed model spec: {exc}") from None


def dtype_bytes(dtype: str) -> int:
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ZoError(f"unknown precision {dtype!r}; use one of {', '.join(DTYPE_BYTES)}") from None


# Sane bounds of a model's shape (the largest published models are far inside them): a
# config outside them is broken, and refused before any size is computed from it.
# ModelSpec field: (HF config key, low, high).
SHAPE_BOUNDS = {
    "num_layers": ("num_hidden_layers", 1, 10_000),
    "hidden": ("hidden_size", 1, 2**20),
    "ffn": ("intermediate_size", 1, 2**22),      # OPT: ffn_dim, GPT-2: n_inner
    "num_heads": ("num_attention_heads", 1, 2**14),
    "num_kv_heads": ("num_key_value_heads", 1, 2**14),
    "head_dim": ("head_dim", 1, 2**14),
    "vocab": ("vocab_size", 2, 2**24),
    "max_positions": ("max_position_embeddings", 1, 2**24),
    "word_embed_proj_dim": ("word_embed_proj_dim", 0, 2**20),
}
_FLAGS = ("tie_word_embeddings", "do_layer_norm_before", "_remove_final_layer_norm",
          "attention_bias", "mlp_bias")


def hf_key(family: str, key: str) -> str:
    """The config.json key of figure `key` (an HF common name) in `family`'s configs."""
    return HF_KEYS.get(family, {}).get(key, key)


def check_shape(values: Mapping[str, object], *, hf_family: str = "") -> None:
    """Raise ValueError naming the first shape figure (a ModelSpec field, or with
    `hf_family` its config.json key) that is not a whole number within SHAPE_BOUNDS, and
    the heads that do not divide what they split."""
    hf_names = bool(hf_family)
    for field_name, (hf_key_name, low, high) in SHAPE_BOUNDS.items():
        if field_name not in values:
            continue
        value = values[field_name]
        label = field_name
        if hf_names:
            label = hf_key(hf_family, hf_key_name)
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"{label} must be a whole number, got {value!r}")
        if not low <= value <= high:
            raise ValueError(f"{label} is {value}, outside {low}..{high}")
    heads, kv = values.get("num_heads"), values.get("num_kv_heads")   # checked above
    if isinstance(heads, int) and isinstance(kv, int) and heads and kv and heads % kv:
        raise ValueError(f"num_attention_heads ({heads}) is not a multiple of "
                         f"num_key_value_heads ({kv})" if hf_names else
                         f"num_heads ({heads}) is not a multiple of num_kv_heads ({kv})")


def _config_int(config: Mapping[str, object], key: str, default: int | None = None) -> object:
    """A config figure as given (checked by check_shape); null or absent: `default`."""
    value = config.get(key)
    if value is None:
        if default is None:
            raise KeyError(key)
        return default
    return value


def _checked_shape(values: dict[str, object], family: str) -> dict[str, int]:
    """`values` (ModelSpec shape fields) once check_shape has found each a whole number
    within its bounds (ValueError naming the first that is not)."""
    check_shape(values, hf_family=family)
    shape: dict[str, int] = {}
    for key, value in values.items():
        assert key in SHAPE_BOUNDS and isinstance(value, int), key   # what check_shape checks
        shape[key] = value
    return shape


def _config_shape(config: Mapping[str, object], family: str) -> dict[str, int]:
    """The ModelSpec shape figures of an HF config, checked (ValueError, KeyError)."""
    def get(key: str, default: int | None = None) -> object:
        return _config_int(config, hf_key(family, key), default)

    shape = _checked_shape({"num_layers": get("num_hidden_layers"), "hidden": get("hidden_size"),
                            "num_heads": get("num_attention_heads"), "vocab": get("vocab_size"),
                            "max_positions": get("max_position_embeddings")}, family)
    hidden, heads = shape["hidden"], shape["num_heads"]
    own_heads = family in LAYER_NORM       # no grouped-query attention, head_dim = hidden / heads
    more: dict[str, object] = {
        "ffn": get("intermediate_size", 4 * hidden if family == "gpt2" else None),
        "num_kv_heads": heads if own_heads else get("num_key_value_heads", heads)}
    if family == "opt":
        more["word_embed_proj_dim"] = get("word_embed_proj_dim", hidden)
    head_dim = None if own_heads else config.get("head_dim")
    if head_dim is None and not own_heads:
        head_dim = HEAD_DIM_DEFAULT.get(family)    # transformers' config class default
    if head_dim is None and hidden % heads:
        raise ValueError(f"{hf_key(family, 'hidden_size')} ({hidden}) is not a multiple of "
                         f"{hf_key(family, 'num_attention_heads')} ({heads})")
    more["head_dim"] = hidden // heads if head_dim is None else head_dim
    shape = _checked_shape({**shape, **more}, family)
    for flag in _FLAGS:
        if config.get(flag) is not None and not isinstance(config[flag], bool):
            raise ValueError(f"{flag} must be true or false, got {config[flag]!r}")
    return shape


class _Biases(TypedDict):
    qkv_bias: bool
    out_bias: bool
    mlp_bias: bool


def _biases(config: Mapping[str, object], family: str) -> _Biases:
    """qkv_bias, out_bias, mlp_bias of a family's config (fixed or attention_bias and
    mlp_bias as transformers' config classes default them)."""
    if family in ("opt", "gpt2"):
        return {"qkv_bias": True, "out_bias": True, "mlp_bias": True}
    if family == "qwen2":
        return {"qkv_bias": True, "out_bias": False, "mlp_bias": False}
    attention = bool(config.get("attention_bias", family == "gpt_neox"))
    if family == "mistral":
        attention = False
    mlp = family == "gpt_neox" or (family == "llama" and bool(config.get("mlp_bias", False)))
    return {"qkv_bias": attention, "out_bias": attention, "mlp_bias": mlp}


def spec_from_hf_config(config: Mapping[str, object], *, name: str) -> ModelSpec:
    """Build a ModelSpec from a Hugging Face config dict (FAMILIES). Every shape
    figure must be a whole number within SHAPE_BOUNDS and the heads must divide what
    they split: anything else is one ZoError naming the config key."""
    family = config.get("model_type")
    if not isinstance(family, str) or family not in FAMILIES:
        lacks = "no adapter for this family in zoexec/model/"
        if isinstance(family, str):
            lacks = UNSUPPORTED.get(family, lacks)
        raise ZoError(f"model {name}: model_type {family!r} is not supported ({lacks}); "
                      f"supported: {', '.join(FAMILIES)}")
    try:
        shape = _config_shape(config, family)
        wdim, final_norm = 0, True   # ModelSpec's defaults: OPT's configs alone set them
        if family == "opt":
            wdim = shape["word_embed_proj_dim"]
            wdim = wdim if wdim != shape["hidden"] else 0
            pre_ln = bool(config.get("do_layer_norm_before", True))
            remove_final = bool(config.get("_remove_final_layer_norm", False))
            final_norm = pre_ln and not remove_final
        return ModelSpec(name=name, family=family, hf_config=dict(config),
                         **_biases(config, family),
                         tied_head=bool(config.get("tie_word_embeddings", family in TIED_DEFAULT)),
                         num_layers=shape["num_layers"], hidden=shape["hidden"],
                         num_heads=shape["num_heads"], vocab=shape["vocab"],
                         max_positions=shape["max_positions"], ffn=shape["ffn"],
                         num_kv_heads=shape["num_kv_heads"], head_dim=shape["head_dim"],
                         word_embed_proj_dim=wdim, final_norm=final_norm)
    except KeyError as exc:
        raise ZoError(f"model {name}: config has no {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise ZoError(f"model {name}: bad config value: {exc}") from None


def catalogue() -> dict[str, ModelSpec]:
    return {name: spec_from_hf_config(cfg, name=name) for name, cfg in CATALOGUE_CONFIGS.items()}


def get_model(name_or_path: str) -> ModelSpec:
    """A catalogue name (case-insensitive), a config.json path, or a model directory."""
    key = name_or_path.lower()
    if key in CATALOGUE_CONFIGS:
        return spec_from_hf_config(CATALOGUE_CONFIGS[key], name=key)
    path = Path(name_or_path)
    if not path.exists() and path.suffix != ".json" and is_repo_id(name_or_path) and (
            "/" in name_or_path or cached_snapshot(name_or_path) is not None):
        path = model_folder(name_or_path, what="--model")   # the local Hub cache's (zoplan.hubcache)
    if path.is_dir():
        index_files(path)   # a model folder: its index names no shard outside it
        path = path / "config.json"
    if path.suffix == ".json" or path.exists():
        config = load_json(path, what="model config")
        if not isinstance(config, dict):
            raise ZoError(f"model config {path} is not a JSON object")
        label = path.parent.name if path.name == "config.json" else path.stem
        return spec_from_hf_config(config, name=label or str(path))
    raise ZoError(f"unknown model {name_or_path!r}: not in the catalogue "
                  f"(see `zoplan models`) and no such config.json")


# ---- one generic block (what `zoplan profile` times) -----------------------------------------
def one_block_config(hidden: int, seq: int, family: str = "opt") -> Config:
    """An HF config of a generic one-block model of `family`: OPT with a 4h MLP, or
    Llama (Qwen3) with a gated 8h/3 MLP; 64-dim heads, a 64-token vocabulary."""
    heads = max(1, hidden // 64)
    if family == "opt":
        return {"model_type": "opt", "num_hidden_layers": 1, "hidden_size": hidden,
                "ffn_dim": 4 * hidden, "num_attention_heads": heads,
                "vocab_size": 64, "max_position_embeddings": max(seq, 64),
                "word_embed_proj_dim": hidden, "do_layer_norm_before": True,
                "tie_word_embeddings": True}
    return {"model_type": family, "num_hidden_layers": 1, "hidden_size": hidden,
            "intermediate_size": 8 * hidden // 3 // 32 * 32 or hidden,
            "num_attention_heads": heads, "num_key_value_heads": heads,
            "head_dim": hidden // heads, "vocab_size": 64,
            "max_position_embeddings": max(seq, 64), "rope_theta": 10000.0,
            "rms_norm_eps": 1e-6, "tie_word_embeddings": False}


class BlockWork(TypedDict):
    """block_forward_work's figures (one timed forward's work)."""

    family: str
    hidden: int
    batch: int
    seq: int
    tokens: int
    flops: float
    attn_flops: float
    elems: float
    weight_bytes: int


def block_forward_work(hidden: int, batch: int, seq: int, *, dtype_bytes: int,
                       family: str = "opt", split: bool = True) -> BlockWork:
    """The work of one forward of one_block_config's block over batch x seq tokens:
    `flops` (GEMMs; with attention when not `split`), `attn_flops` and `elems`
    (element-wise outputs), and the block's `weight_bytes` (see
    zoplan.pricing.compute.forward_time_s)."""
    spec = spec_from_hf_config(one_block_config(hidden, seq, family),
                               name=f"{family}-block-{hidden}")
    tokens = batch * seq
    gemm = tokens * spec.block_gemm_flops_per_token()
    attn = tokens * spec.block_attn_flops_per_token(seq)
    return {"family": family, "hidden": hidden, "batch": batch, "seq": seq, "tokens": tokens,
            "flops": gemm if split else gemm + attn, "attn_flops": attn if split else 0.0,
            "elems": tokens * spec.block_elems_per_token() if split else 0.0,
            "weight_bytes": spec.block_params * dtype_bytes}
