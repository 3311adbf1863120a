"""Bad input, everywhere, gets one clear line: a table of broken inputs fed to the real
`zoplan` and `zoexec` commands in subprocesses (malformed and mismatched plans,
profiles, configs, traces, data, paths the OS refuses, non-finite numbers, absurd
sizes).

Every case must end with a non-zero exit (2: the user's error), exactly one line on
stderr that starts with "error:" and names the problem, no traceback anywhere, no new
file in the case's own working folder (where every output path points), and nothing
left in shared memory. The zoexec cases fail in the launcher's checks, before any rank
starts. The cases run in this process through their tool's CLI (typer's CliRunner, in
the case's folder: what the command does, without the ~1-2 s of starting an interpreter
each; `zoplan`'s entry point is its app), where an exception that escapes the command
counts as a traceback; a few planner cases (IN_SUBPROCESS) run as the installed command
in a fresh interpreter meanwhile, as a user's shell runs them.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from zoexec.store import shmfiles
from zoplan.catalogue import CATALOGUE_CONFIGS
from zoplan.hardware import PROFILES_DIR
from zoplan.io import sha256_json
from zoplan.plan import Plan
from zoplan.search import optimize
from zoplan.trace import write_trace

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from tiny_model import make_model_dir  # noqa: E402

BIN = Path(sys.executable).parent


def command(name: str) -> list[str]:
    """The console entry point next to this interpreter, else `python -m <name>.cli`."""
    script = BIN / name
    return [str(script)] if script.is_file() else [sys.executable, "-m", f"{name}.cli"]


@dataclass(frozen=True)
class Case:
    id: str
    tool: str            # "zoplan" or "zoexec"
    args: tuple          # "{in}" is replaced by the inputs folder
    expect: str          # a fragment of the one error line
    setup: str = ""      # "dir:NAME" makes a folder in the case's working folder first


P, X = "zoplan", "zoexec"
# planner cases run as the console command in a subprocess (the rest: in this process)
IN_SUBPROCESS = {"profile-bandwidth-1e308", "plan-step-time-1e308", "trace-bad-json-line"}
OPT = ("optimize", "--gpus", "2", "--batch", "2", "--seq", "32", "-o", "plan.json", "-q")
RUN = ("run", "{in}/plan.json", "--steps", "1")

CASES = [
    # hardware profiles: non-finite, out of range, wrong types, contradictions
    Case("profile-bandwidth-1e308", P, OPT + ("--model", "tiny-opt", "--profile", "{in}/p-bw.json"),
         "pcie.h2d_gbps is 1e+308 GB/s, outside the plausible"),
    Case("profile-tflops-1e-300", P, OPT + ("--model", "tiny-opt", "--profile", "{in}/p-tflops.json"),
         "compute.peak_tflops is 1e-300 TFLOP/s"),
    Case("profile-infinity", P, OPT + ("--model", "tiny-opt", "--profile", "{in}/p-inf.json"),
         "Infinity, which is not a finite number"),
    Case("profile-fractional-cores", P, OPT + ("--model", "tiny-opt", "--profile", "{in}/p-cores.json"),
         "host.cores must be a whole number, got 2.5"),
    Case("profile-reserves-all-memory", P, OPT + ("--model", "tiny-opt", "--profile", "{in}/p-reserved.json"),
         "device.reserved_gib (40 GiB) leaves nothing of device.memory_gib (32 GiB)"),
    Case("profile-speed-check-1e308", P, OPT + ("--model", "tiny-opt", "--profile", "{in}/p-check.json"),
         "speed_check.gemm.median_s is 1e+308 s"),
    # model configs (HF config.json)
    Case("config-fractional-layers", P, OPT + ("--model", "{in}/c-layers.json", "--profile", "cpu"),
         "num_hidden_layers must be a whole number, got 2.5"),
    Case("config-absurd-vocab", P, OPT + ("--model", "{in}/c-vocab.json", "--profile", "cpu"),
         "vocab_size is 10000000000000, outside 2..16777216"),
    Case("config-heads-do-not-divide-hidden", P, OPT + ("--model", "{in}/c-heads.json", "--profile", "cpu"),
         "hidden_size (130) is not a multiple of num_attention_heads (4)"),
    Case("config-kv-heads-do-not-divide", P, OPT + ("--model", "{in}/c-kv.json", "--profile", "cpu"),
         "num_attention_heads (4) is not a multiple of num_key_value_heads (3)"),
    Case("config-flag-not-boolean", P, OPT + ("--model", "{in}/c-flag.json", "--profile", "cpu"),
         "tie_word_embeddings must be true or false"),
    # plans: malformed and mismatched
    Case("plan-step-time-1e308", P, ("show", "{in}/pl-step.json"),
         "predicted.step_time_s: input should be less than or equal to"),
    Case("plan-span-rank-fraction", P, ("show", "{in}/pl-span.json"),
         "predicted.spans[0].rank: input should be a valid integer"),
    Case("plan-layout-degree-text", P, ("compare", "{in}/pl-layout.json", "{in}/plan.json"),
         "layout: ddp must be a whole number, got '1'"),
    Case("plan-seq-beyond-positions", P, ("show", "{in}/pl-seq.json"),
         "seq (4096) exceeds the 512 positions of tiny-opt"),
    Case("plan-rank-table-exception", P, ("compare", "{in}/pl-ranks.json"),
         "ranks.exceptions must be empty: every rank follows layout"),
    Case("plan-utilisation-text", P, ("show", "{in}/pl-util.json"),
         "predicted.utilisation.pcie.h2d: input should be a valid number"),
    # traces: meta.json of the wrong shape, span files with bad lines, another run's trace
    Case("trace-meta-a-list", P, ("show", "{in}/plan.json", "--trace", "{in}/tr-meta-list"),
         "meta.json: input should be a valid dictionary"),
    Case("trace-meta-world-size-text", P, ("calibrate", "{in}/plan.json", "{in}/tr-meta-world", "--profile", "cpu"),
         "world_size: input should be a valid integer"),
    Case("trace-bad-json-line", P, ("calibrate", "{in}/plan.json", "{in}/tr-line", "--profile", "cpu"),
         "rank0.jsonl:3 is not valid JSON"),
    Case("trace-span-start-1e308", P, ("show", "{in}/plan.json", "--trace", "{in}/tr-huge"),
         "rank1.jsonl:1: malformed span: start_s"),
    Case("trace-binary-span-file", P, ("show", "{in}/plan.json", "--trace", "{in}/tr-binary"),
         "rank0.jsonl is not a text file"),
    Case("trace-block-the-plan-has-not", P, ("show", "{in}/plan.json", "--trace", "{in}/tr-block"),
         "has spans of block 999; model tiny-opt has blocks 0-3"),
    Case("trace-span-in-another-rank-file", P,
         ("calibrate", "{in}/plan.json", "{in}/tr-rank", "--profile", "cpu"),
         "a span of rank 1 in the file of rank 0"),
    # view bounds
    Case("show-width-100000000", P, ("show", "{in}/plan.json", "--width", "100000000"),
         "--width 100000000: the chart is drawn at most 1000 columns wide"),
    # output paths the OS refuses
    Case("optimize-output-in-proc", P,
         OPT[:-3] + ("-o", "/proc/zoplan-plan.json", "-q", "--model", "tiny-opt", "--profile", "cpu"),
         "cannot write the plan to /proc/zoplan-plan.json"),
    Case("show-chrome-name-too-long", P, ("show", "{in}/plan.json", "--chrome", "x" * 300 + ".json"),
         ".json: File name too long"),
    Case("show-svg-onto-a-directory", P, ("show", "{in}/plan.json", "--svg", "taken"),
         "it exists and is not a regular file", setup="dir:taken"),
    # zoexec: refused by the launcher's checks, before any rank starts
    Case("data-empty-file", X, RUN + ("--data", "{in}/d-empty.jsonl"), "holds no tokens"),
    Case("data-bad-json-line", X, RUN + ("--data", "{in}/d-json.jsonl"), "d-json.jsonl:2: not valid JSON"),
    Case("data-ids-outside-vocabulary", X, RUN + ("--data", "{in}/d-oov.jsonl"),
         "token id 99999 is outside the vocabulary (0..511)"),
    Case("data-text-without-model-folder", X, RUN + ("--data", "{in}/d-text.jsonl"),
         "text data needs a tokenizer"),
    Case("data-text-model-folder-without-tokenizer", X,
         RUN + ("--data", "{in}/d-text.jsonl", "--model-path", "{in}/model"),
         "has none (no tokenizer.json"),
    Case("data-too-short-for-one-batch", X, RUN + ("--data", "{in}/d-short.jsonl"),
         "has 40 tokens, fewer than one batch of the plan (2 x 32 = 64 tokens)"),
    Case("run-out-below-a-file", X, RUN + ("--out", "{in}/plan.json/out"),
         "plan.json is a file, not a folder"),
    Case("run-trace-in-proc", X, RUN + ("--trace", "/proc/zoexec-trace"),
         "cannot create a folder there"),
    # zoexec run: option values (each field's own check), options that do not go together
    Case("run-steps-zero", X, RUN[:2] + ("--steps", "0"), "--steps 0: must be >= 1"),
    Case("run-seed-negative", X, RUN + ("--seed", "-1"), "--seed -1: must be a whole number in 0..2^64-1"),
    Case("run-seed-above-2-64", X, RUN + ("--seed", str(2**64)),
         f"--seed {2**64}: must be a whole number in 0..2^64-1"),
    Case("run-lr-nan", X, RUN + ("--lr", "nan"), "--lr nan: must be a finite number >= 0"),
    Case("run-eps-zero", X, RUN + ("--eps", "0"), "--eps 0.0: must be a finite number > 0"),
    Case("run-keep-zero", X, RUN + ("--keep", "0"), "--keep 0: must be >= 1"),
    Case("run-save-every-text", X, RUN + ("--save-every", "soon"), "--save-every soon: must be N steps"),
    Case("run-max-shard-size-text", X, RUN + ("--max-shard-size", "big"),
         "--max-shard-size big: must be a size"),
    Case("run-warmup-beyond-steps", X, RUN + ("--warmup-steps", "5"), "--warmup-steps 5: must be < steps (1)"),
    Case("run-task-unknown", X, RUN + ("--task", "poetry"),
         "--task poetry: must be one of text, completion, classification"),
    Case("run-classification-without-data", X, RUN + ("--task", "classification"),
         "--task classification needs --data FILE"),
    Case("run-report-to-unknown", X, RUN + ("--report-to", "comet"),
         "--report-to comet: must be one of none, tensorboard, wandb, mlflow"),
    Case("run-report-to-wandb-no-out", X, RUN + ("--report-to", "wandb"),
         "--report-to wandb writes under the run folder: give --out DIR"),
    Case("run-threads-zero", X, RUN + ("--threads", "0"), "--threads 0: must be in 1..1024"),
    Case("run-check-nodes-every-zero", X, RUN + ("--check-nodes-every", "0"),
         "--check-nodes-every 0: must be >= 1"),
    Case("run-save-steps-and-save-every", X, RUN + ("--save-steps", "2", "--save-every", "3"),
         "give either --save-every or --save-steps, not both"),
    Case("run-model-path-and-init", X, RUN + ("--model-path", "{in}/model", "--init", "random"),
         "not both"),
    Case("run-eval-every-without-eval-data", X, RUN + ("--eval-every", "2"),
         "--eval-every needs --eval-data FILE"),
    Case("run-eval-data-missing", X, RUN + ("--eval-data", "{in}/no-eval.jsonl"),
         "no-eval.jsonl does not exist"),
    Case("run-overwrite-without-out", X, RUN + ("--overwrite",), "--overwrite needs --out DIR"),
    Case("run-new-schedule-without-resume", X, RUN + ("--new-schedule",),
         "--new-schedule changes a run being resumed: it needs --resume DIR"),
    Case("run-accept-moved-without-resume", X, RUN + ("--accept-moved-inputs",),
         "--accept-moved-inputs changes a run being resumed"),
    # zoexec run: paths and files
    Case("run-data-missing", X, RUN + ("--data", "{in}/nope.jsonl"), "nope.jsonl does not exist"),
    Case("run-model-path-missing", X, RUN + ("--model-path", "{in}/nomodel"), "nomodel does not exist"),
    Case("run-model-without-config", X, RUN + ("--model-path", "{in}/noconfig"), "has no config.json"),
    Case("run-model-shard-truncated", X, RUN + ("--model-path", "{in}/m-trunc"), "model.safetensors is truncated: its tensors need"),
    Case("run-out-name-too-long", X, RUN + ("--out", "x" * 300), "/run.json: File name too long"),
    Case("run-resume-missing-folder", X, RUN[:2] + ("--resume", "{in}/norun"), "norun: no such folder"),
    Case("run-resume-folder-without-run", X, RUN[:2] + ("--resume", "empty"),
         "holds no run to resume (no run.json)", setup="dir:empty"),
    Case("run-resume-and-another-out", X, RUN[:2] + ("--resume", "a", "--out", "b"),
         "--resume DIR continues the run in DIR: give no other --out"),
    # zoexec eval
    Case("eval-seq-zero", X, ("eval", "{in}/m-good", "--data", "{in}/d-ids.jsonl", "--seq", "0"),
         "--seq 0: must be >= 2"),
    Case("eval-truncated-weights", X, ("eval", "{in}/m-trunc", "--data", "{in}/d-ids.jsonl"),
         "model.safetensors is truncated: its tensors need"),
    Case("eval-model-missing", X, ("eval", "{in}/nomodel", "--data", "{in}/d-ids.jsonl"), "nomodel"),
    # every input a regular file (or a folder of them): a FIFO, a device, a folder refused
    # for what it is before it is opened (a FIFO read hangs, /dev/zero never ends)
    Case("run-model-shard-a-fifo", X, RUN + ("--model-path", "{in}/m-fifo"),
         "m-fifo/model.safetensors is a FIFO (named pipe), not a regular file"),
    Case("run-model-shard-a-fifo-with-out", X, RUN + ("--model-path", "{in}/m-fifo", "--out", "o"),
         "m-fifo/model.safetensors is a FIFO (named pipe)"),   # read for run.json's fingerprint
    Case("run-data-a-fifo", X, RUN + ("--data", "{in}/d-fifo.jsonl"),
         "d-fifo.jsonl is a FIFO (named pipe), not a regular file"),
    Case("run-data-dev-zero", X, RUN + ("--data", "/dev/zero"),
         "data file /dev/zero is a character device, not a regular file"),
    Case("run-eval-data-a-fifo", X, RUN + ("--data", "{in}/d-ids.jsonl", "--eval-data", "{in}/d-fifo.jsonl"),
         "d-fifo.jsonl is a FIFO (named pipe)"),
    Case("eval-model-shard-a-fifo", X, ("eval", "{in}/m-fifo", "--data", "{in}/d-ids.jsonl"),
         "model.safetensors is a FIFO (named pipe), not a regular file"),
    Case("eval-data-a-folder-with-a-fifo", X, ("eval", "{in}/m-good", "--data", "{in}/d-fifo-folder"),
         "d-fifo-folder/data-00000-of-00001.arrow is a FIFO"),
    Case("import-gguf-a-fifo", X, ("import-gguf", "{in}/g-fifo.gguf", "-o", "hf"),
         "g-fifo.gguf is a FIFO (named pipe), not a regular file"),
    Case("import-gguf-dev-zero", X, ("import-gguf", "/dev/zero", "-o", "hf"),
         "GGUF file /dev/zero is a character device, not a regular file"),
    Case("export-adapter-a-fifo", X, ("export", "--merge", "{in}/a-fifo", "--base", "{in}/m-good", "-o", "m"),
         "a-fifo/adapter_model.safetensors is a FIFO"),
    Case("lengths-data-a-fifo", X, ("lengths", "{in}/d-fifo.jsonl", "--model-path", "{in}/m-good",
                                    "--task-preset", "sst2", "-o", "l.json"),
         "d-fifo.jsonl is a FIFO (named pipe), not a regular file"),
    Case("show-plan-a-fifo", P, ("show", "{in}/pl-fifo.json"), "pl-fifo.json is a FIFO (named pipe)"),
    Case("show-plan-a-folder", P, ("show", "{in}/trace"), "trace is a folder, not a regular file"),
    Case("optimize-profile-a-fifo", P, OPT + ("--model", "tiny-opt", "--profile", "{in}/p-fifo.json"),
         "p-fifo.json is a FIFO (named pipe)"),
    Case("optimize-model-config-a-fifo", P, OPT + ("--model", "{in}/c-fifo.json", "--profile", "cpu"),
         "c-fifo.json is a FIFO (named pipe)"),
    Case("show-trace-span-file-a-fifo", P, ("show", "{in}/plan.json", "--trace", "{in}/tr-fifo"),
         "rank0.jsonl is a FIFO (named pipe)"),
    # bytes that are not UTF-8: the file and the byte offset
    Case("run-classification-not-utf8", X, RUN + ("--data", "{in}/d-latin1-sst2.jsonl", "--task-preset",
                                                  "sst2", "--model-path", "{in}/m-good"),
         "is not UTF-8 text (byte 0xe9 at byte offset 58 is not UTF-8)"),
    Case("run-multiple-choice-not-utf8", X, RUN + ("--data", "{in}/d-latin1-copa.jsonl", "--task-preset",
                                                   "copa", "--model-path", "{in}/m-good"),
         "is not UTF-8 text (byte 0xe9 at byte offset 20 is not UTF-8)"),
    Case("run-generation-not-utf8", X, RUN + ("--data", "{in}/d-latin1-squad.jsonl", "--task-preset",
                                              "squad", "--model-path", "{in}/m-good"),
         "is not UTF-8 text (byte 0xe9 at byte offset 14 is not UTF-8)"),
    Case("run-text-not-utf8", X, RUN + ("--data", "{in}/d-latin1-text.jsonl", "--model-path", "{in}/m-good"),
         "d-latin1-text.jsonl:2 is not UTF-8 text (byte 0xe9 at byte offset 167 is not UTF-8)"),
    # destinations the OS refuses: one line for every command that writes
    Case("export-into-sys", X, ("export", "--merge", "{in}/lora-run/final", "--base", "{in}/m-good",
                                "-o", "/sys/zoexec-merged"), "cannot write /sys/zoexec-merged"),
    Case("import-gguf-into-sys", X, ("import-gguf", "{in}/g-good.gguf", "-o", "/sys/zoexec-hf"),
         "cannot write /sys/zoexec-hf"),
    # usage errors: one line, not the usage text and a box
    Case("run-unknown-option", X, RUN + ("--frobnicate",), "No such option: --frobnicate"),
    Case("run-steps-not-a-number", X, RUN[:2] + ("--steps", "many"), "Invalid value for '--steps'"),
    Case("run-without-a-plan", X, ("run",), "Missing argument 'plan'"),
    Case("zoexec-unknown-command", X, ("frob",), "No such command 'frob'"),
    Case("optimize-gpus-without-a-value", P, ("optimize", "--gpus"), "Option '--gpus' requires an argument"),
    # zoexec export --merge: the adapters and the base checked against what the run saved
    Case("export-adapter-bits-flipped", X, ("export", "--merge", "{in}/a-flipped", "--base",
                                            "{in}/m-good", "-o", "m"),
         "a-flipped/adapter_model.safetensors changed (sha256"),
    Case("export-alpha-edited", X, ("export", "--merge", "{in}/a-alpha", "--base", "{in}/m-good", "-o", "m"),
         "a-alpha/adapter_config.json changed (sha256"),
    Case("export-targets-cut-checksums-redone", X, ("export", "--merge", "{in}/a-targets", "--base",
                                                    "{in}/m-good", "-o", "m"),
         "adapters of (r, alpha, targets) (8, 16, ['q_proj']), the run's are (8, 16, ['q_proj', 'v_proj'])"),
    Case("export-into-another-base", X, ("export", "--merge", "{in}/lora-run/final", "--base",
                                         "{in}/m-other", "-o", "m"),
         "m-other is not the base the run trained on"),
    Case("export-base-of-a-random-init-run", X, ("export", "--merge", "{in}/a-random", "--base",
                                                 "{in}/m-good", "-o", "m"),
         "the run trained on random weights (no model folder recorded)"),
    # a new run's folder: a symbolic link among its paths refused before anything is written
    Case("run-out-with-a-linked-metrics-file", X, RUN + ("--out", "out"),
         "out/metrics.jsonl is a symbolic link (to", setup="link:out/metrics.jsonl"),
    Case("run-overwrite-a-linked-snapshots-folder", X, RUN + ("--out", "out", "--overwrite"),
         "out/snapshots is a symbolic link (to", setup="link:out/snapshots"),
    Case("run-out-with-a-final-not-written-by-zoexec", X, RUN + ("--out", "out"),
         "out/final was not written by zoexec (no state.json)", setup="dir:out/final"),
    # task data that cannot be right: the row and the column named
    Case("run-copa-empty-candidate", X, RUN + ("--data", "{in}/t-copa-empty.jsonl", "--task-preset",
                                               "copa", "--model-path", "{in}/m-good"),
         "t-copa-empty.jsonl row 2: column 'choice2' is empty"),
    Case("run-copa-whitespace-candidate", X, RUN + ("--data", "{in}/t-copa-blank.jsonl", "--task-preset",
                                                    "copa", "--model-path", "{in}/m-good"),
         "t-copa-blank.jsonl row 1: column 'choice1' is empty"),
    Case("run-choices-template-fills-empty", X, RUN + (
        "--data", "{in}/t-copa-empty.jsonl", "--task", "multiple-choice", "--template", "{premise}",
        "--choices", "{choice1}|{choice2}", "--model-path", "{in}/m-good"),
         "row 2: candidate 2 (--choices '{choice2}', from 'choice2') is empty"),
    Case("run-copa-candidates-the-same", X, RUN + ("--data", "{in}/t-copa-same.jsonl", "--task-preset",
                                                   "copa", "--model-path", "{in}/m-good"),
         "t-copa-same.jsonl row 1: candidates 1 and 2"),
    Case("run-record-query-without-placeholder", X, RUN + (
        "--data", "{in}/t-record-noplace.jsonl", "--task-preset", "record", "--model-path", "{in}/m-good"),
         "t-record-noplace.jsonl row 1: column 'query' holds no @placeholder"),
    Case("run-record-empty-entity", X, RUN + ("--data", "{in}/t-record-empty.jsonl", "--task-preset",
                                              "record", "--model-path", "{in}/m-good"),
         "t-record-empty.jsonl row 1: item 2 of column 'entities' is empty"),
    Case("run-choices-column-empty-list", X, RUN + (
        "--data", "{in}/t-options-empty.jsonl", "--task", "multiple-choice", "--template", "{q}",
        "--choices-column", "options", "--model-path", "{in}/m-good"),
         "t-options-empty.jsonl row 1: column 'options' holds an empty list: no candidates"),
    Case("run-classification-label-true", X, RUN + ("--data", "{in}/t-sst2-true.jsonl", "--task-preset",
                                                    "sst2", "--model-path", "{in}/m-good"),
         "t-sst2-true.jsonl row 1: label True in column 'label' is true/false, not an index"),
    Case("run-classification-label-float", X, RUN + ("--data", "{in}/t-sst2-float.jsonl", "--task-preset",
                                                     "sst2", "--model-path", "{in}/m-good"),
         "in column 'label' is a float, not an integer (a column with one float reads every value"),
    Case("run-multiple-choice-label-true", X, RUN + ("--data", "{in}/t-copa-true.jsonl", "--task-preset",
                                                     "copa", "--model-path", "{in}/m-good"),
         "t-copa-true.jsonl row 1: label True in column 'label' is true/false, not an index"),
    Case("run-save-best-trailing-colon", X, RUN + ("--data", "{in}/d-ids.jsonl", "--eval-data",
                                                   "{in}/d-ids.jsonl", "--save-best", "eval_loss:",
                                                   "--out", "o"),
         "--save-best eval_loss:: must be one of"),
    # the hostile round: what broke, and is one line now
    Case("show-plan-a-link-loop", P, ("show", "loop.json"), "loop.json: Too many levels of symbolic links",
         setup="link:loop.json>loop.json"),
    Case("show-plan-nested-too-deeply", P, ("show", "{in}/pl-deep.json"), "is not valid JSON: nested too deeply"),
    Case("show-plan-an-integer-of-5000-digits", P, ("show", "{in}/pl-digits.json"),
         "Exceeds the limit (4300 digits) for integer string conversion"),
    Case("optimize-plan-over-its-profile", P, OPT[:-3] + ("-o", "{in}/p-own.json", "-q", "--model", "tiny-opt",
                                                         "--profile", "{in}/p-own.json"),
         "it is the input"),
    Case("profile-output-in-sys", P, ("profile", "--quick", "-o", "/sys/zoplan-profile.json"),
         "cannot write /sys/zoplan-profile.json"),
    Case("run-threads-100000", X, RUN + ("--threads", "100000"), "--threads 100000: must be in 1..1024"),
    Case("run-data-nested-too-deeply", X, RUN + ("--data", "{in}/d-deep.jsonl", "--task-preset", "sst2",
                                                 "--model-path", "{in}/m-good"),
         "d-deep.jsonl:1: JSON nested too deeply (over 1000 levels)"),
    Case("run-data-parquet-damaged", X, RUN + ("--data", "{in}/d-bad.parquet", "--task-preset", "sst2",
                                               "--model-path", "{in}/m-good"),
         "cannot read data file"),
    Case("run-data-csv-header-only", X, RUN + ("--data", "{in}/d-header.csv", "--task-preset", "sst2",
                                               "--model-path", "{in}/m-good"),
         "d-header.csv holds no rows"),
    Case("run-data-a-link-loop", X, RUN + ("--data", "loop.jsonl"), "loop.jsonl: Too many levels of symbolic links",
         setup="link:loop.jsonl>loop.jsonl"),
    Case("run-resume-and-overwrite", X, RUN[:2] + ("--resume", "a", "--overwrite"),
         "give either --resume DIR (continue the run) or --overwrite"),
    Case("lengths-over-its-data", X, ("lengths", "{in}/d-sst2.jsonl", "--model-path", "{in}/m-good",
                                      "--task-preset", "sst2", "-o", "{in}/d-sst2.jsonl"),
         "it is the input"),
    Case("import-gguf-truncated", X, ("import-gguf", "{in}/g-cut.gguf", "-o", "hf"),
         "g-cut.gguf: truncated or damaged"),
    # issue 41: an index (or a link) naming a shard outside the model folder: refused in
    # one line before it is opened, by the planner and every command that reads weights
    Case("run-index-shard-climbs-out", X, RUN + ("--model-path", "{in}/m-climb"),
         "names the shard '../m-good/model.safetensors', outside the model folder"),
    Case("run-index-shard-absolute", X, RUN + ("--model-path", "{in}/m-absolute"),
         "names the shard '/etc/passwd', outside the model folder"),
    Case("run-shard-a-link-outside", X, RUN + ("--model-path", "{in}/m-link"),
         "names the shard 'model.safetensors', a link to"),
    Case("eval-index-shard-climbs-out", X, ("eval", "{in}/m-climb", "--data", "{in}/d-ids.jsonl"),
         "names the shard '../m-good/model.safetensors', outside the model folder"),
    Case("export-base-index-shard-absolute", X, ("export", "--merge", "{in}/lora-run/final", "--base",
                                                 "{in}/m-absolute", "-o", "m"),
         "names the shard '/etc/passwd', outside the model folder"),
    Case("optimize-model-index-shard-absolute", P, OPT + ("--model", "{in}/m-absolute", "--profile", "cpu"),
         "names the shard '/etc/passwd', outside the model folder"),
    # zoplan calibrate --fit refits only from a trace of the plan's own run
    Case("calibrate-fit-another-plan-s-trace", P,
         ("calibrate", "{in}/plan.json", "{in}/tr-other", "--profile", "cpu", "--fit", "-o", "fit.json"),
         "--fit: trace"),
]


# ---- the broken inputs ---------------------------------------------------------------------
def _dump(path: Path, data) -> None:
    path.write_text(data if isinstance(data, str) else json.dumps(data))


def _profiles(where: Path) -> None:
    base = json.loads((PROFILES_DIR / "cpu.json").read_text())

    def variant(name: str, change) -> None:
        data = copy.deepcopy(base)
        change(data)
        _dump(where / name, data)

    variant("p-bw.json", lambda d: d["pcie"].update(h2d_gbps=1e308))
    variant("p-tflops.json", lambda d: d["compute"].update(peak_tflops=1e-300))
    variant("p-cores.json", lambda d: d["host"].update(cores=2.5))
    variant("p-reserved.json", lambda d: d["device"].update(reserved_gib=40))
    variant("p-check.json", lambda d: d.update(speed_check={
        k: {"median_s": 1e308 if k == "gemm" else 0.01} for k in ("gemm", "memory", "z")}))
    _dump(where / "p-inf.json", json.dumps(base).replace('"h2d_gbps": 8', '"h2d_gbps": Infinity'))


def _configs(where: Path) -> None:
    opt = CATALOGUE_CONFIGS["tiny-opt"]
    llama = CATALOGUE_CONFIGS["tiny-llama"]
    _dump(where / "c-layers.json", {**opt, "num_hidden_layers": 2.5})
    _dump(where / "c-vocab.json", {**opt, "vocab_size": 10**13})
    _dump(where / "c-heads.json", {**opt, "hidden_size": 130})
    _dump(where / "c-kv.json", {**llama, "num_key_value_heads": 3})
    _dump(where / "c-flag.json", {**opt, "tie_word_embeddings": "yes"})


def _plans(where: Path, plan: dict) -> None:
    def variant(name: str, change) -> None:
        data = copy.deepcopy(plan)
        change(data)
        _dump(where / name, data)

    variant("pl-step.json", lambda d: d["predicted"].update(step_time_s=1e308))
    variant("pl-span.json", lambda d: d["predicted"]["spans"][0].update(rank=0.5))
    variant("pl-layout.json", lambda d: d["layout"].update(ddp="1"))
    variant("pl-seq.json", lambda d: d["workload"].update(seq=4096))
    variant("pl-ranks.json", lambda d: d["ranks"]["exceptions"].append({"rank": 1, "role": "+"}))
    variant("pl-util.json", lambda d: d["predicted"]["utilisation"].update({"pcie.h2d": "high"}))


def _traces(where: Path, plan: Plan) -> None:
    good = where / "trace"
    spans = plan.spans()
    write_trace(good, spans, {"world_size": 2, "layout": plan.data["layout"],
                              "plan_sha256": sha256_json(plan.data)})

    def variant(name: str, file: str, change) -> None:
        shutil.copytree(good, where / name)
        path = where / name / file
        path.write_bytes(change(path.read_bytes()))

    variant("tr-meta-list", "meta.json", lambda b: b"[]")
    variant("tr-meta-world", "meta.json", lambda b: b.replace(b'"world_size": 2', b'"world_size": "two"'))
    variant("tr-line", "rank0.jsonl", lambda b: b"\n".join(b.split(b"\n")[:2] + [b"{oops"]
                                                           + b.split(b"\n")[2:]))
    variant("tr-huge", "rank1.jsonl", lambda b: b.replace(b'"start_s": ', b'"start_s": 1e308, "x": ', 1))
    variant("tr-binary", "rank0.jsonl", lambda b: b + b"\xff\xfe\x00\n")
    span = {"kind": "h2d", "rank": 0, "start_s": 0.0, "dur_s": 0.001, "block": 999, "step": 0}
    variant("tr-block", "rank0.jsonl", lambda b: b + json.dumps(span).encode() + b"\n")
    variant("tr-rank", "rank0.jsonl", lambda b: b + json.dumps({**span, "rank": 1, "block": 0}).encode() + b"\n")
    variant("tr-other", "meta.json", lambda b: b.replace(sha256_json(plan.data).encode(), b"0" * 64))


def _data(where: Path) -> None:
    (where / "d-empty.jsonl").write_text("")
    (where / "d-json.jsonl").write_text('{"input_ids": [1, 2]}\n{oops\n')
    (where / "d-oov.jsonl").write_text('{"input_ids": [1, 99999]}\n')
    (where / "d-text.jsonl").write_text('{"text": "hello world"}\n')
    (where / "d-short.jsonl").write_text(json.dumps({"input_ids": list(range(40))}) + "\n")
    (where / "d-ids.jsonl").write_text(json.dumps({"input_ids": list(range(4, 80))}) + "\n")
    (where / "noconfig").mkdir()
    good = make_model_dir(where / "m-good")
    model = where / "model"    # a model folder with weights but no tokenizer
    model.mkdir()
    _dump(model / "config.json", CATALOGUE_CONFIGS["tiny-opt"])
    shutil.copy(good / "model.safetensors", model / "model.safetensors")
    shutil.copytree(good, where / "m-trunc")    # a shard cut short (a copy that stopped)
    shard = where / "m-trunc" / "model.safetensors"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])


def _special(where: Path) -> None:
    """Inputs that are FIFOs where a regular file belongs (each made with mkfifo)."""
    for name in ("d-fifo.jsonl", "g-fifo.gguf", "pl-fifo.json", "p-fifo.json", "c-fifo.json"):
        os.mkfifo(where / name)
    shutil.copytree(where / "m-good", where / "m-fifo")
    (where / "m-fifo" / "model.safetensors").unlink()
    os.mkfifo(where / "m-fifo" / "model.safetensors")
    (where / "d-fifo-folder").mkdir()
    (where / "d-fifo-folder" / "state.json").write_text("{}")
    os.mkfifo(where / "d-fifo-folder" / "data-00000-of-00001.arrow")
    shutil.copytree(where / "trace", where / "tr-fifo")
    (where / "tr-fifo" / "rank0.jsonl").unlink()
    os.mkfifo(where / "tr-fifo" / "rank0.jsonl")


def _latin1(where: Path) -> None:
    """Data whose bytes are not UTF-8 (Latin-1 text: 0xe9 is "é"), one file per task."""
    rows = {"sst2": [{"sentence": "a good movie", "label": 1}, {"sentence": "caf\xe9 bad", "label": 0}],
            "copa": [{"premise": "Ann caf\xe9.", "choice1": "a", "choice2": "b", "question": "cause",
                      "label": 0}],
            "squad": [{"title": "caf\xe9", "context": "c", "question": "q",
                       "answers": {"text": ["a"], "answer_start": [0]}}],
            "text": [{"input_ids": list(range(4, 40))}, {"text": "caf\xe9"}]}
    for name, lines in rows.items():
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in lines)
        (where / f"d-latin1-{name}.jsonl").write_bytes(text.encode("latin-1"))


def _tasks(where: Path) -> None:
    """Task data that cannot be right (each file one flaw)."""
    copa = {"premise": "It was fun.", "choice1": "I liked it", "choice2": "I hated it",
            "question": "effect", "label": 0}
    record = {"passage": "the movie", "query": "@placeholder was good", "entities": ["it", "movie"],
              "answers": ["it"]}
    files = {"t-copa-empty": [copa, {**copa, "choice2": ""}],
             "t-copa-blank": [{**copa, "choice1": "   "}],
             "t-copa-same": [{**copa, "choice2": copa["choice1"]}],
             "t-copa-true": [{**copa, "label": True}],
             "t-record-noplace": [{**record, "query": "it was good"}],
             "t-record-empty": [{**record, "entities": ["it", ""]}],
             "t-options-empty": [{"q": "the movie", "options": [], "label": 0}],
             "t-sst2-true": [{"sentence": "a good movie", "label": True}],
             "t-sst2-float": [{"sentence": "a good movie", "label": 0}, {"sentence": "bad", "label": 1.0}]}
    for name, rows in files.items():
        (where / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _hostile(where: Path, plan: dict) -> None:
    """What the hostile round fed the commands (docs: /work notes of issue 30)."""
    _dump(where / "pl-deep.json", "[" * 200_000 + "]" * 200_000)
    _dump(where / "pl-digits.json", json.dumps(plan).replace('"batch": 2', '"batch": ' + "9" * 5000, 1))
    (where / "d-deep.jsonl").write_text('{"sentence": ' + "[" * 60_000 + "]" * 60_000 + ', "label": 0}\n')
    (where / "d-bad.parquet").write_bytes(b"PAR1garbagePAR1")
    (where / "d-header.csv").write_text("sentence,label\n")
    shutil.copy(PROFILES_DIR / "cpu.json", where / "p-own.json")
    (where / "d-sst2.jsonl").write_text(json.dumps({"sentence": "a good movie", "label": 1}) + "\n")


def _shards(where: Path) -> None:
    """Model folders whose weights lie outside them: an index naming a shard by `../`
    or by an absolute path, a shard that is a link to another folder's."""
    from safetensors import safe_open

    with safe_open(str(where / "m-good" / "model.safetensors"), framework="pt") as handle:
        names = list(handle.keys())
    for folder, shard in (("m-climb", "../m-good/model.safetensors"), ("m-absolute", "/etc/passwd")):
        (where / folder).mkdir()
        shutil.copy(where / "m-good" / "config.json", where / folder / "config.json")
        _dump(where / folder / "model.safetensors.index.json",
              {"metadata": {}, "weight_map": {name: shard for name in names}})
    shutil.copytree(where / "m-good", where / "m-link")
    (where / "m-link" / "model.safetensors").unlink()
    (where / "m-link" / "model.safetensors").symlink_to(where / "m-good" / "model.safetensors")


