#!/usr/bin/env bash
# Create ./.venv (Python 3.11+) and install zoplan + zoexec with pinned dependencies:
# the planner, the executor's extra (torch 2.13.0 CPU build, transformers) and the test
# tools. Idempotent: a second run only checks that everything is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import zoplan, zoexec, torch, transformers, simpy, pytest, xdist, gguf, peft, mypy, triton, yaml, importlib.util as u; assert u.find_spec('wandb') and u.find_spec('mlflow')" 2>/dev/null \
    || [ ! -x .venv/bin/ruff ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  # byte-code written for what the tools and tests import (scripts/warm_bytecode.py:
  # 4,500 of the 16,000 files installed; 19 s on two cores where compiling all of
  # site-packages took 42 s), not by pip: where PYTHONDONTWRITEBYTECODE is set,
  # nothing is written at import and each process started would compile torch again
  .venv/bin/python -m pip install --quiet --no-compile -e ".[exec,test,trackers]"
  env -u PYTHONDONTWRITEBYTECODE .venv/bin/python scripts/warm_bytecode.py
fi
