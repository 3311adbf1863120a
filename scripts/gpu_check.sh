#!/usr/bin/env bash
# GPU check on a machine with one CUDA GPU, as it is (docs/gpu.md): about 8 minutes on one
# H200. Uses .venv/bin/python where it exists, else python3 with the repo on PYTHONPATH;
# --wheels DIR (default .whl/cp<python version> where it exists) installs the wheels
# scripts/device_wheels.sh downloaded into a private folder put first on PYTHONPATH
# (the image lacks pydantic and simpy; nothing else is installed).
#   bash scripts/gpu_check.sh --out DIR [--wheels DIR] [--device-kind cpu] [gpu_check.py options]
# Out: DIR/summary.txt, DIR/summary.json, DIR/gpu_check-files.tar.gz. A missing package,
# no CUDA GPU, no tmpfs with room or a store that cannot be page-locked stop it with one
# `error:` line (exit 2) before anything is measured.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=${PYTHON:-python3}; fi
WHEELS=""
ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --wheels) WHEELS=$2; shift 2 ;;
    *) ARGS+=("$1"); shift ;;
  esac
done
if [ -z "$WHEELS" ]; then
  guess=.whl/cp$("$PY" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')
  [ -d "$guess" ] && WHEELS=$guess
fi
SITE=""
if [ -n "$WHEELS" ]; then
  if ! ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    echo "error: --wheels $WHEELS holds no wheels (make them: bash scripts/device_wheels.sh $WHEELS)" >&2
    exit 2
  fi
  SITE=$(mktemp -d /tmp/gpu_check-site.XXXXXX)
  trap 'rm -rf "$SITE"' EXIT
  "$PY" -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check \
      --target "$SITE" "$WHEELS"/*.whl \
    || { echo "error: pip could not install the wheels of $WHEELS into $SITE" >&2; exit 2; }
fi
export PYTHONPATH="${SITE:+$SITE:}$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
"$PY" scripts/gpu_check.py ${ARGS[@]+"${ARGS[@]}"}