def _lora(where: Path) -> None:
    """A LoRA run of 2 steps on m-good (lora-run/final: its adapters), and adapter
    folders damaged from it; m-other: a base of the same shape and other weights."""
    from typer.testing import CliRunner

    from zoexec.cli import app
    from zoexec.model.saved import folder_checksums
    from zoplan.handplan import hand_plan
    from zoplan.layout import Layout
    from zoplan.workload import Workload

    workload = Workload(batch=2, seq=8, param_dtype="fp32", compute_dtype="fp32", tuning="lora")
    hand_plan(model="tiny-opt", layout=Layout(), workload=workload).save(where / "lora-plan.json")
    result = CliRunner().invoke(app, ["run", str(where / "lora-plan.json"), "--model-path",
                                      str(where / "m-good"), "--steps", "2", "--threads", "1",
                                      "-q", "--out", str(where / "lora-run")])
    assert result.exit_code == 0, result.output
    final = where / "lora-run" / "final"

    def variant(name: str, change, *, reseal: bool = False) -> None:
        shutil.copytree(final, where / name)
        change(where / name)
        if reseal:   # checksums redone over the change (state.json is not under them)
            state = json.loads((where / name / "state.json").read_text())
            state["files"] = folder_checksums(where / name)
            (where / name / "state.json").write_text(json.dumps(state))

    def edit(file: str, change):
        def apply(folder: Path) -> None:
            data = json.loads((folder / file).read_text())
            change(data)
            (folder / file).write_text(json.dumps(data))
        return apply

    def flip(folder: Path) -> None:
        raw = bytearray((folder / "adapter_model.safetensors").read_bytes())
        raw[-5] ^= 0x40
        (folder / "adapter_model.safetensors").write_bytes(bytes(raw))

    variant("a-flipped", flip)
    variant("a-alpha", edit("adapter_config.json", lambda d: d.update(lora_alpha=64)))
    variant("a-targets", edit("adapter_config.json", lambda d: d.update(target_modules=["q_proj"])),
            reseal=True)
    variant("a-random", edit("state.json", lambda d: d.update(base=None)))
    variant("a-fifo", lambda f: ((f / "adapter_model.safetensors").unlink(),
                                 os.mkfifo(f / "adapter_model.safetensors")))
    make_model_dir(where / "m-other", seed=5)


