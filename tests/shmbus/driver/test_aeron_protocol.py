"""The driver as an Aeron client sees it, byte for byte: commands written straight into the
to-driver ring as Aeron's client writes them, answers read from cnc.dat's to-clients buffer
(the one Aeron's clients read). tests/shmbus/driver/test_aeron_clients.py runs Aeron's real C
client; these pin the rules one by one."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import shmbus
from shmbus.shm import control_protocol as cp
from shmbus.shm.broadcast import BroadcastReceiver
from shmbus.shm.cnc import (
    COUNTERS_METADATA,
    COUNTERS_VALUES,
    EVENTS,
    TO_CLIENTS,
    TO_DRIVER,
    CncFile,
)
from shmbus.shm.counters import CLIENT_HEARTBEAT, COUNTER_LENGTH, CountersReader
from shmbus.shm.log_buffer import READERS_RAISE_OFFSET, LogBuffer
from shmbus.shm.ring_buffer import ManyToOneRingBuffer
from tests.support.waits import wait_until

pytestmark = pytest.mark.timeout(60)


class RawAeronClient:
    """What Aeron's client does on cnc.dat, in Python: commands by type id and bytes, the
    to-clients buffer read as Aeron's conductor reads it (one receiver, from the latest)."""

    def __init__(self, directory: Path) -> None:
        self.cnc = CncFile.open(directory)
        self.ring = ManyToOneRingBuffer(self.cnc.section(TO_DRIVER))
        self.to_clients = BroadcastReceiver(self.cnc.section(TO_CLIENTS))
        self.events = BroadcastReceiver(self.cnc.section(EVENTS))
        self.counters = CountersReader(self.cnc.section(COUNTERS_METADATA),
                                       self.cnc.section(COUNTERS_VALUES))
        self.client_id = self.ring.next_correlation_id()

    def send(self, type_id: int, body: bytes) -> int:
        """Write a command (client id, a fresh correlation id, ``body``); its correlation id."""
        correlation_id = self.ring.next_correlation_id()
        assert self.ring.write(type_id, struct.pack("<qq", self.client_id, correlation_id)
                               + body)
        return correlation_id

    def responses(self, receiver: BroadcastReceiver | None = None, *, until: Any,
                  timeout: float = 10.0) -> list[tuple[int, bytes]]:
        """(type id, bytes) of every message on ``receiver`` (the to-clients buffer) up to the
        first for which ``until(type_id, data)`` holds; the test fails when none does in
        ``timeout`` seconds."""
        receiver = receiver or self.to_clients
        seen: list[tuple[int, bytes]] = []

        def arrived() -> bool:
            while receiver.receive_next():
                seen.append((receiver.msg_type, receiver.buffer))
                if until(*seen[-1]):
                    return True
            return False

        wait_until(arrived, timeout, lambda: f"the response; seen {seen}")
        return seen


@pytest.fixture
def raw(bus_context: Any, driver: Any) -> Iterator[RawAeronClient]:
    client = RawAeronClient(Path(bus_context.dir))
    try:
        yield client
    finally:
        client.cnc.close()


def answered(correlation_id: int, type_id: int) -> Any:
    return lambda t, data: t == type_id and struct.unpack_from("<q", data)[0] == correlation_id


def subscription(stream_id: int, channel: str) -> bytes:
    """ADD_SUBSCRIPTION's body: registration correlation id 0, stream, channel."""
    return struct.pack("<qii", 0, stream_id, len(channel)) + channel.encode()


def test_an_aeron_client_joins_with_its_first_add(raw: RawAeronClient) -> None:
    """Its heartbeat counter (type 11, the client id in its key's first 8 bytes) is announced
    by ON_COUNTER_READY(client id), before the subscription's ready."""
    correlation_id = raw.send(0x04, subscription(7, "aeron:ipc"))
    seen = raw.responses(until=answered(correlation_id, 0x0F07))
    heartbeat = [data for t, data in seen if t == 0x0F08
                 and struct.unpack_from("<q", data)[0] == raw.client_id]
    assert len(heartbeat) == 1
    (counter_id,) = struct.unpack_from("<i", heartbeat[0], 8)
    assert raw.counters.get_type_id(counter_id) == CLIENT_HEARTBEAT
    assert raw.counters.get_key(counter_id)[:8] == struct.pack("<q", raw.client_id)
    assert raw.counters.get_registration_id(counter_id) == raw.client_id
    assert len(seen[-1][1]) == 12  # ON_SUBSCRIPTION_READY: correlation id, channel status
    assert struct.unpack_from("<i", seen[-1][1], 8) == (cp.CHANNEL_STATUS_NOT_ALLOCATED,)


