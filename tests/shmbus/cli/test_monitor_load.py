"""The monitor under load: real processes on a real bus, hundreds of snapshots, each checked.

A publisher keeps its stream saturated (it offers 100-byte messages as fast as the window
allows; spawn targets in ``tests/support/workers/load_workers.py``) while subscribers read at their
own pace, one is stopped (SIGSTOP), and on a second pair of buses the stream goes over the
netbridge on loopback UDP. Every snapshot, as ``stat`` and ``streams`` (and ``export``) take
it, must keep the rules of :func:`shmbus.cli.verdicts.stream_problems`: lag >= 0 (behind pub-pos,
or a network image's rcv-pos), pub-pos less
than one claim past pub-lmt, free within the window, a held verdict naming the slowest
counted reader; and stat's counters must show the positions streams shows.

Every loop is bounded in time; the workers sleep when back-pressured or idle.
"""

from __future__ import annotations

import collections
import json
import multiprocessing as mp
import os
import queue
import re
import select
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from shmbus.cli.app import app
from shmbus.cli.bus_status import EXIT_NO_BUS
from shmbus.cli.snapshot import BusSnapshot, read_snapshot
from shmbus.cli.stream_analysis import analyse_streams
from shmbus.cli.stream_views import StreamView
from shmbus.cli.verdicts import stream_problems
from tests.support.drivers import stop_driver
from tests.support.networks import bus_pair, free_udp_port
from tests.support.waits import wait_until
from tests.support.workers import load_workers

CTX = mp.get_context("spawn")
STREAM = 7
MESSAGE = 100
#: the longest claim the publisher makes: a 32-byte header + 100 bytes, aligned to 32
FRAME = 160
WINDOW = 32768  # bus_context's term length (64 KiB) / 2
SNAPSHOTS = 300
WORKER_TIMEOUT = 90.0

pytestmark = pytest.mark.timeout(240)
runner = CliRunner()


@pytest.fixture
def bus_context(bus_context):
    """The shared test context, with a client liveness timeout well above the seconds a
    subscriber stays stopped here."""
    return bus_context.with_(client_liveness_timeout=10.0)


class Workers:
    """Worker processes sharing one report queue and one stop flag; all stopped at exit."""

    def __init__(self) -> None:
        self.reports = CTX.Queue()
        self.stop = CTX.RawValue("b", 0)
        self.processes: list[Any] = []

    def start(self, target: Callable[..., None], *args: Any, **kwargs: Any) -> Any:
        process = CTX.Process(target=target, args=args, kwargs=kwargs, daemon=True)
        process.start()
        self.processes.append(process)
        return process

    def ready(self, count: int) -> None:
        deadline = time.monotonic() + 30
        while count:
            try:
                report = self.reports.get(timeout=0.5)
            except queue.Empty:
                if time.monotonic() > deadline or not all(p.is_alive() for p in self.processes):
                    pytest.fail(f"workers not ready: {[p.exitcode for p in self.processes]}")
                continue
            assert report[0] == "ready", report
            count -= 1

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.value = 1
        for process in self.processes:
            if process.is_alive():
                os.kill(process.pid, signal.SIGCONT)  # a stopped one must see the flag
        for process in self.processes:
            process.join(5)
            if process.is_alive():
                process.kill()
                process.join(5)


def check(snapshot: BusSnapshot) -> list[StreamView]:
    """The snapshot's stream views, each checked against the rules, and checked to agree
    with the counters ``stat`` shows from the same snapshot."""
    views = analyse_streams(snapshot)
    counters = {c.counter_id: c for c in snapshot.counters}
    for view in views:
        assert view.position_source == "log", view.line()
        assert stream_problems(view, FRAME) == [], view.line()
        if view.kind != "publication":
            continue
        (pub_pos,) = [c.value for c in snapshot.counters
                      if c.type_name == "pub-pos" and c.registration_id == view.registration_id]
        assert pub_pos == view.pub_pos
        for s in view.subscribers:
            if s.group is None:
                assert counters[s.counter_id].value == s.position
    return views


