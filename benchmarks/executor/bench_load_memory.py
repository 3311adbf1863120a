"""Memory of building the node's model: what the builder (local rank 0) holds beyond
the block store while it fills the store, from a checkpoint and by random init.

Saves an HF checkpoint of a model with random weights (default opt-125m, fp32, in
shards of `--shard-size` with save_pretrained), then for each source starts a fresh
process that imports what a rank imports, loads the model into a block store exactly
as a one-rank node does (zoexec.store.node.load_node_model), and reports:
- peak RSS beyond the bare process (imports and a one-layer toy of the family made,
  as transformers imports a family's model code on first use; VmHWM after that, reset through
  /proc/self/clear_refs, minus the RSS at that moment), and that less the store's
  pages (the store lives in shared memory that the process maps and fills, so its
  pages count in the RSS);
- the store's bytes, one block's bytes (param dtype), the resident parts' bytes (the
  modules in the compute dtype + resident_master in the param dtype);
- the peak of RssAnon + RssFile (the RSS without shared memory) beyond the bare
  process, sampled every 2 ms: it catches a peak before the store's pages exist;
- ratio = peak / (one block + resident), the peak being the larger of the two above;
- the fill rate (the store's bytes over the load's wall time).

    .venv/bin/python benchmarks/executor/bench_load_memory.py --model opt-125m --shard-size 100MB

A process that built the whole model first would show the whole model (about the
store's bytes again) beyond the store; streaming block by block shows about one block
plus the resident parts. Nothing is downloaded; the checkpoint goes to a temporary
folder (or --keep DIR). The process does not apply a CPU rank's allocator setting
(hostenv.keep_freed_memory, which retains up to 128 MiB of freed heap), as a GPU rank.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

MIB = 2**20


def _status_kib(field: str) -> int:
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"^{field}:\s+(\d+) kB", text, re.MULTILINE).group(1))


class _PrivatePeak(threading.Thread):
    """Samples RssAnon + RssFile (the RSS without shared memory) every 2 ms."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak_kib = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.peak_kib = max(self.peak_kib, _status_kib("RssAnon") + _status_kib("RssFile"))
            time.sleep(0.002)


def _warm_up(model: str) -> None:
    """Make a one-layer toy of the model's family once: transformers imports a family's
    model code on first use (~80 MiB here), which belongs to the bare process."""
    from zoexec.store.loading import build_parts
    from zoplan.models import get_model

    config = dict(get_model(model).hf_config, num_hidden_layers=1, hidden_size=64,
                  vocab_size=128, num_attention_heads=2, ffn_dim=128, intermediate_size=128,
                  word_embed_proj_dim=64, max_position_embeddings=64)
    config.pop("layer_types", None)
    build_parts(config)


