"""Character-cell Gantt charts of one training step, drawn with rich.

A chart row is one lane (compute, h2d, collective, d2h) of one rank, or of a group of
ranks that draw identically. The chart's time window is cut into `cells` equal cells.

Cell rule: a cell shows the task kind that occupies most of its time on that lane: the
kind's full glyph when the lane is busy for at least half of the cell, the half glyph
"▄" (in the kind's colour) when it is busy for less, and a dim "·" when it is idle, so
idle gaps stay visible at any zoom; cells after the end of the drawn step are blank.

Critical path rule: start at the task that finishes last (the step's end) and walk back,
each time to the latest-finishing task that ended before the current one started among
its possible predecessors: every task of the same rank (any lane), plus the uploads of
the same block on the ranks of the slice group (for an all-gather), on the ranks of the
node (for a write-back: the write-back fence) and the heads of all ranks (for the final
all-reduce). Time between two tasks of the path is waiting.

Rank folding rule: ranks whose rows are identical at the chart's resolution share one
row set (lossless: the chart would show the same cells twice). Up to MAX_RANK_ROWS (16)
ranks, every remaining row set is drawn; with more ranks, when more than MAX_GROUPS (6)
row sets remain, the first MAX_GROUPS are drawn and the other ranks are summarised per
lane by the share of them busy in each cell (░ < 25 %, ▒ < 50 %, ▓ < 75 %, █ >= 75 %).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from rich.text import Text

from zoplan.layout import Layout
from zoplan.trace import Span

LABEL_WIDTH = 14            # rank label (9) + space + lane label (4)
RANK_LABEL_WIDTH = 9
MAX_RANK_ROWS = 16
MAX_GROUPS = 6
IDLE_GLYPH = "·"
PARTIAL_GLYPH = "▄"
WAIT_GLYPH = "─"
SHADES = "░▒▓█"
IDLE_STYLE = "bright_black"
LANE_LABEL = {"compute": "comp", "h2d": "h2d", "collective": "coll", "d2h": "d2h"}


@dataclass(frozen=True, kw_only=True)
class KindStyle:
    glyph: str
    colour: str


# Kinds on one lane get different glyphs, so the chart reads without colour too.
KIND_STYLE = {
    "embed": KindStyle(glyph="▚", colour="cyan"),
    "slice_update": KindStyle(glyph="▒", colour="magenta"),
    "update": KindStyle(glyph="▓", colour="magenta"),
    "forward": KindStyle(glyph="█", colour="blue"),
    "head": KindStyle(glyph="▞", colour="cyan"),
    "h2d": KindStyle(glyph="█", colour="green"),
    "allgather": KindStyle(glyph="█", colour="yellow"),
    "allreduce": KindStyle(glyph="▞", colour="dark_orange"),
    "d2h": KindStyle(glyph="█", colour="red"),
}

# A cell: (kind or None when idle, level 0 idle / 1 partly busy / 2 mostly busy).
Cell = tuple[str | None, int]
LaneRows = tuple[tuple[Cell, ...], ...]   # one rank's cells, a tuple per lane


@dataclass(frozen=True, kw_only=True)
class Window:
    """The chart's time window [start_s, end_s) cut into `cells` cells."""

    start_s: float
    end_s: float
    cells: int

    def __post_init__(self) -> None:
        if self.cells < 1:
            raise ValueError(f"cells must be >= 1, got {self.cells}")
        if not self.end_s > self.start_s:
            object.__setattr__(self, "end_s", self.start_s + 1e-9)

    @property
    def cell_s(self) -> float:
        return (self.end_s - self.start_s) / self.cells

    def cell_of(self, t: float) -> int:
        return int(math.floor((t - self.start_s) / self.cell_s))

    def overlaps(self, span: Span) -> list[tuple[int, float]]:
        """(cell, seconds of the span inside that cell) for every cell it touches."""
        start, end = max(span.start_s, self.start_s), min(span.end_s, self.end_s)
        if end <= start:
            return []
        origin, cell = self.start_s, self.cell_s
        first = min(self.cells - 1, max(0, int((start - origin) / cell)))
        last = min(self.cells - 1, int((end - origin) / cell))
        if first >= last:
            return [(first, end - start)]
        out = []
        for i in range(first, last + 1):
            lo = origin + i * cell
            seconds = min(end, lo + cell) - max(start, lo)
            if seconds > 0:
                out.append((i, seconds))
        return out


