"""Authenticated channels end to end (issue 34): two buses with their drivers and netbridges,
a keyed stream over loopback, and a stranger with plain sockets and no key. Real processes
and sockets; the stranger also sees the wire through a UDP relay on the path."""

from __future__ import annotations

import multiprocessing as mp
import os
import select
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import shmbus
from netbridge import _io
from netbridge.frames import Nak, SetupFrame, StatusMessage, data_frame, encode_datagram
from shmbus.cli import app
from shmbus.settings.keyring import load_keyring, new_key_line
from shmbus.shm.cnc import ERROR_LOG
from shmbus.shm.error_log import read_error_log
from tests.support.drivers import start_driver, stop_driver
from tests.support.keyrings import keyring_at
from tests.support.networks import bus_pair, channel_counters, free_udp_port
from tests.support.waits import wait_until
from tests.support.workers import bridge_workers, keyed_workers

KEY = "e2e"
SEALED_TYPE = 0x5EA1



def keyed_buses(shm_dir: Path, keyring: Path) -> tuple[list[shmbus.Context], list[Any]]:
    return bus_pair(shm_dir, keyring=str(keyring))


class Relay:
    """A UDP relay between a publisher's netbridge and a subscriber's endpoint (both ways), in
    a thread: what a stranger on the path sees. It keeps the first datagrams the publisher
    sends."""

    def __init__(self, endpoint: tuple[str, int], keep: int = 5000) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.address = self.sock.getsockname()
        self.endpoint = endpoint
        self.recorded: list[bytes] = []
        #: what the subscriber's netbridge sends back (status messages, NAKs)
        self.control: list[bytes] = []
        self._keep = keep
        self._publisher: tuple[str, int] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if not select.select([self.sock], [], [], 0.05)[0]:
                continue
            data, source = self.sock.recvfrom(65536)
            if source == self.endpoint:
                if self._publisher is not None:
                    if len(self.control) < self._keep:
                        self.control.append(data)
                    self.sock.sendto(data, self._publisher)
                continue
            self._publisher = source
            if len(self.recorded) < self._keep:
                self.recorded.append(data)
            self.sock.sendto(data, self.endpoint)

    def wait_recorded(self, count: int, timeout: float) -> None:
        wait_until(lambda: len(self.recorded) >= count, timeout,
                   lambda: f"{count} datagrams relayed ({len(self.recorded)} so far)")

    @property
    def publisher(self) -> tuple[str, int]:
        """Where the publisher's netbridge sends from (it hears status messages there)."""
        assert self._publisher is not None
        return self._publisher

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


def keyed_stream(pool: Any, spawn: Any, ctx_a: shmbus.Context, ctx_b: shmbus.Context,
                 relay: Relay, count: int) -> tuple[Any, Any]:
    """``count`` checked messages on stream 7 of a keyed channel, bus A to bus B through
    ``relay``, paced at 15,000 a second (so faults strike mid-stream): the subscriber's and
    the publisher's async results."""
    host, port = relay.endpoint
    ready = spawn.Manager().Event()
    sub = pool.apply_async(bridge_workers.subscribe, (
        ctx_b, f"aeron:udp?endpoint={host}:{port}|key={KEY}", 7, count, 120, ready))
    assert ready.wait(30)
    pub = pool.apply_async(bridge_workers.publish, (
        ctx_a, f"aeron:udp?endpoint={relay.address[0]}:{relay.address[1]}|key={KEY}", 7, count,
        120, 15_000))
    return sub, pub


def wait_counters(context: shmbus.Context, expected: dict[str, int],
                  timeout: float = 10) -> dict[str, int]:
    """The channel counters once they show ``expected`` (the netbridge mirrors them every
    millisecond or so), or as they are after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        counters = channel_counters(context)
        if all(counters.get(k) == v for k, v in expected.items()) or (
                time.monotonic() > deadline):
            return counters
        time.sleep(0.05)


def error_texts(context: shmbus.Context) -> list[str]:
    with shmbus.connect(context) as bus:
        return [o.text for o in read_error_log(bus.cnc.section(ERROR_LOG))]


def forged_stream(session_id: int, stream_id: int, payload: bytes) -> list[bytes]:
    """A plaintext SETUP and one DATA frame carrying ``payload``, as a stranger writes them."""
    setup = SetupFrame(term_offset=0, session_id=session_id, stream_id=stream_id,
                       initial_term_id=0, active_term_id=0, term_length=1 << 16, mtu=1408)
    data = data_frame(session_id=session_id, stream_id=stream_id, term_id=0, term_offset=0,
                      payload=payload)
    return [encode_datagram([setup]), encode_datagram([data])]


class Exploit:
    """A pickle that, when unpickled, creates a file: the code a stranger wants run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def object_message(obj: Any) -> bytes:
    from shmbus.codecs.object_messages import object_parts
    return b"".join(bytes(part) for part in object_parts(obj))


