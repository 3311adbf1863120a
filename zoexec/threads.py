"""How many torch threads a rank uses: the one rule shared by zoexec and `zoplan profile`.

Torch-free on purpose, so the planner side can import it without loading torch.
"""

from __future__ import annotations

import os


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity where the OS reports it)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def threads_per_rank(cores: int, local_ranks: int) -> int:
    """The host's cores shared by its local ranks, at least one each."""
    return max(1, cores // local_ranks)
