"""One publishing session being rebuilt into an image log, by the receiver of its channel
(:mod:`netbridge.receiver`): a sans-IO state machine (docs/protocol.md: Status messages, NAK
recovery, RTT measurement).

A :class:`ReceiverImage` is made from what a SETUP announced (:class:`ImageRequest`) and the
log the process layer's image factory gives it (:class:`ImageResources`). It takes the
datagrams of its session and stream from its receiver, and at each poll adds the datagrams to
send (status messages, NAKs, RTT measurement requests) and its events (:class:`LossDetected`,
:class:`EndOfStream`) to its receiver's.

* **Placement.** A DATA datagram is validated whole (every frame's version, type, length,
  session, stream, term id and term offset must agree with its place in the datagram, and the
  frames must lie inside the term: :meth:`ImagePort.walk <netbridge.log_port.ImagePort.walk>`)
  and then placed by the rule of :mod:`netbridge.placement`: copied into the log at its term
  id and offset in one block, the first frame's length last with a release store, as Aeron's
  term rebuilder does: a reader (shmbus ``Image.poll``) that sees that length sees the whole
  block. Frames below the rebuild position are not rewritten (that part of the log may be
  cleaned already); data past the window (last status message position + receiver window) is
  dropped.
* **Positions.** rcv-hwm is the highest position seen in data or heartbeats; rcv-pos (the
  rebuild position) is the end of the contiguous data (see :mod:`netbridge.loss_detector`).
* **Loss.** Every gap is NAKed at once (unicast) and again every NAK retry time while it
  stays; each new gap is reported once as :class:`LossDetected`.
* **Status messages.** Sent when the image is created or a SETUP repeats, when the
  subscribers' position moves into a new term or more than a quarter of the window past the
  last scheduled one (or so far that less than an MTU of the advertised window is left, when
  the window is small: a full frame must always fit), and every status-message timeout
  (200 ms) otherwise, repeating the last scheduled position. They carry the EOS flag once the
  image reached end of stream, and on the last ones, sent as the image is closed for want of
  subscribers (``netbridge.receiver.LEAVING_STATUS_MESSAGES``, a status-message timeout apart).
* **Window.** ``max_window`` is the channel's receiver window (``rcv-wnd``; by default
  ``netbridge.receiver.RECEIVER_WINDOW_DEFAULT``, or what the socket's receive buffer holds if
  that is less: see ``netbridge.receive_channels``), at least the MTU and at most half a term:
  data past the last status message position plus it is dropped. The window each status
  message advertises (``window``) is the image's congestion control's
  (:mod:`netbridge.congestion_control`, chosen by the channel's ``cc``): the static window
  (``max_window``), or CUBIC's, which shrinks on each new gap and grows with time, driven by
  the round-trip times measured below. A changed window schedules a status message at once,
  at the current consumption position.
* **Cleaning.** The log is zeroed one term behind the subscribers' position, so a term is clean
  before it is written again.
* **End.** An end-of-stream heartbeat sets the end position; when the rebuild position reaches
  it, :class:`EndOfStream` is reported and the log's end-of-stream position is set.
* **Round-trip time.** Every ``rttm_interval_ns`` (1 s; 0 disables) the image sends an RTTM
  request to its control address: flag 0x80 (``RTTM_FLAG_REPLY``: "echo this"), echo_timestamp
  = the receiver's clock in ns, reception_delta 0, its receiver id. The sender echoes it with
  flags 0 and the same echo_timestamp and receiver_id; the echo (which the receiver routes here
  by session, stream and receiver id) gives ``rtt = now - echo_timestamp - reception_delta``,
  kept as the image's ``rtt_ns`` (the last measurement) and given to its congestion control.
  Aeron's driver measures only with ``cc=cubic`` and
  ``AERON_CUBICCONGESTIONCONTROL_MEASURERTT=true`` (its congestion control is the only
  consumer; docs/protocol.md, RTT measurement); shmbus measures always, at
  this low rate, so that ``shmbus stat`` can show the RTT of each receive channel. It costs one
  40-byte datagram each way per image per interval, and a sender that never answers (an Aeron
  driver answers every request, whatever its congestion control) only leaves ``rtt_ns`` None.

An image never closes its log: the process layer does, after the receiver reports it
unavailable.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Protocol

from netbridge.congestion_control import CongestionControl, congestion_control_for
from netbridge.frames import (
    DATA_FLAG_EOS,
    DATA_HEADER_LENGTH,
    FRAME_ALIGNMENT,
    HDR_TYPE_DATA,
    RTTM_FLAG_REPLY,
    SM_FLAG_EOS,
    Nak,
    RttMeasurement,
    StatusMessage,
)
from netbridge.log_port import ImagePort, position_of, term_id_of
from netbridge.loss_detector import LossDetector
from netbridge.placement import Placement, placement

__all__ = [
    "EndOfStream",
    "ImageAvailable",
    "ImageChannel",
    "ImageFactory",
    "ImageRequest",
    "ImageResources",
    "ImageUnavailable",
    "LossDetected",
    "Outgoing",
    "ReceiverEvent",
    "ReceiverImage",
]

_ALIGN_MASK: Final = ~(FRAME_ALIGNMENT - 1)

#: A datagram to send, and where to.
Outgoing = tuple[bytes, object]


# --- what the receiver provides ---------------------------------------------------------------


class ImageChannel(Protocol):
    """What an image reads of its channel's receiver (a
    :class:`~netbridge.receiver.NetworkReceiver`): its settings (first), and the channel
    counters the image adds to."""

    receiver_id: int
    group_tag: int | None
    receiver_window: int
    congestion_control: str
    control_address: object | None
    sm_timeout_ns: int
    nak_delay_ns: int
    nak_retry_ns: int
    nak_delay: Callable[[], int] | None
    rttm_interval_ns: int

    datagrams_received: int
    datagrams_in_order: int
    bytes_received: int
    invalid_datagrams: int
    heartbeats_received: int
    overruns: int
    naks_sent: int
    sms_sent: int
    rttm_requests: int


# --- what the process layer provides --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ImageRequest:
    """What a SETUP announced, for the image factory. ``join_position`` is where the image
    starts (the subscribers' initial position); ``source`` is the sender's address."""

    session_id: int
    stream_id: int
    initial_term_id: int
    active_term_id: int
    term_offset: int
    term_length: int
    mtu: int
    join_position: int
    source: object


@dataclass(slots=True)
class ImageResources:
    """What the image factory returns: a zeroed log created with the request's term length,
    initial term id, mtu, session and stream id; optionally a receiver window for this image
    (``rcv-wnd``)."""

    log: ImagePort
    receiver_window: int | None = None


ImageFactory = Callable[[ImageRequest], ImageResources | None]


# --- events ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ImageAvailable:
    """A SETUP created ``image``; its log is ready for subscribers from its join position."""

    image: ReceiverImage


@dataclass(frozen=True, slots=True)
class LossDetected:
    """A new gap in ``image``: ``length`` bytes at (term_id, term_offset), NAKed."""

    image: ReceiverImage
    term_id: int
    term_offset: int
    length: int


@dataclass(frozen=True, slots=True)
class EndOfStream:
    """``image`` holds everything up to the end of its stream, ``position``."""

    image: ReceiverImage
    position: int


@dataclass(frozen=True, slots=True)
class ImageUnavailable:
    """``image`` was removed (reason ``"timeout"``, ``"end_of_stream"``, ``"closed"``, or
    ``"lost"``: it fell further behind than the sender keeps data for retransmission);
    the process layer may close its log once subscribers are done with it."""

    image: ReceiverImage
    reason: str


ReceiverEvent = ImageAvailable | LossDetected | EndOfStream | ImageUnavailable


# --- one image --------------------------------------------------------------------------------


class ReceiverImage:
    """One publishing session being rebuilt into an image log. Created by the receiver of its
    channel, ``receiver``, whose counters it adds to.

    Read-only attributes for the process layer: ``session_id``, ``stream_id``,
    ``initial_term_id``, ``term_length``, ``mtu``, ``join_position``, ``log``, ``window`` (the
    window advertised now), ``max_window``, ``congestion_control``,
    ``control_address`` (where SMs and NAKs go), ``rcv_hwm`` and ``rcv_pos`` (properties),
    ``consumption_position`` (the subscribers' position as last polled), ``sm_position`` (the
    last scheduled status message position), ``end_of_stream_position`` (None until an EOS
    heartbeat), ``is_end_of_stream``, and counters: ``datagrams_received``, ``bytes_received``,
    ``heartbeats_received``, ``duplicates``, ``overruns`` (data past the window),
    ``invalid_datagrams``, ``naks_sent``, ``sms_sent``, ``gaps_detected``, ``bytes_lost``;
    round-trip time: ``rtt_ns`` (the last measurement in ns, None before the first),
    ``rttm_requests`` (RTTM requests sent) and ``rtt_measurements`` (echoes taken).
    """

    def __init__(
        self,
        receiver: ImageChannel,
        request: ImageRequest,
        resources: ImageResources,
        now_ns: int,
    ) -> None:
        log = resources.log
        if (log.term_length, log.initial_term_id) != (request.term_length,
                                                      request.initial_term_id):
            raise ValueError(
                f"image log has term length {log.term_length} and initial term id "
                f"{log.initial_term_id}; the SETUP says {request.term_length} and "
                f"{request.initial_term_id}"
            )
        self._receiver = receiver
        self.session_id = request.session_id
        self.stream_id = request.stream_id
        self.initial_term_id = request.initial_term_id
        self.term_length = request.term_length
        self.mtu = request.mtu
        self.join_position = request.join_position
        self.log = log
        window = resources.receiver_window or receiver.receiver_window
        # at least one MTU (else a full frame could never be sent), at most half a term
        self.max_window = min(max(window, self.mtu), self.term_length // 2)
        self.congestion_control: CongestionControl = congestion_control_for(
            receiver.congestion_control, mtu=self.mtu, max_window=self.max_window,
            now_ns=now_ns)
        self.window = self.congestion_control.window
        # multicast sends control to the channel's control group, unicast back to the source
        self._follow_source = receiver.control_address is None
        self.control_address = request.source if self._follow_source else receiver.control_address

        self._position_bits = self.term_length.bit_length() - 1
        self._term_mask = self.term_length - 1
        # A heartbeat may lie past the window by the padding the sender skipped after sending
        # a PAD header that fit it; a quarter term is more than any padding can be.
        self._heartbeat_slack = self.term_length // 4
        self.loss = LossDetector(
            request.join_position,
            self.term_length,
            nak_delay_ns=receiver.nak_delay_ns,
            nak_retry_ns=receiver.nak_retry_ns,
            nak_delay=receiver.nak_delay,
        )
        self.consumption_position = request.join_position
        self.sm_position = request.join_position
        #: the furthest position the sender was seen at (data past the window included), and
        #: since when (at which rcv-pos) it has been out of retransmission reach
        self.furthest_seen = request.join_position
        self.behind_since_ns: int | None = None
        self.behind_at = 0
        self._clean_position = request.join_position
        self._sm_due = True
        self._last_sm_ns: int | None = None
        self.last_heard_ns = now_ns
        self.end_of_stream_position: int | None = None
        self.is_end_of_stream = False

        self.datagrams_received = 0
        self.bytes_received = 0
        self.heartbeats_received = 0
        self.duplicates = 0
        self.overruns = 0
        self.invalid_datagrams = 0
        self.naks_sent = 0
        self.sms_sent = 0
        self.rtt_ns: int | None = None
        self.rttm_requests = 0
        self.rtt_measurements = 0
        interval = receiver.rttm_interval_ns
        # the first measurement one interval after the SETUP, then every interval
        self._next_rttm_ns: int | None = now_ns + interval if interval > 0 else None

    @property
    def rcv_hwm(self) -> int:
        """The highest position seen (rcv-hwm)."""
        return self.loss.hwm_position

    @property
    def rcv_pos(self) -> int:
        """The rebuild position: everything below it is in the log (rcv-pos)."""
        return self.loss.rebuild_position

    @property
    def gaps_detected(self) -> int:
        return self.loss.gaps_detected

    @property
    def bytes_lost(self) -> int:
        return self.loss.bytes_lost

    def stream_position(self, term_id: int, term_offset: int) -> int:
        """The stream position of (``term_id``, ``term_offset``) in this image."""
        return position_of(term_id, term_offset, self._position_bits, self.initial_term_id)

    def _term_id(self, position: int) -> int:
        return term_id_of(position, self._position_bits, self.initial_term_id)

    def _invalid(self) -> None:
        self.invalid_datagrams += 1
        self._receiver.invalid_datagrams += 1

    # -- data ------------------------------------------------------------------------------------

    def on_data(
        self,
        now_ns: int,
        view: memoryview,
        frame_length: int,
        frame_type: int,
        flags: int,
        term_offset: int,
        term_id: int,
        source: object,
    ) -> None:
        """Place one DATA/PAD datagram (or take a heartbeat) whose first header was unpacked
        by the receiver into the arguments."""
        size = len(view)
        term_length = self.term_length
        if term_offset < 0 or term_offset >= term_length or term_offset & (FRAME_ALIGNMENT - 1):
            self._invalid()
            return
        if frame_type == HDR_TYPE_DATA and frame_length == 0:
            if size != DATA_HEADER_LENGTH:
                self._invalid()
                return
            self._on_heartbeat(now_ns, flags, self.stream_position(term_id, term_offset), source)
            return

        position = self.stream_position(term_id, term_offset)
        rebuild = self.loss.rebuild_position
        walk = self.log.walk(view, term_offset, term_id, rebuild - position)
        if walk is None:
            self._invalid()
            return

        self.last_heard_ns = now_ns
        if source is not None and self._follow_source:
            self.control_address = source
        self.datagrams_received += 1
        self.bytes_received += size
        verdict = placement(position, walk, rebuild, self.window_limit,
                            self.end_of_stream_position)
        if verdict is Placement.OVERRUN:
            self.overruns += 1
            self._receiver.overruns += 1
            self.furthest_seen = max(self.furthest_seen, position + walk.span)
        elif verdict is Placement.PAST_END:
            self._invalid()
        elif verdict is Placement.DUPLICATE or not self.loss.on_data(
                now_ns, position + walk.skip, position + walk.span):
            self.duplicates += 1
        elif walk.skip < walk.end:
            self.log.insert(position + walk.skip, view[walk.skip:walk.end])

    @property
    def sm_due_position(self) -> int:
        """The subscribers' position at which :meth:`poll` sends the next status message for
        their progress: a quarter window past the last one, the next term, or less than an MTU
        short of the window's end (the process layer may sleep until they get there)."""
        sm_position, window = self.sm_position, self.window
        next_term = ((sm_position >> self._position_bits) + 1) << self._position_bits
        return max(sm_position + 1, min(sm_position + window // 4 + 1, next_term,
                                        sm_position + window - self.mtu + 1))

    @property
    def window_limit(self) -> int:
        """Data may not end past this position (the last status message position plus the
        receiver window); what does is dropped as an overrun."""
        return self.sm_position + self.max_window

    def is_lost(self, now_ns: int, lost_timeout_ns: int) -> bool:
        """Whether the sender has been further ahead than this image can take even once its
        subscribers read everything (a slow receiver under max flow control) for more than
        ``lost_timeout_ns``, rcv-pos not moving meanwhile: its data is dropped past the window
        and its heartbeats say nothing usable, so no gap is known and none is NAKed, and the
        image can never move again. The receiver asks at each poll; the time counts from the
        first poll that finds it so (one stray datagram with a far position must not end an
        image)."""
        if self.furthest_seen - self.rcv_pos <= self.max_window + self._heartbeat_slack:
            self.behind_since_ns = None
            return False
        if self.behind_since_ns is None or self.behind_at != self.rcv_pos:
            self.behind_since_ns, self.behind_at = now_ns, self.rcv_pos
            return False
        return now_ns - self.behind_since_ns > lost_timeout_ns

    def on_in_order_data(self, now_ns: int, end_position: int, datagrams: int, size: int,
                         source: object) -> None:
        """``datagrams`` DATA datagrams (``size`` bytes, the latest from ``source``) that each
        were :func:`~netbridge.placement.in_order` and valid were placed in the log up to
        ``end_position`` by the native batch path (see :meth:`NetworkReceiver.in_order_images
        <netbridge.receiver.NetworkReceiver.in_order_images>`):
        count them and move the positions exactly as :meth:`on_data` would have, one by
        one."""
        self.last_heard_ns = now_ns
        if source is not None and self._follow_source:
            self.control_address = source
        self.datagrams_received += datagrams
        self.bytes_received += size
        self.loss.on_data(now_ns, self.loss.hwm_position, end_position)
        receiver = self._receiver
        receiver.datagrams_received += datagrams
        receiver.datagrams_in_order += datagrams
        receiver.bytes_received += size

    def _on_heartbeat(self, now_ns: int, flags: int, position: int, source: object) -> None:
        self.heartbeats_received += 1
        self._receiver.heartbeats_received += 1
        self.last_heard_ns = now_ns
        if source is not None and self._follow_source:
            self.control_address = source
        self.furthest_seen = max(self.furthest_seen, position)
        if (
            position > self.sm_position + self.max_window + self._heartbeat_slack
            or position < self.loss.rebuild_position
        ):
            return  # outside the window: alive, but the position says nothing usable
        self.loss.on_heartbeat(now_ns, position)
        if (
            flags & DATA_FLAG_EOS
            and self.end_of_stream_position is None
            and position >= self.loss.hwm_position
        ):
            self.end_of_stream_position = position

    def on_rttm_echo(self, now_ns: int, rttm: RttMeasurement) -> bool:
        """The sender's echo of one of this image's RTTM requests: take the round-trip time.
        Returns False (nothing taken) when the echo claims a time after ``now_ns``."""
        rtt = now_ns - rttm.echo_timestamp - rttm.reception_delta
        if rtt < 0:
            return False
        self.rtt_ns = rtt
        self.rtt_measurements += 1
        self.congestion_control.on_rtt(now_ns, rtt)
        return True

    def on_setup(self, now_ns: int, source: object) -> None:
        """A SETUP for this existing image: answer with a status message at once."""
        self.last_heard_ns = now_ns
        if source is not None and self._follow_source:
            self.control_address = source
        self._sm_due = True

    # -- timers ---------------------------------------------------------------------------------

    def poll(self, now_ns: int, out: list[Outgoing], events: list[ReceiverEvent]) -> int:
        """Track consumption, clean, detect end of stream, send due NAKs and status messages;
        return the next time this image needs a poll."""
        receiver = self._receiver
        rebuild = self.loss.rebuild_position
        subscriber = self.log.subscriber_position()
        if subscriber > self.consumption_position:
            self.consumption_position = min(subscriber, rebuild) & _ALIGN_MASK
            clean_to = self.consumption_position - self.term_length
            if clean_to > self._clean_position:
                self.log.clean(self._clean_position, clean_to)
                self._clean_position = clean_to

        if (
            self.end_of_stream_position is not None
            and not self.is_end_of_stream
            and rebuild >= self.end_of_stream_position
        ):
            self.is_end_of_stream = True
            self.log.end_of_stream(self.end_of_stream_position)
            self._sm_due = True
            events.append(EndOfStream(self, self.end_of_stream_position))

        for request in self.loss.poll(now_ns):
            term_id = self._term_id(request.position)
            term_offset = request.position & self._term_mask
            nak = Nak(
                session_id=self.session_id,
                stream_id=self.stream_id,
                term_id=term_id,
                term_offset=term_offset,
                length=request.length,
            )
            out.append((nak.encode(), self.control_address))
            self.naks_sent += 1
            receiver.naks_sent += 1
            if request.first:
                events.append(LossDetected(self, term_id, term_offset, request.length))
                self.congestion_control.on_loss(now_ns)

        consumption = self.consumption_position
        sm_position = self.sm_position
        window = self.congestion_control.on_tick(now_ns)
        if window != self.window:
            self.window = window
            self.sm_position = consumption
            self._sm_due = True
        elif consumption > sm_position and (
            consumption - sm_position > self.window // 4
            or consumption >> self._position_bits > sm_position >> self._position_bits
            # less than a frame of room left: the sender may be waiting for this SM
            or consumption + self.mtu > sm_position + self.window
        ):
            self.sm_position = consumption
            self._sm_due = True
        timeout = receiver.sm_timeout_ns
        if self._sm_due or self._last_sm_ns is None or now_ns - self._last_sm_ns >= timeout:
            self.send_status_message(now_ns, out)

        next_rttm = self._next_rttm_ns
        if next_rttm is not None and not self.is_end_of_stream:
            if now_ns >= next_rttm:
                self._send_rttm(now_ns, out)
                next_rttm = self._next_rttm_ns = now_ns + receiver.rttm_interval_ns
        else:
            next_rttm = None

        deadline = self._last_sm_ns + timeout  # type: ignore[operator]
        nak_deadline = self.loss.next_deadline()
        if nak_deadline is not None:
            deadline = min(deadline, nak_deadline)
        if next_rttm is not None:
            deadline = min(deadline, next_rttm)
        cc_deadline = self.congestion_control.next_deadline()
        if cc_deadline is not None:
            deadline = min(deadline, cc_deadline)
        return deadline

    def _send_rttm(self, now_ns: int, out: list[Outgoing]) -> None:
        receiver = self._receiver
        request = RttMeasurement(
            flags=RTTM_FLAG_REPLY,  # "echo this" (Wireshark's "Reply" label notwithstanding)
            session_id=self.session_id,
            stream_id=self.stream_id,
            echo_timestamp=now_ns,
            reception_delta=0,
            receiver_id=receiver.receiver_id,
        )
        out.append((request.encode(), self.control_address))
        self.rttm_requests += 1
        receiver.rttm_requests += 1

    def send_status_message(self, now_ns: int, out: list[Outgoing], *, leaving: bool = False
                            ) -> None:
        """Add to ``out`` a status message at the last scheduled position: with the EOS flag
        once the image reached end of stream, or when ``leaving`` (its subscribers are gone)."""
        receiver = self._receiver
        position = self.sm_position
        sm = StatusMessage(
            flags=SM_FLAG_EOS if self.is_end_of_stream or leaving else 0,
            session_id=self.session_id,
            stream_id=self.stream_id,
            consumption_term_id=self._term_id(position),
            consumption_term_offset=position & self._term_mask,
            receiver_window=self.window,
            receiver_id=receiver.receiver_id,
            group_tag=receiver.group_tag,
        )
        out.append((sm.encode(), self.control_address))
        self._sm_due = False
        self._last_sm_ns = now_ns
        self.sms_sent += 1
        receiver.sms_sent += 1

    def __repr__(self) -> str:
        return (
            f"ReceiverImage(session_id={self.session_id}, stream_id={self.stream_id}, "
            f"rcv_pos={self.rcv_pos}, rcv_hwm={self.rcv_hwm})"
        )