def _gguf(where: Path) -> None:
    from gguf_file import write_llama_gguf

    from zoexec.model.export import hf_tensors
    from zoexec.store.loading import build_parts

    parts, flats = build_parts("tiny-llama", seed=7)
    write_llama_gguf(where / "g-good.gguf", {k: t.clone() for k, t in hf_tensors(parts, flats)},
                     parts.config)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    where = tmp_path_factory.mktemp("inputs")
    plan = optimize(model="tiny-opt", gpus=2, profile="cpu", batch=2, seq=32, ddp=2,
                    output=where / "plan.json")
    _profiles(where)
    _configs(where)
    _plans(where, plan.data)
    _traces(where, plan)
    _data(where)
    _special(where)
    _latin1(where)
    _tasks(where)
    _lora(where)
    _shards(where)
    _gguf(where)
    _hostile(where, plan.data)
    (where / "g-cut.gguf").write_bytes((where / "g-good.gguf").read_bytes()[:2000])
    return where


# ---- running the table ----------------------------------------------------------------------
@dataclass(frozen=True)
class Outcome:
    code: int
    stdout: str
    stderr: str
    before: list[str]
    after: list[str]
    pid: int


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def _folder(case: Case, cases: Path) -> Path:
    """The case's working folder; "dir:NAME" makes a folder in it, "link:NAME" a
    symbolic link NAME to a file or folder of the user's beside it (mine/)."""
    folder = cases / case.id
    folder.mkdir()
    kind, _, name = case.setup.partition(":")
    name, _, target = name.partition(">")
    if kind == "dir":
        (folder / name).mkdir(parents=True)
    elif kind == "link" and target:   # a link to the given target (itself: a loop)
        (folder / name).symlink_to(target)
    elif kind == "link":
        target = folder / "mine" / Path(name).name
        target.parent.mkdir()
        if Path(name).suffix:
            target.write_text("the user's own\n")
        else:
            (target / "keep").mkdir(parents=True)
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).symlink_to(target)
    return folder


