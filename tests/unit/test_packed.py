"""zoexec.data.packed: packed text read and tokenised as the batches need it, the same
rows as packing the whole file, a resume at the same row, chunks shared between the
processes of a launch (the tokenizer called once a node) and checked before trusted."""

from __future__ import annotations

import json
import multiprocessing as mp
import pickle
import tempfile
from pathlib import Path

import pytest
import torch

from zoexec.data import packed
from zoexec.data.batch import IGNORE, EpochOrder, Example, pack_examples
from zoexec.data.choices import subset
from zoexec.data.section import TaskOptions
from zoexec.data.sources import make_eval_set
from zoexec.data.text import _TAG_JSONL, EvalRows, JsonlReader, TextData, check_data
from zoplan.errors import ZoError

WORDS = ["[UNK]", "</s>", "hello", "world", "big", "cat"]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    folder = tmp_path_factory.mktemp("tok")
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]",
                            eos_token="</s>").save_pretrained(folder)
    return folder


@pytest.fixture
def small(monkeypatch):
    """Chunks of 16 tokens, pieces of 12 characters: a small file spans several."""
    monkeypatch.setattr(packed, "CHUNK_TOKENS", 16)
    monkeypatch.setattr(packed, "PIECE_CHARS", 12)


def _docs(path: Path, count: int) -> Path:
    rows = []
    for i in range(count):
        words = " ".join(WORDS[2 + (i * 7 + k) % 4] for k in range(1 + (i * 5) % 9))
        rows.append({"text": words} if i % 3 else {"input_ids": [2 + (i + k) % 4 for k in range(i % 6)]})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _eager(path: Path, tok_dir: Path, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every row of `seq` as the reader before the lazy one packed them: every document
    tokenised whole, joined, cut (JsonlReader is that reader)."""
    stream, first = [], []
    for ids in JsonlReader(path, vocab=len(WORDS), tokenizer_dir=tok_dir).documents():
        first += [1] + [0] * (len(ids) - 1) if ids else []
        stream += ids
    rows = len(stream) // seq
    ids = torch.tensor(stream[:rows * seq]).view(rows, seq)
    return ids, ids.masked_fill(torch.tensor(first[:rows * seq], dtype=torch.bool).view(rows, seq), IGNORE)


@pytest.mark.parametrize("seq", [3, 40])
def test_rows_are_those_of_the_whole_file_packed_and_every_epoch_visits_each_once(tmp_path, tok_dir,
                                                                                    small, seq):
    path = _docs(tmp_path / "d.jsonl", 30)
    ids, labels = _eager(path, tok_dir, seq)
    data = TextData(path, vocab=len(WORDS), tokenizer_dir=tok_dir, seed=3)
    batch, steps = 4, -(-2 * ids.shape[0] // 4)   # two epochs and a bit
    for epoch in range(2):
        seen: list[int] = []
        for step in range(steps):
            picks = data.picks(step, batch, seq)
            got = data.batch(step, batch, seq)
            assert torch.equal(got.ids, ids[picks]) and torch.equal(got.labels, labels[picks])
            seen += [p for k, p in zip(range(step * batch, (step + 1) * batch), picks)
                     if k // ids.shape[0] == epoch]
        assert sorted(seen) == list(range(ids.shape[0])), epoch
    assert torch.equal(data.rows(seq).ids, ids) and torch.equal(data.rows(seq).labels, labels)


def test_a_file_of_one_block_keeps_the_order_of_the_eager_reader(tmp_path, tok_dir):
    path = _docs(tmp_path / "d.jsonl", 40)
    data = TextData(path, vocab=len(WORDS), tokenizer_dir=tok_dir, seed=5)
    count = data.rows(4).rows
    order = EpochOrder(_TAG_JSONL, 5)
    for step in (0, 1, 7, 30):
        assert data.picks(step, 3, 4) == order.picks(step, 3, count)


def test_a_resume_takes_the_same_rows_without_the_steps_before(tmp_path, tok_dir, small):
    path = _docs(tmp_path / "d.jsonl", 60)
    whole = TextData(path, vocab=len(WORDS), tokenizer_dir=tok_dir, seed=1)
    before = [whole.batch(step, 2, 5) for step in range(40)]
    for start in (3, 17, 33):
        resumed = TextData(path, vocab=len(WORDS), tokenizer_dir=tok_dir, seed=1)
        for step in range(start, 40):
            got = resumed.batch(step, 2, 5)
            assert torch.equal(got.ids, before[step].ids) and torch.equal(got.labels, before[step].labels)


def test_a_short_run_reads_the_start_of_the_file_only(tmp_path, tok_dir, small):
    """A bad line past what 5 steps use is never read (the eager reader refused the file)."""
    path = _docs(tmp_path / "d.jsonl", 200)
    with path.open("a") as out:
        out.write("{oops\n")
    data = TextData(path, vocab=len(WORDS), tokenizer_dir=tok_dir)
    for step in range(5):
        data.batch(step, 2, 4)
    check_data(str(path), vocab=len(WORDS), batch=2, seq=4, tokenizer_dir=tok_dir, steps=5)
    assert max(data.chunks.heads) < 5 and data.epoch_of(4) is None   # the end not known yet
    with pytest.raises(ZoError, match=r"d.jsonl:201: not valid JSON"):
        check_data(str(path), vocab=len(WORDS), batch=2, seq=4, tokenizer_dir=tok_dir)


def test_a_long_document_is_tokenised_in_pieces(tmp_path, tok_dir, small, monkeypatch):
    text = " ".join(WORDS[2 + k % 4] for k in range(500))
    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps({"text": text}) + "\n" + json.dumps({"text": "cat"}) + "\n")
    longest: list[int] = []
    encode = packed.Packer.encode

    def counted(self, piece, **kwargs):
        longest.append(len(piece))
        return encode(self, piece, **kwargs)

    monkeypatch.setattr(packed.Packer, "encode", counted)
    data = TextData(path, vocab=len(WORDS), tokenizer_dir=tok_dir)
    ids, labels = _eager(path, tok_dir, 7)
    assert torch.equal(data.rows(7).ids, ids) and torch.equal(data.rows(7).labels, labels)
    assert max(longest) <= packed.PIECE_CHARS and len(longest) > 40


# ---- shared between the processes of a launch ---------------------------------------------------
def _rank(folder: str, path: str, tok_dir: str, out: mp.Queue) -> None:
    tempfile.tempdir = folder
    data = TextData(path, vocab=len(WORDS), tokenizer_dir=tok_dir, seed=2)
    out.put([data.batch(step, 2, 5).ids.tolist() for step in range(30)])


def test_the_processes_of_a_launch_tokenise_each_chunk_once(tmp_path, tok_dir, small, monkeypatch):
    path = _docs(tmp_path / "d.jsonl", 60)
    calls = tmp_path / "calls"
    encode = packed.Packer.encode

    def counted(self, piece, **kwargs):
        with calls.open("a") as log:
            log.write(piece + "\n")
        return encode(self, piece, **kwargs)

    monkeypatch.setattr(packed.Packer, "encode", counted)
    folder = tmp_path / "zoexec-rdzv-test"
    folder.mkdir()
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    ranks = [ctx.Process(target=_rank, args=(str(folder), str(path), str(tok_dir), out))
             for _ in range(2)]
    for rank in ranks:
        rank.start()
    got = [out.get(timeout=120) for _ in ranks]
    for rank in ranks:
        rank.join(timeout=60)
        assert rank.exitcode == 0
    by_ranks = len(calls.read_text().splitlines())
    alone = tmp_path / "zoexec-rdzv-alone"
    alone.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(alone))   # one process, its chunks kept as files
    mine = TextData(path, vocab=len(WORDS), tokenizer_dir=tok_dir, seed=2)
    want = [mine.batch(step, 2, 5).ids.tolist() for step in range(30)]
    assert got == [want, want]
    assert by_ranks == len(calls.read_text().splitlines()) - by_ranks > 0   # two processes tokenised what one does alone
    names = sorted(p.name for p in (folder / "tokens").iterdir())
    assert [n for n in names if not n.endswith(".tok")] == [f"{mine.chunks.name}.lock"]   # no temporary left


def test_a_chunk_file_is_checked_before_it_is_trusted(tmp_path, tok_dir, small, monkeypatch):
    path = _docs(tmp_path / "d.jsonl", 30)
    folder = tmp_path / "zoexec-rdzv-test"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    want = TextData(path, vocab=len(WORDS), tokenizer_dir=tok_dir).rows(4)
    files = sorted((folder / "tokens").glob("*.tok"))
    assert len(files) > 2
    files[0].write_bytes(files[0].read_bytes()[:-3])                 # cut short
    raw = bytearray(files[1].read_bytes())
    raw[-1] ^= 1                                                      # a flipped bit
    files[1].write_bytes(bytes(raw))
    files[2].write_bytes(files[2].read_bytes().replace(b'"chunk": 2', b'"chunk": 9'))   # another's
    made = []
    make = packed.Packer.make
    monkeypatch.setattr(packed.Packer, "make", lambda self, *a: made.append(1) or make(self, *a))
    again = TextData(path, vocab=len(WORDS), tokenizer_dir=tok_dir).rows(4)
    assert torch.equal(again.ids, want.ids) and torch.equal(again.labels, want.labels)
    assert len(made) == 3   # the three bad files made again, the others read


# ---- a line too long to read whole ----------------------------------------------------------------
@pytest.fixture
def tiny_lines(monkeypatch, small):
    """Lines over 64 bytes are read in pieces, scanned 16 bytes at a time."""
    from zoexec.data import hugeline

    monkeypatch.setattr(packed, "ROW_BYTES_FLOOR", 64)
    monkeypatch.setattr(hugeline, "CHUNK", 16)


def test_a_line_too_long_to_read_is_tokenised_in_pieces_as_the_whole(tmp_path, tok_dir, tiny_lines):
    long = " ".join(WORDS[2 + k % 4] for k in range(60))
    rows = [{"text": "cat"}, {"id": "x\\\"{[", "text": long + "\n\t\"é\" big", "n": [1, {"a": "]"}]},
            {"input_ids": [2, 3]}, {"text": "hello " + long}]
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=i % 2 == 0) + "\n" for i, r in enumerate(rows)))
    data = TextData(path, vocab=len(WORDS), tokenizer_dir=tok_dir)
    ids, labels = _eager(path, tok_dir, 5)   # read whole (16 MiB a line)
    assert torch.equal(data.rows(5).ids, ids) and torch.equal(data.rows(5).labels, labels)
    resumed = TextData(path, vocab=len(WORDS), tokenizer_dir=tok_dir)
    assert torch.equal(resumed.batch(9, 3, 5).ids, data.batch(9, 3, 5).ids)


@pytest.mark.parametrize("line,says", [
    ('{"input_ids": [' + "1, " * 40 + "1]}", r"d.jsonl:2: a document of 64 bytes or more given as 'input_ids'"),
    ('{"label": "' + "a" * 80 + '"}', r"d.jsonl:2: expected an object with 'text' \(string\)"),
    ('["' + "a" * 80 + '"]', r"d.jsonl:2: not valid JSON \(expected one object on the line\)"),
    ('{"text": "' + "a " * 40 + '"', r"d.jsonl:2: not valid JSON \(the object does not end"),
    ('{"text": "' + "a " * 40 + '\x01"}', r"d.jsonl:2: not valid JSON in the text"),
])
def test_a_bad_line_too_long_to_read_is_one_line(tmp_path, tok_dir, tiny_lines, line, says):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "cat"}\n' + line + "\n")
    with pytest.raises(ZoError, match=says):
        TextData(path, vocab=len(WORDS), tokenizer_dir=tok_dir).rows(2)


def test_a_node_keeps_a_bounded_number_of_chunk_files(tmp_path, tok_dir, small, monkeypatch):
    path = _docs(tmp_path / "d.jsonl", 30)
    folder = tmp_path / "zoexec-rdzv-test"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    monkeypatch.setattr(packed, "SHARED_FILES", 2)
    data = TextData(path, vocab=len(WORDS), tokenizer_dir=tok_dir)
    rows = data.rows(4)
    assert len(list((folder / "tokens").glob("*.tok"))) == 2 and len(data.chunks.heads) > 4
    monkeypatch.setattr(packed, "KEPT", 1)   # read again: the removed chunks made again
    again = TextData(path, vocab=len(WORDS), tokenizer_dir=tok_dir).rows(4)
    assert torch.equal(again.ids, rows.ids) and torch.equal(again.labels, rows.labels)


# ---- evaluation rows: made from the chunks as they are read ---------------------------------------
def _eager_eval(path: Path, tok_dir: Path, seq: int) -> list[Example]:
    """The evaluation rows as the eager reader made them: every token of the file in
    rows of `seq` (the last shorter), the document starts skipped."""
    stream: list[int] = []
    first: list[int] = []
    for ids in JsonlReader(path, vocab=len(WORDS), tokenizer_dir=tok_dir).documents():
        first += [1] + [0] * (len(ids) - 1) if ids else []
        stream += ids
    return [Example((), tuple(stream[s:s + seq]), tuple(i for i, f in enumerate(first[s:s + seq]) if f))
            for s in range(0, len(stream), seq)]


@pytest.mark.parametrize("samples", [None, 5])
def test_eval_rows_are_the_eager_rows_made_as_they_are_read(tmp_path, tok_dir, small, monkeypatch,
                                                            samples):
    monkeypatch.setattr(packed, "KEPT", 2)
    path = _docs(tmp_path / "d.jsonl", 30)
    seq = 7
    want = _eager_eval(path, tok_dir, seq)
    assert len(want[-1].target) < seq and len(want) * seq > 4 * packed.CHUNK_TOKENS   # a short last row
    evals = make_eval_set(path, TaskOptions(), vocab=len(WORDS), seq=seq, tokenizer_dir=str(tok_dir),
                          samples=samples)
    if samples is not None:
        assert evals.rows == [want[i] for i in subset(len(want), samples)]
        return
    rows = evals.rows
    assert isinstance(rows, EvalRows) and len(rows) == len(want)   # the sequence itself, not a list
    assert list(rows) == want and rows[-1] == want[-1] and rows[3] == want[3]
    assert rows[2:9] == want[2:9] and rows[::4] == want[::4] and rows[len(want) - 2:] == want[-2:]
    assert pickle.loads(pickle.dumps(rows))[5:7] == want[5:7]   # rebuilt from the file
    with pytest.raises(IndexError):
        rows[len(want)]


def test_evaluating_a_long_file_never_holds_its_stream(tmp_path, tok_dir, small, monkeypatch):
    """The held-out file of many chunks is read in order, a chunk made once a pass,
    at most KEPT kept; the whole stream (TextData._all) is never built."""
    monkeypatch.setattr(packed, "KEPT", 2)
    path = _docs(tmp_path / "d.jsonl", 60)
    seq, call = 5, 4
    want = _eager_eval(path, tok_dir, seq)

    def whole(self):
        raise AssertionError("the whole stream read")

    monkeypatch.setattr(TextData, "_all", whole)
    evals = make_eval_set(path, TaskOptions(), vocab=len(WORDS), seq=seq, tokenizer_dir=str(tok_dir))
    chunks = evals.rows.data.chunks
    made: list[int] = []
    make = packed.Packer.make
    monkeypatch.setattr(packed.Packer, "make", lambda self, *a: made.append(1) or make(self, *a))
    count = len(evals.rows)
    for start in range(0, count, call):   # as zoexec.run.evaluate.Evaluator.run calls it
        got = evals.pack(start, min(start + call, count), rows=call, seq=seq)
        expect = pack_examples(want[start:start + call] + [Example((), ())] * (start + call - min(start + call, count)),
                               seq=seq, pad=0)
        assert torch.equal(got.ids, expect.ids) and torch.equal(got.labels, expect.labels)
        assert len(chunks._kept) <= packed.KEPT
    assert len(chunks.heads) > 2 * packed.KEPT and len(made) <= len(chunks.heads)
