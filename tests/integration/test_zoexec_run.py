"""`zoexec run` from the command line on a good plan: its ranks run and leave
losses.jsonl, final/ (HF weights) and a trace."""

from __future__ import annotations

import json

from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from zoexec.cli import app
from zoplan.handplan import hand_plan
from zoplan.layout import Layout
from zoplan.trace import read_trace
from zoplan.workload import Workload

WORKLOAD = Workload(batch=2, seq=8, param_dtype="fp32", compute_dtype="fp32")
runner = CliRunner()


def _plan(tmp_path, layout: Layout) -> str:
    path = tmp_path / "plan.json"
    hand_plan(model="tiny-opt", layout=layout, workload=WORKLOAD).save(path)
    return str(path)


def test_run_writes_losses_weights_and_trace(tmp_path):
    out, trace = tmp_path / "out", tmp_path / "trace"
    result = runner.invoke(app, ["run", _plan(tmp_path, Layout(ddp=2, slices=2)), "--steps", "2",
                                 "--lr", "1e-3", "--threads", "1", "--quiet",
                                 "--out", str(out), "--trace", str(trace)])
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in (out / "losses.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert set(records[0]) == {"step", "seed", "loss_plus", "loss_minus", "g", "loss", "lr",
                               "data_position", "tokens_per_s", "step_time_s"}
    assert (out / "run.json").is_file() and (out / "final" / "state.json").is_file()
    model = AutoModelForCausalLM.from_pretrained(out / "final")
    assert model.config.num_hidden_layers == 4
    meta, spans = read_trace(trace)
    assert meta["world_size"] == 2 and {s.rank for s in spans} == {0, 1}
