#!/usr/bin/env bash
# The test command: install what is needed, lint, then both tiers of the suite on the CPU:
# tests/unit (fast: torch-free or one process) and tests/integration (gloo ranks, the
# end-to-end loop). Arguments go to both pytest runs (e.g. -x, -k NAME).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/python -m pytest -q tests/unit "$@"
.venv/bin/python -m pytest -q tests/integration "$@"
