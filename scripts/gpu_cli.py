"""The CPU dry run's way to run a command of scripts/gpu_stages.py: a `python -m
zoplan.cli|zoexec.cli ARGS` command line run by that CLI's main in the stage's own
process, saving a process's start-up and imports (torch, transformers: most of a
run stage's seconds on the CPU). On a GPU the stages run the same command lines as
children."""

from __future__ import annotations

import importlib
import os
import sys
import traceback


def in_process(cmd: list[str], handle) -> int:
    """`cmd` (`[python, "-m", "zoplan.cli" or "zoexec.cli", ARGS...]`) as its CLI's main
    here, file descriptors 1 and 2 on `handle` for its length and COLUMNS=120 (as a
    child gets them): its exit status (a traceback in `handle` and 1 for an exception)."""
    assert cmd[1] == "-m" and cmd[2] in ("zoplan.cli", "zoexec.cli"), cmd
    os.environ["COLUMNS"] = "120"
    main = importlib.import_module(cmd[2]).main
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    os.dup2(handle.fileno(), 1)
    os.dup2(handle.fileno(), 2)
    argv, sys.argv = sys.argv, [cmd[2], *cmd[3:]]
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except Exception:  # as a child's traceback: in the log, a non-zero status
        traceback.print_exc()
        code = 1
    finally:
        sys.argv = argv
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, copy in zip((1, 2), saved):
            os.dup2(copy, fd)
            os.close(copy)
    return code