# ---- cells --------------------------------------------------------------------------
def lane_cells(spans: list[Span], window: Window, *,
               end_s: float = math.inf) -> tuple[Cell, ...]:
    """The cells of one lane (spans of one rank and lane) under the cell rule; cells
    wholly after `end_s` (the end of the drawn step) are blank, level -1."""
    per_cell: list[dict[str, float]] = [{} for _ in range(window.cells)]
    for span in spans:
        for i, seconds in window.overlaps(span):
            per_cell[i][span.kind] = per_cell[i].get(span.kind, 0.0) + seconds
    cells: list[Cell] = []
    for i, kinds in enumerate(per_cell):
        if not kinds:
            after = window.start_s + i * window.cell_s >= end_s
            cells.append((None, -1 if after else 0))
            continue
        kind = max(kinds, key=lambda k: (kinds[k], k))
        busy = sum(kinds.values()) / window.cell_s
        cells.append((kind, 2 if busy >= 0.5 else 1))
    return tuple(cells)


def rank_rows(spans: list[Span], ranks: list[int], lanes: list[str],
              window: Window) -> dict[int, LaneRows]:
    """rank -> one tuple of cells per lane."""
    by_key: dict[tuple[int, str], list[Span]] = {}
    for span in spans:
        by_key.setdefault((span.rank, span.lane), []).append(span)
    end_s = max((s.end_s for s in spans), default=math.inf)
    return {rank: tuple(lane_cells(by_key.get((rank, lane), []), window, end_s=end_s)
                        for lane in lanes)
            for rank in ranks}


def cells_text(cells: tuple[Cell, ...]) -> Text:
    glyphs: list[tuple[str, str]] = []
    for kind, level in cells:
        if kind is None:
            glyphs.append((IDLE_GLYPH, IDLE_STYLE) if level == 0 else (" ", ""))
        else:
            style = KIND_STYLE[kind]
            glyphs.append((style.glyph if level == 2 else PARTIAL_GLYPH, style.colour))
    return runs_text(glyphs)


def runs_text(glyphs: list[tuple[str, str]]) -> Text:
    """Text from (glyph, style) pairs, one span per run of equal style (small SVGs)."""
    text, run_style = Text(), None
    run: list[str] = []
    for glyph, style in glyphs:
        if style != run_style and run:
            text.append("".join(run), run_style)
            run = []
        run.append(glyph)
        run_style = style
    if run:
        text.append("".join(run), run_style)
    return text


def share_text(rows: list[LaneRows], lane_index: int) -> Text:
    """Summary row of one lane over many ranks: shade = share of them busy per cell."""
    glyphs: list[tuple[str, str]] = []
    cells = len(rows[0][lane_index]) if rows else 0
    for i in range(cells):
        kinds = [kind for row in rows if (kind := row[lane_index][i][0]) is not None]
        if not kinds:
            after = all(row[lane_index][i][1] < 0 for row in rows)
            glyphs.append((" ", "") if after else (IDLE_GLYPH, IDLE_STYLE))
            continue
        share = len(kinds) / len(rows)
        kind = max(set(kinds), key=lambda k: (kinds.count(k), k))
        glyphs.append((SHADES[min(3, int(share * 4))], KIND_STYLE[kind].colour))
    return runs_text(glyphs)


