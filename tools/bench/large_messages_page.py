"""The dated page of tools/bench/large_messages.py: what each row does, its tables (median and
spread of the repeated runs), the issue's two target ratios, and a plot.

Called by ``large_messages.main`` with ``--page DIR`` once every run is done: :func:`write`
puts ``DIR/large_messages.md`` (through :func:`tools.bench.pages.write_page`) and
``DIR/large_messages.png`` beside it. Ratios are only taken between rows of one kind (in place
with in place, copying with copying), at one size and reader count.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tools.bench import pages
from tools.bench.large_message_rows import COPYING, IN_PLACE, RING_SLOTS, TARGETS, Row

NAME = "large_messages"
TITLE = "Large messages: tools/bench/large_messages.py"
MODULE = "tools.bench.large_messages"


def _gb(v: float) -> str:
    return f"{v:.2f}"


def _us(v: float) -> str:
    return f"{v:,.0f}"


def _find(table: list[dict[str, Any]], key: str, mib: float, readers: int) -> dict[str, Any]:
    return next((r for r in table if r["method"] == key and r["mib"] == mib
                 and r["readers"] == readers), {})


def _spread(row: dict[str, Any], figure: str) -> pages.Spread | None:
    return pages.spread(row.get(f"{figure}_runs", []))


def paired_ratio(a: dict[str, Any], b: dict[str, Any]) -> pages.Spread | None:
    """The spread of ``a``'s GB/s over ``b``'s, run by run (the runs are interleaved, so run i
    of both met the same load); None when no run of both succeeded."""
    return pages.spread(x / y for x, y in zip(a.get("gb_s_runs", []), b.get("gb_s_runs", []),
                                              strict=False)
                        if x is not None and y is not None and y > 0)


def target_size(sizes: Sequence[float]) -> float:
    """The size the targets are read at: 64 MiB, or the largest measured without it."""
    return 64.0 if 64 in sizes else max(sizes)


def targets(table: list[dict[str, Any]], by_key: dict[str, Row], sizes: Sequence[float],
            reader_counts: Sequence[int]) -> str:
    """The section on the issue's targets: each ratio, run by run, and whether it is met."""
    mib = target_size(sizes)
    lines = ["## Targets", ""]
    if mib != 64:
        lines += [f"64 MiB is not in this run: the ratios are read at {mib:g} MiB.", ""]
    lines += ["| target | readers | ratio of GB/s, median (min-max over runs) | met |",
              "| --- | --- | --- | --- |"]
    for key, base, at_least in TARGETS:
        if key not in by_key or base not in by_key:
            continue
        for readers in reader_counts:
            ratio = paired_ratio(_find(table, key, mib, readers), _find(table, base, mib, readers))
            met = "n/a" if ratio is None else ("yes" if ratio.median >= at_least else "no")
            lines.append(f"| {by_key[key].name} >= {at_least:g} x {by_key[base].name}, "
                         f"{mib:g} MiB | {readers} | {pages.fmt_spread(ratio, _gb)} | {met} |")
    lines += ["", "A target is met when the median of the run-by-run ratios reaches it."]
    return "\n".join(lines)


