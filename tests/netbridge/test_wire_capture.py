"""An independent decoder for what the netbridge puts on the wire: an end-to-end run over
loopback (two buses, their drivers and auto-started netbridges, 5% loss injected) is captured
with ``tshark -i lo`` and read back by Wireshark's Aeron dissector.

The run is shaped so that every frame type appears: SETUP and status messages at the
handshake, heartbeats while the connected publication is idle, DATA with whole and fragmented
messages and PAD at each end of a 64 KiB term, NAKs for the injected loss, RTT measurement
requests and echoes (the test waits until the receiving bridge has measured an RTT), and
end-of-stream heartbeats answered by EOS status messages after the publication closes.

tshark is required (``make test`` installs it): without it the test fails, never skips.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import shmbus
from netbridge.frames import decode_frames
from netbridge.receiver import RECEIVER_WINDOW_DEFAULT
from tests.support.drivers import stop_driver
from tests.support.networks import bus_pair, free_udp_port
from tests.support.pcap import read_udp
from tests.support.waits import time_left, wait_until
from tests.support.wireshark import (
    COLUMNS,
    EXTRA_COLUMNS,
    Decoded,
    expected_columns,
)
from tests.support.workers import bridge_workers

MESSAGES = 20_000  # every 1000th is a 3000-byte message: 20 of them in three fragments
STREAM = 5
TERM_LENGTH = 64 * 1024  # small terms: the run crosses ~40 of them, each ending with a PAD
LOSS = "drop=0.05,seed=23"
RUN_TIMEOUT = 20.0  # the whole run over the bridges; every wait below is bounded by it
TSHARK_TIMEOUT = 15.0

Rows = dict[int, dict[str, list[int]]]


def require_tshark() -> str:
    tshark = shutil.which("tshark")
    if tshark is None:
        pytest.fail(
            "tshark is not installed: this test reads a capture of the netbridge with "
            "Wireshark's Aeron dissector. `make test` installs it (Debian package tshark); "
            "by hand: DEBIAN_FRONTEND=noninteractive apt-get install -y tshark"
        )
    return tshark


@contextmanager
def capturing(tshark: str, port: int, path: Path) -> Iterator[None]:
    """tshark captures UDP to or from ``port`` on lo into ``path`` (classic pcap) while the
    block runs: started and seen capturing before the block, stopped with SIGINT after."""
    process = subprocess.Popen(
        [tshark, "-n", "-i", "lo", "-f", f"udp port {port}", "-F", "pcap", "-w", str(path)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    stderr: list[str] = []
    started = threading.Event()

    def read_stderr() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            stderr.append(line)
            if "Capturing on" in line:
                started.set()

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + TSHARK_TIMEOUT
        while not started.wait(0.05):
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"tshark did not start capturing on lo: {''.join(stderr)}")
        yield
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
        try:
            process.wait(TSHARK_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            pytest.fail(f"tshark did not stop on SIGINT: {''.join(stderr)}")
        reader.join(TSHARK_TIMEOUT)
    assert process.returncode == 0, f"tshark exited with {process.returncode}: {stderr}"
    assert path.is_file() and path.stat().st_size > 24, f"empty capture: {''.join(stderr)}"


def receive_counters(bus: shmbus.Client) -> dict[str, int]:
    return {c.label.split(":")[0]: c.value for c in bus.counters.counters() if c.type_id >= 100}


def run_traffic(ctx_a: shmbus.Context, ctx_b: shmbus.Context, channel: str) -> dict[str, int]:
    """Publish MESSAGES on bus A, receive them all on bus B through the bridges, wait for an
    RTT measurement, close the publication and see the image reach end of stream. Returns
    the publication's geometry and ids, and bus B's channel counters."""
    deadline = time.monotonic() + RUN_TIMEOUT
    got: list[bytes] = []
    assembler = shmbus.FragmentAssembler(lambda buffer, header: got.append(bytes(buffer)))
    with shmbus.connect(ctx_b) as bus_b, shmbus.connect(ctx_a) as bus_a:
        subscription = bus_b.add_subscription(channel, STREAM)
        publication = bus_a.add_exclusive_publication(channel, STREAM)
        facts = {"session_id": publication.session_id, "stream_id": publication.stream_id,
                 "term_length": publication.term_length, "mtu": publication.mtu,
                 "initial_term_id": publication.initial_term_id}

        def poll() -> int:
            return subscription.poll(assembler, 256)

        wait_until(lambda: publication.is_connected and bool(subscription.images),
                   time_left(deadline), "the publication to connect through the bridges",
                   poll=poll)
        idle_until = time.monotonic() + 0.35  # idle and connected: heartbeats every 100 ms
        wait_until(lambda: time.monotonic() > idle_until, time_left(deadline), "the idle time",
                   poll=poll)

        sent = 0
        while sent < MESSAGES:
            assert time.monotonic() < deadline, f"stuck at {sent} sent, {len(got)} received"
            if publication.offer(bridge_workers.message(sent)) > 0:
                sent += 1
            else:
                subscription.poll(assembler, 256)
        wait_until(lambda: len(got) >= MESSAGES, time_left(deadline), f"{MESSAGES} messages",
                   poll=poll)
        assert got == [bridge_workers.message(i) for i in range(MESSAGES)]

        # the receiving bridge measures RTT once a second: wait for a request and its echo
        wait_until(lambda: receive_counters(bus_b).get("rtt ns", 0) > 0, time_left(deadline),
                   "an RTT measurement (counter 'rtt ns')", poll=poll)

        (image,) = subscription.images
        publication.close()
        wait_until(lambda: image.is_end_of_stream, time_left(deadline), "the end of stream",
                   poll=poll)
        linger = time.monotonic() + 0.6  # EOS heartbeats every 100 ms, EOS SMs every 200 ms
        wait_until(lambda: time.monotonic() > linger, time_left(deadline), "the EOS linger",
                   poll=poll)
        facts.update(receive_counters(bus_b))
    return facts


def tshark_fields(tshark: str, capture: Path, port: int, columns: list[str]) -> Rows:
    command = [tshark, "-n", "-r", str(capture), "-d", f"udp.port=={port},aeron", "-T", "fields",
               "-E", "separator=/t", "-E", "occurrence=a", "-E", "aggregator=,",
               "-e", "frame.number"]
    for column in columns:
        command += ["-e", column]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, f"tshark failed: {result.stderr}"
    rows: Rows = {}
    for line in result.stdout.splitlines():
        number, *cells = line.split("\t")
        assert len(cells) == len(columns), line
        rows[int(number)] = {
            column: [int(value, 0) for value in cell.split(",")] if cell else []
            for column, cell in zip(columns, cells, strict=True)
        }
    return rows


def tshark_text(tshark: str, capture: Path, port: int, *args: str) -> str:
    result = subprocess.run(
        [tshark, "-n", "-r", str(capture), "-d", f"udp.port=={port},aeron", *args],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 0, f"tshark failed: {result.stderr}"
    return result.stdout


def column(rows: Rows, name: str) -> list[int]:
    return [value for row in rows.values() for value in row[name]]


def fields(rows: Rows, kind: str, *names: str, **where: int) -> list[tuple[int, ...]]:
    """Every ``kind`` frame's ``names`` fields as tuples (frames in packet order), keeping
    only packets whose scalar columns (``udp_srcport=...``) match ``where``."""
    out = []
    for row in rows.values():
        if any(row[key.replace("_", ".")] != [value] for key, value in where.items()):
            continue
        out += zip(*(row[f"aeron.{kind}.{name}"] for name in names), strict=True)
    return out


@pytest.fixture
def capture(shm_dir: Path, tmp_path: Path) -> Iterator[tuple[str, Path, int, dict[str, int]]]:
    """Run the traffic under tshark; yields (tshark, capture file, endpoint port, facts)."""
    tshark = require_tshark()
    (ctx_a, ctx_b), drivers = bus_pair(shm_dir, LOSS)
    port = free_udp_port()
    channel = f"aeron:udp?endpoint=127.0.0.1:{port}|term-length={TERM_LENGTH}"
    path = tmp_path / "netbridge.pcap"
    try:
        with capturing(tshark, port, path):
            facts = run_traffic(ctx_a, ctx_b, channel)
    finally:
        for process in drivers:
            stop_driver(process)
    yield tshark, path, port, facts


def test_wiresharks_aeron_dissector_reads_an_end_to_end_run(capture) -> None:  # noqa: ANN001
    tshark, path, port, facts = capture
    # the dissector shows 32-bit fields unsigned
    session, stream = facts["session_id"] % 2**32, facts["stream_id"] % 2**32
    initial_term_id = facts["initial_term_id"] % 2**32
    ports = ["udp.srcport", "udp.dstport"]
    rows = tshark_fields(tshark, path, port, COLUMNS + EXTRA_COLUMNS + ports)
    to_endpoint = {"udp_dstport": port}  # sender -> receiver
    from_endpoint = {"udp_srcport": port}  # receiver -> sender

    # no malformed packet, no expert error
    assert tshark_text(tshark, path, port, "-Y", "_ws.malformed", "-T", "fields",
                       "-e", "frame.number").split() == []
    expert = tshark_text(tshark, path, port, "-q", "-z", "expert")
    assert "Errors (" not in expert and "Malformed" not in expert, expert

    # SETUP: the publication's geometry and ids
    setups = fields(rows, "setup", "frame_length", "flags", "session_id", "stream_id",
                    "initial_term_id", "term_length", "mtu", "ttl", **to_endpoint)
    assert setups and set(setups) == {(40, 0, session, stream, initial_term_id,
                                       facts["term_length"], facts["mtu"], 0)}
    assert len(setups) == len(column(rows, "aeron.setup.type"))

    # DATA: every frame of the publication's session and stream, whole messages and fragments
    # (B 0x80, middle 0x00, E 0x40), and end-of-stream heartbeats (0xE0, length 0) that
    # Wireshark files under DATA
    data = fields(rows, "data", "frame_length", "flags", "session_id", "stream_id",
                  **to_endpoint)
    assert len(data) == len(column(rows, "aeron.data.type")) > MESSAGES // 10
    assert {(s, t) for _, _, s, t in data} == {(session, stream)}
    flags = Counter(f for length, f, _, _ in data if length)
    assert set(flags) == {0xC0, 0x80, 0x00, 0x40}, flags
    # every fragmented message's first and last fragment at least once (retransmits add more)
    assert min(flags[0x80], flags[0x40]) >= MESSAGES // 1000
    assert all(length <= facts["mtu"] for length, _, _, _ in data)
    eos = [f for length, f, _, _ in data if length == 0]
    assert eos and set(eos) == {0xE0}
    pads = fields(rows, "pad", "term_offset", "frame_length", "session_id", **to_endpoint)
    assert pads and all(offset + length == TERM_LENGTH for offset, length, _ in pads)

    # heartbeats while idle: frame length 0, flags 0xC0, 32 bytes on the wire
    beats = fields(rows, "heartbeat", "frame_length", "flags", "session_id", "stream_id",
                   **to_endpoint)
    assert beats and set(beats) == {(0, 0xC0, session, stream)}
    for row in rows.values():
        if row["aeron.heartbeat.type"]:
            assert row["udp.length"] == [8 + 32]

    # status messages: 36 bytes, one receiver id, the window (half the 64 KiB term), and the
    # EOS flag once the image ended
    sms = fields(rows, "sm", "frame_length", "flags", "session_id", "receiver_window",
                 "receiver_id", **from_endpoint)
    assert len(sms) == len(column(rows, "aeron.sm.type")) > 0
    assert {length for length, *_ in sms} == {36}
    (receiver_id,) = {rid for *_, rid in sms}
    assert receiver_id != 0
    normal = [(f, s, w) for _, f, s, w, _ in sms if not f & 0x80]  # not a SETUP request
    assert {s for _, s, _ in normal} == {session}
    assert {w for _, _, w in normal} == {min(RECEIVER_WINDOW_DEFAULT, TERM_LENGTH // 2)}
    assert {f for f, _, _ in normal} == {0x00, 0x40}

    # NAKs for the injected loss: 28 bytes, whole frames (multiples of 32) inside the term
    naks = fields(rows, "nak", "frame_length", "flags", "session_id", "stream_id",
                  "term_offset", "length", **from_endpoint)
    assert len(naks) == len(column(rows, "aeron.nak.type")) > 0
    assert facts["naks sent"] > 0 and facts["gaps"] > 0
    for length, flag, nak_session, nak_stream, offset, nak_length in naks:
        assert (length, flag, nak_session, nak_stream) == (28, 0, session, stream)
        assert nak_length > 0 and nak_length % 32 == 0 and offset % 32 == 0
        assert offset + nak_length <= TERM_LENGTH

    # RTT measurement: the receiver asks (0x80), the sender echoes (0x00) the same timestamp
    names = ("frame_length", "flags", "session_id", "stream_id", "echo_timestamp",
             "reception_delta", "receiver_id")
    requests = fields(rows, "rtt", *names, **from_endpoint)
    echoes = fields(rows, "rtt", *names, **to_endpoint)
    assert len(requests) + len(echoes) == len(column(rows, "aeron.rtt.type"))
    assert requests and echoes
    assert {r[:4] + r[5:] for r in requests} == {(40, 0x80, session, stream, 0, receiver_id)}
    assert {e[:4] + e[5:] for e in echoes} == {(40, 0x00, session, stream, 0, receiver_id)}
    requested = {r[4] for r in requests}
    assert all(e[4] in requested for e in echoes)  # every echo answers a request
    assert facts["rtt ns"] > 0

    # our codec agrees with the dissector on every captured datagram, field by field
    datagrams = [Decoded(d, list(decode_frames(d.payload))) for d in read_udp(path)]
    assert len(datagrams) == len(rows)
    mismatches = []
    for item in datagrams:
        actual = rows[item.datagram.number]
        assert actual["udp.srcport"] == [item.datagram.src_port]
        for name, values in expected_columns(item).items():
            if actual[name] != values:
                mismatches.append((item.datagram.number, name, values, actual[name]))
    assert not mismatches, f"{len(mismatches)} mismatches, first: {mismatches[:5]}"
