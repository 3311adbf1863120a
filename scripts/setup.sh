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
if ! .venv/bin/python -c "import zoplan, zoexec, torch, transformers, simpy, pytest, xdist, gguf, peft, mypy, yaml" 2>/dev/null \
    || [ ! -x .venv/bin/ruff ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  # byte-code compiled on every core after the install, not one file at a time by pip
  # (a fresh install 57 s -> 50 s on 2 cores); compiled it must be: where
  # PYTHONDONTWRITEBYTECODE is set, nothing compiles at import and each process started
  # would compile torch again
  .venv/bin/python -m pip install --quiet --no-compile -e ".[exec,test]"
  .venv/bin/python -m compileall -q -j 0 "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null || true
fi