# ---- rank folding ---------------------------------------------------------------------
def rank_label(ranks: list[int]) -> str:
    """Compact label of a set of ranks: r3, r0-7, r0,2..62, or r5×12."""
    if len(ranks) == 1:
        return f"r{ranks[0]}"
    step = ranks[1] - ranks[0]
    arithmetic = all(b - a == step for a, b in zip(ranks, ranks[1:]))
    if arithmetic and step == 1:
        label = f"r{ranks[0]}-{ranks[-1]}"
    elif arithmetic:
        label = f"r{ranks[0]},{ranks[1]}..{ranks[-1]}"
    else:
        label = ""
    if not label or len(label) > RANK_LABEL_WIDTH:
        label = f"r{ranks[0]}×{len(ranks)}"
    return label


def fold_ranks(rows: dict[int, LaneRows]) -> tuple[list[list[int]], list[int], str]:
    """(row sets to draw, ranks summarised, the rule applied in words)."""
    ranks = sorted(rows)
    groups: dict[LaneRows, list[int]] = {}
    for rank in ranks:
        groups.setdefault(rows[rank], []).append(rank)
    ordered = sorted(groups.values(), key=lambda g: g[0])
    rule = (f"{len(ranks)} ranks drawn as {len(ordered)} row set(s): ranks whose rows "
            f"are identical share one" if len(ordered) < len(ranks) else "")
    limit = MAX_RANK_ROWS if len(ranks) <= MAX_RANK_ROWS else MAX_GROUPS
    if len(ordered) <= limit:
        return ordered, [], rule
    rest = sorted(r for group in ordered[limit:] for r in group)
    rule = (rule + "; " if rule else f"{len(ranks)} ranks: ")
    rule += (f"first {limit} row sets shown, the other {len(rest)} ranks summarised per lane "
             f"by the share busy ({SHADES[0]} <25% {SHADES[1]} <50% {SHADES[2]} <75% "
             f"{SHADES[3]} >=75%)")
    return ordered[:MAX_GROUPS], rest, rule


# ---- critical path --------------------------------------------------------------------
def critical_path(spans: list[Span], layout: Layout) -> list[Span]:
    """The chain of tasks that ends at the step's end (module docstring), in time order."""
    live = [s for s in spans if s.dur_s > 0]
    if not live:
        return []
    tol = 1e-9 + 1e-6 * (max(s.end_s for s in live) - min(s.start_s for s in live))
    index = _PredecessorIndex(live, layout)
    current = max(live, key=lambda s: (s.end_s, s.start_s))
    path, seen = [current], {id(current)}
    while (pred := index.latest_before(current, tol, seen)) is not None:
        path.append(pred)
        seen.add(id(pred))
        current = pred
    return path[::-1]


class _PredecessorIndex:
    """Spans indexed for the backward walk: per rank by end time, and by task."""

    def __init__(self, spans: list[Span], layout: Layout) -> None:
        self.layout = layout
        self.by_rank: dict[int, list[Span]] = {}
        for span in sorted(spans, key=lambda s: (s.end_s, s.start_s)):
            self.by_rank.setdefault(span.rank, []).append(span)
        self.ends = {r: [s.end_s for s in ss] for r, ss in self.by_rank.items()}
        self.task = {(s.kind, s.block, s.rank): s for s in spans}

    def candidates(self, span: Span) -> list[Span | None]:
        """Tasks of other ranks that this task waits for (module docstring)."""
        if span.kind == "allgather":   # the members' slices: uploaded, or updated
            ranks = self.layout.slice_group_ranks(span.rank)
            return [self.task.get((kind, span.block, r)) for r in ranks
                    for kind in ("h2d", "slice_update")]
        if span.kind == "d2h":
            node = self.layout.node_of(span.rank)
            first = node * self.layout.local_ranks
            return [self.task.get(("h2d", span.block, r))
                    for r in range(first, first + self.layout.local_ranks)]
        if span.kind == "allreduce":
            return [self.task.get(("head", span.block, r)) for r in self.by_rank]
        return []

    def latest_before(self, span: Span, tol: float, seen: set[int]) -> Span | None:
        best: Span | None = None
        same_rank = self.by_rank.get(span.rank, [])
        i = bisect.bisect_right(self.ends.get(span.rank, []), span.start_s + tol)
        for cand in reversed(same_rank[:i]):
            if id(cand) not in seen and cand.start_s < span.start_s + tol:
                best = cand
                break
        for other in self.candidates(span):
            if (other is not None and id(other) not in seen and other.end_s <= span.start_s + tol
                    and (best is None or other.end_s > best.end_s + tol)):
                best = other
        return best


