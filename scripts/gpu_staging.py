"""The `staging` stage of scripts/gpu_check.py (run by scripts/gpu_stages.py): what a
store that cannot be page-locked costs. H2D, D2H and both at once (two streams, one
host thread, as a run issues them) for 256 MiB: page-locked and pageable memory copied
directly (gpu_stages.copies), then a pageable store mapping (a tmpfs file, as the
node's block store is) through zoexec's staging ring (zoexec.runtime.pinning.Staging:
8 pinned slots of 64 MiB) and the same mapping page-locked (cudaHostRegister) and
copied directly. GB/s from the host's clock around each copy and its wait. On the CPU
(the dry run) the ring's bytes are checked through unpinned slots, nothing timed."""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

SIZE = 256 << 20


def staging(args) -> dict:
    import torch

    from zoexec.runtime.pinning import Staging, pin_tensor, unpin_host_memory
    from zoexec.store.blocks import create_store

    cuda = args.device_kind == "cuda"
    size = SIZE if cuda else 1 << 20
    folder = Path(os.environ.get("ZOEXEC_SHM_DIR", "/dev/shm"))
    path = folder / f"zoexec-gpucheck-staging-{os.getpid()}"
    try:
        store = create_store(path, num_blocks=1, block_numel=size, stride=size, dtype=torch.uint8)
    finally:
        path.unlink(missing_ok=True)
    store.flat.copy_(torch.arange(size, dtype=torch.int64).remainder_(251).to(torch.uint8))
    if not cuda:
        return ring_bytes_on_cpu(store.flat, Staging)
    from gpu_stages import copies

    out = copies(size)
    ring = Staging(dtype=torch.uint8)
    dev = torch.empty(size, dtype=torch.uint8, device="cuda")
    out.update(timed_copies("ring", dev, store.flat, h2d=ring.h2d,
                            d2h=lambda dst, src: (ring.d2h(dst, src), ring.drain())))
    same = torch.equal(dev.cpu(), store.flat)
    if pin_tensor(store.flat, who="gpu_check staging"):
        direct = lambda dst, src: dst.copy_(src, non_blocking=True)
        out.update(timed_copies("store_pinned", dev, store.flat, h2d=direct, d2h=direct))
        unpin_host_memory(store.flat)
    else:
        out["store_pinned"] = "cudaHostRegister failed"
    return {**out, "ok": bool(same), "ring_bytes_equal": bool(same), "bytes": size,
            **({} if same else {"error": "the ring changed bytes"})}


def timed_copies(name: str, dev, host, *, h2d, d2h, repeats: int = 3) -> dict:
    """GB/s of h2d(dev, host) on one stream, d2h(host, dev) on another, and both
    queued at once (both ways' bytes over the common time): medians of `repeats`."""
    import torch

    up, down = torch.cuda.Stream(), torch.cuda.Stream()

    def run(*work) -> float:
        torch.cuda.synchronize()
        began = time.perf_counter()
        for stream, fn, dst, src in work:
            with torch.cuda.stream(stream):
                fn(dst, src)
        torch.cuda.synchronize()
        return time.perf_counter() - began
    size = host.numel() * host.element_size()
    out = {}
    for label, work in (("h2d", [(up, h2d, dev, host)]), ("d2h", [(down, d2h, host, dev)]),
                        ("both", [(up, h2d, dev, host), (down, d2h, host, dev)])):
        seconds = statistics.median(run(*work) for _ in range(repeats))
        out[f"{name}_{label}_gbps"] = len(work) * size / seconds / 1e9
    return out


def ring_bytes_on_cpu(flat, staging_class) -> dict:
    """The ring's copies on the CPU (unpinned slots, no events): the bytes come back."""
    import torch

    ring = staging_class(dtype=torch.uint8, pin=False, event=lambda: None, slot_bytes=1 << 18)
    dev = torch.empty_like(flat)
    ring.h2d(dev, flat)
    back = torch.empty_like(flat)
    ring.d2h(back, dev)
    ring.drain()
    same = bool(torch.equal(back, flat) and torch.equal(dev, flat))
    return {"ok": same, "ring_bytes_equal": same, "bytes": flat.numel(),
            "rates": "need a CUDA GPU", **({} if same else {"error": "the ring changed bytes"})}
