"""Aeron's own C client (libaeron, built from source by ``make aeron-c``) on a shmbus driver:
Aeron's C test programs (tools/aeron_c/c/) and shmbus processes on the same ``aeron:ipc``
streams of one bus directory, every message checked (publisher id, sequence, length, CRC-32)
by whichever side reads it.

An Aeron client exits at once on a broadcast message it does not know, so every test here also
shows that shmbus's own events (a shmbus client connecting, images of shmbus subscriptions)
never reach the to-clients buffer Aeron's clients read.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

import shmbus
from shmbus.cli.json_documents import load_schema
from shmbus.shm.cnc import CncLayoutError
from shmbus.shm.counters import CLIENT_HEARTBEAT, PUB_LIMIT, SUB_POS
from tests.support.aeron_c import AeronC, Finished, Program, Programs, running_aeronmd
from tests.support.commands import run
from tests.support.processes import CTX
from tests.support.waits import wait_until
from tests.support.workers import aeron_workers

pytestmark = pytest.mark.timeout(180)

STREAM = 1001
#: bus_context's term length is 64 KiB: a message of up to 8 KiB, frames of 1408 bytes
FRAGMENTED = 6000


@pytest.fixture
def aeron(aeron_c: AeronC, bus_context: Any, driver: Any, tmp_path: Path) -> Iterator[Programs]:
    """Aeron's C test programs on the shmbus driver of ``bus_context``."""
    programs = Programs(aeron_c, Path(bus_context.dir), tmp_path)
    try:
        yield programs
    finally:
        programs.close()


def received(finished: Finished, expected: dict[int, int]) -> None:
    """An Aeron subscriber that got every expected message intact, in order."""
    assert finished.returncode == 0, finished.stderr
    summary = finished.summary
    assert summary["ok"] is True and summary["errors"] == 0, summary
    assert summary["received"] == {str(p): n for p, n in expected.items()}


def published(finished: Finished, count: int) -> dict[str, Any]:
    """An Aeron publisher that had every message accepted."""
    assert finished.returncode == 0, finished.stderr
    assert finished.summary["ok"] is True and finished.summary["sent"] == count
    summary: dict[str, Any] = finished.summary
    return summary


class ShmbusSide:
    """shmbus processes (spawned) publishing and reading the checked messages."""

    def __init__(self, procs: Any, context: Any) -> None:
        self.procs = procs
        self.context = context
        self.done = CTX.Event()

    def subscribe(self, expected: dict[int, int], stream: int = STREAM) -> None:
        ready = CTX.Event()
        self.procs.start(aeron_workers.subscribe_checked, self.context, "aeron:ipc", stream,
                         expected, self.procs.queue, ready)
        wait_until(ready.is_set, 30, "the shmbus subscriber to add its subscription")

    def publish(self, publisher_id: int, count: int, length: int, *, exclusive: bool = False,
                stream: int = STREAM) -> None:
        self.procs.start(aeron_workers.publish_checked, self.context, "aeron:ipc", stream,
                         publisher_id, count, length, exclusive, self.procs.queue, self.done)

    def received(self, expected: dict[int, int]) -> dict[str, Any]:
        """The shmbus subscriber's report, after it got every expected message intact."""
        report = self.procs.wait("received", 1, timeout=90)[0]
        assert report["error"] is None, report["error"]
        assert report["received"] == expected
        result: dict[str, Any] = report
        return result

    def published(self, n: int = 1) -> list[dict[str, Any]]:
        reports: list[dict[str, Any]] = self.procs.wait("published", n, timeout=90)
        return reports


@pytest.fixture
def side(procs: Any, bus_context: Any, driver: Any) -> Iterator[ShmbusSide]:
    shmbus_side = ShmbusSide(procs, bus_context)
    try:
        yield shmbus_side
    finally:
        shmbus_side.done.set()


def started_subscriber(aeron: Programs, expect: dict[int, int], **options: Any) -> Program:
    subscriber = aeron.subscribe(stream=options.pop("stream", STREAM), expect=expect, **options)
    subscriber.wait_ready()
    return subscriber


