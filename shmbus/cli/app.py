"""The ``shmbus`` command line (typer): a thin layer over the library."""

from __future__ import annotations

import errno
import json
import os
import sys
from typing import Annotated, Any

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from shmbus.cli import snapshot as bussnapshot
from shmbus.cli.bus_status import EXIT_NO_BUS, EXIT_OK, RUNNING, BusStatus, check_bus
from shmbus.cli.client_views import client_processes_wanted, list_clients
from shmbus.cli.counter_views import describe_counters, filter_counters, parse_type
from shmbus.cli.json_documents import STAT_JSON_EXAMPLE, document, errors_json
from shmbus.cli.processes import probe_processes
from shmbus.cli.rendering import clients_table, counters_table, error_lines, header_line
from shmbus.cli.services import analyse_services
from shmbus.cli.stream_analysis import analyse_streams
from shmbus.driver.media_driver import DriverAlreadyRunningError, run_driver
from shmbus.settings.context import Context
from shmbus.settings.keyring import KeyringError, keyring_path, load_keyring, new_key_line

app = typer.Typer(help="shmbus: a shared-memory message bus (Aeron's design, in Python).",
                  no_args_is_help=True, add_completion=False)

@app.callback()
def _group() -> None:
    """shmbus: a shared-memory message bus (Aeron's design, in Python)."""


DirOption = Annotated[str | None, typer.Option("--dir", help="bus directory (default: "
                                                "$SHMBUS_DIR or /dev/shm/shmbus-$USER)")]


