"""Several nodes for real, on one host: two `torchrun` invocations (one per node, as on
two machines: each node builds its own block store, the ranks meet over TCP on the
loopback through the c10d rendezvous) whose stores come to differ stop with one line
naming the node. The rendezvous is served at a store on a port the OS chose
(tests/fixtures/ports.py), so that no other process can take the port between choosing
and using it.

That a 2-node x 2-rank job (PertP 2 x DDP 2, two blocks resident on each node's slice
group, the update on the slice) gives the one-rank run's losses and weights is
test_launch_templates.py's: it starts those two nodes through examples/slurm's
templates (node.sh's torchrun line with the c10d rendezvous), one launch for both
claims.
"""

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
from ports import rendezvous_store, torchrun_rendezvous  # noqa: E402

BIN = Path(sys.executable).parent
MODEL, SEED, LR = "tiny-opt", 3, 1e-3
WORKLOAD = Workload(batch=4, seq=16, param_dtype="fp32", compute_dtype="fp32")
ARGS = ["--seed", str(SEED), "--lr", str(LR), "--threads", "1", "-q"]


def _losses(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "losses.jsonl").read_text().splitlines()]


def _outputs(nodes: list[subprocess.Popen], *, timeout: float) -> list[str]:
    """Each node's output once it ends; a node still running after that is killed
    with its ranks."""
    try:
        return [proc.communicate(timeout=timeout)[0] for proc in nodes]
    finally:
        for proc in nodes:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)


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
             str(tmp_path / "run"), "--steps", "8", "--check-nodes-every", "1", *ARGS],
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
