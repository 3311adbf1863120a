#!/usr/bin/env bash
# The GPU check on a machine with one CUDA GPU, as that machine is (docs/gpu.md): at most
# 240 s on one H200, most valuable stage first, every result kept as it comes.
#   bash scripts/gpu_check.sh --out DIR [--wheels DIR] [--deadline-s S] [--stages a,b]
#                             [--device-kind cpu] [other gpu_check.py options]
# Python: .venv/bin/python where it exists, else $PYTHON or python3, with the repository
# on PYTHONPATH; --wheels DIR (default .whl/cp<python version> where it exists) installs
# the wheels scripts/device_wheels.sh downloaded into a private folder put first on
# PYTHONPATH (nothing else is installed). The deadline (default 240 s, 120 s for the CPU
# dry run) counts the wheels' install: gpu_check.py gets what is left and ends itself
# cleanly when it runs out; `timeout -s TERM` is the backstop.
# Out: DIR/summary.json and DIR/summary.txt (rewritten after every stage), DIR/files.tar
# (each stage's plans, traces, logs and profiles, appended as it ends), DIR/profile.json.
set -euo pipefail
cd "$(dirname "$0")/.."
began=$SECONDS
if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=${PYTHON:-python3}; fi
WHEELS=""
DEADLINE=""
KIND=cuda
ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --wheels) WHEELS=$2; shift 2 ;;
    --deadline-s) DEADLINE=$2; shift 2 ;;
    --device-kind) KIND=$2; ARGS+=("$1" "$2"); shift 2 ;;
    *) ARGS+=("$1"); shift ;;
  esac
done
if [ -z "$DEADLINE" ]; then
  if [ "$KIND" = cpu ]; then DEADLINE=120; else DEADLINE=240; fi
fi
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
# what is left after the wheels, less 5 s for the last writes
left=$(( ${DEADLINE%.*} - (SECONDS - began) - 5 ))
if [ "$left" -lt 10 ]; then
  echo "error: the deadline of $DEADLINE s leaves $left s after installing the wheels" >&2
  exit 2
fi
# in the background, so that a SIGTERM or SIGINT to this script is passed on (timeout
# relays it to the check, which saves what it has and exits 3)
timeout -s TERM -k 10 $(( left + 10 )) "$PY" scripts/gpu_check.py --deadline-s "$left" \
  ${ARGS[@]+"${ARGS[@]}"} &
check=$!
trap 'kill -TERM "$check" 2>/dev/null || true' TERM INT
status=0
wait "$check" || status=$?
if [ "$status" -gt 128 ] && kill -0 "$check" 2>/dev/null; then   # woken by the trap
  status=0
  wait "$check" || status=$?
fi
exit "$status"
