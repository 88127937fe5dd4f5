"""The text ``shmbus stat``, ``clients`` and ``errors`` print for people: the header line
(the driver, its heartbeat age, STALE and why), rich tables and the error log's lines.
``shmbus streams`` prints each view's own line (:meth:`StreamView.line
<shmbus.cli.stream_views.StreamView.line>`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from rich import box
from rich.table import Table
from rich.text import Text

from shmbus.cli.bus_status import RUNNING, BusStatus
from shmbus.cli.client_views import ALIVE, ClientView
from shmbus.cli.counter_views import CounterView
from shmbus.cli.formatting import format_bytes, format_duration, format_time
from shmbus.cli.snapshot import BusSnapshot
from shmbus.shm.error_log import ErrorObservation


def header_line(command: str, snapshot: BusSnapshot, status: BusStatus) -> str:
    """``12:00:01 - shmbus stat - <dir> - driver pid 42, heartbeat age 5 ms, layout v1, up
    3 s``, and a second line ``STALE: <why>`` for a stale bus."""
    driver = snapshot.driver
    clock = time.strftime("%H:%M:%S", time.localtime(snapshot.time_ms / 1000))
    up = format_duration(max(0, snapshot.time_ms - driver.start_time_ms))
    line = (f"{clock} - shmbus {command} - {snapshot.directory} - driver pid {driver.pid}, "
            f"heartbeat age {format_duration(status.heartbeat_age_ms)}, layout v"
            f"{driver.layout_version}, up {up}")
    if status.state != RUNNING:
        line += f"\nSTALE: {status.reason}"
    return line


def counters_table(views: Sequence[CounterView], title: str | None = None) -> Table:
    """The ``shmbus stat`` table: one row per counter, with its rate of change."""
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("id", justify="right")
    table.add_column("type")
    table.add_column("value", justify="right")
    table.add_column("rate/s", justify="right")
    table.add_column("stream", justify="right")
    table.add_column("session", justify="right")
    table.add_column("client")
    table.add_column("label", overflow="fold")
    for view in views:
        c = view.counter
        rate = "" if view.rate is None else f"{view.rate:,.0f}"
        client = " ".join(str(part) for part in (view.client_pid, view.client_name) if part)
        table.add_row(str(c.counter_id), c.type_name, f"{c.value:,}", rate,
                      "" if view.stream_id is None else str(view.stream_id),
                      "" if view.session_id is None else str(view.session_id),
                      client.strip(), c.label)
    return table


def clients_table(clients: Sequence[ClientView]) -> Table:
    """The ``shmbus clients`` table; gone and timed-out clients are flagged in red."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for name, justify in (("pid", "right"), ("name", "left"), ("state", "left"),
                          ("heartbeat age", "right"), ("CPU%", "right"), ("RSS", "right"),
                          ("streams", "left"), ("command line", "left")):
        table.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for view in clients:
        process = view.process
        state = view.state.upper() if view.state != ALIVE else view.state
        if view.reason:
            state += f": {view.reason}"
        style = "bold red" if view.state != ALIVE else ""
        cpu = "" if process is None or process.cpu_percent is None else (
            f"{process.cpu_percent:.1f}")
        rss = "" if process is None or process.rss is None else format_bytes(process.rss)
        streams = [f"pub {s}/{session}" for s, session in view.publications]
        streams += [f"sub {s}" for s in view.subscriptions]
        cmdline = " ".join(process.cmdline) if process is not None else ""
        table.add_row(str(view.client.pid or "-"), view.client.name, Text(state, style=style),
                      format_duration(view.heartbeat_age_ms), cpu, rss, ", ".join(streams),
                      cmdline)
    return table


def error_lines(errors: Sequence[ErrorObservation]) -> list[str]:
    """The ``shmbus errors`` text: a summary line, then each error with its count and times."""
    if not errors:
        return ["no errors"]
    total = sum(e.observation_count for e in errors)
    lines = [f"{len(errors)} distinct error{'s' if len(errors) != 1 else ''}, "
             f"{total} observation{'s' if total != 1 else ''}"]
    for e in errors:
        lines.append("")
        lines.append(f"{e.observation_count} x, first {format_time(e.first_observation_ms)}, "
                     f"last {format_time(e.last_observation_ms)}")
        lines.extend(f"    {line}" for line in e.text.splitlines() or [""])
    return lines
