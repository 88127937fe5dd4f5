"""How the benchmarks report: table cells, markdown and text tables, ratios between rows, and
where a run happened. Pure functions over result rows (dicts with at least ``status``: "ok",
"n/a" or "failed"); they run in a benchmark's parent process.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any

Row = dict[str, Any]


def add_ratios(rows: list[Row], field: str, is_base: Callable[[Row], bool],
               key: Callable[[Row], Hashable], ratio: Callable[[Row, Row], float]) -> None:
    """Set ``row[field] = ratio(row, base)`` on every ok row that has a base: of the ok rows
    for which ``is_base`` holds and whose ``key`` equals the row's, the one with the most
    ``msgs_per_s`` (the first one when the rows have no rate, e.g. round trips)."""
    bases: dict[Hashable, Row] = {}
    for r in rows:
        if r["status"] == "ok" and is_base(r):
            best = bases.get(key(r))
            if best is None or r.get("msgs_per_s", 0) > best.get("msgs_per_s", 0):
                bases[key(r)] = r
    for r in rows:
        base = bases.get(key(r))
        if r["status"] == "ok" and base is not None:
            r[field] = ratio(r, base)


def size_name(size: int) -> str:
    """A message size as a table says it: 4 KiB, 1 KiB, 32 B."""
    return f"{size // 1024} KiB" if size >= 1024 and size % 1024 == 0 else f"{size} B"


def fmt(value: Any, digits: int = 0) -> str:
    """A table cell: "-" for None, floats with thousands separators and ``digits`` decimals."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def fmt_rate(value: float | None) -> str:
    """A rate as 2.13 M / 180 k / 6.4 k / 950."""
    if value is None:
        return "-"
    if value >= 1e6:
        return f"{value / 1e6:.2f} M"
    if value >= 1e3:
        return f"{value / 1e3:.{0 if value >= 1e4 else 1}f} k"
    return f"{value:.0f}"


def markdown_table(headers: Sequence[str], lines: Sequence[Sequence[str]],
                   right: Iterable[int] = ()) -> str:
    """A markdown (GitHub) table; columns whose index is in ``right`` right-aligned."""
    right = set(right)
    rule = [("---:" if i in right else "---") for i in range(len(headers))]

    def row(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    return "\n".join([row(headers), "| " + " | ".join(rule) + " |", *map(row, lines)])


def text_table(headers: Sequence[str], lines: Sequence[Sequence[str]], right: Iterable[int],
               groups: Sequence[Any]) -> str:
    """A plain text table: headers, a rule, one line per row, the columns whose index is in
    ``right`` right-aligned; a blank line where the group key (one per row) changes."""
    right = set(right)
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(headers)]

    def render(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    out = [render(headers), render(["-" * w for w in widths])]
    previous = None
    for group, line in zip(groups, lines, strict=True):
        if previous is not None and group != previous:
            out.append("")
        previous = group
        out.append(render(line))
    return "\n".join(out)


def machine() -> dict[str, Any]:
    """Where a benchmark ran: python, platform, CPUs and the load average now."""
    return {"python": platform.python_version(), "platform": platform.platform(),
            "cpus": os.cpu_count(), "load": os.getloadavg()[0]}