def test_a_stranger_cannot_write_into_a_keyed_stream_and_every_drop_is_counted(
        shm_dir: Path, tmp_path: Path) -> None:
    keyring = keyring_at(tmp_path / "keyring", new_key_line(KEY))
    (ctx_a, ctx_b), drivers = keyed_buses(shm_dir, keyring)
    endpoint = ("127.0.0.1", free_udp_port())
    relay = Relay(endpoint)
    count = 60_000
    spawn = mp.get_context("spawn")
    strangers = {kind: socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                 for kind in ("plaintext", "unknown key", "bad tag", "replayed")}
    try:
        with spawn.Pool(2) as pool:
            sub, pub = keyed_stream(pool, spawn, ctx_a, ctx_b, relay, count)
            relay.wait_recorded(200, 30)
            recorded = list(relay.recorded)
            sent = {"plaintext": 0, "unknown key": 0, "bad tag": 0, "replayed": 0}

            def send(kind: str, datagram: bytes, counted_as: str | None = None) -> None:
                strangers[kind].sendto(datagram, endpoint)
                sent[counted_as or kind] += 1

            for datagram in forged_stream(4242, 7, object_message(Exploit(tmp_path / "x"))):
                send("plaintext", datagram)
            stranger_key = _io.Sealer([(1, os.urandom(32), True)])
            own_id = load_keyring(keyring).keys[0].key_id
            wrong_secret = _io.Sealer([(own_id, os.urandom(32), True)])
            for datagram in forged_stream(4243, 7, b"forged"):
                send("unknown key", stranger_key.seal(datagram))
                send("bad tag", wrong_secret.seal(datagram))
            for datagram in recorded[10:30]:  # a flipped bit (in the counter: not yet seen)
                flipped = bytearray(datagram)
                flipped[35] ^= 0x40
                send("bad tag", bytes(flipped))
            for datagram in recorded[30:40]:  # truncated
                send("bad tag", datagram[:len(datagram) // 2])
            for datagram in recorded[40:60]:  # replayed as they were
                send("replayed", datagram)
            # at the sender: a forged status message and NAK (plaintext), and replayed
            # status messages, which would steer its limit and retransmissions
            session_id = struct.unpack_from("<i", relay.control[0], 44 + 8)[0]
            at_sender = relay.publisher
            forged_sm = StatusMessage(session_id=session_id, stream_id=7, consumption_term_id=0,
                                      consumption_term_offset=0, receiver_window=1 << 30,
                                      receiver_id=99).encode()
            forged_nak = Nak(session_id=session_id, stream_id=7, term_id=0, term_offset=0,
                             length=4096).encode()
            replays = relay.control[:5]
            assert replays
            for datagram in (forged_sm, forged_nak, *replays):
                strangers["replayed"].sendto(datagram, at_sender)
            at_a = {"dropped plaintext": 2, "dropped replayed": len(replays),
                    "dropped unknown key": 0, "dropped bad tag": 0}  # while the stream runs
            got_a = wait_counters(ctx_a, at_a)
            assert {k: v for k, v in got_a.items() if k.startswith("dropped")} == at_a, got_a
            streams = CliRunner().invoke(app, ["streams", "--dir", ctx_a.dir])
            assert f"|key={KEY} (authenticated, key {KEY})" in streams.output, streams.output
            summary = sub.get(150)
            assert pub.get(150) == count
        assert summary == {"received": count, "out_of_order": 0, "bad_checksum": 0, "images": 1}
        expected = {f"dropped {kind}": n for kind, n in sent.items()}
        assert {k: v for k, v in wait_counters(ctx_b, expected).items()
                if k.startswith("dropped")} == expected
        exposition = CliRunner().invoke(app, ["stat", "--dir", ctx_b.dir, "--openmetrics"])
        assert 'name="dropped bad tag"' in exposition.output
        texts = error_texts(ctx_b)
        for kind, stranger in strangers.items():
            port = stranger.getsockname()[1]
            assert any(f"dropped a datagram from 127.0.0.1:{port}: {kind}" in text
                       for text in texts), (kind, texts)
        assert not (tmp_path / "x").exists()
        # the wire: every datagram sealed, no message bytes in the clear
        assert all(struct.unpack_from("<H", d, 6)[0] == SEALED_TYPE for d in relay.recorded)
        known = bridge_workers.message(150)[12:40]
        assert not any(known in d for d in relay.recorded)
    finally:
        relay.close()
        for stranger in strangers.values():
            stranger.close()
        for driver in drivers:
            stop_driver(driver)


def test_the_forged_pickle_never_runs_on_a_keyed_channel_and_the_key_holders_objects_arrive(
        shm_dir: Path, tmp_path: Path) -> None:
    keyring = keyring_at(tmp_path / "keyring", new_key_line(KEY))
    (ctx_a, ctx_b), drivers = keyed_buses(shm_dir, keyring)
    port = free_udp_port()
    channel = f"aeron:udp?endpoint=127.0.0.1:{port}|key={KEY}"
    marker = tmp_path / "pwned"
    objects = [{"n": i, "text": "x" * i} for i in range(10)]
    spawn = mp.get_context("spawn")
    try:
        with spawn.Pool(2) as pool, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as stranger:
            ready = spawn.Manager().Event()
            reader = pool.apply_async(keyed_workers.read_objects,
                                      (ctx_b, channel, 9, len(objects) + 1, 8, ready))
            assert ready.wait(30)
            for datagram in forged_stream(777, 9, object_message(Exploit(marker))):
                stranger.sendto(datagram, ("127.0.0.1", port))
                stranger.sendto(_io.Sealer([(5, os.urandom(32), True)]).seal(datagram),
                                ("127.0.0.1", port))
            writer = pool.apply_async(keyed_workers.publish_objects,
                                      (ctx_a, channel, 9, objects, 30))
            assert writer.get(60) == len(objects)
            # read while the reader still holds the channel: its counters go with the channel
            counters = wait_counters(ctx_b, {"dropped plaintext": 2, "dropped unknown key": 2})
            got = reader.get(60)  # asks for one more than was sent: waits out its timeout
        assert got == objects
        assert not marker.exists()
        assert (counters.get("dropped plaintext"), counters.get("dropped unknown key")) == (2, 2)
    finally:
        for driver in drivers:
            stop_driver(driver)


def test_a_key_rotated_under_load_loses_duplicates_and_reorders_nothing(
        shm_dir: Path, tmp_path: Path) -> None:
    old, new = new_key_line(KEY), new_key_line(KEY)
    keyring = keyring_at(tmp_path / "keyring", old)
    (ctx_a, ctx_b), drivers = keyed_buses(shm_dir, keyring)
    endpoint = ("127.0.0.1", free_udp_port())
    relay = Relay(endpoint, keep=10**9)
    count = 120_000
    spawn = mp.get_context("spawn")
    try:
        with spawn.Pool(2) as pool:
            sub, pub = keyed_stream(pool, spawn, ctx_a, ctx_b, relay, count)
            relay.wait_recorded(100, 30)
            for step, lines in enumerate(([old, new + " receive-only"], [old, new], [new])):
                keyring_at(keyring, *lines)
                # as an operator does: the next step once both bridges have taken this one
                for context in (ctx_a, ctx_b):
                    wait_until(lambda c=context, n=step + 2: channel_counters(c)["keyring loads"]
                               == n, 30, f"rotation step {step + 1} to reach the bridge")
            summary = sub.get(150)
            assert pub.get(150) == count
        assert summary == {"received": count, "out_of_order": 0, "bad_checksum": 0, "images": 1}
        ids = [struct.unpack_from("<I", d, 8)[0] for d in relay.recorded]
        old_id, new_id = (int(line.split()[1]) for line in (old, new))
        assert ids[0] == old_id and ids[-1] == new_id
        assert set(ids) == {old_id, new_id}
        switched = ids.index(new_id)
        assert set(ids[switched:]) == {new_id}  # one switch, never back
        for context in (ctx_a, ctx_b):
            dropped = {k: v for k, v in channel_counters(context).items()
                       if k.startswith("dropped")}
            assert dropped == dict.fromkeys(dropped, 0) and len(dropped) == 4
    finally:
        relay.close()
        for driver in drivers:
            stop_driver(driver)


def test_an_endpoint_is_keyed_or_not_and_a_key_the_keyring_lacks_is_refused_at_once(
        bus_context: shmbus.Context, tmp_path: Path) -> None:
    keyring = keyring_at(tmp_path / "keyring", new_key_line(KEY))
    context = bus_context.with_(keyring=str(keyring))
    driver = start_driver(context)
    port = free_udp_port()
    try:
        check_keyed_endpoints(context, keyring, port)
    finally:
        stop_driver(driver)


def check_keyed_endpoints(context: shmbus.Context, keyring: Path, port: int) -> None:
    with shmbus.connect(context) as bus:
        keyed = bus.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}|key={KEY}", 1)
        for stream_id in (1, 2):  # the same stream, or another on the same endpoint
            with pytest.raises(shmbus.RegistrationError,
                               match=f"keyed with '{KEY}'.*names no key"):
                bus.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}", stream_id)
        keyed.close()  # the endpoint lingers keyed a while; a plain channel opens it again
        bus.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}", 2).close()
        with pytest.raises(shmbus.RegistrationError, match="holds no key named 'missing'"):
            bus.add_publication(f"aeron:udp?endpoint=127.0.0.1:{port}|key=missing", 3)
    keyring.chmod(0o644)
    with shmbus.connect(context) as bus, pytest.raises(shmbus.RegistrationError,
                                                       match="chmod 600"):
        bus.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}|key={KEY}", 1)
