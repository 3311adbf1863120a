"""`zoexec lengths`: the widths of the rows a task's training batches pack, measured
with the task's own code (zoexec.data.tasktypes, zoexec.data.choices), for `zoplan optimize
--lengths` (the file's format and the planner's use of it: zoplan.lengths)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from zoexec.data.batch import IGNORE, Batch, pack_examples
from zoexec.data.choices import ChoiceRows, classification_batch
from zoexec.data.multichoice import MultipleChoiceRows, choice_batch
from zoexec.data.section import TaskOptions
from zoexec.data.sources import make_task_source
from zoexec.data.tasks import ExampleRows
from zoexec.data.text import TOKENIZER_FILES
from zoplan.errors import ZoError
from zoplan.io import check_writable, need_folder, need_input
from zoplan.lengths import LengthsDocument, lengths_document, write_lengths
from zoplan.models import get_model
from zoplan.workload import MAX_SEQ


def example_rows(source: ChoiceRows | MultipleChoiceRows | ExampleRows) -> tuple[list[int], int, float]:
    """(each example's width: the tokens of its batch when packed alone, uncut; the
    rows one example adds to a batch; the mean positions per example whose head a run
    computes: those that predict a label, zoexec.model.heads.gathered_logits) of a
    completion, classification, multiple-choice or generation source. A
    multiple-choice batch pads each example to the most candidates of the batch: the
    file's most is what is priced (exact where every example has as many, as COPA; an
    upper bound where they vary, as ReCoRD)."""
    widths, rows, labelled = [], [], 0
    for batch in _alone(source):
        widths.append(int(batch.ids.shape[1]))
        rows.append(int(batch.rows))
        labelled += int((batch.labels[:, 1:] != IGNORE).sum())   # position i predicts i + 1
    return widths, max(rows), labelled / len(widths)


def _alone(source: ChoiceRows | MultipleChoiceRows | ExampleRows) -> Iterator[Batch]:
    """Each example of `source` as a batch of its own, uncut."""
    def where(number: int) -> str:
        return f"{source.path} row {number}"

    if isinstance(source, ChoiceRows):
        for number, labelled in enumerate(source.examples, start=1):
            yield classification_batch([labelled], loss=source.loss, seq=MAX_SEQ, pad=source.pad,
                                       where=where(number))
    elif isinstance(source, MultipleChoiceRows):
        for number, choice in enumerate(source.examples, start=1):
            yield choice_batch([choice], score=source.score, seq=MAX_SEQ, pad=source.pad,
                               where=where(number))
    else:
        for number, ex in enumerate(source.examples, start=1):
            yield pack_examples([ex], seq=MAX_SEQ, pad=source.pad, where=where(number))


def measure_lengths(data: Path, spec: TaskOptions, *, model_dir: Path, output: Path) -> LengthsDocument:
    """Tokenise `data` as task `spec` with `model_dir`'s tokenizer and write the lengths
    file `output`; returns what it wrote."""
    if spec.type.packed:
        raise ZoError(f"--task {spec.name} packs documents into rows of the plan's seq: every "
                      f"row is full, so there are no lengths to measure (plan without --lengths)")
    _check_model_dir(model_dir)
    check_writable(output, what="the lengths file", inputs=(data,))
    need_input(data, what="data")
    vocab = get_model(str(model_dir)).vocab
    source = make_task_source(str(data), spec, vocab=vocab, tokenizer_dir=str(model_dir))
    if not source.examples:
        raise ZoError(f"data file {data} holds no examples")
    widths, per, head = example_rows(source)
    doc = lengths_document(data=str(data), task=spec.record(), tokenizer=str(model_dir),
                           rows_per_example=per, widths=widths, head_positions=head)
    write_lengths(output, doc)
    return doc


def _check_model_dir(model_dir: Path) -> None:
    need_folder(model_dir, what="--model-path")
    if not (Path(model_dir) / "config.json").is_file():
        raise ZoError(f"--model-path {model_dir} is not a model folder (no config.json)")
    if not any((Path(model_dir) / name).is_file() for name in TOKENIZER_FILES):
        raise ZoError(f"--model-path {model_dir} holds no tokenizer (no "
                      f"{', '.join(TOKENIZER_FILES)})")
