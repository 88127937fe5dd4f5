"""The sans-IO sender (netbridge.sender), driven by a fake clock over an in-memory publication
log (tests/support/fake_log_port.py): no shared memory.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from netbridge.flow_control import MaxFlowControl
from netbridge.frames import (
    DATA_HEADER_LENGTH,
    HDR_TYPE_DATA,
    HDR_TYPE_PAD,
    SM_FLAG_EOS,
    SM_FLAG_SETUP,
    DataHeader,
    ErrorFrame,
    Nak,
    RttMeasurement,
    SetupFrame,
    decode_frames,
)
from netbridge.log_port import PublicationPort
from netbridge.sender import NetworkSender
from tests.support.fake_log_port import FakePublicationLog
from tests.support.sans_io import (
    CONTROL,
    DEST,
    INITIAL,
    MTU,
    SESSION,
    STREAM,
    TERM,
    connect,
    publication_log,
    sm,
    term_id_at,
)

MS = 1_000_000


@pytest.fixture
def pub() -> Iterator[FakePublicationLog]:
    yield publication_log()


def make_sender(log: PublicationPort, **kwargs: object) -> NetworkSender:
    return NetworkSender(log, destination=DEST, **kwargs)  # type: ignore[arg-type]


def nak(position: int, length: int, *, term_id: int | None = None) -> bytes:
    return Nak(session_id=SESSION, stream_id=STREAM,
               term_id=term_id_at(position) if term_id is None else term_id,
               term_offset=position % TERM, length=length).encode()


def decode(datagram: bytes | memoryview) -> list:
    return list(decode_frames(bytes(datagram)))


def data_headers(out: list) -> list[DataHeader]:
    """Every DATA/PAD frame in a poll's output, in order."""
    found = []
    for datagram, _ in out:
        for frame in decode(datagram):
            if isinstance(frame, DataHeader) and frame.frame_length:
                found.append(frame)
    return found


# --- handshake ---------------------------------------------------------------------------------


def test_setup_every_100ms_until_the_first_status_message(pub: FakePublicationLog) -> None:
    sender = make_sender(pub)
    pub.offer(b"x" * 100)  # published, but nothing may go out before an SM
    out, deadline = sender.poll(0)
    assert len(out) == 1 and out[0][1] == DEST
    (setup,) = decode(out[0][0])
    assert isinstance(setup, SetupFrame)
    assert (setup.session_id, setup.stream_id, setup.initial_term_id) == (SESSION, STREAM, INITIAL)
    assert (setup.active_term_id, setup.term_offset) == (INITIAL, 0)
    assert (setup.term_length, setup.mtu, setup.ttl, setup.flags) == (TERM, MTU, 0, 0)
    assert deadline == 100 * MS
    assert sender.poll(50 * MS)[0] == []
    out, _ = sender.poll(100 * MS)
    assert [type(f) for d, _ in out for f in decode(d)] == [SetupFrame]
    assert sender.setups_sent == 2 and sender.is_setup_phase and not sender.is_connected
    assert sender.sender_position == 0

    sender.on_datagram(120 * MS, sm(0), CONTROL)
    assert not sender.is_setup_phase and sender.is_connected and sender.has_initial_connection
    assert sender.sender_limit == 32 * 1024
    out, _ = sender.poll(130 * MS)
    assert all(isinstance(f, DataHeader) for d, _ in out for f in decode(d))
    assert sender.sender_position == 160  # 32 + 100 aligned
    assert sender.poll(200 * MS + 1)[0] == [] or sender.setups_sent == 2
    assert sender.setups_sent == 2


def test_sm_with_setup_flag_elicits_a_setup_at_once(pub: FakePublicationLog) -> None:
    sender = make_sender(pub)
    connect(sender)
    pub.offer(b"y" * 64)
    sender.poll(1 * MS)
    sender.on_datagram(5 * MS, sm(0, 0, flags=SM_FLAG_SETUP), CONTROL)
    assert sender.sender_limit == 32 * 1024  # an elicit SM carries no flow control
    out, deadline = sender.poll(5 * MS)
    setups = [f for d, _ in out for f in decode(d) if isinstance(f, SetupFrame)]
    assert len(setups) == 1
    assert setups[0].term_offset == 96 and setups[0].active_term_id == INITIAL
    # connected already: one SETUP is enough
    out, _ = sender.poll(200 * MS)
    assert not [f for d, _ in out for f in decode(d) if isinstance(f, SetupFrame)]


