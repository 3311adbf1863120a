"""`zoexec run --model-path ORG/NAME` (issue 40): a model in the local Hugging Face
cache (a fake one built here: refs/main and a snapshot of a micro model) trains, and
run.json records the snapshot it read; `zoexec eval` takes the id too; a model the
cache lacks is one error line saying where it looked, and nothing is downloaded;
`zoexec eval --config` reads the task's options from a file to the same metrics."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from typer.testing import CliRunner

from zoexec.cli import app
from zoplan.handplan import hand_plan
from zoplan.layout import Layout
from zoplan.models import get_model
from zoplan.workload import Workload

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
from make_model import make_model  # noqa: E402

DATA = ROOT / "examples" / "sentiment"


def test_a_cached_hub_id_trains_and_a_missing_one_is_one_line(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    repo = cache / "models--tiny-org--micro"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("feedbeef")
    snapshot = make_model(repo / "snapshots" / "feedbeef", size="micro", seed=0)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    plan = tmp_path / "plan.json"
    hand_plan(model=get_model("tiny-org/micro"), layout=Layout(),
              workload=Workload(batch=8, seq=32, param_dtype="fp32",
                                compute_dtype="fp32")).save(plan)
    runner = CliRunner()
    done = runner.invoke(app, ["run", str(plan), "--model-path", "tiny-org/micro", "--steps", "2",
                               "--lr", "1e-3", "--threads", "1", "--out", str(tmp_path / "run"),
                               "-q"])
    assert done.exit_code == 0, done.output
    assert json.loads((tmp_path / "run" / "run.json").read_text())["init"] == str(snapshot)
    test = tmp_path / "test.jsonl"
    test.write_text("".join(DATA.joinpath("test.jsonl").read_text().splitlines(True)[:4]))
    scored = runner.invoke(app, ["eval", "tiny-org/micro", "--data", str(test), "--task",
                                 "classification", "--template", "{sentence} It was",
                                 "--label-words", "terrible,great", "--json"])
    assert scored.exit_code == 0 and "eval_accuracy" in scored.output, scored.output
    (tmp_path / "eval.yaml").write_text("task: classification\ntemplate: '{sentence} It was'\n"
                                        "label_words: [terrible, great]\n")
    by_file = runner.invoke(app, ["eval", "tiny-org/micro", "--data", str(test), "--config",
                                  str(tmp_path / "eval.yaml"), "--json"])   # the same options
    assert by_file.exit_code == 0 and by_file.output == scored.output, by_file.output
    missing = runner.invoke(app, ["run", str(plan), "--model-path", "tiny-org/other", "--steps",
                                  "2", "--out", str(tmp_path / "other")])
    assert missing.exit_code == 2, missing.output
    assert "models--tiny-org--other" in missing.output and "Traceback" not in missing.output
    assert not (tmp_path / "other").exists()