def take(directory: str, count: int, pause: float = 0.005) -> Iterator[BusSnapshot]:
    for _ in range(count):
        yield read_snapshot(directory)
        time.sleep(pause)  # pacing: snapshots spread over the load, not a wait


def publication(directory: str) -> StreamView | None:
    views = [v for v in analyse_streams(read_snapshot(directory))
             if v.kind == "publication"]
    return views[0] if views else None


def running(directory: str, past: int) -> bool:
    """Whether the publication has published ``past`` bytes and has subscribers or a
    connected sender."""
    view = publication(directory)
    return view is not None and (view.pub_pos or 0) > past and view.state != "not-connected"


def check_json(doc: dict[str, Any], held_by: int | None) -> dict[str, Any]:
    """The rules on ``streams --json`` (one publication); returns its stream."""
    (stream,) = [s for s in doc["streams"] if s["kind"] == "publication"]
    assert all(s["lag"] >= 0 for s in stream["subscribers"]), stream
    assert stream["pub_pos"] - stream["pub_lmt"] < FRAME, stream
    if stream["state"] == "free":
        assert 0 < stream["free"] <= stream["window"], stream
    elif held_by is not None:
        assert stream["state"] == "held" and stream["held_by"] == [held_by], stream
    return stream


# -- one IPC stream: saturated, a slow subscriber, then a stopped one --------------------------


