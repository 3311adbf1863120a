"""zoexec.data.rowfile: rows read as a run uses them. A JSONL file's index agrees with
a plain parse (blank lines, CRLF, no last newline, lines across read chunks); the
lazy examples give the batches the eager ones gave (same seed, same order); the
preflight check reads only the rows the run's steps use; an over-long row or text is
cut or refused in one line, before it is tokenised."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from zoexec.data import rowfile
from zoexec.data.records import load_records, open_rows
from zoexec.data.section import TaskOptions
from zoexec.data.sources import check_task_data, make_task_source
from zoexec.data.tasks import ExampleRows, Tokens, completion_examples
from zoexec.data.text import JsonlReader, load_tokenizer
from zoplan.errors import ZoError

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from make_model import make_tokenizer  # noqa: E402

WORDS = ("is", "the", "opposite", "of", "hot", "cold", "up", "down", "It", "was", "great",
         "terrible", "film", "fine", "dull", ".")
CLS = TaskOptions(name="classification", template="{sentence} It was",
                  label_words=("terrible", "great"))


@pytest.fixture
def tok_dir(tmp_path):
    make_tokenizer(WORDS).save_pretrained(tmp_path / "tok")
    return tmp_path / "tok"


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_index_matches_a_plain_parse(tmp_path, monkeypatch):
    """Blank and whitespace lines skipped, CRLF ends, no final newline, lines split
    across the index's read chunks (7 bytes here)."""
    monkeypatch.setattr(rowfile, "CHUNK_BYTES", 7)
    text = '{"a": 1}\n\n  \n{"a": "x y"}\r\n\t\n{"a": [1, 2, 3]}               \n   {"a": 4}'
    path = tmp_path / "d.jsonl"
    path.write_text(text)
    want = [json.loads(line) for line in text.splitlines() if line.strip()]
    rows = open_rows(path)
    assert len(rows) == 4 and list(rows) == want and rows[-1] == {"a": 4}
    assert rows[1:3] == want[1:3]


def test_bad_line_named_by_its_line_number(tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"a": 1}\n\n{oops\n')
    rows = open_rows(tmp_path / "bad.jsonl")
    assert rows[0] == {"a": 1}
    with pytest.raises(ZoError, match=r"bad.jsonl:3: not valid JSON"):
        rows[1]


def test_lazy_batches_equal_the_eager_ones(tmp_path, tok_dir):
    """The same seed gives the same batches as every row tokenised up front (the order
    and the rows a resumed run relies on)."""
    rows = [{"prompt": " ".join(WORDS[i % 7:i % 7 + 3]), "completion": " " + WORDS[i % 16]}
            for i in range(37)]
    data = _jsonl(tmp_path / "c.jsonl", rows)
    task = TaskOptions(name="completion")
    lazy = make_task_source(data, task, vocab=32, seed=5, tokenizer_dir=tok_dir, seq=16)
    tokens = Tokens(load_tokenizer(tok_dir, where="x"), vocab=32, where="x")
    eager = ExampleRows(completion_examples(load_records(data), task, tokens, str(data)),
                        pad=tokens.pad, seed=5, path=str(data))
    for step in range(25):   # past two epochs
        a, b = lazy.batch(step, 3, 16), eager.batch(step, 3, 16)
        assert a.ids.tolist() == b.ids.tolist() and a.labels.tolist() == b.labels.tolist()


def test_preflight_reads_only_the_rows_the_steps_use(tmp_path, tok_dir):
    """A broken row the run's batches never reach is not read; every row is read when
    the steps cover the file (or no step count is given)."""
    rows = [{"sentence": "the film", "label": i % 2} for i in range(200)]
    data = tmp_path / "d.jsonl"
    _jsonl(data, rows)
    with data.open("a") as out:
        out.write("{oops\n")
    check_task_data(str(data), CLS, vocab=32, batch=4, seq=16, tokenizer_dir=str(tok_dir), steps=5)
    with pytest.raises(ZoError, match=r"d.jsonl:201: not valid JSON"):
        check_task_data(str(data), CLS, vocab=32, batch=4, seq=16, tokenizer_dir=str(tok_dir))
    with pytest.raises(ZoError, match=r"d.jsonl:201: not valid JSON"):
        check_task_data(str(data), CLS, vocab=32, batch=4, seq=16, tokenizer_dir=str(tok_dir),
                        steps=51)


def test_long_prompt_cut_to_the_same_batch(tmp_path, tok_dir):
    """A prompt past the text budget is cut from the left before it is tokenised: the
    batch (the prompt's last tokens) is the uncut one's."""
    long = " ".join(["the film is fine"] * 400)   # 6,399 characters: over 16 x 32
    data = _jsonl(tmp_path / "c.jsonl", [{"sentence": long, "label": 1}])
    cut = make_task_source(data, CLS, vocab=32, tokenizer_dir=tok_dir, seq=16).batch(0, 1, 16)
    whole = make_task_source(data, CLS, vocab=32, tokenizer_dir=tok_dir).batch(0, 1, 16)
    assert cut.ids.tolist() == whole.ids.tolist() and cut.labels.tolist() == whole.labels.tolist()


def test_long_answer_and_long_row_refused_in_one_line(tmp_path, tok_dir, monkeypatch):
    data = _jsonl(tmp_path / "c.jsonl", [{"prompt": "up", "completion": " down" * 200}])
    with pytest.raises(ZoError, match=r"c.jsonl row 1: the completion is 1,000 characters, more "
                                      r"than the sequence can hold \(128"):
        make_task_source(data, TaskOptions(name="completion"), vocab=32, tokenizer_dir=tok_dir,
                         seq=4)   # the first row is made at once
    monkeypatch.setattr(rowfile, "ROW_BYTES_FLOOR", 100)
    big = _jsonl(tmp_path / "big.jsonl", [{"sentence": "the", "label": 0},
                                          {"sentence": "the film " * 20, "label": 1}])
    rows = open_rows(big, max_row_bytes=rowfile.row_byte_limit(None))
    assert rows[0]["label"] == 0
    with pytest.raises(ZoError, match=r"big.jsonl:2: a row of 208 bytes, over the 100 bytes a row "
                                      r"may hold"):
        rows[1]


def test_text_document_over_the_limit_refused(tmp_path, monkeypatch):
    from zoexec.data import text

    monkeypatch.setattr(text, "ROW_BYTES_FLOOR", 64)
    path = tmp_path / "t.jsonl"
    path.write_text('{"input_ids": [1, 2]}\n' + json.dumps({"input_ids": list(range(30))}) + "\n")
    with pytest.raises(ZoError, match=r"t.jsonl:2: a document over 64 bytes; split it"):
        list(JsonlReader(path, vocab=32).documents())


def test_an_example_is_made_once_while_kept_and_the_kept_ones_are_bounded(monkeypatch):
    """A run's epochs ask for the same rows again: each example is made (read, tokenised)
    once while kept, and no more than KEPT_EXAMPLES are kept."""
    from zoexec.data.rowfile import Examples

    made: list[int] = []
    examples = Examples([{"x": i} for i in range(10)], lambda row, n: made.append(n) or row["x"])
    assert [examples[i] for i in (0, 1, 0, 1, -1)] == [0, 1, 0, 1, 9]
    assert made == [1, 2, 10]
    monkeypatch.setattr(Examples, "KEPT_EXAMPLES", 2)
    few = Examples([{"x": i} for i in range(10)], lambda row, n: made.append(n) or row["x"])
    made.clear()
    assert [few[i] for i in (0, 1, 2, 0)] == [0, 1, 2, 0] and made == [1, 2, 3, 1]
