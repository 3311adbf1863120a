"""The cluster templates run (issue 40), and several nodes for real on one host:
examples/slurm/zoexec.sbatch, executed with stand-ins for Slurm's `srun` (one task per
node, here two processes) and `scontrol` (the first node: 127.0.0.1), starts
examples/slurm/node.sh's torchrun line on two CPU "nodes" of two ranks each that meet
through the c10d rendezvous (as on two machines: each node builds its own block store
and its own node-local groups, the ranks meet over TCP on the loopback). The run, from
a config file, computes the losses and weights of the one-rank run: the plan keeps two
of the four blocks resident on each node's slice group and applies the update on the
slice, so every new path of the executor crosses the node boundary too. The data is
packed text (zoexec.data.packed): each node tokenises it once, its two ranks sharing the
chunks in the folder of their torchrun agent (spawn.node_folder), which the last rank
out removes. The Kubernetes PyTorchJob manifest is well-formed and runs the same
torchrun line.

The commands (README: "Several nodes"), with N = 0 on the first node and 1 on the
second, HOST:PORT the first node's address and a free port:
    torchrun --nnodes 2 --nproc-per-node 2 --node-rank N --master-addr HOST \\
        --master-port PORT -m zoexec.cli run plan.json --out run --steps 3 ...
or the c10d rendezvous, the same command on both nodes (node.sh's line): `--rdzv-backend
c10d --rdzv-endpoint HOST:PORT` in place of the last three options. The test serves the
rendezvous at a store on a port the OS chose (tests/fixtures/ports.py), so that no other
process can take the port between choosing and using it. (test_multinode.py: two nodes
whose stores diverge.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from zoexec.config import RunConfig
from zoexec.launch.spawn import run_in_process
from zoplan.handplan import hand_plan
from zoplan.layout import Layout
from zoplan.workload import Workload

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from ports import rendezvous_store  # noqa: E402
from tiny_model import DEFAULT_WORDS, make_model_dir  # noqa: E402

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
MODEL, SEED, STEPS, LR = "tiny-opt", 3, 2, 1e-3
WORKLOAD = Workload(batch=4, seq=16, param_dtype="fp32", compute_dtype="fp32")
LAYOUT = Layout(pertp=2, ddp=2, nodes=2, slices=2, slice_update=True)
RESIDENT = (1, 2)
LOSS_RTOL, G_ATOL, W_ATOL = 1e-5, 5e-3, 5e-5   # DDP: test_zoexec_layouts' tolerances
# put first on the nodes' PYTHONPATH: every call of the tokenizer on packed text, logged
# with the process's parent (a rank's: its torchrun agent, one per node)
COUNTING = """import json, os
from zoexec.data import packed
encode = packed.Packer.encode
def counted(self, text, **kwargs):
    with open(os.environ["ZOTEST_ENCODED"], "a") as log:
        log.write(json.dumps([os.getppid(), text]) + "\\n")
    return encode(self, text, **kwargs)
