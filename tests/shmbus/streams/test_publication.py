"""Publications and images in one process: boundaries, codes, claims, batches, and a model."""

from __future__ import annotations

import shutil
import struct
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shmbus
from shmbus.shm import _native
from shmbus.shm._native import PublicationCore
from shmbus.shm.log_buffer import (
    ACTIVE_TERM_COUNT_OFFSET,
    TAIL_COUNTERS_OFFSET,
)
from shmbus.streams.publication import BufferClaim
from tests.support.sleepers import writers_asleep
from tests.support.standalone_stream import StandaloneStream
from tests.support.waits import wait_until

TERM = 65536
MTU = 1408
MAX_PAYLOAD = MTU - 32


@pytest.fixture(params=[True, False], ids=["exclusive", "concurrent"])
def exclusive(request) -> bool:
    return request.param


@pytest.fixture
def stream(shm_dir):
    s = StandaloneStream(shm_dir, create=True, term_length=TERM, initial_term_id=-3,
                         session_id=11, stream_id=22)
    yield s
    s.close()


def drain(stream: StandaloneStream, image: shmbus.Image, limit: int = 100) -> list:
    """Poll until nothing is left, reassembling; returns (bytes, header fields) per message."""
    out = []

    def on_message(buffer, header):
        out.append((bytes(buffer), header.flags, header.reserved_value, header.position))

    assembler = shmbus.FragmentAssembler(on_message)
    while image.poll(assembler, limit):
        stream.update_limit([image.position])
    stream.update_limit([image.position])
    return out


def frames(stream: StandaloneStream, image: shmbus.Image) -> list:
    out = []
    image.poll(lambda b, h: out.append((len(b), h.flags, h.term_offset, h.term_id)), 1000)
    return out


def test_unfragmented_frame_in_the_log_is_the_wire_header(stream, exclusive) -> None:
    pub = stream.publication(exclusive)
    assert pub.offer(b"Hello World! 0", reserved_value=5) == 64
    raw = stream.log.buffer.get_bytes(0, 64)
    assert struct.unpack_from("<iBBHiiiiq", raw) == (46, 0, 0xC0, 1, 0, 11, 22, -3, 5)
    assert raw[32:46] == b"Hello World! 0"
    assert raw[46:64] == bytes(18)  # alignment padding stays zero


