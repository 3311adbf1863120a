"""Model catalogue: parameter bytes, FLOPs and activation sizes of each block.

Covers OPT, Llama (2 and 3) and Qwen3 by name, and any Hugging Face `config.json` of
those families by path. Figures come from the architecture formulas below; a test checks
the parameter counts against transformers' own classes built on the meta device.
Sources: each catalogue entry's shape (hidden size, layers, heads, key-value heads,
FFN size, vocabulary, positions, tied embeddings) is copied from the model's published
config.json on the Hugging Face Hub (facebook/opt-*, meta-llama/Llama-2-*-hf and
Meta-Llama-3-*, Qwen/Qwen3-*), OPT-175B's (not on the Hub) from table 1 of the OPT
paper (Zhang et al., arXiv 2205.01068); the tiny and small test models are our own
shapes, built with random weights.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from zoplan.errors import ZoError
from zoplan.io import load_json

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
FAMILIES = ("opt", "llama", "qwen3")


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
    hf_config: dict = field(default_factory=dict, compare=False)

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
    def block_params(self) -> int:
        """Parameters of one decoder block (HF module layout)."""
        h, f = self.hidden, self.ffn
        if self.family == "opt":
            # q,k,v,out with biases; fc1, fc2 with biases; two LayerNorms (w + b)
            return 4 * (h * h + h) + (h * f + f) + (f * h + h) + 4 * h
        attn = h * self.attn_dim + 2 * h * self.kv_dim + self.attn_dim * h
        mlp = 3 * h * f
        norms = 2 * h + (2 * self.head_dim if self.family == "qwen3" else 0)
        return attn + mlp + norms

    @property
    def matmul_params_per_block(self) -> int:
        """Weights that take part in a GEMM (drives FLOPs)."""
        h, f = self.hidden, self.ffn
        if self.family == "opt":
            return 4 * h * h + 2 * h * f
        return h * self.attn_dim + 2 * h * self.kv_dim + self.attn_dim * h + 3 * h * f

    @property
    def embed_params(self) -> int:
        h = self.hidden
        if self.family == "opt":
            wdim = self.word_embed_proj_dim or h
            proj = 2 * wdim * h if wdim != h else 0
            return self.vocab * wdim + (self.max_positions + 2) * h + proj
        return self.vocab * h

    @property
    def head_params(self) -> int:
        """Final norm + LM head (zero extra for a head tied to the embeddings)."""
        h = self.hidden
        norm = (2 * h if self.family == "opt" else h) if self.final_norm else 0
        head = 0 if self.tied_head else self.vocab * h
        return norm + head

    @property
    def resident_params(self) -> int:
        return self.embed_params + self.head_params

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

    def block_attn_flops_per_token(self, seq: int) -> float:
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
        if self.family == "opt":
            # 2 LayerNorms, 6 bias broadcasts (q,k,v,out,fc1,fc2), 2 residual adds,
            # ReLU, the query scaling and the attention output's transpose
            return 2 * h + (5 * h + f) + 2 * h + f + h + h
        qk = self.attn_dim + self.kv_dim
        # 2 RMSNorms (~4 ops each), rotary on q and k (~4 ops), 2 residual adds,
        # SiLU and the gate product, the attention output's transpose (+ qk norms)
        extra = 4 * qk if self.family == "qwen3" else 0
        return 8 * h + 4 * qk + 2 * h + 2 * f + h + extra

    def embed_elems_per_token(self) -> float:
        """Token (and OPT position) embedding lookups and their sum."""
        return 3.0 * self.hidden if self.family == "opt" else float(self.hidden)

    def head_elems_per_token(self) -> float:
        """Final norm, and the loss over the vocabulary (one fused log-softmax pass)."""
        return 4.0 * self.hidden + 1.0 * self.vocab

    # ---- tensors (the z chunks of zoexec.maths.zo follow them) ---------------------------
    def block_tensor_numels(self) -> list[int]:
        """Element counts of one block's parameter tensors (HF module order)."""
        h, f, a, kv = self.hidden, self.ffn, self.attn_dim, self.kv_dim
        if self.family == "opt":
            return [h * h, h] * 4 + [h, h] + [f * h, f, h * f, h] + [h, h]
        out = [a * h, kv * h, kv * h, h * a]
        if self.family == "qwen3":
            out += [self.head_dim, self.head_dim]
        return out + [f * h, f * h, h * f, h, h]

    def resident_tensor_numels(self) -> list[int]:
        """Element counts of the resident tensors (embeddings, final norm, untied head)."""
        h = self.hidden
        if self.family == "opt":
            wdim = self.word_embed_proj_dim or h
            out = [self.vocab * wdim, (self.max_positions + 2) * h]
            if self.final_norm:
                out += [h, h]
            if wdim != h:
                out += [wdim * h, h * wdim]
            if not self.tied_head:
                out.append(self.vocab * wdim)
            return out
        out = [self.vocab * h, h]
        return out if self.tied_head else out + [self.vocab * h]

    # ---- activations: what zoexec's forward holds at its peak -------------------------
    # Measured with zoexec.runtime.memtrack.AllocationTracker (live tensor storages) on one-block
    # OPT, Llama and Qwen3 models (hidden 128-512, attention width 1-2x hidden, 1-4 query
    # heads per kv head, ffn 1-4x hidden, 32-256 tokens, fp32 and bf16; sdpa attention,
    # torch 2.13 CPU, transformers 5.23, CPython 3.11): the largest stage below is the
    # tracked peak to within 1% (tests/unit/test_memory_model.py repeats it on a grid).
    # The eager S x S attention scores of the old formula never exist: sdpa's kernels
    # keep them per tile.
    def block_stage_bytes(self, dtype: str) -> dict[str, float]:
        """Bytes per token one block's forward holds beyond its input at the peak of
        each stage (compute precision `dtype`; RMSNorm works in fp32 whatever it is)."""
        b = dtype_bytes(dtype)
        h, f, a, kv = self.hidden, self.ffn, self.attn_dim, self.kv_dim
        if self.family == "opt":
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
        of it). `seq` is kept for the callers: sdpa holds nothing of seq x seq size."""
        del seq
        return int(tokens * max(self.block_stage_bytes(dtype).values()))

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
        if self.family == "opt":
            norm = h * b + (width * b if width != h else 0)
        else:
            norm = 8.0 * h + 8
        per_token = max(norm, (width + v) * b, 8 * v) + 8
        return int(tokens * per_token)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ModelSpec:
        try:
            return cls(**data)
        except (TypeError, ValueError) as exc:
            raise ZoError(f"malformed model spec: {exc}") from None


def dtype_bytes(dtype: str) -> int:
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ZoError(f"unknown precision {dtype!r}; use one of {', '.join(DTYPE_BYTES)}") from None


# ---- the catalogue (figures from the published HF config.json files) -------------------
def _opt(name, layers, hidden, heads, *, proj=0, pre_ln=True) -> dict:
    cfg = {"model_type": "opt", "num_hidden_layers": layers, "hidden_size": hidden,
           "ffn_dim": 4 * hidden, "num_attention_heads": heads, "vocab_size": 50272,
           "max_position_embeddings": 2048, "word_embed_proj_dim": proj or hidden,
           "do_layer_norm_before": pre_ln, "tie_word_embeddings": True}
    return {name: cfg}


def _llama(name, layers, hidden, ffn, heads, kv, vocab, *, rope=10000.0, max_pos=4096):
    cfg = {"model_type": "llama", "num_hidden_layers": layers, "hidden_size": hidden,
           "intermediate_size": ffn, "num_attention_heads": heads,
           "num_key_value_heads": kv, "vocab_size": vocab, "head_dim": 128,
           "max_position_embeddings": max_pos, "rope_theta": rope,
           "tie_word_embeddings": False, "rms_norm_eps": 1e-5}
    return {name: cfg}


def _qwen3(name, layers, hidden, ffn, heads, kv, *, tied):
    cfg = {"model_type": "qwen3", "num_hidden_layers": layers, "hidden_size": hidden,
           "intermediate_size": ffn, "num_attention_heads": heads,
           "num_key_value_heads": kv, "vocab_size": 151936, "head_dim": 128,
           "max_position_embeddings": 40960, "rope_theta": 1000000.0,
           "tie_word_embeddings": tied, "rms_norm_eps": 1e-6}
    return {name: cfg}


def _tiny(name: str, family: str) -> dict:
    """Small random-weight models for tests, demos and CPU runs (not published models)."""
    cfg = {"model_type": family, "num_hidden_layers": 4, "hidden_size": 128,
           "num_attention_heads": 4, "vocab_size": 512, "max_position_embeddings": 512,
           "tie_word_embeddings": family != "llama"}
    if family == "opt":
        cfg.update(ffn_dim=512, word_embed_proj_dim=128, do_layer_norm_before=True)
    else:
        cfg.update(intermediate_size=384, num_key_value_heads=2, head_dim=32,
                   rope_theta=10000.0, rms_norm_eps=1e-6)
    return {name: cfg}


CATALOGUE_CONFIGS: dict[str, dict] = {
    **_tiny("tiny-opt", "opt"), **_tiny("tiny-llama", "llama"), **_tiny("tiny-qwen3", "qwen3"),
    # a CPU demo model: big enough that a step is compute, not overhead (~20M params)
    "small-opt": {"model_type": "opt", "num_hidden_layers": 6, "hidden_size": 512,
                  "ffn_dim": 2048, "num_attention_heads": 8, "vocab_size": 2048,
                  "max_position_embeddings": 512, "word_embed_proj_dim": 512,
                  "do_layer_norm_before": True, "tie_word_embeddings": True},
    **_opt("opt-125m", 12, 768, 12), **_opt("opt-350m", 24, 1024, 16, proj=512, pre_ln=False),
    **_opt("opt-1.3b", 24, 2048, 32), **_opt("opt-2.7b", 32, 2560, 32),
    **_opt("opt-6.7b", 32, 4096, 32), **_opt("opt-13b", 40, 5120, 40),
    **_opt("opt-30b", 48, 7168, 56), **_opt("opt-66b", 64, 9216, 72),
    **_opt("opt-175b", 96, 12288, 96),
    **_llama("llama-2-7b", 32, 4096, 11008, 32, 32, 32000),
    **_llama("llama-2-13b", 40, 5120, 13824, 40, 40, 32000),
    **_llama("llama-2-70b", 80, 8192, 28672, 64, 8, 32000),
    **_llama("llama-3-8b", 32, 4096, 14336, 32, 8, 128256, rope=500000.0, max_pos=8192),
    **_llama("llama-3-70b", 80, 8192, 28672, 64, 8, 128256, rope=500000.0, max_pos=8192),
    **_qwen3("qwen3-0.6b", 28, 1024, 3072, 16, 8, tied=True),
    **_qwen3("qwen3-1.7b", 28, 2048, 6144, 16, 8, tied=True),
    **_qwen3("qwen3-4b", 36, 2560, 9728, 32, 8, tied=True),
    **_qwen3("qwen3-8b", 36, 4096, 12288, 32, 8, tied=False),
    **_qwen3("qwen3-14b", 40, 5120, 17408, 40, 8, tied=False),
    **_qwen3("qwen3-32b", 64, 5120, 25600, 64, 8, tied=False),
}


# Sane bounds of a model's shape (the largest published models are far inside them): a
# config outside them is broken, and refused before any size is computed from it.
# ModelSpec field: (HF config key, low, high).
SHAPE_BOUNDS = {
    "num_layers": ("num_hidden_layers", 1, 10_000),
    "hidden": ("hidden_size", 1, 2**20),
    "ffn": ("intermediate_size", 1, 2**22),      # OPT: ffn_dim
    "num_heads": ("num_attention_heads", 1, 2**14),
    "num_kv_heads": ("num_key_value_heads", 1, 2**14),
    "head_dim": ("head_dim", 1, 2**14),
    "vocab": ("vocab_size", 2, 2**24),
    "max_positions": ("max_position_embeddings", 1, 2**24),
    "word_embed_proj_dim": ("word_embed_proj_dim", 0, 2**20),
}
_FLAGS = ("tie_word_embeddings", "do_layer_norm_before", "_remove_final_layer_norm")


def check_shape(values: dict, *, hf_family: str = "") -> None:
    """Raise ValueError naming the first shape figure (a ModelSpec field, or with
    `hf_family` its config.json key) that is not a whole number within SHAPE_BOUNDS, and
    the heads that do not divide what they split."""
    hf_names = bool(hf_family)
    for field_name, (hf_key, low, high) in SHAPE_BOUNDS.items():
        if field_name not in values:
            continue
        value = values[field_name]
        label = field_name
        if hf_names:
            label = "ffn_dim" if field_name == "ffn" and hf_family == "opt" else hf_key
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"{label} must be a whole number, got {value!r}")
        if not low <= value <= high:
            raise ValueError(f"{label} is {value}, outside {low}..{high}")
    heads, kv = values.get("num_heads"), values.get("num_kv_heads")
    if heads and kv and heads % kv:
        raise ValueError(f"num_attention_heads ({heads}) is not a multiple of "
                         f"num_key_value_heads ({kv})" if hf_names else
                         f"num_heads ({heads}) is not a multiple of num_kv_heads ({kv})")


def _config_int(config: dict, key: str, default: int | None = None) -> object:
    """A config figure as given (checked by check_shape); null or absent: `default`."""
    value = config.get(key)
    if value is None:
        if default is None:
            raise KeyError(key)
        return default
    return value


def _config_shape(config: dict, family: str) -> dict:
    """The ModelSpec shape figures of an HF config, checked (ValueError, KeyError)."""
    shape = {"num_layers": _config_int(config, "num_hidden_layers"),
             "hidden": _config_int(config, "hidden_size"),
             "num_heads": _config_int(config, "num_attention_heads"),
             "vocab": _config_int(config, "vocab_size"),
             "max_positions": _config_int(config, "max_position_embeddings")}
    check_shape(shape, hf_family=family)
    hidden, heads = shape["hidden"], shape["num_heads"]
    if family == "opt":
        shape["ffn"] = _config_int(config, "ffn_dim")
        shape["num_kv_heads"] = heads
        shape["word_embed_proj_dim"] = _config_int(config, "word_embed_proj_dim", hidden)
    else:
        shape["ffn"] = _config_int(config, "intermediate_size")
        shape["num_kv_heads"] = _config_int(config, "num_key_value_heads", heads)
    if (family == "opt" or config.get("head_dim") is None) and hidden % heads:
        raise ValueError(f"hidden_size ({hidden}) is not a multiple of num_attention_heads "
                         f"({heads})")
    shape["head_dim"] = (hidden // heads if family == "opt"
                         else _config_int(config, "head_dim", hidden // heads))
    check_shape(shape, hf_family=family)
    for flag in _FLAGS:
        if config.get(flag) is not None and not isinstance(config[flag], bool):
            raise ValueError(f"{flag} must be true or false, got {config[flag]!r}")
    return shape


def spec_from_hf_config(config: dict, *, name: str) -> ModelSpec:
    """Build a ModelSpec from a Hugging Face config dict (OPT, Llama, Qwen3). Every shape
    figure must be a whole number within SHAPE_BOUNDS and the heads must divide what
    they split: anything else is one ZoError naming the config key."""
    family = config.get("model_type")
    if family not in FAMILIES:
        raise ZoError(f"model {name}: model_type {family!r} is not supported "
                      f"(supported: {', '.join(FAMILIES)})")
    try:
        shape = _config_shape(config, family)
        common = dict(name=name, family=family, hf_config=dict(config),
                      **{k: shape[k] for k in ("num_layers", "hidden", "num_heads", "vocab",
                                               "max_positions", "ffn", "num_kv_heads",
                                               "head_dim")})
        if family == "opt":
            wdim = shape["word_embed_proj_dim"]
            pre_ln = bool(config.get("do_layer_norm_before", True))
            remove_final = bool(config.get("_remove_final_layer_norm", False))
            return ModelSpec(**common, tied_head=bool(config.get("tie_word_embeddings", True)),
                             word_embed_proj_dim=wdim if wdim != shape["hidden"] else 0,
                             final_norm=pre_ln and not remove_final)
        return ModelSpec(**common, tied_head=bool(config.get("tie_word_embeddings", False)))
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
    if path.is_dir():
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
def one_block_config(hidden: int, seq: int, family: str = "opt") -> dict:
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


def block_forward_work(hidden: int, batch: int, seq: int, *, dtype_bytes: int,
                       family: str = "opt", split: bool = True) -> dict:
    """The work of one forward of one_block_config's block over batch x seq tokens:
    `flops` (GEMMs; with attention when not `split`), `attn_flops` and `elems`
    (element-wise outputs), and the block's `weight_bytes` (see
    HardwareProfile.forward_time_s)."""
    spec = spec_from_hf_config(one_block_config(hidden, seq, family),
                               name=f"{family}-block-{hidden}")
    tokens = batch * seq
    gemm = tokens * spec.block_gemm_flops_per_token()
    attn = tokens * spec.block_attn_flops_per_token(seq)
    return {"family": family, "hidden": hidden, "batch": batch, "seq": seq, "tokens": tokens,
            "flops": gemm if split else gemm + attn, "attn_flops": attn if split else 0.0,
            "elems": tokens * spec.block_elems_per_token() if split else 0.0,
            "weight_bytes": spec.block_params * dtype_bytes}
