"""What `zoplan profile` measures and how often (the profiler's settings).

The settings travel with the samples (Settings.to_dict), so the planner side that fits
them (zoplan.profiling) knows the sizes and shapes without importing the profiler.
"""

from __future__ import annotations

from dataclasses import dataclass

KIB, MIB, GIB = 2**10, 2**20, 2**30
RETRIES = 8                   # a sample disturbed by other processes is retaken (x repeats)


@dataclass(frozen=True, kw_only=True)
class Settings:
    """What to measure and how often; `ranks` = local ranks (CPU: gloo processes)."""

    repeats: int
    quick: bool
    ranks: int
    cores: int
    device: str = "cpu"
    time_budget_s: float = 120.0   # the whole profile's (zoexec.profiler.budget)

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {self.repeats}")
        if not (self.time_budget_s > 0 and self.time_budget_s < float("inf")):
            raise ValueError(f"--time-budget must be a number of seconds > 0, got "
                             f"{self.time_budget_s:g}")
        if self.ranks < 1:
            raise ValueError(f"ranks must be >= 1, got {self.ranks}")

    @property
    def rounds(self) -> int:
        """Measurement rounds planned (as many run as the time budget holds); the profile
        takes the median of each figure (CPU hosts: a shared or virtual machine's speed
        drifts)."""
        return 1 if self.quick or self.device == "cuda" else 3

    @property
    def retries(self) -> int:
        """Extra tries (x repeats) for samples disturbed by other processes."""
        return 2 if self.quick else RETRIES

    @property
    def copy_bytes(self) -> int:
        """The headline copy size: a block-sized buffer."""
        return 16 * MIB if self.device == "cpu" else 256 * MIB

    @property
    def store_bytes(self) -> int:
        """Size of the store the CPU copies cycle through (beyond the caches)."""
        return 256 * MIB if self.quick else 1024 * MIB

    @property
    def copy_sweep(self) -> list[int]:
        if self.device == "cpu":
            return [4 * MIB, 16 * MIB] if self.quick else [1 * MIB, 4 * MIB, 16 * MIB, 64 * MIB]
        return [16 * MIB, 256 * MIB] if self.quick else [4 * MIB, 64 * MIB, 256 * MIB, GIB]

    @property
    def gather_sizes(self) -> list[int]:
        """Total all-gather output sizes (bytes)."""
        if self.device == "cpu":
            sizes = [4 * KIB, 256 * KIB, 4 * MIB] if self.quick else \
                [4 * KIB, 64 * KIB, 256 * KIB, MIB, 4 * MIB, 16 * MIB, 64 * MIB]
        else:
            sizes = [8 * KIB, MIB, 64 * MIB] if self.quick else \
                [8 * KIB, 256 * KIB, MIB, 16 * MIB, 64 * MIB, 256 * MIB, GIB]
        return sizes

    @property
    def forward_grid(self) -> list[tuple[str, int, int, int]]:
        """(family, hidden, batch, seq) of the timed block forwards. On the CPU the grid
        spans small and wide blocks, short and long sequences and both block families,
        so the fit can tell GEMMs, attention and element-wise work apart."""
        if self.device == "cpu":
            if self.quick:
                return [("opt", h, b, s) for h in (128, 512)
                        for b, s in ((1, 32), (4, 128), (2, 512), (8, 512))] + \
                    [("llama", 256, b, s) for b, s in ((4, 64), (1, 512))]
            shapes = [(1, 32), (4, 64), (1, 256), (8, 128), (2, 512), (4, 512)]
            wide = {128: [(16, 512), (32, 256)], 256: [(16, 512)], 512: [(8, 512)], 1024: []}
            return [("opt", h, b, s) for h in (128, 256, 512, 1024) for b, s in shapes + wide[h]] \
                + [("llama", h, b, s) for h in (128, 512) for b, s in shapes + wide[h]]
        # a GPU forward of a few thousand tokens is bound by the host's launches (on an
        # H200 every OPT block forward up to 2k tokens took 0.6 ms, docs/gpu.md): the
        # quick grid keeps one such shape per width and one of 16k tokens, where the
        # GEMMs dominate, so the fit can tell the launch cost from the GEMM rate
        hiddens = [2048, 4096] if self.quick else [1024, 2048, 4096]
        shapes = [(1, 128), (8, 2048)] if self.quick else \
            [(1, 64), (1, 256), (2, 512), (4, 1024), (8, 2048)]
        return [("opt", h, b, s) for h in hiddens for b, s in shapes]

    @property
    def forward_dtypes(self) -> dict[str, list[tuple[str, int, int, int]]]:
        """GPU: the shapes timed per GEMM precision: "bf16" (16-bit tensor cores) the
        whole grid, "tf32" (fp32 with TF32 allowed) and "fp32" (TF32 off) a few shapes
        of two widths (the fit shares the GEMM efficiency term and the launch cost)."""
        grid = self.forward_grid
        if self.device == "cpu":
            return {"fp32": grid}
        sub = [g for g in grid if g[1] != min(h for _, h, _, _ in grid)]
        sub = sub[1::2] if len(sub) > 3 else sub
        return {"bf16": grid, "tf32": sub, "fp32": sub}

    @property
    def z_gpu_blocks(self) -> list[tuple[int, int]]:
        """GPU: (tensors, elements each) of the blocks whose z draws separate the cost
        of a generator launch (many small tensors) from that of an element (a few large
        ones)."""
        if self.quick:
            return [(4, 1 << 24), (256, 1 << 12)]
        return [(4, 1 << 26), (1024, 1 << 12)]

    @property
    def reference_shape(self) -> tuple[str, int, int, int]:
        """The shape timed with all ranks at once (-> compute.rank_scaling)."""
        if self.device == "cpu":
            return ("opt", 256 if self.quick else 512, 4, 128)
        return self.forward_grid[-1]

    @property
    def z_hiddens(self) -> tuple[int, ...]:
        """Hidden sizes of the OPT blocks whose z draws fit the CPU z model."""
        return (128, self.zo_hidden)

    @property
    def zo_hidden(self) -> int:
        """Hidden size of the block whose update task is timed (its real tensor specs)."""
        if self.device == "cpu":
            return 256 if self.quick else 512
        return 2048 if self.quick else 4096

    def to_dict(self) -> dict[str, object]:
        """The settings and every size and shape derived from them (plain JSON)."""
        return {"repeats": self.repeats, "quick": self.quick, "ranks": self.ranks,
                "cores": self.cores, "device": self.device, "rounds": self.rounds,
                "time_budget_s": self.time_budget_s,
                "copy_bytes": self.copy_bytes, "store_bytes": self.store_bytes,
                "copy_sweep": self.copy_sweep, "gather_sizes": self.gather_sizes,
                "forward_grid": [list(s) for s in self.forward_grid],
                "reference_shape": list(self.reference_shape),
                "z_hiddens": list(self.z_hiddens), "zo_hidden": self.zo_hidden,
                "forward_dtypes": {k: [list(s) for s in v]
                                   for k, v in self.forward_dtypes.items()},
                "z_gpu_blocks": [list(b) for b in self.z_gpu_blocks]}