# --- data -------------------------------------------------------------------------------------


def test_data_is_sent_straight_from_the_log_packed_up_to_the_mtu(pub: FakePublicationLog) -> None:
    sender = make_sender(pub)
    connect(sender)
    sizes = [10, 200, 1376, 3000, 50] + [20] * 60
    for i, size in enumerate(sizes):
        assert pub.offer(bytes([i % 256]) * size) > 0
    end = pub.position
    out, deadline = sender.poll(1 * MS)
    assert deadline == 1 * MS + 100 * MS
    assert sender.sender_position == end
    position = 0
    for datagram, destination in out:
        assert destination == DEST
        assert isinstance(datagram, memoryview) and datagram.readonly
        assert len(datagram) <= MTU and len(datagram) % 32 == 0
        # the datagram is the log's bytes, frames never split
        assert bytes(datagram) == pub.bytes_at(position, len(datagram))
        for frame in decode(datagram):
            assert frame.type == HDR_TYPE_DATA and frame.frame_length > 0
        position += len(datagram)
    assert position == end
    # plus the SETUP of the handshake
    assert sender.datagrams_sent == len(out) + 1 and sender.bytes_sent == end + 40
    # 60 messages of 20 bytes (64-byte frames) pack 22 to a datagram
    assert max(len(decode(d)) for d, _ in out) == 22


def test_flow_control_limit_holds_data_back_and_counts_back_pressure(
        pub: FakePublicationLog) -> None:
    sender = make_sender(pub)
    connect(sender, window=1000)
    for _ in range(40):
        pub.offer(b"z" * 100)  # 160-byte frames
    out, _ = sender.poll(1 * MS)
    assert sender.sender_position == 960  # six frames fit in 1000 bytes, the seventh does not
    assert sender.sender_limit == 1000
    assert sender.back_pressure_events == 1
    sender.poll(2 * MS)
    assert sender.back_pressure_events == 2
    sender.on_datagram(3 * MS, sm(960, 1000), CONTROL)
    sender.poll(3 * MS)
    assert sender.sender_position == 1920
    # a reordered, older SM does not pull the limit back
    sender.on_datagram(4 * MS, sm(0, 1000), CONTROL)
    assert sender.sender_limit == 1960


def test_budget_per_poll_asks_to_be_called_again_at_once(pub: FakePublicationLog) -> None:
    sender = make_sender(pub, max_datagrams_per_poll=2)
    connect(sender)
    for _ in range(5):
        pub.offer(b"m" * 1376)  # full-mtu frames, one per datagram
    out, deadline = sender.poll(1 * MS)
    assert len(out) == 2 and deadline == 1 * MS
    out, deadline = sender.poll(1 * MS)
    out, deadline = sender.poll(1 * MS)
    assert len(out) == 1 and deadline > 1 * MS
    assert sender.sender_position == 5 * 1408


def test_pad_frame_goes_out_as_its_header_and_the_position_jumps_terms(
    pub: FakePublicationLog,
) -> None:
    sender = make_sender(pub)
    connect(sender)
    sent: list[bytes] = []
    now = 1 * MS
    # 1000-byte messages (1056-byte frames): 62 fit in the term, then the 63rd pads it out
    for _ in range(64):
        assert pub.offer(b"p" * 1000) > 0
        out, _ = sender.poll(now)
        sent.extend(bytes(d) for d, _ in out if decode(d)[0].frame_length)  # not heartbeats
        sender.on_datagram(now, sm(sender.sender_position), CONTROL)
        pub.follow(sender.sender_position)
        now += MS
    pad_offset = 62 * 1056
    with_pad = [d for d in sent if decode(d)[-1].type == HDR_TYPE_PAD]
    assert len(with_pad) == 1
    pad = decode(with_pad[0])[-1]
    assert len(with_pad[0]) == 32  # the header only, though it stands for the rest of the term
    assert (pad.term_offset, pad.frame_length, pad.term_id) == (
        pad_offset, TERM - pad_offset, INITIAL)
    after = sent[sent.index(with_pad[0]) + 1]
    first = decode(after)[0]
    assert (first.term_id, first.term_offset) == (term_id_at(TERM), 0)
    assert first.term_id == 2**31 - 1 and term_id_at(2 * TERM) == -(2**31)  # wraps next
    assert sender.sender_position == TERM + 2 * 1056


