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
