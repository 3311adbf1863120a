"""What a resume keeps besides the settings (issue 40): the evaluation, reporting and
other run options (kept="run") come from run.json unless given, a change is said in one
line, an older run.json without them takes the command line's; the resume command
repeats the options run.json does not keep."""

from __future__ import annotations

import shlex
from pathlib import Path

from zoexec.config import RUN_KEPT
from zoexec.flags import repeated, resume_command
from zoexec.options import _evaluation_missed, _run_options


def test_the_run_options_are_the_evaluation_and_reporting_ones():
    assert {"eval_data", "eval_samples", "eval_every", "save_best", "report_to",
            "log_every"} <= set(RUN_KEPT)


def test_a_resume_takes_the_recorded_options_unless_given(tmp_path):
    data = tmp_path / "test.jsonl"
    ident = {"eval_data": str(data), "eval_every": 2, "save_best": "eval_loss:max",
             "eval_samples": None}
    use, record, line = _run_options(ident, {})
    assert use == {"eval_data": str(data), "eval_every": 2, "save_best": "eval_loss:max"}
    assert line is None and record["eval_every"] == 2
    use, record, line = _run_options(ident, {"eval_every": 4})
    assert use["eval_every"] == 4 and record["eval_every"] == 4
    assert line == ("zoexec: this resume changes the run's --eval-every 2 -> 4 (run.json "
                    "records the new values)")
    same, _, line = _run_options(ident, {"eval_data": str(data)})   # given the same: no line
    assert line is None and same["eval_data"] == str(data)


def test_a_run_recorded_before_them_takes_the_command_lines(tmp_path):
    use, record, line = _run_options({}, {"eval_data": "t.jsonl", "eval_every": 3})
    assert use == {"eval_data": str(Path.cwd() / "t.jsonl"), "eval_every": 3}
    assert line is None and record == use   # run.json records them from now on


def test_the_resume_command_repeats_what_run_json_does_not_keep():
    given = {"out": "r", "lr": 1e-3, "eval_data": "t.jsonl", "threads": 2, "quiet": True,
             "timeout_s": 30.0, "data": "d.jsonl", "model_path": "m", "steps": 9,
             "lora_targets": ("q_proj",)}
    words = repeated(given)
    assert words == ("--quiet", "--threads", "2", "--timeout-s", "30.0")
    command = resume_command("my plan.json", "r", words)
    assert shlex.split(command) == ["zoexec", "run", "my plan.json", "--resume", "r", *words]


def test_an_evaluation_cut_off_by_a_kill_is_redone(tmp_path):
    options = {"eval_data": "t.jsonl", "eval_every": 2}
    assert _evaluation_missed(tmp_path, options, 4, 10)          # no metrics.jsonl
    (tmp_path / "metrics.jsonl").write_text('{"step": 4, "loss": 1.0}\n')
    assert _evaluation_missed(tmp_path, options, 4, 10)          # a step's line, no eval
    (tmp_path / "metrics.jsonl").write_text('{"step": 4, "eval_loss": 1.0}\n')
    assert not _evaluation_missed(tmp_path, options, 4, 10)
    assert not _evaluation_missed(tmp_path, options, 3, 10)      # step 3 does not evaluate
    assert _evaluation_missed(tmp_path, {"eval_data": "t"}, 10, 10)   # the last step does
    assert not _evaluation_missed(tmp_path, {}, 4, 10)           # no evaluation at all
