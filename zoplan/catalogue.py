"""The catalogue: each model `--model NAME` names, as the Hugging Face `config.json`
(zoplan.models.spec_from_hf_config reads it; zoplan.models.get_model looks names up here).

Sources: each catalogue entry's shape (hidden size, layers, heads, key-value heads,
FFN size, vocabulary, positions, tied embeddings) is copied from the model's published
config.json on the Hugging Face Hub (facebook/opt-*, meta-llama/Llama-2-*-hf and
Meta-Llama-3-*, Qwen/Qwen3-*, Qwen/Qwen2.5-*, mistralai/Mistral-7B-v0.1 and -v0.3,
google/gemma-*, openai-community/gpt2*, EleutherAI/pythia-*), OPT-175B's (not on the Hub) from table 1 of the OPT
paper (Zhang et al., arXiv 2205.01068); the tiny and small test models are our own
shapes, built with random weights.
"""

from __future__ import annotations

from typing import Any

Config = dict[str, Any]      # a config.json as Hugging Face writes it
Entry = dict[str, Config]     # catalogue name -> its config


def _opt(name: str, layers: int, hidden: int, heads: int, *, proj: int = 0,
         pre_ln: bool = True) -> Entry:
    cfg = {"model_type": "opt", "num_hidden_layers": layers, "hidden_size": hidden,
           "ffn_dim": 4 * hidden, "num_attention_heads": heads, "vocab_size": 50272,
           "max_position_embeddings": 2048, "word_embed_proj_dim": proj or hidden,
           "do_layer_norm_before": pre_ln, "tie_word_embeddings": True}
    return {name: cfg}


def _llama(name: str, layers: int, hidden: int, ffn: int, heads: int, kv: int, vocab: int, *,
           rope: float = 10000.0, max_pos: int = 4096) -> Entry:
    cfg = {"model_type": "llama", "num_hidden_layers": layers, "hidden_size": hidden,
           "intermediate_size": ffn, "num_attention_heads": heads,
           "num_key_value_heads": kv, "vocab_size": vocab, "head_dim": 128,
           "max_position_embeddings": max_pos, "rope_theta": rope,
           "tie_word_embeddings": False, "rms_norm_eps": 1e-5}
    return {name: cfg}


def _qwen3(name: str, layers: int, hidden: int, ffn: int, heads: int, kv: int, *,
           tied: bool) -> Entry:
    cfg = {"model_type": "qwen3", "num_hidden_layers": layers, "hidden_size": hidden,
           "intermediate_size": ffn, "num_attention_heads": heads,
           "num_key_value_heads": kv, "vocab_size": 151936, "head_dim": 128,
           "max_position_embeddings": 40960, "rope_theta": 1000000.0,
           "tie_word_embeddings": tied, "rms_norm_eps": 1e-6}
    return {name: cfg}


def _qwen2(name: str, layers: int, hidden: int, ffn: int, heads: int, kv: int, *, tied: bool,
           vocab: int = 151936, max_pos: int = 32768) -> Entry:
    cfg = {"model_type": "qwen2", "num_hidden_layers": layers, "hidden_size": hidden,
           "intermediate_size": ffn, "num_attention_heads": heads,
           "num_key_value_heads": kv, "vocab_size": vocab, "max_position_embeddings": max_pos,
           "rope_theta": 1000000.0, "tie_word_embeddings": tied, "rms_norm_eps": 1e-6,
           "use_sliding_window": False}
    return {name: cfg}


