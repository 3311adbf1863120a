"""What says it is torch-free is: the run configuration (every section, the task types'
registry, a whole RunConfig built and checked, `zoexec --help`) and the planner
(zoplan's commands, search, calibration, profiling's fits) import and work in a Python
where torch and the executor's other packages cannot be imported at all, not merely
where they happen not to be loaded yet (tests/unit/test_import_rules.py reads the
imports; this runs them)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BLOCKED = ("torch", "transformers", "safetensors", "numpy", "psutil", "datasets", "peft",
           "accelerate", "gguf", "tokenizers")

BLOCKER = f"""
import sys

class Unimportable:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {BLOCKED!r}:
            raise ImportError("unimportable here: " + name)

sys.meta_path.insert(0, Unimportable())
"""

CONFIG = """
from typer.testing import CliRunner

from zoexec.cli import app
from zoexec.config import RunConfig
from zoplan.handplan import hand_plan
from zoplan.layout import Layout
from zoplan.workload import Workload

plan = hand_plan(model="tiny-opt", layout=Layout(), workload=Workload(batch=2, seq=8)).data
cfg = RunConfig.make(plan=plan, data="d.jsonl", eval_data="e.jsonl", task_preset="copa",
                     demonstrations=2, max_shard_size="2GB", save_best="eval_accuracy_norm",
                     save_every="10m", lr=1e-4, steps=5)
print(cfg.task.type.name, cfg.checkpoint.max_shard_bytes, cfg.checkpoint.best,
      sorted(cfg.settings()))
help = CliRunner().invoke(app, ["run", "--help"])
print(help.exit_code, "--task-preset" in help.output)
"""

PLANNER = """
import zoplan.cli, zoplan.search, zoplan.calibrate, zoplan.profiling, zoplan.views
from zoplan.handplan import hand_plan
from zoplan.layout import Layout
from zoplan.workload import Workload

print(hand_plan(model="tiny-opt", layout=Layout(), workload=Workload(batch=2, seq=8)).step_time_s > 0)
"""


def run_blocked(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCKER + code], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)


def test_the_blocker_blocks():
    """The guard can fail: torch itself is refused under it."""
    out = run_blocked("import torch\n")
    assert out.returncode != 0 and "unimportable here: torch" in out.stderr


def test_the_run_configuration_is_torch_free():
    out = run_blocked(CONFIG)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("multiple-choice 2000000000 ('eval_accuracy_norm', True)"), out.stdout
    assert lines[1] == "0 True", out.stdout


def test_the_planner_is_torch_free():
    out = run_blocked(PLANNER)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"
