"""zoexec: execute a zoplan plan with torch.distributed (NCCL on CUDA, gloo on CPU).

Packages, lowest layer first (docs/code.md; tests/unit/test_import_rules.py): maths/ (the
seed rule, z, perturbation, the deferred update, the lr schedule), data/ (data files,
packed text, the task section and the task types' registry), model/ (one adapter per
HF family, precision, export), config.py (the run configuration) and reference.py (the
plain MeZO-SGD loop, the oracle), runtime/, store/, profiler/, train/, run/, launch/,
and the face: cli.py, flags.py, options.py. Importing the package imports nothing heavy.
"""

import os as _os
import signal as _signal
import sys as _sys


def _stop_at_once(signum: int, _frame: object) -> None:
    """A stop signal while the command line starts (nothing made yet, nothing to save):
    exit at once, Ctrl-C quietly, SIGTERM / SIGHUP with one line naming it (`zoexec
    run` takes the signals over before it makes anything: zoexec.cli.run_cmd)."""
    if signum != _signal.SIGINT:
        _os.write(2, f"zoexec: stopped by {_signal.Signals(signum).name}\n".encode())
    _os._exit(128 + signum)


if _sys.argv and _os.path.basename(_sys.argv[0]) == "zoexec":   # the console script only
    for _signum in (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP):
        _signal.signal(_signum, _stop_at_once)
