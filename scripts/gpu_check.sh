#!/usr/bin/env bash
# GPU check on a machine with one CUDA GPU: profile the GPU (`zoplan profile --quick`),
# then for each update mode (master, stochastic, plain) plan OPT-1.3B (random weights)
# for one GPU on that profile, run 30 steps with `zoexec run --trace` and print predicted
# vs measured step time, planned vs peak GPU memory, tokens/s, the share of the first
# update lost, and z time per block; then the first mode's plan with every other block
# resident (the same losses, bit for bit) and an on-device check that a slice's z and
# update (the update on the slice) are the whole block's bits (scripts/gpu_check.py).
# About 5-8 minutes on one GPU (not yet run on one). Output: benchmarks/results/gpu_check-<UTC>/ (commit summary.txt and summary.json).
#   bash scripts/gpu_check.sh [--profile measure|NAME] [--steps 30] [--batch 8] ...
# Uses .venv/bin/python when it exists, else python3 with the repo on PYTHONPATH
# (machines with torch preinstalled and no network).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=${PYTHON:-python3}; fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
RESULTS=${RESULTS:-benchmarks/results/gpu_check-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$RESULTS"
# the block store lives in /dev/shm; containers often give it 64 MiB: use a file under
# /tmp (shared through the page cache, same code path) when it has less than 8 GiB free
if [ "$(df -k --output=avail /dev/shm 2>/dev/null | tail -1 || echo 0)" -lt 8388608 ]; then
  export ZOEXEC_SHM_DIR=$(mktemp -d /tmp/zoexec-shm.XXXXXX)
  echo "small /dev/shm: block store in $ZOEXEC_SHM_DIR"
fi
df -h /dev/shm "${ZOEXEC_SHM_DIR:-/dev/shm}" > "$RESULTS/shm.txt" 2>&1 || true
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA GPU'; print(torch.__version__, torch.cuda.get_device_name(0))" | tee "$RESULTS/device.txt"
"$PY" scripts/gpu_check.py --results "$RESULTS" "$@" 2>&1 | tee "$RESULTS/gpu_check.log"
echo "results in $RESULTS"
