"""The cluster templates run (issue 40): examples/slurm/zoexec.sbatch, executed with
stand-ins for Slurm's `srun` (one task per node, here two processes) and `scontrol`
(the first node: 127.0.0.1), starts examples/slurm/node.sh's torchrun line on two CPU
"nodes" that meet through the c10d rendezvous, and the run ends with final/; the
Kubernetes PyTorchJob manifest is well-formed and runs the same torchrun line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from zoplan.handplan import hand_plan
from zoplan.layout import Layout
from zoplan.workload import Workload

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from ports import rendezvous_store  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SRUN = """#!/bin/bash
# srun's stand-in: the command once per node, at once (SLURM_JOB_NUM_NODES tasks)
while [ "${1#--}" != "$1" ]; do shift; done
pids=()
for node in $(seq 0 $((SLURM_JOB_NUM_NODES - 1))); do SLURM_NODEID=$node "$@" & pids+=($!); done
rc=0
for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
exit $rc
"""


def test_the_sbatch_script_runs_two_cpu_nodes(tmp_path):
    plan = tmp_path / "plan.json"
    hand_plan(model="tiny-opt", layout=Layout(ddp=2, nodes=2),
              workload=Workload(batch=4, seq=16, param_dtype="fp32", compute_dtype="fp32")).save(plan)
    (tmp_path / "run.yaml").write_text("steps: 2\nlr: 1.0e-3\nthreads: 1\nquiet: true\n")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "srun").write_text(SRUN)
    (fake / "scontrol").write_text("#!/bin/bash\necho 127.0.0.1\n")
    for tool in ("srun", "scontrol"):
        (fake / tool).chmod(0o755)
    with rendezvous_store() as endpoint:
        env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "OMP_NUM_THREADS": "1",
               "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_JOB_NUM_NODES": "2",
               "SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "zoexec", "SLURM_SUBMIT_DIR": str(ROOT),
               "PLAN": str(plan), "OUT": str(tmp_path / "run"), "GPUS_PER_NODE": "1",
               "RDZV_PORT": endpoint.rsplit(":", 1)[1], "VENV": str(BIN.parent),
               "CONFIG": str(tmp_path / "run.yaml"),
               # the test's store serves the rendezvous (tests/fixtures/ports.py)
               "TORCHRUN_OPTIONS": "--rdzv-conf is_host=false --local-addr 127.0.0.1"}
        done = subprocess.run(["bash", str(ROOT / "examples" / "slurm" / "zoexec.sbatch")],
                              env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    logged = (tmp_path / "run" / "losses.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in logged] == [1, 2]
    assert (tmp_path / "run" / "final" / "state.json").is_file()
    identity = json.loads((tmp_path / "run" / "run.json").read_text())
    assert identity["lr"] == 1e-3 and identity["steps"] == 2


def test_the_pytorchjob_manifest_runs_the_same_torchrun_line():
    import yaml

    job = yaml.safe_load((ROOT / "examples" / "k8s" / "pytorchjob.yaml").read_text())
    assert job["kind"] == "PyTorchJob" and job["apiVersion"].startswith("kubeflow.org/")
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert set(specs) == {"Master", "Worker"} and specs["Master"]["replicas"] == 1
    for spec in specs.values():
        (container,) = spec["template"]["spec"]["containers"]
        assert container["name"] == "pytorch"   # the name the operator looks for
        line = " ".join(container["command"] + container.get("args", []))
        assert "torchrun" in line and "-m zoexec.cli run" in line and "--rdzv-backend c10d" in line
