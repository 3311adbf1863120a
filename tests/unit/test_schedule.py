"""Learning-rate schedules (zoexec.maths.schedule), literal values."""

from __future__ import annotations

import pytest

from zoexec.maths.schedule import lr_at


@pytest.mark.parametrize("schedule,expected", [
    ("constant", [0.25, 0.5, 0.75, 1.0, 1.0, 1.0, 1.0, 1.0]),
    ("linear", [0.25, 0.5, 0.75, 1.0, 0.8, 0.6, 0.4, 0.2]),
    ("cosine", [0.25, 0.5, 0.75, 1.0, 0.904508, 0.654508, 0.345492, 0.095492]),
])
def test_warmup_then_the_schedule(schedule, expected):
    got = [lr_at(s, lr=1.0, schedule=schedule, warmup=3, total=8) for s in range(8)]
    assert got == pytest.approx(expected, abs=1e-6)


def test_no_warmup_starts_at_the_full_rate_and_unknown_names_are_refused():
    assert lr_at(0, lr=2e-6, schedule="linear", warmup=0, total=10) == 2e-6
    with pytest.raises(ValueError, match="lr schedule must be one of constant, linear, cosine"):
        lr_at(0, lr=1.0, schedule="step", warmup=0, total=10)
