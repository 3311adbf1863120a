#!/usr/bin/env bash
# The main job, end to end on this machine (no GPU needed):
#  1. plan OPT-175B on 8 GPUs of the shipped DGX A100 profile;
#  2. measure this machine's CPUs into a profile, plan a small model for up to 2 gloo ranks
#     on it (the planner takes 1 when that is faster, and says so), run that plan with
#     zoexec, and compare prediction with measurement;
#  3. fine-tune a small local model (made by examples/make_model.py) on the shipped
#     short sentiment example with a label-word template, and evaluate it before and after.
# Everything is written under ./out/ (override with OUT=...).
#
#   bash scripts/demo.sh                          # measures this machine (stage 2a)
#   bash scripts/demo.sh --profile out/this-cpu.json   # reuses a profile (or DEMO_PROFILE=FILE)
#
# Stage 2a's profile is bounded by `zoplan profile --time-budget` (DEMO_PROFILE_BUDGET
# seconds, default 60), so the demo ends in minutes however busy the machine is; a
# reused profile skips it. When the machine ran at another speed than when it was
# profiled (a busy machine, a profile of another day), stage 2d's `zoplan calibrate`
# says so in a warning line: that part of the error is the machine's, not the plan's.
set -euo pipefail
cd "$(dirname "$0")/.."
PROFILE=${DEMO_PROFILE:-}
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) PROFILE=${2:?--profile needs a file}; shift 2 ;;
    --profile=*) PROFILE=${1#--profile=}; shift ;;
    *) echo "error: unknown argument $1 (usage: bash scripts/demo.sh [--profile FILE])" >&2; exit 2 ;;
  esac
done
if [ -n "$PROFILE" ] && [ ! -f "$PROFILE" ]; then
  echo "error: --profile $PROFILE: no such file (a profile written by zoplan profile)" >&2
  exit 2
fi
bash scripts/setup.sh
OUT=${OUT:-out}
mkdir -p "$OUT"
BIN=.venv/bin
START=$SECONDS

echo "== 1. plan OPT-175B on a DGX A100 (8 GPUs)"
$BIN/zoplan optimize --model opt-175b --gpus 8 --profile dgx-a100-80gb -o "$OUT/plan-opt175b.json"

if [ -n "$PROFILE" ]; then
  echo "== 2a. reuse the profile $PROFILE (no measuring)"
  [ "$PROFILE" -ef "$OUT/this-cpu.json" ] || cp "$PROFILE" "$OUT/this-cpu.json"
else
  echo "== 2a. profile this machine's CPUs (gloo ranks), within ${DEMO_PROFILE_BUDGET:-60} s"
  $BIN/zoplan profile --cpu --name this-cpu --time-budget "${DEMO_PROFILE_BUDGET:-60}" \
    -o "$OUT/this-cpu.json"
  echo "   (next time: bash scripts/demo.sh --profile $OUT/this-cpu.json skips this stage)"
fi

echo "== 2b. plan small-opt (6 blocks, 20M params) for up to 2 CPU ranks on that profile"
$BIN/zoplan optimize --model small-opt --gpus 2 --batch 8 --seq 128 --profile "$OUT/this-cpu.json" \
  -o "$OUT/plan-small.json"

echo "== 2c. run it (40 steps, random weights, built-in task)"
$BIN/zoexec run "$OUT/plan-small.json" --init random --steps 40 --out "$OUT/run" --trace "$OUT/trace" \
  --overwrite

echo "== 2d. predicted vs measured (a warning says so when this machine ran at another speed"
echo "   than when it was profiled: a busy machine, or a reused profile of another day)"
$BIN/zoplan calibrate "$OUT/plan-small.json" "$OUT/trace" --profile "$OUT/this-cpu.json"
$BIN/zoplan show "$OUT/plan-small.json" --trace "$OUT/trace" --width 120
echo "== 3a. a small local model folder with a tokenizer (examples/make_model.py, no download)"
$BIN/python examples/make_model.py "$OUT/micro-model" --size micro --seed 0

TASK=(--task classification --template "{sentence} It was" --label-words "terrible,great")
DATA=examples/sentiment-short   # short reviews: a random model's features tell them apart
echo "== 3b. the base model on the held-out sentiment examples ($DATA/test.jsonl)"
$BIN/zoexec eval "$OUT/micro-model" --data $DATA/test.jsonl "${TASK[@]}"

echo "== 3c. fine-tune it with MeZO on $DATA/train.jsonl (1 CPU rank)"
$BIN/zoplan optimize --model "$OUT/micro-model" --gpus 1 --batch 64 --seq 16 \
  --profile "$OUT/this-cpu.json" -o "$OUT/plan-micro.json"
$BIN/zoexec run "$OUT/plan-micro.json" --model-path "$OUT/micro-model" \
  --data $DATA/train.jsonl "${TASK[@]}" \
  --eval-data $DATA/test.jsonl --eval-every 200 \
  --steps 600 --lr 1e-2 --lr-schedule linear --eps 1e-2 --out "$OUT/finetune" --overwrite

echo "== 3d. the fine-tuned model (final/) on the same held-out examples"
$BIN/zoexec eval "$OUT/finetune/final" --data $DATA/test.jsonl "${TASK[@]}"

echo "done in $((SECONDS - START)) s: plans, trace, loss log and final weights are in $OUT/;"
echo "      the fine-tuning run (metrics.jsonl, final/ with its tokenizer) is in $OUT/finetune/"