@pytest.mark.parametrize(
    ("length", "expected_frames"),
    [
        (MAX_PAYLOAD - 1, [(MAX_PAYLOAD - 1, 0xC0)]),
        (MAX_PAYLOAD, [(MAX_PAYLOAD, 0xC0)]),
        (MAX_PAYLOAD + 1, [(MAX_PAYLOAD, 0x80), (1, 0x40)]),
        (3000, [(1376, 0x80), (1376, 0x00), (248, 0x40)]),
        (TERM // 8, [(1376, 0x80)] + [(1376, 0)] * 4 + [(TERM // 8 - 5 * 1376, 0x40)]),
    ],
)
def test_fragmentation_at_mtu(stream, exclusive, length: int, expected_frames: list) -> None:
    pub = stream.publication(exclusive)
    payload = bytes(range(256)) * (length // 256 + 1)
    assert pub.offer(payload[:length]) > 0
    image = stream.image()
    got = frames(stream, image)
    assert [(n, f) for n, f, _, _ in got] == expected_frames
    image.position = 0
    assert drain(stream, image)[0][0] == payload[:length]


def test_max_message_length_is_enforced(stream, exclusive) -> None:
    pub = stream.publication(exclusive)
    assert pub.max_message_length == TERM // 8
    with pytest.raises(ValueError, match="max message length of 8192"):
        pub.offer(bytes(TERM // 8 + 1))
    with pytest.raises(ValueError, match="max message length"):
        pub.offer(bytes(5000), bytes(5000))
    assert pub.position == 0


def test_non_buffer_is_a_type_error(stream) -> None:
    pub = stream.publication()
    with pytest.raises(TypeError, match="buffer protocol.*str"):
        pub.offer("text")
    with pytest.raises(TypeError, match="buffer protocol.*int"):
        pub.offer(b"ok", 5)
    with pytest.raises(TypeError, match="reserved_value"):
        pub.offer(b"ok", reserved=1)


def test_any_buffer_and_gather(stream, exclusive) -> None:
    pub = stream.publication(exclusive)
    arr = np.arange(10, dtype=np.int32)
    assert pub.offer(arr) > 0
    assert pub.offer(bytearray(b"ab"), memoryview(b"cd"), b"", b"e") > 0
    assert pub.offer(b"") > 0
    got = [m for m, *_ in drain(stream, stream.image())]
    assert got == [arr.tobytes(), b"abcde", b""]


def test_message_that_just_fits_at_the_end_of_a_term(stream, exclusive) -> None:
    stream.limit.set(2 * TERM)  # no reader in this test: lift the window
    pub = stream.publication(exclusive)
    filler = bytes(992 - 32)  # frames of 992 bytes: 66 fill 65472 of the term
    for _ in range(66):
        assert pub.offer(filler) > 0
    assert pub.position == TERM - 64
    assert pub.offer(bytes(32)) == TERM  # exactly fills the term
    assert pub.offer(b"next") == shmbus.codes.ADMIN_ACTION  # full term: rotate, no padding needed
    assert pub.offer(b"next") == TERM + 64


def test_message_that_does_not_fit_pads_and_rotates(stream, exclusive) -> None:
    stream.limit.set(2 * TERM)
    pub = stream.publication(exclusive)
    filler = bytes(992 - 32)
    for _ in range(66):
        assert pub.offer(filler) > 0
    assert pub.offer(bytes(33)) == shmbus.codes.ADMIN_ACTION  # needs 96 bytes, 64 are left
    assert pub.position == TERM
    assert pub.offer(bytes(33)) == TERM + 96
    pad = stream.log.buffer.get_bytes(TERM - 64, 8)
    assert struct.unpack("<iBBH", pad) == (64, 0, 0xC0, 0)
    image = stream.image()
    got = drain(stream, image)
    assert [len(m) for m, *_ in got] == [960] * 66 + [33]  # PAD never reaches a handler
    assert image.position == TERM + 96


def test_codes_not_connected_back_pressured_closed(stream, exclusive) -> None:
    pub = stream.publication(exclusive)
    window = TERM // 2
    message = bytes(1000)
    while pub.offer(message) > 0:
        pass
    assert pub.offer(message) == shmbus.codes.BACK_PRESSURED
    assert window <= pub.position < window + 1056
    stream.log.is_connected = False
    assert pub.offer(message) == shmbus.codes.NOT_CONNECTED
    assert not pub.is_connected
    pub.close()
    assert pub.offer(message) == shmbus.codes.CLOSED
    assert pub.offer_many([message]) == shmbus.codes.CLOSED
    assert not pub.try_claim(10)


def test_max_position_exceeded(shm_dir, exclusive) -> None:
    stream = StandaloneStream(shm_dir, create=True, term_length=TERM, initial_term_id=7)
    log = stream.log
    last_count = 2**31 - 1
    last_term_id = (7 + last_count + 2**31) % 2**32 - 2**31
    index = last_count % 3
    m = log.meta_offset
    log.buffer.put_int64_release(m + TAIL_COUNTERS_OFFSET + 8 * index,
                                 ((last_term_id & 0xFFFFFFFF) << 32 | (TERM - 64)) - 2**64
                                 if last_term_id < 0 else last_term_id << 32 | (TERM - 64))
    log.buffer.put_int32_release(m + ACTIVE_TERM_COUNT_OFFSET, last_count)
    stream.limit.set(2**62)
    pub = stream.publication(exclusive)
    assert pub.max_possible_position == TERM * 2**31
    assert pub.offer(bytes(10)) == TERM * 2**31  # the last frame that fits
    assert pub.offer(bytes(10)) == shmbus.codes.MAX_POSITION_EXCEEDED
    stream.close()


def test_try_claim_commit_and_abort(stream, exclusive) -> None:
    pub = stream.publication(exclusive)
    with pub.try_claim(8, reserved_value=3) as claim:
        claim.buffer[:] = b"claimed!"
    aborted = pub.try_claim(16)
    assert aborted
    aborted.buffer[:4] = b"gone"
    aborted.abort()
    with pytest.raises(ValueError):
        aborted.commit()
    with pytest.raises(RuntimeError), pub.try_claim(4) as claim:
        claim.buffer[:] = b"boom"
        raise RuntimeError("handler failed")  # aborted on the way out
    assert pub.offer(b"after") > 0
    got = drain(stream, stream.image())
    assert [(m, r) for m, _, r, _ in got] == [(b"claimed!", 3), (b"after", 0)]


def test_a_claim_open_when_its_publication_closes_is_not_published(stream, exclusive
                                                                    ) -> None:
    """A client that fails (driver lost, timed out) closes its publications under open
    claims: finishing one raises PublicationError CLOSED, a ShmbusError a rebuild loop
    catches, and nothing reaches the log."""
    pub = stream.publication(exclusive)
    claim = pub.try_claim(8)
    assert claim
    claim.buffer[:] = b"orphaned"
    pub.close()
    with pytest.raises(shmbus.PublicationError, match="closed while this claim was open") as raised:
        claim.commit()
    assert raised.value.code == shmbus.codes.CLOSED
    assert drain(stream, stream.image()) == []



def test_a_publication_closed_between_the_claim_and_its_buffer_gives_a_failed_claim(
        stream, exclusive) -> None:
    """The client's conductor thread may close the publication just after try_claim reserved
    the frame: the claim comes back failed with CLOSED (as offer would), not a ValueError."""
    pub = stream.publication(exclusive)
    result, frame_offset = pub._claim(8, 0)
    assert result > 0
    pub.close()
    claim = BufferClaim(pub, result, frame_offset, 8)
    assert not claim and claim.result == shmbus.codes.CLOSED and claim.buffer is None
    with pytest.raises(shmbus.PublicationError):
        claim.__enter__()
    assert drain(stream, stream.image()) == []

def test_claim_limits_and_failures(stream) -> None:
    pub = stream.publication()
    with pytest.raises(ValueError, match="max payload"):
        pub.try_claim(MAX_PAYLOAD + 1)
    stream.log.is_connected = False
    stream.limit.set(0)
    claim = pub.try_claim(10)
    assert not claim and claim.result == shmbus.codes.NOT_CONNECTED
    with pytest.raises(shmbus.PublicationError, match="NOT_CONNECTED"), claim:
        pass


def test_offer_many_sequence_2d_and_records(stream, exclusive) -> None:
    pub = stream.publication(exclusive)
    assert pub.offer_many([b"a", b"bb", bytearray(b"ccc")]) == 3
    rows = np.arange(40, dtype=np.uint8).reshape(4, 10)
    assert pub.offer_many(rows) == 4
    records = np.zeros(3, dtype=[("seq", "<u8"), ("price", "<f8")])
    records["seq"] = [1, 2, 3]
    assert pub.offer_many(records) == 3
    stamped = np.zeros(2, dtype=[("time", "M8[ns]"), ("price", "<f8")])  # datetime fields too
    assert pub.offer_many(stamped) == 2
    assert pub.offer_many([]) == 0
    with pytest.raises(TypeError, match="offer_many"):
        pub.offer_many(b"just bytes")
    got = [m for m, *_ in drain(stream, stream.image())]
    assert got[:3] == [b"a", b"bb", b"ccc"]
    assert got[3:7] == [r.tobytes() for r in rows]
    assert got[7:10] == [r.tobytes() for r in records]
    assert got[10:] == [r.tobytes() for r in stamped]


def test_offer_many_stops_at_the_term_end_and_limit(stream, exclusive) -> None:
    pub = stream.publication(exclusive)
    block = np.zeros((200, 480), np.uint8)  # 512-byte frames: 128 fill a term
    assert pub.offer_many(block) == 64  # the window (half a term) stops it
    assert pub.offer_many(block) == shmbus.codes.BACK_PRESSURED
    image = stream.image()
    drain(stream, image)
    total = 64
    while total < 300:
        r = pub.offer_many(block[: 300 - total])
        if r == shmbus.codes.ADMIN_ACTION:
            continue
        assert r > 0, shmbus.codes.result_name(r)
        total += r
        drain(stream, image)
    assert image.position == 300 * 512 + (TERM - 128 * 512) * 0


def test_controlled_poll_actions(stream) -> None:
    pub = stream.publication()
    for i in range(6):
        pub.offer(bytes([i]))
    image = stream.image()
    seen = []

    def handler(buffer, header):
        value = buffer[0]
        seen.append(value)
        if value == 1 and seen.count(1) == 1:
            return shmbus.codes.Action.ABORT
        if value == 3:
            return shmbus.codes.Action.BREAK
        if value == 4:
            return shmbus.codes.Action.COMMIT
        return None

    assert image.controlled_poll(handler, 10) == 1  # 0, then abort at 1
    assert image.position == 64
    assert image.controlled_poll(handler, 10) == 3  # 1, 2, 3 (break)
    assert image.controlled_poll(handler, 10) == 2  # 4 (commit), 5
    assert seen == [0, 1, 1, 2, 3, 4, 5]
    assert image.position == 6 * 64
    with pytest.raises(ValueError, match="not an Action"):
        pub.offer(b"x")
        image.controlled_poll(lambda b, h: 99, 10)


def test_handler_exception_consumes_the_fragment_and_propagates(stream) -> None:
    pub = stream.publication()
    pub.offer(b"one")
    pub.offer(b"two")
    image = stream.image()

    def boom(buffer, header):
        raise KeyError(bytes(buffer))

    with pytest.raises(KeyError, match="one"):
        image.poll(boom, 10)
    assert image.position == 64
    assert [m for m, *_ in drain(stream, image)] == [b"two"]


def test_kept_buffer_is_released_after_the_handler(stream) -> None:
    pub = stream.publication()
    pub.offer(b"data")
    kept = []
    headers = []
    stream.image().poll(lambda b, h: (kept.append(b), headers.append(h)), 10)
    with pytest.raises(ValueError, match="released"):
        bytes(kept[0])
    assert headers[0].session_id == 11 and headers[0].position == 64  # headers are copies


def test_poll_batch_and_records(stream, exclusive) -> None:
    pub = stream.publication(exclusive)
    dtype = np.dtype([("seq", "<u8"), ("value", "<f8")])
    records = np.zeros(100, dtype)
    records["seq"] = np.arange(100)
    records["value"] = np.arange(100) * 0.5
    assert pub.offer_many(records) == 100
    image = stream.image()
    batches = []

    def on_batch(batch: shmbus.FragmentBatch) -> None:
        batches.append((batch.position, batch.records(dtype), batch.payloads()[:2]))

    assert image.poll_batch(on_batch, 64) == 64
    assert image.poll_batch(on_batch, 64) == 36
    assert image.poll_batch(on_batch, 64) == 0
    assert [b[0] for b in batches] == [0, 64 * 64]  # 16-byte records in 64-byte frames
    got = np.concatenate([b[1] for b in batches])
    assert np.array_equal(got, records)
    assert batches[0][2] == [records[0].tobytes(), records[1].tobytes()]
    assert image.position == 100 * 64


def test_batch_records_rejects_mixed_lengths(stream) -> None:
    pub = stream.publication()
    pub.offer(bytes(16))
    pub.offer(bytes(8))
    with pytest.raises(ValueError, match="fragment 1 has 8 bytes"):
        stream.image().poll_batch(lambda b: b.records("<u8,<u8"), 10)


# -- the model test -----------------------------------------------------------------------

operation = st.one_of(
    st.tuples(st.just("offer"), st.integers(0, 3 * MAX_PAYLOAD), st.integers(-(2**63), 2**63 - 1)),
    st.tuples(st.just("gather"), st.lists(st.integers(0, 600), min_size=2, max_size=4),
              st.just(0)),
    st.tuples(st.just("claim"), st.integers(0, MAX_PAYLOAD), st.booleans()),
    st.tuples(st.just("many"), st.lists(st.integers(0, 2000), min_size=1, max_size=20),
              st.just(0)),
)


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(operation, min_size=1, max_size=120), limits=st.lists(
    st.integers(1, 50), min_size=1, max_size=10), exclusive=st.booleans(),
    initial_term_id=st.integers(-(2**31), 2**31 - 1))
def test_offers_read_back_exactly_in_order(ops, limits, exclusive,
                                           initial_term_id) -> None:
    directory = Path(tempfile.mkdtemp(dir="/dev/shm"))
    stream = StandaloneStream(directory, create=True, term_length=TERM,
                              initial_term_id=initial_term_id)
    try:
        pub = stream.publication(exclusive)
        image = stream.image()
        expected: list[tuple[bytes, int]] = []
        got: list[tuple[bytes, int]] = []
        assembler = shmbus.FragmentAssembler(
            lambda b, h: got.append((bytes(b), h.reserved_value)))
        counter = 0
        poll_round = 0

        def make(n: int) -> bytes:
            nonlocal counter
            counter += 1
            return (counter.to_bytes(4, "little") * (n // 4 + 1))[:n]

        def pump() -> None:
            nonlocal poll_round
            image.poll(assembler, limits[poll_round % len(limits)])
            poll_round += 1
            stream.update_limit([image.position])

        def retry(attempt) -> None:
            """Run attempt() until it returns a position, pumping the reader in between."""
            for _ in range(1000):
                result = attempt()
                if result > 0:
                    return
                assert result in (shmbus.codes.ADMIN_ACTION, shmbus.codes.BACK_PRESSURED), result
                pump()
            pytest.fail("no progress")

        def offer(message: bytes, reserved: int) -> int:
            result = pub.offer(message, reserved_value=reserved)
            if result > 0:
                expected.append((message, reserved))
            return result

        def gather(parts: list[bytes]) -> int:
            result = pub.offer(*parts)
            if result > 0:
                expected.append((b"".join(parts), 0))
            return result

        def claim(message: bytes, commit: bool) -> int:
            claimed = pub.try_claim(len(message))
            if claimed:
                claimed.buffer[:] = message
                if commit:
                    claimed.commit()
                    expected.append((message, 0))
                else:
                    claimed.abort()
            return claimed.result

        for kind, arg, extra in ops:
            if kind == "offer":
                message = make(arg)
                retry(lambda m=message, r=extra: offer(m, r))
            elif kind == "gather":
                parts = [make(n) for n in arg]
                retry(lambda p=parts: gather(p))
            elif kind == "claim":
                message = make(arg)
                retry(lambda m=message, c=extra: claim(m, c))
            else:
                remaining = [make(n) for n in arg]
                while remaining:
                    result = pub.offer_many(remaining)
                    if result > 0:
                        expected.extend((m, 0) for m in remaining[:result])
                        remaining = remaining[result:]
                    else:
                        assert result in (shmbus.codes.ADMIN_ACTION,
                                          shmbus.codes.BACK_PRESSURED), result
                        pump()
        for _ in range(10000):
            before = image.position
            pump()
            if image.position == before:
                break
        assert got == expected
        assert image.position == pub.position
    finally:
        stream.close()
        shutil.rmtree(directory, ignore_errors=True)


# -- a publication moved to a new driver's log (reconnect) ---------------------------------------


def sleep_at_the_limit(pub: shmbus.Publication, stream: StandaloneStream,
                       seconds: float) -> threading.Thread:
    """Fill ``pub`` to its limit, then a thread sleeps in _await_progress on its log."""
    while pub.offer(b"x" * 1000) > 0:
        pass
    assert pub.offer(b"x") == shmbus.codes.BACK_PRESSURED
    sleeper = threading.Thread(target=pub._await_progress, args=(seconds,))
    sleeper.start()
    wait_until(lambda: writers_asleep(stream.log) == 1, 5, "the thread asleep at the limit")
    return sleeper


@pytest.fixture
def two_streams(shm_dir):
    """The log of a publication's lost driver (session 1) and of its new one (session 2)."""
    streams = []
    for name, session_id in (("old", 1), ("new", 2)):
        (shm_dir / name).mkdir()
        streams.append(StandaloneStream(shm_dir / name, create=True, term_length=TERM,
                                        session_id=session_id, stream_id=9))
    yield streams
    for stream in streams:
        stream.close()


def test_a_detached_publication_refuses_offers_then_writes_only_its_new_log(two_streams,
                                                                            exclusive):
    old, new = two_streams
    pub = old.publication(exclusive)
    sleeper = sleep_at_the_limit(pub, old, 30.0)
    reached = pub.position
    old_bytes = old.log.buffer.get_bytes(0, TERM * 3)
    began = time.monotonic()
    pub._detach()
    sleeper.join(5)
    assert not sleeper.is_alive() and time.monotonic() - began < 5, "sleeper not woken"
    assert writers_asleep(old.log) == 0
    # refused, not closed; the position stays where the lost log ended
    assert pub.offer(b"y") == shmbus.codes.NOT_CONNECTED
    claim = pub.try_claim(10)
    assert not claim and claim.result == shmbus.codes.NOT_CONNECTED
    assert pub.offer_many([b"y", b"z"]) == shmbus.codes.NOT_CONNECTED
    assert not pub.is_closed and not pub.is_connected and pub.position == reached
    before = time.monotonic()
    pub._await_progress(0.05)  # nothing will ring: it sleeps the timeout, no spinning
    assert time.monotonic() - before >= 0.04

    pub._rebind(new.log, new.limit, new.positions, 77)
    assert (pub.session_id, pub.registration_id, pub.position) == (2, 77, 0)
    image = new.image()
    assert pub.offer(b"hello") > 0
    assert drain(new, image)[0][0] == b"hello"
    assert old.log.buffer.get_bytes(0, TERM * 3) == old_bytes, "the old log was written"
    pub.close()
    assert pub.offer(b"y") == shmbus.codes.CLOSED and pub.is_closed


def test_a_sleeper_of_the_old_log_leaves_the_new_logs_waiter_count_alone(two_streams,
                                                                         exclusive):
    """Initialised again while a thread sleeps at the old log's limit: the sleeper is let go,
    its count taken back from the old log, and it never touches the new log's count."""
    old, new = two_streams
    pub = old.publication(exclusive)
    sleeper = sleep_at_the_limit(pub, old, 30.0)
    pub._rebind(new.log, new.limit, new.positions, 5)
    sleeper.join(5)
    assert not sleeper.is_alive()
    assert (writers_asleep(old.log), writers_asleep(new.log)) == (0, 0)
    # a sleeper of the new log counts there, and takes its count back on waking
    second = sleep_at_the_limit(pub, new, 0.2)
    second.join(5)
    assert not second.is_alive() and writers_asleep(new.log) == 0
    # a failed initialisation leaves the publication as it was
    with pytest.raises(ValueError, match="mtu"):
        PublicationCore.__init__(
            pub, old.log.buffer, TERM, 0, 33, 1, 9, old.limit.buffer, old.limit.offset,
            exclusive)
    assert pub.session_id == 2 and pub.offer(b"x") == shmbus.codes.BACK_PRESSURED


def test_a_publisher_asleep_at_its_limit_is_woken_by_wake_log_writers(stream, exclusive):
    """What a netbridge's sender calls when it moves: a network publication's limit follows
    the sender position, which no reader's progress rings."""
    pub = stream.publication(exclusive)
    sleeper = sleep_at_the_limit(pub, stream, 30.0)
    _native.wake_log_writers(stream.log.buffer)
    sleeper.join(5)
    assert not sleeper.is_alive()
    assert writers_asleep(stream.log) == 0
    with pytest.raises(TypeError, match="wake_log_writers"):
        _native.wake_log_writers(b"not a log")  # type: ignore[arg-type]
