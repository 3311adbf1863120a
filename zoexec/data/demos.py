"""Demonstrations (`--demonstrations K`): K training examples with their answers before
each prompt, the in-context (few-shot) baseline MeZO reports beside zero-shot.

The K are fixed by `--demonstrations-seed`: the rows of the demonstrations file (the
training data unless `--demonstrations-data` names another) in one random order of
that seed, the first K of them that are not the example itself (a row equal to it,
column for column, is skipped: the evaluated example never shows its own answer). Each
is the task's own tokens of the row: its prompt (without the tokenizer's leading
special tokens), its answer (the correct label word or candidate, the first gold
answer, the completion without its EOS) and a blank line ("\\n\\n"); they follow the
special tokens the prompt starts with (a BOS) and precede the prompt's text.

A row too long for the sequence loses whole demonstrations first, the first ones
first (`fit`), then prompt tokens from the left (zoexec.data.batch.pack_examples).
Evaluation uses them when K > 0; training only with `--demonstrations-in-training`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

import torch

from zoexec.data.batch import generator
from zoplan.errors import ZoError

if TYPE_CHECKING:
    from zoexec.data.taskfields import TaskFields
    from zoexec.data.tasks import Tokens


class Shown(Protocol):
    """An example of any task type (a dataclass with a prompt; its answer: `target`, or
    `candidates` and `label`)."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    @property
    def prompt(self) -> tuple[int, ...]: ...


E = TypeVar("E", bound=Shown)
Record = dict[str, Any]

_TAG_DEMOS = 0x444D
SEPARATOR = "\n\n"


def demonstrations_from(examples: Sequence[Shown], records: Sequence[Record], *, spec: TaskFields,
                        tokens: Tokens, where: str) -> Demonstrations:
    """The demonstrations of `spec` over a pool: its `records` and the task's
    `examples` of them; `tokens`: the task's tokenizer (zoexec.data.tasks.Tokens)."""
    return Demonstrations(
        examples, records, k=spec.demonstrations, seed=spec.demonstrations_seed,
        prefix=tuple(tokens.encode("", special=True, what="the prompt")),
        separator=tuple(tokens.encode(SEPARATOR, special=False, what="the separator")),
        eos=tokens.eos, where=where)


def answer_ids(example: Shown) -> tuple[int, ...]:
    """The answer a demonstration shows: the correct candidate (classification, multiple
    choice) or the target (completion, generation: without its trailing EOS, `eos`)."""
    if hasattr(example, "candidates") and hasattr(example, "label"):
        return tuple(example.candidates[example.label])
    assert hasattr(example, "target"), "an example without an answer"
    return tuple(example.target)


class Demonstrations:
    """The demonstrations of a task over a pool of examples (the task's own, built from
    the demonstrations file's `records`); `prefix`: the tokens a prompt starts with
    (the tokenizer's special tokens), `separator`: the ids of the blank line."""

    def __init__(self, examples: Sequence[Shown], records: Sequence[Record], *, k: int, seed: int,
                 prefix: tuple[int, ...], separator: tuple[int, ...], eos: int | None,
                 where: str) -> None:
        if len(examples) < k:
            raise ZoError(f"--demonstrations {k}: {where} holds {len(examples)} rows, fewer "
                          f"than {k}")
        order = torch.randperm(len(examples), generator=generator(_TAG_DEMOS, seed)).tolist()
        self.k, self.prefix = k, prefix
        self.order = order[:k + 1] if k else []   # one spare: the example itself may be among them
        self.records = {i: records[i] for i in self.order}   # the shown ones' rows only
        self.shown = {i: self._ids(examples[i], separator, eos) for i in self.order}

    def _ids(self, example: Shown, separator: tuple[int, ...], eos: int | None) -> tuple[int, ...]:
        prompt = tuple(example.prompt)
        if self.prefix and prompt[:len(self.prefix)] == self.prefix:
            prompt = prompt[len(self.prefix):]
        answer = answer_ids(example)
        if not hasattr(example, "candidates") and eos is not None and answer[-1:] == (eos,):
            answer = answer[:-1]
        return prompt + answer + separator

    def chosen(self, record: Record) -> list[int]:
        """The pool indices shown before `record`'s prompt: the first K of the seed's
        order that are not `record` itself."""
        return [i for i in self.order if self.records[i] != record][:self.k]

    def for_record(self, record: Record) -> list[tuple[int, ...]]:
        """The token ids of each demonstration shown before `record`, in order."""
        return [self.shown[i] for i in self.chosen(record)]


def fit(prefix: tuple[int, ...], demos: list[tuple[int, ...]], prompt: tuple[int, ...], *,
        room: int | None) -> tuple[int, ...]:
    """prefix + demonstrations + the prompt (its own `prefix` removed), within `room`
    tokens: whole demonstrations dropped from the first while it is longer (None: all
    kept). What is still too long is cut by pack_examples from the left."""
    body = prompt[len(prefix):] if prefix and prompt[:len(prefix)] == prefix else prompt
    head = prefix if prompt[:len(prefix)] == prefix else ()
    while demos and room is not None and len(head) + sum(map(len, demos)) + len(body) > room:
        demos = demos[1:]
    return tuple(head) + tuple(t for d in demos for t in d) + tuple(body)


def with_demonstrations(examples: list[E], records: Sequence[Record], demos: Demonstrations | None, *,
                        seq: int | None, reserve: Callable[[E], int]) -> list[E]:
    """`examples` (a task's, built from `records` in order) with the demonstrations
    before each prompt, fitted to `seq` minus `reserve(example)` tokens (the target's
    or the candidates' longest, the tokens to generate); unchanged without `demos`."""
    if demos is None or not demos.k:
        return examples
    return [demonstrated(example, record, demos, seq=seq, reserve=reserve)
            for example, record in zip(examples, records)]


def demonstrated(example: E, record: Record, demos: Demonstrations | None, *, seq: int | None,
                 reserve: Callable[[E], int]) -> E:
    """One example (of `record`) with the demonstrations before its prompt (see
    with_demonstrations)."""
    if demos is None or not demos.k:
        return example
    room = None if seq is None else seq - reserve(example)
    prompt = fit(demos.prefix, demos.for_record(record), tuple(example.prompt), room=room)
    return dataclasses.replace(example, prompt=prompt)
