"""A step's record: (step, seed, g, lr) and its losses, as every rank knows it after the
loss all-reduce. The (step, seed, g, lr) of each step (and with several directions a
step, each direction's g: `gs`) are the whole training history of MeZO: the initial
weights and these records rebuild the model exactly."""

from __future__ import annotations

import math
import tempfile
from array import array
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any, BinaryIO


@dataclass(frozen=True, kw_only=True)
class Update:
    """What a step's update applies (deferred to the next pass): its step (lowrank's V
    period), seed, projected gradient, learning rate, and with q > 1 directions each
    direction's projected gradient `gs` (g is their mean)."""

    step: int
    seed: int
    g: float
    lr: float
    gs: tuple[float, ...] = ()

    @property
    def terms(self) -> tuple[tuple[int, float], ...]:
        """(direction, coefficient) of each direction's share of the update: g along
        direction 0, or g_j / q along each direction j."""
        if not self.gs:
            return ((0, self.g),)
        return tuple((j, g / len(self.gs)) for j, g in enumerate(self.gs))


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
    gs: tuple[float, ...] = ()     # each direction's g (q > 1 directions a step; g: their mean)

    @property
    def loss(self) -> float:
        return 0.5 * (self.loss_plus + self.loss_minus)

    @property
    def finite(self) -> bool:
        return all(math.isfinite(v) for v in (self.loss_plus, self.loss_minus, self.g, *self.gs))

    @property
    def update(self) -> Update | None:
        """The update this step applies later, or None (skipped, not finite)."""
        if self.skipped or not self.finite:
            return None
        return Update(step=self.step, seed=self.seed, g=self.g, lr=self.lr, gs=self.gs)

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {**asdict(self), "loss": self.loss, "data_position": self.step}
        if not self.skipped:
            out.pop("skipped")
        gs = [v if math.isfinite(v) else None for v in self.gs]
        if not self.gs:
            out.pop("gs")
        else:
            out["gs"] = gs
        bad = [k for k, v in out.items() if isinstance(v, float) and not math.isfinite(v)]
        for key in bad:
            out[key] = None
        if bad or None in gs:
            out["nonfinite"] = True
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StepRecord:   # a JSON line's object
        """A logged line back (null: NaN); ValueError/KeyError/TypeError if malformed."""
        def num(key: str) -> float:
            value = data[key]
            return math.nan if value is None else float(value)
        return cls(step=int(data["step"]), seed=int(data["seed"]), loss_plus=num("loss_plus"),
                   loss_minus=num("loss_minus"), g=num("g"), lr=num("lr"),
                   tokens_per_s=float(data.get("tokens_per_s") or 0.0),
                   step_time_s=float(data.get("step_time_s") or 0.0),
                   skipped=bool(data.get("skipped", False)),
                   gs=tuple(math.nan if v is None else float(v) for v in data.get("gs", ())))


_FLOATS = ("loss_plus", "loss_minus", "g", "lr", "tokens_per_s", "step_time_s")


class StepHistory:
    """The StepRecords of a run, kept as columns of numbers (72 bytes a step instead of
    a record object's ~350), read back as StepRecords. Only the last HELD steps stay in
    memory: older ones go, HELD at a time, to an unnamed temporary file (the page
    cache, not the process's memory), so a run of any length holds the same few
    hundred KiB of its history. A list's append, len, iteration and indexing."""

    HELD = 4096   # steps in memory; a block of this many is moved to the file at a time

    def __init__(self, records: Iterable[StepRecord] = ()) -> None:
        self._ints = array("q")        # step, seed (63-bit), skipped: 3 per record
        self._floats = array("d")      # _FLOATS: 6 per record
        self._gs: dict[int, tuple[float, ...]] = {}   # q > 1 directions: each record's gs
        self._moved = 0                # records in the file, in blocks of HELD
        self._file: BinaryIO | None = None
        for record in records:
            self.append(record)

    def append(self, record: StepRecord) -> None:
        self._ints.extend((record.step, record.seed, int(record.skipped)))
        self._floats.extend(getattr(record, name) for name in _FLOATS)
        if record.gs:
            self._gs[len(self) - 1] = tuple(record.gs)
        if len(self._ints) == 3 * self.HELD:
            self._move_block()

    def _move_block(self) -> None:
        """The HELD records in memory written to the end of the file, then let go."""
        if self._file is None:
            self._file = tempfile.TemporaryFile(prefix="zoexec-history-")
        self._file.seek(0, 2)
        self._file.write(self._ints.tobytes() + self._floats.tobytes())
        self._ints, self._floats = array("q"), array("d")
        self._moved += self.HELD

    def __len__(self) -> int:
        return self._moved + len(self._ints) // 3

    def _columns(self, index: int) -> tuple[list[int], list[float]]:
        """Record `index`'s 3 integers and 6 floats, from memory or the file."""
        if index >= self._moved:
            at = index - self._moved
            return list(self._ints[3 * at:3 * at + 3]), list(self._floats[6 * at:6 * at + 6])
        assert self._file is not None, "records moved to no file"
        block, at = divmod(index, self.HELD)
        base = block * self.HELD * 72
        ints, floats = array("q"), array("d")
        self._file.seek(base + 24 * at)
        ints.frombytes(self._file.read(24))
        self._file.seek(base + 24 * self.HELD + 48 * at)
        floats.frombytes(self._file.read(48))
        return list(ints), list(floats)

    def __getitem__(self, index: int) -> StepRecord:
        count = len(self)
        if not -count <= index < count:
            raise IndexError("step history index out of range")
        index %= count
        (step, seed, skipped), floats = self._columns(index)
        values = dict(zip(_FLOATS, floats, strict=True))
        return StepRecord(step=step, seed=seed, skipped=bool(skipped),
                          gs=self._gs.get(index, ()), **values)

    def __iter__(self) -> Iterator[StepRecord]:
        return (self[i] for i in range(len(self)))

    def __bool__(self) -> bool:
        return len(self) > 0