def test_heartbeat_after_100ms_idle_at_the_sender_position(pub: FakePublicationLog) -> None:
    sender = make_sender(pub)
    connect(sender)
    out, deadline = sender.poll(0)
    # nothing sent yet since connecting: a heartbeat goes out at once, then every 100 ms
    beats = [f for d, _ in out for f in decode(d)]
    assert len(beats) == 1 and beats[0].is_heartbeat
    assert deadline == 100 * MS
    assert sender.poll(99 * MS)[0] == []
    pub.offer(b"q" * 30)
    out, deadline = sender.poll(99 * MS)  # data resets the idle timer
    assert len(data_headers(out)) == 1
    assert sender.poll(150 * MS)[0] == []
    out, _ = sender.poll(199 * MS)
    (datagram, destination), = out
    assert len(datagram) == DATA_HEADER_LENGTH and destination == DEST
    (beat,) = decode(datagram)
    assert beat.is_heartbeat and beat.flags == 0xC0 and not beat.is_end_of_stream
    assert (beat.term_id, beat.term_offset) == (INITIAL, 64)
    assert (beat.session_id, beat.stream_id) == (SESSION, STREAM)
    assert sender.heartbeats_sent == 2


def test_no_heartbeat_before_the_first_status_message(pub: FakePublicationLog) -> None:
    sender = make_sender(pub)
    for now in range(0, 1000 * MS, 50 * MS):
        out, _ = sender.poll(now)
        assert all(isinstance(f, SetupFrame) for d, _ in out for f in decode(d))
    assert sender.heartbeats_sent == 0


# --- NAK and retransmit ------------------------------------------------------------------------


def test_nak_resends_the_range_and_repeats_are_ignored_while_lingering(
    pub: FakePublicationLog,
) -> None:
    sender = make_sender(pub)
    connect(sender)
    for i in range(30):
        pub.offer(bytes([i]) * 200)  # 256-byte frames
    sender.poll(1 * MS)
    assert sender.sender_position == 30 * 256
    sender.on_datagram(2 * MS, nak(5 * 256, 3 * 256), CONTROL)
    out, deadline = sender.poll(2 * MS)
    frames = data_headers(out)
    assert [f.term_offset for f in frames] == [5 * 256, 6 * 256, 7 * 256]
    assert bytes(out[0][0]) == pub.bytes_at(5 * 256, len(out[0][0]))
    assert sender.retransmits == 1 and sender.retransmitted_bytes == 3 * 256
    assert sender.naks_received == 1
    # the same NAK within the 10 ms linger is ignored
    sender.on_datagram(5 * MS, nak(5 * 256, 3 * 256), CONTROL)
    assert data_headers(sender.poll(5 * MS)[0]) == []
    assert sender.naks_ignored == 1
    # another range is resent at once
    sender.on_datagram(6 * MS, nak(20 * 256, 256), CONTROL)
    assert [f.term_offset for f in data_headers(sender.poll(6 * MS)[0])] == [20 * 256]
    # after the linger the first range can be asked for again
    sender.on_datagram(12 * MS + 1, nak(5 * 256, 256), CONTROL)
    assert [f.term_offset for f in data_headers(sender.poll(12 * MS + 1)[0])] == [5 * 256]
    assert sender.retransmits == 3


def test_nak_length_inside_a_frame_resends_the_whole_frame_packed_to_the_mtu(
    pub: FakePublicationLog,
) -> None:
    sender = make_sender(pub)
    connect(sender)
    for i in range(20):
        pub.offer(bytes([i]) * 400)  # 448-byte frames: three to a datagram
    sender.poll(1 * MS)
    sender.on_datagram(2 * MS, nak(448, 10), CONTROL)
    out, _ = sender.poll(2 * MS)
    assert [f.term_offset for f in data_headers(out)] == [448]
    sender.on_datagram(3 * MS, nak(2 * 448, 7 * 448), CONTROL)
    out, _ = sender.poll(3 * MS)
    assert [len(d) for d, _ in out] == [3 * 448, 3 * 448, 448]


