"""What the MeZO and ZO2 baseline runners share: their settings, the model as they hold
it (the weights in one dtype, no fp32 masters; a tied LM head untied where the runner
needs it), z drawn per tensor with torch's normal from a generator re-seeded with the
step seed, the perturbation and update as their code writes them (torch ops per tensor,
out of place), and the timing of a run (medians and per-kind busy time from the lanes'
spans).

Both programs (MeZO's `large_models/trainer.py`, ZO2's `zo2/optimizer/mezo_sgd/`) are
written here from the published algorithms (arXiv 2305.17333, 2503.12668) and the
descriptions of zoplan.pricing.baselines: not their code. The model's pieces are
zoexec's (ModelParts: HF's own modules, the same forward as a zoexec run).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from zoexec.data.batch import as_batch
from zoexec.data.text import SyntheticTask
from zoexec.maths import zo
from zoexec.model import heads
from zoexec.model.families import ModelParts, torch_dtype
from zoexec.runtime import lanes as zlanes
from zoexec.store.loading import build_parts
from zoplan.errors import ZoError
from zoplan.trace import Span

DTYPES = ("fp32", "fp16", "bf16")
HostMemory = Literal["pageable", "pinned"]


@dataclass(frozen=True, kw_only=True)
class BaselineConfig:
    """A baseline run: the model (a catalogue name, a config.json, or with `init` a
    model folder), the batch, the precision of the weights and the compute, the zo
    settings, and ZO2's host memory kind."""

    model: str
    init: str = "random"
    batch: int = 8
    seq: int = 512
    steps: int = 10
    dtype: str = "bf16"
    lr: float = 1e-6
    eps: float = 1e-3
    weight_decay: float = 0.0
    seed: int = 0
    device: str = "cpu"
    host_memory: HostMemory = "pageable"
    attn: str = "eager"          # both programs run HF's eager attention
    untie_head: bool = False     # MeZO: keep a tied head tied (ZO2 always unties)

    def __post_init__(self) -> None:
        for name in ("batch", "seq", "steps"):
            if getattr(self, name) < 1:
                raise ZoError(f"--{name} must be >= 1, got {getattr(self, name)}")
        if self.dtype not in DTYPES:
            raise ZoError(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.device not in ("cpu", "cuda"):
            raise ZoError(f"--device must be cpu or cuda, got {self.device!r}")
        if self.host_memory not in ("pageable", "pinned"):
            raise ZoError(f"--host-memory must be pageable or pinned, got {self.host_memory!r}")
        if not self.eps > 0:
            raise ZoError(f"--eps must be > 0, got {self.eps}")


# ---- the model as the baselines hold it ------------------------------------------------------
@dataclass(kw_only=True, eq=False)
class Held:
    """The model's pieces on the device: the resident modules (embedding stage, head
    stage) and the block template (ModelParts), the blocks' flat buffers (on the host
    or the device: the runner's choice), the tensors of each z stage in z order."""

    parts: ModelParts
    flats: list[torch.Tensor]
    embed: list[tuple[torch.Tensor, bool]]    # (tensor, weight decay) of the embedding stage
    head: list[tuple[torch.Tensor, bool]]     # ... of the head stage (final norm, head)


def build(cfg: BaselineConfig) -> tuple[ModelParts, list[torch.Tensor]]:
    """The model's parts and block buffers in `cfg.dtype` (weights and compute alike)."""
    return build_parts(cfg.model, init=cfg.init, param_dtype=cfg.dtype, compute_dtype=cfg.dtype,
                       seed=cfg.seed, attn_implementation=cfg.attn)


def load(cfg: BaselineConfig, device: torch.device, *, untie: bool,
         built: tuple[ModelParts, list[torch.Tensor]] | None = None) -> Held:
    """The model (`built`, else built now), the resident modules on `device`, the
    block buffers on the host (pageable)."""
    parts, flats = built or build(cfg)
    if untie:
        untie_head(parts.resident)
    parts.to(device)
    embed, head = split_resident(parts, device)
    return Held(parts=parts, flats=flats, embed=embed, head=head)


def untie_head(resident: nn.Module) -> bool:
    """Give every parameter registered under a second name (a tied LM head) its own
    copy; True where one was untied."""
    seen: dict[int, str] = {}
    untied = False
    for name, param in list(resident.named_parameters(remove_duplicate=False)):
        if id(param) not in seen:
            seen[id(param)] = name
            continue
        owner, _, attr = name.rpartition(".")
        module = resident.get_submodule(owner)
        setattr(module, attr, nn.Parameter(param.detach().clone(), requires_grad=False))
        untied = True
    return untied


def split_resident(parts: ModelParts, device: torch.device) -> tuple[list[tuple[torch.Tensor, bool]],
                                                                     list[tuple[torch.Tensor, bool]]]:
    """(tensor, weight decay) of the resident tensors the embedding uses, and of the
    others (the final norm and the head), each in module order, found by which ones a
    tiny embedding reaches. Weight decay: matrices only (MeZO's rule)."""
    params = list(parts.resident.parameters())
    for p in params:
        p.requires_grad_(True)
    try:
        with torch.enable_grad():
            hidden, _ = parts.embed(torch.zeros(1, 2, dtype=torch.long, device=device))
            used = torch.autograd.grad(hidden.float().sum(), params, allow_unused=True)
    finally:
        for p in params:
            p.requires_grad_(False)
    embed = [(p.data, p.dim() >= 2) for p, g in zip(params, used) if g is not None]
    head = [(p.data, p.dim() >= 2) for p, g in zip(params, used) if g is None]
    return embed, head


def block_tensors(parts: ModelParts, flat: torch.Tensor) -> list[tuple[torch.Tensor, bool]]:
    """(view, weight decay) of each tensor of a block's flat buffer, in module order."""
    return [(flat[s.offset:s.stop].view(s.shape), s.decay) for s in parts.block_specs]


# ---- the zo maths as their code writes it ----------------------------------------------------------
def draw_z(gen: torch.Generator, like: torch.Tensor) -> torch.Tensor:
    """z of one tensor: torch's normal in the tensor's dtype, from `gen`."""
    return torch.normal(0.0, 1.0, size=tuple(like.shape), generator=gen, device=like.device,
                        dtype=like.dtype)


def perturb(tensors: list[tuple[torch.Tensor, bool]], gen: torch.Generator, scale: float,
            eps: float) -> None:
    """theta <- theta + scale * z * eps, tensor by tensor (two temporaries each)."""
    for t, _ in tensors:
        z = draw_z(gen, t)
        torch.add(t, scale * z * eps, out=t)


def update(tensors: list[tuple[torch.Tensor, bool]], gen: torch.Generator, *, lr: float,
           g: float, weight_decay: float) -> None:
    """theta <- theta - lr * (g * z + wd * theta) (wd only for matrices: MeZO skips
    biases and norm weights), tensor by tensor."""
    for t, decay in tensors:
        z = draw_z(gen, t)
        if decay and weight_decay:
            torch.sub(t, lr * (g * z + weight_decay * t), out=t)
        else:
            torch.sub(t, lr * (g * z), out=t)


def loss_of(parts: ModelParts, hidden: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(the batch's summed next-token loss over the vocabulary, left on the device;
    its count of tokens): zoexec's head (zoexec.model.heads), divided on the host."""
    return heads.loss_sum(parts, hidden, as_batch(ids))


def mean_losses(plus: tuple[torch.Tensor, int], minus: tuple[torch.Tensor, int]) -> tuple[float, float]:
    """Both streams' mean losses read to the host (the step's one wait for the device)."""
    return float(plus[0]) / plus[1], float(minus[0]) / minus[1]


def make_generator(device: torch.device) -> torch.Generator:
    return torch.Generator(device=device)


# ---- a run, timed --------------------------------------------------------------------------------
@dataclass(kw_only=True)
class StepRecord:
    loss_plus: float
    loss_minus: float
    g: float
    seconds: float


@dataclass(kw_only=True)
class BaselineResult:
    """What a baseline run measured: per step its losses, g and wall seconds; the
    per-kind busy seconds of each step's tasks (its lanes' spans)."""

    name: str
    config: BaselineConfig
    records: list[StepRecord]
    kind_s: dict[str, list[float]]
    notes: list[str] = field(default_factory=list)

    @property
    def step_s(self) -> float:
        """Median seconds a step (the first left out, warming up, when there are more)."""
        times = [r.seconds for r in self.records]
        return statistics.median(times[1:] if len(times) > 1 else times)

    def summary(self) -> dict[str, Any]:
        kinds = {k: statistics.median(v[1:] if len(v) > 1 else v) for k, v in self.kind_s.items()}
        return {"baseline": self.name, "model": self.config.model, "batch": self.config.batch,
                "seq": self.config.seq, "dtype": self.config.dtype, "device": self.config.device,
                "steps": len(self.records), "step_s_median": self.step_s,
                "step_s": [r.seconds for r in self.records],
                "kind_busy_s_median": kinds,
                "losses": [[r.loss_plus, r.loss_minus] for r in self.records],
                **({"host_memory": self.config.host_memory} if self.name == "zo2" else {}),
                "notes": self.notes}


class Spans(list[Span]):
    """The lanes' spans of the run (zoplan.trace.Span), kept in memory."""


def make_lanes(device: torch.device, spans: Spans) -> zlanes.Lanes:
    """zoexec's lanes of one process on `device` (CUDA: a stream per lane, tasks timed
    with events; CPU: in program order)."""
    if device.type == "cuda":
        return zlanes.CudaLanes(rank=0, device=device, spans=spans)
    return zlanes.CpuLanes(rank=0, spans=spans)


def host_wait(task: zlanes.Task) -> None:
    """The host waits for a task's last event (ZO2's wait per block; nothing on the CPU)."""
    if task.done is not None:
        task.done.synchronize()


def timed_steps(cfg: BaselineConfig, lanes: zlanes.Lanes, spans: Spans,
                step: Callable[[int, int, torch.Tensor], tuple[float, float]],
                batches: Iterator[torch.Tensor]) -> tuple[list[StepRecord], dict[str, list[float]]]:
    """Run `cfg.steps` steps of `step(step, seed, ids) -> (l+, l-)`, each between
    begin_step and end_step (the device idle at both): wall seconds and per-kind busy
    seconds of each step."""
    import time

    records: list[StepRecord] = []
    kind_s: dict[str, list[float]] = {}
    for index in range(cfg.steps):
        ids = next(batches)
        seen = len(spans)
        lanes.begin_step(index)
        began = time.perf_counter()
        plus, minus = step(index, zo.step_seed(cfg.seed, index), ids)
        lanes.end_step()
        seconds = time.perf_counter() - began
        records.append(StepRecord(loss_plus=plus, loss_minus=minus,
                                  g=zo.projected_grad(plus, minus, cfg.eps), seconds=seconds))
        busy: dict[str, float] = {}
        for span in spans[seen:]:
            busy[span.kind] = busy.get(span.kind, 0.0) + span.dur_s
        for kind, value in busy.items():
            kind_s.setdefault(kind, []).append(value)
    return records, kind_s


def batches_for(cfg: BaselineConfig, parts: ModelParts, device: torch.device) -> Iterator[torch.Tensor]:
    """The synthetic task's batches (zoexec's default data), on the device."""
    task = SyntheticTask(vocab=parts.config.vocab_size, seed=cfg.seed)
    step = 0
    while True:
        yield task.batch(step, cfg.batch, cfg.seq).to(device)
        step += 1


def device_of(cfg: BaselineConfig) -> torch.device:
    """The device of a baseline run: zoexec's one device choice for one rank."""
    from zoexec.runtime.device import select_device

    return select_device(cfg.device, 0, local_world_size=1, world_size=1)[0]


def dtype_of(cfg: BaselineConfig) -> torch.dtype:
    return torch_dtype(cfg.dtype)