def tables(table: list[dict[str, Any]], rows: Sequence[Row], sizes: Sequence[float],
           reader_counts: Sequence[int]) -> str:
    """A table per reader count and kind of row: GB/s and hand-over p50 as median (min-max),
    the rest as medians over the runs."""
    out = []
    for readers in reader_counts:
        for kind in (IN_PLACE, COPYING):
            kept = [r for r in rows if r.kind == kind]
            if not kept:
                continue
            out += [f"### {readers} readers, {kind}", "",
                    "| row | MiB | GB/s | x best peer | hand-over p50 us | hand-over max us "
                    "| first array ms | writer fill ms | cpu-s/GB | peak /dev/shm MiB |",
                    "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
            for mib in sizes:
                best = max((f["gb_s"] for r in kept if not r.shmbus
                            if (f := _find(table, r.key, mib, readers)).get("gb_s")),
                           default=None)
                for r in kept:
                    f = _find(table, r.key, mib, readers)
                    if not f.get("gb_s"):
                        why = "; ".join(sorted(set(f.get("errors", [])))) or "not run"
                        out.append(f"| {r.name} | {mib:g} | n/a: {why} | | | | | | | |")
                        continue
                    x = f"{f['gb_s'] / best:.2f}" if best else "-"
                    failed = len(f["errors"])
                    note = f" ({failed} of {f['runs']} runs failed)" if failed else ""
                    out.append(
                        f"| {r.name}{note} | {mib:g} | {pages.fmt_spread(_spread(f, 'gb_s'), _gb)}"
                        f" | {x} | {pages.fmt_spread(_spread(f, 'p50_us'), _us)}"
                        f" | {_us(f['max_us'])} | {f['first_ms']:.1f} | {f['fill_ms']:.2f}"
                        f" | {f['cpu_s_per_gb']:.2f} | {f['peak_shm_mib']:.0f} |")
            out.append("")
    return "\n".join(out)


def plot(path: Path, table: list[dict[str, Any]], rows: Sequence[Row], sizes: Sequence[float],
         reader_counts: Sequence[int]) -> None:
    """GB/s (top) and hand-over p50 (bottom) by size, a column per reader count, a line per
    row (solid in place, dashed copying), error bars from the lowest to the highest run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(reader_counts), figsize=(6 * len(reader_counts), 8),
                             squeeze=False)
    for col, readers in enumerate(reader_counts):
        for figure, ax in (("gb_s", axes[0][col]), ("p50_us", axes[1][col])):
            for r in rows:
                found = [(mib, s) for mib in sizes
                         if (s := _spread(_find(table, r.key, mib, readers), figure))]
                if not found:
                    continue
                xs = [mib for mib, _ in found]
                ys = [s.median for _, s in found]
                err = [[s.median - s.low for _, s in found], [s.high - s.median for _, s in found]]
                ax.errorbar(xs, ys, yerr=err, capsize=3, marker="o", label=r.name,
                            linestyle="-" if r.kind == IN_PLACE else "--")
            ax.set_xscale("log", base=2)
            ax.set_xticks(list(sizes), [f"{mib:g}" for mib in sizes])
            ax.set_xlabel("array MiB")
            if figure == "gb_s":
                ax.set_title(f"{readers} readers")
                ax.set_ylabel("GB/s read and checked (all readers)")
            else:
                ax.set_yscale("log")
                ax.set_ylabel("hand-over p50, us")
            ax.grid(True, alpha=0.3)
    axes[0][0].legend(fontsize=7)
    pages.save_plot(fig, path)


def body(table: list[dict[str, Any]], rows: Sequence[Row], sizes: Sequence[float],
         reader_counts: Sequence[int], runs: int) -> str:
    """The page below its head: what every row does, the targets, the tables, the plot."""
    by_key = {r.key: r for r in rows}
    sizes_text = ", ".join(f"{mib:g}" for mib in sizes)
    readers_text = " and ".join(str(n) for n in reader_counts)
    lines = [
        "",
        f"One writer process sends numpy arrays of {sizes_text} MiB to {readers_text} reader "
        "processes.",
        f"Each row is measured {runs} times, interleaved: every row once, then every row "
        "again. Each figure is the median, with the lowest and highest run in brackets.",
        "",
        "Every row does the same work.",
        "Each array holds uint64 `ramp + seq`: `ramp` is `0 .. n-1` and `seq` the array's "
        "sequence number.",
        "The writer writes every element of every array with `np.add(ramp, seq, out=...)`.",
        "Every reader sums every element of every array it gets (uint64, wrapping).",
        "It compares the sum with the closed form `n(n-1)/2 + n*seq`.",
        "A wrong, stale or torn array changes the sum and fails the row.",
        "Warm-up arrays (64 MiB's worth, at least 2) go first; the measured ones start once "
        "every reader has read them.",
        "",
        "## Rows",
        "",
        "In place: the writer fills the transport's own memory.",
        "",
    ]
    lines += [f"* *{r.name}*: {r.does}." for r in rows if r.kind == IN_PLACE]
    lines += ["", "Copying: the writer fills a source array of its own, then hands it over.", ""]
    lines += [f"* *{r.name}*: {r.does}." for r in rows if r.kind == COPYING]
    lines += [
        "",
        "Ratios are taken only between rows of one kind.",
        f"Each shared_memory ring has {RING_SLOTS} slots: at most {RING_SLOTS} arrays in "
        "flight.",
        "",
        "## What the columns mean",
        "",
        "* *GB/s*: bytes read and checked by all readers, over the time from the end of the "
        "warm-up to the last reader's last check.",
        "* *x best peer*: the row's median GB/s over the best peer row of its kind, at that "
        "size and reader count.",
        "* *hand-over*: from a stamp before the writer's first call for the array to the "
        "reader holding it, before it sums.",
        "  For in-place rows the stamp is before the claim, loan or wait for a free slot, so "
        "the fill is inside.",
        "  For copying rows it is after the source's fill, before publish, send, put or "
        "copy-in.",
        "  Every hand-over is checked to be >= 0.",
        "* *first array*: the hand-over of the first warm-up array, into cold memory.",
        "* *writer fill*: the median time of the writer's `np.add` into the array.",
        "* *cpu-s/GB*: user and system seconds of every process per GB delivered (the shmbus "
        "driver too), warm-up included.",
        "* *peak /dev/shm*: the most /dev/shm held above the start, sampled every 2 ms.",
        "",
        targets(table, by_key, sizes, reader_counts),
        "",
        "## Tables",
        "",
        tables(table, rows, sizes, reader_counts),
        f"![GB/s and hand-over p50 by array size]({NAME}.png)",
        "",
    ]
    return "\n".join(lines)


def write(directory: str | os.PathLike[str], setting: pages.Setting,
          table: list[dict[str, Any]], rows: Sequence[Row], sizes: Sequence[float],
          reader_counts: Sequence[int], runs: int) -> Path:
    """Write ``directory/large_messages.md`` and its plot ``large_messages.png``; returns the
    page's path."""
    Path(directory).mkdir(parents=True, exist_ok=True)
    plot(Path(directory) / f"{NAME}.png", table, rows, sizes, reader_counts)
    return pages.write_page(directory, NAME, TITLE, MODULE, setting,
                            body(table, rows, sizes, reader_counts, runs))
