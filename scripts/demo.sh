#!/usr/bin/env bash
# The main job, end to end on this machine (no GPU needed):
#  1. plan OPT-175B on 8 GPUs of the shipped DGX A100 profile;
#  2. measure this machine's CPUs into a profile, plan a small model for 2 gloo ranks on it,
#     run that plan with zoexec, and compare prediction with measurement.
# Everything is written under ./out/ (override with OUT=...).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
OUT=${OUT:-out}
mkdir -p "$OUT"
BIN=.venv/bin

echo "== 1. plan OPT-175B on a DGX A100 (8 GPUs)"
$BIN/zoplan optimize --model opt-175b --gpus 8 --profile dgx-a100-80gb -o "$OUT/plan-opt175b.json"

echo "== 2a. profile this machine's CPUs (gloo ranks)"
$BIN/zoplan profile --cpu --name this-cpu -o "$OUT/this-cpu.json"

echo "== 2b. plan small-opt (6 blocks, 20M params) for 2 CPU ranks on that profile"
$BIN/zoplan optimize --model small-opt --gpus 2 --batch 8 --seq 128 --profile "$OUT/this-cpu.json" \
  -o "$OUT/plan-small.json"

echo "== 2c. run it (40 steps, random weights, built-in task)"
$BIN/zoexec run "$OUT/plan-small.json" --init random --steps 40 --out "$OUT/run" --trace "$OUT/trace"

echo "== 2d. predicted vs measured"
$BIN/zoplan calibrate "$OUT/plan-small.json" "$OUT/trace" --profile "$OUT/this-cpu.json"
$BIN/zoplan show "$OUT/plan-small.json" --trace "$OUT/trace" --width 120
echo "done: plans, trace, loss log and final weights are in $OUT/"
