"""`--task generation`: a prompt and a free-text answer (SQuAD, DROP: MeZO's
question-answering tasks).

Each row: the prompt from `--template` (else the `--prompt-column` as it is); the gold
answers from `--answer-column` (a string, a list of strings, or SQuAD's / DROP's dict
with a "text" / "spans" list). Training: the loss on the first gold answer's tokens
(after a space, none after whitespace) and the EOS, teacher forced, as a completion
row. Evaluation: eval_loss of those rows, and the answer generated greedily through the
block pipeline (zoexec.train.generate): up to `--max-new-tokens` tokens, stopping at
the EOS, or at a newline too with `--stop-at newline` (the squad and drop presets);
scored against every gold answer by exact match and token F1 after SQuAD's
normalisation (lower case, punctuation and the articles a/an/the removed, whitespace
collapsed), the best over the golds, averaged over the examples (eval_exact_match,
eval_f1).
"""

from __future__ import annotations

import collections
import math
import re
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from zoexec.data.batch import Example
from zoexec.data.records import check_columns
from zoexec.data.templates import fill, joiner, template_fields, text_of, texts_of
from zoplan.errors import ZoError

if TYPE_CHECKING:
    from zoexec.data.taskfields import TaskFields


class Tokens(Protocol):
    """What this module uses of zoexec.data.tasks.Tokens (not imported: tasks imports
    this module)."""

    eos: int | None
    pad: int
    tokenizer: Any

    def encode(self, text: str, *, special: bool, what: str,
               where: str | None = None) -> list[int]: ...

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)


# ---- SQuAD's scoring -------------------------------------------------------------------
def normalize_answer(text: str) -> str:
    """SQuAD's normalisation: lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def token_f1(prediction: str, gold: str) -> float:
    """F1 of the normalised answers' token bags (1.0 when both are empty)."""
    pred, true = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not pred or not true:
        return float(pred == true)
    common = sum((collections.Counter(pred) & collections.Counter(true)).values())
    if not common:
        return 0.0
    precision, recall = common / len(pred), common / len(true)
    return 2 * precision * recall / (precision + recall)


def answer_scores(prediction: str, golds: list[str]) -> tuple[float, float]:
    """(exact match, F1) of `prediction`: the best over the gold answers."""
    return (max(exact_match(prediction, g) for g in golds),
            max(token_f1(prediction, g) for g in golds))


def generation_metrics(predictions: list[str], golds: list[list[str]]) -> dict[str, float]:
    """eval_exact_match and eval_f1: the mean over the examples of each one's best."""
    if not predictions:
        return {"eval_exact_match": math.nan, "eval_f1": math.nan}
    scores = [answer_scores(p, g) for p, g in zip(predictions, golds)]
    return {"eval_exact_match": sum(s[0] for s in scores) / len(scores),
            "eval_f1": sum(s[1] for s in scores) / len(scores)}


# ---- rows of a file --------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Answered:
    """A generation example: the prompt, the target (the first gold's tokens and the EOS)
    and every gold answer's text."""

    prompt: tuple[int, ...]
    target: tuple[int, ...]
    golds: tuple[str, ...]

    def example(self) -> Example:
        return Example(self.prompt, self.target)


def prompt_template(spec: TaskFields) -> str:
    """The prompt's template: --template, else the prompt column as it is."""
    return spec.template or "{" + spec.prompt_column + "}"


def generation_examples(rows: Sequence[dict[str, Any]], spec: TaskFields, tokens: Tokens, path: str, *,
                        first: int = 1) -> list[Answered]:
    """The generation examples of `rows` (see the module docstring; the first row is
    row number `first` of the file)."""
    template = prompt_template(spec)
    columns = template_fields(template)
    check_columns(rows, (*columns, spec.answer_column), path)
    out = []
    for number, row in enumerate(rows, start=first):
        where = f"{path} row {number}"
        text = fill(template, {n: text_of(row[n], n, where) for n in columns}, where=where)
        golds = texts_of(row[spec.answer_column], spec.answer_column, where)
        target = tokens.encode(joiner(text) + golds[0], special=False, what="the answer",
                               where=where)
        if not target:
            raise ZoError(f"{where}: the answer {golds[0]!r} tokenises to no tokens")
        if tokens.eos is not None:
            target.append(tokens.eos)
        out.append(Answered(prompt=tuple(tokens.encode(text, special=True, what="the prompt")),
                            target=tuple(target), golds=tuple(golds)))
    return out


@dataclass(kw_only=True)
class Decoding:
    """What the evaluation generates: each example's prompt (fitted to seq minus
    `max_new` tokens), the golds, when to stop (`eos`: the id, `newline`: stop at a
    token whose text holds a newline) and the tokenizer's decode."""

    prompts: list[tuple[int, ...]]
    golds: list[tuple[str, ...]]
    max_new: int
    eos: int | None
    newline: bool
    decode: Callable[..., str]   # the tokenizer's decode
    pad: int

    def stops(self, token: int) -> bool:
        """Does generation end with `token`?"""
        if token == self.eos:
            return True
        return self.newline and "\n" in self.decode([token])

    def answer(self, generated: list[int]) -> str:
        """The answer text of the generated ids: before the EOS and the first newline."""
        if self.eos is not None and self.eos in generated:
            generated = generated[:generated.index(self.eos)]
        text = self.decode(generated, skip_special_tokens=True)
        return text.split("\n")[0].strip() if self.newline else text.strip()

    def metrics(self, generated: list[list[int]]) -> dict[str, float]:
        return generation_metrics([self.answer(g) for g in generated],
                                  [list(g) for g in self.golds])


def decoding_of(examples: list[Answered], spec: TaskFields, tokens: Tokens, *, seq: int) -> Decoding:
    """What the evaluation generates for `examples` (prompts with their demonstrations):
    each prompt's last seq - --max-new-tokens tokens."""
    room = seq - spec.max_new_tokens
    if room < 1:
        raise ZoError(f"--max-new-tokens {spec.max_new_tokens} leaves no room for a prompt in "
                      f"rows of {seq} tokens")
    return Decoding(prompts=[tuple(ex.prompt[-room:]) for ex in examples],
                    golds=[ex.golds for ex in examples], max_new=spec.max_new_tokens,
                    eos=tokens.eos, newline=spec.stop_at == "newline",
                    decode=tokens.tokenizer.decode, pad=tokens.pad)