# -- Aeron to Aeron, on the shmbus driver -------------------------------------------------------

def test_an_aeron_publisher_reaches_an_aeron_subscriber_through_the_shmbus_driver(
        aeron: Programs) -> None:
    subscriber = started_subscriber(aeron, {1: 10_000})
    publisher = aeron.publish(stream=STREAM, count=10_000, length=32, publisher_id=1)
    published(publisher.finish(), 10_000)
    received(subscriber.finish(), {1: 10_000})


# -- both directions ----------------------------------------------------------------------------

def test_an_aeron_process_and_a_shmbus_process_share_one_concurrent_publication(
        aeron: Programs, side: ShmbusSide) -> None:
    """Aeron's publisher (id 1) and shmbus's (id 2) add the same channel and stream: one log,
    one session, both writing into it; an Aeron and a shmbus subscriber each get both."""
    expected = {1: 5000, 2: 5000}
    subscriber = started_subscriber(aeron, expected)
    side.subscribe(expected)
    publisher = aeron.publish(stream=STREAM, count=5000, length=100, publisher_id=1)
    side.publish(2, 5000, 100)
    published(publisher.finish(), 5000)
    (report,) = side.published()
    received(subscriber.finish(), expected)
    shmbus_report = side.received(expected)
    assert shmbus_report["sessions"] == [report["session_id"]]  # one log, shared


def test_exclusive_publications_both_ways(aeron: Programs, side: ShmbusSide) -> None:
    """An Aeron exclusive publication read by shmbus, and a shmbus one read by Aeron."""
    subscriber = started_subscriber(aeron, {2: 3000}, stream=STREAM + 1)
    side.subscribe({1: 3000})
    publisher = aeron.publish(stream=STREAM, count=3000, length=64, publisher_id=1,
                              exclusive=True)
    side.publish(2, 3000, 64, exclusive=True, stream=STREAM + 1)
    published(publisher.finish(), 3000)
    side.published()
    received(subscriber.finish(), {2: 3000})
    side.received({1: 3000})


def test_fragmented_messages_both_ways(aeron: Programs, side: ShmbusSide) -> None:
    """Messages of several frames: Aeron's fragments reassembled by shmbus, shmbus's by
    Aeron's fragment assembler."""
    subscriber = started_subscriber(aeron, {2: 300}, stream=STREAM + 1)
    side.subscribe({1: 300})
    publisher = aeron.publish(stream=STREAM, count=300, length=FRAGMENTED, publisher_id=1)
    side.publish(2, 300, FRAGMENTED, stream=STREAM + 1)
    published(publisher.finish(), 300)
    side.published()
    received(subscriber.finish(), {2: 300})
    side.received({1: 300})


def test_a_slow_aeron_subscriber_holds_a_shmbus_publisher_back(
        aeron: Programs, side: ShmbusSide) -> None:
    """3 MB through a 192 KiB log to a subscriber that takes 100 us a message: the log wraps
    fifteen times, and a publisher not held back by the Aeron reader's position would overwrite
    what it had not read (a lost or corrupt message fails it)."""
    subscriber = started_subscriber(aeron, {2: 3000}, delay_us=100)
    side.publish(2, 3000, 1000)
    received(subscriber.finish(90), {2: 3000})
    side.published()


def test_a_slow_shmbus_subscriber_holds_an_aeron_publisher_back(
        aeron: Programs, side: ShmbusSide) -> None:
    """The other way: the Aeron publisher sees back pressure from the shmbus reader's position
    (the driver raises its limit), and nothing is lost."""
    side.subscribe({1: 20_000})
    publisher = aeron.publish(stream=STREAM, count=20_000, length=1000, publisher_id=1)
    summary = published(publisher.finish(90), 20_000)
    side.received({1: 20_000})
    assert summary["back_pressured"] > 0  # 20 MB through a 192 KiB log


# -- liveness and counters ----------------------------------------------------------------------

