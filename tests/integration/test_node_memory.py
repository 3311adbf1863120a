"""The node's builder holds about one block plus the resident parts beyond the store
(measured by benchmarks/executor/bench_load_memory.py, in a child process of its own:
its own memory only, so these run beside other tests, not alone as the waits of
tests/integration/test_node_loading.py do)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from zoexec.model.families import build_hf_model

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "executor" / "bench_load_memory.py"


@pytest.fixture(scope="module")
def small_checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("small-opt")
    build_hf_model("small-opt", seed=0).save_pretrained(folder, max_shard_size="20MB")
    assert len(list(folder.glob("*.safetensors"))) > 2
    return folder


@pytest.mark.parametrize("init", ["random", "checkpoint"])
def test_the_builder_holds_about_one_block_and_the_resident_parts(init, small_checkpoint):
    """small-opt: 6 blocks of 12 MiB (72 MiB in the store), resident 10 MiB (module +
    master). Measured 22-27 MiB beyond the store; holding the model's blocks once more
    (as building the HF model first did) gives about 100 MiB. Bound: 2 x (block + resident)."""
    source = str(small_checkpoint) if init == "checkpoint" else "random"
    done = subprocess.run([sys.executable, str(BENCH), "--child", "--model", "small-opt",
                           "--init", source, "--quiet"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    row = json.loads(done.stdout.strip().splitlines()[-1])
    bound = 2 * (row["block_bytes"] + row["resident_bytes"])
    assert row["store_rss"] >= 0.95 * row["store_bytes"], row
    assert row["beyond_store"] <= bound and row["private_peak_beyond_bare"] <= bound, row
