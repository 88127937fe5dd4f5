"""The sender side of one network publication: a sans-IO state machine
(docs/protocol.md: Stream set-up, Frames on the wire, Flow control, NAK recovery).

:class:`NetworkSender` reads committed frames straight from a publication's log and
decides, for a given time, which datagrams go out: SETUP every 100 ms until the first status
message; then DATA between the sender position and the sender limit set by the flow-control
strategy, several whole frames per datagram up to the MTU; heartbeats after 100 ms without
data; retransmits on NAK; RTT replies; end-of-stream heartbeats after :meth:`close`.

Nothing here opens a socket, reads a clock or starts a thread: the caller feeds received
datagrams to :meth:`NetworkSender.on_datagram` and calls :meth:`NetworkSender.poll` with the
current time, sends what it returns, and calls again by the deadline it returns.

The log is read through a :class:`~netbridge.log_port.PublicationPort` (in the bridge, the
publication's shared log: :mod:`netbridge.shared_log`): only committed frames are sent (a
publisher in another process may be writing the next one). DATA datagrams are views of the log
itself (a :class:`~netbridge.log_port.Datagrams` batch of them per poll, or a memoryview per
datagram; nothing copied): the caller must send them (or copy them) before the log is cleaned
past them. The owner of the log must therefore clean it no closer than one term length behind
the sender position, as Aeron does; retransmits read up to half a term plus the maximum message
length behind it.

Every DATA the sender sends is accounted by one method (:meth:`NetworkSender._on_scan`): the
scans of :meth:`NetworkSender.poll`, and the scans the process layer's native spin sends by
itself while :meth:`NetworkSender.spin_send` allows (reported with
:meth:`NetworkSender.on_data_sent`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from netbridge.flow_control import FlowControl, UnicastFlowControl
from netbridge.frames import (
    FRAME_ALIGNMENT,
    SM_FLAG_EOS,
    SM_FLAG_SETUP,
    ErrorFrame,
    Nak,
    RttMeasurement,
    SetupFrame,
    StatusMessage,
    decode_datagram,
    heartbeat,
)
from netbridge.log_port import Datagrams, PublicationPort, Scan, position_of, term_id_of

__all__ = [
    "CONNECTION_TIMEOUT_NS_DEFAULT",
    "HEARTBEAT_INTERVAL_NS_DEFAULT",
    "RETRANSMIT_LINGER_NS_DEFAULT",
    "SETUP_INTERVAL_NS_DEFAULT",
    "NetworkSender",
    "Outgoing",
]

SETUP_INTERVAL_NS_DEFAULT: Final = 100_000_000
HEARTBEAT_INTERVAL_NS_DEFAULT: Final = 100_000_000
CONNECTION_TIMEOUT_NS_DEFAULT: Final = 5_000_000_000
RETRANSMIT_LINGER_NS_DEFAULT: Final = 10_000_000
RETRANSMIT_DELAY_NS_DEFAULT: Final = 0
MAX_RETRANSMITS_DEFAULT: Final = 16
MAX_DATAGRAMS_PER_POLL_DEFAULT: Final = 64

#: One datagram to send (``bytes`` or a read-only memoryview of the log), or a batch of DATA
#: datagrams of the log, and where to. Destinations are opaque to the state machine (the
#: socket layer uses (host, port)).
Outgoing = tuple[bytes | memoryview | Datagrams, object]


@dataclass(slots=True)
class _Retransmit:
    """A NAKed range: sent at ``send_at_ns`` (None once sent), NAKs for the same start are
    ignored until ``expires_ns``."""

    term_id: int
    term_offset: int
    length: int
    send_at_ns: int | None
    expires_ns: int


class NetworkSender:
    """The sans-IO sender of one publication session over UDP (unicast; built for more).

    ``log`` is the publication's log (a :class:`~netbridge.log_port.PublicationPort`): session
    id, stream id, initial term id and term length come from it. ``destination`` is where
    DATA, SETUP and heartbeats go (the channel endpoint). ``position`` is the sender position
    to start from (where the publication started; a multiple of 32). ``mtu`` is the largest
    datagram (default: the log's MTU, which bounds its frames; it may not be smaller).
    ``flow_control`` defaults to :class:`~netbridge.flow_control.UnicastFlowControl`.

    Timings default to Aeron's: SETUP every 100 ms, heartbeat after 100 ms idle, connection
    lost after 5 s without a status message (or at once when the last receiver's status
    message carries the EOS flag: it left), retransmit delay 0 and linger 10 ms, at most 16
    retransmits in flight. ``max_datagrams_per_poll`` bounds the DATA datagrams one poll emits
    (the deadline is then "now" while more is ready). With ``data_batches`` the DATA of a poll
    comes out as one :class:`~netbridge.log_port.Datagrams` batch per destination instead of a
    memoryview per datagram.

    Counters are plain ints (the process layer mirrors them): ``sender_position`` (snd-pos),
    ``sender_limit`` (snd-lmt), ``back_pressure_events`` (snd-bpe), ``bytes_sent``,
    ``datagrams_sent``, ``setups_sent``, ``heartbeats_sent``, ``retransmits`` (NAKed ranges
    resent), ``retransmitted_bytes``, ``naks_received``, ``naks_ignored`` (lingering,
    out of range or over the in-flight cap), ``sms_received``, ``rttm_replies``,
    ``errors_received``, ``invalid_datagrams`` (malformed), ``ignored_frames`` (another
    session or stream, or a type a sender does not take).
    """

    def __init__(
        self,
        log: PublicationPort,
        *,
        destination: object,
        flow_control: FlowControl | None = None,
        position: int = 0,
        mtu: int | None = None,
        ttl: int = 0,
        setup_flags: int = 0,
        setup_interval_ns: int = SETUP_INTERVAL_NS_DEFAULT,
        heartbeat_interval_ns: int = HEARTBEAT_INTERVAL_NS_DEFAULT,
        connection_timeout_ns: int = CONNECTION_TIMEOUT_NS_DEFAULT,
        retransmit_delay_ns: int = RETRANSMIT_DELAY_NS_DEFAULT,
        retransmit_linger_ns: int = RETRANSMIT_LINGER_NS_DEFAULT,
        max_retransmits: int = MAX_RETRANSMITS_DEFAULT,
        max_datagrams_per_poll: int = MAX_DATAGRAMS_PER_POLL_DEFAULT,
        data_batches: bool = False,
    ) -> None:
        self.log = d = log
        self.session_id: int = d.session_id
        self.stream_id: int = d.stream_id
        self.initial_term_id: int = d.initial_term_id
        self.term_length: int = d.term_length
        self.mtu: int = d.mtu if mtu is None else mtu
        if self.mtu < d.mtu or self.mtu % FRAME_ALIGNMENT or self.mtu > 65504:
            raise ValueError(
                f"mtu {self.mtu} must be a multiple of 32, at most 65504 and at least the "
                f"log's mtu {d.mtu}"
            )
        if position < 0 or position % FRAME_ALIGNMENT:
            raise ValueError(f"position {position} must be a non-negative multiple of 32")
        if not 1 <= max_datagrams_per_poll <= 4096 or max_retransmits < 0:
            raise ValueError(f"max_datagrams_per_poll {max_datagrams_per_poll} must be 1..4096 "
                             f"and max_retransmits {max_retransmits} >= 0")
        #: where DATA goes; empty (``destination=None``) until a multi-destination-cast
        #: publication is given its first destination
        self.destinations: list[object] = [] if destination is None else [destination]
        self.flow_control = flow_control if flow_control is not None else UnicastFlowControl()
        self.flow_control.initialize(initial_term_id=d.initial_term_id, term_length=d.term_length)
        self.ttl = ttl
        self.setup_flags = setup_flags
        self.setup_interval_ns = setup_interval_ns
        self.heartbeat_interval_ns = heartbeat_interval_ns
        self.connection_timeout_ns = connection_timeout_ns
        self.retransmit_delay_ns = retransmit_delay_ns
        self.retransmit_linger_ns = retransmit_linger_ns
        self.max_retransmits = max_retransmits
        self.max_datagrams_per_poll = max_datagrams_per_poll
        self.data_batches = data_batches

        self._position_bits = d.term_length.bit_length() - 1
        self._term_mask = d.term_length - 1
        self._max_resend_distance = d.term_length // 2 + log.max_message_length

        # counters
        self.sender_position = position
        self.sender_limit = position
        self.back_pressure_events = 0
        self.bytes_sent = 0
        self.datagrams_sent = 0
        self.setups_sent = 0
        self.heartbeats_sent = 0
        self.retransmits = 0
        self.retransmitted_bytes = 0
        self.naks_received = 0
        self.naks_ignored = 0
        self.sms_received = 0
        self.rttm_replies = 0
        self.errors_received = 0
        self.invalid_datagrams = 0
        self.ignored_frames = 0

        # state
        self.has_initial_connection = False
        self._has_receivers = False
        self._should_send_setup = True
        self._setup_requested = False  # a receiver asked for a SETUP (SM with SETUP flag)
        self._next_setup_ns: int | None = None  # None: at the first poll
        self._last_sm_ns = 0
        self._last_send_ns: int | None = None
        self._retransmits: dict[tuple[int, int], _Retransmit] = {}
        self._pending: list[Outgoing] = []
        self.closed = False
        self.end_position: int | None = None
        self._eos_heartbeat_sent = False
        self.last_error: ErrorFrame | None = None

    # -- state the process layer reads ------------------------------------------------------

    @property
    def is_connected(self) -> bool:
        """A receiver sent a status message within the connection timeout (as of the last
        poll), not every receiver the strategy knows left since (an EOS status message), and
        the flow-control strategy has the receivers it requires."""
        return self._has_receivers and self.flow_control.has_required_receivers()

    @property
    def is_end_of_stream(self) -> bool:
        """Closed, and everything up to the end position has been sent."""
        return self.end_position is not None and self.sender_position >= self.end_position

    @property
    def is_setup_phase(self) -> bool:
        """SETUP frames are still being sent (no status message yet, or one asked for it)."""
        return self._should_send_setup

    # -- commands ----------------------------------------------------------------------------

    def add_destination(self, destination: object) -> None:
        """Send DATA, SETUP and heartbeats to ``destination`` too (multi-destination-cast);
        a SETUP goes out at the next poll so the new destination can build its image."""
        if destination not in self.destinations:
            self.destinations.append(destination)
            if not self.is_end_of_stream:
                self._should_send_setup = True
                self._next_setup_ns = None

    def remove_destination(self, destination: object) -> None:
        """Stop sending to ``destination``."""
        if destination in self.destinations:
            self.destinations.remove(destination)

    def close(self, end_position: int | None = None) -> None:
        """The publication is closed: once everything up to ``end_position`` (default: the
        log's producer position) is sent, heartbeats carry the end-of-stream flag (0xE0).
        The caller keeps polling for its linger time, then drops the sender. Idempotent."""
        if self.closed:
            return
        self.closed = True
        self.end_position = (
            self.log.producer_position() if end_position is None else end_position
        )

    # -- input -------------------------------------------------------------------------------

    def on_datagram(
        self, now_ns: int, datagram: bytes | bytearray | memoryview, source: object = None
    ) -> None:
        """Handle one datagram from the control path, as it came off the socket.

        SM: the first one without the SETUP flag ends the setup phase; each feeds the flow
        control; one with the SETUP flag asks for a SETUP at the next poll. NAK: the range is
        resent (after the retransmit delay) unless a NAK for the same start lingers. RTTM with
        the reply flag: an echo goes back to ``source``. Anything malformed, for another
        session or stream, or of another type is counted and ignored. Replies are returned
        by the next :meth:`poll`.
        """
        frames = decode_datagram(datagram)
        if frames is None:
            self.invalid_datagrams += 1
            return
        for frame in frames:
            if isinstance(frame, StatusMessage | Nak | RttMeasurement | ErrorFrame) and (
                frame.session_id != self.session_id or frame.stream_id != self.stream_id
            ):
                self.ignored_frames += 1
            elif isinstance(frame, StatusMessage):
                self._on_status_message(now_ns, frame, source)
            elif isinstance(frame, Nak):
                self._on_nak(now_ns, frame)
            elif isinstance(frame, RttMeasurement):
                self._on_rttm(frame, source)
            elif isinstance(frame, ErrorFrame):
                self.errors_received += 1
                self.last_error = frame
            else:
                self.ignored_frames += 1

    def _on_status_message(self, now_ns: int, sm: StatusMessage, source: object) -> None:
        self.sms_received += 1
        if sm.flags & SM_FLAG_SETUP:
            if not self.is_end_of_stream:
                # kept until sent: another receiver's status message must not cancel it
                self._setup_requested = True
            return
        if sm.flags & SM_FLAG_EOS:
            # the receiver left (its image ended, or its subscribers went): the strategy
            # forgets it, and when it was the last one the connection ends now, not after
            # the connection timeout (the publisher learns there is nobody to send to)
            self.sender_limit = self.flow_control.on_status_message(
                sm, self.sender_position, now_ns, sender_limit=self.sender_limit, source=source
            )
            if not self.flow_control.receivers:
                self._has_receivers = False
            return
        self._has_receivers = True
        self._last_sm_ns = now_ns
        self.has_initial_connection = True
        self._should_send_setup = False
        self.sender_limit = self.flow_control.on_status_message(
            sm, self.sender_position, now_ns, sender_limit=self.sender_limit, source=source
        )

    def _on_nak(self, now_ns: int, nak: Nak) -> None:
        self.naks_received += 1
        term_offset, length = nak.term_offset, nak.length
        if (
            length <= 0
            or term_offset < 0
            or term_offset >= self.term_length
            or term_offset % FRAME_ALIGNMENT
        ):
            self.naks_ignored += 1
            return
        position = position_of(nak.term_id, term_offset, self._position_bits,
                               self.initial_term_id)
        behind = self.sender_position - position
        if behind <= 0 or behind > self._max_resend_distance:
            self.naks_ignored += 1
            return
        key = (nak.term_id, term_offset)
        action = self._retransmits.get(key)
        if action is not None and now_ns < action.expires_ns:
            self.naks_ignored += 1
            return
        if action is None and len(self._retransmits) >= self.max_retransmits:
            self._expire_retransmits(now_ns)
            if len(self._retransmits) >= self.max_retransmits:
                self.naks_ignored += 1
                return
        length = min(length, behind, self.term_length - term_offset)
        if self.retransmit_delay_ns <= 0:
            self._resend(position, length, self._pending)
            self._retransmits[key] = _Retransmit(
                nak.term_id, term_offset, length, None, now_ns + self.retransmit_linger_ns
            )
        else:
            send_at = now_ns + self.retransmit_delay_ns
            self._retransmits[key] = _Retransmit(
                nak.term_id, term_offset, length, send_at, send_at + self.retransmit_linger_ns
            )

    def _on_rttm(self, rttm: RttMeasurement, source: object) -> None:
        if not rttm.wants_reply:
            return  # an echo of a measurement this sender never starts
        destination = source if source is not None else self.destinations[0]
        self._emit(self._pending, rttm.echo().encode(), destination)
        self.rttm_replies += 1

    # -- output ------------------------------------------------------------------------------

    def poll(self, now_ns: int) -> tuple[list[Outgoing], int]:
        """The datagrams to send now, and the time by which to poll again.

        In order: replies and retransmits queued by :meth:`on_datagram`, a SETUP when due,
        DATA up to the sender limit (at most ``max_datagrams_per_poll`` datagrams), and a
        heartbeat when nothing was sent for the heartbeat interval (at once, the first time,
        when the end of stream is reached). DATA datagrams are memoryviews of the log (or
        batches of them): send them before the log is cleaned past them.
        """
        out = self._pending
        self._pending = []
        if self._has_receivers and now_ns - self._last_sm_ns > self.connection_timeout_ns:
            self._has_receivers = False
        self.sender_limit = self.flow_control.on_idle(
            now_ns, self.sender_limit, self.sender_position
        )
        deadline = now_ns + self.heartbeat_interval_ns

        if self._setup_requested:
            self._setup_requested = False
            self._send_setup(out)
        elif self._should_send_setup:
            if self._next_setup_ns is None or now_ns >= self._next_setup_ns:
                self._send_setup(out)
                self._next_setup_ns = now_ns + self.setup_interval_ns
                if self._has_receivers:
                    self._should_send_setup = False
            if self._should_send_setup:
                deadline = min(deadline, self._next_setup_ns)

        if self._retransmits:
            deadline = min(deadline, self._run_retransmits(now_ns, out))

        if self.has_initial_connection:
            if self._send_data(now_ns, out):
                deadline = now_ns
            eos_due = self.is_end_of_stream and not self._eos_heartbeat_sent
            last_send = self._last_send_ns
            if (
                eos_due
                or last_send is None
                or now_ns - last_send >= self.heartbeat_interval_ns
            ):
                self._send_heartbeat(now_ns, out)
                last_send = now_ns
            deadline = min(deadline, last_send + self.heartbeat_interval_ns)
            if self._has_receivers:
                deadline = min(deadline, self._last_sm_ns + self.connection_timeout_ns + 1)
        return out, max(deadline, now_ns)

    def _emit(self, out: list[Outgoing], data: bytes | memoryview, destination: object) -> None:
        out.append((data, destination))
        self.datagrams_sent += 1
        self.bytes_sent += len(data)

    def _term_id(self, position: int) -> int:
        return term_id_of(position, self._position_bits, self.initial_term_id)

    def _send_setup(self, out: list[Outgoing]) -> None:
        position = self.sender_position
        setup = SetupFrame(
            flags=self.setup_flags,
            term_offset=position & self._term_mask,
            session_id=self.session_id,
            stream_id=self.stream_id,
            initial_term_id=self.initial_term_id,
            active_term_id=self._term_id(position),
            term_length=self.term_length,
            mtu=self.mtu,
            ttl=self.ttl,
        ).encode()
        for destination in self.destinations:
            self._emit(out, setup, destination)
        self.setups_sent += 1

    def _send_heartbeat(self, now_ns: int, out: list[Outgoing]) -> None:
        position = self.sender_position
        eos = self.is_end_of_stream
        frame = heartbeat(
            term_offset=position & self._term_mask,
            session_id=self.session_id,
            stream_id=self.stream_id,
            term_id=self._term_id(position),
            end_of_stream=eos,
        ).encode()
        for destination in self.destinations:
            self._emit(out, frame, destination)
        self.heartbeats_sent += 1
        self._last_send_ns = now_ns
        if eos:
            self._eos_heartbeat_sent = True

    def _send_data(self, now_ns: int, out: list[Outgoing]) -> bool:
        """Send DATA from the sender position up to the limit; True if the per-poll budget ran
        out with more to send."""
        scan = self.log.scan(self.sender_position, self.sender_limit, self.mtu,
                             self.max_datagrams_per_poll)
        self._on_scan(now_ns, scan)
        batch = scan.batch
        if batch is not None:
            if self.data_batches:
                out.extend((batch, destination) for destination in self.destinations)
            else:
                out.extend((data, destination) for data in batch.datagrams()
                           for destination in self.destinations)
        return scan.more

    def _on_scan(self, now_ns: int, scan: Scan) -> None:
        """Account for a scan's DATA, sent to every destination: the one place DATA moves the
        sender position and counts as sent."""
        if scan.back_pressured:
            self.back_pressure_events += 1
        self.sender_position = scan.position
        if scan.datagrams:
            self._last_send_ns = now_ns
            self.datagrams_sent += scan.datagrams * len(self.destinations)
            self.bytes_sent += scan.length * len(self.destinations)

    @property
    def waits_for_data(self) -> bool:
        """Connected, not at its end, and with room under its limit: what it sends next is
        whatever a publisher commits at ``sender_position`` (the process layer may sleep until
        that, or a datagram, or the deadline of :meth:`poll`). Not when the frame committed
        there already does not fit under the limit: then it waits for a status message."""
        if not (self.has_initial_connection and not self.is_end_of_stream
                and self.sender_position < self.sender_limit):
            return False
        if (self.sender_limit - self.sender_position >= self.mtu
                or not self.log.committed(self.sender_position)):
            return True  # a frame is never longer than the mtu
        scan = self.log.scan(self.sender_position, self.sender_limit, self.mtu, 1)
        return scan.datagrams > 0 or not scan.back_pressured

    def spin_send(self) -> tuple[int, int, int, int] | None:
        """(position, limit, mtu, max datagrams): the scan (as :meth:`PublicationPort.scan
        <netbridge.log_port.PublicationPort.scan>` takes it) that the process layer may make
        and send to every destination by itself, without a poll, once a publisher commits at
        ``sender_position`` (the DATA step of :meth:`poll`, which is all a poll would do then),
        and report with :meth:`on_data_sent`; None while a poll must decide (not connected, no
        room, a reply or SETUP queued, datagrams not sent as batches)."""
        if (not self.data_batches or not self.waits_for_data or self._pending
                or self._setup_requested or self._should_send_setup):
            return None
        return self.sender_position, self.sender_limit, self.mtu, self.max_datagrams_per_poll

    def on_data_sent(self, now_ns: int, scan: Scan) -> None:
        """The process layer made the scan :meth:`spin_send` allowed and sent its datagrams to
        every destination: account for them as :meth:`poll` does for its own."""
        self._on_scan(now_ns, scan)

    def data_ready(self) -> bool:
        """It waits for data and a publisher has committed a frame at ``sender_position``
        since: :meth:`poll` would send it now."""
        return self.waits_for_data and self.log.committed(self.sender_position)

    def _resend(self, position: int, length: int, out: list[Outgoing]) -> None:
        """Resend the whole frames that start in [position, position + length), if the frame
        at position is one this session wrote there (else the NAK is ignored)."""
        datagrams = self.log.frames(position, length, self.mtu)
        if datagrams is None:
            self.naks_ignored += 1
            return
        for data in datagrams:
            for destination in self.destinations:
                self._emit(out, data, destination)
            self.retransmitted_bytes += len(data)
        self.retransmits += 1

    def _run_retransmits(self, now_ns: int, out: list[Outgoing]) -> int:
        """Send delayed retransmits that are due, forget lingering ones that expired; return
        the next time one of them needs attention."""
        deadline = now_ns + self.heartbeat_interval_ns
        for key, action in list(self._retransmits.items()):
            if action.send_at_ns is not None:
                if now_ns >= action.send_at_ns:
                    position = position_of(action.term_id, action.term_offset,
                                           self._position_bits, self.initial_term_id)
                    if 0 < self.sender_position - position <= self._max_resend_distance:
                        self._resend(position, action.length, out)
                    action.send_at_ns = None
                else:
                    deadline = min(deadline, action.send_at_ns)
                    continue
            if now_ns >= action.expires_ns:
                del self._retransmits[key]
        return deadline

    def _expire_retransmits(self, now_ns: int) -> None:
        for key, action in list(self._retransmits.items()):
            if action.send_at_ns is None and now_ns >= action.expires_ns:
                del self._retransmits[key]
