"""One rank of a prefix-tuning run (Workload.tuning "prefix"): LoRA's schedule
(zoexec.train.lora.FrozenBaseTrainer: a frozen, read-only base, small fp32 tensors per block
as the only trained weights, perturbed and updated block by block, identical on every
rank) with each block's prefix keys and values (zoexec.model.prefix) in place of
adapters: the working block's attention gets them through the cache of the ctx
(PrefixCache, bound to the working prefix), and the embed places the input after the
prefix (prefix_embed). The initial prefixes are the base's own keys and values of P
seeded tokens, computed once over the streamed blocks (rank 0's, given to every rank),
or a snapshot's on a resume.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch

from zoexec.model.prefix import (
    PrefixCache,
    PrefixSpec,
    init_prefix,
    is_prefix_folder,
    load_prefixes,
    prefix_embed,
    prefix_spec,
    save_prefixes,
)
from zoexec.train.engine import SavedState, Trainer
from zoexec.train.lora import FrozenBaseTrainer, LoraTrainer
from zoexec.train.state import Hidden
from zoplan.workload import Workload


class PrefixTrainer(FrozenBaseTrainer[PrefixSpec]):
    """The step loop of one rank training prefixes (module docstring)."""

    cache: PrefixCache

    def _tuned_spec(self) -> PrefixSpec:
        return prefix_spec(self.parts, tokens=self.cfg.workload.prefix_tokens)

    def _attach(self, work: torch.Tensor) -> None:
        self.cache = PrefixCache(self.lora)
        self.cache.bind(work)

    def _initial_adapters(self) -> torch.Tensor:
        """[blocks, numel] fp32: a resumed run's snapshot (checked), else the base's keys
        and values of P seeded tokens (rank 0's, broadcast: every rank starts alike)."""
        blocks = self.store.num_blocks
        if self.cfg.load_from is not None and is_prefix_folder(self.cfg.load_from):
            return load_prefixes(Path(self.cfg.load_from), self.lora, num_blocks=blocks)
        out = torch.zeros(blocks, self.lora.numel, dtype=torch.float32, device=self.env.device)
        buf = self.bufs[0][:self.store.block_numel]

        def weights() -> Iterator[torch.Tensor]:
            for block in range(blocks):
                buf.copy_(self.store.weights(block))
                yield buf
        init_prefix(self.parts, self.lora, seed=self.cfg.optim.seed, blocks=weights(), out=out)
        if self.env.place.world_size > 1:
            import torch.distributed as dist

            dist.broadcast(out, src=0, group=self.env.world)
        return out.cpu()

    def _eval_embed(self, ids: torch.Tensor) -> Hidden:
        return prefix_embed(self.parts, ids, self.cache)

    def save(self, folder: Path, *, state: SavedState) -> None:
        """Rank 0: the prefixes as a PEFT prefix-tuning folder with the base's tokenizer
        (zoexec.model.prefix.save_prefixes)."""
        source = Path(self.cfg.source_dir) if self.cfg.source_dir else None
        save_prefixes(folder, self.adapters.cpu(), self.lora, base=self.base_name(),
                      tokenizer_from=source, state=state)


def trainer_class(workload: Workload) -> type[Trainer]:
    """The step loop of a workload's tuning: Trainer (full), LoraTrainer, PrefixTrainer."""
    tuned: dict[str, type[Trainer]] = {"lora": LoraTrainer, "prefix": PrefixTrainer}
    return tuned.get(workload.tuning, Trainer)