def test_naks_that_make_no_sense_are_ignored(pub: FakePublicationLog) -> None:
    sender = make_sender(pub)
    connect(sender)
    for i in range(10):
        pub.offer(bytes([i]) * 200)
    sender.poll(1 * MS)
    bad = [
        nak(10 * 256, 256),  # not sent yet
        nak(96, 256),  # inside a frame (the header there is payload)
        nak(0, 0),  # empty
        Nak(session_id=SESSION, stream_id=STREAM, term_id=INITIAL, term_offset=TERM + 32,
            length=32).encode(),  # outside the term
        Nak(session_id=SESSION, stream_id=STREAM, term_id=INITIAL, term_offset=33,
            length=32).encode(),  # unaligned
        nak(0, 256, term_id=INITIAL - 3),  # three terms back: long gone
        Nak(session_id=SESSION + 1, stream_id=STREAM, term_id=INITIAL, term_offset=0,
            length=256).encode(),  # another session
    ]
    for datagram in bad:
        sender.on_datagram(2 * MS, datagram, CONTROL)
    out, _ = sender.poll(2 * MS)
    assert data_headers(out) == []
    assert sender.retransmits == 0
    assert sender.naks_received == 6 and sender.naks_ignored == 6 and sender.ignored_frames == 1


def test_retransmits_in_flight_are_capped(pub: FakePublicationLog) -> None:
    sender = make_sender(pub, max_retransmits=2)
    connect(sender)
    for i in range(10):
        pub.offer(bytes([i]) * 200)
    sender.poll(1 * MS)
    for i in range(4):
        sender.on_datagram(2 * MS, nak(i * 256, 256), CONTROL)
    assert sender.retransmits == 2 and sender.naks_ignored == 2
    sender.on_datagram(20 * MS, nak(3 * 256, 256), CONTROL)  # the first two have expired
    assert sender.retransmits == 3


def test_delayed_retransmit_is_sent_when_due(pub: FakePublicationLog) -> None:
    sender = make_sender(pub, retransmit_delay_ns=5 * MS)
    connect(sender)
    for i in range(10):
        pub.offer(bytes([i]) * 200)
    sender.poll(1 * MS)
    sender.on_datagram(2 * MS, nak(256, 256), CONTROL)
    out, deadline = sender.poll(2 * MS)
    assert data_headers(out) == [] and deadline == 7 * MS
    sender.on_datagram(3 * MS, nak(256, 256), CONTROL)  # already scheduled: ignored
    out, _ = sender.poll(7 * MS)
    assert [f.term_offset for f in data_headers(out)] == [256]
    assert sender.retransmits == 1 and sender.naks_ignored == 1


# --- RTT, errors, bad input ---------------------------------------------------------------------


def test_rttm_request_is_echoed_to_its_source(pub: FakePublicationLog) -> None:
    sender = make_sender(pub)
    request = RttMeasurement(flags=0x80, session_id=SESSION, stream_id=STREAM,
                             echo_timestamp=123456789, reception_delta=0, receiver_id=42)
    sender.on_datagram(0, request.encode(), ("10.0.0.9", 5000))
    out, _ = sender.poll(0)
    replies = [(f, dest) for d, dest in out for f in decode(d) if isinstance(f, RttMeasurement)]
    assert len(replies) == 1
    reply, destination = replies[0]
    assert destination == ("10.0.0.9", 5000)
    assert (reply.flags, reply.echo_timestamp, reply.reception_delta, reply.receiver_id) == (
        0, 123456789, 0, 42)
    # an echo (flags 0) needs no answer
    sender.on_datagram(0, reply.encode(), ("10.0.0.9", 5000))
    assert not [f for d, _ in sender.poll(1)[0] for f in decode(d)
                if isinstance(f, RttMeasurement)]
    assert sender.rttm_replies == 1


