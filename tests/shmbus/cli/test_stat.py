"""``shmbus stat``, ``streams``, ``clients`` and ``errors`` against real buses.

The scenario: a driver, one publisher and two subscribers, each a process of its own (spawn;
targets in ``tests/support/workers/stat_workers.py``). The subscribers stop polling after different
numbers of messages and report their Image.position; the publisher then offers until the
slow one holds it back and reports its position and limit. The commands run through their
real entry point (typer's runner on ``shmbus.cli.app.app``, and once as ``.venv/bin/shmbus``)
and must agree with what the processes report, without writing to cnc.dat.
"""

from __future__ import annotations

import dataclasses
import json
import mmap
import multiprocessing as mp
import os
import queue
import re
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import shmbus
from shmbus.cli import snapshot as bussnapshot
from shmbus.cli.bus_status import EXIT_NO_BUS, EXIT_STALE
from shmbus.cli.counter_views import counter_rates, describe_counters, filter_counters, parse_type
from shmbus.cli.formatting import format_bytes, format_duration
from shmbus.cli.json_documents import STAT_JSON_EXAMPLE
from shmbus.cli.stream_analysis import analyse_streams
from shmbus.cli.stream_views import ReceiverView, SenderView, SubscriberView
from shmbus.cli.verdicts import verdict
from shmbus.shm._native import epoch_ms
from shmbus.shm.cnc import (
    CNC_FILE,
    HEADER_LENGTH,
    SHMBUS_LAYOUT_VERSION_OFFSET,
    TO_DRIVER,
    VERSION_OFFSET,
    CncFile,
    CncLengths,
)
from shmbus.shm.counters import COUNTER_LENGTH, FC_RCV_POS, Counter
from shmbus.shm.ring_buffer import CONSUMER_HEARTBEAT_OFFSET, TRAILER_LENGTH, ManyToOneRingBuffer
from tests.support.commands import run, shmbus_executable
from tests.support.stream_counters import network_stream_counters
from tests.support.waits import wait_until
from tests.support.workers import stat_workers

CTX = mp.get_context("spawn")
STREAM = 7
MESSAGE = 224           # payload bytes: 256-byte frames
FRAME = 256
SLOW_AFTER = 40         # messages the slow subscriber reads before it stops
FAST_AFTER = 100
WINDOW = 32768          # term length 65536 (bus_context) / 2
WORKER_TIMEOUT = 30.0

pytestmark = pytest.mark.timeout(120)



@pytest.fixture
def bus_context(bus_context):
    """The shared test context with a client liveness timeout long enough that a killed
    client's counters are still there when ``clients`` looks."""
    return bus_context.with_(client_liveness_timeout=10.0)