def test_a_saturated_stream_with_a_slow_then_a_stopped_subscriber(bus_context, driver) -> None:
    d = bus_context.dir
    with Workers() as w:
        w.start(load_workers.subscribe, bus_context, "aeron:ipc", STREAM, w.reports, w.stop,
                WORKER_TIMEOUT, "load-fast")
        slow = w.start(load_workers.subscribe, bus_context, "aeron:ipc", STREAM, w.reports,
                       w.stop, WORKER_TIMEOUT, "load-slow", 8, 0.002)
        w.ready(2)
        w.start(load_workers.saturate, bus_context, "aeron:ipc", STREAM, MESSAGE, w.reports,
                w.stop, WORKER_TIMEOUT)
        w.ready(1)
        wait_until(lambda: running(d, 4 * WINDOW), 30, "the stream to run")

        held: collections.Counter[tuple[int | None, ...]] = collections.Counter()
        for snapshot in take(d, SNAPSHOTS):
            (view,) = check(snapshot)
            assert view.state in ("held", "free"), view.line()
            if view.state == "held":
                held[tuple(s.pid for s in view.verdict.held_by)] += 1
        # saturated: mostly held, and by the slow one (the fast one is never a window behind)
        assert sum(held.values()) >= SNAPSHOTS // 2, held
        assert held[(slow.pid,)] >= 0.9 * sum(held.values()), held

        # the commands, each its own snapshot: streams --json and stat --json agree within
        for _ in range(20):
            check_json(json.loads(runner.invoke(app, ["streams", "--dir", d, "--json"]).stdout),
                       None)
            doc = json.loads(runner.invoke(app, ["stat", "--once", "--dir", d, "--json"]).stdout)
            by_type = collections.defaultdict(list)
            for c in doc["counters"]:
                by_type[c["type"]].append(c["value"])
            (pub_pos,), (pub_lmt,) = by_type["pub-pos"], by_type["pub-lmt"]
            assert max(by_type["sub-pos"]) <= pub_pos < pub_lmt + FRAME

        os.kill(slow.pid, signal.SIGSTOP)
        try:
            def steady() -> bool:  # the publisher stopped at a window past the slow one
                first = publication(d)
                time.sleep(0.05)  # the steadiness check's window: pub-pos unmoved across it
                second = publication(d)
                return (first is not None and second is not None and first.state == "held"
                        and first.pub_pos == second.pub_pos)
            wait_until(steady, 10, "the stopped subscriber to hold the publisher")
            stopped_at = None
            for snapshot in take(d, SNAPSHOTS // 3):
                (view,) = check(snapshot)
                assert view.state == "held", view.line()
                assert [s.pid for s in view.verdict.held_by] == [slow.pid], view.line()
                (lag,) = [s.lag for s in view.subscribers if s.pid == slow.pid]
                assert WINDOW <= lag < WINDOW + FRAME, view.line()
                stopped_at = stopped_at or view.pub_pos
                assert view.pub_pos == stopped_at, view.line()
            line = runner.invoke(app, ["streams", "--dir", d]).stdout
            assert f"=> held by subscriber pid {slow.pid} (load-slow), 32" in line, line
            check_json(json.loads(runner.invoke(app, ["streams", "--dir", d, "--json"]).stdout),
                       slow.pid)
        finally:
            os.kill(slow.pid, signal.SIGCONT)


# -- a network publication over loopback -------------------------------------------------------


def test_a_saturated_network_publication(shm_dir) -> None:
    contexts, drivers = bus_pair(shm_dir, udp_term_length=1 << 20)
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
    try:
        with Workers() as w:
            w.start(load_workers.subscribe, contexts[1], channel, STREAM, w.reports, w.stop,
                    WORKER_TIMEOUT, "net-sub")
            w.ready(1)
            w.start(load_workers.saturate, contexts[0], channel, STREAM, MESSAGE, w.reports,
                    w.stop, WORKER_TIMEOUT, "net-pub")
            w.ready(1)
            wait_until(lambda: running(contexts[0].dir, 1 << 20), 30, "the stream to cross")
            states: collections.Counter[str] = collections.Counter()
            for snapshot in take(contexts[0].dir, SNAPSHOTS):
                (view,) = check(snapshot)
                assert view.sender is not None and view.sender.position is not None
                states[view.state] += 1
                if view.state == "held":  # the sender is its only reader
                    assert view.verdict.held_by_sender, view.line()
            assert states["held"] + states["free"] == SNAPSHOTS, states
            # the receiving bus: the image's rcv-pos is read live, its subscriber never ahead
            for snapshot in take(contexts[1].dir, SNAPSHOTS):
                (image,) = check(snapshot)
                assert image.kind == "image" and image.stream_id == STREAM
                assert [s.name for s in image.subscribers] == ["net-sub"]
    finally:
        for process in drivers:
            stop_driver(process)


# -- Prometheus / OpenMetrics ------------------------------------------------------------------


def start_exporter(directory: str, port: int = 0) -> tuple[subprocess.Popen[str], str]:
    """``shmbus export`` in a process of its own; returns it and the first stderr line."""
    process = subprocess.Popen([sys.executable, "-m", "shmbus", "export", "--port", str(port),
                                "--addr", "127.0.0.1", "--dir", directory],
                               stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    readable, _, _ = select.select([process.stderr], [], [], 30)
    assert readable, "the exporter said nothing in 30 s"
    return process, process.stderr.readline()


def scrape(port: int, openmetrics: bool = False) -> str:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics")
    if openmetrics:
        request.add_header("Accept", "application/openmetrics-text; version=1.0.0")
    with urllib.request.urlopen(request, timeout=10) as response:
        return str(response.read().decode())


def samples_by_family(families: Any) -> dict[str, tuple[str, list[Any]]]:
    return {f.name: (f.type, f.samples) for f in families}


def check_scrape(families: dict[str, tuple[str, list[Any]]]) -> None:
    """One scrape: every kind of family, positions as gauges, lag >= 0 and sub-pos <= pub-pos
    (one snapshot)."""
    assert families["shmbus_position_bytes"][0] == "gauge"
    assert families["shmbus_events"][0] == "counter"
    assert families["shmbus_up"][1][0].value == 1
    positions = collections.defaultdict(list)
    for sample in families["shmbus_position_bytes"][1]:
        positions[sample.labels["type"]].append(sample.value)
        assert sample.labels["stream"] == str(STREAM)
    (pub_pos,), (pub_lmt,) = positions["pub-pos"], positions["pub-lmt"]
    assert max(positions["sub-pos"]) <= pub_pos < pub_lmt + FRAME
    assert all(s.value >= 0 for s in families["shmbus_subscriber_lag_bytes"][1])
    names = {s.labels["name"] for s in families["shmbus_events"][1]}
    assert {"bytes published", "errors", "subscriptions"} <= names


def test_export_serves_every_counter_under_load(bus_context, driver) -> None:
    d = bus_context.dir
    with Workers() as w:
        w.start(load_workers.subscribe, bus_context, "aeron:ipc", STREAM, w.reports, w.stop,
                WORKER_TIMEOUT, "load-fast")
        w.ready(1)
        publisher = w.start(load_workers.saturate, bus_context, "aeron:ipc", STREAM, MESSAGE,
                            w.reports, w.stop, WORKER_TIMEOUT)
        w.ready(1)
        wait_until(lambda: running(d, 4 * WINDOW), 30, "the stream to run")
        exporter, said = start_exporter(d)
        try:
            match = re.search(r"http://127\.0\.0\.1:(\d+)/metrics", said)
            assert match, said
            port = int(match[1])
            for _ in range(30):
                check_scrape(samples_by_family(text_string_to_metric_families(scrape(port))))
            body = scrape(port, openmetrics=True)
            assert body.endswith("# EOF\n")
            families = samples_by_family(openmetrics_families(body))
            check_scrape(families)
            # every counter of the bus is there, under its id
            snapshot = read_snapshot(d)
            ids = {s.labels["id"] for name in ("shmbus_position_bytes", "shmbus_value",
                                                "shmbus_events")
                   for s in families[name][1]}
            assert ids == {str(c.counter_id) for c in snapshot.counters}
            (pub,) = [s for s in families["shmbus_position_bytes"][1]
                      if s.labels["type"] == "pub-pos"]
            assert pub.labels["client_pid"] == str(publisher.pid)
            assert pub.labels["client_name"] == "load-pub"
            assert pub.labels["channel"] == "aeron:ipc"

            # stat --once --openmetrics prints the same families
            printed = runner.invoke(app, ["stat", "--once", "--openmetrics", "--dir", d])
            assert printed.exit_code == 0, printed.output
            assert printed.stdout.endswith("# EOF\n")
            once = samples_by_family(openmetrics_families(printed.stdout))
            check_scrape(once)
            assert {(n, t) for n, (t, _) in once.items()} == {
                (n, t) for n, (t, _) in families.items()}

            # the port is taken: a clear error, exit code 1
            taken, said = start_exporter(d, port)
            assert taken.wait(30) == 1
            assert f"error: cannot serve on 127.0.0.1:{port}: " in said
            assert "already in use" in said and "choose another --port" in said
        finally:
            exporter.send_signal(signal.SIGTERM)
            assert exporter.wait(10) == 0


def test_openmetrics_of_no_bus(shm_dir) -> None:
    nowhere = str(shm_dir / "nowhere")
    from prometheus_client.openmetrics.exposition import generate_latest

    from shmbus.cli.metrics import bus_registry

    families = samples_by_family(openmetrics_families(
        generate_latest(bus_registry(nowhere, 1000)).decode()))
    assert families["shmbus_up"][1][0].value == 0
    result = runner.invoke(app, ["stat", "--once", "--openmetrics", "--dir", nowhere])
    assert result.exit_code == EXIT_NO_BUS and result.stdout == ""
    both = runner.invoke(app, ["stat", "--openmetrics", "--json", "--dir", nowhere])
    assert both.exit_code == 2 and "exclude each other" in both.output