def test_bad_datagrams_are_counted_and_ignored(pub: FakePublicationLog) -> None:
    sender = make_sender(pub)
    connect(sender)
    for garbage in (b"", b"\x01\x02", b"\xff" * 40, sm(0)[:20]):
        sender.on_datagram(1, garbage, CONTROL)
    assert sender.invalid_datagrams == 4
    sender.on_datagram(1, sm(5000, session_id=SESSION + 1), CONTROL)
    assert sender.sender_limit == 32 * 1024 and sender.ignored_frames == 1
    error = ErrorFrame(session_id=SESSION, stream_id=STREAM, receiver_id=1, error_code=3,
                       message=b"no")
    sender.on_datagram(1, error.encode(), CONTROL)
    assert sender.errors_received == 1 and sender.last_error.text == "no"
    # a datagram is bytes, never decoded frames
    with pytest.raises(TypeError, match="list"):
        sender.on_datagram(1, list(decode_frames(sm(64, 64 * 1024))), CONTROL)
    assert sender.sender_limit == 32 * 1024
    sender.on_datagram(1, memoryview(sm(64, 64 * 1024)), CONTROL)
    assert sender.sender_limit == 64 + 64 * 1024


def test_constructor_checks(pub: FakePublicationLog) -> None:
    with pytest.raises(ValueError):
        make_sender(pub, mtu=1024)  # below the log's mtu: frames would not fit
    with pytest.raises(ValueError):
        make_sender(pub, position=33)


# --- connection and end of stream ---------------------------------------------------------------


def test_connection_is_lost_without_status_messages(pub: FakePublicationLog) -> None:
    sender = make_sender(pub)
    connect(sender)
    _, deadline = sender.poll(1 * MS)
    assert sender.is_connected
    sender.poll(5000 * MS)
    assert sender.is_connected
    sender.poll(5001 * MS)
    assert not sender.is_connected
    sender.on_datagram(5002 * MS, sm(0), CONTROL)
    assert sender.is_connected


def test_the_last_receiver_leaving_ends_the_connection_at_once(pub: FakePublicationLog) -> None:
    """A status message with the EOS flag says its receiver left (its image closed): the
    sender is not connected from then, without waiting for the connection timeout, until a
    receiver speaks again."""
    sender = make_sender(pub)
    connect(sender)
    sender.poll(1 * MS)
    assert sender.is_connected
    sender.on_datagram(2 * MS, sm(0, flags=SM_FLAG_EOS), CONTROL)
    assert not sender.is_connected
    sender.poll(3 * MS)
    assert not sender.is_connected and sender.flow_control.receivers == {}
    sender.on_datagram(4 * MS, sm(0), CONTROL)  # a receiver (back) with a new image
    assert sender.is_connected


def test_one_of_several_receivers_leaving_keeps_the_connection(pub: FakePublicationLog) -> None:
    sender = make_sender(pub, flow_control=MaxFlowControl())
    sender.poll(0)
    sender.on_datagram(0, sm(0, receiver_id=1), CONTROL)
    sender.on_datagram(0, sm(0, receiver_id=2), ("10.0.0.3", 40123))
    sender.on_datagram(1 * MS, sm(0, flags=SM_FLAG_EOS, receiver_id=1), CONTROL)
    assert sender.is_connected and list(sender.flow_control.receivers) == [2]
    sender.on_datagram(2 * MS, sm(0, flags=SM_FLAG_EOS, receiver_id=2), ("10.0.0.3", 40123))
    assert not sender.is_connected


def test_close_sends_end_of_stream_heartbeats_once_everything_is_sent(
    pub: FakePublicationLog,
) -> None:
    sender = make_sender(pub)
    connect(sender, window=200)
    for i in range(3):
        pub.offer(bytes([i]) * 100)  # 160-byte frames: one fits the window at a time
    sender.poll(0)
    sender.close()
    assert sender.end_position == 480 and not sender.is_end_of_stream
    out, _ = sender.poll(200 * MS)
    beats = [f for d, _ in out for f in decode(d) if f.frame_length == 0]
    assert beats and not beats[0].is_end_of_stream  # data still unsent: plain heartbeat
    sender.on_datagram(201 * MS, sm(480, 1000), CONTROL)
    out, deadline = sender.poll(202 * MS)
    frames = [f for d, _ in out for f in decode(d)]
    assert [f.frame_length for f in frames] == [132, 132, 0]
    eos = frames[-1]
    assert eos.flags == 0xE0 and eos.term_offset == 480 and sender.is_end_of_stream
    assert sender.poll(250 * MS)[0] == []
    out, _ = sender.poll(302 * MS)
    (eos_again,) = [f for d, _ in out for f in decode(d)]
    assert eos_again.flags == 0xE0
    # at end of stream a SETUP is no longer elicited
    sender.on_datagram(303 * MS, sm(0, 0, flags=SM_FLAG_SETUP), CONTROL)
    assert not [f for d, _ in sender.poll(303 * MS)[0] for f in decode(d)
                if isinstance(f, SetupFrame)]


