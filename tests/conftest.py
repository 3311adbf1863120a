"""The order the files run in, for scripts/test.sh's two test processes (pytest-xdist,
--dist loadfile --no-loadscope-reorder: a file's tests stay together, files are handed
out in the order collected). The longest files go first, so that no long file starts
last and runs alone at the end while the other process idles; the rest follow in
their usual order. The figures: seconds a file took in a run of the whole suite
(relative sizes only: a file not listed counts as short). A file's tests keep their
order (its module fixtures are shared in that order)."""

from __future__ import annotations

from pathlib import Path

import pytest

# seconds per file, the longest first (JUnit durations of a suite run on 848eed0 under
# load, scaled to this branch's changes); order matters only among the long ones
LONG_FILES = {
    "integration/test_gpu_check.py": 30,
    "integration/test_multinode.py": 25,
    "integration/test_precision_runs.py": 60,
    "integration/test_zoexec_layouts.py": 40,
    "integration/test_resume.py": 34,     # these two: as measured alone (once `serial`)
    "integration/test_failures.py": 32,
    "integration/test_accuracy.py": 18,
    "integration/test_faults.py": 25,
    "unit/test_memory_model.py": 25,
    "integration/test_estimator_runs.py": 18,
    "integration/test_lora_runs.py": 13,
    "integration/test_launch_templates.py": 45,
    "integration/test_bad_input.py": 12,
    "integration/test_trackers.py": 11,
    "unit/test_search.py": 10,
    "integration/test_node_memory.py": 10,
    "integration/test_gpu_stages_cpu.py": 14,
    "integration/test_resume_evaluation.py": 8,
}
TESTS = Path(__file__).resolve().parent


def _weight(item) -> float:
    try:
        name = Path(str(item.path)).resolve().relative_to(TESTS).as_posix()
    except ValueError:
        return 0.0
    return LONG_FILES.get(name, 0.0)


def pytest_collection_modifyitems(session, config, items) -> None:
    """Files by weight, heaviest first; a file's tests, and the short files, in the
    order collected (sorted() is stable)."""
    first_seen: dict[str, int] = {}
    for index, item in enumerate(items):
        first_seen.setdefault(str(item.path), index)
    items[:] = sorted(items, key=lambda it: (-_weight(it), first_seen[str(it.path)]))


@pytest.fixture(scope="session", autouse=True)
def _speed_checks_off():
    """Runs made in a test process skip the speed checks of a traced run (SpeedMonitor:
    about 0.4 s of every core at each end of the run, with the other ranks waiting) unless
    the test passes speed_checks=True: they measure the machine, which no test here
    checks except test_speed_probes (its own monitor) and test_loop_e2e (the CLI, in a
    process of its own, checks on)."""
    from zoexec.config import RunConfig

    make = RunConfig.make.__func__

    def make_without_checks(cls, *, plan, **values):
        values.setdefault("speed_checks", False)
        return make(cls, plan=plan, **values)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(RunConfig, "make", classmethod(make_without_checks))
        yield