def child(args) -> None:
    """One load, as a one-rank node's builder; prints a JSON object on stdout."""
    import torch

    import zoexec.train.engine  # noqa: F401 - what a rank has imported before it builds anything
    from zoexec.config import RunConfig
    from zoexec.runtime import groups as zgroups
    from zoexec.runtime.hostmem import mapping_pss_bytes
    from zoexec.store.node import load_node_model
    from zoplan.handplan import hand_plan
    from zoplan.layout import Layout
    from zoplan.workload import Workload

    workload = Workload(batch=1, seq=16, param_dtype=args.param_dtype,
                        compute_dtype=args.compute_dtype)
    plan = hand_plan(model=args.model, layout=Layout(), workload=workload)
    cfg = RunConfig.make(plan=plan.data, load_from=args.init, seed=0, quiet=args.quiet)
    _warm_up(args.model)
    env = zgroups.DistEnv(place=zgroups.RankPlace(rank=0, local_rank=0, world_size=1,
                                                  local_world_size=1),
                          layout=Layout(), device=torch.device("cpu"), backend="gloo")
    Path("/proc/self/clear_refs").write_text("5")         # VmHWM := VmRSS from here
    bare_kib = _status_kib("VmRSS")
    private_bare_kib = _status_kib("RssAnon") + _status_kib("RssFile")
    sampler = _PrivatePeak()
    sampler.start()
    start = time.monotonic()
    parts, store = load_node_model(cfg, env, f"bench{uuid.uuid4().hex[:8]}")
    wall_s = time.monotonic() - start
    sampler.stop.set()
    sampler.join()
    peak_kib = _status_kib("VmHWM")
    _, store_rss = mapping_pss_bytes(store.path)
    p_item = torch.empty(0, dtype=parts.param_dtype).element_size()
    c_item = torch.empty(0, dtype=parts.dtype).element_size()
    beyond = (peak_kib - bare_kib) * 1024
    out = {"init": "checkpoint" if args.init != "random" else "random",
           "bare_rss": bare_kib * 1024, "peak_beyond_bare": beyond,
           "store_rss": store_rss, "beyond_store": beyond - store_rss,
           "private_peak_beyond_bare": (sampler.peak_kib - private_bare_kib) * 1024,
           "store_bytes": store.nbytes, "block_bytes": parts.block_numel * p_item,
           "resident_bytes": parts.resident_numel * (c_item + p_item),
           "num_blocks": store.num_blocks, "wall_s": wall_s}
    out["peak"] = max(out["beyond_store"], out["private_peak_beyond_bare"])
    out["ratio"] = out["peak"] / (out["block_bytes"] + out["resident_bytes"])
    print(json.dumps(out))


def save_checkpoint(model: str, folder: Path, shard_size: str, dtype: str) -> list[str]:
    from zoexec.model.families import build_hf_model

    hf = build_hf_model(model, seed=0, dtype=dtype)
    hf.save_pretrained(folder, max_shard_size=shard_size)
    return sorted(p.name for p in folder.glob("*.safetensors"))


def run_child(args, init: str) -> dict:
    cmd = [sys.executable, __file__, "--child", "--model", args.model, "--init", init,
           "--param-dtype", args.param_dtype, "--compute-dtype", args.compute_dtype]
    if args.quiet:
        cmd.append("--quiet")
    done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(row: dict) -> None:
    print(f"{row['init']:>10}: peak RSS beyond the bare process {row['peak_beyond_bare'] / MIB:8.1f} MiB"
          f" (store pages {row['store_rss'] / MIB:.1f} MiB) -> beyond the store "
          f"{row['beyond_store'] / MIB:7.1f} MiB; sampled RssAnon+RssFile peak "
          f"{row['private_peak_beyond_bare'] / MIB:.1f} MiB")
    print(f"{'':>12}store {row['store_bytes'] / MIB:.1f} MiB ({row['num_blocks']} blocks), one block "
          f"{row['block_bytes'] / MIB:.1f} MiB, resident {row['resident_bytes'] / MIB:.1f} MiB -> "
          f"ratio {row['peak'] / MIB:.1f} MiB / (block + resident) = {row['ratio']:.2f}; "
          f"{row['store_bytes'] / row['wall_s'] / 2**30:.2f} GiB/s ({row['wall_s']:.1f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="opt-125m")
    parser.add_argument("--param-dtype", default="fp32")
    parser.add_argument("--compute-dtype", default="fp32")
    parser.add_argument("--checkpoint-dtype", default="fp32", help="precision the checkpoint is saved in")
    parser.add_argument("--shard-size", default="100MB")
    parser.add_argument("--keep", type=Path, help="save the checkpoint here (kept)")
    parser.add_argument("--quiet", action="store_true", help="no loading progress on stderr")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--init", default="random", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or Path(tmp) / "ckpt"
        shards = save_checkpoint(args.model, folder, args.shard_size, args.checkpoint_dtype)
        print(f"{args.model}: checkpoint ({args.checkpoint_dtype}) in {len(shards)} safetensors "
              f"file(s); store param {args.param_dtype}, compute {args.compute_dtype}")
        for init in (str(folder), "random"):
            report(run_child(args, init))


if __name__ == "__main__":
    main()
