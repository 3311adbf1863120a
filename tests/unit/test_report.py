"""zoexec.run.report: progress lines off a terminal, metrics.jsonl with the HF Trainer's
names, TensorBoard (an optional extra) and its error when missing, the end-of-run
summary, and -q."""

from __future__ import annotations

import io
import json
import math
import sys
import types

import pytest

from zoexec.config import FieldError, RunConfig
from zoexec.maths.history import StepRecord
from zoexec.run.report import (
    LOG_EVERY_S,
    Reporter,
    check_report_to,
    fmt_duration,
    quiet_libraries,
    tensorboard_tag,
)
from zoplan.errors import ZoError


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _cfg(**kw) -> RunConfig:
    return RunConfig.make(plan={}, **{"steps": 12, **kw})


def _record(step: int, loss: float = 2.0, **kw) -> StepRecord:
    return StepRecord(step=step, seed=step, loss_plus=loss + 0.1, loss_minus=loss - 0.1, g=1.0,
                      lr=1e-3, tokens_per_s=1000.0, step_time_s=0.5, **kw)


def _drive(rep: Reporter, clock: Clock, steps, *, dt: float = 1.0, loss=lambda s: 2.0) -> None:
    rep.begin()
    for step in steps:
        clock.now += dt
        rep.train(_record(step, loss(step)))


def _lines(stream: io.StringIO) -> list[str]:
    return [line for line in stream.getvalue().splitlines() if line]


def test_progress_lines_every_n_steps_off_a_terminal():
    stream, clock = io.StringIO(), Clock()
    rep = Reporter(_cfg(log_every=5), stream=stream, clock=clock)
    _drive(rep, clock, range(12))
    rep.close()
    lines = _lines(stream)
    assert [line.split()[2] for line in lines] == ["1/12", "5/12", "10/12", "12/12"], lines
    assert "loss 2.0000" in lines[1] and "lr 1.00e-03" in lines[1] and "1,000 tok/s" in lines[1]
    assert lines[1].endswith("ETA 7.0s"), lines[1]            # 5 steps in 5 s, 7 to go
    assert lines[-1].endswith("12s in all"), lines[-1]


def test_progress_lines_by_time_without_log_every():
    stream, clock = io.StringIO(), Clock()
    rep = Reporter(_cfg(steps=100), stream=stream, clock=clock)
    _drive(rep, clock, range(100), dt=LOG_EVERY_S / 10)   # a line every 10 steps
    steps = [int(line.split()[2].split("/")[0]) for line in _lines(stream)]
    assert steps == [1, *range(11, 100, 10), 100], steps


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_bar_on_a_terminal():
    stream = Terminal()
    rep = Reporter(_cfg(steps=12, log_every=5), stream=stream)
    rep.begin()
    assert rep._bar is not None
    for step in range(12):
        rep.train(_record(step, 1.5))
    rep.evaluate(12, {"loss": 1.25})
    rep.close()
    text = stream.getvalue()
    assert "zoexec: step" not in text                          # no plain lines
    assert "12/12" in text and "loss 1.5000" in text and "zoexec: eval after step 12/12" in text


def test_quiet_shows_nothing_but_writes_metrics(tmp_path):
    stream, clock = io.StringIO(), Clock()
    rep = Reporter(_cfg(quiet=True, out=str(tmp_path)), stream=stream, clock=clock)
    _drive(rep, clock, range(12))
    rep.evaluate(12, {"eval_loss": 1.5})
    rep.close()
    assert rep.summary() is None
    assert stream.getvalue() == ""
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 14


def test_metrics_jsonl_names_and_strict_json(tmp_path):
    clock = Clock()
    rep = Reporter(_cfg(steps=3, out=str(tmp_path), quiet=True), clock=clock)
    rep.evaluate(0, {"eval_loss": 3.0, "eval_accuracy": 0.5})
    rep.begin()
    rep.train(_record(0), epoch=0.25)
    rep.train(_record(1, math.nan, skipped=True))
    rep.train(_record(2))
    rep.evaluate(3, {"eval_loss": 2.5, "eval_accuracy": 0.75, "eval_f1": 0.7})
    rep.close()
    text = (tmp_path / "metrics.jsonl").read_text()
    assert "NaN" not in text
    rows = [json.loads(line) for line in text.splitlines()]
    assert rows[0] == {"step": 0, "eval_loss": 3.0, "eval_accuracy": 0.5}
    assert rows[1] == {"step": 1, "epoch": 0.25, "loss": 2.0, "learning_rate": 1e-3,
                       "projected_grad": 1.0, "tokens_per_s": 1000.0, "step_time_s": 0.5}
    assert rows[2]["loss"] is None and rows[2]["skipped"] is True and "epoch" not in rows[2]
    assert rows[4] == {"step": 3, "eval_loss": 2.5, "eval_accuracy": 0.75, "eval_f1": 0.7}
    assert rows[5]["step"] == 3 and rows[5]["train_loss"] == 2.0
    assert set(rows[5]) == {"step", "train_runtime", "train_loss", "train_steps_per_second",
                            "train_tokens_per_second"}


