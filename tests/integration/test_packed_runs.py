"""Packed text in a run of two gloo ranks on a tiny model (issue 41): the documents are
tokenised once on the node (the launcher's preflight makes the chunks in the launch's
private folder, the ranks read them: zoexec.data.packed), and each rank draws the
batches the reader gives alone (before the lazy reader: the launcher and every rank
tokenised the whole file, three times). The ranks are forked (--start-method fork) so
that the test's counting tokenizer is theirs too."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from typer.testing import CliRunner

from zoexec.cli import app
from zoexec.data import packed
from zoexec.data.text import TextData
from zoplan.handplan import hand_plan
from zoplan.layout import Layout
from zoplan.models import get_model
from zoplan.workload import Workload

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from tiny_model import DEFAULT_WORDS, make_model_dir  # noqa: E402

STEPS, BATCH, SEQ = 3, 4, 16


def test_two_ranks_tokenise_the_text_once_and_draw_the_batches_of_the_reader(tmp_path, monkeypatch):
    model = make_model_dir(tmp_path / "model", seed=1)
    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps({"text": " ".join(DEFAULT_WORDS[(i * 3 + k) % 20]
                                                          for k in range(4 + i % 9))}) + "\n"
                            for i in range(40)))
    plan = tmp_path / "plan.json"
    hand_plan(model=get_model(str(model)), layout=Layout(ddp=2),
              workload=Workload(batch=BATCH, seq=SEQ, param_dtype="fp32", compute_dtype="fp32")).save(plan)
    calls, drawn = tmp_path / "calls", tmp_path / "drawn"
    encode, batch = packed.Packer.encode, TextData.batch

    def counted(self, text, **kwargs):
        with calls.open("a") as log:
            log.write(json.dumps(text) + "\n")
        return encode(self, text, **kwargs)

    def recorded(self, step, batch_size, seq):
        got = batch(self, step, batch_size, seq)
        with drawn.open("a") as log:
            log.write(json.dumps([step, got.ids.tolist(), got.labels.tolist()]) + "\n")
        return got

    monkeypatch.setattr(packed.Packer, "encode", counted)
    monkeypatch.setattr(TextData, "batch", recorded)
    result = CliRunner().invoke(app, ["run", str(plan), "--model-path", str(model), "--data", str(data),
                                      "--task", "text", "--steps", str(STEPS), "--backend", "gloo",
                                      "--start-method", "fork", "--threads", "1", "-q"])
    assert result.exit_code == 0, result.output
    on_node = calls.read_text().splitlines()
    assert sorted(on_node) == sorted(json.dumps(json.loads(line)["text"])
                                     for line in data.read_text().splitlines())   # each once
    monkeypatch.setattr(packed.Packer, "encode", encode)
    monkeypatch.setattr(TextData, "batch", batch)
    alone = TextData(data, vocab=get_model(str(model)).vocab, tokenizer_dir=model)
    want = [[step, b.ids.tolist(), b.labels.tolist()]
            for step in range(STEPS) for b in [alone.batch(step, BATCH, SEQ)]]
    got = [json.loads(line) for line in drawn.read_text().splitlines()]
    assert sorted(got) == sorted(want * 2)   # both ranks, every step, the reader's batch