def _run_in_process(case: Case, inputs: Path, cases: Path) -> Outcome:
    """A case through its tool's CLI in this process, in the case's folder."""
    from typer.testing import CliRunner

    from zoexec.cli import app as zoexec_app
    from zoplan.cli import app as zoplan_app

    app = zoexec_app if case.tool == X else zoplan_app

    folder = _folder(case, cases)
    before = _files(folder)
    args = [a.replace("{in}", str(inputs)) for a in case.args]
    old = Path.cwd()
    os.chdir(folder)
    try:
        result = CliRunner().invoke(app, args)
    finally:
        os.chdir(old)
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        stderr += f"\nTraceback (in process): {result.exception!r}"
    return Outcome(result.exit_code, result.stdout, stderr, before, _files(folder), os.getpid())


def _run(case: Case, inputs: Path, cases: Path, env: dict) -> Outcome:
    folder = _folder(case, cases)
    before = _files(folder)
    args = [a.replace("{in}", str(inputs)) for a in case.args]
    proc = subprocess.Popen(command(case.tool) + args, cwd=folder, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        stdout, stderr = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        stderr += "\n(timed out)"
    return Outcome(proc.returncode, stdout, stderr, before, _files(folder), proc.pid)


def _shm_entries() -> set[str]:
    shm = Path("/dev/shm")
    return {p.name for p in shm.glob("zoexec-*")} if shm.is_dir() else set()


@pytest.fixture(scope="module")
def outcomes(inputs, tmp_path_factory):
    cases = tmp_path_factory.mktemp("cases")
    shm_dir = tmp_path_factory.mktemp("shm")
    env = {k: v for k, v in os.environ.items() if k not in ("ZOEXEC_DEBUG", "COLUMNS")}
    env["ZOEXEC_SHM_DIR"] = str(shm_dir)   # a private store folder: its sweep sees no one else's files
    shm_before = _shm_entries()
    apart = [c for c in CASES if c.id in IN_SUBPROCESS]
    with ThreadPoolExecutor(max_workers=2) as pool, pytest.MonkeyPatch.context() as patch:
        running = pool.map(lambda c: _run(c, inputs, cases, env), apart)
        for name in ("ZOEXEC_DEBUG", "COLUMNS"):
            patch.delenv(name, raising=False)
        patch.setenv("ZOEXEC_SHM_DIR", str(shm_dir))
        patch.setattr(shmfiles, "SHM_DIR", shm_dir)
        results = {c.id: _run_in_process(c, inputs, cases) for c in CASES if c not in apart}
        results.update(zip((c.id for c in apart), running))
    return {"results": results, "shm_dir": shm_dir,
            "shm_new": _shm_entries() - shm_before}


GOOD_INPUTS = {"plan.json", "trace", "lora-plan.json"}   # what the broken inputs are made from
MISSING = {"nomodel", "nope.jsonl", "norun", "no-eval.jsonl"}   # inputs cases name as missing, on purpose


def test_each_case_feeds_its_own_broken_input(inputs):
    """The table is sound: unique ids, each case of a command its own expected line, the commands of
    both tools exercised; every input a case names is made (a missing one would fail
    with "does not exist", not with the problem the case is about) and every broken
    input made is fed to a case."""
    assert len({c.id for c in CASES}) == len(CASES)
    assert len({(c.tool, c.args[0], c.expect) for c in CASES}) == len(CASES)   # one line per case of a command
    assert {(c.tool, c.args[0]) for c in CASES} >= {(P, "optimize"), (P, "show"), (X, "run")}
    assert IN_SUBPROCESS <= {c.id for c in CASES if c.tool == P}
    named = set()
    for case in CASES:
        for arg in case.args:
            if arg.startswith("{in}/"):
                name = arg.removeprefix("{in}/").split("/")[0]
                made = (inputs / name).exists()
                assert made != (name in MISSING), f"{case.id}: {name} made {made}"
                named.add(name)
    made = {path.name for path in inputs.iterdir()}
    assert made - named - GOOD_INPUTS == set(), "broken inputs no case feeds"


# values the command line may give an option, one of which each checked option refuses
BAD_TEXTS = ("not-one-of-them", "-1", "0", "-1e9", "nan", "inf", "1e400", " ", "x,", "1x")


def _refused_text(f, hint) -> str | None:
    """A text of BAD_TEXTS that the option field `f` refuses (its type, its fixed set,
    its check), as the command line turns it into the field's value; None: none is."""
    from zoexec.config import FieldError, check_value
    from zoexec.flags import _base_type

    kind = _base_type(f, hint)
    for text in BAD_TEXTS:
        try:
            value = f.metadata["parse"](text) if f.metadata["parse"] else kind(text)
        except ValueError:
            continue          # the type refuses it: click's usage error, not the field's
        try:
            check_value(f, hint, value)
        except FieldError:
            return text
    return None


def _checked_options() -> list:
    import typing

    from zoexec.config import SECTIONS, choices_of, option_fields

    out = []
    for section in SECTIONS.values():
        hints = typing.get_type_hints(section)
        out += [(f, hints[f.name]) for f in option_fields(section)
                if f.metadata["check"] or choices_of(f, hints[f.name])]
    return out


@pytest.mark.parametrize("field,hint", _checked_options(), ids=lambda v: getattr(v, "name", ""))
def test_every_checked_option_refuses_a_bad_value_in_one_line(inputs, tmp_path, field, hint):
    """Each option whose field checks its value (a fixed set or a check), with a value
    the field refuses, is one `error:` line naming the option, exit 2, nothing written:
    the table's cases are examples; this covers every option, those added later too."""
    from typer.testing import CliRunner

    from zoexec.cli import app
    from zoexec.config import flag_of

    text = _refused_text(field, hint)
    assert text is not None, f"{flag_of(field)}: no value of BAD_TEXTS is refused"
    old = Path.cwd()
    os.chdir(tmp_path)
    try:
        result = CliRunner().invoke(app, ["run", str(inputs / "plan.json"), flag_of(field), text])
    finally:
        os.chdir(old)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    shown = f"{flag_of(field)} {text!r}: exit {result.exit_code}: {result.stderr}"
    assert result.exit_code == 2 and isinstance(result.exception, (SystemExit, type(None))), shown
    assert len(lines) == 1 and lines[0].startswith(f"error: {flag_of(field)} "), shown
    assert list(tmp_path.iterdir()) == [], shown


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_clear_line(outcomes, case):
    out = outcomes["results"][case.id]
    shown = f"exit {out.code}\nstdout:\n{out.stdout}\nstderr:\n{out.stderr}"
    assert out.code == 2, shown
    assert "Traceback" not in out.stdout + out.stderr, shown
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), shown
    assert case.expect in lines[0], shown
    if case.tool == X:   # found by the launcher's checks, not by a rank that started
        assert not lines[0].startswith("error: rank "), shown
    assert out.after == out.before, f"files left behind: {sorted(set(out.after) - set(out.before))}"


def test_nothing_is_left_in_shared_memory(outcomes):
    assert list(outcomes["shm_dir"].iterdir()) == []
    pids = {f".{o.pid}." for o in outcomes["results"].values()}
    ours = [name for name in outcomes["shm_new"] if any(pid in name for pid in pids)]
    assert ours == []
