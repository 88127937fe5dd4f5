"""The sans-IO receiver (netbridge.receiver), driven by a fake clock and hand-made datagrams;
what it rebuilds in in-memory image logs (tests/support/fake_log_port.py) is read back as a
subscriber would. No shared memory.
"""

from __future__ import annotations

import math
import struct

import pytest

from netbridge.frames import (
    DATA_FLAG_EOS,
    SM_FLAG_EOS,
    SM_FLAG_SETUP,
    Nak,
    RttMeasurement,
    SetupFrame,
    StatusMessage,
    data_frame,
    decode_frames,
    encode_datagram,
    pad_frame,
)
from netbridge.receiver import LEAVING_STATUS_MESSAGES, NetworkReceiver
from netbridge.receiver_image import (
    EndOfStream,
    ImageAvailable,
    ImageUnavailable,
    LossDetected,
)
from tests.support.fake_log_port import FakeImageHost, FakeImageLog
from tests.support.sans_io import (
    INITIAL,
    MTU,
    RECEIVER_ID,
    SENDER,
    SESSION,
    STREAM,
    TERM,
    beat,
    data,
    make_receiver,
    payload,
    setup,
    term_id_at,
)

MS = 1_000_000
WINDOW = TERM // 2  # the default window, capped at half the term


class ImageHost(FakeImageHost):
    """The image factory of the tests (in-memory image logs, one subscriber each); its
    subscribers' positions feed the SMs."""

    def image(self, session_id: int = SESSION, stream_id: int = STREAM) -> FakeImageLog:
        return super().image(session_id, stream_id)

    def read(self, session_id: int = SESSION, stream_id: int = STREAM) -> list[bytes]:
        """Every fragment the subscriber can read now, as bytes."""
        return self.image(session_id, stream_id).poll()


@pytest.fixture
def host() -> ImageHost:
    return ImageHost()


def frames_out(result) -> list:
    return [(f, dest) for d, dest in result.datagrams for f in decode_frames(d)]


def sms(result) -> list[StatusMessage]:
    return [f for f, _ in frames_out(result) if isinstance(f, StatusMessage)]


def naks(result) -> list[Nak]:
    return [f for f, _ in frames_out(result) if isinstance(f, Nak)]


def joined(host: ImageHost, position: int = 0, **kwargs: object) -> NetworkReceiver:
    """A receiver with an image of SESSION that joined at ``position``; its first SM is out."""
    receiver = make_receiver(host, **kwargs)
    receiver.on_datagram(0, setup(position), SENDER)
    receiver.poll(0)
    return receiver


# --- setup -------------------------------------------------------------------------------------


def test_setup_creates_an_image_and_is_answered_with_a_status_message(host: ImageHost) -> None:
    receiver = make_receiver(host)
    receiver.on_datagram(0, setup(3 * TERM + 448), SENDER)
    (request,) = host.requests
    assert (request.session_id, request.stream_id, request.initial_term_id) == (
        SESSION, STREAM, INITIAL)
    assert (request.term_length, request.mtu, request.source) == (TERM, MTU, SENDER)
    assert request.join_position == 3 * TERM + 448
    assert request.active_term_id == term_id_at(3 * TERM) < 0  # across the int32 wrap
    result = receiver.poll(0)
    (event,) = result.events
    assert isinstance(event, ImageAvailable)
    image = event.image
    assert (image.rcv_pos, image.rcv_hwm, image.window) == (3 * TERM + 448,) * 2 + (WINDOW,)
    ((sm, destination),) = frames_out(result)
    assert destination == SENDER
    assert isinstance(sm, StatusMessage) and sm.flags == 0
    assert (sm.session_id, sm.stream_id, sm.receiver_id) == (SESSION, STREAM, RECEIVER_ID)
    assert (sm.consumption_term_id, sm.consumption_term_offset) == (term_id_at(3 * TERM), 448)
    assert sm.receiver_window == WINDOW and sm.group_tag is None
    assert result.next_deadline_ns == 200 * MS
    # a repeated SETUP (our SM was lost) is answered at once, without a second image
    receiver.on_datagram(10 * MS, setup(3 * TERM + 448), SENDER)
    result = receiver.poll(10 * MS)
    assert len(sms(result)) == 1 and not result.events and len(host.requests) == 1


def test_setup_for_an_unsubscribed_stream_or_a_bad_geometry_is_ignored(host: ImageHost) -> None:
    receiver = make_receiver(host)
    receiver.on_datagram(0, setup(0, stream_id=STREAM + 1), SENDER)
    receiver.on_datagram(0, setup(0, term_length=TERM + 1), SENDER)
    receiver.on_datagram(0, setup(0, mtu=100), SENDER)
    receiver.on_datagram(0, SetupFrame(term_offset=33, session_id=SESSION, stream_id=STREAM,
                                       initial_term_id=INITIAL, active_term_id=INITIAL,
                                       term_length=TERM, mtu=MTU).encode(), SENDER)
    assert host.requests == [] and receiver.images == {}
    assert receiver.invalid_datagrams == 3 and receiver.ignored_frames == 1
    assert receiver.poll(0) == ([], [], None)