def test_a_resumed_run_keeps_its_metrics_up_to_its_start(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in range(1, 7))
                    + '{"step": 7, "lo')                     # a torn last line
    rep = Reporter(_cfg(out=str(tmp_path), start_step=4, resumed=True, quiet=True))
    rep.begin()
    rep.train(_record(4))
    rep.close()
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3, 4, 5]


def test_a_new_run_replaces_old_metrics(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 99}\n')
    rep = Reporter(_cfg(out=str(tmp_path), quiet=True))
    rep.train(_record(0))
    rep.close()
    assert json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])["step"] == 1


def test_only_rank_0_writes_and_shows(tmp_path):
    stream = io.StringIO()
    rep = Reporter(_cfg(out=str(tmp_path)), lead=False, stream=stream)
    rep.begin()
    rep.train(_record(0))
    rep.evaluate(1, {"eval_loss": 1.0})
    rep.close()
    assert rep.summary() is None and stream.getvalue() == ""
    assert not (tmp_path / "metrics.jsonl").exists()


def test_summary_of_a_run_with_evaluations(tmp_path):
    (tmp_path / "final").mkdir()
    (tmp_path / "final" / "model.safetensors").write_bytes(b"")
    (tmp_path / "snapshots" / "step-000007").mkdir(parents=True)
    stream, clock = io.StringIO(), Clock()
    rep = Reporter(_cfg(steps=30, out=str(tmp_path), trace="tr", log_every=100),
                   stream=stream, clock=clock)
    clock.now += 3.0                                           # loading
    _drive(rep, clock, range(30), loss=lambda s: 5.0 - 0.1 * s)
    for step, loss, acc in ((10, 2.0, 0.6), (20, 1.5, 0.8), (30, 1.7, 0.7)):
        rep.evaluate(step, {"eval_loss": loss, "eval_accuracy": acc})
    rep.close()
    clock.now += 2.0                                           # saving
    text = rep.summary()
    assert text in stream.getvalue()
    assert "30 steps (steps 1-30 of 30)" in text and "start-up 3.0s" in text
    assert "training 30s (1,000 tok/s)" in text and "saving 2.0s" in text
    assert "loss 4.5500 (mean of steps 1-10) -> 2.5500 (mean of steps 21-30)" in text
    assert "eval, final (after step 30): eval_loss 1.7000  eval_accuracy 0.7000" in text
    assert ("eval, best of 3 by highest eval_accuracy (after step 20): eval_loss 1.5000  "
            "eval_accuracy 0.8000") in text
    assert "zoexec: eval after step 20/30: eval_loss 1.5000  eval_accuracy 0.8000" in stream.getvalue()
    assert f"run folder: {tmp_path}" in text and f"model: {tmp_path / 'final'}" in text
    assert "tokenizer: none: the run started from random weights" in text
    assert "step-000007" in text and "metrics.jsonl" in text and "trace: tr" in text


def test_summary_of_a_resumed_run_counts_the_whole_log(tmp_path):
    from zoexec.run.checkpoint import LossLog

    log = LossLog(tmp_path)
    for step in range(20):
        log.append(_record(step, 9.0 if step < 10 else 1.0))
    log.close()
    clock = Clock()
    rep = Reporter(_cfg(steps=20, start_step=16, resumed=True, out=str(tmp_path)),
                   stream=io.StringIO(), clock=clock)
    _drive(rep, clock, range(16, 20), loss=lambda s: 1.0)
    rep.close()
    text = rep.summary()
    assert "4 steps (steps 17-20 of 20, resumed after step 16)" in text
    assert "loss 9.0000 (mean of steps 1-10) -> 1.0000 (mean of steps 11-20)" in text


def test_summary_without_out():
    rep = Reporter(_cfg(steps=2), stream=io.StringIO())
    rep.train(_record(0))
    rep.train(_record(1))
    rep.close()
    assert "weights: not saved (no --out)" in rep.summary()


