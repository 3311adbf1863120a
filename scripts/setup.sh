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
# installed? (found, not imported: importing them all took 7 s of each test command)
if ! .venv/bin/python -c "import importlib.util as u, sys; sys.exit(not all(u.find_spec(m) for m in 'zoplan zoexec torch transformers simpy pytest xdist gguf peft mypy triton yaml wandb mlflow'.split()))" 2>/dev/null \
    || [ ! -x .venv/bin/ruff ]; then
  # torch by pip, pinned as pyproject.toml pins it: pip takes a wheel the machine keeps
  # on disk (its find-links) where there is one, which uv would not look at
  torch=$(.venv/bin/python -c 'import tomllib; print(next(d for d in tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["exec"] if d.startswith("torch==")))')
  .venv/bin/python -m pip install --quiet --no-compile "$torch"
  # the rest by uv where it installs (the torch above kept: it satisfies the pin): 10 s
  # where pip took 40 on two cores; else by pip. Byte-code written for what the tools
  # and tests import (scripts/warm_bytecode.py: 4,500 of the 16,000 files installed; 19 s
  # on two cores where compiling all of site-packages took 42 s), not at the install:
  # where PYTHONDONTWRITEBYTECODE is set, nothing is written at import and each process
  # started would compile torch again
  if .venv/bin/python -m pip install --quiet "uv==0.9.5" 2>/dev/null; then
    .venv/bin/uv pip install --quiet --python .venv/bin/python -e ".[exec,test,trackers]"
  else
    .venv/bin/python -m pip install --quiet --no-compile -e ".[exec,test,trackers]"
  fi
  env -u PYTHONDONTWRITEBYTECODE .venv/bin/python scripts/warm_bytecode.py
fi
