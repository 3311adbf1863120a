"""`--report-to wandb` and `--report-to mlflow` (issue 40), offline: a run writes a
wandb offline run (its .wandb file: the records read with wandb's own protobuf;
`wandb sync --dry-run OUT/wandb/offline-run-*` lists it, tried by hand) and an MLflow file store (read with MLflow's client),
each with the loss, the learning rate, the evaluation metrics, the plan's predicted step
beside the measured one and the run's settings. Skipped without the packages
(`pip install "zoplan[trackers]"`; scripts/setup.sh installs them)."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest
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
STEPS = 3


@pytest.fixture(scope="module")
def plan(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("trackers")
    model = make_model(folder / "micro", size="micro", seed=0)
    path = folder / "plan.json"
    hand_plan(model=get_model(str(model)), layout=Layout(),
              workload=Workload(batch=8, seq=48, param_dtype="fp32",
                                compute_dtype="fp32")).save(path)
    return path, model


def _run(plan: tuple[Path, Path], out: Path, tracker: str) -> None:
    path, model = plan
    done = CliRunner().invoke(app, [
        "run", str(path), "--model-path", str(model), "--data", str(DATA / "train.jsonl"),
        "--task", "classification", "--template", "{sentence} It was", "--label-words",
        "terrible,great", "--eval-data", str(DATA / "test.jsonl"), "--eval-samples", "8",
        "--steps", str(STEPS), "--lr", "1e-3", "--threads", "1", "--report-to", tracker,
        "--out", str(out), "-q"])
    assert done.exit_code == 0, done.output


def _metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def wandb_records(path: Path):
    """The records of a .wandb file (a log of 32 KiB blocks of checksummed chunks after a
    7-byte header), each a wandb Record protobuf."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, block, pending = path.read_bytes(), 7, 32768, b""
    assert data[:4] == b":W&B", data[:8]
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:
            pos += left
            continue
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):   # a whole record, or its last chunk
            record = pb.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def _key(item) -> str:
    return item.key or "/".join(item.nested_key)


def test_report_to_wandb_writes_an_offline_run_wandb_reads(plan, tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="--report-to wandb needs wandb: pip install \"zoplan[trackers]\"")
    monkeypatch.delenv("WANDB_MODE", raising=False)   # offline: the default
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "config"))
    out = tmp_path / "run"
    _run(plan, out, "wandb")
    files = list((out / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1, list((out / "wandb").rglob("*"))
    history, config = {}, {}
    for record in wandb_records(files[0]):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            items = {_key(i): json.loads(i.value_json) for i in record.history.item}
            history.setdefault(items.get("_step"), {}).update(items)
        elif kind in ("run", "config"):
            updates = record.run.config.update if kind == "run" else record.config.update
            config.update({_key(i): json.loads(i.value_json) for i in updates})
    for row in _metrics(out):
        logged = history[row["step"]]
        for key, value in row.items():
            if key != "step" and isinstance(value, float):
                assert logged[key] == pytest.approx(value), (key, row, logged)
    last = history[STEPS]
    assert {"loss", "learning_rate", "eval_loss", "eval_accuracy", "step_time_s",
            "predicted_step_time_s"} <= set(last), last
    assert config["lr"] == 1e-3 and config["task"]["name"] == "classification", config
    assert config["eval_data"] == str(DATA / "test.jsonl") and config["predicted_step_time_s"] > 0


def test_report_to_mlflow_writes_a_file_store_mlflow_reads(plan, tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason="--report-to mlflow needs mlflow-skinny: pip install \"zoplan[trackers]\"")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)   # the run folder's file store
    out = tmp_path / "run"
    _run(plan, out, "mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(out / "mlruns").resolve().as_uri())
    experiment = client.get_experiment_by_name("zoexec")
    (run,) = client.search_runs([experiment.experiment_id])
    for row in _metrics(out):
        for key, value in row.items():
            if key == "step" or not isinstance(value, float):
                continue
            logged = {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}
            assert logged[row["step"]] == pytest.approx(value), (key, row)
    assert {"loss", "learning_rate", "eval_loss", "eval_accuracy",
            "predicted_step_time_s"} <= set(run.data.metrics)
    params = run.data.params
    assert float(params["lr"]) == 1e-3 and json.loads(params["task"])["name"] == "classification"
    assert run.info.status == "FINISHED"