def test_the_to_clients_buffer_has_only_aerons_responses(raw: RawAeronClient,
                                                         bus_context: Any) -> None:
    """A shmbus client connecting, publishing and subscribing: Aeron's clients hear Aeron's
    responses only (they exit on anything else); shmbus's events buffer has them all, in the
    same order (a last command of the Aeron client's own marks the end)."""
    with shmbus.connect(bus_context) as bus:
        publication = bus.add_publication("aeron:ipc", 9)
        bus.add_subscription("aeron:ipc", 9)
        publication.publish(b"x", timeout=5)
    sentinel = raw.send(0x09, struct.pack("<ii", 1101, 0) + struct.pack("<i", 0))  # a counter
    aeron = raw.responses(until=answered(sentinel, 0x0F08))
    assert {t for t, _ in aeron} <= cp.AERON_RESPONSES
    events = raw.responses(raw.events, until=answered(sentinel, 0x0F08))
    assert cp.OnClientReady.TYPE_ID in {t for t, _ in events}
    assert [t for t, _ in aeron] == [t for t, _ in events if t in cp.AERON_RESPONSES]


def test_a_publication_ready_names_its_log_by_absolute_path_and_marks_it(
        raw: RawAeronClient) -> None:
    channel = b"aeron:ipc"
    correlation_id = raw.send(0x01, struct.pack("<ii", 5, len(channel)) + channel)
    data = raw.responses(until=answered(correlation_id, 0x0F03))[-1][1]
    (correlation, registration, _session, stream, limit_id, status, length) = struct.unpack_from(
        "<qqiiiii", data)
    assert (correlation, registration, stream, status) == (correlation_id, correlation_id, 5,
                                                            -1)
    path = data[36:36 + length].decode()
    assert Path(path).is_absolute() and Path(path).exists()
    assert raw.counters.get_type_id(limit_id) == 1  # pub-lmt
    log = LogBuffer.open(path)  # marked: its shmbus readers raise the limit too
    assert log.buffer.get_int32(log.meta_offset + READERS_RAISE_OFFSET) == limit_id + 1
    log.close()


def test_aeron_counters_are_added_and_removed_by_registration_id(raw: RawAeronClient) -> None:
    key, label = b"\x01\x02\x03", b"my counter"
    body = struct.pack("<ii", 1101, len(key)) + key + bytes(-len(key) % 4)
    body += struct.pack("<i", len(label)) + label
    added = raw.send(0x09, body)
    ready = raw.responses(until=answered(added, 0x0F08))[-1][1]
    (counter_id,) = struct.unpack_from("<i", ready, 8)
    assert raw.counters.get_label(counter_id) == "my counter"
    assert raw.counters.get_key(counter_id)[:3] == key
    assert raw.counters.get_type_id(counter_id) == 1101
    assert raw.counters.get_registration_id(counter_id) == added

    removed = raw.send(0x0A, struct.pack("<q", added))
    seen = raw.responses(until=lambda t, data: t == 0x0F09)
    assert (0x0F04, struct.pack("<q", removed)) in seen
    assert seen[-1][1] == struct.pack("<qi", added, counter_id)

    unknown = raw.send(0x0A, struct.pack("<q", added))
    error = raw.responses(until=answered(unknown, 0x0F01))[-1][1]
    assert struct.unpack_from("<i", error, 8) == (cp.UNKNOWN_COUNTER,)


def test_a_command_the_driver_does_not_serve_is_refused_by_its_correlation_id(
        raw: RawAeronClient) -> None:
    """REJECT_IMAGE (0x10): ON_ERROR UNKNOWN_COMMAND_TYPE_ID, not a 10 s client timeout."""
    refused = raw.send(0x10, struct.pack("<qqi", 1, 0, 0))
    error = raw.responses(until=answered(refused, 0x0F01))[-1][1]
    (code, length) = struct.unpack_from("<ii", error, 8)
    assert code == cp.UNKNOWN_COMMAND_TYPE_ID and b"0x10" in error[16:16 + length]


def test_a_closed_aeron_client_does_not_join_again(raw: RawAeronClient) -> None:
    first = raw.send(0x04, subscription(7, "aeron:ipc"))
    raw.responses(until=answered(first, 0x0F07))
    raw.send(0x0B, b"")  # CLIENT_CLOSE
    raw.responses(until=lambda t, data: t == 0x0F09
                  and struct.unpack_from("<q", data)[0] == raw.client_id)
    again = raw.send(0x04, subscription(7, "aeron:ipc"))
    error = raw.responses(until=answered(again, 0x0F01))[-1][1]
    assert b"unknown client" in error


def test_a_keepalive_moves_an_aeron_clients_heartbeat(raw: RawAeronClient) -> None:
    """CLIENT_KEEPALIVE (Aeron's Java client's way; the C client writes the counter)."""
    first = raw.send(0x04, subscription(7, "aeron:ipc"))
    seen = raw.responses(until=answered(first, 0x0F07))
    (counter_id,) = [struct.unpack_from("<i", data, 8)[0] for t, data in seen
                     if t == 0x0F08 and struct.unpack_from("<q", data)[0] == raw.client_id]
    # a second old (within the 2 s liveness): the keepalive must bring it to now
    old = raw.counters.get_value(counter_id) - 1000
    raw.cnc.section(COUNTERS_VALUES).put_int64_release(counter_id * COUNTER_LENGTH, old)
    raw.send(0x06, b"")
    wait_until(lambda: raw.counters.get_value(counter_id) > old, 5,
               "the keepalive to move the heartbeat")