def test_a_declining_factory_creates_no_image() -> None:
    host = ImageHost(decline=True)
    receiver = make_receiver(host)
    receiver.on_datagram(0, setup(0), SENDER)
    assert len(host.requests) == 1 and receiver.images == {}


def test_receiver_window_comes_from_the_factory_and_group_tag_goes_into_sms() -> None:
    host = ImageHost(receiver_window=4096)
    receiver = make_receiver(host, group_tag=99)
    receiver.on_datagram(0, setup(0), SENDER)
    (sm,) = sms(receiver.poll(0))
    assert sm.receiver_window == 4096 and sm.group_tag == 99


# --- data --------------------------------------------------------------------------------------


def test_data_in_order_is_readable_by_the_subscriber(host: ImageHost) -> None:
    receiver = joined(host)
    receiver.on_datagram(1 * MS, data(0, payload(1), payload(2, 10)), SENDER)
    receiver.on_datagram(1 * MS, data(192, payload(3, 1376)), SENDER)
    image = receiver.images[(SESSION, STREAM)]
    assert image.rcv_pos == image.rcv_hwm == 192 + 1408
    assert host.read() == [payload(1), payload(2, 10), payload(3, 1376)]
    assert image.datagrams_received == 2 and image.bytes_received == 192 + 1408


def test_reordered_data_leaves_a_gap_that_is_naked_at_once_then_filled(
    host: ImageHost,
) -> None:
    receiver = joined(host)
    receiver.on_datagram(1 * MS, data(0, payload(0)), SENDER)
    receiver.on_datagram(1 * MS, data(256, payload(2)), SENDER)  # 128..256 is missing
    image = receiver.images[(SESSION, STREAM)]
    assert (image.rcv_pos, image.rcv_hwm) == (128, 384)
    assert host.read() == [payload(0)]  # the subscriber stops at the gap
    result = receiver.poll(1 * MS)
    ((nak_frame, destination),) = [(f, d) for f, d in frames_out(result) if isinstance(f, Nak)]
    assert destination == SENDER
    assert (nak_frame.term_id, nak_frame.term_offset, nak_frame.length) == (INITIAL, 128, 128)
    (loss,) = [e for e in result.events if isinstance(e, LossDetected)]
    assert (loss.term_id, loss.term_offset, loss.length) == (INITIAL, 128, 128)
    receiver.on_datagram(2 * MS, data(128, payload(1)), SENDER)
    assert image.rcv_pos == image.rcv_hwm == 384
    assert host.read() == [payload(1), payload(2)]
    assert naks(receiver.poll(20 * MS)) == []
    assert image.gaps_detected == 1 and image.naks_sent == 1