def heartbeats(context: Any) -> dict[int, Any]:
    """The client-heartbeat counters by client id, read through shmbus's counters."""
    with shmbus.connect(context) as bus:
        return {c.registration_id: c for c in bus.counters.counters()
                if c.type_id == CLIENT_HEARTBEAT}


def test_a_killed_aeron_client_is_timed_out_and_its_counters_freed(
        aeron: Programs, bus_context: Any) -> None:
    """Its heartbeat stops: the driver times it out, frees its heartbeat and its subscriber
    position, and the shmbus publication it read is no longer connected."""
    subscriber = started_subscriber(aeron, {1: 1})
    with shmbus.connect(bus_context) as bus:
        publication = bus.add_publication("aeron:ipc", STREAM)
        aeron_clients = [c for c in bus.counters.counters() if c.type_id == CLIENT_HEARTBEAT
                         and c.label.startswith("client-heartbeat: id=")]
        assert len(aeron_clients) == 1, aeron_clients
        client_id = aeron_clients[0].registration_id
        key = bus.counters.get_key(aeron_clients[0].counter_id)
        assert int.from_bytes(key[:8], "little") == client_id  # where Aeron looks for it
        # the Aeron client found its counter: it writes the time and appends its name
        wait_until(lambda: "name=" in bus.counters.get_label(aeron_clients[0].counter_id),
                   10, "the Aeron client to label its heartbeat")
        wait_until(lambda: publication.is_connected, 10, "the Aeron subscriber's image")
        assert [c for c in bus.counters.counters()
                if c.type_id == SUB_POS and c.owner_id == client_id]
        timeouts = bus.counters.get_value(2)  # the "client timeouts" system counter

        os.kill(subscriber.process.pid, signal.SIGKILL)
        subscriber.process.wait()

        def gone() -> bool:
            return not [c for c in bus.counters.counters() if c.owner_id == client_id]

        wait_until(gone, 15, "the driver to time the killed Aeron client out")
        assert bus.counters.get_value(2) == timeouts + 1
        wait_until(lambda: not publication.is_connected, 5, "the publication to be unread")


def test_an_aeron_publisher_killed_holding_a_claim_is_unblocked_for_a_shmbus_one(
        aeron: Programs, side: ShmbusSide, bus_context: Any, tmp_path: Path) -> None:
    """The Aeron publisher (id 1) claims a frame of the concurrent publication it shares with
    a shmbus publisher (id 2) and is SIGKILLed holding it: the driver pads over the frame
    (publication_unblock_timeout, 1 s here), so the shmbus publisher's messages behind it
    reach the Aeron reader, and every message the killed publisher had acked arrived first."""
    progress = tmp_path / "progress"
    progress.write_bytes(bytes(64))
    acked_at, phase_at, hold_at, checked_at = 0, 16, 24, 32

    def field(offset: int) -> int:
        return int.from_bytes(progress.read_bytes()[offset:offset + 8], "little", signed=True)

    reader = aeron.subscribe_until_stopped(stream=STREAM, progress=(progress, checked_at, 40))
    reader.wait_ready()
    writer = aeron.publish_until_stopped(stream=STREAM, publisher_id=1, length=20,
                                         max_length=1000, rate=2000,
                                         progress=(progress, acked_at, phase_at), hold_at=hold_at)
    wait_until(lambda: field(acked_at) >= 200, 30, "the Aeron publisher's first 200 messages")
    with progress.open("r+b") as f:
        f.seek(hold_at)
        f.write((1).to_bytes(8, "little"))
    wait_until(lambda: field(phase_at) == 2, 30, "the Aeron publisher to hold its claim")
    acked = field(acked_at)
    with shmbus.connect(bus_context) as bus:
        unblocked = bus.counters.get_value(3)  # the "unblocked publications" system counter
        os.kill(writer.process.pid, signal.SIGKILL)
        writer.process.wait()
        side.publish(2, 1000, 200)
        side.published()
        wait_until(lambda: field(checked_at) == acked + 1000, 30,
                   "the reader to check both publishers' messages")
        assert bus.counters.get_value(3) == unblocked + 1
    reader.stop()
    finished = reader.finish()
    assert finished.returncode == 0, finished.stderr
    seen = finished.summary["publishers"]
    assert (seen["1"]["received"], seen["1"]["last"]) == (acked, acked - 1)
    assert (seen["2"]["received"], seen["2"]["last"], seen["2"]["images"]) == (1000, 999, 1)


