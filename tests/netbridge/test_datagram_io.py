"""Datagram I/O in batches (netbridge.datagram_io and its native calls): the batch path gives the
sans-IO state machines exactly what one datagram at a time gives them, over real loopback
sockets; the sender's batches go out byte for byte; the log watcher wakes on a publisher's frame
and only then."""

from __future__ import annotations

import select
import socket
import struct
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from netbridge import _io
from netbridge.datagram_io import RECEIVE_BATCH, DatagramIO
from netbridge.frames import encode_datagram, pad_frame
from netbridge.receiver import NetworkReceiver
from netbridge.shared_log import DataBatch, sent
from shmbus.settings.codes import BACK_PRESSURED
from shmbus.shm import _native
from tests.support.sans_io import (
    SESSION,
    STREAM,
    TERM,
    beat,
    connect,
    data,
    make_receiver,
    payload,
    setup,
    term_id_at,
)
from tests.support.shared_logs import ImageHost, PublicationLog, make_sender
from tests.support.sleepers import readers_asleep
from tests.support.system import io_uring_futex_waits
from tests.support.waits import wait_until

MS = 1_000_000


@pytest.fixture
def loopback() -> Iterator[tuple[socket.socket, socket.socket]]:
    """(sending socket, non-blocking receiving socket) on 127.0.0.1."""
    out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    out.bind(("127.0.0.1", 0))
    into = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    into.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    into.bind(("127.0.0.1", 0))
    into.setblocking(False)
    try:
        yield out, into
    finally:
        out.close()
        into.close()


def receive_all(io: DatagramIO, sock: socket.socket, count: int, now: int,
                receiver: NetworkReceiver) -> None:
    """Receive ``count`` datagrams through the batch path (several calls if the kernel hands
    them over in parts)."""
    deadline = time.monotonic() + 5
    got = 0
    while got < count:
        assert time.monotonic() < deadline, f"{got} of {count} datagrams arrived"
        select.select([sock], [], [], 0.1)
        got += io.receive(sock, now, lambda d, s: receiver.on_datagram(now, d, s), receiver)[0]


def state(receiver: NetworkReceiver) -> dict[str, object]:
    """Everything the protocol rules keep about a receiver and its images."""
    counters = ("datagrams_received", "bytes_received", "invalid_datagrams",
                "unknown_session_datagrams", "ignored_frames", "heartbeats_received",
                "overruns", "naks_sent", "sms_sent", "setups_received", "setup_elicitations")
    out: dict[str, object] = {name: getattr(receiver, name) for name in counters}
    for key, image in receiver.images.items():
        out[f"image {key}"] = (
            image.rcv_pos, image.rcv_hwm, image.datagrams_received, image.bytes_received,
            image.duplicates, image.overruns, image.invalid_datagrams, image.last_heard_ns,
            image.control_address, [(g.start, g.end, g.nak_at_ns) for g in image.loss.gaps],
            image.gaps_detected, image.bytes_lost, image.end_of_stream_position,
            b"".join(bytes(image.log.log.term_view(i)) for i in range(3)))
    return out