def run_json(*args: str) -> dict[str, Any]:
    result = run(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


# -- the scenario ------------------------------------------------------------------------------


@dataclass
class Scenario:
    directory: str
    publisher: Any
    fast: Any
    slow: Any
    pub_pos: int
    pub_lmt: int
    fast_pos: int
    slow_pos: int


class Reports:
    """The workers' reports, taken by kind (they arrive interleaved)."""

    def __init__(self, queue_: Any) -> None:
        self.queue = queue_
        self.pending: list[tuple] = []

    def collect(self, kind: str, count: int, processes: list[Any]) -> dict[str, tuple]:
        """``count`` reports of ``kind`` by worker name; fails on a "failed" report, a dead
        worker or the timeout."""
        deadline = time.monotonic() + WORKER_TIMEOUT
        while sum(r[0] == kind for r in self.pending) < count:
            try:
                report = self.queue.get(timeout=0.5)
            except queue.Empty:
                if time.monotonic() > deadline or not all(p.is_alive() for p in processes):
                    pytest.fail(f"waiting for {count} {kind!r} reports, got {self.pending}; "
                                f"exit codes {[p.exitcode for p in processes]}")
                continue
            assert report[0] != "failed", report
            self.pending.append(report)
        got = {r[1]: r for r in self.pending if r[0] == kind}
        self.pending = [r for r in self.pending if r[0] != kind]
        return got


@pytest.fixture
def scenario(bus_context, driver) -> Iterator[Scenario]:
    reports = CTX.Queue()
    go, fill, stop = (CTX.RawValue("b", 0) for _ in range(3))
    slow = CTX.Process(target=stat_workers.subscriber, daemon=True, args=(
        bus_context, "stat-slow", STREAM, SLOW_AFTER, reports, stop, WORKER_TIMEOUT))
    fast = CTX.Process(target=stat_workers.subscriber, daemon=True, args=(
        bus_context, "stat-fast", STREAM, FAST_AFTER, reports, stop, WORKER_TIMEOUT))
    publisher = CTX.Process(target=stat_workers.publisher, daemon=True, args=(
        bus_context, "stat-pub", STREAM, MESSAGE, reports, go, fill, stop, WORKER_TIMEOUT))
    processes = [slow, fast, publisher]
    got = Reports(reports)
    try:
        for process in processes:
            process.start()
        got.collect("ready", 2, processes)  # both subscribed before the publication exists
        go.value = 1
        got.collect("ready", 1, processes)
        stopped = got.collect("stopped", 2, processes)
        fill.value = 1
        full = got.collect("full", 1, processes)["stat-pub"]
        yield Scenario(bus_context.dir, publisher, fast, slow, full[3], full[4],
                       stopped["stat-fast"][3], stopped["stat-slow"][3])
    finally:
        stop.value = 1
        for process in processes:
            process.join(5)
            if process.is_alive():
                process.kill()
                process.join(5)


def settled_stat(scenario: Scenario) -> dict[str, Any]:
    """``stat --once --json`` once the driver's pub-pos sample has caught up."""
    def sample() -> dict[str, Any] | None:
        doc = run_json("stat", "--once", "--dir", scenario.directory)
        pub_pos = [c for c in doc["counters"] if c["type"] == "pub-pos"]
        return doc if pub_pos and pub_pos[0]["value"] == scenario.pub_pos else None
    return wait_until(sample, 5.0, "the driver's pub-pos sample to settle")


# -- stat --------------------------------------------------------------------------------------


def test_stat_json_reports_the_positions_the_processes_report(scenario) -> None:
    assert scenario.slow_pos == SLOW_AFTER * FRAME
    assert scenario.fast_pos == FAST_AFTER * FRAME
    assert scenario.pub_pos >= scenario.pub_lmt  # back-pressured

    doc = settled_stat(scenario)
    assert doc["command"] == "stat"
    assert doc["bus"]["state"] == "running" and doc["bus"]["reason"] is None
    assert doc["bus"]["layout_version"] == 2
    by_type: dict[str, list[dict]] = {}
    for counter in doc["counters"]:
        by_type.setdefault(counter["type"], []).append(counter)
    (pub_pos,) = by_type["pub-pos"]
    (pub_lmt,) = by_type["pub-lmt"]
    assert pub_pos["value"] == scenario.pub_pos
    assert pub_lmt["value"] == scenario.pub_lmt
    assert pub_pos["client_pid"] == scenario.publisher.pid
    assert pub_pos["stream_id"] == STREAM and pub_pos["channel"] == "aeron:ipc"
    subs = {c["client_pid"]: c for c in by_type["sub-pos"]}
    assert subs.keys() == {scenario.slow.pid, scenario.fast.pid}
    assert subs[scenario.slow.pid]["value"] == scenario.slow_pos
    assert subs[scenario.fast.pid]["value"] == scenario.fast_pos
    assert subs[scenario.slow.pid]["client_name"] == "stat-slow"
    session = pub_pos["session_id"]
    assert all(c["session_id"] == session and c["stream_id"] == STREAM
               for c in by_type["sub-pos"])
    heartbeats = {c["client_pid"] for c in by_type["client-heartbeat"]}
    assert heartbeats == {scenario.publisher.pid, scenario.slow.pid, scenario.fast.pid}
    assert {c["label"] for c in by_type["system"]} >= {"bytes published", "errors"}
    assert all(c["rate"] is None for c in doc["counters"])  # one sample: no rate yet


def test_stat_filters(scenario) -> None:
    d = scenario.directory
    only_subs = run_json("stat", "--once", "--dir", d, "--type", "sub-pos")["counters"]
    assert {c["type"] for c in only_subs} == {"sub-pos"} and len(only_subs) == 2
    by_id = run_json("stat", "--once", "--dir", d, "--type", "12", "--type", "pub-lmt")
    assert sorted(c["type"] for c in by_id["counters"]) == ["pub-lmt", "pub-pos"]
    stream = run_json("stat", "--once", "--dir", d, "--stream", str(STREAM))["counters"]
    assert sorted(c["type"] for c in stream) == ["pub-lmt", "pub-pos", "sub-pos", "sub-pos"]
    assert run_json("stat", "--once", "--dir", d, "--stream", "999")["counters"] == []
    session = stream[0]["session_id"]
    assert len(run_json("stat", "--once", "--dir", d, "--session", str(session))[
        "counters"]) == 4
    assert run_json("stat", "--once", "--dir", d, "--session", str(session + 1))[
        "counters"] == []
    assert len(run_json("stat", "--once", "--dir", d, "--channel", "ipc")["counters"]) == 4
    assert run_json("stat", "--once", "--dir", d, "--channel", "udp")["counters"] == []

    table = run("stat", "--once", "--dir", d, "--type", "sub-pos")
    assert table.exit_code == 0
    assert f"driver pid {scenario_driver_pid(d)}" in table.stdout
    assert "stat-slow" in table.stdout and "stat-fast" in table.stdout
    assert f"{scenario.slow_pos:,}" in table.stdout

    bad = run("stat", "--once", "--dir", d, "--type", "nope")
    assert bad.exit_code == 2 and "unknown counter type 'nope'" in bad.output


def scenario_driver_pid(directory: str) -> int:
    cnc = CncFile.open(Path(directory), writable=False)
    try:
        return cnc.pid
    finally:
        cnc.close()


def test_stat_interval_prints_one_json_document_per_line_with_rates(bus_context,
                                                                    driver) -> None:
    with shmbus.connect(bus_context):
        result = run("stat", "--dir", bus_context.dir, "--json", "--interval", "0.3",
                     "--count", "3", "--type", "client-heartbeat")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 3
    docs = [json.loads(line) for line in lines]
    assert docs[0]["time_ms"] < docs[1]["time_ms"] < docs[2]["time_ms"]
    rates = [d["counters"][0]["rate"] for d in docs]
    assert rates[0] is None
    # the heartbeat is epoch ms, written every 0.1 s: it rises by about 1000 per second
    assert all(r is not None and 300 < r < 3000 for r in rates[1:]), rates

    watch = run("stat", "--dir", bus_context.dir, "--interval", "0.05", "--count", "2")
    assert watch.exit_code == 0
    assert watch.stdout.count("shmbus stat") == 2  # two tables, one after the other


# -- streams -----------------------------------------------------------------------------------


def test_streams_names_the_slow_subscriber_as_the_one_holding_the_publisher(scenario) -> None:
    settled_stat(scenario)
    doc = run_json("streams", "--dir", scenario.directory)
    (stream,) = doc["streams"]
    assert stream["stream_id"] == STREAM
    assert stream["publisher_pid"] == scenario.publisher.pid
    assert stream["pub_pos"] == scenario.pub_pos and stream["pub_lmt"] == scenario.pub_lmt
    assert stream["window"] == WINDOW and stream["term_length"] == 2 * WINDOW
    assert stream["kind"] == "publication" and stream["sender"] is None
    assert stream["state"] == "held" and not stream["held_by_sender"]
    assert stream["held_by"] == [scenario.slow.pid]
    subscribers = {s["pid"]: s for s in stream["subscribers"]}
    assert subscribers[scenario.slow.pid]["lag"] == scenario.pub_pos - scenario.slow_pos
    assert subscribers[scenario.fast.pid]["lag"] == scenario.pub_pos - scenario.fast_pos
    behind = format_bytes(scenario.pub_pos - scenario.slow_pos)
    expected = (f"held by subscriber pid {scenario.slow.pid} (stat-slow), {behind} behind; "
                f"window 32 KiB")
    assert stream["verdict"] == expected

    text = run("streams", "--dir", scenario.directory)
    assert text.exit_code == 0
    (line,) = [x for x in text.stdout.splitlines() if x.startswith("stream ")]
    assert line.startswith(f"stream {STREAM} session {stream['session_id']} aeron:ipc")
    assert line.endswith(expected)
    assert f"pid {scenario.fast.pid} (stat-fast) at {scenario.fast_pos:,}" in line


def test_streams_free_and_not_connected(bus_context, driver) -> None:
    with shmbus.connect(bus_context) as bus:
        subscription = bus.add_subscription("aeron:ipc", 20)
        free = bus.add_exclusive_publication("aeron:ipc", 20)
        lonely = bus.add_exclusive_publication("aeron:ipc", 21)
        wait_until(lambda: subscription.poll(lambda b, h: None, 1) or subscription.images, 5.0,
                   "the image")
        free.publish(bytes(MESSAGE))

        def streams() -> dict[int, dict] | None:
            doc = run_json("streams", "--dir", bus_context.dir)
            views = {s["stream_id"]: s for s in doc["streams"]}
            return views if views[20]["pub_pos"] == FRAME else None

        views = wait_until(streams, 5.0, "pub-pos to be sampled")
        assert views[20]["state"] == "free"
        assert views[20]["verdict"] == (
            f"free: {format_bytes(views[20]['pub_lmt'] - FRAME)} of window left")
        assert views[20]["pub_lmt"] - FRAME > WINDOW - WINDOW // 8
        assert views[21]["state"] == "not-connected" and views[21]["subscribers"] == []
        assert views[21]["verdict"].startswith("not connected")
        only = run_json("streams", "--dir", bus_context.dir, "--stream", "21")["streams"]
        assert [s["session_id"] for s in only] == [lonely.session_id]
        text = run("streams", "--dir", bus_context.dir).stdout
        assert "=> not connected" in text and "=> free: " in text


# -- clients -----------------------------------------------------------------------------------


def test_clients_lists_the_processes_and_flags_one_that_was_killed(scenario) -> None:
    doc = run_json("clients", "--dir", scenario.directory)
    clients = {c["pid"]: c for c in doc["clients"]}
    pids = {scenario.publisher.pid: "stat-pub", scenario.slow.pid: "stat-slow",
            scenario.fast.pid: "stat-fast"}
    assert clients.keys() == pids.keys()
    for pid, name in pids.items():
        client = clients[pid]
        assert client["name"] == name
        assert client["state"] == "alive" and client["reason"] is None
        assert 0 <= client["heartbeat_age_ms"] < 2000
        assert client["process"]["rss"] > 0
        assert client["process"]["cpu_percent"] >= 0
        assert any("multiprocessing" in part for part in client["process"]["cmdline"])
    assert clients[scenario.publisher.pid]["publications"][0]["stream_id"] == STREAM
    assert clients[scenario.slow.pid]["subscriptions"] == [STREAM]

    os.kill(scenario.slow.pid, signal.SIGKILL)
    wait_until(lambda: not scenario.slow.is_alive(), 5.0, "the killed subscriber to die")
    # before the driver's liveness timeout (10 s here): the counters are still there
    killed = run("clients", "--dir", scenario.directory)
    assert killed.exit_code == 0
    (row,) = [x for x in killed.stdout.splitlines() if f"{scenario.slow.pid} " in x]
    assert "GONE" in row and "stat-slow" in row
    doc = run_json("clients", "--dir", scenario.directory)
    states = {c["pid"]: c for c in doc["clients"]}
    assert states[scenario.slow.pid]["state"] == "gone"
    assert states[scenario.slow.pid]["process"] is None
    assert states[scenario.fast.pid]["state"] == "alive"
    assert states[scenario.publisher.pid]["state"] == "alive"


# -- errors ------------------------------------------------------------------------------------


def test_errors_lists_each_distinct_error_once_with_its_count(bus_context, driver) -> None:
    clean = run("errors", "--dir", bus_context.dir)
    assert clean.exit_code == 0 and "no errors" in clean.stdout
    with shmbus.connect(bus_context) as bus:
        before = epoch_ms()
        for _ in range(2):
            with pytest.raises(shmbus.RegistrationError):
                bus.add_publication("aeron:ipc", 0)
        with pytest.raises(shmbus.RegistrationError):
            bus.add_subscription("aeron:ipx", 3)
    (zero, ipx) = run_json("errors", "--dir", bus_context.dir)["errors"]
    assert zero["count"] == 2 and "stream_id 0" in zero["text"]
    assert before <= zero["first_ms"] <= zero["last_ms"] <= epoch_ms()
    assert ipx["count"] == 1 and "ipx" in ipx["text"]
    text = run("errors", "--dir", bus_context.dir).stdout
    assert "2 distinct errors, 3 observations" in text
    assert "2 x, first " in text and "stream_id 0" in text


# -- read-only ---------------------------------------------------------------------------------


def invariant_bytes(path: Path) -> bytes:
    """cnc.dat without what a quiet bus changes by itself: the to-driver ring's consumer
    heartbeat (the driver's) and the counter values (ids and padding stay)."""
    data = Path(path).read_bytes()
    lengths = struct.unpack_from("<iiiii", data, 4)
    offsets = []
    offset = HEADER_LENGTH
    for length in lengths:  # Aeron's sections, back to back
        offsets.append(offset)
        offset += length
    parts = [data[:HEADER_LENGTH]]
    to_driver = data[offsets[0]:offsets[0] + lengths[0]]
    heartbeat = len(to_driver) - TRAILER_LENGTH + CONSUMER_HEARTBEAT_OFFSET
    parts += [to_driver[:heartbeat], to_driver[heartbeat + 8:]]
    parts.append(data[offsets[1]:offsets[1] + lengths[1]])           # to-clients
    parts.append(data[offsets[2]:offsets[2] + lengths[2]])           # counters metadata
    values = data[offsets[3]:offsets[3] + lengths[3]]
    parts += [values[i + 8:i + COUNTER_LENGTH] for i in range(0, len(values), COUNTER_LENGTH)]
    parts.append(data[offsets[4]:])           # error log, shmbus's events
    return b"".join(parts)


def test_commands_never_write_to_cnc_dat(scenario, monkeypatch) -> None:
    path = Path(scenario.directory) / CNC_FILE
    settled_stat(scenario)
    before = invariant_bytes(path)
    inode = path.stat().st_ino
    mappings: list[int] = []
    real_mmap = mmap.mmap

    def spy(fileno: int, length: int, *args: Any, **kwargs: Any) -> mmap.mmap:
        mappings.append(kwargs.get("access", mmap.ACCESS_DEFAULT))
        return real_mmap(fileno, length, *args, **kwargs)

    monkeypatch.setattr(mmap, "mmap", spy)
    d = scenario.directory
    for args in (["stat", "--once"], ["stat", "--once", "--json"],
                 ["stat", "--json", "--interval", "0.05", "--count", "3"],
                 ["stat", "--interval", "0.05", "--count", "2", "--type", "sub-pos"],
                 ["streams"], ["streams", "--json"], ["clients"], ["clients", "--json"],
                 ["errors"], ["errors", "--json"]):
        result = run(*args, "--dir", d)
        assert result.exit_code == 0, (args, result.output)
    monkeypatch.undo()
    # private maps of read-only opened files: nothing done through them reaches the file
    assert len(mappings) >= 12 and set(mappings) == {mmap.ACCESS_COPY}
    assert path.stat().st_ino == inode
    assert invariant_bytes(path) == before


# -- the real entry point, no bus, stale bus ---------------------------------------------------


def test_installed_entry_point_prints_the_documented_json(bus_context, driver) -> None:
    result = subprocess.run([shmbus_executable(), "stat", "--once", "--json", "--dir",
                             bus_context.dir], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["bus"]["driver_pid"] == driver.pid and doc["bus"]["state"] == "running"
    assert 0 <= doc["bus"]["heartbeat_age_ms"] < 5000
    example = json.loads(STAT_JSON_EXAMPLE)
    assert doc.keys() == example.keys()
    assert doc["bus"].keys() == example["bus"].keys()
    assert all(c.keys() == example["counters"][0].keys() for c in doc["counters"])
    help_text = run("stat", "--help").stdout
    assert '"client_liveness_timeout_ms": 10000' in help_text

    missing = subprocess.run([shmbus_executable(), "stat", "--once", "--json", "--dir",
                              bus_context.dir + "-nowhere"], capture_output=True, text=True,
                             timeout=30)
    assert missing.returncode == EXIT_NO_BUS and missing.stdout == ""
    assert f"shmbus driver --dir {bus_context.dir}-nowhere" in missing.stderr


@pytest.mark.parametrize("command", ["stat", "streams", "clients", "errors"])
def test_no_bus_says_where_it_looked_and_how_to_start_a_driver(shm_dir, command) -> None:
    nowhere = shm_dir / "nowhere"
    result = run(command, "--dir", str(nowhere))
    assert result.exit_code == EXIT_NO_BUS
    assert result.stdout == ""
    assert f"no bus at {nowhere}: the directory does not exist" in result.stderr
    assert f"shmbus driver --dir {nowhere}" in result.stderr

    empty = shm_dir / "empty"
    empty.mkdir()
    result = run(command, "--dir", str(empty), "--json")
    assert result.exit_code == EXIT_NO_BUS and result.stdout == ""
    assert f"{empty / CNC_FILE} does not exist" in result.stderr
    assert f"shmbus driver --dir {empty}" in result.stderr
    assert not (empty / CNC_FILE).exists()  # looking created nothing


def test_a_killed_driver_leaves_a_stale_bus(bus_context, driver) -> None:
    with shmbus.connect(bus_context) as bus:
        bus.add_exclusive_publication("aeron:ipc", 5)
        driver.kill()
        driver.wait(10)
        for command in (["stat", "--once"], ["streams"], ["clients"], ["errors"]):
            result = run(*command, "--dir", bus_context.dir)
            assert result.exit_code == EXIT_STALE, (command, result.output)
            assert f"STALE: driver pid {driver.pid}: process is gone" in result.stdout
        doc = json.loads(run("stat", "--once", "--json", "--dir", bus_context.dir).stdout)
        assert doc["bus"]["state"] == "stale"
        assert f"shmbus driver --dir {bus_context.dir}" in doc["bus"]["reason"]
        assert any(c["type"] == "pub-lmt" for c in doc["counters"])  # still shown


def test_old_heartbeat_or_reused_pid_is_stale(shm_dir) -> None:
    now = epoch_ms()
    lengths = CncLengths(to_driver_capacity=1024, to_clients_capacity=1024, counters=16,
                         error_log=4096)

    def bus(name: str, pid: int, heartbeat_ms: int) -> Path:
        directory = shm_dir / name
        directory.mkdir()
        cnc = CncFile.create(directory, lengths, pid=pid, start_time_ms=now - 60_000,
                             client_liveness_timeout_ns=10**10)
        ManyToOneRingBuffer(cnc.section(TO_DRIVER)).consumer_heartbeat_time = heartbeat_ms
        cnc.close()
        return directory

    old = bus("old", 1, now - 60_000)  # pid 1: alive since boot, but silent for 60 s
    result = run("stat", "--once", "--json", "--dir", str(old))
    assert result.exit_code == EXIT_STALE
    reason = json.loads(result.stdout)["bus"]["reason"]
    assert re.search(r"driver heartbeat is 1 min \d+ s old \(timeout 10.0 s\)", reason)
    assert "process is gone" not in reason

    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) as later:
        try:  # a process started after the driver did has only reused its pid
            reused = bus("reused", later.pid, epoch_ms())
            result = run("streams", "--json", "--dir", str(reused))
            assert result.exit_code == EXIT_STALE
            reason = json.loads(result.stdout)["bus"]["reason"]
            assert "pid now belongs to a process started later" in reason
            assert "heartbeat" not in reason
        finally:
            later.kill()

    # another shmbus layout; a CnC major Aeron's clients refuse too
    for name, offset, value, said in (
            ("foreign", SHMBUS_LAYOUT_VERSION_OFFSET, 99, "shmbus layout version 99"),
            ("newer", VERSION_OFFSET, 0x10200, "CnC version 0x10200")):
        other = bus(name, os.getpid(), epoch_ms())
        with open(other / CNC_FILE, "r+b") as f:
            f.seek(offset)
            f.write(struct.pack("<i", value))
        result = run("stat", "--once", "--dir", str(other))
        assert result.exit_code == EXIT_NO_BUS
        assert said in result.stderr


# -- pure functions ----------------------------------------------------------------------------


def sub(pid: int, position: int, pub_pos: int) -> SubscriberView:
    return SubscriberView(pid, pid, pid, f"w{pid}", pid, position, pub_pos - position)


def test_verdicts() -> None:
    mib = 1 << 20
    held = verdict(8 * mib, 8 * mib, 4 * mib,
                   [sub(1, 5 * mib, 8 * mib), sub(4242, 4 * mib + 102 * 1024, 8 * mib)])
    assert held.state == "held" and [s.pid for s in held.held_by] == [4242]
    assert held.sentence == "held by subscriber pid 4242 (w4242), 3.9 MiB behind; window 4 MiB"
    assert not held.held_by_sender
    tie = verdict(100, 100, None, [sub(1, 50, 100), sub(2, 50, 100)])
    assert tie.sentence == "held by subscribers pid 1 (w1), pid 2 (w2), 50 B behind"
    free = verdict(2 * mib - 2 * mib // 10, 4 * mib, 4 * mib, [sub(1, 0, 0)])
    assert (free.state, free.held_by) == ("free", ())
    assert free.sentence == "free: 2.2 MiB of window left"
    assert verdict(0, 0, 4 * mib, []).state == "not-connected"


def test_streams_of_a_network_publication_and_image() -> None:
    udp = "aeron:udp?endpoint=h:1"
    counters = network_stream_counters(udp, udp)
    logs = {5: bussnapshot.LogInfo(5, -77, 9, 65536, 1408, True, 32768)}
    driver = bussnapshot.DriverInfo("cnc.dat", 1, 1, 1, 0, 10_000)
    snap = bussnapshot.BusSnapshot("d", 0, 0.0, driver, tuple(counters), logs)
    publication, image = analyse_streams(snap)
    assert (publication.kind, publication.stream_id, publication.session_id) == (
        "publication", 9, -77)
    assert publication.publisher_pid == 4240 and publication.window == 32768
    assert publication.sender == SenderView(8000, 8000, 3, True, mtu=1408)
    assert publication.verdict.held_by_sender and publication.state == "held"
    assert publication.verdict.sentence == (
        "held by the sender (waiting at snd-lmt for the receivers), 31.2 KiB behind; "
        "window 32 KiB")
    assert "snd-pos 8,000, snd-lmt 8,000" in publication.line()
    assert (image.kind, image.session_id, image.pub_pos) == ("image", -5, None)
    assert image.receiver == ReceiverView(5000, 4000, "127.0.0.1:4000")
    (subscriber,) = image.subscribers
    assert (subscriber.pid, subscriber.name, subscriber.lag) == (4242, "w", 1000)
    assert image.verdict.sentence == (
        "receiving; slowest subscriber pid 4242 (w), 1000 B behind rcv-pos; 1000 B between "
        "rcv-pos and rcv-hwm (loss being repaired)")
    assert image.line().startswith(f"stream 9 session -5 {udp} (plaintext) image from "
                                   f"127.0.0.1:4000: rcv-pos 4,000, rcv-hwm 5,000")
    views = {v.counter.counter_id: v for v in describe_counters(snap)}
    assert (views[15].stream_id, views[15].session_id, views[15].channel) == (9, -5, udp)
    assert (views[15].client_pid, views[10].client_pid, views[13].client_pid) == (4242, 4240,
                                                                                  None)
    assert [v.counter.counter_id for v in filter_counters(
        views.values(), sessions=[-5])] == [13, 14, 15]

    alone = dataclasses.replace(snap, logs={5: dataclasses.replace(logs[5],
                                                                   is_connected=False)})
    assert analyse_streams(alone)[0].verdict.sentence == (
        "not connected: no receiver has answered the sender")


@pytest.mark.parametrize("fc, holder", [("min", "10.0.0.3:40"), ("tagged,g:7", "10.0.0.3:40"),
                                        ("max", "10.0.0.2:40")])
def test_streams_name_the_receiver_that_sets_the_sender_limit(fc: str, holder: str) -> None:
    """fc-rcv-pos counters (the netbridge's, one per receiver its flow control knows): under
    min and tagged the slowest counted receiver holds the sender back, under max the fastest
    sets the limit; an uncounted receiver (not of the tagged group) never does."""
    udp = f"aeron:udp?endpoint=224.0.1.1:40|fc={fc}"
    counters = [
        Counter(8, 1, f"pub-lmt: 5 -77 9 {udp}", 40000, 5, 3, -77, b""),
        Counter(9, 12, f"pub-pos: 5 -77 9 {udp}", 40000, 5, 3, -77, b""),
        Counter(10, 2, f"snd-pos: 5 -77 9 {udp}", 8000, 5, 3, -77, b""),
        Counter(11, 9, f"snd-lmt: 5 -77 9 {udp}", 8064, 5, 3, -77, b""),  # < 1 mtu of room
        Counter(12, 17, f"fc-receivers: 5 -77 9 {udp}", 2, 5, 99, -77, b""),
        Counter(13, FC_RCV_POS, f"fc-rcv-pos: 5 -77 9 {udp} receiver 71 at 10.0.0.2:40", 7000,
                5, 99, -77, b""),
        Counter(14, FC_RCV_POS, f"fc-rcv-pos: 5 -77 9 {udp} receiver 72 at 10.0.0.3:40", 4000,
                5, 99, -77, b""),
        Counter(15, FC_RCV_POS,
                f"fc-rcv-pos: 5 -77 9 {udp} receiver 73 at 10.0.0.4:40 (not counted)",
                1000, 5, 99, -77, b""),
    ]
    logs = {5: bussnapshot.LogInfo(5, -77, 9, 65536, 1408, True, 32768)}
    driver = bussnapshot.DriverInfo("cnc.dat", 1, 1, 1, 0, 10_000)
    snap = bussnapshot.BusSnapshot("d", 0, 0.0, driver, tuple(counters), logs)
    (publication,) = analyse_streams(snap)
    sender = publication.sender
    assert sender is not None and sender.fc_receivers == 2
    assert sender.flow_control == fc.partition(",")[0]
    assert [(r.receiver_id, r.position, r.counted) for r in sender.receivers] == [
        (71, 7000, True), (72, 4000, True), (73, 1000, False)]
    assert sender.holding_receiver is not None and sender.holding_receiver.address == holder
    assert f"waiting at snd-lmt for receiver {holder}" in publication.verdict.sentence
    assert "10.0.0.4:40 at 1,000 (not counted)" in publication.line()
    document = publication.to_json()["sender"]
    assert document["holding_receiver"]["address"] == holder
    assert len(document["receivers"]) == 3
    views = {v.counter.counter_id: v for v in describe_counters(snap)}
    assert (views[14].stream_id, views[14].session_id, views[14].channel) == (9, -77, udp)


def test_formatting_and_type_names() -> None:
    assert [format_bytes(n) for n in (0, 1023, 1024, 32768, 4 << 20, 3 << 30)] == [
        "0 B", "1023 B", "1 KiB", "32 KiB", "4 MiB", "3 GiB"]
    assert format_duration(850) == "850 ms"
    assert format_duration(12_345) == "12.3 s"
    assert parse_type("pub-lmt") == 1 and parse_type("12") == 12
    with pytest.raises(ValueError, match="sub-pos"):
        parse_type("subpos")


def snapshot(counters: list[Counter], monotonic_s: float,
             start_ms: int = 1) -> bussnapshot.BusSnapshot:
    driver = bussnapshot.DriverInfo("cnc.dat", 1, 1, start_ms, 0, 10_000)
    return bussnapshot.BusSnapshot("d", 0, monotonic_s, driver, tuple(counters))


def test_rates_only_compare_the_same_counter() -> None:
    def counter(counter_id: int, value: int, registration_id: int = 5) -> Counter:
        return Counter(counter_id, 12, "pub-pos: 5 1 7 aeron:ipc", value, registration_id, 0,
                       1, b"")

    before = snapshot([counter(0, 1000), counter(1, 0)], 10.0)
    after = snapshot([counter(0, 3000), counter(1, 50, registration_id=6)], 10.5)
    assert counter_rates(before, after) == {0: 4000.0}  # id 1 was reused
    restarted = snapshot([counter(0, 3000)], 10.5, start_ms=2)
    assert counter_rates(before, restarted) == {}
