"""Sizes, durations and wall-clock times as the monitoring commands write them for people."""

from __future__ import annotations

import time


def format_bytes(n: int) -> str:
    """``512 B``, ``32 KiB``, ``3.9 MiB`` (binary units, one decimal where it matters)."""
    sign = "-" if n < 0 else ""
    value = float(abs(n))
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            if unit == "B":
                return f"{sign}{int(value)} B"
            text = f"{value:.1f}".rstrip("0").rstrip(".")
            return f"{sign}{text} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_duration(ms: int) -> str:
    """``850 ms``, ``12.3 s``, ``4 min 5 s``, ``3 h 2 min``."""
    if ms < 1000:
        return f"{ms} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    seconds = ms // 1000
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def format_time(ms: int) -> str:
    """Local wall-clock time of an epoch ms, with milliseconds."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000)) + f".{ms % 1000:03d}"
