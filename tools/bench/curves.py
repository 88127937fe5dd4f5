"""Latency as percentile curves: the percentiles a benchmark keeps of its round-trip samples,
and the plot of them (x: percentile 50 to 99.9 on an axis that spreads the tail, y:
microseconds, one line per row).

Runs in a benchmark's parent process; matplotlib (Agg backend) is imported only to plot.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tools.bench.pages import save_plot

#: the percentiles kept of each run's samples, and plotted
PERCENTILES = (50.0, 75.0, 90.0, 95.0, 99.0, 99.5, 99.9)


def curve_us(samples_ns: Any, warmup_fraction: float = 0.1, max_warmup: int = 1000
             ) -> dict[str, float]:
    """The PERCENTILES of round-trip samples (ns) in microseconds, keyed by the percentile as
    text ("99.9"), with the same warm-up left out as harness.percentiles_us (the first
    ``warmup_fraction`` of the samples, at most ``max_warmup``). Empty for no samples."""
    samples = np.asarray(samples_ns, dtype=np.int64)
    kept = samples[min(max_warmup, int(len(samples) * warmup_fraction)):]
    if not len(kept):
        return {}
    values = np.percentile(kept / 1000.0, PERCENTILES)
    return {f"{p:g}": float(v) for p, v in zip(PERCENTILES, values, strict=True)}


def tail_axis(percentile: float) -> float:
    """Where a percentile sits on the x axis: -log10 of the fraction above it (50 -> 0.3,
    99 -> 2, 99.9 -> 3), so that each nine gets the same width."""
    return -math.log10(1.0 - percentile / 100.0)


def plot_curves(path: str | Path, panels: Sequence[tuple[str, Sequence[tuple[str,
                dict[str, float]]]]], title: str) -> Path:
    """Write a PNG to ``path``: one panel per (panel title, lines), each line a (label, curve)
    with curve as curve_us gives it (median over runs); y on a log scale. Returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = 1 if len(panels) == 1 else 2
    rows = math.ceil(len(panels) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(6.5 * columns, 4.2 * rows),
                                squeeze=False)
    ticks = [tail_axis(p) for p in PERCENTILES]
    for ax, (name, lines) in zip(axes.flat, panels, strict=False):
        for label, curve in lines:
            points = [(tail_axis(float(p)), v) for p, v in curve.items()]
            if points:
                xs, ys = zip(*sorted(points), strict=True)
                ax.plot(xs, ys, marker="o", markersize=3, label=label)
        ax.set_xticks(ticks, [f"{p:g}" for p in PERCENTILES])
        ax.set_yscale("log")
        ax.set_xlabel("percentile")
        ax.set_ylabel("round trip, us")
        ax.set_title(name, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    figure.suptitle(title)
    return save_plot(figure, path)
