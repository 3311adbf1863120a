"""Which CUDA device a local rank uses, and which physical GPUs those are (torch-free).

CUDA numbers the GPUs a process may use 0..n-1: CUDA_VISIBLE_DEVICES selects and orders
them (a scheduler's per-task binding, SLURM --gpus-per-task=1, leaves each process one).
`nvidia-smi` ignores that variable and numbers the machine's GPUs physically, so its
topology rows must be picked through the same variable.
"""

from __future__ import annotations

import os
import re

from zoplan.errors import ZoError

ENV_VISIBLE = "CUDA_VISIBLE_DEVICES"


def visible_env() -> str | None:
    """CUDA_VISIBLE_DEVICES as this process has it (None: unset, every GPU visible)."""
    return os.environ.get(ENV_VISIBLE)


def cuda_index(local_rank: int, *, local_world_size: int, num_visible: int,
               visible_env: str | None) -> int:
    """The CUDA device index of local rank `local_rank` among `num_visible` devices:
    the rank itself when every local rank has a visible device of its own, 0 when the
    process sees exactly one (per-task binding: each rank was given its own GPU);
    otherwise a ZoError with the numbers (`visible_env`: CUDA_VISIBLE_DEVICES or None)."""
    if not 0 <= local_rank < local_world_size:
        raise ZoError(f"local rank {local_rank} is outside the node's {local_world_size} "
                      f"local ranks (LOCAL_RANK / LOCAL_WORLD_SIZE)")
    if num_visible >= local_world_size:
        return local_rank
    if num_visible == 1:
        return 0
    shown = "unset" if visible_env is None else repr(visible_env)
    raise ZoError(f"{num_visible} CUDA GPU(s) visible to this process "
                  f"({ENV_VISIBLE}={shown}) for {local_world_size} local ranks: give "
                  f"every rank its own GPU (all {local_world_size} visible, or exactly "
                  f"one per process)")


def visible_physical(visible_env: str | None, count: int) -> list[int] | None:
    """The physical GPU indices (as `nvidia-smi` numbers them) of CUDA devices
    0..count-1, or None where they cannot be told. Unset: the identity. Only the
    leading indices can be mapped: CUDA stops reading the list at an invalid entry, and
    UUIDs (GPU-..., MIG-...) name GPUs that `nvidia-smi topo -m` lists only by index.
    CUDA's default order (CUDA_DEVICE_ORDER=FASTEST_FIRST) equals nvidia-smi's PCI order
    on a machine of one GPU model, the case the profiler measures."""
    if visible_env is None:
        return list(range(count))
    physical = []
    for entry in visible_env.split(","):
        if not entry.strip().isdigit():
            break
        physical.append(int(entry))
    return physical[:count] if len(physical) >= count else None


_GPU = re.compile(r"GPU\d+")


def topo_gpu_matrix(text: str, physical: list[int]) -> list[list[str]] | None:
    """The GPU x GPU entries (X, NV12, PIX, SYS, ...) of `nvidia-smi topo -m` output
    (colour codes removed) for the physical GPUs `physical`, in that order; None if one
    is missing. The header (a line that starts with white space) names the columns;
    rows start with GPU<k>."""
    header: list[str] | None = None
    rows: dict[int, list[str]] = {}
    for line in text.splitlines():
        cells = line.split()
        if not cells or not _GPU.fullmatch(cells[0]):
            continue
        if line[:1].isspace():
            header = header or cells
        else:
            rows[int(cells[0][3:])] = cells[1:]
    try:
        columns = [header.index(f"GPU{p}") if header else p for p in physical]
        return [[rows[p][c] for c in columns] for p in physical]
    except (KeyError, IndexError, ValueError):
        return None
