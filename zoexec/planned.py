"""The options the plan decides, as sections of a run's configuration (zoexec.config):
`PlanDecided`, a section whose options default to the plan's and must agree with it when
given, and its two sections, the tuning (`TuningOptions`: full, LoRA or prefix) and the
zeroth-order estimator (`EstimatorOptions`). Torch-free, like zoexec.config.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from zoexec.fields import FieldError, Section, at_least, option, option_fields
from zoplan.names import ESTIMATOR_WORDS, TUNING_WORDS, Estimator, Tuning, described
from zoplan.workload import Workload


def _targets(text: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in text.split(",") if name.strip())


def _module_names(value: tuple[str, ...]) -> str | None:
    return None if value and all(n.isidentifier() for n in value) else \
        "block module names, comma-separated (q_proj,v_proj)"


class PlanDecided(Section):
    """A section whose options the plan decides: each defaults to None (the plan's), and a
    given one must agree with the plan (`check_plan`). A subclass says what the plan holds
    (`planned`), why an option the plan has no value for is refused (`left_out`) and which
    `zoplan optimize` option decides them (DECIDED_BY)."""

    DECIDED_BY: ClassVar[str]

    @property
    def given(self) -> bool:
        return any(getattr(self, f.name) is not None for f in option_fields(type(self)))

    def planned(self, workload: Workload) -> dict[str, object]:
        """The plan's value of each option it decides (a name left out: it has none)."""
        raise NotImplementedError

    def left_out(self, workload: Workload) -> str:
        raise NotImplementedError

    def check_plan(self, workload: Workload) -> None:
        """FieldError for a given option that is not the plan's."""
        planned = self.planned(workload)
        for f in option_fields(type(self)):
            value = getattr(self, f.name)
            if value is None:
                continue
            if f.name not in planned:
                raise FieldError(f.name, value, self.left_out(workload))
            want = planned[f.name]
            if (tuple(value) if isinstance(want, tuple) else value) != want:
                shown = ",".join(want) if isinstance(want, tuple) else want
                raise FieldError(f.name, value, f"{shown}, the plan's (zoplan optimize "
                                 f"--{self.DECIDED_BY} decides it)")


@dataclass(frozen=True, kw_only=True)
class TuningOptions(PlanDecided):
    """Full-parameter or LoRA MeZO: the plan decides (zoplan optimize --tuning); given
    here, each must agree with the plan (docs/lora.md)."""

    PANEL: ClassVar[str] = "Tuning (the plan's; given, they must match it)"

    tuning: Tuning | None = option(None, described(TUNING_WORDS), shown="the plan's")
    lora_r: int | None = option(None, "LoRA rank r", shown="the plan's", check=at_least(1))
    lora_alpha: int | None = option(None, "LoRA alpha (scaling alpha / r)", shown="the plan's",
                                    check=at_least(1))
    lora_targets: tuple[str, ...] | None = option(
        None, "Block modules LoRA adapts, comma-separated", shown="the plan's",
        parse=_targets, check=_module_names)
    prefix_tokens: int | None = option(None, "Prefix tuning: keys and values per block",
                                       shown="the plan's", check=at_least(1))

    DECIDED_BY: ClassVar[str] = "tuning"

    def planned(self, workload: Workload) -> dict[str, object]:
        planned: dict[str, object] = {"tuning": workload.tuning}
        if workload.is_lora:
            planned.update(lora_r=workload.lora_r, lora_alpha=workload.lora_alpha,
                           lora_targets=tuple(workload.lora_targets))
        if workload.is_prefix:
            planned.update(prefix_tokens=workload.prefix_tokens)
        return planned

    def left_out(self, workload: Workload) -> str:
        return f"left out: the plan is a {workload.tuning} plan (zoplan optimize --tuning decides it)"


def _share(v: float) -> str | None:
    return None if math.isfinite(v) and 0 < v <= 1 else "a number in (0, 1]"


@dataclass(frozen=True, kw_only=True)
class EstimatorOptions(PlanDecided):
    """The zeroth-order estimator: the plan decides (zoplan optimize --estimator); given
    here, each must agree with the plan (docs/estimators.md)."""

    PANEL: ClassVar[str] = "Estimator (the plan's; given, they must match it)"

    estimator: Estimator | None = option(None, described(ESTIMATOR_WORDS), shown="the plan's")
    lowrank_rank: int | None = option(None, "lowrank: the rank r of U V^T", shown="the plan's",
                                      check=at_least(1))
    lowrank_every: int | None = option(None, "lowrank: steps V is kept before it is redrawn",
                                       shown="the plan's", check=at_least(1))
    sparse_share: float | None = option(
        None, "sparse: the share of each tensor perturbed and updated (its smallest "
        "magnitudes)", shown="the plan's", check=_share)
    directions: int | None = option(
        None, "Directions a step, each on its equal part of the global batch (each DDP "
        "group its own where the layout has them)", shown="the plan's", check=at_least(1))

    DECIDED_BY: ClassVar[str] = "estimator"

    def planned(self, workload: Workload) -> dict[str, object]:
        return workload.estimator_spec.to_dict()   # its name, own settings and directions

    def left_out(self, workload: Workload) -> str:
        return (f"left out: the plan's estimator is {workload.estimator_spec.estimator} "
                f"(make another with zoplan optimize --estimator)")
