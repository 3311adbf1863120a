"""zoexec.run.watch: the climbing-loss rule (reported within its window, not on noise
or on a loss near 0 that doubles), and the best metric kept across a resume."""

from __future__ import annotations

import json
import math

import pytest

from zoexec.maths.history import StepRecord
from zoexec.run.watch import BestMetric, Divergence
from zoplan.errors import ZoError


def _record(step: int, loss: float, **kw) -> StepRecord:
    return StepRecord(step=step, seed=step, loss_plus=loss + 0.01, loss_minus=loss - 0.01,
                      g=0.0, lr=1e-4, step_time_s=1.0, tokens_per_s=1.0, **kw)


def _first_report(losses, window) -> int | None:
    watch = Divergence(window)
    for step, loss in enumerate(losses):
        if watch.add(_record(step, loss)) is not None:
            return step
    return None


def test_a_climbing_loss_is_reported_within_the_window():
    """The issue's run: 5 at first, then a climb to 150 from step 30 on; window 20."""
    losses = [5.0] * 30 + [5.0 + 15 * k for k in range(1, 11)] + [150.0] * 30
    step = _first_report(losses, 20)
    assert step is not None and 30 <= step < 30 + 20
    assert _first_report([5.0] * 3 + [150.0] * 30, 20) == 19     # a climb in the first steps


@pytest.mark.parametrize("losses", [
    [5.0 + (0.8 if k % 2 else -0.8) for k in range(100)],    # noisy but level
    [5.0 - 0.03 * k for k in range(100)],                    # falling
    [0.05] * 10 + [0.4] * 90,                                # 8x a loss near 0: under the margin
    [0.69] * 10 + [1.5] * 90,                                # 2.2x but only 0.81 above
])
def test_level_falling_and_small_losses_are_not_divergence(losses):
    assert _first_report(losses, 20) is None


def test_a_loss_near_0_that_climbs_past_the_margin_is():
    assert _first_report([0.69] * 10 + [3.0] * 40, 20) is not None


def test_skipped_steps_do_not_count_and_the_message_says_where():
    watch = Divergence(4)
    assert watch.add(_record(0, math.nan)) is None
    for step, loss in enumerate([1.0, 1.0, 9.0, 9.0], start=1):
        what = watch.add(_record(step, loss))
    assert what == ("the loss is climbing: 5 over steps 2-5, from 1 over steps 2-2 (more than "
                    "2x and 1 above)")
    assert watch.add(_record(5, 50.0)) is None           # reported once


def test_a_long_run_holds_the_windows_only_and_a_late_climb_is_still_reported():
    """100,000 level steps then a climb: the watch holds the start window and the last
    W steps (not a number per step), and the message names the right steps."""
    watch = Divergence(20)
    for step in range(100_000):
        assert watch.add(_record(step, 5.0)) is None
    assert len(watch.start) == 5 and len(watch.recent) == 20
    what = watch.add(_record(100_000, 150.0))     # (19 x 5 + 150) / 20 = 12.25 > 2 x 5
    assert what == ("the loss is climbing: 12.25 over steps 99982-100001, from 5 over steps "
                    "1-5 (more than 2x and 1 above)")   # counted from 1 (record.step from 0)


def test_best_metric_keeps_the_best_and_reads_it_back(tmp_path):
    best = BestMetric("eval_accuracy", True)
    assert [best.improved({"eval_accuracy": v}) for v in (0.5, 0.4, 0.5, 0.7)] == [True, False, False, True]
    assert best.improved({"eval_loss": 1.0}) is False and best.value == 0.7
    lowest = BestMetric("eval_loss", False)
    assert [lowest.improved({"eval_loss": v}) for v in (2.0, 1.0, math.nan, 1.5)] == [True, True, False, False]
    (tmp_path / "best").mkdir()
    (tmp_path / "best" / "state.json").write_text(json.dumps({"step": 3, **best.state()}))
    assert BestMetric("eval_accuracy", True, tmp_path).value == 0.7
    assert BestMetric("eval_loss", False, tmp_path).value is None     # another metric
    (tmp_path / "best" / "state.json").write_text("{")
    with pytest.raises(ZoError, match="not the state of a best/ folder"):
        BestMetric("eval_accuracy", True, tmp_path)
