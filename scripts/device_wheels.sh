#!/usr/bin/env bash
# The wheels the GPU machine's image must be given for zoplan + zoexec, chosen by version
# (scripts/device_wheels.py says how; docs/gpu.md when): manylinux x86_64 binary wheels
# for one CPython version, one version of each, at most 20 MiB in all.
#   bash scripts/device_wheels.sh [--python-version 3.12] DIR
# Idempotent: wheels already in DIR are kept, anything else there is removed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && PY=.venv/bin/python
exec "$PY" scripts/device_wheels.py "$@"
