"""zoexec.data.text: synthetic task, JSONL files, sharding."""

import json

import pytest
import torch

from zoexec.data.batch import shard
from zoexec.data.sources import make_source
from zoexec.data.text import JsonlData, SyntheticTask, TextData
from zoplan.errors import ZoError


def test_synthetic_batches_are_deterministic_and_follow_the_cycle():
    task = SyntheticTask(vocab=512, seed=3)
    batch = task.batch(7, 4, 20)
    assert batch.shape == (4, 20) and batch.dtype == torch.long
    assert torch.equal(batch, SyntheticTask(vocab=512, seed=3).batch(7, 4, 20))
    assert not torch.equal(batch, task.batch(8, 4, 20))
    assert not torch.equal(batch, SyntheticTask(vocab=512, seed=4).batch(7, 4, 20))
    assert batch.min() >= 0 and batch.max() < 512
    assert len(batch.unique()) <= task.alphabet
    successor = {int(a): int(b) for a, b in zip(task.cycle, task.cycle.roll(-1))}
    assert all(successor[int(a)] == int(b) for row in batch for a, b in zip(row[:-1], row[1:]))


def test_synthetic_small_vocab():
    task = SyntheticTask(vocab=5, seed=0)
    assert task.alphabet == 5 and task.batch(0, 2, 9).max() < 5
    with pytest.raises(ZoError):
        SyntheticTask(vocab=1)


def _write(path, records):
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in records) + "\n")
    return path


def test_jsonl_ids_packing_and_epoch_order(tmp_path):
    path = _write(tmp_path / "d.jsonl", [{"input_ids": list(range(0, 10))}, "",
                                         {"input_ids": list(range(10, 25))}])
    data = JsonlData(path, vocab=100, seed=1)
    rows = data.rows(4).ids
    assert rows.shape == (6, 4) and torch.equal(rows.flatten(), torch.arange(24))
    epoch = torch.cat([data.batch(step, 2, 4).ids for step in range(3)])
    assert sorted(map(tuple, epoch.tolist())) == sorted(map(tuple, rows.tolist()))
    again = JsonlData(path, vocab=100, seed=1).batch(5, 2, 4)
    assert torch.equal(data.batch(5, 2, 4).ids, again.ids)
    assert torch.equal(data.batch(5, 2, 4).labels, again.labels)
    assert not torch.equal(epoch, torch.cat([data.batch(s, 2, 4).ids for s in range(3, 6)]))
    data.batch(3, 2, 4)
    assert data.epoch_of(3) == pytest.approx(4 * 2 / 6)   # 8 of the 6 rows of seq 4 seen


def test_jsonl_errors_name_the_problem(tmp_path):
    with pytest.raises(ZoError, match="does not exist"):
        JsonlData(tmp_path / "nope.jsonl", vocab=10)
    bad = _write(tmp_path / "bad.jsonl", [{"input_ids": [1, 2]}, "{oops"])
    with pytest.raises(ZoError, match=r"bad.jsonl:2: not valid JSON"):
        JsonlData(bad, vocab=10)
    big = _write(tmp_path / "big.jsonl", [{"input_ids": [1, 2]}, {"input_ids": [3, 10]}])
    with pytest.raises(ZoError, match=r":2: token id 10 is outside the vocabulary \(0..9\)"):
        JsonlData(big, vocab=10)
    text = _write(tmp_path / "text.jsonl", [{"text": "hello"}])
    with pytest.raises(ZoError, match=r":1: text data needs a tokenizer"):
        JsonlData(text, vocab=10)
    other = _write(tmp_path / "other.jsonl", [{"label": 1}])
    with pytest.raises(ZoError, match=r":1: expected an object with 'text'"):
        JsonlData(other, vocab=10)
    short = JsonlData(_write(tmp_path / "short.jsonl", [{"input_ids": [1, 2, 3]}]), vocab=10)
    with pytest.raises(ZoError, match="3 tokens, fewer than one sequence of 8"):
        short.batch(0, 1, 8)


def test_jsonl_text_uses_the_model_directory_tokenizer(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {"[UNK]": 0, "</s>": 1, "hello": 2, "world": 3}
    tok = Tokenizer(models.WordLevel(words, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]",
                            eos_token="</s>").save_pretrained(tmp_path / "model")
    path = _write(tmp_path / "t.jsonl", [{"text": "hello world"}, {"text": "world what"}])
    data = JsonlData(path, vocab=4, tokenizer_dir=tmp_path / "model")
    assert data.tokens.tolist() == [2, 3, 1, 3, 0, 1]
    assert isinstance(make_source(str(path), vocab=4, tokenizer_dir=tmp_path / "model"), TextData)
    assert isinstance(make_source("synthetic", vocab=4), SyntheticTask)


def test_shard_rows():
    batch = torch.arange(24).view(6, 4)
    parts = [shard(batch, data_shard=i, num_shards=3) for i in range(3)]
    assert all(p.shape == (2, 4) for p in parts)
    assert torch.equal(torch.cat(parts), batch)
    assert torch.equal(shard(batch, data_shard=0, num_shards=1), batch)
    with pytest.raises(ZoError, match=r"global batch \(6\) is not divisible by the data shards \(4\)"):
        shard(batch, data_shard=0, num_shards=4)
    with pytest.raises(ZoError, match="not in 0..2"):
        shard(batch, data_shard=3, num_shards=3)

