"""MeZO as its code runs (arXiv 2305.17333, Algorithm 1; its `large_models/trainer.py`),
written here from the algorithm: every weight on the device in the run's dtype; a step
is four passes over every tensor, each drawing its z with torch's normal from a
generator re-seeded with the step seed (+eps; forward; -2eps; forward; +eps to
restore; the update), tensor by tensor with out-of-place torch ops, no fusion, then
the next step. The projected gradient g = (l+ - l-) / (2 eps) is read to the host
between the second forward and the restore (MeZO's `.item()`).

z order (the generator's sequence): the embedding's tensors, block 0..L-1's in module
order, then the final norm's and the head's, the order ZO2's runner draws them in
(zoexec.baselines.zo2), so both runners see the same z for the same seeds.

Tasks on zoexec's lanes (their spans are the per-phase times): `update` for each of
the four passes over z, `embed`, `forward` per block and stream, `head` per stream.
"""

from __future__ import annotations

import torch

from zoexec.baselines.common import (
    BaselineConfig,
    BaselineResult,
    Held,
    Spans,
    batches_for,
    block_tensors,
    device_of,
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
from zoexec.model.families import ModelParts, bind_block
from zoexec.runtime.lanes import Lanes


class Mezo:
    """The MeZO program on one device (`held`: the model, every block moved there)."""

    def __init__(self, cfg: BaselineConfig, held: Held, device: torch.device, lanes: Lanes) -> None:
        self.cfg, self.held, self.lanes = cfg, held, lanes
        self.flats = [f.to(device) for f in held.flats]      # every block resident
        held.flats = self.flats
        self.blocks = [block_tensors(held.parts, f) for f in self.flats]
        self.tensors = held.embed + [t for b in self.blocks for t in b] + held.head
        self.gen = make_generator(device)

    def pass_over_z(self, seed: int, scale: float) -> None:
        with self.lanes.task("update"):
            self.gen.manual_seed(seed)
            perturb(self.tensors, self.gen, scale, self.cfg.eps)

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, int]:
        parts = self.held.parts
        with self.lanes.task("embed"):
            hidden, ctx = parts.embed(ids)
        for block, flat in enumerate(self.flats):
            with self.lanes.task("forward", block):
                bind_block(parts, flat)
                hidden = parts.block_forward(hidden, ctx)
        with self.lanes.task("head"):
            return loss_of(parts, hidden, ids)

    def step(self, index: int, seed: int, ids: torch.Tensor) -> tuple[float, float]:
        with torch.no_grad():
            return self._step(seed, ids)

    def _step(self, seed: int, ids: torch.Tensor) -> tuple[float, float]:
        self.pass_over_z(seed, 1.0)
        plus = self.forward(ids)
        self.pass_over_z(seed, -2.0)
        minus = self.forward(ids)
        loss_plus, loss_minus = mean_losses(plus, minus)
        g = zo.projected_grad(loss_plus, loss_minus, self.cfg.eps)
        self.pass_over_z(seed, 1.0)
        with self.lanes.task("update"):
            self.gen.manual_seed(seed)
            update(self.tensors, self.gen, lr=self.cfg.lr, g=g,
                   weight_decay=self.cfg.weight_decay)
        return loss_plus, loss_minus


def run_mezo(cfg: BaselineConfig, *, built: tuple[ModelParts, list[torch.Tensor]] | None = None
             ) -> tuple[BaselineResult, Held]:
    """Train with MeZO for cfg.steps steps, timed; (the result, the trained model).
    `built`: the model already built (common.build), used as it is."""
    device = device_of(cfg)
    held = load(cfg, device, untie=cfg.untie_head, built=built)
    spans = Spans()
    lanes = make_lanes(device, spans)
    program = Mezo(cfg, held, device, lanes)
    records, kinds = timed_steps(cfg, lanes, spans, program.step,
                                 batches_for(cfg, held.parts, device))
    notes = ["every block resident; z per tensor (torch.normal), four passes a step"]
    return BaselineResult(name="mezo", config=cfg, records=records, kind_s=kinds,
                          notes=notes), held
