"""The zeroth-order maths of one rank's `Trainer` (zoexec.train.engine's module
docstring): the estimator's draws, the deferred updates applied in the workload's
update mode (torch path or one counter pass, --zo-kernel counter/fused) and the
perturbation of a block. `ZoUpdates` is a part of `Trainer`."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from zoexec.maths.counter import Perturb, Term, f32, terms_of
from zoexec.maths.estimators import Directions, direction_seed
from zoexec.maths.history import Update
from zoexec.maths.zo import apply_update, apply_update_stochastic, perturb_into
from zoexec.model.families import TensorSpec
from zoexec.train.state import Stream, TrainerState
from zoplan.execrules import SR_SCRATCH, sr_chunk

Specs = Sequence[TensorSpec]   # the tensors of a flat range (a block's, the resident parts')


class ZoUpdates(TrainerState):
    """The estimator's draws, the deferred updates and the perturbation (see the
    module docstring); a part of `Trainer`, whose state it reads."""

    def _directions(self, shared: Directions | None = None,
                    specs: Specs | None = None) -> Directions:
        """The estimator's draws (zoexec.maths.estimators) for one lane of work, of the
        tensors of `specs` (default: a block's and the resident parts'; with `shared`, a
        block's), sparse thresholds shared with `shared`'s."""
        if specs is None:
            specs = self.parts.block_specs + ([] if shared else self.parts.resident_specs)
        return Directions(self.estimator, run_seed=self.cfg.optim.seed, device=self.env.device,
                          thresholds=shared.thresholds if shared is not None else None,
                          shapes=[s.shape for s in specs])

    # ---- resident parts ----------------------------------------------------------------
    def _update_scratch(self) -> list[torch.Tensor]:
        """fp32 chunks the stochastic rounding computes the update in (update
        "stochastic"; none otherwise)."""
        if self.cfg.workload.update != "stochastic":
            return []
        largest = max(s.numel for s in self.parts.block_specs + self.parts.resident_specs)
        size = min(sr_chunk(self.env.device.type), largest)
        return [torch.empty(size, dtype=torch.float32, device=self.env.device)
                for _ in range(SR_SCRATCH)]

    def _apply_pending(self, theta: torch.Tensor, block: int, specs: Specs, z: torch.Tensor,
                       *, start: int | None = None, edge: torch.Tensor | None = None,
                       scratch: list[torch.Tensor] | None = None,
                       dirs: Directions | None = None) -> None:
        """theta -= lr * (g d_t + wd theta) for each pending update t in order (the
        deferred update of the last step; several when a resume replays the log), d_t
        the estimator's direction of step t (with q directions: g_j / q along each
        d_j, weight decay once), in the workload's update mode (docs/precision.md): in
        the stored precision for "master" (fp32) and "plain" (16-bit, round to
        nearest), computed in fp32 and rounded stochastically for "stochastic". With
        `start`, `theta` is the flat range [start, start + len) of the block (the update
        on the slice): d is drawn for it alone (zoexec.maths.estimators, cut chunks
        through `edge`), the same bits land there as with the whole block; `scratch`,
        `dirs`: the rounding's and the draws' (default the compute stream's). The counter
        paths: every term in one pass (zoexec.maths.counter), no z buffer."""
        if self.zk:
            self._zo_pass(theta, block, specs, terms=self._terms(), start=start or 0)
            return
        z = z if start is None else z[:theta.numel()]
        for pend in self.pending:
            for index, (direction, g) in enumerate(pend.terms):
                self._apply_term(theta, block, specs, z, pend, direction, g,
                                 wd=self.cfg.optim.weight_decay if index == 0 else 0.0,
                                 start=start, edge=edge, scratch=scratch, dirs=dirs or self.dirs)

    def _apply_term(self, theta: torch.Tensor, block: int, specs: Specs, z: torch.Tensor,
                    pend: Update, direction: int, g: float, *, wd: float, start: int | None,
                    edge: torch.Tensor | None, scratch: list[torch.Tensor] | None,
                    dirs: Directions) -> None:
        """One direction's share of a pending update (see _apply_pending)."""
        if not pend.lr or not (g or wd):
            return
        seed = direction_seed(pend.seed, direction)
        if g:
            dirs.fill(z, seed=seed, step=pend.step, block=block, specs=specs, theta=theta,
                      start=start, edge=edge)
        before = self.rounding.before(theta, block) if not start else None
        if self.cfg.workload.update == "stochastic":
            apply_update_stochastic(theta, z, lr=pend.lr, g=g, weight_decay=wd, specs=specs,
                                    seed=seed, block=block, scratch=scratch or self.scratch,
                                    start=start or 0)
        else:
            apply_update(theta, z, lr=pend.lr, g=g, weight_decay=wd,
                         decay_mask_or_specs=specs, start=start or 0)
        self.rounding.after(theta, z, before, g=g)

    def _draw(self, z: torch.Tensor, theta: torch.Tensor, block: int, specs: Specs,
              direction: int) -> None:
        """z <- d of the step in progress along `direction` (the whole block; nothing on
        the counter paths: their passes regenerate z)."""
        if self.zk:
            return
        step, seed = self._step_now()
        self.dirs.fill(z, seed=direction_seed(seed, direction), step=step, block=block,
                       specs=specs, theta=theta)

    # ---- the counter paths (--zo-kernel counter, fused) -------------------------------------
    def _terms(self) -> list[Term]:
        """The pending updates as the counter pass's terms (zoexec.maths.counter.terms_of)."""
        return terms_of(self.pending, weight_decay=self.cfg.optim.weight_decay)

    def _step_now(self) -> tuple[int, int]:
        """(step, seed) of the step in progress (Trainer.step sets it before any draw)."""
        assert self.now is not None, "no step in progress"
        return self.now

    def _zo_pass(self, theta: torch.Tensor, block: int, specs: Specs, *,
                 terms: Sequence[Term] = (), stream: Stream | None = None,
                 work: torch.Tensor | None = None, start: int = 0) -> None:
        """One counter pass over `theta` (the block's range from `start`): `terms`, then
        `stream`'s perturbation of the step in progress into `work`."""
        perturb = None
        if stream is not None:
            assert work is not None, "a perturbation is written into `work`"
            perturb = Perturb(seed=direction_seed(self._step_now()[1], stream.direction),
                              scale=f32(stream.sign * self.cfg.optim.eps), out=work)
        if terms or perturb is not None:
            assert self.zk is not None, "the torch path draws z into buffers"
            self.zk(theta, specs=specs, block=block, terms=terms, perturb=perturb, start=start,
                    kind=self.zk_kind)

    def _update_block(self, theta: torch.Tensor, block: int, seed: int | None, *,
                      pending: bool) -> None:
        """[The pending updates,] then d of step `seed` along the first stream's
        direction and its perturbation."""
        specs = self.parts.block_specs
        if self.zk:   # the counter paths: the pending updates and the perturbation in one pass
            first = self.streams[0] if seed is not None else None
            self._zo_pass(theta, block, specs, terms=self._terms() if pending else [],
                          stream=first, work=self.work)
            return
        if pending:
            self._apply_pending(theta, block, specs, self.z)
        if seed is not None:
            first = self.streams[0]
            self._draw(self.z, theta, block, specs, first.direction)
            perturb_into(self.work, theta, self.z, first.sign * self.cfg.optim.eps)