def critical_cells(path: list[Span], window: Window) -> tuple[Cell, ...]:
    """Cells of the critical path row: the path's kind in each cell, waiting between."""
    cells = list(lane_cells(path, window))
    if path:
        first = max(0, window.cell_of(path[0].start_s))
        last = min(window.cells - 1, window.cell_of(path[-1].end_s - 1e-15))
        for i in range(first, last + 1):
            if cells[i][0] is None:
                cells[i] = ("wait", 0)
    return tuple(cells)


def critical_text(cells: tuple[Cell, ...]) -> Text:
    glyphs: list[tuple[str, str]] = []
    for kind, level in cells:
        if kind == "wait":
            glyphs.append((WAIT_GLYPH, IDLE_STYLE))
        elif kind is None:
            glyphs.append((" ", ""))
        else:
            style = KIND_STYLE[kind]
            glyph = style.glyph if level == 2 else PARTIAL_GLYPH
            glyphs.append((glyph, f"bold {style.colour}"))
    return runs_text(glyphs)


def critical_breakdown(path: list[Span]) -> dict[str, float]:
    """Seconds of the critical path per task kind, plus "wait" for the gaps."""
    out: dict[str, float] = {}
    previous: list[Span | None] = [None, *path[:-1]]
    for prev, span in zip(previous, path):
        out[span.kind] = out.get(span.kind, 0.0) + span.dur_s
        if prev is not None and span.start_s > prev.end_s:
            out["wait"] = out.get("wait", 0.0) + span.start_s - prev.end_s
    return out


# ---- time axis ------------------------------------------------------------------------
def time_unit(seconds: float) -> tuple[str, float]:
    """(unit, seconds per unit) for an axis spanning `seconds`."""
    if seconds >= 2.0:
        return "s", 1.0
    if seconds >= 2e-3:
        return "ms", 1e-3
    return "µs", 1e-6


def tick_step(span_units: float, max_ticks: int) -> float:
    """Smallest 1-2-5 x 10^k step giving at most max_ticks intervals."""
    raw = span_units / max(1, max_ticks)
    base = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    for mult in (1, 2, 5, 10):
        if mult * base >= raw:
            return mult * base
    return 10 * base