def test_aeron_stat_reads_the_shmbus_driver_counters(aeron: Programs, side: ShmbusSide,
                                                     bus_context: Any) -> None:
    """Aeron's counters API (aeron_cnc_init, aeron_counters_reader_foreach_counter) reads the
    bus as AeronStat does: the CnC header, the system counters, the pub-lmt of a stream and
    the heartbeat of each client, shmbus's and Aeron's."""
    subscriber = started_subscriber(aeron, {1: 1})
    side.publish(1, 1, 32)
    side.published()
    received(subscriber.finish(), {1: 1})
    stat = aeron.stat()
    assert stat.returncode == 0, stat.stderr
    cnc, *counters = stat.json_lines()
    assert cnc["cnc_version_text"] == "0.2.0"
    assert cnc["pid"] == int(Path(bus_context.dir, "driver.lock").read_text().split()[0])
    by_label = {c["label"]: c for c in counters}
    assert by_label["bytes published"]["type_id"] == 0
    assert any(c["type_id"] == PUB_LIMIT and f" {STREAM} aeron:ipc" in c["label"]
               for c in counters)
    assert any(c["type_id"] == CLIENT_HEARTBEAT for c in counters)


def shown(command: str, directory: str) -> dict[str, Any]:
    """``shmbus <command> --json``'s document, valid against its schema."""
    result = run(command, *(["--once"] if command == "stat" else []), "--json", "--dir",
                 directory)
    assert result.exit_code == 0, result.stderr
    document: dict[str, Any] = json.loads(result.stdout)
    Draft202012Validator(load_schema(command)).validate(document)
    return document


def test_shmbus_clients_streams_and_stat_show_aeron_clients(aeron: Programs,
                                                            bus_context: Any) -> None:
    """By name and version (from the heartbeat label the Aeron client completes), alive by
    heartbeat (an Aeron client does not tell its pid), with the stream each uses."""
    subscriber = started_subscriber(aeron, {1: 1})
    bus = shmbus.connect(bus_context)
    bus.add_publication("aeron:ipc", STREAM)
    name = "aeron aeron_subscribe 1.53"

    def listed() -> list[dict[str, Any]]:
        return [c for c in shown("clients", bus_context.dir)["clients"]
                if c["name"].startswith(name)]

    try:
        wait_until(lambda: [c["subscriptions"] for c in listed()] == [[STREAM]], 10,
                   "shmbus clients to list the Aeron client with its image")
        (client,) = listed()
        assert client["state"] == "alive" and client["pid"] == 0 and client["process"] is None
        (stream,) = shown("streams", bus_context.dir)["streams"]
        (reader,) = stream["subscribers"]
        assert reader["name"].startswith(name) and reader["pid"] is None
        counters = shown("stat", bus_context.dir)["counters"]
        assert [c["client_name"] for c in counters if c["type"] == "sub-pos"] == [
            reader["name"]]
    finally:
        subscriber.kill()
        bus.close()


def test_a_shmbus_client_refuses_an_aeron_media_drivers_directory(
        aeron_c: AeronC, shm_dir: Path, tmp_path: Path) -> None:
    """shmbus's clients need a shmbus driver: on the directory of Aeron's own driver they say
    so, rather than wait for a driver or start one over it."""
    directory = shm_dir / "aeron"
    with running_aeronmd(aeron_c.aeronmd, directory, tmp_path / "aeronmd.log"):
        for embedded in (False, True):
            context = shmbus.Context(dir=str(directory), embedded_driver=embedded,
                                     driver_timeout=5.0)
            with pytest.raises(CncLayoutError, match="an Aeron media driver's"):
                shmbus.connect(context)
