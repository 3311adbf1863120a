"""ZO2 as its code runs (arXiv 2503.12668; its `zo2/optimizer/mezo_sgd/zo2.py` as
zoplan.pricing.baselines describes it), written here from the algorithm:

- the embeddings, the final norm and the LM head (untied: each resident tensor is
  perturbed in one stage, as ZO2's runs untie it) stay on the device; every block lives
  in host memory and crosses the link once a step, one tensor at a time (Module.to): the
  blocks start pageable (what ZO2's code loads; `host_memory="pinned"` page-locks them
  first) and come back as Module.to("cpu", non_blocking=True) brings them, into new
  host tensors that PyTorch page-locks (ATen's _to_copy pins the output of a
  non-blocking copy from a GPU), so from the second step on both directions copy pinned
  memory on a GPU;
- three streams (zoexec's lanes: h2d, compute, d2h); at block i the host waits for the
  compute of block i-2 and enqueues its offload, waits for the upload of block i-1 and
  enqueues its compute, then enqueues the upload of block i (ZO2's synchronisation per
  block: each task first makes the host wait for the task before it on its stream);
- a block's compute: step t-1's deferred update with step t-1's z, then +eps, the
  forward of the + stream, -2eps, the forward of the - stream, +eps (restore): the dual
  forward, both streams' activations side by side; z per tensor with torch's normal
  from a generator whose state continues from stage to stage (re-set to the stage's
  start for each of its three perturbations);
- the last step's update stays pending until `flush`.

For the same seeds and batches its losses and weights equal the MeZO runner's
(zoexec.baselines.mezo with untie_head) bit for bit: the same ops on the same values
in the same z order (tests/unit/test_baselines.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from zoexec.baselines.common import (
    BaselineConfig,
    BaselineResult,
    Held,
    Spans,
    batches_for,
    block_tensors,
    device_of,
    host_wait,
    load,
    loss_of,
    make_generator,
    make_lanes,
    mean_losses,
    perturb,
    timed_steps,
    update,
)
from zoexec.maths import zo
from zoexec.model.adapter import Context
from zoexec.model.families import ModelParts, bind_block
from zoexec.runtime.lanes import Lanes, Task

Tensors = list[tuple[torch.Tensor, bool]]
RING = 3          # device buffers: the block leaving, the one computing, the one arriving


class Zo2:
    """The ZO2 program on one device; `held`'s block buffers stay on the host."""

    def __init__(self, cfg: BaselineConfig, held: Held, device: torch.device, lanes: Lanes) -> None:
        self.cfg, self.held, self.lanes = cfg, held, lanes
        if cfg.host_memory == "pinned" and device.type == "cuda":
            held.flats = [f.pin_memory() for f in held.flats]
        self.host = [block_tensors(held.parts, f) for f in held.flats]
        numel, dtype = held.parts.block_numel, held.flats[0].dtype
        self.ring = [torch.empty(numel, dtype=dtype, device=device) for _ in range(RING)]
        self.ring_tensors = [block_tensors(held.parts, f) for f in self.ring]
        self.gen = make_generator(device)
        self.pending: tuple[int, float] | None = None
        self.cur: torch.Tensor | None = None       # step t's generator state at this stage
        self.prev: torch.Tensor | None = None      # step t-1's, for its deferred update

    # ---- a stage: deferred update, dual forward ---------------------------------------------
    def refresh(self, tensors: Tensors, scale: float) -> None:
        """Step t-1's update (its z continues its sequence), then +eps of step t."""
        if self.pending is not None:
            self.gen.set_state(self.prev)
            update(tensors, self.gen, lr=self.cfg.lr, g=self.pending[1],
                   weight_decay=self.cfg.weight_decay)
            self.prev = self.gen.get_state()
        self.shift(tensors, scale)

    def shift(self, tensors: Tensors, scale: float) -> None:
        """A perturbation with the stage's z (its generator state re-set each time)."""
        self.gen.set_state(self.cur)
        perturb(tensors, self.gen, scale, self.cfg.eps)

    def dual(self, tensors: Tensors, block: int, kind: str, plus: Callable[[], Any],
             minus: Callable[[], Any], *,
             after: tuple[torch.cuda.Event | None, ...] = ()) -> tuple[Any, Any, Task]:
        """update, +eps, plus(), -2eps, minus(), +eps (restore): (plus's, minus's
        results, the last task) on the compute lane."""
        with self.lanes.task("update", block, after=after):
            self.refresh(tensors, 1.0)
        with self.lanes.task(kind, block):
            got_plus = plus()
        with self.lanes.task("update", block):
            self.shift(tensors, -2.0)
        with self.lanes.task(kind, block):
            got_minus = minus()
        with self.lanes.task("update", block) as last:
            self.shift(tensors, 1.0)
            self.cur = self.gen.get_state()
        return got_plus, got_minus, last

    # ---- the step -------------------------------------------------------------------------------
    def step(self, index: int, seed: int, ids: torch.Tensor) -> tuple[float, float]:
        with torch.no_grad():
            return self._step(seed, ids)

    def _step(self, seed: int, ids: torch.Tensor) -> tuple[float, float]:
        parts, held = self.held.parts, self.held
        self.gen.manual_seed(seed)
        self.cur = self.gen.get_state()
        if self.pending is not None:
            self.gen.manual_seed(self.pending[0])
            self.prev = self.gen.get_state()
        (h_plus, ctx), (h_minus, _), _ = self.dual(
            held.embed, -1, "embed", lambda: parts.embed(ids), lambda: parts.embed(ids))
        streams = [h_plus, h_minus]
        self.blocks(streams, ctx)
        plus, minus, _ = self.dual(held.head, -1, "head", lambda: loss_of(parts, streams[0], ids),
                                   lambda: loss_of(parts, streams[1], ids))
        loss_plus, loss_minus = mean_losses(plus, minus)
        self.pending = (seed, zo.projected_grad(loss_plus, loss_minus, self.cfg.eps))
        return loss_plus, loss_minus

    def blocks(self, streams: list[torch.Tensor], ctx: Context) -> None:
        """Every block through the ring: offload i-2, compute i-1, upload i."""
        count = len(self.host)
        up: list[Any] = [None] * count
        comp: list[Any] = [None] * count
        down: list[Any] = [None] * count
        for i in range(count + 2):
            if i >= 2:
                host_wait(comp[i - 2])
                down[i - 2] = self.offload(i - 2, after=comp[i - 2].done)
            if 1 <= i <= count:
                host_wait(up[i - 1])
                comp[i - 1] = self.compute(i - 1, streams, ctx, after=up[i - 1].done)
            if i < count:
                up[i] = self.upload(i, after=down[i - RING].done if i >= RING else None)

    def upload(self, block: int, *, after: torch.cuda.Event | None) -> Task:
        with self.lanes.task("h2d", block, after=(after,)) as task:
            for (dev, _), (host, _) in zip(self.ring_tensors[block % RING], self.host[block]):
                dev.copy_(host, non_blocking=True)
        return task

    def compute(self, block: int, streams: list[torch.Tensor], ctx: Context, *,
                after: torch.cuda.Event | None) -> Task:
        parts = self.held.parts
        flat = self.ring[block % RING]

        def forward(which: int) -> None:
            bind_block(parts, flat)
            streams[which] = parts.block_forward(streams[which], ctx)
        *_, last = self.dual(self.ring_tensors[block % RING], block, "forward",
                             lambda: forward(0), lambda: forward(1), after=(after,))
        return last

    def offload(self, block: int, *, after: torch.cuda.Event | None) -> Task:
        """Each tensor back to the host as ZO2's Module.to("cpu", non_blocking=True)
        does: a new host tensor, which ATen page-locks for a non-blocking copy from a
        GPU (so from the second step on, the blocks are in pinned memory)."""
        with self.lanes.task("d2h", block, after=(after,)) as task:
            self.host[block] = [(dev.to("cpu", non_blocking=True, copy=True), decay)
                                for dev, decay in self.ring_tensors[block % RING]]
        return task

    def flush(self) -> None:
        """The last step's pending update on every tensor, in z order (each block
        uploaded, updated and brought back in turn), and every block's weights back in
        `held.flats`; nothing timed."""
        if self.pending is not None:
            device, (seed, g) = self.ring[0].device, self.pending
            kw = dict(lr=self.cfg.lr, g=g, weight_decay=self.cfg.weight_decay)
            self.gen.manual_seed(seed)
            update(self.held.embed, self.gen, **kw)
            for b, host in enumerate(self.host):
                dev = [(h.to(device, copy=True), d) for h, d in host]
                update(dev, self.gen, **kw)
                self.host[b] = [(d.to("cpu", copy=True), decay) for d, decay in dev]
            update(self.held.head, self.gen, **kw)
            self.pending = None
        self.write_back()

    def write_back(self) -> None:
        """The blocks' current host tensors into `held.flats` (the device idle)."""
        if self.ring[0].device.type == "cuda":
            torch.cuda.synchronize(self.ring[0].device)
        for flat, host in zip(self.held.flats, self.host):
            for (view, _), (h, _) in zip(block_tensors(self.held.parts, flat), host):
                view.copy_(h)


def run_zo2(cfg: BaselineConfig, *, flush: bool = True,
            built: tuple[ModelParts, list[torch.Tensor]] | None = None) -> tuple[BaselineResult, Held]:
    """Train with ZO2 for cfg.steps steps, timed (then the pending update flushed);
    (the result, the trained model: held.flats hold the blocks' weights).
    `built`: the model already built (common.build), used as it is."""
    device = device_of(cfg)
    held = load(cfg, device, untie=True, built=built)
    spans = Spans()
    lanes = make_lanes(device, spans)
    program = Zo2(cfg, held, device, lanes)
    records, kinds = timed_steps(cfg, lanes, spans, program.step,
                                 batches_for(cfg, held.parts, device))
    if flush:
        program.flush()
    else:
        program.write_back()
    notes = [f"the blocks start in {cfg.host_memory} host memory" +
             (" (the CPU: no page-locking)" if device.type == "cpu" and cfg.host_memory == "pinned"
              else "") + "; its offload (Tensor.to cpu, non_blocking) page-locks them on a GPU",
             "a tied head untied; z per tensor (torch.normal), 4 draws a block a step"]
    return BaselineResult(name="zo2", config=cfg, records=records, kind_s=kinds,
                          notes=notes), held
