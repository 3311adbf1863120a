"""The all-gather composed from broadcasts (zoexec.runtime.groups.gather_by_broadcasts,
what ranks sharing a GPU over gloo run for CUDA tensors) equals gloo's own all-gather
bit for bit: two gloo ranks on the CPU, pieces of several dtypes and lengths, a piece
that is already its own slice of the output (as a block buffer's is), async and not."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import torch
import torch.distributed as dist

from zoexec.config import RuntimeOptions
from zoexec.runtime import groups as zgroups
from zoplan.layout import Layout

CASES = ((torch.float32, 7), (torch.bfloat16, 1000), (torch.float16, 33))


def _rank(rank: int, init: str, out) -> None:
    result: tuple = (rank, "error", "did not finish")
    try:
        place = zgroups.RankPlace(rank=rank, local_rank=rank, world_size=2, local_world_size=2,
                                  init_file=init)
        env = zgroups.init_distributed(place=place, layout=Layout(pertp=2), device_kind="cpu",
                                       runtime=RuntimeOptions(timeout_s=60.0))
        same = []
        for index, (dtype, n) in enumerate(CASES):
            gen = torch.Generator().manual_seed(100 * index + rank)
            mine = torch.randn(n, generator=gen).to(dtype)
            want = torch.empty(2 * n, dtype=dtype)
            zgroups.all_gather_call()(want, mine, group=env.world)
            got = torch.full((2 * n,), float("nan"), dtype=dtype)
            zgroups.gather_by_broadcasts(got, mine, group=env.world).wait()
            inplace = torch.full((2 * n,), float("nan"), dtype=dtype)
            inplace[rank * n:(rank + 1) * n] = mine
            zgroups.gather_by_broadcasts(inplace, inplace[rank * n:(rank + 1) * n],
                                         group=None, async_op=False)
            bits = [t.view(torch.uint8) for t in (got, inplace, want)]
            same.append(torch.equal(bits[0], bits[2]) and torch.equal(bits[1], bits[2]))
        result = (rank, "ok", same)
        dist.destroy_process_group()
    except Exception as exc:  # noqa: BLE001 - reported to the test
        result = (rank, "error", f"{type(exc).__name__}: {exc}")
    finally:
        out.put(result)
        out.close()
        out.join_thread()      # the result is in the pipe before the process ends
        os._exit(0)


def test_broadcasts_gather_what_gloo_gathers(tmp_path: Path):
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, str(tmp_path / "init"), out)) for r in (0, 1)]
    for p in procs:
        p.start()
    results = sorted(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(30)
    assert results == [(0, "ok", [True] * 3), (1, "ok", [True] * 3)], results
