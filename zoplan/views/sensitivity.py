"""What `zoplan optimize` prints of a plan's sensitivity section
(zoplan.search.sensitivity): the step as a range where the profile's assumed figures
move it more than a few percent, the figures that move it most, the ZO2 ratio the
same way, and whether the winning layout stays the winner across that range."""

from __future__ import annotations

from typing import Any

from zoplan.hardware import GIB

SHOWN_AT = 0.03   # the step is printed as a range once assumptions move it this much
FIGURES_SHOWN = 6


def _secs(seconds: float) -> str:
    return f"{seconds:.3f}" if seconds < 100 else f"{seconds:.1f}"


def _value(value: Any) -> str:
    return "table" if isinstance(value, list) else f"{value:g}"


def figure_line(f: dict[str, Any], nominal: float, nominal_mem: float) -> str:
    """One assumed figure: its value, its range, and the step (and the memory, where it
    moves) at each end; the range's reason is in plan.json and docs/planner.md."""
    parts = []
    for end in ("low", "high"):
        step = f.get(f"step_{end}_s")
        bound = _value(f[end])
        if step is None:
            parts.append(f"{bound}: does not fit")
            continue
        move = f"step {step / nominal - 1:+.1%}" if nominal else "-"
        mem = f.get(f"gpu_mem_{end}_bytes")
        if mem and abs(mem - nominal_mem) >= 0.005 * nominal_mem:
            move += f", memory {mem / GIB:.1f} GiB"
        parts.append(f"{bound}: {move}")
    return f"  {f['figure']} {_value(f['value'])} -> " + "; ".join(parts)


def sensitivity_lines(d: dict[str, Any]) -> list[str]:
    """The lines under the winner's summary (none for a plan without the section)."""
    sens = d.get("sensitivity")
    if not sens:
        return []
    step = d["predicted"]["step_time_s"]
    nominal = sens["nominal_step_s"] or step
    low = step * sens["step_time_s"]["low"] / nominal
    high = step * sens["step_time_s"]["high"] / nominal
    figures = sens["figures"]
    if not figures:
        return ["assumptions: no assumed figure of the profile moves the step or the "
                "memory by 0.5% or more"]
    spread = max(step - low, high - step) / step
    stays = ("the winning layout stays the winner across it"
             if sens["winner_stays"] else "the winner does NOT stay the winner across it")
    runner = (f" (runner-up {sens['runner_up']})" if sens.get("runner_up") else "")
    if spread >= SHOWN_AT:
        head = (f"[bold]step {_secs(low)}-{_secs(high)} s[/] with the profile's assumed figures "
                f"across their plausible ranges ({_secs(step)} s as given); {stays}{runner}")
    else:
        head = (f"step {_secs(step)} s moves less than {SHOWN_AT:.0%} across the assumed "
                f"figures' ranges ({_secs(low)}-{_secs(high)} s); {stays}{runner}")
    lines = [head]
    mem = sens.get("gpu_mem_bytes")
    if mem and mem["low"] != mem["high"]:
        lines.append(f"GPU memory {mem['low'] / GIB:.1f}-{mem['high'] / GIB:.1f} GiB across them")
    ratio = sens.get("zo2_ratio")
    if ratio:
        lines.append(f"over ZO2: {ratio['low']:.2f}x-{ratio['high']:.2f}x across them")
    over_mezo = sens.get("mezo_ratio")
    if over_mezo:
        lines.append(f"over MeZO-SGD on the winner's layout: {over_mezo['low']:.2f}x-"
                     f"{over_mezo['high']:.2f}x across them")
    lines.append("assumed figures that move it (each alone, at the low and the high end):")
    mem_now = float(d["predicted"]["gpu_mem_bytes"])
    lines += [figure_line(f, nominal, mem_now) for f in figures[:FIGURES_SHOWN]]
    if len(figures) > FIGURES_SHOWN:
        lines.append(f"  and {len(figures) - FIGURES_SHOWN} more (plan.json: sensitivity)")
    return lines