@app.command()
def driver(
    dir: DirOption = None,
    idle_timeout: Annotated[float | None, typer.Option(
        help="exit after this many seconds without a client (default: run until stopped)")] = None,
    term_length: Annotated[int | None, typer.Option(help="IPC term length in bytes")] = None,
) -> None:
    """Run a driver in the foreground; Ctrl-C stops it and removes its files."""
    settings: dict[str, object] = {"dir": dir, "ipc_term_length": term_length}
    if idle_timeout is not None:
        settings["driver_idle_timeout"] = idle_timeout
    context = Context.resolve(**settings)
    typer.echo(f"shmbus driver serving {context.dir} (Ctrl-C to stop)", err=True)
    try:
        run_driver(context, embedded=idle_timeout is not None)
    except (DriverAlreadyRunningError, PermissionError, OSError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    typer.echo("shmbus driver stopped", err=True)


# -- looking at a bus: stat, streams, clients, errors (a thin layer over the views in shmbus.cli) -

JsonOption = Annotated[bool, typer.Option("--json", help="print one JSON document (shape: "
                                          "below; every field is described by its JSON Schema, "
                                          "shmbus/cli/schema/<command>.schema.json)")]
_JSON_COMMON = ('{"command": ..., "time_ms": ..., "directory": ..., "bus": {...as in '
                '`shmbus stat --help`...}, ')


def _bus_settings(dir: str | None) -> tuple[str, int]:
    """The bus directory and the driver timeout (ms) beyond which a bus is stale."""
    context = Context.resolve(dir=dir)
    return context.dir, int(context.driver_timeout * 1000)


def _console() -> Console:
    # no line wrapping when piped or captured: one stream per line stays one line
    return Console(highlight=False, markup=False,
                   width=None if sys.stdout.isatty() else 240)


def _read(dir: str | None, *, errors: bool = False
          ) -> tuple[bussnapshot.BusSnapshot, BusStatus]:
    directory, timeout_ms = _bus_settings(dir)
    try:
        snapshot = bussnapshot.read_snapshot(directory, errors=errors)
    except bussnapshot.BusNotFoundError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(EXIT_NO_BUS) from None
    return snapshot, check_bus(snapshot, timeout_ms)


def _echo_json(doc: dict[str, Any]) -> None:
    typer.echo(json.dumps(doc, separators=(",", ":")))


_STAT_HELP = (
    "Every counter of the bus with its rate of change, refreshed every --interval seconds."
    "\n\nReads cnc.dat read-only: it never writes to the bus and never registers as a client. "
    "The header shows the driver pid, its heartbeat age and the cnc layout version; a stale "
    "bus (heartbeat older than the driver timeout, or driver process gone) is marked STALE. "
    "Without --once or --count it refreshes until Ctrl-C (a table; with --json, a line per "
    "sample). pub-pos is the log's tail, read live (not the driver's sample), in the same "
    "snapshot `shmbus streams` takes."
    "\n\nExit codes: 0 running bus; 1 no bus (stderr says where it looked and how to start a "
    "driver); 3 stale bus."
    "\n\n--json prints one JSON document (with --interval: one per line):"
    "\n\n" + "\n".join("  " + line for line in STAT_JSON_EXAMPLE.splitlines()) +
    "\n\nrate is the change per second since the previous sample (null in the first); "
    "stream_id, session_id and channel are null for counters of no stream; client_pid and "
    "client_name are null for counters no client owns (system counters); reason is null "
    "unless the bus is stale. Times are epoch ms. streams, clients and errors show their JSON "
    "in their --help; the JSON Schema files in shmbus/cli/schema/ describe all four.")


@app.command("stat", help=_STAT_HELP)
def stat_command(
    dir: DirOption = None,
    interval: Annotated[float | None, typer.Option(
        help="seconds between refreshes (default 1); with --json, one document per line",
        min=0.01)] = None,
    once: Annotated[bool, typer.Option("--once", help="print one sample and exit")] = False,
    count: Annotated[int, typer.Option(
        help="stop after this many samples (0: until Ctrl-C)", min=0)] = 0,
    types: Annotated[list[str] | None, typer.Option(
        "--type", help="counter type, by name (pub-lmt, pub-pos, sub-pos, client-heartbeat, "
        "system, ...) or id; repeatable")] = None,
    streams: Annotated[list[int] | None, typer.Option(
        "--stream", help="stream id; repeatable")] = None,
    channel: Annotated[str | None, typer.Option(help="substring of the channel")] = None,
    sessions: Annotated[list[int] | None, typer.Option(
        "--session", help="session id; repeatable (negative: --session=-5)")] = None,
    as_json: JsonOption = False,
    openmetrics: Annotated[bool, typer.Option(
        "--openmetrics", help="print one OpenMetrics exposition (what `shmbus export` serves "
        "at /metrics) and exit")] = False,
) -> None:
    try:
        type_ids = [parse_type(t) for t in types or []]
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--type") from None
    directory, timeout_ms = _bus_settings(dir)
    if openmetrics:
        if as_json:
            raise typer.BadParameter("--openmetrics and --json exclude each other",
                                     param_hint="--openmetrics")
        _print_openmetrics(directory, timeout_ms)
    watch = not once and (interval is not None or not as_json)
    samples = count if watch else 1
    console = _console()
    live = Live(console=console, auto_refresh=False) if watch and console.is_terminal else None
    previous = None
    code = EXIT_OK
    try:
        if live is not None:
            live.start()
        for snapshot in bussnapshot.samples(directory, interval or 1.0, samples):
            status = check_bus(snapshot, timeout_ms)
            code = status.exit_code
            views = filter_counters(describe_counters(snapshot, previous), types=type_ids,
                                    streams=streams or (), sessions=sessions or (),
                                    channel=channel)
            previous = snapshot
            if as_json:
                _echo_json(document("stat", snapshot, status,
                                    counters=[v.to_json() for v in views]))
                continue
            style = "" if status.state == RUNNING else "bold red"
            view = Group(Text(header_line("stat", snapshot, status), style=style),
                         counters_table(views))
            if live is not None:
                live.update(view, refresh=True)
            else:
                console.print(view)
    except bussnapshot.BusNotFoundError as e:
        typer.echo(f"error: {e}", err=True)
        code = EXIT_NO_BUS
    except KeyboardInterrupt:
        pass
    finally:
        if live is not None:
            live.stop()
    raise typer.Exit(code)


def _print_openmetrics(directory: str, timeout_ms: int) -> None:
    """One OpenMetrics exposition of the bus on stdout; exits with stat's codes."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.openmetrics.exposition import generate_latest

    try:
        snapshot = bussnapshot.read_snapshot(directory)
    except bussnapshot.BusNotFoundError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(EXIT_NO_BUS) from None
    from shmbus.cli import metrics

    status = check_bus(snapshot, timeout_ms)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics.SnapshotCollector(snapshot, status))
    exposition: bytes = generate_latest(registry)  # type: ignore[no-untyped-call]
    typer.echo(exposition.decode(), nl=False)
    raise typer.Exit(status.exit_code)


@app.command("export", help=(
    "Serve the bus's counters to Prometheus: GET /metrics on --addr:--port (OpenMetrics when "
    "the scraper asks for it, else the Prometheus text format)."
    "\n\nEach scrape reads the bus afresh (the same snapshot `shmbus streams` takes): every "
    "counter as shmbus_position_bytes (gauges: pub-pos, pub-lmt, sub-pos, ...), shmbus_value "
    "(other gauges) or shmbus_events_total (totals), labelled with type, id, name, stream, "
    "session, channel, client_pid and client_name; plus shmbus_subscriber_lag_bytes, "
    "shmbus_publication_held, shmbus_up and shmbus_driver_heartbeat_age_seconds. A bus that "
    "is missing or stale gives shmbus_up 0. Runs until Ctrl-C or SIGTERM."
    "\n\nExit codes: 0 stopped, 1 cannot serve (the port is in use, the address is not "
    "this host's)."))
def export_command(
    dir: DirOption = None,
    port: Annotated[int, typer.Option(help="TCP port (0: any free port, printed on stderr)",
                                      min=0, max=65535)] = 9464,
    addr: Annotated[str, typer.Option(help="address to listen on")] = "0.0.0.0",
) -> None:
    import signal
    import threading

    from prometheus_client import start_http_server

    from shmbus.cli import metrics

    directory, timeout_ms = _bus_settings(dir)
    try:
        server, thread = start_http_server(port, addr,
                                           registry=metrics.bus_registry(directory, timeout_ms))
    except OSError as e:
        reason = e.strerror or str(e)
        hint = (" (another exporter may be running there; choose another --port)"
                if e.errno == errno.EADDRINUSE else "")
        typer.echo(f"error: cannot serve on {addr}:{port}: {reason}{hint}", err=True)
        raise typer.Exit(1) from None
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    typer.echo(f"serving http://{addr}:{server.server_port}/metrics for the bus in "
               f"{directory} (Ctrl-C to stop)", err=True)
    stop.wait()
    server.shutdown()
    server.server_close()
    thread.join(5)


@app.command("streams", help=(
    "One line per stream and session: pub-pos, pub-lmt, each subscriber's position and lag, "
    "and what limits the publisher now."
    "\n\nThe verdict is \"held by subscriber pid 4242 (worker-3), 3.9 MiB behind; window "
    "4 MiB\" when the publisher is at its limit or a window ahead of its slowest counted "
    "subscriber (which holds it; on a udp channel possibly the sender), \"free: 2.1 MiB of "
    "window left\" otherwise (never more than the window), or \"not connected\" with no "
    "subscriber. Network images (received from udp) follow, with rcv-pos, rcv-hwm and their "
    "subscribers' lag."
    "\n\npub-pos is the log's tail, read live after the subscribers' positions and before "
    "pub-lmt, so no lag is negative; a publisher's last message may end past pub-lmt."
    "\n\nExit codes: 0 running bus, 1 no bus, 3 stale bus."
    "\n\n--json: " + _JSON_COMMON + '"streams": [{"kind", "stream_id", "session_id", '
    '"channel", "registration_id", "publisher_pid", "publisher_name", "pub_pos", "pub_lmt", '
    '"position_source" ("log"|"counter"), "window", "term_length", "free", "sender", '
    '"receiver", "state", "held_by" (pids), "held_by_sender", "verdict", "subscribers": '
    '[{"subscription_id", "client_id", "pid", "name", "counter_id", "position", "lag", '
    '"group", "counted"}]}]}'))
def streams_command(
    dir: DirOption = None,
    streams: Annotated[list[int] | None, typer.Option(
        "--stream", help="stream id; repeatable")] = None,
    as_json: JsonOption = False,
) -> None:
    snapshot, status = _read(dir)
    views = [v for v in analyse_streams(snapshot)
             if not streams or v.stream_id in streams]
    services = [s for s in analyse_services(snapshot.counters)
                if not streams or s.stream_id in streams]
    if as_json:
        _echo_json(document("streams", snapshot, status,
                            streams=[v.to_json() for v in views],
                            services=[s.to_json() for s in services]))
    else:
        typer.echo(header_line("streams", snapshot, status))
        for view in views:
            typer.echo(view.line())
        if not views:
            typer.echo("no publications")
        for service in services:
            typer.echo(service.line())
    raise typer.Exit(status.exit_code)


@app.command("clients", help=(
    "The processes attached to the bus: pid, name, command line, CPU%, RSS, heartbeat age."
    "\n\nA client whose process is gone (killed, exited, or its pid reused) is flagged GONE; "
    "one whose heartbeat is older than the client liveness timeout is flagged TIMED-OUT (the "
    "driver is about to remove it)."
    "\n\nExit codes: 0 running bus, 1 no bus, 3 stale bus."
    "\n\n--json: " + _JSON_COMMON + '"clients": [{"client_id", "pid", "name", "heartbeat_ms", '
    '"heartbeat_age_ms", "state": "alive"|"gone"|"timed-out", "reason", "process": null|{'
    '"name", "cmdline", "cpu_percent", "rss", "status"}, "publications": [{"stream_id", '
    '"session_id"}], "subscriptions": [7, ...]}]}'))
def clients_command(
    dir: DirOption = None,
    cpu_interval: Annotated[float, typer.Option(
        help="seconds over which CPU% is measured", min=0.0)] = 0.1,
    as_json: JsonOption = False,
) -> None:
    snapshot, status = _read(dir)
    processes = probe_processes(client_processes_wanted(snapshot), cpu_interval=cpu_interval)
    clients = list_clients(snapshot, processes)
    if as_json:
        _echo_json(document("clients", snapshot, status,
                            clients=[c.to_json() for c in clients]))
    else:
        console = _console()
        console.print(header_line("clients", snapshot, status))
        if clients:
            console.print(clients_table(clients))
        else:
            console.print("no clients")
    raise typer.Exit(status.exit_code)


@app.command("errors", help=(
    "The driver's distinct error log: each error once, with its count, first and last time."
    "\n\nStill readable after the driver died (a stale bus)."
    "\n\nExit codes: 0 running bus, 1 no bus, 3 stale bus."
    "\n\n--json: " + _JSON_COMMON + '"errors": [{"count", "first_ms", "last_ms", "text"}]} '
    '(oldest first; times are epoch ms)'))
def errors_command(dir: DirOption = None, as_json: JsonOption = False) -> None:
    snapshot, status = _read(dir, errors=True)
    if as_json:
        _echo_json(document("errors", snapshot, status, errors=errors_json(snapshot.errors)))
    else:
        typer.echo(header_line("errors", snapshot, status))
        for line in error_lines(snapshot.errors):
            typer.echo(line)
    raise typer.Exit(status.exit_code)


@app.command()
def keygen(
    name: Annotated[str, typer.Argument(help="the key's name, as channels name it (key=NAME)")],
    keyring: Annotated[str | None, typer.Option(
        help="keyring file (default: $SHMBUS_KEYRING or ~/.config/shmbus/keyring)")] = None,
    receive_only: Annotated[bool, typer.Option(
        "--receive-only", help="a key that opens datagrams but does not seal yet (the first "
                               "step of a rotation)")] = False,
) -> None:
    """Add a new random key to the keyring (created mode 0600 if missing) and print its line,
    which every host that shares the channel puts in its own keyring."""
    path = keyring_path(Context.resolve(keyring=keyring).keyring)
    try:
        taken = ({k.key_id for k in load_keyring(path).keys} if path.exists() else set())
        line = new_key_line(name, taken) + (" receive-only" if receive_only else "")
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a") as file:
            file.write(line + "\n")
    except (KeyringError, OSError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"added key {name!r} to {path}; the same line goes into the keyring of every "
               f"host on the channel:", err=True)
    typer.echo(line)


@app.command()
def record(
    directory: Annotated[str, typer.Argument(help="recording directory (created if missing)")],
    stream: Annotated[int, typer.Option("--stream", help="stream id to record")],
    channel: Annotated[str, typer.Option(help="channel to record")] = "aeron:ipc",
    session: Annotated[int | None, typer.Option(
        "--session", help="record only this session (default: every session)")] = None,
    dir: DirOption = None,
    segment_length: Annotated[int | None, typer.Option(
        help="segment file length: a power of two >= the term length (default 32 MiB)")] = None,
    fsync: Annotated[str, typer.Option(help="fsync policy: none, segment or write")] = "none",
    duration: Annotated[float | None, typer.Option(
        help="stop after this many seconds (default: until Ctrl-C or SIGTERM)")] = None,
) -> None:
    """Record a channel and stream into DIRECTORY: one recording per publishing session."""
    import signal
    import threading

    from shmbus.archive.catalog import RecordingError
    from shmbus.client.client import connect
    from shmbus.settings.errors import ShmbusError

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    client = None
    try:
        client = connect(Context.resolve(dir=dir))
        recorder = client.add_recorder(directory, channel, stream, session_id=session,
                                       segment_length=segment_length, fsync=fsync)
    except (ShmbusError, ValueError, OSError) as e:
        if client is not None:
            client.close()
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    for entry in recorder.recovered:
        typer.echo(f"recovered recording {entry.recording_id}: stop position "
                   f"{entry.stop_position}", err=True)
    typer.echo(f"recording {channel} stream {stream} into {directory} (Ctrl-C to stop)",
               err=True)
    failed = None
    try:
        recorder.run(duration=duration, stop=stop)
    except (RecordingError, ShmbusError) as e:
        failed = e
    finally:
        recorder.close()
        client.close()
    if failed is not None:
        typer.echo(f"error: {failed}", err=True)
        raise typer.Exit(1)
    typer.echo("recorder stopped", err=True)


@app.command()
def replay(
    directory: Annotated[str, typer.Argument(help="recording directory")],
    recording: Annotated[int, typer.Option("--recording", help="recording id to replay")],
    stream: Annotated[int, typer.Option("--stream", help="stream id to publish on")],
    channel: Annotated[str, typer.Option(help="channel to publish on")] = "aeron:ipc",
    from_position: Annotated[int | None, typer.Option(
        help="replay the messages that begin at or after this position (default: start)")
    ] = None,
    to_position: Annotated[int | None, typer.Option(
        help="... and before this one (default: the recorded end, now)")] = None,
    dir: DirOption = None,
    timeout: Annotated[float, typer.Option(
        help="seconds to wait for a subscriber, and for each message under back-pressure")
    ] = 10.0,
) -> None:
    """Republish a recording's messages (reserved values kept) onto a channel and stream."""
    import time

    import shmbus
    from shmbus.archive.recording_reader import RecordingReader
    from shmbus.archive.recording_reader import replay as replay_recording
    from shmbus.settings.errors import ShmbusError

    try:
        reader = RecordingReader(directory, recording)
        with shmbus.connect(Context.resolve(dir=dir)) as bus:
            publication = bus.add_exclusive_publication(channel, stream)
            deadline = time.monotonic() + timeout
            while not publication.is_connected:
                if time.monotonic() > deadline:
                    typer.echo(f"error: no subscriber on {channel} stream {stream} within "
                               f"{timeout} s", err=True)
                    raise typer.Exit(1)
                time.sleep(0.01)
            window = publication.available_window
            count = replay_recording(reader, publication, from_position, to_position,
                                     timeout=timeout)
            # wait for the subscribers to catch up (the driver raises the limit in steps of an
            # eighth of the window); the closed publication's log lingers for the rest
            deadline = time.monotonic() + timeout
            while (publication.available_window < window - window // 4
                   and time.monotonic() < deadline):
                time.sleep(0.005)
    except (ShmbusError, ValueError, OSError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"replayed {count} messages of recording {recording} onto {channel} stream "
               f"{stream}", err=True)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