def _gemma(name: str, family: str, layers: int, hidden: int, ffn: int, heads: int, kv: int, *,
           head_dim: int = 256) -> Entry:
    cfg = {"model_type": family, "num_hidden_layers": layers, "hidden_size": hidden,
           "intermediate_size": ffn, "num_attention_heads": heads, "num_key_value_heads": kv,
           "head_dim": head_dim, "vocab_size": 256000, "max_position_embeddings": 8192,
           "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True}
    if family == "gemma2":
        cfg.update(sliding_window=4096, query_pre_attn_scalar=head_dim,
                   attn_logit_softcapping=50.0, final_logit_softcapping=30.0)
    return {name: cfg}


def _gpt2(name: str, layers: int, hidden: int, heads: int) -> Entry:
    cfg = {"model_type": "gpt2", "n_layer": layers, "n_embd": hidden, "n_head": heads,
           "n_positions": 1024, "vocab_size": 50257, "tie_word_embeddings": True}
    return {name: cfg}


def _pythia(name: str, layers: int, hidden: int, heads: int) -> Entry:
    cfg = {"model_type": "gpt_neox", "num_hidden_layers": layers, "hidden_size": hidden,
           "intermediate_size": 4 * hidden, "num_attention_heads": heads, "vocab_size": 50304,
           "max_position_embeddings": 2048, "rotary_pct": 0.25, "rotary_emb_base": 10000,
           "use_parallel_residual": True, "tie_word_embeddings": False}
    return {name: cfg}


def _tiny(name: str, family: str) -> Entry:
    """Small random-weight models for tests, demos and CPU runs (not published models)."""
    cfg = {"model_type": family, "num_hidden_layers": 4, "hidden_size": 128,
           "num_attention_heads": 4, "vocab_size": 512, "max_position_embeddings": 512,
           "tie_word_embeddings": family not in ("llama", "mistral", "gpt_neox")}
    if family == "opt":
        cfg.update(ffn_dim=512, word_embed_proj_dim=128, do_layer_norm_before=True)
    elif family == "gpt2":
        cfg = {"model_type": "gpt2", "n_layer": 4, "n_embd": 128, "n_head": 4, "n_inner": 512,
               "vocab_size": 512, "n_positions": 512, "tie_word_embeddings": True}
    elif family == "gpt_neox":
        cfg.update(intermediate_size=512, rotary_pct=0.25, use_parallel_residual=True)
    else:
        cfg.update(intermediate_size=384, num_key_value_heads=2, head_dim=32,
                   rope_theta=10000.0, rms_norm_eps=1e-6)
    if family == "gemma2":
        cfg.update(sliding_window=256, query_pre_attn_scalar=32, attn_logit_softcapping=50.0,
                   final_logit_softcapping=30.0)
    return {name: cfg}


CATALOGUE_CONFIGS: dict[str, Config] = {
    **_tiny("tiny-opt", "opt"), **_tiny("tiny-llama", "llama"), **_tiny("tiny-qwen3", "qwen3"),
    **_tiny("tiny-qwen2", "qwen2"), **_tiny("tiny-mistral", "mistral"),
    **_tiny("tiny-gemma", "gemma"), **_tiny("tiny-gemma2", "gemma2"),
    **_tiny("tiny-gpt2", "gpt2"), **_tiny("tiny-gptneox", "gpt_neox"),
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
    **_qwen2("qwen2.5-0.5b", 24, 896, 4864, 14, 2, tied=True),
    **_qwen2("qwen2.5-1.5b", 28, 1536, 8960, 12, 2, tied=True),
    **_qwen2("qwen2.5-3b", 36, 2048, 11008, 16, 2, tied=True),
    **_qwen2("qwen2.5-7b", 28, 3584, 18944, 28, 4, tied=False, vocab=152064, max_pos=131072),
    "mistral-7b-v0.1": {"model_type": "mistral", "num_hidden_layers": 32, "hidden_size": 4096,
                        "intermediate_size": 14336, "num_attention_heads": 32,
                        "num_key_value_heads": 8, "vocab_size": 32000,
                        "max_position_embeddings": 32768, "rope_theta": 10000.0,
                        "sliding_window": 4096, "rms_norm_eps": 1e-5, "tie_word_embeddings": False},
    "mistral-7b-v0.3": {"model_type": "mistral", "num_hidden_layers": 32, "hidden_size": 4096,
                        "intermediate_size": 14336, "num_attention_heads": 32,
                        "num_key_value_heads": 8, "vocab_size": 32768,
                        "max_position_embeddings": 32768, "rope_theta": 1000000.0,
                        "sliding_window": None, "rms_norm_eps": 1e-5, "tie_word_embeddings": False},
    **_gemma("gemma-2b", "gemma", 18, 2048, 16384, 8, 1),
    **_gemma("gemma-7b", "gemma", 28, 3072, 24576, 16, 16),
    **_gemma("gemma-2-2b", "gemma2", 26, 2304, 9216, 8, 4),
    **_gemma("gemma-2-9b", "gemma2", 42, 3584, 14336, 16, 8),
    **_gpt2("gpt2", 12, 768, 12), **_gpt2("gpt2-medium", 24, 1024, 16),
    **_gpt2("gpt2-large", 36, 1280, 20), **_gpt2("gpt2-xl", 48, 1600, 25),
    **_pythia("pythia-70m", 6, 512, 8), **_pythia("pythia-160m", 12, 768, 12),
    **_pythia("pythia-410m", 24, 1024, 16), **_pythia("pythia-1b", 16, 2048, 8),
    **_pythia("pythia-1.4b", 24, 2048, 16),
}
