#!/usr/bin/env bash
# The test command: install what is needed, then run the whole suite on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q "$@"
