"""`zoexec run` whose node builder holds inside its fill (the node's store file made,
not yet filled) until it is killed: a start-up that a test kills at a known point, not
one it has to catch in flight. The ranks are forked (--start-method fork) from this
process, so they inherit the held fill. Used by test_failures.py:
python tests/integration/held_start.py plan.json --steps 1 ..."""

from __future__ import annotations

import sys
import time

from zoexec.runtime.hostenv import quiet_openmp

quiet_openmp()   # as zoexec.cli does, before torch is imported

from zoexec.store import loading  # noqa: E402


def _held(self, store, progress=None) -> None:
    while True:        # the store file stays: the test kills the job here
        time.sleep(1)


if __name__ == "__main__":
    loading.ModelSource.fill = _held
    from zoexec import cli

    sys.argv = ["zoexec", "run", *sys.argv[1:], "--start-method", "fork"]
    cli.main()