def test_a_publication_that_did_not_start_at_zero() -> None:
    stream = publication_log(initial_term_id=5)
    sender = NetworkSender(stream, destination=DEST, position=0)
    assert sender.poll(0)[0]
    # positions are relative to the initial term
    connect(sender)
    stream.offer(b"i" * 10)
    (frame,) = data_headers(sender.poll(1 * MS)[0])
    assert (frame.term_id, frame.term_offset) == (5, 0)


def test_destinations_can_be_added_and_removed(pub: FakePublicationLog) -> None:
    sender = make_sender(pub)
    connect(sender)
    other = ("10.0.0.3", 40123)
    sender.add_destination(other)
    pub.offer(b"d" * 64)
    out, _ = sender.poll(1 * MS)
    kinds = [(type(decode(d)[0]).__name__, dest) for d, dest in out]
    assert ("SetupFrame", other) in kinds and ("DataHeader", other) in kinds
    assert ("DataHeader", DEST) in kinds
    sender.remove_destination(DEST)
    pub.offer(b"e" * 64)
    out, _ = sender.poll(2 * MS)
    assert [dest for _, dest in out] == [other]


def test_a_scan_the_process_layer_sent_is_accounted_as_a_polls(pub: FakePublicationLog) -> None:
    """What the bridge's native spin does (the scan spin_send allows, sent to every destination
    by the process layer, then on_data_sent) leaves a sender as its own poll does."""
    other = publication_log()
    spun, polled = make_sender(pub, data_batches=True), make_sender(other, data_batches=True)
    for sender in (spun, polled):
        sender.add_destination(("10.0.0.3", 40123))
        connect(sender, window=1 << 20)
        sender.poll(0)  # the SETUP phase is over: nothing queued
    for log in (pub, other):
        for i in range(40):
            log.offer(bytes([i]) * 300)
    position, limit, mtu, most = spun.spin_send()  # type: ignore[misc]
    scan = pub.scan(position, limit, mtu, most)
    spun.on_data_sent(5 * MS, scan)
    (batch, _), _ = polled.poll(5 * MS)[0]
    assert scan.datagrams == batch.count > 1 and scan.length == batch.length
    for name in ("sender_position", "datagrams_sent", "bytes_sent", "back_pressure_events"):
        assert getattr(spun, name) == getattr(polled, name), name
    assert spun.poll(5 * MS)[0] == []  # nothing left that the spin should have sent


def test_a_sender_whose_committed_frame_does_not_fit_waits_for_a_status_message(
        pub: FakePublicationLog) -> None:
    """At the end of the receiver's window, with the next frame committed but too long for
    what is left, the sender does not wait for data (a process layer watching for a frame
    there would find it ready forever) but for a status message that moves its limit."""
    sender = make_sender(pub, data_batches=True)
    connect(sender, window=1000)
    sender.poll(0)
    assert sender.waits_for_data and not sender.data_ready()  # nothing committed yet
    pub.offer(b"x" * 600)  # 640 bytes aligned
    assert sender.data_ready()
    pub.offer(b"y" * 600)
    sender.poll(1)
    assert (sender.sender_position, sender.sender_limit) == (640, 1000)
    assert not sender.waits_for_data and not sender.data_ready()
    assert sender.spin_send() is None
    sender.on_datagram(2, sm(640, 1000), CONTROL)
    sender.poll(2)
    assert sender.sender_position == 1280 and sender.waits_for_data
