"""`zoexec run --config FILE` (issue 40): the README's three-step example (a
classification run with HF Trainer names) from a config file written by --print-config
trains to the same bytes of final/ as from flags; the command line overrides the file."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from typer.testing import CliRunner

from zoexec.cli import app
from zoplan.handplan import hand_plan
from zoplan.layout import Layout
from zoplan.models import get_model
from zoplan.workload import Workload

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
from make_model import make_model  # noqa: E402

DATA = ROOT / "examples" / "sentiment"


def _readme_flags(model: Path) -> list[str]:
    """The README's step 2, on a micro model for 3 steps."""
    return ["--model-path", str(model), "--data", str(DATA / "train.jsonl"),
            "--task", "classification", "--template", "{sentence} It was",
            "--label-words", "terrible,great", "--eval-data", str(DATA / "test.jsonl"),
            "--eval-steps", "2", "--max-steps", "3", "--learning-rate", "1e-3", "--eps", "1e-3",
            "--eval-samples", "8", "--threads", "1", "-q"]


def _evals(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "eval_loss" in r]


def test_the_readme_example_from_a_config_file_gives_the_same_final(tmp_path):
    model = make_model(tmp_path / "micro", size="micro", seed=0)
    plan = tmp_path / "plan.json"
    hand_plan(model=get_model(str(model)), layout=Layout(),
              workload=Workload(batch=8, seq=48, param_dtype="fp32",
                                compute_dtype="fp32")).save(plan)
    runner = CliRunner()
    flags = runner.invoke(app, ["run", str(plan), *_readme_flags(model), "--output-dir",
                                str(tmp_path / "flags")])
    assert flags.exit_code == 0, flags.output
    config = tmp_path / "run.yaml"
    wrote = runner.invoke(app, ["run", str(plan), *_readme_flags(model), "--print-config",
                                str(config)])
    assert wrote.exit_code == 0 and config.is_file(), wrote.output
    text = config.read_text()
    assert "learning_rate" not in text and "lr: 0.001" in text, text   # under the flag's name
    config.write_text(text.replace("0.001", "0.5"))   # the command line sets lr and eps back
    from_file = runner.invoke(app, ["run", str(plan), "--config", str(config), "--lr", "1e-3",
                                    "--eps", "1e-3", "--out", str(tmp_path / "file")])
    assert from_file.exit_code == 0, from_file.output
    for name in ("model.safetensors", "config.json"):
        assert (tmp_path / "file" / "final" / name).read_bytes() == \
            (tmp_path / "flags" / "final" / name).read_bytes(), name
    assert _evals(tmp_path / "file") == _evals(tmp_path / "flags") != []
