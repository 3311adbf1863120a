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
if ! .venv/bin/python -c "import zoplan, zoexec, torch, transformers, simpy, pytest, xdist, gguf, peft" 2>/dev/null \
    || [ ! -x .venv/bin/ruff ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  # --no-compile: byte-code is written as modules are first imported (most of torch's
  # and transformers' never are), which halves a fresh install (57 s -> 26 s)
  .venv/bin/python -m pip install --quiet --no-compile -e ".[exec,test]"
fi
