"""A step's record: (step, seed, g, lr) and its losses, as every rank knows it after the
loss all-reduce. The (seed, g, lr) triples are the whole training history of MeZO: the
initial weights and these records rebuild the model exactly."""

from __future__ import annotations

import math
from array import array
from dataclasses import asdict, dataclass


@dataclass(frozen=True, kw_only=True)
class StepRecord:
    """One training step as every rank knows it after the loss all-reduce."""

    step: int
    seed: int
    loss_plus: float
    loss_minus: float
    g: float
    lr: float = 0.0
    tokens_per_s: float = 0.0
    step_time_s: float = 0.0
    skipped: bool = False          # a non-finite step skipped (--on-nonfinite skip): no update

    @property
    def loss(self) -> float:
        return 0.5 * (self.loss_plus + self.loss_minus)

    @property
    def finite(self) -> bool:
        return all(math.isfinite(v) for v in (self.loss_plus, self.loss_minus, self.g))

    @property
    def update(self) -> tuple[int, float, float] | None:
        """(seed, g, lr) of the update this step applies later, or None."""
        return None if self.skipped or not self.finite else (self.seed, self.g, self.lr)

    def to_dict(self) -> dict:
        out = {**asdict(self), "loss": self.loss, "data_position": self.step}
        if not self.skipped:
            out.pop("skipped")
        bad = [k for k, v in out.items() if isinstance(v, float) and not math.isfinite(v)]
        for key in bad:
            out[key] = None
        if bad:
            out["nonfinite"] = True
        return out

    @classmethod
    def from_dict(cls, data: dict) -> StepRecord:
        """A logged line back (null: NaN); ValueError/KeyError/TypeError if malformed."""
        def num(key: str) -> float:
            value = data[key]
            return math.nan if value is None else float(value)
        return cls(step=int(data["step"]), seed=int(data["seed"]), loss_plus=num("loss_plus"),
                   loss_minus=num("loss_minus"), g=num("g"), lr=num("lr"),
                   tokens_per_s=float(data.get("tokens_per_s") or 0.0),
                   step_time_s=float(data.get("step_time_s") or 0.0),
                   skipped=bool(data.get("skipped", False)))


_FLOATS = ("loss_plus", "loss_minus", "g", "lr", "tokens_per_s", "step_time_s")


class StepHistory:
    """The StepRecords of a run, kept as columns of numbers (72 bytes a step instead of
    a record object's ~350), read back as StepRecords: what a long run holds of its
    history stays small (10,000 steps: 0.7 MiB). A list's append, len, iteration and
    indexing."""

    def __init__(self, records=()) -> None:
        self._ints = array("q")        # step, seed (63-bit), skipped: 3 per record
        self._floats = array("d")      # _FLOATS: 6 per record
        for record in records:
            self.append(record)

    def append(self, record: StepRecord) -> None:
        self._ints.extend((record.step, record.seed, int(record.skipped)))
        self._floats.extend(getattr(record, name) for name in _FLOATS)

    def __len__(self) -> int:
        return len(self._ints) // 3

    def __getitem__(self, index: int) -> StepRecord:
        count = len(self)
        if not -count <= index < count:
            raise IndexError("step history index out of range")
        index %= count
        step, seed, skipped = self._ints[3 * index:3 * index + 3]
        values = dict(zip(_FLOATS, self._floats[6 * index:6 * index + 6], strict=True))
        return StepRecord(step=step, seed=seed, skipped=bool(skipped), **values)

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __bool__(self) -> bool:
        return len(self) > 0