def test_report_to_checks():
    check_report_to("none", None)
    with pytest.raises(FieldError, match="report_to must be one of none, tensorboard, wandb, "
                                         "mlflow, got 'comet'"):
        _cfg(report_to="comet")
    with pytest.raises(ZoError, match="give --out DIR"):
        check_report_to("tensorboard", None)


def test_report_to_tensorboard_without_the_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(ZoError, match="needs the tensorboard package, which is not installed: "
                                      "pip install tensorboard"):
        check_report_to("tensorboard", "out")


def test_tensorboard_tags_follow_the_hf_trainer():
    assert [tensorboard_tag(k) for k in ("loss", "learning_rate", "eval_loss", "eval_accuracy",
                                         "train_loss")] == \
        ["train/loss", "train/learning_rate", "eval/loss", "eval/accuracy", "train/train_loss"]


class FakeWriter:
    """torch.utils.tensorboard.SummaryWriter's calls, recorded (tensorboard is an
    optional extra, not installed in the test environment)."""

    made: list = []

    def __init__(self, log_dir: str, purge_step=None) -> None:
        self.log_dir, self.purge_step = log_dir, purge_step
        self.scalars: list = []
        self.closed = False
        FakeWriter.made.append(self)

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self.scalars.append((tag, value, step))

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def fake_tensorboard(monkeypatch):
    module = types.ModuleType("torch.utils.tensorboard")
    module.SummaryWriter = FakeWriter
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", module)
    FakeWriter.made = []
    return FakeWriter.made


def test_tensorboard_scalars(tmp_path, fake_tensorboard):
    check_report_to("tensorboard", tmp_path)                   # importable: no error
    board = tmp_path / "runs"
    board.mkdir()
    (board / "events.out.tfevents.old").write_text("")          # an earlier run's
    rep = Reporter(_cfg(steps=3, out=str(tmp_path), report_to="tensorboard", quiet=True))
    rep.begin()
    for step in range(3):
        rep.train(_record(step, math.nan if step == 1 else 3.0 - step))
    rep.evaluate(3, {"loss": 0.5, "accuracy": 0.9})
    rep.close()
    (writer,) = fake_tensorboard
    assert writer.log_dir == str(board) and writer.purge_step is None and writer.closed
    assert not (board / "events.out.tfevents.old").exists()
    assert [(s, v) for t, v, s in writer.scalars if t == "train/loss"] == [(1, 3.0), (3, 1.0)]
    assert ("train/learning_rate", 1e-3, 1) in writer.scalars
    assert ("eval/loss", 0.5, 3) in writer.scalars and ("eval/accuracy", 0.9, 3) in writer.scalars
    assert ("train/train_runtime", 0.0, 3) not in writer.scalars   # real clock: > 0
    assert any(t == "train/train_loss" and s == 3 for t, _, s in writer.scalars)
    (board / "events.out.tfevents.ours").write_text("")
    rep.evaluate(3, {"loss": 0.4})                                 # after close: appends
    assert len(fake_tensorboard) == 2 and fake_tensorboard[1].purge_step is None
    assert (board / "events.out.tfevents.ours").exists()
    assert fake_tensorboard[1].scalars == [("eval/loss", 0.4, 3)]


def test_tensorboard_of_a_resumed_run_purges_after_its_start(tmp_path, fake_tensorboard):
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "events.out.tfevents.1").write_text("")
    rep = Reporter(_cfg(out=str(tmp_path), start_step=4, resumed=True, report_to="tensorboard",
                        quiet=True))
    rep.train(_record(4))
    rep.close()
    assert fake_tensorboard[0].purge_step == 5 and (tmp_path / "runs" / "events.out.tfevents.1").exists()


