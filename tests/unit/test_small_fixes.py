"""Small things a new user met (issue 40): a prefix run's summary suggests no merge (a
prefix has no weights to merge); `scripts/test.sh --help` prints its usage and runs
nothing; benchmarks/planner/cost_table.py prices a user-written profile (no datasheet figures:
no bounds); zoplan's output piped to a file keeps wide tables whole."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


@pytest.mark.parametrize("prefix", [True, False])
def test_the_summary_suggests_a_merge_for_lora_only(prefix, tmp_path):
    from zoexec.run.report import _adapter_lines

    cfg = SimpleNamespace(source_dir=str(tmp_path / "base"))
    (tmp_path / "final").mkdir()
    (tmp_path / "final" / "adapter_config.json").write_text(
        '{"peft_type": "%s"}' % ("PREFIX_TUNING" if prefix else "LORA"))
    text = "\n".join(_adapter_lines(cfg, tmp_path / "final"))
    assert ("export --merge" in text) is not prefix, text
    assert f"zoexec eval {tmp_path / 'final'}" in text


def test_test_sh_help_prints_its_usage_and_runs_nothing():
    done = subprocess.run(["bash", str(ROOT / "scripts" / "test.sh"), "--help"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: scripts/test.sh"), done.stdout
    assert "positional arguments" not in done.stdout   # pytest's own help: not run


def test_cost_table_prices_a_user_written_profile(monkeypatch, capsys):
    profile = ROOT / "tests" / "fixtures" / "node4-nvswitch.json"   # no datasheet figures
    monkeypatch.setattr(sys, "argv", ["cost_table.py", "--profile", str(profile), "--model",
                                      "opt-125m", "--gpus", "1", "--batch", "4", "--seq", "128"])
    runpy.run_path(str(ROOT / "benchmarks" / "planner" / "cost_table.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "the bounds are left out" in out and "| forward (compute lane) |" in out, out
    assert "| all terms as priced |" in out, out


def test_piped_zoplan_output_keeps_wide_tables_whole(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    done = subprocess.run([str(BIN / "zoplan"), "optimize", "--model", "opt-125m", "--gpus", "4",
                           "--profile", "dgx-a100-80gb", "--batch", "4", "--seq", "128", "-o",
                           str(tmp_path / "plan.json")], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert "bottleneck" in done.stdout and "…" not in done.stdout, done.stdout


def test_the_settings_page_is_made_from_the_results_and_a_stale_one_is_found():
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen_docs.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    results = json.loads(gen.SETTINGS_RESULTS.read_text())
    page = gen.settings_page(results)
    assert page == gen.SETTINGS_DOC.read_text()
    prefix = next(e for e in results["entries"] if e["tuning"] == "prefix")
    assert f"| prefix | mezo | lr {prefix['settings']['lr']}, eps" in page
    prefix["settings"]["lr"] = "1e-3"   # a figure changed in the results: the page is stale
    assert gen.problem(gen.SETTINGS_DOC, page, gen.settings_page(results))


@pytest.mark.parametrize("tracker, package", [("wandb", "wandb"), ("mlflow", "mlflow-skinny")])
def test_a_tracker_without_its_package_is_one_line(monkeypatch, tracker, package):
    import importlib.util

    from zoexec.run.trackers import check_tracker
    from zoplan.errors import ZoError

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ZoError, match=f"--report-to {tracker} needs the {package} package, "
                                      f"which is not installed"):
        check_tracker(tracker, "out")
