"""The receiver side of a receive channel: a sans-IO state machine that rebuilds images
(docs/protocol.md: Stream set-up, Status messages, NAK recovery, RTT measurement).

:class:`NetworkReceiver` takes datagrams (DATA, PAD, heartbeats, SETUP, RTTM) with the time
and their source, and from :meth:`NetworkReceiver.poll` returns the datagrams to send (status
messages, NAKs, RTT measurement requests and replies), events (:class:`ImageAvailable`,
:class:`LossDetected`, :class:`EndOfStream`, :class:`ImageUnavailable`, all of
:mod:`netbridge.receiver_image`) and the time to poll again. Nothing here opens a socket,
reads a clock or starts a thread.

It keeps one :class:`~netbridge.receiver_image.ReceiverImage` per publishing session (session
id, stream id), which places the session's data, NAKs its gaps, sends its status messages and
measures its round-trip time (:mod:`netbridge.receiver_image`). The receiver itself:

* **Creation.** A SETUP for a subscribed stream calls the ``image_factory`` the process layer
  provides; it returns the image's log as an :class:`~netbridge.log_port.ImagePort` (same term
  length and initial term id as the SETUP, freshly zeroed), which also gives the subscribers'
  (minimum) position.
* **Removal.** An image that hears nothing for the image liveness timeout (10 s) is removed
  (:class:`ImageUnavailable`, reason ``"end_of_stream"`` or ``"timeout"``), as is one that
  fell out of its sender's reach (``"lost"``) and one the process layer closes (reason
  ``"closed"``, e.g. its stream's last subscription went: ``LEAVING_STATUS_MESSAGES`` status
  messages with the EOS flag tell the sender this receiver left); its session is then ignored
  for a cool-down.
* **Unknown sessions.** DATA for a subscribed stream but an unknown session is dropped and
  answered with a status message with the SETUP flag (at most every 200 ms per session).
* **Round-trip time.** The sender's echo of an image's RTTM request goes to that image (same
  session and stream, this receiver's id); echoes for another receiver id, an unknown session
  or with a timestamp in the future are counted as ignored frames. An RTTM *request* from the
  sender (flag 0x80) is echoed, as Aeron's receiver does.

Hostile input (malformed datagrams, unknown sessions, offsets outside the term, lengths past
the datagram, positions outside the window) is counted and dropped and never reaches the log.
The receiver never closes an image's log: the process layer does, after ImageUnavailable.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Final, NamedTuple

from netbridge.frames import (
    CURRENT_VERSION,
    DATA_HEADER_LENGTH,
    FRAME_ALIGNMENT,
    HDR_TYPE_DATA,
    HDR_TYPE_PAD,
    RTTM_FLAG_REPLY,
    SM_FLAG_SETUP,
    Frame,
    Nak,
    RttMeasurement,
    SetupFrame,
    StatusMessage,
    decode_datagram,
)
from netbridge.log_port import position_of, valid_geometry
from netbridge.loss_detector import NAK_RETRY_NS_DEFAULT
from netbridge.receiver_image import (
    ImageAvailable,
    ImageFactory,
    ImageRequest,
    ImageUnavailable,
    Outgoing,
    ReceiverEvent,
    ReceiverImage,
)
from shmbus.settings.channel_uri import CONGESTION_CONTROLS

__all__ = [
    "IMAGE_LIVENESS_TIMEOUT_NS_DEFAULT",
    "LEAVING_STATUS_MESSAGES",
    "RECEIVER_WINDOW_DEFAULT",
    "RTTM_INTERVAL_NS_DEFAULT",
    "SM_TIMEOUT_NS_DEFAULT",
    "NetworkReceiver",
    "ReceiverPoll",
]

#: 2 MiB, where Aeron's is 128 KiB: a status message takes tens of microseconds through each
#: Python bridge, not Aeron's few, and the window must cover the data sent meanwhile. At most
#: half a term, and at most what the socket's receive buffer holds.
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
_ELICIT_TABLE_LIMIT: Final = 1024


class ReceiverPoll(NamedTuple):
    """What :meth:`NetworkReceiver.poll` returns: datagrams to send as (bytes, destination),
    events, and when to poll again (None: nothing is scheduled; poll when a datagram comes)."""

    datagrams: list[Outgoing]
    events: list[ReceiverEvent]
    next_deadline_ns: int | None


class NetworkReceiver:
    """The sans-IO receiver of one receive channel endpoint (one socket's traffic).

    ``image_factory`` is called on a SETUP for a subscribed stream without an image and returns
    :class:`~netbridge.receiver_image.ImageResources` (or None to decline). ``receiver_id``
    goes into every status message, with ``group_tag`` when not None. ``receiver_window`` is
    the default window (``RECEIVER_WINDOW_DEFAULT``; each image uses at most half its term
    length);
    ``congestion_control`` names the strategy that sets each image's advertised window within
    it (``static`` or ``cubic``, as the channel's ``cc``). Timings default to Aeron's: status
    message timeout 200 ms, image liveness 10 s, NAK delay 0 and retry 10 ms (unicast); SETUP
    elicitation at most every 200 ms per session; a removed image's session is ignored for
    ``image_cooldown_ns`` (1 s). Each image measures its round-trip time every
    ``rttm_interval_ns`` (1 s; 0 disables; see :mod:`netbridge.receiver_image`).

    Streams are subscribed with :meth:`add_subscription`; traffic for other streams is
    ignored. Channel counters (plain ints): ``datagrams_received`` (``datagrams_in_order``
    of them placed by the native batch path), ``bytes_received``,
    ``invalid_datagrams``, ``unknown_session_datagrams``, ``ignored_frames``,
    ``heartbeats_received``, ``overruns``, ``naks_sent``, ``sms_sent``, ``setups_received``,
    ``setup_elicitations``, ``images_created``, ``rttm_replies`` (echoes of the sender's
    requests), ``rttm_requests`` (requests of our own sent), ``rtt_measurements`` (echoes of
    them taken); ``gaps_detected`` and ``bytes_lost`` (properties, over current and removed
    images). It is its images' :class:`~netbridge.receiver_image.ImageChannel`: they read its
    settings and add to its counters.
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
            image.send_status_message(now_ns, self._pending, leaving=True)
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
        frames = decode_datagram(view)
        if frames is None:
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
        for frame in decode_datagram(datagram) or ():
            if not isinstance(frame, Nak):
                continue
            image = self.images.get((frame.session_id, frame.stream_id))
            if image is not None:
                position = image.stream_position(frame.term_id, frame.term_offset)
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
        self._pending.append((rttm.echo().encode(), source))
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
            if image.is_lost(now_ns, self.lost_timeout_ns):
                self._remove(image, "lost", now_ns)
                continue
            due = min(image.poll(now_ns, out, self._events), image.last_heard_ns + liveness + 1)
            deadline = due if deadline is None else min(deadline, due)
        for key, (image, due, left) in list(self._leaving.items()):
            if key in self.images:  # the session came back (a new image): it is not leaving
                del self._leaving[key]
                continue
            if now_ns >= due:
                image.send_status_message(now_ns, out, leaving=True)
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