def frame(position: int, n: int, size: int = 96, session_id: int = SESSION) -> bytes:
    """One datagram of ``n`` 128-byte frames from ``position``."""
    return data(position, *(payload(position // 128 + i, size) for i in range(n)),
                session_id=session_id)


def other(position: int) -> bytes:
    """A datagram of the second publisher's image."""
    return frame(position, 8, session_id=SESSION + 1)


def script() -> list[list[bytes]]:
    """Batches of datagrams: in order, across a term (and the term id's int32 wrap), with a
    gap and its repair, duplicates, a heartbeat, a PAD, an unknown session, data past the
    window, a corrupt frame; a second image interleaved, with a gap of its own."""
    pad_at = TERM - 1024
    pad = encode_datagram([pad_frame(frame_length=1024, term_offset=pad_at % TERM,
                                     session_id=SESSION, stream_id=STREAM,
                                     term_id=term_id_at(pad_at))])
    corrupt = bytearray(frame(9 * 1024, 2))
    corrupt[128 + 12] ^= 1  # the second frame's session id
    return [
        [setup(0), setup(0, session_id=SESSION + 1)],
        [frame(i * 1024, 8) for i in range(0, 8)],                  # in order
        [frame(i * 1024, 8) for i in range(8, 9)] + [bytes(corrupt)]
        + [frame(i * 1024, 8) for i in range(10, 12)],               # corrupt, then a gap
        [frame(9 * 1024, 8), frame(4 * 1024, 8)],                    # repair, a duplicate
        [frame(i * 1024, 8) for i in range(12, 40)] + [beat(40 * 1024)],
        [frame(40 * 1024, 8), beat(41 * 1024)],                      # in order after a beat
        [frame(i * 1024, 8) for i in range(41, 63)] + [frame(pad_at - 256, 2), pad],
        [frame(TERM + i * 1024, 8) for i in range(0, 3)]              # the next term id
        + [data(TERM + 3 * 1024, payload(1), session_id=SESSION + 2)]
        + [frame(TERM + i * 1024, 8) for i in range(3, 5)],          # after an unknown session
        [frame(TERM + 5 * 1024, 8), other(0), frame(TERM + 6 * 1024, 8), other(2048),
         frame(TERM + 7 * 1024, 8), other(1024), frame(TERM + 8 * 1024, 8), other(3072)],
        [frame(TERM + 200 * 1024, 8)],                                # past the window
    ]


def test_the_batch_path_leaves_the_receiver_as_one_datagram_at_a_time_does(
        tmp_path: Path, loopback: tuple[socket.socket, socket.socket]) -> None:
    out, into = loopback
    hosts = [ImageHost(tmp_path / name) for name in ("one", "batch")]
    for host in hosts:
        host.directory.mkdir()
    one, batched = (make_receiver(host) for host in hosts)
    io = DatagramIO()
    try:
        now = 0
        for batch in script():
            now += MS
            for datagram in batch:
                one.on_datagram(now, datagram, out.getsockname())
                out.sendto(datagram, into.getsockname())
            receive_all(io, into, len(batch), now, batched)
            polled = one.poll(now), batched.poll(now)
            assert polled[0].datagrams == polled[1].datagrams
            assert [type(e) for e in polled[0].events] == [type(e) for e in polled[1].events]
            assert state(batched) == state(one)
            assert hosts[1].read() == hosts[0].read()  # the subscribers move on alike
        image = batched.images[(SESSION, STREAM)]
        assert image.rcv_pos == TERM + 9 * 1024 and image.gaps_detected == 1
        second = batched.images[(SESSION + 1, STREAM)]
        assert second.rcv_pos == 4 * 1024 and second.gaps_detected == 1
        assert batched.datagrams_in_order > 50  # the native path did the bulk
        assert batched.datagrams_in_order < batched.datagrams_received
    finally:
        for host in hosts:
            host.close()


def test_readers_asleep_on_an_image_wake_when_the_batch_path_places_data(
        tmp_path: Path, loopback: tuple[socket.socket, socket.socket]) -> None:
    out, into = loopback
    host = ImageHost(tmp_path)
    receiver = make_receiver(host)
    io = DatagramIO()
    try:
        receiver.on_datagram(0, setup(0), out.getsockname())
        subscriber = host.image()
        woke: list[bool] = []
        reader = threading.Thread(target=lambda: woke.append(
            _native.wait_for_data((subscriber,), 10.0)))
        reader.start()
        wait_until(lambda: readers_asleep(subscriber.log) == 1, 10,
                   "the reader asleep on the image")
        out.sendto(frame(0, 4), into.getsockname())
        receive_all(io, into, 1, MS, receiver)
        reader.join(5)
        assert woke == [True] and receiver.datagrams_in_order == 1
    finally:
        host.close()


def test_receive_batch_takes_at_most_a_batch_and_hands_back_sources_in_order(
        loopback: tuple[socket.socket, socket.socket]) -> None:
    out, into = loopback
    for i in range(RECEIVE_BATCH + 5):
        out.sendto(struct.pack("<i", i), into.getsockname())
    slots = bytearray(RECEIVE_BATCH * 65536)
    select.select([into], [], [], 1)
    received, in_order, rest, dropped = _io.receive_batch(into.fileno(), slots, ())
    assert received == len(rest) and in_order == () and dropped is None
    assert [struct.unpack_from("<i", slots, offset)[0] for offset, _, _ in rest] == list(
        range(received))
    assert {(size, source) for _, size, source in rest} == {(4, out.getsockname())}
    assert received <= RECEIVE_BATCH


def test_receive_batch_refuses_bad_arguments_clearly() -> None:
    with pytest.raises(ValueError, match="slot"):
        _io.receive_batch(0, bytearray(100), ())
    with pytest.raises(OSError):
        _io.receive_batch(-1, bytearray(65536), ())
    with pytest.raises(ValueError, match="term length"):
        _io.receive_batch(0, bytearray(65536), ((_native.AtomicBuffer(bytearray(4096)),
                                                 1, 2, 1000, 0, 0, 0),))


# --- sending --------------------------------------------------------------------------------


def test_a_data_batch_is_what_the_sender_sends_one_by_one_and_goes_out_byte_for_byte(
        tmp_path: Path, loopback: tuple[socket.socket, socket.socket]) -> None:
    out, into = loopback
    logs = [PublicationLog(tmp_path, name=name) for name in ("one.log", "batch.log")]
    try:
        senders = [make_sender(logs[0]), make_sender(logs[1], data_batches=True)]
        for log in logs:
            for i in range(150):  # about 20 KiB: several datagrams, inside the limit
                assert log.offer(bytes([i % 256]) * (i % 200 + 1)) > 0
        for sender in senders:
            connect(sender, window=64 * 1024)
        (one, _), (batched, _) = (sender.poll(MS) for sender in senders)
        singles = [bytes(d) for d, _ in one if len(d) > 32]
        (batch, destination), = [(d, to) for d, to in batched if isinstance(d, DataBatch)]
        assert [bytes(d) for d in batch.datagrams()] == singles
        assert batch.count == len(singles) > 10 and batch.length == sum(map(len, singles))
        assert senders[0].sender_position == senders[1].sender_position
        assert senders[0].bytes_sent == senders[1].bytes_sent
        assert senders[0].datagrams_sent == senders[1].datagrams_sent

        sent = _io.send_batch(out.fileno(), batch.buffer, batch.spans, into.getsockname())
        assert sent == batch.count
        got = []
        while len(got) < sent:
            assert select.select([into], [], [], 5)[0], f"{len(got)} of {sent} arrived"
            got.append(into.recv(65536))
        assert got == singles
    finally:
        for log in logs:
            log.close()


@pytest.fixture
def log(tmp_path: Path) -> Iterator[PublicationLog]:
    """A publication's log in ``tmp_path`` (tests/support/shared_logs.py), closed after."""
    log = PublicationLog(tmp_path)
    try:
        yield log
    finally:
        log.close()


def runs_of_datagrams(buffer: _native.AtomicBuffer) -> tuple[bytes, list[bytes]]:
    """Spans in ``buffer`` for send_batch and the datagrams they are: runs of one length that
    go out as segmented sends (a shorter one ends a run, a longer one starts the next), more
    than one sendmmsg and more than fit one segmented send."""
    lengths = [1000] * 70 + [300] + [500] * 10 + [700, 64, 64] + [1408] * 50 + [1]
    spans, datagrams, offset = [], [], 0
    for i, length in enumerate(lengths):
        data = bytes((i + k) % 256 for k in range(length))
        buffer.put_bytes(offset, data)
        spans.append(struct.pack("<qq", offset, length))
        datagrams.append(data)
        offset += length
    return b"".join(spans), datagrams


def test_runs_of_equal_datagrams_go_out_segmented_and_arrive_as_the_same_datagrams(
        loopback: tuple[socket.socket, socket.socket]) -> None:
    out, into = loopback
    buffer = _native.AtomicBuffer(bytearray(1 << 20))
    spans, datagrams = runs_of_datagrams(buffer)
    assert _io.send_batch(out.fileno(), buffer, spans, into.getsockname()) == len(datagrams)
    got = []
    while len(got) < len(datagrams):
        assert select.select([into], [], [], 5)[0], f"{len(got)} of {len(datagrams)} arrived"
        got.append(into.recv(65536))
    assert got == datagrams


def test_send_batch_refuses_spans_outside_the_log_and_bad_destinations(
        log: PublicationLog, loopback: tuple[socket.socket, socket.socket]) -> None:
    out, into = loopback
    buffer = log.log.buffer
    with pytest.raises(ValueError, match="inside the buffer"):
        _io.send_batch(out.fileno(), buffer, struct.pack("<qq", 1 << 40, 100),
                       into.getsockname())
    with pytest.raises(ValueError, match="pairs"):
        _io.send_batch(out.fileno(), buffer, b"123", into.getsockname())
    with pytest.raises(ValueError, match="numeric IPv4"):
        _io.send_batch(out.fileno(), buffer, b"", ("localhost", 1))


def test_scan_datagrams_stops_at_the_limit_and_says_when_a_frame_waits_behind_it(
        log: PublicationLog) -> None:
    for _ in range(4):
        assert log.offer(b"x" * 1000) > 0  # 1056-byte frames
    buffer, term = log.log.buffer, log.term_length
    position, spans, length, back_pressured, more = _io.scan_datagrams(
        buffer, term, 0, 2 * 1056, 1408, 64)
    assert (position, length, back_pressured, more) == (2 * 1056, 2 * 1056, True, False)
    assert list(struct.iter_unpack("<qq", spans)) == [(0, 1056), (1056, 1056)]
    position, spans, length, back_pressured, more = _io.scan_datagrams(
        buffer, term, 0, term, 1408, 3)
    assert (position, len(spans) // 16, back_pressured, more) == (3 * 1056, 3, False, True)
    assert _io.scan_datagrams(buffer, term, 4 * 1056, term, 1408, 64)[:2] == (
        4 * 1056, b"")
    with pytest.raises(ValueError, match="position"):
        _io.scan_datagrams(buffer, term, 7, term, 1408, 64)


# --- the log watcher ------------------------------------------------------------------------


def readable(fd: int, timeout: float) -> bool:
    return bool(select.select([fd], [], [], timeout)[0])


# both kinds of log watcher (shmbus.shm.log_watchers); FutexRing where this kernel has it
WATCHERS = [_native.LogWatcher] + ([_native.FutexRing] if io_uring_futex_waits() else [])


@pytest.fixture(params=WATCHERS, ids=lambda kind: kind.__name__)
def watcher_kind(request):
    return request.param


def test_the_watcher_wakes_when_a_frame_is_committed_where_a_sender_waits(
        tmp_path: Path, watcher_kind) -> None:
    log = PublicationLog(tmp_path)
    watcher = watcher_kind()
    try:
        buffer, term = log.log.buffer, log.term_length
        watcher.arm(((buffer, term, 0),), ())
        assert not readable(watcher.fileno(), 0.1)  # nothing written: it sleeps
        writer = threading.Timer(0.1, lambda: log.offer(b"wake"))
        writer.start()
        assert readable(watcher.fileno(), 5)
        writer.join()
        assert watcher.clear() and not watcher.clear()
        # a frame there already: that sender waits for its window, not for data
        watcher.arm(((buffer, term, 0),), ())
        assert not readable(watcher.fileno(), 0.1)
        # disarmed, a frame where it watched wakes nobody
        watcher.arm(((buffer, term, 64),), ())
        watcher.disarm(True)
        assert log.offer(b"quiet") > 0
        assert not readable(watcher.fileno(), 0.1)
    finally:
        watcher.close()
        watcher.close()
        log.close()
    with pytest.raises(ValueError, match="closed"):
        watcher.arm((), ())


def test_the_watcher_refuses_what_is_not_a_log_position(tmp_path: Path, watcher_kind) -> None:
    log = PublicationLog(tmp_path)
    watcher = watcher_kind()
    try:
        with pytest.raises(ValueError, match="multiple of 32"):
            watcher.arm(((log.log.buffer, log.term_length, 5),), ())
        with pytest.raises(ValueError, match="term length"):
            watcher.arm(((log.log.buffer, 1000, 0),), ())
        with pytest.raises(TypeError):
            watcher.arm([(log.log.buffer, log.term_length, 0)], ())  # type: ignore[arg-type]
        with pytest.raises(IndexError):  # a counter outside its buffer
            watcher.arm((), ((log.log.buffer, log.term_length, log.log.buffer, 1 << 40, 0),))
    finally:
        watcher.close()
        log.close()


def test_the_watcher_wakes_when_a_subscriber_reads_up_to_the_threshold(
        tmp_path: Path, watcher_kind) -> None:
    """A progress watch: the subscriber's position counter reaching the threshold (a reader
    advancing wakes whoever sleeps on the log's progress word)."""
    host = ImageHost(tmp_path)
    receiver = make_receiver(host)
    watcher = watcher_kind()
    try:
        receiver.on_datagram(0, setup(0), ("127.0.0.1", 1))
        image = receiver.images[(SESSION, STREAM)]
        for i in range(8):
            receiver.on_datagram(MS, frame(i * 1024, 8), ("127.0.0.1", 1))
        subscriber = host.image()
        counter = (host._positions, 64 * len(host.requests))  # where ImageHost keeps it
        watcher.arm((), ((image.log.log.buffer, TERM, *counter, 4096),))
        assert not readable(watcher.fileno(), 0.1)
        fragments: list[bytes] = []
        reader = threading.Timer(0.1, lambda: subscriber.poll(
            lambda buffer, _header: fragments.append(bytes(buffer)), 40))  # 5 KiB on
        reader.start()
        assert readable(watcher.fileno(), 5)
        reader.join()
        assert len(fragments) == 40 and watcher.clear()
        # at the threshold already: nothing to wait for
        watcher.arm((), ((image.log.log.buffer, TERM, *counter, 4096),))
        assert not readable(watcher.fileno(), 0.1)
    finally:
        watcher.close()
        host.close()


def test_a_watcher_woken_on_any_of_its_words_says_it_fired(tmp_path: Path, watcher_kind) -> None:
    """clear() is True whichever word woke it (an io_uring futex wait completes with the
    index of the word woken: 1 here), so the loop knows it must arm again before it sleeps."""
    log = PublicationLog(tmp_path)
    other_log = PublicationLog(tmp_path, name="other.log")
    watcher = watcher_kind()
    try:
        watcher.arm(((other_log.log.buffer, other_log.term_length, 0),
                     (log.log.buffer, log.term_length, 0)), ())
        assert log.offer(b"second word") > 0
        assert readable(watcher.fileno(), 5)
        assert watcher.clear()
    finally:
        watcher.close()
        log.close()
        other_log.close()


# --- the busy window's spin ---------------------------------------------------------------------


def test_busy_poll_returns_at_a_datagram_a_committed_frame_or_its_deadline(
        log: PublicationLog, loopback: tuple[socket.socket, socket.socket]) -> None:
    out, into = loopback
    data_watch = ((log.log.buffer, log.term_length, 0),)
    fds = (into.fileno(),)
    many = tuple(socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(200))
    assert _io.busy_poll((*(s.fileno() for s in many), *fds), data_watch, (), 0) == (
        None, ())
    for sock in many:  # more sockets than the watches' limit are fine
        sock.close()
    before = time.monotonic_ns()
    assert _io.busy_poll(fds, data_watch, (), before + 20 * MS) == (None, ())
    assert time.monotonic_ns() - before >= 20 * MS  # it spun until its deadline
    # a datagram: the readable fd, long before the deadline
    threading.Timer(0.05, lambda: out.sendto(b"x", into.getsockname())).start()
    assert _io.busy_poll(fds, data_watch, (), time.monotonic_ns() + 10_000 * MS) == (
        fds, ())
    into.recv(16)
    # a publisher's frame where the sender waits: () (nothing readable)
    threading.Timer(0.05, lambda: log.offer(b"wake")).start()
    assert _io.busy_poll(fds, data_watch, (), time.monotonic_ns() + 10_000 * MS) == (
        (), ())


def test_the_spin_sends_a_publishers_frame_itself_as_a_poll_would(
        tmp_path: Path, loopback: tuple[socket.socket, socket.socket]) -> None:
    """A send given to busy_poll goes out once a publisher has committed where the sender
    waits: the datagrams a poll would send, to each destination, and the sender accounts for them
    with on_data_sent exactly as its poll would have."""
    out, into = loopback
    logs = [PublicationLog(tmp_path, name=f"{i}.log") for i in range(2)]
    try:
        spun, polled = (make_sender(log, data_batches=True) for log in logs)
        for sender in (spun, polled):
            connect(sender, window=1 << 20)
            sender.poll(0)  # the SETUP phase is over: nothing queued
        assert spun.spin_send() == (0, spun.sender_limit, spun.mtu, spun.max_datagrams_per_poll)
        destinations = (into.getsockname(), into.getsockname())  # two: each gets the DATA
        send = (out.fileno(), logs[0].log.buffer, spun.term_length, *spun.spin_send(),
                destinations)
        messages = [bytes([n]) * 600 for n in range(5)]  # three datagrams at mtu 1408
        for m in messages:
            logs[0].offer(m)
        found, spun_sent = _io.busy_poll((), (), (), time.monotonic_ns() + 10_000 * MS,
                                             (send,))
        assert found is None
        index, position, datagrams, length, back_pressured, more = spun_sent
        assert index == 0 and not back_pressured and not more
        spun.on_data_sent(5 * MS, sent(spun_sent[1:]))
        for m in messages:
            logs[1].offer(m)
        expected, _ = polled.poll(5 * MS)
        batches = [data for data, _ in expected]
        wanted = [bytes(d) for d in batches[0].datagrams()]
        into.settimeout(5)
        assert [into.recv(65536) for _ in range(2 * len(wanted))] == wanted * 2
        assert (position, datagrams, length) == (
            polled.sender_position, batches[0].count, batches[0].length)
        for name in ("sender_position", "datagrams_sent", "bytes_sent", "back_pressure_events"):
            assert getattr(spun, name) == getattr(polled, name), name
        assert spun.poll(5 * MS)[0] == []  # nothing left that the spin should have sent
    finally:
        for log in logs:
            log.close()


def test_offer_is_back_pressured_at_the_limit_set_from_the_sender_position(
        tmp_path: Path) -> None:
    """The test publication's limit follows the sender position as a driver's does."""
    pub = PublicationLog(tmp_path)
    try:
        pub.follow(0)
        while (result := pub.offer(b"b" * 1000)) > 0:
            pass
        assert result == BACK_PRESSURED
        assert TERM // 2 <= pub.publication.position <= TERM // 2 + 1056  # at most one past
    finally:
        pub.close()


def test_send_now_sends_what_is_committed_at_once(
        log: PublicationLog, loopback: tuple[socket.socket, socket.socket]) -> None:
    out, into = loopback
    send = (out.fileno(), log.log.buffer, log.term_length, 0, 1 << 20, 1408, 64,
            (into.getsockname(),))
    assert _io.send_now(send) == (0, 0, 0, False, False)  # nothing committed yet
    log.offer(b"a" * 100)
    log.offer(b"b" * 100)
    # both frames (each 132 bytes, aligned to 160) in one datagram, straight from the log
    assert _io.send_now(send) == (320, 1, 320, False, False)
    into.settimeout(5)
    assert into.recv(65536) == log.bytes_at(0, 320)
    with pytest.raises(OSError):
        _io.send_now((into.fileno() + 100, *send[1:]))  # no such socket


def test_the_spin_leaves_a_frame_its_limit_has_no_room_for_to_the_duty_cycle(
        log: PublicationLog, loopback: tuple[socket.socket, socket.socket]) -> None:
    out, into = loopback
    log.offer(b"x" * 1000)  # committed, but the limit leaves 64 bytes
    send = (out.fileno(), log.log.buffer, log.term_length, 0, 64, 1408, 64,
            (into.getsockname(),))
    before = time.monotonic_ns()
    assert _io.busy_poll((), (), (), before + 20 * MS, (send,)) == (None, ())
    assert time.monotonic_ns() - before >= 20 * MS  # it spun on, sending nothing
    into.setblocking(False)
    with pytest.raises(BlockingIOError):
        into.recv(65536)


def test_a_sender_the_spin_may_not_send_for() -> None:
    """spin_send is None until a poll has nothing to do first: before the SETUP phase ends,
    or without data batches."""
    with tempfile.TemporaryDirectory(dir="/dev/shm") as directory:
        log = PublicationLog(Path(directory))
        try:
            sender = make_sender(log, data_batches=True)
            assert sender.spin_send() is None  # not connected
            sender.poll(0)
            assert sender.spin_send() is None  # SETUP sent, no status message yet
            connect(sender)
            sender.poll(0)
            assert sender.spin_send() is not None
            assert make_sender(log).spin_send() is None  # datagrams one by one
        finally:
            log.close()


def test_busy_poll_refuses_bad_arguments_clearly(log: PublicationLog) -> None:
    with pytest.raises(TypeError):
        _io.busy_poll(("3",), (), (), 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="multiple of 32"):
        _io.busy_poll((), ((log.log.buffer, log.term_length, 5),), (), 0)
    with pytest.raises(TypeError):
        _io.busy_poll([0], (), (), 0)  # type: ignore[arg-type]
    send = (0, log.log.buffer, log.term_length, 0, 1 << 20, 1408, 64, (("localhost", 1),))
    with pytest.raises(ValueError, match="not a numeric IPv4"):
        _io.busy_poll((), (), (), 0, (send,))
    with pytest.raises(ValueError, match="mtu 16"):
        _io.busy_poll((), (), (), 0, (send[:5] + (16,) + send[6:],))
    with pytest.raises(TypeError, match="a send is a tuple"):
        _io.send_now([0])  # type: ignore[arg-type]
