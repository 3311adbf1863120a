"""Several nodes for real, on one host: a 2-node x 2-rank CPU job started by two
`torchrun` invocations (one per node, as on two machines: each node builds its own
block store and its own node-local groups, the ranks meet over TCP on the loopback)
computes the losses and weights of the one-rank run. The plan keeps two of the four
blocks resident on each node's slice group and applies the update on the slice, so
every new path of the executor crosses the node boundary too.

The commands (README: "Several nodes"), with N = 0 on the first node and 1 on the
second, HOST:PORT the first node's address and a free port:
    torchrun --nnodes 2 --nproc-per-node 2 --node-rank N --master-addr HOST \\
        --master-port PORT -m zoexec.cli run plan.json --out run --steps 3 ...
or the c10d rendezvous, the same command on both nodes: `--rdzv-backend c10d
--rdzv-endpoint HOST:PORT` in place of the last three options. The tests use the
second, at a store they serve on a port the OS chose (tests/fixtures/ports.py), so
that no other process can take the port between choosing and using it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from zoexec.config import RunConfig
from zoexec.launch.spawn import run_in_process
from zoexec.store.blocks import SHM_DIR
from zoplan.handplan import hand_plan
from zoplan.layout import Layout
from zoplan.workload import Workload

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from ports import rendezvous_store, torchrun_rendezvous  # noqa: E402

BIN = Path(sys.executable).parent
MODEL, SEED, STEPS, LR = "tiny-opt", 3, 3, 1e-3
WORKLOAD = Workload(batch=4, seq=16, param_dtype="fp32", compute_dtype="fp32")
LAYOUT = Layout(pertp=2, ddp=2, nodes=2, slices=2, slice_update=True)
RESIDENT = (1, 2)
LOSS_RTOL, G_ATOL, W_ATOL = 1e-5, 5e-3, 5e-5   # DDP: test_zoexec_layouts' tolerances
ARGS = ["--steps", str(STEPS), "--seed", str(SEED), "--lr", str(LR), "--threads", "1", "-q"]


def _losses(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "losses.jsonl").read_text().splitlines()]


def _one_rank(tmp: Path) -> tuple[list, dict]:
    plan = hand_plan(model=MODEL, layout=Layout(), workload=WORKLOAD)
    out = tmp / "one"
    run_in_process(RunConfig.make(plan=plan.data, plan_path="one.json", steps=STEPS, seed=SEED,
                             lr=LR, threads=1, quiet=True, out=str(out)))
    return _losses(out), load_file(str(out / "final" / "model.safetensors"))


def _node(plan: Path, out: Path, endpoint: str) -> subprocess.Popen:
    """One node's torchrun, meeting the other at `endpoint` (ports.rendezvous_store)."""
    command = [str(BIN / "torchrun"), "--nnodes", "2", "--nproc-per-node", "2",
               *torchrun_rendezvous(endpoint), "-m", "zoexec.cli", "run", str(plan),
               "--out", str(out), *ARGS]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env, start_new_session=True)


def _outputs(nodes: list[subprocess.Popen], *, timeout: float) -> list[str]:
    """Each node's output once it ends; a node still running after that is killed
    with its ranks."""
    try:
        return [proc.communicate(timeout=timeout)[0] for proc in nodes]
    finally:
        for proc in nodes:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)


def test_two_torchrun_nodes_give_the_one_rank_losses_and_weights(tmp_path):
    plan = tmp_path / "plan.json"
    hand_plan(model=MODEL, layout=LAYOUT, workload=WORKLOAD, resident=RESIDENT).save(plan)
    out = tmp_path / "run"
    before = {p.name for p in Path(SHM_DIR).glob("zoexec-*")}
    with rendezvous_store() as endpoint:
        nodes = [_node(plan, out, endpoint) for _ in (0, 1)]
        outputs = _outputs(nodes, timeout=120)
    for node, (proc, text) in enumerate(zip(nodes, outputs, strict=True)):
        assert proc.returncode == 0, f"node {node}: {text[-3000:]}"
    losses, weights = _one_rank(tmp_path)
    got = _losses(out)
    for a, b in zip(losses, got, strict=True):
        assert (a["step"], a["seed"]) == (b["step"], b["seed"])
        assert b["loss_plus"] == pytest.approx(a["loss_plus"], rel=LOSS_RTOL), (a, b)
        assert b["loss_minus"] == pytest.approx(a["loss_minus"], rel=LOSS_RTOL), (a, b)
        assert b["g"] == pytest.approx(a["g"], abs=G_ATOL), (a, b)
    final = load_file(str(out / "final" / "model.safetensors"))
    assert final.keys() == weights.keys()
    for key, tensor in weights.items():
        torch.testing.assert_close(final[key], tensor, rtol=0, atol=W_ATOL)
    # both nodes removed their stores (files named after their owner, each node's torchrun
    # agent: other tests' files may come and go meanwhile)
    left = {p.name for p in Path(SHM_DIR).glob("zoexec-*")} - before
    assert [name for name in left if any(f".{proc.pid}." in name for proc in nodes)] == []


def test_two_nodes_whose_stores_diverge_stop_with_one_line_naming_the_node(tmp_path):
    """Two torchrun nodes of one rank each; node 1's store gets one bit of block 0
    flipped after step 2 (a node whose memory changed the weights): the nodes' check
    after that step (--check-nodes-every 1) stops both with one line naming node 1."""
    plan = tmp_path / "plan.json"
    hand_plan(model=MODEL, layout=Layout(ddp=2, nodes=2), workload=WORKLOAD).save(plan)
    script = Path(__file__).with_name("diverging_node.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with rendezvous_store() as endpoint:
        nodes = [subprocess.Popen(
            [str(BIN / "torchrun"), "--nnodes", "2", "--nproc-per-node", "1",
             *torchrun_rendezvous(endpoint), str(script), "1", "2", str(plan), "--out",
             str(tmp_path / "run"), "--steps", "8", "--check-nodes-every", "1", *ARGS[2:]],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
            start_new_session=True) for _ in (0, 1)]
        outputs = _outputs(nodes, timeout=180)
    for node, (proc, text) in enumerate(zip(nodes, outputs, strict=True)):
        errors = [line for line in text.splitlines() if line.startswith("error:")]
        assert proc.returncode != 0 and len(errors) == 1, f"node {node}: {text[-3000:]}"
        assert ("the nodes' copies of the model after step 3 differ from node 0's: node 1 "
                "(block 0)") in errors[0], errors[0]
    logged = _losses(tmp_path / "run")
    assert [r["step"] for r in logged] == [1, 2, 3]   # stopped at the check after step 3
    assert not (tmp_path / "run" / "final").exists()