packed.Packer.encode = counted
"""


def _losses(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "losses.jsonl").read_text().splitlines()]


def _one_rank(tmp: Path, model: Path, data: Path) -> tuple[list, dict]:
    plan = hand_plan(model=MODEL, layout=Layout(), workload=WORKLOAD)
    out = tmp / "one"
    run_in_process(RunConfig.make(plan=plan.data, plan_path="one.json", steps=STEPS, seed=SEED,
                                  lr=LR, threads=1, quiet=True, out=str(out), model_path=str(model),
                                  data=str(data)))   # the task: text, the default
    return _losses(out), load_file(str(out / "final" / "model.safetensors"))


def test_the_sbatch_script_runs_two_cpu_nodes_that_give_the_one_rank_run(tmp_path):
    plan = tmp_path / "plan.json"
    hand_plan(model=MODEL, layout=LAYOUT, workload=WORKLOAD, resident=RESIDENT).save(plan)
    model = make_model_dir(tmp_path / "model", MODEL, seed=SEED)
    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps({"text": " ".join(DEFAULT_WORDS[(i * 3 + k) % 20]
                                                          for k in range(4 + i % 9))}) + "\n"
                            for i in range(40)))
    (tmp_path / "run.yaml").write_text(
        f"steps: {STEPS}\nseed: {SEED}\nlr: {LR:.1e}\nthreads: 1\nquiet: true\n"
        f"model_path: {model}\ndata: {data}\ntask: text\n")
    hook, temp, encoded = tmp_path / "hook", tmp_path / "tmp", tmp_path / "encoded"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(COUNTING)
    temp.mkdir()
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "srun").write_text(SRUN)
    (fake / "scontrol").write_text("#!/bin/bash\necho 127.0.0.1\n")
    for tool in ("srun", "scontrol"):
        (fake / tool).chmod(0o755)
    # the nodes' stores in a folder of their own on the tmpfs (ZOEXEC_SHM_DIR): what they
    # leave there is theirs, whatever other tests do in /dev/shm meanwhile
    shm = Path("/dev/shm") / f"zotest-{uuid.uuid4().hex[:10]}"
    shm.mkdir()
    try:
        with rendezvous_store() as endpoint:
            env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "OMP_NUM_THREADS": "1",
                   "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_JOB_NUM_NODES": "2",
                   "SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "zoexec",
                   "SLURM_SUBMIT_DIR": str(ROOT), "PLAN": str(plan), "OUT": str(tmp_path / "run"),
                   "GPUS_PER_NODE": "2", "RDZV_PORT": endpoint.rsplit(":", 1)[1],
                   "VENV": str(BIN.parent), "CONFIG": str(tmp_path / "run.yaml"),
                   "ZOEXEC_SHM_DIR": str(shm),
                   # the nodes' temporary folder (theirs alone) and the tokenizer's log
                   "TMPDIR": str(temp), "ZOTEST_ENCODED": str(encoded),
                   "PYTHONPATH": os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")])),
                   # the test's store serves the rendezvous (tests/fixtures/ports.py)
                   "TORCHRUN_OPTIONS": "--rdzv-conf is_host=false --local-addr 127.0.0.1"}
            done = subprocess.run(["bash", str(ROOT / "examples" / "slurm" / "zoexec.sbatch")],
                                  env=env, cwd=tmp_path, capture_output=True, text=True,
                                  timeout=300)
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
        # both nodes removed their stores
        assert sorted(p.name for p in shm.iterdir()) == []
    finally:
        for left in shm.iterdir():
            left.unlink()
        shm.rmdir()
    # each node tokenised each document once (its agent's two ranks, the start-up check
    # of each included, shared the chunks), and the ranks' folders went with them
    by_agent: dict[int, list[str]] = {}
    for line in encoded.read_text().splitlines():
        agent, text = json.loads(line)
        by_agent.setdefault(agent, []).append(text)
    documents = sorted(json.loads(line)["text"] for line in data.read_text().splitlines())
    assert len(by_agent) == 2 and all(sorted(texts) == documents for texts in by_agent.values())
    assert sorted(p.name for p in temp.glob("zoexec-rdzv-*")) == []
    out = tmp_path / "run"
    identity = json.loads((out / "run.json").read_text())
    assert identity["lr"] == LR and identity["steps"] == STEPS   # the config file's
    assert (out / "final" / "state.json").is_file()
    losses, weights = _one_rank(tmp_path, model, data)
    got = _losses(out)
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))
    for a, b in zip(losses, got, strict=True):
        assert (a["step"], a["seed"]) == (b["step"], b["seed"])
        assert b["loss_plus"] == pytest.approx(a["loss_plus"], rel=LOSS_RTOL), (a, b)
        assert b["loss_minus"] == pytest.approx(a["loss_minus"], rel=LOSS_RTOL), (a, b)
        assert b["g"] == pytest.approx(a["g"], abs=G_ATOL), (a, b)
    final = load_file(str(out / "final" / "model.safetensors"))
    assert final.keys() == weights.keys()
    for key, tensor in weights.items():
        torch.testing.assert_close(final[key], tensor, rtol=0, atol=W_ATOL)


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