def axis_lines(window: Window) -> list[Text]:
    """Two lines: the axis with tick marks, and the tick labels with the unit."""
    unit, scale = time_unit(window.end_s - window.start_s)
    lo, hi = window.start_s / scale, window.end_s / scale
    step = tick_step(hi - lo, max(1, window.cells // 9))
    decimals = max(0, -math.floor(math.log10(step))) if step < 1 else 0
    marks = ["─"] * window.cells
    labels = [" "] * window.cells
    free_from = 0
    tick = math.ceil(lo / step - 1e-9) * step
    while tick <= hi + 1e-9 * step:
        col = min(window.cells - 1, int(round((tick - lo) / (hi - lo) * window.cells)))
        marks[col] = "┬"
        label = f"{tick:.{decimals}f}"
        if col >= free_from and col + len(label) <= window.cells:
            labels[col:col + len(label)] = label
            free_from = col + len(label) + 1
        tick += step
    axis = Text(" " * LABEL_WIDTH + "└" + "".join(marks), IDLE_STYLE)
    caption = Text(f"{'time [' + unit + ']':>{LABEL_WIDTH}} " + "".join(labels))
    return [axis, caption]


def block_line(spans: list[Span], window: Window, rank: int) -> Text | None:
    """Block numbers at the start of each forward of `rank` (where they fit)."""
    forwards = sorted((s for s in spans if s.kind == "forward" and s.rank == rank),
                      key=lambda s: s.start_s)
    chars, free_from, placed = [" "] * window.cells, 0, 0
    for span in forwards:
        col = window.cell_of(span.start_s)
        label = str(span.block)
        if 0 <= col and col >= free_from and col + len(label) <= window.cells:
            chars[col:col + len(label)] = label
            free_from, placed = col + len(label) + 1, placed + 1
    if not placed:
        return None
    label = f"block r{rank}"
    return Text(f"{label:<{LABEL_WIDTH}} " + "".join(chars), IDLE_STYLE)


def legend(kinds: set[str], *, summary: bool, width: int) -> Text:
    """The glyphs and colours, packed into lines of at most `width` columns."""
    items = [(style.glyph, style.colour, kind) for kind, style in KIND_STYLE.items()
             if kind in kinds]
    items += [(PARTIAL_GLYPH, "", "busy < half a cell"), (IDLE_GLYPH, IDLE_STYLE, "idle"),
              (WAIT_GLYPH, IDLE_STYLE, "waiting (critical path)")]
    if summary:
        items.append((SHADES, "", "share of ranks busy"))
    text, used = Text(), 0
    for glyph, style, label in items:
        size = len(glyph) + 1 + len(label)
        if used and used + 2 + size > width:
            text.append("\n")
            used = 0
        elif used:
            text.append("  ")
            used += 2
        text.append(glyph, style)
        text.append(f" {label}")
        used += size
    return text


# ---- the chart ------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Chart:
    """A drawn chart: its lines (each exactly LABEL_WIDTH + 1 + cells wide) and notes."""

    lines: list[Text]
    notes: list[str]
    summarised: bool


def draw_chart(*, spans: list[Span], ranks: list[int], lanes: list[str], window: Window,
               critical: list[Span] | None, blocks_row: bool = True) -> Chart:
    """Rows per rank (folded per the module rule), the critical path row and the axis."""
    rows = rank_rows(spans, ranks, lanes, window)
    groups, rest, rule = fold_ranks(rows)
    lines: list[Text] = []
    if blocks_row and groups and (row := block_line(spans, window, groups[0][0])):
        lines.append(row)
    for group in groups:
        for i, lane in enumerate(lanes):
            label = rank_label(group) if i == 0 else ""
            lines.append(_row(label, LANE_LABEL[lane], cells_text(rows[group[0]][i])))
    for i, lane in enumerate(lanes):
        if rest:
            label = f"+{len(rest)} ranks" if i == 0 else ""
            lines.append(_row(label, LANE_LABEL[lane], share_text([rows[r] for r in rest], i)))
    if critical is not None:
        lines.append(_row("critical", "path", critical_text(critical_cells(critical, window))))
    lines.extend(axis_lines(window))
    notes = [rule] if rule else []
    notes += _group_notes(groups)
    return Chart(lines=lines, notes=notes, summarised=bool(rest))


def _row(rank_part: str, lane_part: str, cells: Text) -> Text:
    line = Text()
    line.append(f"{rank_part[:RANK_LABEL_WIDTH]:<{RANK_LABEL_WIDTH}}", "bold")
    line.append(f" {lane_part:<4}")
    line.append("│", IDLE_STYLE)
    line.append_text(cells)
    return line


def _group_notes(groups: list[list[int]]) -> list[str]:
    """Spell out the members of groups whose label had to be abbreviated."""
    notes = []
    for group in groups:
        label = rank_label(group)
        if "×" in label:
            notes.append(f"{label} = ranks {span_label(group)}")
    return notes


def span_label(indices: list[int]) -> str:
    """0,1,2,3,7 -> "0-3,7"."""
    parts, start = [], None
    for i, value in enumerate(indices):
        if start is None:
            start = value
        if i + 1 == len(indices) or indices[i + 1] != value + 1:
            parts.append(str(start) if start == value else f"{start}-{value}")
            start = None
    return ",".join(parts)
