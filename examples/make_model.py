"""Write a small local model folder for the examples: an OPT-style model with seeded
random weights and a word-level tokenizer over the example data's words (nothing is
downloaded). What a user's `--model-path` folder looks like: config.json,
generation_config.json, model.safetensors, tokenizer.json, tokenizer_config.json.

    python examples/make_model.py OUT_DIR [--size micro|tiny] [--seed N]

micro: 2 layers, hidden 32 (26k parameters), a few milliseconds a MeZO step on
a CPU (the tests and scripts/demo.sh); tiny: 4 layers, hidden 128 (about 0.8M). With
random weights the label-word loss of the long sentiment example falls within a few
hundred MeZO steps, but accuracy stays near chance: MeZO fine-tunes what a model already
half knows, and a random model's features barely tell those reviews apart. On the short
reviews of examples/sentiment-short they do, and 600 steps (batch 64, lr 5e-3 decaying
linearly, eps 1e-2) take the micro model from 0.51 to 0.95 held-out (scripts/demo.sh).
The tokenizer splits on whitespace and punctuation; its vocabulary is <s> <pad> </s>
<unk> then every word of examples/*/*.jsonl and of the templates (first seen first).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")        # ids 0..3: bos, pad, eos, unk
EXTRA_TEXT = ("It was terrible great .",)            # the sentiment template and label words
_SPLIT = re.compile(r"\w+|[^\w\s]+")                  # tokenizers' Whitespace pre-tokenizer
SIZES = {"micro": dict(num_hidden_layers=2, hidden_size=32, ffn_dim=64, num_attention_heads=2),
         "tiny": dict(num_hidden_layers=4, hidden_size=128, ffn_dim=512, num_attention_heads=4)}


def example_words() -> list[str]:
    """Every word of the shipped examples (and the templates), first seen first."""
    texts = list(EXTRA_TEXT)
    for path in sorted(HERE.glob("*/*.jsonl")):
        for line in path.read_text().splitlines():
            texts.extend(str(v) for v in json.loads(line).values() if isinstance(v, str))
    return list(dict.fromkeys(w for text in texts for w in _SPLIT.findall(text)))


def make_tokenizer(words):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(dict.fromkeys([*SPECIALS, *words]))}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", pad_token="<pad>",
                                   eos_token="</s>", unk_token="<unk>")


def model_config(size: str, vocab: int) -> dict:
    return {"model_type": "opt", **SIZES[size], "vocab_size": vocab,
            "max_position_embeddings": 128, "word_embed_proj_dim": SIZES[size]["hidden_size"],
            "do_layer_norm_before": True, "tie_word_embeddings": True,
            "bos_token_id": 0, "pad_token_id": 1, "eos_token_id": 2}


def make_model(out, *, size: str = "micro", seed: int = 0) -> Path:
    """Write the model folder at `out` (created; an existing one is replaced file by file)."""
    from transformers import GenerationConfig

    from zoexec.model.families import build_hf_model

    out = Path(out)
    tokenizer = make_tokenizer(example_words())
    vocab = -(-len(tokenizer) // 16) * 16          # a multiple of 16 above the words
    model = build_hf_model(model_config(size, vocab), init="random", seed=seed)
    model.generation_config = GenerationConfig.from_model_config(model.config)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--size", choices=sorted(SIZES), default="micro")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(make_model(args.out, size=args.size, seed=args.seed))


if __name__ == "__main__":
    main()