def test_every_gap_is_naked_not_only_the_first(host: ImageHost) -> None:
    receiver = joined(host)
    for position in (0, 256, 512, 1024):  # missing: 128, 384, 640..1024
        receiver.on_datagram(1 * MS, data(position, payload(position // 128)), SENDER)
    result = receiver.poll(1 * MS)
    assert [(n.term_offset, n.length) for n in naks(result)] == [(128, 128), (384, 128),
                                                                  (640, 384)]
    assert len([e for e in result.events if isinstance(e, LossDetected)]) == 3


def test_a_gap_is_naked_again_after_the_retry_time_until_filled(host: ImageHost) -> None:
    receiver = joined(host)
    receiver.on_datagram(1 * MS, data(512, payload(4)), SENDER)
    result = receiver.poll(1 * MS)
    assert [(n.term_offset, n.length) for n in naks(result)] == [(0, 512)]
    assert result.next_deadline_ns == 11 * MS
    assert naks(receiver.poll(10 * MS)) == []
    result = receiver.poll(11 * MS)
    assert [(n.term_offset, n.length) for n in naks(result)] == [(0, 512)]
    assert not [e for e in result.events if isinstance(e, LossDetected)]  # reported once
    # a retransmit that fills part of the gap: the rest keeps its timer (no NAK burst)
    receiver.on_datagram(12 * MS, data(0, payload(0), payload(1)), SENDER)
    assert naks(receiver.poll(12 * MS)) == []
    assert [(n.term_offset, n.length) for n in naks(receiver.poll(21 * MS))] == [(256, 256)]


def test_a_gap_across_a_term_boundary_is_naked_per_term(host: ImageHost) -> None:
    start = TERM - 256
    receiver = joined(host, start)
    receiver.on_datagram(1 * MS, data(TERM + 128, payload(9)), SENDER)
    result = receiver.poll(1 * MS)
    assert [(n.term_id, n.term_offset, n.length) for n in naks(result)] == [
        (INITIAL, TERM - 256, 256), (INITIAL + 1, 0, 128)]


def test_tail_loss_is_found_from_a_heartbeat(host: ImageHost) -> None:
    receiver = joined(host)
    receiver.on_datagram(1 * MS, data(0, payload(0)), SENDER)
    assert naks(receiver.poll(1 * MS)) == []
    receiver.on_datagram(100 * MS, beat(384), SENDER)
    image = receiver.images[(SESSION, STREAM)]
    assert (image.rcv_pos, image.rcv_hwm, image.heartbeats_received) == (128, 384, 1)
    assert [(n.term_offset, n.length) for n in naks(receiver.poll(100 * MS))] == [(128, 256)]


def test_duplicates_are_ignored(host: ImageHost) -> None:
    receiver = joined(host)
    first = data(0, payload(0), payload(1))
    receiver.on_datagram(1 * MS, first, SENDER)
    receiver.on_datagram(1 * MS, data(512, payload(4)), SENDER)
    receiver.on_datagram(1 * MS, first, SENDER)  # below the rebuild position
    receiver.on_datagram(1 * MS, data(512, payload(4)), SENDER)  # above it, already there
    image = receiver.images[(SESSION, STREAM)]
    assert image.duplicates == 2
    assert host.read() == [payload(0), payload(1)]
    # a retransmit that overlaps what is there and fills the gap
    receiver.on_datagram(2 * MS, data(128, payload(1), payload(2), payload(3)), SENDER)
    assert image.rcv_pos == 640
    assert host.read() == [payload(2), payload(3), payload(4)]


def test_a_pad_frame_covers_the_rest_of_the_term(host: ImageHost) -> None:
    start = TERM - 512
    receiver = joined(host, start)
    pad = encode_datagram([
        data_frame(term_offset=start % TERM, session_id=SESSION, stream_id=STREAM,
                   term_id=term_id_at(start), payload=payload(7)),
        pad_frame(frame_length=384, term_offset=TERM - 384, session_id=SESSION,
                  stream_id=STREAM, term_id=term_id_at(start)),
    ])
    assert len(pad) == 160
    receiver.on_datagram(1 * MS, pad, SENDER)
    receiver.on_datagram(1 * MS, data(TERM, payload(8)), SENDER)
    image = receiver.images[(SESSION, STREAM)]
    assert image.rcv_pos == TERM + 128
    assert host.read() == [payload(7), payload(8)]


def test_data_beyond_the_window_is_dropped(host: ImageHost) -> None:
    receiver = joined(host)
    receiver.on_datagram(1 * MS, data(WINDOW - 128, payload(1)), SENDER)  # ends at the edge
    receiver.on_datagram(1 * MS, data(WINDOW, payload(2)), SENDER)
    image = receiver.images[(SESSION, STREAM)]
    assert image.overruns == 1 and receiver.overruns == 1
    assert image.rcv_hwm == WINDOW


def test_frames_of_an_unknown_session_elicit_a_setup_at_a_limited_rate(host: ImageHost) -> None:
    receiver = joined(host)
    other = SESSION + 1
    receiver.on_datagram(1 * MS, data(0, payload(0), session_id=other), SENDER)
    receiver.on_datagram(2 * MS, beat(0, session_id=other), SENDER)
    result = receiver.poll(2 * MS)
    ((elicit, destination),) = [(f, d) for f, d in frames_out(result)
                                if isinstance(f, StatusMessage) and f.session_id == other]
    assert destination == SENDER and elicit.flags == SM_FLAG_SETUP
    assert (elicit.consumption_term_id, elicit.consumption_term_offset,
            elicit.receiver_window, elicit.receiver_id) == (0, 0, 0, RECEIVER_ID)
    receiver.on_datagram(150 * MS, beat(0, session_id=other), SENDER)
    assert not [f for f in sms(receiver.poll(150 * MS)) if f.session_id == other]
    receiver.on_datagram(202 * MS, beat(0, session_id=other), SENDER)
    assert [f for f in sms(receiver.poll(202 * MS)) if f.session_id == other]
    assert receiver.unknown_session_datagrams == 4 and receiver.setup_elicitations == 2
    # the image of the known session is untouched, and no image was made for the other
    assert list(receiver.images) == [(SESSION, STREAM)] and host.read() == []
    # data for a stream nobody subscribed to is dropped without an answer (the one status
    # message is the closed image's goodbye: test_closing_an_image)
    receiver.remove_subscription(STREAM, 300 * MS)
    receiver.on_datagram(301 * MS, data(0, payload(0), session_id=other + 1), SENDER)
    assert [(f.session_id, f.flags) for f in sms(receiver.poll(301 * MS))] == [
        (SESSION, SM_FLAG_EOS)]


def test_rttm_request_is_echoed(host: ImageHost) -> None:
    receiver = joined(host)
    request = RttMeasurement(flags=0x80, session_id=SESSION, stream_id=STREAM,
                             echo_timestamp=987, receiver_id=RECEIVER_ID)
    receiver.on_datagram(1 * MS, request.encode(), SENDER)
    ((reply, destination),) = [(f, d) for f, d in frames_out(receiver.poll(1 * MS))
                               if isinstance(f, RttMeasurement)]
    assert destination == SENDER
    assert (reply.flags, reply.echo_timestamp, reply.receiver_id) == (0, 987, RECEIVER_ID)
    # for another receiver, or an unknown session: no echo
    receiver.on_datagram(2 * MS, RttMeasurement(
        flags=0x80, session_id=SESSION, stream_id=STREAM, echo_timestamp=1,
        receiver_id=RECEIVER_ID + 1).encode(), SENDER)
    receiver.on_datagram(2 * MS, RttMeasurement(
        flags=0x80, session_id=SESSION + 5, stream_id=STREAM, echo_timestamp=1,
        receiver_id=RECEIVER_ID).encode(), SENDER)
    assert receiver.rttm_replies == 1 and receiver.ignored_frames == 2


def rttms(result) -> list[tuple[RttMeasurement, object]]:
    return [(f, d) for f, d in frames_out(result) if isinstance(f, RttMeasurement)]


def echo_of(request: RttMeasurement, *, reception_delta: int = 0, **changes: int) -> bytes:
    """The sender's echo of ``request`` (flags 0), with ``changes`` to its fields."""
    fields = {"session_id": request.session_id, "stream_id": request.stream_id,
              "echo_timestamp": request.echo_timestamp, "receiver_id": request.receiver_id}
    fields.update(changes)
    return RttMeasurement(flags=0, reception_delta=reception_delta, **fields).encode()


def test_rtt_is_measured_at_the_interval_and_taken_from_the_echo(host: ImageHost) -> None:
    receiver = joined(host, rttm_interval_ns=1000 * MS)
    image = receiver.images[(SESSION, STREAM)]
    assert image.rtt_ns is None and image.rttm_requests == 0
    # no request before one interval has passed since the SETUP; the deadline says when
    assert rttms(receiver.poll(999 * MS)) == []
    receiver.on_datagram(999 * MS, beat(0), SENDER)  # keep the image alive
    result = receiver.poll(1000 * MS)
    ((request, destination),) = rttms(result)
    assert destination == image.control_address == SENDER
    assert request.flags == 0x80 and request.wants_reply
    assert (request.session_id, request.stream_id) == (SESSION, STREAM)
    assert (request.echo_timestamp, request.reception_delta) == (1000 * MS, 0)
    assert request.receiver_id == RECEIVER_ID
    assert request.encode()[5] == 0x80  # the raw flags byte on the wire
    assert image.rttm_requests == receiver.rttm_requests == 1
    # nothing more until the next interval, which bounds the next deadline
    assert rttms(receiver.poll(1500 * MS)) == []
    assert receiver.poll(1900 * MS).next_deadline_ns <= 2000 * MS

    # the echo comes back 3 ms later (2 ms of it spent in the sender): rtt = 1 ms
    receiver.on_datagram(1003 * MS, echo_of(request, reception_delta=2 * MS), SENDER)
    assert image.rtt_ns == 1 * MS
    assert image.rtt_measurements == receiver.rtt_measurements == 1
    assert rttms(receiver.poll(1003 * MS)) == []  # an echo is not echoed again
    assert receiver.rttm_replies == 0

    ((second, _),) = rttms(receiver.poll(2000 * MS))
    assert second.echo_timestamp == 2000 * MS
    receiver.on_datagram(2000 * MS + 250_000, echo_of(second), SENDER)
    assert image.rtt_ns == 250_000  # the last measurement, not an average
    assert image.rtt_measurements == 2


def test_cubic_backs_off_on_a_gap_grows_back_and_keeps_data_sent_under_a_larger_window(
    host: ImageHost,
) -> None:
    receiver = make_receiver(host, congestion_control="cubic", rttm_interval_ns=1000 * MS)
    receiver.on_datagram(0, setup(0), SENDER)
    (sm,) = sms(receiver.poll(0))
    # cubic's first window (docs/protocol.md, Congestion control)
    assert sm.receiver_window == 10 * MTU
    image = receiver.images[(SESSION, STREAM)]
    assert (image.window, image.max_window) == (10 * MTU, WINDOW)
    assert image.congestion_control.name == "cubic"
    # below its largest window, the image wants a poll at least every update interval
    assert receiver.poll(0).next_deadline_ns == 1 * MS

    # 128 bytes go missing: NAKed, and the window drops to 8 MTUs in a status message at once
    receiver.on_datagram(1 * MS, data(0, payload(1)), SENDER)
    receiver.on_datagram(1 * MS, data(256, payload(3)), SENDER)
    result = receiver.poll(1 * MS)
    assert [type(e) for e in result.events] == [LossDetected] and len(naks(result)) == 1
    (sm,) = sms(result)
    assert sm.receiver_window == image.window == 8 * MTU
    # more gaps in the same round trip are the same congestion event
    receiver.on_datagram(1 * MS, data(512, payload(5)), SENDER)
    result = receiver.poll(1 * MS)
    assert len(result.events) == 1 and sms(result) == [] and image.window == 8 * MTU
    # data the sender sent before it heard of the smaller window still fits the log: kept
    receiver.on_datagram(1 * MS, data(10 * MTU - 128, payload(9)), SENDER)
    assert image.overruns == 0 and image.rcv_hwm == 10 * MTU
    assert len(receiver.poll(1 * MS).events) == 1  # one more gap, the same event
    assert image.congestion_control.congestion_events == 1 and image.window == 8 * MTU
    # the retransmits fill every gap
    for position in (128, 384, *range(640, 10 * MTU - 128, 128)):
        receiver.on_datagram(2 * MS, data(position, payload(position // 128)), SENDER)
    assert image.rcv_pos == 10 * MTU

    # a measured round trip sets the pace of growth
    receiver.on_datagram(999 * MS, beat(10 * MTU), SENDER)
    ((request, _),) = rttms(receiver.poll(1000 * MS))
    receiver.on_datagram(1002 * MS, echo_of(request), SENDER)
    assert image.congestion_control.rtt_ns == 2 * MS  # type: ignore[attr-defined]
    # without further loss it is back at 10 MTUs K = cbrt(10 * 0.2 / 0.4) s after the loss,
    # and each change is advertised at once
    k_ns = int(math.cbrt(10 * 0.2 / 0.4) * 1e9)
    changes = []
    for now in range(1003 * MS, 1800 * MS, 2 * MS):
        receiver.on_datagram(now, beat(10 * MTU), SENDER)
        changes += [(now, sm.receiver_window) for sm in sms(receiver.poll(now))
                    if not changes or sm.receiver_window != changes[-1][1]]
    assert [window for _, window in changes] == [9 * MTU, 10 * MTU]  # 9 after 0.35 s
    assert 1 * MS + k_ns <= changes[-1][0] <= 1 * MS + k_ns + 4 * MS
    assert image.congestion_control.congestion_events == 1


def test_rtt_echoes_for_another_receiver_or_session_are_ignored(host: ImageHost) -> None:
    receiver = joined(host, rttm_interval_ns=100 * MS)
    image = receiver.images[(SESSION, STREAM)]
    ((request, _),) = rttms(receiver.poll(100 * MS))
    ignored = receiver.ignored_frames
    receiver.on_datagram(101 * MS, echo_of(request, receiver_id=RECEIVER_ID + 1), SENDER)
    receiver.on_datagram(101 * MS, echo_of(request, receiver_id=0), SENDER)
    receiver.on_datagram(101 * MS, echo_of(request, session_id=SESSION + 1), SENDER)
    receiver.on_datagram(101 * MS, echo_of(request, stream_id=STREAM + 1), SENDER)
    # an echo that claims a time after now (a broken clock or a forged frame)
    receiver.on_datagram(101 * MS, echo_of(request, echo_timestamp=102 * MS), SENDER)
    assert image.rtt_ns is None and receiver.rtt_measurements == 0
    assert receiver.ignored_frames == ignored + 5
    assert rttms(receiver.poll(101 * MS)) == []  # none of them is answered
    receiver.on_datagram(102 * MS, echo_of(request), SENDER)
    assert image.rtt_ns == 2 * MS


def test_rtt_measurement_can_be_disabled_and_stops_at_end_of_stream(host: ImageHost) -> None:
    with pytest.raises(ValueError, match="rttm_interval_ns"):
        make_receiver(host, rttm_interval_ns=-1)
    receiver = joined(host, rttm_interval_ns=0)
    for t in range(1, 40):
        receiver.on_datagram(t * 250 * MS, beat(0), SENDER)
        assert rttms(receiver.poll(t * 250 * MS)) == []
    assert receiver.images[(SESSION, STREAM)].rttm_requests == 0

    # an image at end of stream measures no more (its sender is going away)
    other = SESSION + 1
    receiver = make_receiver(host, rttm_interval_ns=100 * MS)
    receiver.on_datagram(0, setup(0, session_id=other), SENDER)
    receiver.poll(0)
    receiver.on_datagram(50 * MS, beat(0, eos=True, session_id=other), SENDER)
    receiver.poll(50 * MS)
    image = receiver.images[(other, STREAM)]
    assert image.is_end_of_stream
    assert rttms(receiver.poll(500 * MS)) == [] and image.rttm_requests == 0


def test_a_datagram_is_bytes_not_decoded_frames(host: ImageHost) -> None:
    receiver = make_receiver(host)
    with pytest.raises(TypeError, match="list"):
        receiver.on_datagram(0, list(decode_frames(setup(0))), SENDER)
    assert receiver.datagrams_received == 0 and host.requests == []
    receiver.on_datagram(0, setup(0), SENDER)
    receiver.on_datagram(1, memoryview(data(0, payload(5), payload(6))), SENDER)
    receiver.poll(1)
    assert host.read() == [payload(5), payload(6)]


# --- status messages ---------------------------------------------------------------------------


def test_status_message_cadence(host: ImageHost) -> None:
    receiver = joined(host)
    image = receiver.images[(SESSION, STREAM)]
    quarter = WINDOW // 4  # 8 KiB
    # below a quarter window of consumption: only the 200 ms timeout, repeating position 0
    receiver.on_datagram(1 * MS, data(0, *[payload(i, 1000) for i in range(7)]), SENDER)
    host.read()
    assert host.image().position == 7 * 1056 < quarter
    assert sms(receiver.poll(1 * MS)) == []
    (sm,) = sms(receiver.poll(200 * MS))
    assert sm.consumption_term_offset == 0
    # past a quarter window: an SM at once, at the subscriber's position
    receiver.on_datagram(201 * MS, data(7 * 1056, payload(7, 1000), payload(8, 1000)), SENDER)
    host.read()
    (sm,) = sms(receiver.poll(201 * MS))
    assert sm.consumption_term_offset == 9 * 1056 == image.sm_position
    assert sms(receiver.poll(300 * MS)) == []
    (sm,) = sms(receiver.poll(401 * MS))
    assert sm.consumption_term_offset == 9 * 1056
    assert image.sms_sent == 4


def test_status_message_when_consumption_enters_a_new_term() -> None:
    host = ImageHost(receiver_window=TERM // 2)
    start = TERM - 1024
    receiver = joined(host, start)
    receiver.on_datagram(1 * MS, data(start, payload(1, 992)), SENDER)
    receiver.on_datagram(1 * MS, data(TERM, payload(2)), SENDER)
    host.read()
    (sm,) = sms(receiver.poll(1 * MS))  # only 1152 bytes consumed (< 8 KiB), but a new term
    assert (sm.consumption_term_id, sm.consumption_term_offset) == (term_id_at(TERM), 128)


def test_a_small_window_is_at_least_an_mtu_and_is_advertised_before_a_frame_cannot_fit() -> None:
    host = ImageHost(receiver_window=1024)
    receiver = joined(host)
    image = receiver.images[(SESSION, STREAM)]
    assert image.window == MTU  # a smaller window could never carry a full frame
    receiver.on_datagram(1 * MS, data(0, payload(0, 288)), SENDER)  # a 320-byte frame
    host.read()
    # 320 bytes is less than a quarter window, but with the SM at 0 only 1088 bytes of room
    # are left: less than a frame, so the sender may be blocked; advertise at once
    (sm,) = sms(receiver.poll(1 * MS))
    assert sm.consumption_term_offset == 320 and sm.receiver_window == MTU


def int32_at(log: FakeImageLog, offset: int) -> int:
    """The int32 at ``offset`` of the log's partitions (term 0's first)."""
    return int(struct.unpack_from("<i", log.memory, offset)[0])


def test_consumption_moves_the_window_and_the_log_is_cleaned_a_term_behind(
    host: ImageHost,
) -> None:
    receiver = joined(host)
    image = receiver.images[(SESSION, STREAM)]
    log = host.image()
    frames_per_term = TERM // 1024
    for k in range(4 * frames_per_term + 10):  # through every partition and on
        receiver.on_datagram(k * MS, data(k * 1024, payload(k, 992)), SENDER)
        assert host.read() == [payload(k, 992)]
        receiver.poll(k * MS)
        assert image.overruns == 0
        if k == 2 * frames_per_term + 20:
            # term 0's partition is clean once consumption is a term past its end
            assert log.memory[:TERM] == bytes(TERM)
            # term 1's only up to a term behind consumption (149 KiB - 64 KiB)
            assert int32_at(log, TERM + 20 * 1024) == 0
            assert int32_at(log, TERM + 21 * 1024) == 1024 - 32 + 32
    assert image.consumption_position == (4 * frames_per_term + 10) * 1024
    # term 3 reused partition 0; it is cleaned up to a term behind consumption
    assert log.memory[:9 * 1024] == bytes(9 * 1024)
    assert int32_at(log, 10 * 1024) != 0
    assert image.sms_sent > 4 * TERM // (WINDOW // 4)


# --- end of stream and liveness ------------------------------------------------------------------


def test_end_of_stream_at_the_rebuild_position_ends_the_image_cleanly(host: ImageHost) -> None:
    receiver = joined(host)
    image = receiver.images[(SESSION, STREAM)]
    receiver.on_datagram(1 * MS, data(0, payload(0)), SENDER)
    # an EOS heartbeat past a gap: the gap is NAKed, the end is not reached yet
    receiver.on_datagram(2 * MS, beat(256, eos=True), SENDER)
    result = receiver.poll(2 * MS)
    assert [(n.term_offset, n.length) for n in naks(result)] == [(128, 128)]
    assert not [e for e in result.events if isinstance(e, EndOfStream)]
    assert image.end_of_stream_position == 256 and not image.is_end_of_stream
    receiver.on_datagram(3 * MS, data(128, payload(1)), SENDER)
    result = receiver.poll(3 * MS)
    (eos,) = [e for e in result.events if isinstance(e, EndOfStream)]
    assert eos.position == 256 and eos.image is image
    (sm,) = sms(result)
    assert sm.flags == SM_FLAG_EOS
    assert image.log.end_of_stream_position == 256
    assert host.read() == [payload(0), payload(1)] and host.image().is_end_of_stream
    # later SMs keep the EOS flag; the image stays while the sender lingers
    receiver.on_datagram(100 * MS, beat(256, eos=True), SENDER)
    assert [s.flags for s in sms(receiver.poll(300 * MS))] == [SM_FLAG_EOS]
    # then it times out, reported as ended
    result = receiver.poll(100 * MS + 10_000 * MS + 1)
    (gone,) = result.events
    assert isinstance(gone, ImageUnavailable) and gone.reason == "end_of_stream"
    assert receiver.images == {}


def test_data_past_the_end_of_stream_is_refused(host: ImageHost) -> None:
    receiver = joined(host)
    receiver.on_datagram(1 * MS, beat(0, eos=True), SENDER)
    receiver.on_datagram(1 * MS, data(0, payload(0)), SENDER)
    assert host.read() == []
    assert [type(e) for e in receiver.poll(1 * MS).events] == [EndOfStream]


def test_an_image_that_hears_nothing_times_out_and_its_session_cools_down(
    host: ImageHost,
) -> None:
    receiver = joined(host, image_liveness_timeout_ns=10_000 * MS)
    receiver.on_datagram(5_000 * MS, beat(0), SENDER)
    result = receiver.poll(5_000 * MS)
    assert result.next_deadline_ns <= 5_200 * MS
    assert not receiver.poll(15_000 * MS).events
    (event,) = receiver.poll(15_000 * MS + 1).events
    assert isinstance(event, ImageUnavailable) and event.reason == "timeout"
    assert receiver.images == {}
    # during the cool-down its frames are dropped without eliciting a SETUP
    receiver.on_datagram(15_001 * MS, beat(0), SENDER)
    receiver.on_datagram(15_001 * MS, setup(0), SENDER)
    assert sms(receiver.poll(15_001 * MS)) == [] and receiver.images == {}
    # afterwards the session may come back
    receiver.on_datagram(16_100 * MS, beat(0), SENDER)
    assert [s.flags for s in sms(receiver.poll(16_100 * MS))] == [SM_FLAG_SETUP]
    receiver.on_datagram(16_101 * MS, setup(0), SENDER)
    assert [type(e) for e in receiver.poll(16_101 * MS).events] == [ImageAvailable]


def test_closing_an_image_tells_its_sender_it_left(host: ImageHost) -> None:
    """Its last status message carries the EOS flag (Aeron's draining image does the same):
    a sender this receiver was the only one of stops being connected at once."""
    receiver = joined(host)
    receiver.on_datagram(1 * MS, data(0, payload(0)), SENDER)
    receiver.poll(1 * MS)
    host.read()
    receiver.poll(2 * MS)
    sent_before = receiver.sms_sent
    receiver.close_image(SESSION, STREAM, 3 * MS)
    result = receiver.poll(3 * MS)
    (event,) = result.events
    assert isinstance(event, ImageUnavailable) and event.reason == "closed"
    ((goodbye, destination),) = [(f, d) for f, d in frames_out(result)
                                 if isinstance(f, StatusMessage)]
    assert destination == SENDER and goodbye.flags == SM_FLAG_EOS
    assert (goodbye.session_id, goodbye.stream_id, goodbye.receiver_id) == (
        SESSION, STREAM, RECEIVER_ID)
    assert receiver.sms_sent == sent_before + 1
    # its frames are dropped during the cool-down (no SETUP asked for); the goodbye is said
    # LEAVING_STATUS_MESSAGES times, one status-message timeout apart, in case one is lost
    receiver.on_datagram(4 * MS, beat(128), SENDER)
    assert sms(receiver.poll(100 * MS)) == []
    assert result.next_deadline_ns is None or result.next_deadline_ns <= 203 * MS
    assert [s.flags for s in sms(receiver.poll(203 * MS))] == [SM_FLAG_EOS]
    assert [s.flags for s in sms(receiver.poll(403 * MS))] == [SM_FLAG_EOS]
    assert sms(receiver.poll(1000 * MS)) == []
    assert receiver.poll(2000 * MS).next_deadline_ns is None
    assert receiver.sms_sent == sent_before + LEAVING_STATUS_MESSAGES == sent_before + 3


# --- hostile input -------------------------------------------------------------------------------


def test_hostile_datagrams_are_counted_and_dropped_and_the_image_stays_intact(
    host: ImageHost,
) -> None:
    receiver = joined(host)
    receiver.on_datagram(1 * MS, data(0, payload(0)), SENDER)
    good = data(128, payload(1), payload(2))
    image = receiver.images[(SESSION, STREAM)]

    def patched(datagram: bytes, offset: int, fmt: str, value: int) -> bytes:
        out = bytearray(datagram)
        struct.pack_into(fmt, out, offset, value)
        return bytes(out)

    hostile = [
        b"",
        b"\x00" * 7,
        b"garbage!" * 9,
        good[:40],  # first frame cut short
        good[:-8],  # second frame's length runs past the datagram
        patched(good, 0, "<i", 5000),  # frame length past the datagram end
        patched(good, 0, "<i", 12),  # frame length below a header
        patched(good, 4, "<B", 1),  # version 1
        patched(good, 8, "<i", TERM + 128),  # term offset outside the term
        patched(good, 8, "<i", -128),
        patched(good, 8, "<i", 130),  # unaligned
        patched(good, 128 + 8, "<i", 512),  # second frame not where its offset says
        patched(good, 128 + 12, "<i", SESSION + 9),  # second frame of another session
        patched(good, 128 + 20, "<i", INITIAL + 1),  # second frame of another term
        patched(good, 128 + 6, "<H", 3),  # second frame is an SM
        data(TERM - 128, payload(1), payload(2)),  # runs past the end of the term
        encode_datagram([pad_frame(frame_length=TERM, term_offset=128, session_id=SESSION,
                                   stream_id=STREAM, term_id=INITIAL)]),  # past the term
        beat(0)[:31] + b"\x00\x00",  # a heartbeat with a trailing byte
        data(3 * TERM, payload(5)),  # far outside the window
        patched(data(128, payload(9)), 20, "<i", term_id_at(1000 * TERM)),  # term far ahead
        patched(data(128, payload(9)), 20, "<i", INITIAL - 3),  # three terms behind
    ]
    for datagram in hostile:
        receiver.on_datagram(1 * MS, datagram, SENDER)
    assert receiver.invalid_datagrams == len(hostile) - 3
    assert image.overruns == 2 and image.duplicates == 1
    assert image.rcv_pos == image.rcv_hwm == 128
    # the log holds only what was valid; the subscriber reads it without a corrupt frame
    assert host.read() == [payload(0)]
    receiver.on_datagram(2 * MS, good, SENDER)
    assert host.read() == [payload(1), payload(2)]
    receiver.poll(2 * MS)
    assert receiver.images and naks(receiver.poll(3 * MS)) == []


def test_heartbeat_or_data_flags_for_eos_do_not_end_an_image_early(host: ImageHost) -> None:
    receiver = joined(host)
    receiver.on_datagram(1 * MS, data(0, payload(0), payload(1)), SENDER)
    eos_data = bytearray(data(256, payload(2)))
    eos_data[5] |= DATA_FLAG_EOS  # the EOS flag only means something on a heartbeat
    receiver.on_datagram(1 * MS, bytes(eos_data), SENDER)
    receiver.on_datagram(1 * MS, beat(128, eos=True), SENDER)  # behind what arrived: ignored
    assert not [e for e in receiver.poll(1 * MS).events if isinstance(e, EndOfStream)]
    assert receiver.images[(SESSION, STREAM)].end_of_stream_position is None


def test_an_image_the_sender_left_behind_past_its_window_is_lost(host: ImageHost) -> None:
    """A slow receiver under max flow control: the sender (now idle) is further ahead than
    the window and heartbeat slack reach, but less than a term. Nothing tells the image which
    data it misses, so it can never move again: after the lost timeout it is removed
    (``"lost"``) instead of waiting forever, and the session may then rejoin."""
    receiver = joined(host)
    receiver.on_datagram(1 * MS, data(0, payload(0)), SENDER)
    assert host.read() == [payload(0)]
    ahead = WINDOW + TERM // 4 + 1024  # past what even a heartbeat may announce
    assert ahead < TERM
    events = []
    for ms in range(2, 1_600, 100):
        receiver.on_datagram(ms * MS, beat(ahead), SENDER)
        result = receiver.poll(ms * MS)
        assert naks(result) == []  # no gap is known: nothing to NAK
        events += result.events
    (event,) = events
    assert isinstance(event, ImageUnavailable) and event.reason == "lost"
    assert receiver.images == {}


def test_sm_due_position_is_where_the_subscribers_progress_makes_a_status_message_due(
        host: ImageHost) -> None:
    receiver = joined(host)
    image = receiver.images[(SESSION, STREAM)]
    for i in range(16):  # 16 KiB in the log
        receiver.on_datagram(MS, data(i * 1024, *(payload(i) for _ in range(8))), SENDER)
    receiver.poll(MS)
    due = image.sm_due_position
    assert due == WINDOW // 4 + 1  # a quarter window past the last status message
    subscriber = host.image()
    subscriber.position = due - 1 & ~31  # just short of it: nothing
    assert sms(receiver.poll(2 * MS)) == []
    subscriber.position = due + 31 & ~31  # reached: a status message at once
    (sm,) = sms(receiver.poll(3 * MS))
    assert sm.consumption_term_offset == due + 31 & ~31
