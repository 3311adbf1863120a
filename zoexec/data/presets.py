"""Task presets (`--task-preset NAME`): the templates, label words, candidates and columns
of the tasks MeZO fine-tunes, written from the MeZO paper's table of prompts (Malladi et
al., 2023, appendix: "the prompts of the datasets we used in our OPT experiments").

The user brings the data files, in the columns of the HF datasets (SuperGLUE's for
rte, cb, boolq, wsc, wic, multirc, copa, record; GLUE's sst2; squad; drop). A preset
is a set of default option values (`values`: TaskOptions field names); an option given
on the command line wins over the preset's. Two presets add derived fields a template
may name besides the columns (`derive`, `derive_choice`): COPA's premise without its
final period, its connector and its choices with a lower-case first letter; ReCoRD's
passage with its "@highlight" lines as "- " items and its query with the candidate
entity in place of "@placeholder".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from zoplan.errors import ZoError

Row = dict[str, Any]          # a data row: its columns' values
Fields = dict[str, str]       # fields a preset derives from a row, for its templates

# the task types (--task; a preset names one of them)
TASKS = ("text", "completion", "classification", "multiple-choice", "generation")
YES_NO = ("No", "Yes")   # SuperGLUE's boolean labels: 0 False, 1 True


@dataclass(frozen=True, kw_only=True)
class Preset:
    """A task's defaults (`values`: option field -> value) and its derived fields: the
    names (`derived`, `choice_derived`) and the functions computing them from a row
    (and a candidate)."""

    name: str
    values: dict[str, Any]
    derived: tuple[str, ...] = ()
    derive: Callable[[Row], Fields] | None = None
    choice_derived: tuple[str, ...] = ()
    derive_choice: Callable[[Row, str], Fields] | None = None
    note: str = ""
    columns: tuple[str, ...] = field(default=())

    def fields(self, row: Row, where: str) -> Fields:
        """The derived fields of `row` ({} without any); ZoError naming `where` (the
        row) and the column when the row cannot give them."""
        return _named(where, self.derive, row) if self.derive else {}

    def choice_fields(self, row: Row, choice: str, where: str) -> Fields:
        return _named(where, self.derive_choice, row, choice) if self.derive_choice else {}


def _named(where: str, derive: Callable[..., Fields], *args: Any) -> Fields:
    try:
        return derive(*args)
    except ValueError as exc:
        raise ZoError(f"{where}: {exc}") from None


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]


def _copa(row: Row) -> Fields:
    premise = str(row.get("premise", "")).rstrip()
    question = str(row.get("question", "")).strip()
    if question not in ("cause", "effect"):
        raise ValueError(f"column 'question' is {question!r}, not 'cause' or 'effect'")
    for column in ("choice1", "choice2"):
        if not str(row.get(column, "")).strip():
            raise ValueError(f"column {column!r} is empty: an empty candidate scores no tokens "
                             f"and always wins")
    return {"premise_stem": premise[:-1] if premise.endswith(".") else premise,
            "connector": "because" if question == "cause" else "so",
            "choice1_lc": _lower_first(str(row.get("choice1", ""))),
            "choice2_lc": _lower_first(str(row.get("choice2", "")))}


def _record(row: Row) -> Fields:
    return {"passage_items": str(row.get("passage", "")).replace("@highlight\n", "- ")}


def _record_choice(row: Row, choice: str) -> Fields:
    query = str(row.get("query", ""))
    if "@placeholder" not in query:
        raise ValueError("column 'query' holds no @placeholder: every candidate would read "
                         "the same query")
    return {"filled_query": query.replace("@placeholder", choice)}


def _classification(template: str, words: tuple[str, ...]) -> dict[str, Any]:
    return {"name": "classification", "template": template, "label_words": words,
            "label_column": "label"}


PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset(name="sst2", values=_classification("{sentence} It was", ("terrible", "great")),
           columns=("sentence", "label")),
    Preset(name="rte", values=_classification(
        '{premise}\nDoes this mean that "{hypothesis}" is true? Yes or No?\n', ("Yes", "No")),
        columns=("premise", "hypothesis", "label")),
    Preset(name="cb", values=_classification(
        'Suppose {premise} Can we infer that "{hypothesis}"? Yes, No, or Maybe?\n',
        ("Yes", "No", "Maybe")), columns=("premise", "hypothesis", "label")),
    Preset(name="boolq", values=_classification("{passage} {question}?\n", YES_NO),
           columns=("passage", "question", "label")),
    Preset(name="wsc", values=_classification(
        '{text}\nIn the previous sentence, does the pronoun "{span2_text}" refer to '
        '{span1_text}? Yes or No?\n', YES_NO),
        columns=("text", "span1_text", "span2_text", "label")),
    Preset(name="wic", values=_classification(
        'Does the word "{word}" have the same meaning in these two sentences? Yes, No?\n'
        '{sentence1}\n{sentence2}\n', YES_NO),
        columns=("word", "sentence1", "sentence2", "label")),
    Preset(name="multirc", values=_classification(
        '{paragraph}\nQuestion: {question}\nI found this answer "{answer}". Is that correct? '
        'Yes or No?\n', YES_NO), columns=("paragraph", "question", "answer", "label")),
    Preset(name="copa", values={"name": "multiple-choice", "template": "{premise_stem} {connector}",
                                "choices": ("{choice1_lc}", "{choice2_lc}"), "label_column": "label"},
           derived=("premise_stem", "connector", "choice1_lc", "choice2_lc"), derive=_copa,
           columns=("premise", "choice1", "choice2", "question", "label")),
    Preset(name="record", values={"name": "multiple-choice", "template": "{passage_items}\n",
                                  "choices_column": "entities", "choices": ("{filled_query}",),
                                  "label_column": "answers"},
           derived=("passage_items",), derive=_record, choice_derived=("filled_query",),
           derive_choice=_record_choice, columns=("passage", "query", "entities", "answers")),
    Preset(name="squad", values={
        "name": "generation", "template": "Title: {title}\nContext: {context}\nQuestion: "
        "{question}\nAnswer:", "answer_column": "answers", "stop_at": "newline"},
        columns=("title", "context", "question", "answers")),
    Preset(name="drop", values={
        "name": "generation", "template": "Passage: {passage}\nQuestion: {question}\nAnswer:",
        "answer_column": "answers_spans", "stop_at": "newline"},
        columns=("passage", "question", "answers_spans")),
)}
PRESET_NAMES = tuple(PRESETS)


def preset(name: str | None) -> Preset | None:
    """The preset `name` (None: none)."""
    if name is None:
        return None
    if name not in PRESETS:
        raise ZoError(f"--task-preset {name!r}: give one of {', '.join(PRESETS)}")
    return PRESETS[name]


def with_preset(values: dict[str, Any]) -> dict[str, Any]:
    """Option values ({field: value}) with the defaults of `values["task_preset"]` under
    them: what was given wins."""
    chosen = preset(values.get("task_preset"))
    return values if chosen is None else {**chosen.values, **values}
