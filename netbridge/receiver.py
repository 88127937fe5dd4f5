"""The receiver side of a receive channel: a sans-IO state machine that rebuilds images
(docs/protocol.md: Stream set-up, Status messages, NAK recovery, RTT measurement).

:class:`NetworkReceiver` takes datagrams (DATA, PAD, heartbeats, SETUP, RTTM) with the time
and their source, and from :meth:`NetworkReceiver.poll` returns the datagrams to send (status
messages, NAKs, RTT measurement requests and replies), events (:class:`ImageAvailable`,
:class:`LossDetected`, :class:`EndOfStream`, :class:`ImageUnavailable`) and the time to poll
again. Nothing here opens a socket, reads a clock or starts a thread.

One :class:`ReceiverImage` per publishing session (session id, stream id):

* **Creation.** A SETUP for a subscribed stream calls the ``image_factory`` the process layer
  provides; it returns the image's log as an :class:`~netbridge.log_port.ImagePort` (same term
  length and initial term id as the SETUP, freshly zeroed), which also gives the subscribers'
  (minimum) position.
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
  subscribers (``LEAVING_STATUS_MESSAGES``, a status-message timeout apart).
* **Window.** ``max_window`` is the channel's receiver window (``rcv-wnd``; by default
  ``RECEIVER_WINDOW_DEFAULT``, or what the socket's receive buffer holds if that is less: see
  ``netbridge.bridge``), at least the MTU and at most half a term: data past the last status message
  position plus it is dropped. The window each status message advertises (``window``) is the
  image's congestion control's (:mod:`netbridge.congestion_control`, chosen by the channel's
  ``cc``): the static window (``max_window``), or CUBIC's, which shrinks on each new gap and
  grows with time, driven by the round-trip times measured below. A changed window schedules
  a status message at once, at the current consumption position.
* **Cleaning.** The log is zeroed one term behind the subscribers' position, so a term is clean
  before it is written again.
* **End.** An end-of-stream heartbeat sets the end position; when the rebuild position reaches
  it, :class:`EndOfStream` is reported and the log's end-of-stream position is set. An image
  that hears nothing for the image liveness timeout (10 s) is removed
  (:class:`ImageUnavailable`, reason ``"end_of_stream"`` or ``"timeout"``), as is one the
  process layer closes (reason ``"closed"``, e.g. its stream's last subscription went: a
  status message with the EOS flag tells the sender this receiver left); its session is then
  ignored for a cool-down.
* **Unknown sessions.** DATA for a subscribed stream but an unknown session is dropped and
  answered with a status message with the SETUP flag (at most every 200 ms per session).
* **Round-trip time.** Every ``rttm_interval_ns`` (1 s; 0 disables) each image sends an RTTM
  request to its control address: flag 0x80 (``RTTM_FLAG_REPLY``: "echo this"), echo_timestamp
  = the receiver's clock in ns, reception_delta 0, its receiver id. The sender echoes it with
  flags 0 and the same echo_timestamp and receiver_id; the echo for an image (same session and
  stream) and this receiver's id gives ``rtt = now - echo_timestamp - reception_delta``, kept
  as the image's ``rtt_ns`` (the last measurement) and given to its congestion control.
  Echoes for another receiver id, an unknown session or with a timestamp in the future are
  counted as ignored frames. Aeron's driver measures only with ``cc=cubic`` and
  ``AERON_CUBICCONGESTIONCONTROL_MEASURERTT=true`` (its congestion control is the only
  consumer; docs/protocol.md, RTT measurement); shmbus measures always, at
  this low rate, so that ``shmbus stat`` can show the RTT of each receive channel. It costs one
  40-byte datagram each way per image per interval, and a sender that never answers (an Aeron
  driver answers every request, whatever its congestion control) only leaves ``rtt_ns`` None.
  An RTTM *request* from the sender (flag 0x80) is echoed, as Aeron's receiver does.

Hostile input (malformed datagrams, unknown sessions, offsets outside the term, lengths past
the datagram, positions outside the window) is counted and dropped and never reaches the log.
The receiver never closes an image's log: the process layer does, after ImageUnavailable.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, NamedTuple

from netbridge.congestion_control import CongestionControl, congestion_control_for
from netbridge.frames import (
    CURRENT_VERSION,
    DATA_FLAG_EOS,
    DATA_HEADER_LENGTH,
    FRAME_ALIGNMENT,
    HDR_TYPE_DATA,
    HDR_TYPE_PAD,
    RTTM_FLAG_REPLY,
    SM_FLAG_EOS,
    SM_FLAG_SETUP,
    Frame,
    MalformedFrame,
    Nak,
    RttMeasurement,
    SetupFrame,
    StatusMessage,
    decode_frames,
)
from netbridge.log_port import ImagePort, position_of, term_id_of, valid_geometry
from netbridge.loss_detector import NAK_RETRY_NS_DEFAULT, LossDetector
from netbridge.placement import Placement, placement
from shmbus.settings.channel_uri import CONGESTION_CONTROLS

__all__ = [
    "IMAGE_LIVENESS_TIMEOUT_NS_DEFAULT",
    "RECEIVER_WINDOW_DEFAULT",
    "RTTM_INTERVAL_NS_DEFAULT",
    "SM_TIMEOUT_NS_DEFAULT",
    "EndOfStream",
    "ImageAvailable",
    "ImageFactory",
    "ImageRequest",
    "ImageResources",
    "ImageUnavailable",
    "LossDetected",
    "NetworkReceiver",
    "ReceiverEvent",
    "ReceiverImage",
    "ReceiverPoll",
]

#: 2 MiB, where Aeron's is 128 KiB: a status message takes tens of microseconds through each
#: Python bridge, not Aeron's few, and the window must cover the data sent meanwhile
#: (tools/bench/netbridge.py on loopback, 4 KiB: 186 MB/s with 128 KiB, 345-386 with 256-512 KiB;
#: 32 B with 4 MiB terms: 4.4-4.6 M msg/s with 2 MiB, 3.5-3.9 M with 512 KiB). At most half a
#: term, and at most what the socket's receive buffer holds.
RECEIVER_WINDOW_DEFAULT: Final = 2 * 1024 * 1024
SM_TIMEOUT_NS_DEFAULT: Final = 200_000_000
IMAGE_LIVENESS_TIMEOUT_NS_DEFAULT: Final = 10_000_000_000
SETUP_ELICIT_INTERVAL_NS_DEFAULT: Final = 200_000_000
IMAGE_COOLDOWN_NS_DEFAULT: Final = 1_000_000_000
#: status messages with the EOS flag an image closed for want of subscribers sends its sender,
#: one every status-message timeout (Aeron's draining image sends them for a while): a lost
#: one must not leave the sender connected until its connection timeout
LEAVING_STATUS_MESSAGES: Final = 3
LOST_TIMEOUT_NS_DEFAULT: Final = 1_000_000_000
#: how often each image measures its round-trip time (shmbus's choice; Aeron: cubic only)
RTTM_INTERVAL_NS_DEFAULT: Final = 1_000_000_000

_HEADER = struct.Struct("<iBBHiiii")  # the first 24 bytes of a DATA/PAD header
_ALIGN_MASK: Final = ~(FRAME_ALIGNMENT - 1)
_ELICIT_TABLE_LIMIT: Final = 1024

Outgoing = tuple[bytes, object]


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


class ReceiverPoll(NamedTuple):
    """What :meth:`NetworkReceiver.poll` returns: datagrams to send as (bytes, destination),
    events, and when to poll again (None: nothing is scheduled; poll when a datagram comes)."""

    datagrams: list[Outgoing]
    events: list[ReceiverEvent]
    next_deadline_ns: int | None


# --- one image --------------------------------------------------------------------------------


class ReceiverImage:
    """One publishing session being rebuilt into an image log. Created by the receiver.

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
        receiver: NetworkReceiver,
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

    def _position(self, term_id: int, term_offset: int) -> int:
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
            self._on_heartbeat(now_ns, flags, self._position(term_id, term_offset), source)
            return

        position = self._position(term_id, term_offset)
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

    def on_in_order_data(self, now_ns: int, end_position: int, datagrams: int, size: int,
                         source: object) -> None:
        """``datagrams`` DATA datagrams (``size`` bytes, the latest from ``source``) that each
        were :func:`~netbridge.placement.in_order` and valid were placed in the log up to
        ``end_position`` by the native batch path (see :meth:`NetworkReceiver.in_order_images`):
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
            self._send_sm(now_ns, out)

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

    def _send_sm(self, now_ns: int, out: list[Outgoing], *, leaving: bool = False) -> None:
        """Schedule a status message at the last scheduled position: with the EOS flag once
        the image reached end of stream, or when ``leaving`` (its subscribers are gone)."""
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


# --- the receive channel -----------------------------------------------------------------------


class NetworkReceiver:
    """The sans-IO receiver of one receive channel endpoint (one socket's traffic).

    ``image_factory`` is called on a SETUP for a subscribed stream without an image and returns
    :class:`ImageResources` (or None to decline). ``receiver_id`` goes into every status
    message, with ``group_tag`` when not None. ``receiver_window`` is the default window
    (``RECEIVER_WINDOW_DEFAULT``; each image uses at most half its term length);
    ``congestion_control`` names the strategy that sets each image's advertised window within
    it (``static`` or ``cubic``, as the channel's ``cc``). Timings default to Aeron's: status
    message timeout 200 ms, image liveness 10 s, NAK delay 0 and retry 10 ms (unicast); SETUP
    elicitation at most every 200 ms per session; a removed image's session is ignored for
    ``image_cooldown_ns`` (1 s). Each image measures its round-trip time every
    ``rttm_interval_ns`` (1 s; 0 disables; see the module docstring).

    Streams are subscribed with :meth:`add_subscription`; traffic for other streams is
    ignored. Channel counters (plain ints): ``datagrams_received`` (``datagrams_in_order``
    of them placed by the native batch path), ``bytes_received``,
    ``invalid_datagrams``, ``unknown_session_datagrams``, ``ignored_frames``,
    ``heartbeats_received``, ``overruns``, ``naks_sent``, ``sms_sent``, ``setups_received``,
    ``setup_elicitations``, ``images_created``, ``rttm_replies`` (echoes of the sender's
    requests), ``rttm_requests`` (requests of our own sent), ``rtt_measurements`` (echoes of
    them taken); ``gaps_detected`` and ``bytes_lost`` (properties, over current and removed
    images).
    """

    def __init__(
        self,
        image_factory: ImageFactory,
        *,
        receiver_id: int,
        group_tag: int | None = None,
        receiver_window: int = RECEIVER_WINDOW_DEFAULT,
        sm_timeout_ns: int = SM_TIMEOUT_NS_DEFAULT,
        image_liveness_timeout_ns: int = IMAGE_LIVENESS_TIMEOUT_NS_DEFAULT,
        nak_delay_ns: int = 0,
        nak_retry_ns: int = NAK_RETRY_NS_DEFAULT,
        setup_elicit_interval_ns: int = SETUP_ELICIT_INTERVAL_NS_DEFAULT,
        image_cooldown_ns: int = IMAGE_COOLDOWN_NS_DEFAULT,
        rttm_interval_ns: int = RTTM_INTERVAL_NS_DEFAULT,
        control_address: object | None = None,
        nak_delay: Callable[[], int] | None = None,
        lost_timeout_ns: int = LOST_TIMEOUT_NS_DEFAULT,
        congestion_control: str = CONGESTION_CONTROLS[0],
    ) -> None:
        if receiver_window < FRAME_ALIGNMENT:
            raise ValueError(f"receiver_window {receiver_window} is below {FRAME_ALIGNMENT}")
        if congestion_control not in CONGESTION_CONTROLS:
            raise ValueError(f"congestion_control {congestion_control!r} is not one of "
                             f"{', '.join(CONGESTION_CONTROLS)}")
        if rttm_interval_ns < 0:
            raise ValueError(f"rttm_interval_ns {rttm_interval_ns} is negative (0 disables)")
        self.image_factory = image_factory
        self.receiver_id = receiver_id
        self.group_tag = group_tag
        self.receiver_window = receiver_window
        self.congestion_control = congestion_control
        self.sm_timeout_ns = sm_timeout_ns
        self.image_liveness_timeout_ns = image_liveness_timeout_ns
        self.nak_delay_ns = nak_delay_ns
        self.nak_retry_ns = nak_retry_ns
        self.setup_elicit_interval_ns = setup_elicit_interval_ns
        self.image_cooldown_ns = image_cooldown_ns
        self.rttm_interval_ns = rttm_interval_ns
        #: multicast: status messages and NAKs go to the control group, not to the source
        self.control_address = control_address
        #: multicast: a randomized delay per new gap (see loss_detector.multicast_nak_delay)
        self.nak_delay = nak_delay
        self.naks_suppressed = 0
        #: an image out of retransmission reach this long is lost
        self.lost_timeout_ns = lost_timeout_ns

        self.subscriptions: set[int] = set()
        self.images: dict[tuple[int, int], ReceiverImage] = {}
        self._cooldown: dict[tuple[int, int], int] = {}
        #: images closed for want of subscribers: (image, when its next EOS status message is
        #: due, how many are left to send)
        self._leaving: dict[tuple[int, int], tuple[ReceiverImage, int, int]] = {}
        self._elicited: dict[tuple[int, int], int] = {}
        self._pending: list[Outgoing] = []
        self._events: list[ReceiverEvent] = []
        self._retired_gaps = 0
        self._retired_bytes_lost = 0

        self.datagrams_received = 0
        #: of them, placed by the process layer's native batch path (on_in_order_data)
        self.datagrams_in_order = 0
        self.bytes_received = 0
        self.invalid_datagrams = 0
        self.unknown_session_datagrams = 0
        self.ignored_frames = 0
        self.heartbeats_received = 0
        self.overruns = 0
        self.naks_sent = 0
        self.sms_sent = 0
        self.setups_received = 0
        self.setup_elicitations = 0
        self.images_created = 0
        self.rttm_replies = 0
        self.rttm_requests = 0
        self.rtt_measurements = 0

    @property
    def gaps_detected(self) -> int:
        return self._retired_gaps + sum(i.gaps_detected for i in self.images.values())

    @property
    def bytes_lost(self) -> int:
        return self._retired_bytes_lost + sum(i.bytes_lost for i in self.images.values())

    # -- subscriptions and images ---------------------------------------------------------------

    def add_subscription(self, stream_id: int) -> None:
        """Accept SETUPs and data for ``stream_id``."""
        self.subscriptions.add(stream_id)

    def remove_subscription(self, stream_id: int, now_ns: int) -> None:
        """Stop taking ``stream_id``: its images are removed (reason ``"closed"``)."""
        self.subscriptions.discard(stream_id)
        for session_id, image_stream in list(self.images):
            if image_stream == stream_id:
                self.close_image(session_id, stream_id, now_ns)

    def close_image(self, session_id: int, stream_id: int, now_ns: int) -> None:
        """Remove an image now (ImageUnavailable, reason ``"closed"``, at the next poll),
        telling its sender with status messages with the EOS flag (the first at the next
        poll, then one every status-message timeout, ``LEAVING_STATUS_MESSAGES`` in all):
        this receiver has left, so a sender it was the last receiver of stops being connected
        at once rather than after its connection timeout (as Aeron's draining image does)."""
        image = self.images.get((session_id, stream_id))
        if image is not None:
            self._remove(image, "closed", now_ns)
            image._send_sm(now_ns, self._pending, leaving=True)
            self._leaving[(session_id, stream_id)] = (
                image, now_ns + self.sm_timeout_ns, LEAVING_STATUS_MESSAGES - 1)

    def _remove(self, image: ReceiverImage, reason: str, now_ns: int) -> None:
        key = (image.session_id, image.stream_id)
        del self.images[key]
        self._retired_gaps += image.gaps_detected
        self._retired_bytes_lost += image.bytes_lost
        self._cooldown[key] = now_ns + self.image_cooldown_ns
        self._events.append(ImageUnavailable(image, reason))

    # -- input ------------------------------------------------------------------------------------

    def on_datagram(
        self, now_ns: int, datagram: bytes | bytearray | memoryview, source: object = None
    ) -> None:
        """Handle one datagram from the data path, as it came off the socket (DATA and PAD
        frames are checked and copied without per-frame objects). Replies and events come out
        of :meth:`poll`. Raises TypeError for anything that is not a bytes-like object."""
        view = datagram if isinstance(datagram, memoryview) else memoryview(datagram)
        size = len(view)
        self.datagrams_received += 1
        self.bytes_received += size
        if size >= DATA_HEADER_LENGTH:
            (frame_length, version, flags, frame_type, term_offset, session_id, stream_id,
             term_id) = _HEADER.unpack_from(view, 0)
            if frame_type == HDR_TYPE_DATA or frame_type == HDR_TYPE_PAD:
                if version != CURRENT_VERSION:
                    self.invalid_datagrams += 1
                    return
                image = self.images.get((session_id, stream_id))
                if image is None:
                    self._on_unknown_session(now_ns, session_id, stream_id, source)
                    return
                image.on_data(now_ns, view, frame_length, frame_type, flags, term_offset,
                              term_id, source)
                return
        try:
            frames = list(decode_frames(view))
        except MalformedFrame:
            self.invalid_datagrams += 1
            return
        for frame in frames:
            self._on_control(now_ns, frame, source)

    def in_order_images(self) -> list[ReceiverImage]:
        """The images a datagram may be placed in without :meth:`on_datagram`: those whose end
        of stream is not announced. A valid DATA/PAD datagram of one of them that is
        :func:`~netbridge.placement.in_order` (it starts exactly at its ``rcv_hwm`` and ends at
        or below its ``window_limit``) does nothing but copy its frames and move rcv-hwm (and
        rcv-pos, when no gap is open) to its end; the process layer may do that natively for a
        batch and report each image's result with :meth:`ReceiverImage.on_in_order_data`, once
        every later datagram of an image whose datagram did not qualify goes to on_datagram, in
        order (an image's state depends only on its own datagrams)."""
        return [image for image in self.images.values() if image.end_of_stream_position is None]

    def _on_control(self, now_ns: int, frame: Frame, source: object) -> None:
        if isinstance(frame, SetupFrame):
            self._on_setup(now_ns, frame, source)
        elif isinstance(frame, RttMeasurement):
            self._on_rttm(now_ns, frame, source)
        else:
            self.ignored_frames += 1

    def on_nak_heard(self, now_ns: int, datagram: bytes | memoryview) -> None:
        """A datagram from the control group (multicast): another receiver's NAK for a gap
        this receiver also has suppresses its own NAK for a retry interval."""
        try:
            frames = list(decode_frames(datagram))
        except MalformedFrame:
            return
        for frame in frames:
            if not isinstance(frame, Nak):
                continue
            image = self.images.get((frame.session_id, frame.stream_id))
            if image is not None:
                position = image._position(frame.term_id, frame.term_offset)
                self.naks_suppressed += image.loss.on_nak_heard(now_ns, position, frame.length)

    def _on_unknown_session(
        self, now_ns: int, session_id: int, stream_id: int, source: object
    ) -> None:
        self.unknown_session_datagrams += 1
        key = (session_id, stream_id)
        if stream_id not in self.subscriptions or self._cooling_down(key, now_ns):
            return
        last = self._elicited.get(key)
        if last is not None and now_ns - last < self.setup_elicit_interval_ns:
            return
        if last is None and len(self._elicited) >= _ELICIT_TABLE_LIMIT:
            self._prune_elicited(now_ns)
            if len(self._elicited) >= _ELICIT_TABLE_LIMIT:
                return
        self._elicited[key] = now_ns
        sm = StatusMessage(
            flags=SM_FLAG_SETUP,
            session_id=session_id,
            stream_id=stream_id,
            consumption_term_id=0,
            consumption_term_offset=0,
            receiver_window=0,
            receiver_id=self.receiver_id,
            group_tag=self.group_tag,
        )
        # multicast: the sender listens on the control group, not on its source address
        self._pending.append((sm.encode(), self.control_address or source))
        self.setup_elicitations += 1
        self.sms_sent += 1

    def _cooling_down(self, key: tuple[int, int], now_ns: int) -> bool:
        until = self._cooldown.get(key)
        if until is None:
            return False
        if now_ns < until:
            return True
        del self._cooldown[key]
        return False

    def _on_setup(self, now_ns: int, setup: SetupFrame, source: object) -> None:
        self.setups_received += 1
        key = (setup.session_id, setup.stream_id)
        image = self.images.get(key)
        if image is not None:
            image.on_setup(now_ns, source)
            return
        if setup.stream_id not in self.subscriptions or self._cooling_down(key, now_ns):
            self.ignored_frames += 1
            return
        term_length = setup.term_length
        if not valid_geometry(term_length, setup.mtu):
            self.invalid_datagrams += 1
            return
        term_offset = setup.term_offset
        if term_offset < 0 or term_offset >= term_length or term_offset % FRAME_ALIGNMENT:
            self.invalid_datagrams += 1
            return
        join_position = position_of(setup.active_term_id, term_offset,
                                    term_length.bit_length() - 1, setup.initial_term_id)
        if join_position < 0:
            self.invalid_datagrams += 1
            return
        request = ImageRequest(
            session_id=setup.session_id,
            stream_id=setup.stream_id,
            initial_term_id=setup.initial_term_id,
            active_term_id=setup.active_term_id,
            term_offset=term_offset,
            term_length=term_length,
            mtu=setup.mtu,
            join_position=join_position,
            source=source,
        )
        resources = self.image_factory(request)
        if resources is None:
            return
        image = ReceiverImage(self, request, resources, now_ns)
        self.images[key] = image
        self._elicited.pop(key, None)
        self.images_created += 1
        self._events.append(ImageAvailable(image))

    def _on_rttm(self, now_ns: int, rttm: RttMeasurement, source: object) -> None:
        image = self.images.get((rttm.session_id, rttm.stream_id))
        if not rttm.flags & RTTM_FLAG_REPLY:
            # the sender's echo of an image's request: only ours (receiver id) count
            if (
                image is None
                or rttm.receiver_id != self.receiver_id
                or not image.on_rttm_echo(now_ns, rttm)
            ):
                self.ignored_frames += 1
                return
            self.rtt_measurements += 1
            return
        # a request from the sender (flag 0x80): echo it, as Aeron's receiver does
        if image is None or rttm.receiver_id not in (0, self.receiver_id):
            self.ignored_frames += 1
            return
        reply = RttMeasurement(
            flags=0,
            session_id=rttm.session_id,
            stream_id=rttm.stream_id,
            echo_timestamp=rttm.echo_timestamp,
            reception_delta=0,
            receiver_id=rttm.receiver_id,
        )
        self._pending.append((reply.encode(), source))
        self.rttm_replies += 1

    # -- output -----------------------------------------------------------------------------------

    def poll(self, now_ns: int) -> ReceiverPoll:
        """Run every image's timers: liveness, consumption and cleaning, end of stream, NAKs,
        status messages. Returns the datagrams to send, the events, and the next deadline."""
        out = self._pending
        self._pending = []
        deadline: int | None = None
        liveness = self.image_liveness_timeout_ns
        for image in list(self.images.values()):
            if now_ns - image.last_heard_ns > liveness:
                reason = "end_of_stream" if image.is_end_of_stream else "timeout"
                self._remove(image, reason, now_ns)
                continue
            if image.furthest_seen - image.rcv_pos > image.max_window + image._heartbeat_slack:
                # the sender is further ahead than this image can take even once its
                # subscribers read everything (a slow receiver under max flow control): its
                # data is dropped past the window and its heartbeats say nothing usable, so no
                # gap is known and none is NAKed; once that lasts (one stray datagram with a
                # far position must not end an image), the image can never move again
                if image.behind_since_ns is None or image.behind_at != image.rcv_pos:
                    image.behind_since_ns, image.behind_at = now_ns, image.rcv_pos
                elif now_ns - image.behind_since_ns > self.lost_timeout_ns:
                    self._remove(image, "lost", now_ns)
                    continue
            else:
                image.behind_since_ns = None
            due = min(image.poll(now_ns, out, self._events), image.last_heard_ns + liveness + 1)
            deadline = due if deadline is None else min(deadline, due)
        for key, (image, due, left) in list(self._leaving.items()):
            if key in self.images:  # the session came back (a new image): it is not leaving
                del self._leaving[key]
                continue
            if now_ns >= due:
                image._send_sm(now_ns, out, leaving=True)
                left -= 1
                due = now_ns + self.sm_timeout_ns
                if not left:
                    del self._leaving[key]
                    continue
                self._leaving[key] = (image, due, left)
            deadline = due if deadline is None else min(deadline, due)
        events = self._events
        self._events = []
        if len(self._elicited) > _ELICIT_TABLE_LIMIT // 2:
            self._prune_elicited(now_ns)
        if self._cooldown:
            for key in [k for k, until in self._cooldown.items() if now_ns >= until]:
                del self._cooldown[key]
        if deadline is not None:
            deadline = max(deadline, now_ns)
        return ReceiverPoll(out, events, deadline)

    def _prune_elicited(self, now_ns: int) -> None:
        interval = self.setup_elicit_interval_ns
        for key in [k for k, at in self._elicited.items() if now_ns - at >= interval]:
            del self._elicited[key]
