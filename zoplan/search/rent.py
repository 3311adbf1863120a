"""`zoplan rent`: one job planned on several machines (profiles and GPU counts), each
with the best layout, its step as a range over the profile's assumed figures
(zoplan.search.sensitivity), its memory, ZO2 on one of its GPUs, and the time and cost
of 1,000 steps at a price per GPU-hour where one is given; the fastest and the cheapest
marked by the view (zoplan.views.rent)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from zoplan.errors import ZoError
from zoplan.search.evaluate import search
from zoplan.search.sensitivity import sensitivity
from zoplan.search.space import resolve_request

STEPS = 1000
MAX_OPTIONS = 16


@dataclass(frozen=True, kw_only=True)
class Option:
    """One machine to price: a profile (name or path), GPUs, a price per GPU-hour."""

    profile: str
    gpus: int
    price: float | None = None

    @classmethod
    def parse(cls, text: str) -> Option:
        """PROFILE:GPUS[:PRICE] (a ZoError naming what is wrong)."""
        parts = text.rsplit(":", 2) if text.count(":") >= 2 else text.rsplit(":", 1)
        if len(parts) < 2:
            raise ZoError(f"--on {text!r}: give PROFILE:GPUS or PROFILE:GPUS:PRICE_PER_GPU_HOUR")
        try:
            gpus = int(parts[1])
            price = float(parts[2]) if len(parts) == 3 else None
        except ValueError:
            raise ZoError(f"--on {text!r}: GPUS is a whole number, PRICE a number") from None
        if gpus < 1 or (price is not None and not 0 <= price < 1e6):
            raise ZoError(f"--on {text!r}: GPUS >= 1 and 0 <= PRICE < 1e6 per GPU-hour")
        return cls(profile=parts[0], gpus=gpus, price=price)


@dataclass(frozen=True, kw_only=True)
class Priced:
    """One option's answer (`reason` set: nothing of it runs the job)."""

    option: Option
    name: str = ""
    reason: str = ""
    layout: str = ""
    used_gpus: int = 0
    step_s: float = 0.0
    step_range_s: tuple[float, float] = (0.0, 0.0)
    winner_stays: bool = True
    gpu_mem_bytes: float = 0.0
    host_mem_bytes: float = 0.0
    zo2_step_s: float | None = None
    zo2_fits: bool = True
    assumed: list[str] = field(default_factory=list)
    moving: list[str] = field(default_factory=list)

    def hours(self, steps: int = STEPS) -> tuple[float, float, float]:
        """(nominal, low, high) hours of `steps` steps."""
        low, high = self.step_range_s
        return self.step_s * steps / 3600, low * steps / 3600, high * steps / 3600

    def cost(self, steps: int = STEPS) -> tuple[float, float, float] | None:
        """(nominal, low, high) cost of `steps` steps on the GPUs the plan uses."""
        if self.option.price is None or self.reason:
            return None
        rate = self.option.price * self.used_gpus
        return tuple(h * rate for h in self.hours(steps))  # type: ignore[return-value]


def price_option(option: Option, *, model: str, batch: int, seq: int,
                 precision: str | None) -> Priced:
    """Plan the job on one option (the search, the winner's sensitivity, ZO2)."""
    req = resolve_request(model=model, gpus=option.gpus, profile=option.profile, batch=batch,
                          seq=seq, precision=precision)
    try:
        result = search(req)
    except ZoError as exc:
        return Priced(option=option, name=req.profile.name, reason=str(exc),
                      assumed=req.profile.assumed_figures())
    win, sens = result.winner, sensitivity(result)
    zo2 = result.zo2
    return Priced(option=option, name=req.profile.name, layout=win.label,
                  used_gpus=win.layout.world_size, step_s=float(win.step_time_s or 0.0),
                  step_range_s=_range(sens, float(win.step_time_s or 0.0)),
                  winner_stays=bool(sens["winner_stays"]), gpu_mem_bytes=win.memory.gpu_bytes,
                  host_mem_bytes=win.memory.host_bytes, zo2_step_s=zo2.step_time_s,
                  zo2_fits=zo2.memory.reason is None, assumed=req.profile.assumed_figures(),
                  moving=[f["figure"] for f in sens["figures"]])


def _range(sens: dict[str, Any], step: float) -> tuple[float, float]:
    nominal = sens["nominal_step_s"] or step
    return (step * sens["step_time_s"]["low"] / nominal, step * sens["step_time_s"]["high"] / nominal)


def rent(options: list[Option], *, model: str, batch: int, seq: int,
         precision: str | None = None) -> list[Priced]:
    """Every option priced, in the order given."""
    if not options:
        raise ZoError("give at least one machine: --on PROFILE:GPUS[:PRICE]")
    if len(options) > MAX_OPTIONS:
        raise ZoError(f"{len(options)} machines: at most {MAX_OPTIONS} at once")
    return [price_option(o, model=model, batch=batch, seq=seq, precision=precision)
            for o in options]
