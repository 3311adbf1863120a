"""Experiment trackers besides metrics.jsonl (`--report-to wandb|mlflow`; TensorBoard:
zoexec.run.report): rank 0's Reporter hands each metrics.jsonl row to the tracker,
which logs it under the same names ("loss", "learning_rate", "eval_loss", ...) at its
"step", with the plan's predicted step time beside the measured one
("predicted_step_time_s" next to "step_time_s"), and records the run's settings (run.json's
settings and run options, the plan, the layout) as the run's config or params.

Both run without a network unless the user says otherwise:
- wandb: offline (WANDB_MODE=offline unless set), the run under OUT/wandb/
  (`wandb sync OUT/wandb/offline-run-*` uploads it later); its id is the run's digest
  (run.json's run_digest), so a resumed run continues the same wandb run;
- MLflow: the tracking URI $MLFLOW_TRACKING_URI when set, else a file store in
  OUT/mlruns (MLflow's file backend, allowed for it: MLFLOW_ALLOW_FILE_STORE), the
  experiment "zoexec", one MLflow run per zoexec run (a resume finds its run by the tag
  zoexec_run_digest and continues it).
Each package is optional (`pip install "zoplan[trackers]"`); check_tracker is the one
line a run without it gets before anything starts."""

from __future__ import annotations

import importlib.util
import json
import os
import time
from pathlib import Path
from typing import Any

from zoplan.errors import ZoError

TRACKERS = {"wandb": "wandb", "mlflow": "mlflow"}   # --report-to NAME: the package it needs
WANDB_DIR = "wandb"
MLFLOW_DIR = "mlruns"
EXPERIMENT = "zoexec"
DIGEST_TAG = "zoexec_run_digest"


def check_tracker(name: str, out_dir: Any) -> None:
    """--report-to wandb|mlflow: the run folder (its files go there) and the package."""
    if name not in TRACKERS:
        return
    if out_dir is None:
        raise ZoError(f"--report-to {name} writes under the run folder: give --out DIR")
    if importlib.util.find_spec(TRACKERS[name]) is None:
        package = "mlflow-skinny" if name == "mlflow" else name
        raise ZoError(f"--report-to {name} needs the {package} package, which is not installed: "
                      f"pip install \"zoplan[trackers]\" (or use --report-to none)")


def run_config(cfg: Any) -> dict[str, Any]:
    """What a tracker records of the run: its settings and run options as run.json
    does, the steps, the plan and its layout, the plan's predicted step."""
    return {**cfg.settings(), **cfg.run_options(), "steps": cfg.optim.steps,
            "plan": str(Path(cfg.plan_path).resolve()), "layout": cfg.layout.label(),
            "tuning": cfg.workload.tuning, "estimator": cfg.workload.estimator_spec.to_dict(),
            "predicted_step_time_s": predicted_step_s(cfg)}


def predicted_step_s(cfg: Any) -> float:
    return float(cfg.plan["predicted"]["step_time_s"])


def run_digest(out: Path) -> str | None:
    """run.json's run_digest (rank 0 wrote run.json before the first step)."""
    try:
        digest = json.loads((out / "run.json").read_text()).get("run_digest")
    except (OSError, ValueError, AttributeError):
        return None
    return digest if isinstance(digest, str) else None


def open_tracker(name: str, cfg: Any, out: Path) -> WandbTracker | MlflowTracker:
    if name == "wandb":
        return WandbTracker(cfg, out)
    return MlflowTracker(cfg, out)


def _row(data: dict[str, Any], cfg: Any) -> dict[str, float]:
    """The numbers of a metrics row (not its step, no flags); a step's with the plan's
    predicted step beside the measured one."""
    row = {k: float(v) for k, v in data.items()
           if k != "step" and not isinstance(v, bool) and isinstance(v, int | float)}
    if "step_time_s" in row:
        row["predicted_step_time_s"] = predicted_step_s(cfg)
    return row


class WandbTracker:
    """A wandb run, offline unless WANDB_MODE says otherwise, under OUT/wandb/."""

    def __init__(self, cfg: Any, out: Path) -> None:
        import wandb

        self.cfg = cfg
        folder = out / WANDB_DIR
        folder.mkdir(parents=True, exist_ok=True)
        digest = run_digest(out)
        self.run = wandb.init(mode=os.environ.get("WANDB_MODE", "offline"),  # type: ignore[arg-type]
                              dir=str(out), project=os.environ.get("WANDB_PROJECT", EXPERIMENT),
                              name=out.resolve().name, config=run_config(cfg),
                              id=digest[:32] if digest else None, resume="allow",
                              settings=wandb.Settings(silent=True, console="off"))

    def log(self, data: dict[str, Any]) -> None:
        row = _row(data, self.cfg)
        if row:
            self.run.log(row, step=int(data["step"]))

    def close(self) -> None:
        self.run.finish()


class MlflowTracker:
    """An MLflow run in the experiment "zoexec": $MLFLOW_TRACKING_URI, else OUT/mlruns."""

    def __init__(self, cfg: Any, out: Path) -> None:
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            uri = (out / MLFLOW_DIR).resolve().as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")   # our own file store
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.cfg, self.client = cfg, MlflowClient(tracking_uri=uri)
        experiment = self.client.get_experiment_by_name(EXPERIMENT)
        eid = experiment.experiment_id if experiment else self.client.create_experiment(EXPERIMENT)
        digest = run_digest(out) or ""
        found = self.client.search_runs([eid], filter_string=f"tags.`{DIGEST_TAG}` = '{digest}'",
                                        max_results=1) if digest and cfg.resumed else []
        if found:
            self.run_id = found[0].info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
            return
        run = self.client.create_run(eid, run_name=out.resolve().name, tags={DIGEST_TAG: digest})
        self.run_id = run.info.run_id
        params = [Param(k, v if isinstance(v, str) else json.dumps(v))
                  for k, v in run_config(cfg).items()]
        self.client.log_batch(self.run_id, params=params)

    def log(self, data: dict[str, Any]) -> None:
        from mlflow.entities import Metric

        now, step = int(time.time() * 1000), int(data["step"])
        metrics = [Metric(k, v, now, step) for k, v in _row(data, self.cfg).items()]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)
