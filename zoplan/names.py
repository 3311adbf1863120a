"""The names both halves share of what a plan decides: the tunings and the zeroth-order
estimators, each declared once as a Literal type and read as a tuple from it.

zoplan's request (zoplan.request: `--tuning`, `--estimator`), the workload's checks
(zoplan.workload, zoplan.estimators) and zoexec's run configuration (zoexec.config's
TuningOptions, EstimatorOptions: `Tuning | None`, `Estimator | None`) all read them
here; a new estimator or tuning is one word below. A contract (zoexec may import it);
imports nothing.
"""

from __future__ import annotations

import typing
from typing import Literal

Tuning = Literal["full", "lora", "prefix"]
TUNINGS: tuple[str, ...] = typing.get_args(Tuning)            # a plan's tuning
AUTO_TUNING = "auto"                                          # optimize: full and lora searched
TUNING_CHOICES: tuple[str, ...] = (*TUNINGS, AUTO_TUNING)     # --tuning's

Estimator = Literal["mezo", "lowrank", "sparse"]
ESTIMATORS: tuple[str, ...] = typing.get_args(Estimator)

# what each is, in the words of --tuning's and --estimator's help (both commands')
TUNING_WORDS = {"full": "every weight", "lora": "adapters on a frozen, read-only base",
                "prefix": "prefix keys and values on a frozen base"}
ESTIMATOR_WORDS = {"mezo": "z over every weight",
                   "lowrank": "U V^T per matrix, V kept for --lowrank-every steps",
                   "sparse": "the smallest-magnitude --sparse-share of each tensor"}


def described(words: dict[str, str]) -> str:
    """'a (its words), b (...) or c (...)': a help's list of names with their words."""
    parts = [f"{name} ({text})" for name, text in words.items()]
    return ", ".join(parts[:-1]) + " or " + parts[-1]