def test_quiet_libraries_silences_the_bars_not_the_warnings_and_restores():
    """From either state of transformers' bars (a command run in this process before,
    e.g. `zoexec export --merge`, may have left them off): off inside, as found after."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    try:
        for bars in (True, False):
            (hf_logging.enable_progress_bar if bars else hf_logging.disable_progress_bar)()
            before = hf_logging.get_verbosity()
            with quiet_libraries(True):
                assert hf_logging.get_verbosity() == before            # warnings still print
                assert not hf_logging.is_progress_bar_enabled()
            assert hf_logging.get_verbosity() == before
            assert hf_logging.is_progress_bar_enabled() == bars
            with quiet_libraries(False):
                assert hf_logging.is_progress_bar_enabled() == bars
    finally:
        (hf_logging.enable_progress_bar if was else hf_logging.disable_progress_bar)()


def test_evaluate_prefixes_keys_and_picks_the_best(tmp_path):
    stream = io.StringIO()
    rep = Reporter(_cfg(steps=30, out=str(tmp_path)), stream=stream)
    assert rep.best_eval() is None
    rep.evaluate(0, {"loss": 2.0, "eval_f1": 0.5, "samples": 80})
    rep.evaluate(10, {"loss": 1.5})
    rep.evaluate(20, {"loss": 1.5})
    rep.evaluate(30, {"loss": math.nan})
    assert rep.best_eval() == (10, {"eval_loss": 1.5}, "eval_loss")     # lowest, earliest
    rep.evaluate(30, {"loss": 1.9, "accuracy": 0.6})
    rep.evaluate(30, {"loss": 1.0, "accuracy": math.nan})
    assert rep.best_eval()[:2] == (30, {"eval_loss": 1.9, "eval_accuracy": 0.6})   # accuracy first
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[0] == {"step": 0, "eval_loss": 2.0, "eval_f1": 0.5, "eval_samples": 80}
    assert rows[3] == {"step": 30, "eval_loss": None}
    assert "zoexec: eval after step 0/30: eval_loss 2.0000  eval_f1 0.5000  eval_samples 80" in \
        stream.getvalue()


def test_an_evaluation_after_close_appends(tmp_path):
    rep = Reporter(_cfg(steps=2, out=str(tmp_path), quiet=True))
    rep.train(_record(0))
    rep.train(_record(1))
    rep.close()
    rep.evaluate(2, {"eval_loss": 1.0})
    rep.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 2, 2] and "train_runtime" in rows[2]
    assert rows[3] == {"step": 2, "eval_loss": 1.0}


def test_fmt_duration():
    assert [fmt_duration(s) for s in (0.04, 4.24, 42, 220, 7500)] == \
        ["0.0s", "4.2s", "42s", "3m40s", "2h05m"]


def test_summary_loss_of_short_runs():
    for steps, expect in ((1, "loss 3.0000 (step 1)\n"),
                          (2, "loss 3.0000 (step 1) -> 2.0000 (step 2)"),
                          (7, "loss 2.0000 (mean of steps 1-3) -> -2.0000 (mean of steps 5-7)")):
        rep = Reporter(_cfg(steps=steps), stream=io.StringIO())
        for step in range(steps):
            rep.train(_record(step, 3.0 - step))
        rep.close()
        assert expect in rep.summary() + "\n", (steps, rep.summary())


def test_summary_of_a_resumed_run_counts_the_evaluations_before_the_resume(tmp_path):
    """The best of the whole run: the evaluation of step 10, before the resume at 16,
    is better than the one after step 20 (the stale "best of 2" left it out)."""
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (
        {"step": 0, "eval_loss": 3.0, "eval_accuracy": 0.5},
        {"step": 10, "eval_loss": 1.0, "eval_accuracy": 0.9},
        {"step": 18, "eval_loss": 9.0, "eval_accuracy": 0.1})))   # after the start: dropped
    clock = Clock()
    rep = Reporter(_cfg(steps=20, start_step=16, resumed=True, out=str(tmp_path)),
                   stream=io.StringIO(), clock=clock)
    _drive(rep, clock, range(16, 20))
    rep.evaluate(20, {"eval_loss": 2.0, "eval_accuracy": 0.7})
    rep.close()
    text = rep.summary()
    assert "eval, final (after step 20): eval_loss 2.0000  eval_accuracy 0.7000" in text
    assert ("eval, best of 3 (2 before the resume) by highest eval_accuracy (after step 10): "
            "eval_loss 1.0000  eval_accuracy 0.9000") in text, text


def test_summary_of_a_lora_run_names_the_adapters_and_how_to_load_them(tmp_path):
    base = tmp_path / "base"
    base.mkdir()
    (base / "tokenizer.json").write_text("{}")
    final = tmp_path / "run" / "final"
    final.mkdir(parents=True)
    for name in ("adapter_model.safetensors", "adapter_config.json", "tokenizer.json"):
        (final / name).write_text("{}")
    rep = Reporter(_cfg(steps=2, out=str(tmp_path / "run"), model_path=str(base)),
                   stream=io.StringIO(), clock=Clock())
    rep.close()
    text = rep.summary()
    assert f"adapters: {final}  (PEFT adapters: adapter_model.safetensors" in text
    assert (f"load: PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained("
            f"{str(base.resolve())!r}), {str(final.resolve())!r})") in text
    assert f"tokenizer: in {final}" in text and "model.safetensors;" not in text
