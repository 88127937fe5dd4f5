"""Late joiners: a subscription that hands out a stream's recorded history from a position, then
its live messages, per publishing session, with no gap and no duplicate.

``bus.add_subscription(channel, stream_id, history=Recording(dir), from_position=p)`` makes a
:class:`LateJoinSubscription`. It reads each session's recording (the directory a
:class:`~shmbus.Recorder` writes) from ``p`` (or from the start: ``from_position="start"``;
or the last ``n`` messages: ``last=n``), and, once the replay has caught up with the
recording's end, adds a live subscription. On ``aeron:ipc`` that one joins at the earliest
position each log still holds (``join-position=earliest``), which is mostly behind the
replay: the live image is moved up to where the replay got and read from there. A live image
that joined ahead of the replay (a udp image, which joins at its live end; or a replay that
fell behind again) waits, holding its publisher back, while the recording is read up to its
join position. The rule is ``shmbus.history.history_merge``.

While the replay is behind, :attr:`LateJoinSubscription.behind` says by how many bytes; a
live stream faster than the replay only delays the live subscription (the recording keeps
everything), it never loses a message. When a session's history is lost (the recording
stopped, later ones start further on, and the log no longer holds the range) a read raises
:class:`~shmbus.history.history_merge.HistoryGapError` naming the positions.

Runs in the application's process; reads the recording's files and the live logs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from shmbus.archive.catalog import RecordingDescriptor, live_position, read_catalog
from shmbus.archive.large_payloads import RECORDED_REFERENCE_LENGTH
from shmbus.archive.recording_reader import RecordingReader
from shmbus.history.history_merge import HistoryGapError, Phase, SessionMerge
from shmbus.settings.channel_uri import JOIN_POSITION, ChannelUri, ChannelUriError
from shmbus.shm._native import Header
from shmbus.shm.log_buffer import FRAME_ALIGNMENT, HEADER_LENGTH, align
from shmbus.streams.context_managers import Closeable
from shmbus.streams.fragment_assembler import FragmentAssembler
from shmbus.streams.image import Image

if TYPE_CHECKING:
    from shmbus.streams.subscription import Subscription

#: how long an image of a session with no recording yet waits for the recorder to add one
_RECORDING_WAIT_S = 2.0
#: the least merge window (bytes); by default it is the larger of this and the term length
_MERGE_WINDOW_MIN = 1 << 20
#: how long a live image may wait for a recording that does not grow (a dead recorder)
_RECORDING_STALL_S = 5.0
#: the longest sleep of a waiting read
_WAIT_SLICE_S = 0.001


@dataclass(frozen=True)
class Recording:
    """Where a late joiner's history comes from: a recording directory (``Recorder``'s)."""

    directory: str | Path


class MessageInfo(NamedTuple):
    """What a :meth:`LateJoinSubscription.poll` handler learns besides the payload."""

    session_id: int
    #: the stream position just after the message
    end_position: int
    reserved_value: int
    #: True for a message from the recording, False for one from the live image
    replayed: bool


MessageHandler = Callable[[memoryview, MessageInfo], Any]


class _Session:
    """A session's merge state with its recordings and live image."""

    def __init__(self, merge: SessionMerge) -> None:
        self.merge = merge
        self.recordings: list[RecordingDescriptor] = []
        self.readers: dict[int, RecordingReader] = {}
        self.image: Image | None = None
        #: the recording's readable end last seen while a live image waits, and since when
        self.last_recorded = -1
        self.recorded_since = 0.0

    def reader(self, descriptor: RecordingDescriptor, root: Path) -> RecordingReader:
        reader = self.readers.get(descriptor.recording_id)
        if reader is None:
            reader = self.readers[descriptor.recording_id] = RecordingReader(root, descriptor)
        return reader


class LateJoinSubscription(Closeable):
    """History from a recording, then live, per session (see the module docstring).

    Read it with :meth:`poll` (``handler(payload, MessageInfo)`` per whole message) or
    :meth:`messages` (bytes). Not thread-safe: one reader thread.
    """

    def __init__(self, subscribe: Callable[[str, int], Subscription], channel: str,
                 stream_id: int, history: Recording, *,
                 from_position: int | str | None = None, last: int | None = None,
                 merge_window: int | None = None, catch_up: float | None = None) -> None:
        if from_position is not None and last is not None:
            raise ValueError("give from_position or last, not both")
        # (an int, not a bool: any other value is refused, never read as the start)
        if from_position is not None and from_position != "start" and (
                not isinstance(from_position, int) or isinstance(from_position, bool)):
            raise ValueError(f"from_position={from_position!r} must be a stream position "
                             f"(int >= 0) or 'start'")
        if isinstance(from_position, int) and not 0 <= from_position < 2**63 or (
                isinstance(from_position, int) and from_position % 32):
            raise ValueError(f"from_position={from_position} must be a stream position: an "
                             f"int >= 0 (below 2**63), a multiple of 32 (a message's start)")
        if last is not None and (not isinstance(last, int) or isinstance(last, bool)
                                 or last < 0):
            raise ValueError(f"last={last!r} must be an int >= 0")
        self._uri = ChannelUri.parse(channel)
        if JOIN_POSITION in self._uri.params:
            raise ChannelUriError(f"channel {channel!r}: a late joiner sets {JOIN_POSITION} "
                                  f"itself")
        #: adds the live subscription: the creating client's ``add_subscription``
        self._subscribe = subscribe
        self.channel = channel
        self.stream_id = stream_id
        self.directory = Path(history.directory)
        self._from = from_position
        self._last = last
        self._session_filter = (self._uri.int_param("session-id")
                                if "session-id" in self._uri.params else None)
        self._sessions: dict[int, _Session] = {}
        self._assembler = FragmentAssembler(self._on_live_fragment)
        self._live: Subscription | None = None
        self._delivering: _Session | None = None
        self._handler: MessageHandler | None = None
        #: messages() collects bytes here instead of calling a handler
        self._sink: list[bytes] | None = None
        #: messages handed out from the recordings, and from the live images
        self.replayed_messages = 0
        self.live_messages = 0
        self._closed = False
        #: sessions seen live before their recording, since when (monotonic s)
        self._waiting: dict[int, float] = {}
        #: when the replay first caught up with the recordings and the live subscription began
        self.live_since: float | None = None
        for descriptor in self._recordings():
            self._track(descriptor, at_start=True)
        window = merge_window
        if window is None:
            terms = [d.term_length for d in self._all_recordings()]
            window = max([_MERGE_WINDOW_MIN, *terms])
        #: the live subscription joins once the replay is this few bytes behind the recording
        self.merge_window = window
        #: seconds the replay may try to come within merge_window; then the live
        #: subscription joins anyway and holds its publishers until the replay reaches it
        self.catch_up = catch_up
        self._started = time.monotonic()
        if not self._sessions:
            self._go_live()

    # -- recordings ------------------------------------------------------------------------------

    def _recordings(self) -> list[RecordingDescriptor]:
        """The catalog's recordings of this channel, stream (and session)."""
        key = self._uri.endpoint_key()
        found = []
        for d in read_catalog(self.directory):
            if d.stream_id != self.stream_id:
                continue
            if self._session_filter is not None and d.session_id != self._session_filter:
                continue
            try:
                if ChannelUri.parse(d.channel).endpoint_key() != key:
                    continue
            except ValueError:
                continue
            found.append(d)
        return found

    def _all_recordings(self) -> list[RecordingDescriptor]:
        return [d for s in self._sessions.values() for d in s.recordings]

    def _track(self, descriptor: RecordingDescriptor, *, at_start: bool) -> _Session:
        """Add a recording to its session (made on first sight: from the requested position
        for sessions there at the start, from its beginning for later ones)."""
        session = self._sessions.get(descriptor.session_id)
        if session is None:
            start = descriptor.start_position
            if at_start:
                start = self._first_position(descriptor)
            session = self._sessions[descriptor.session_id] = _Session(
                SessionMerge(descriptor.session_id, start))
        if all(d.recording_id != descriptor.recording_id for d in session.recordings):
            session.recordings.append(descriptor)
            session.recordings.sort(key=lambda d: (d.start_position, d.recording_id))
        return session

    def _first_position(self, d: RecordingDescriptor) -> int:
        if self._last is not None:
            return _last_messages_start(RecordingReader(self.directory, d), self._last)
        if isinstance(self._from, int):
            return _check_message_start(RecordingReader(self.directory, d), self._from)
        return d.start_position

    def _refresh(self, session: _Session) -> list[tuple[int, int, bool]]:
        """(start, readable end, active) of the session's recordings. An active one the
        replay has caught up with is looked up in the catalog again: it may have stopped."""
        spans = []
        catalog: list[RecordingDescriptor] | None = None
        for i, d in enumerate(session.recordings):
            end = live_position(self.directory, d)
            if d.is_active and end <= session.merge.position:
                if catalog is None:
                    catalog = read_catalog(self.directory)
                fresh = next((r for r in catalog if r.recording_id == d.recording_id), d)
                if not fresh.is_active:
                    session.recordings[i] = d = fresh
                    session.readers.pop(d.recording_id, None)
                    end = live_position(self.directory, d)
            spans.append((d.start_position, end, d.is_active))
        return spans

    def _rescan(self) -> None:
        """Pick up recordings that appeared since (new sessions, a restarted recorder)."""
        for descriptor in self._recordings():
            self._track(descriptor, at_start=False)

    # -- the state -------------------------------------------------------------------------------

    @property
    def is_live(self) -> bool:
        """True once the live subscription is there and no session is being replayed."""
        return self._live is not None and all(
            s.merge.phase is not Phase.REPLAY for s in self._sessions.values())

    @property
    def live_subscription(self) -> Subscription | None:
        """The live subscription (its images, their join positions), None until it joined."""
        return self._live

    @property
    def behind(self) -> int:
        """Bytes of recorded history not yet handed out, over all sessions being replayed."""
        total = 0
        for session in self._sessions.values():
            if session.merge.phase is Phase.REPLAY and session.recordings:
                d = session.recordings[-1]
                total += max(0, live_position(self.directory, d) - session.merge.position)
        return total

    def positions(self) -> dict[int, tuple[str, int]]:
        """Session id -> (phase: 'replay', 'live' or 'done'; end of the last message handed
        out)."""
        return {sid: (s.merge.phase.value, s.merge.position)
                for sid, s in self._sessions.items()}

    # -- reading ---------------------------------------------------------------------------------

    def poll(self, handler: MessageHandler, limit: int = 4096) -> int:
        """Hand up to ``limit`` whole messages to ``handler(payload, info)``: history first,
        then live, per session. The payload is valid only during the call. Returns how many.

        Raises HistoryGapError when a session's history is lost, and what the live
        subscription's poll raises: ClientTimeoutError when the driver timed the client out,
        also from the poll whose handler was running meanwhile (a process stopped past its
        liveness), since the live messages it was handed may have been reused under it.
        """
        if self._closed:
            return 0
        self._handler = handler
        count = 0
        live = self._live
        live_before = self.live_messages
        try:
            if live is not None:
                live._check_client()  # the images are read directly: the lease, as poll does
                self._check_images()
            for session in list(self._sessions.values()):
                if count >= limit:
                    break
                count += self._poll_session(session, limit - count)
            if live is not None and self.live_messages != live_before:
                live._check_client()  # stopped in the handler past the liveness: torn
            if self._live is None and (
                    self.behind <= self.merge_window or (
                        self.catch_up is not None
                        and time.monotonic() - self._started >= self.catch_up)):
                self._go_live()
        finally:
            self._handler = None
        return count

    def _poll_session(self, session: _Session, limit: int) -> int:
        merge = session.merge
        if merge.phase is Phase.LIVE:
            image = session.image
            if image is None:
                return 0
            self._delivering = session
            before = self.live_messages
            try:
                image.poll(self._assembler, limit)
            finally:
                self._delivering = None
            return self.live_messages - before
        if merge.phase is Phase.DONE:
            return 0
        spans = self._refresh(session)
        index = merge.source(spans)
        if index is None:
            return 0
        descriptor = session.recordings[index]
        recorded = spans[index][1]
        self._check_stall(session, recorded)
        span = merge.replay_range(recorded)
        if span is None:
            merge.replayed(merge.position)  # at the live image's join already: go live
            return 0
        return self._replay(session, session.reader(descriptor, self.directory), span[1],
                            recorded, limit)

    def _check_stall(self, session: _Session, recorded: int) -> None:
        """Raise HistoryGapError when a live image waits for a recording that stopped growing
        (its recorder died) for _RECORDING_STALL_S: it would hold the publisher for good."""
        merge = session.merge
        now = time.monotonic()
        if merge.live_join is None or recorded >= merge.live_join \
                or recorded != session.last_recorded:
            session.last_recorded, session.recorded_since = recorded, now
            return
        if now - session.recorded_since > _RECORDING_STALL_S:
            raise HistoryGapError(
                f"session {merge.session_id}: the live image waits at {merge.live_join} and "
                f"the recording in {self.directory} has not grown past {recorded} for "
                f"{_RECORDING_STALL_S:g} s (is its recorder running?)")

    def _replay(self, session: _Session, reader: RecordingReader, end: int,
                limit_position: int, limit: int) -> int:
        """Hand out the recorded messages starting in [position, end), stopping after the
        batch that reaches ``limit`` messages (the position is then that batch's end)."""
        handler, sink = self._handler, self._sink
        merge = session.merge
        sid = merge.session_id
        mtu = reader.descriptor.mtu
        count = 0
        for batch in reader.read_batches(merge.position, end, limit=limit_position):
            n = len(batch)
            if not n:
                continue
            offsets = batch.offsets.tolist()
            ends = message_ends(batch.positions, batch.lengths, mtu, batch.large).tolist()
            if sink is not None:  # messages(): bytes, no call per message
                whole = batch.data.tobytes()
                sink.extend([whole[offsets[i]:offsets[i + 1]] for i in range(n)])
            else:
                assert handler is not None
                data = batch.data.data  # zero-copy slices
                reserved = batch.reserved_values.tolist()
                for i in range(n):
                    handler(data[offsets[i]:offsets[i + 1]], MessageInfo(sid, ends[i],
                                                                          reserved[i], True))
            count += n
            self.replayed_messages += n
            if count >= limit:
                merge.replayed(ends[-1])
                return count
            merge.position = max(merge.position, ends[-1])
        merge.replayed(end)
        return count

    def _on_live_fragment(self, buffer: memoryview, header: Header) -> None:
        session = self._delivering
        assert session is not None
        end = header.position
        session.merge.delivered_live(end)
        self.live_messages += 1
        if self._sink is not None:
            self._sink.append(bytes(buffer))
            return
        handler = self._handler
        assert handler is not None
        handler(buffer, MessageInfo(session.merge.session_id, end, header.reserved_value,
                                    False))

    # -- the live subscription -------------------------------------------------------------------

    def _go_live(self) -> None:
        channel = self.channel
        if self._uri.is_ipc:
            channel += ("|" if "?" in channel else "?") + f"{JOIN_POSITION}=earliest"
        self._live = self._subscribe(channel, self.stream_id)
        self.live_since = time.monotonic()
        self._rescan()
        self._check_images()

    def _check_images(self) -> None:
        live = self._live
        assert live is not None
        images = {image.session_id: image for image in live.images}
        for sid, session in self._sessions.items():
            image = session.image
            if image is not None and images.get(sid) is not image:
                session.image = None
                self._assembler.free_session(sid)
                if session.merge.phase is Phase.LIVE or session.merge.live_join is not None:
                    session.merge.image_lost()
        for sid, image in images.items():
            known = self._sessions.get(sid)
            if known is not None and known.image is image:
                continue
            joining = known if known is not None else self._session_for_new_image(image)
            if joining is None:
                continue
            joining.image = image
            move_to = joining.merge.image_joined(image.join_position)
            if move_to is not None and move_to != image.position:
                image.position = move_to

    def _session_for_new_image(self, image: Image) -> _Session | None:
        """A session first seen live: merged with its recording, or read live from its join
        when it joined at its beginning (a session newer than this subscription)."""
        self._rescan()
        session = self._sessions.get(image.session_id)
        if session is not None:
            return session
        if image.join_position == 0:
            session = self._sessions[image.session_id] = _Session(
                SessionMerge(image.session_id, 0))
            return session
        # its recording may not be in the catalog yet: wait for it, boundedly
        now = time.monotonic()
        waiting = self._waiting.setdefault(image.session_id, now)
        if now - waiting < _RECORDING_WAIT_S:
            return None
        raise HistoryGapError(
            f"session {image.session_id}: its live image starts at {image.join_position} and "
            f"no recording in {self.directory} has what came before")

    # -- iteration -------------------------------------------------------------------------------

    def messages(self, timeout: float | None = 1.0) -> Iterator[bytes]:
        """Whole messages as bytes, history then live; ends after ``timeout`` seconds without
        one (None: only when closed)."""
        batch: list[bytes] = []
        deadline = None
        while not self._closed:
            self._sink = batch
            try:
                found = self.poll(_no_handler, 4096)
            finally:
                self._sink = None
            if found:
                deadline = None
                yield from batch
                batch.clear()
                continue
            now = time.monotonic()
            if deadline is None and timeout is not None:
                deadline = now + timeout
            if deadline is not None and now >= deadline:
                return
            self._wait(_WAIT_SLICE_S if deadline is None else min(_WAIT_SLICE_S,
                                                                   deadline - now))

    def _wait(self, seconds: float) -> None:
        if self._live is not None and self.is_live:
            self._live.wait(seconds)
        else:
            time.sleep(max(seconds, 0))

    def close(self) -> None:
        """Close the live subscription. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._live is not None:
            self._live.close()

    def __repr__(self) -> str:
        return (f"LateJoinSubscription({self.channel!r}, {self.stream_id}, "
                f"history={str(self.directory)!r}, sessions={len(self._sessions)}, "
                f"live={self.is_live})")


def _no_handler(payload: memoryview, info: MessageInfo) -> None:
    """The handler of messages()' polls, never called (they collect bytes)."""


def message_ends(positions: np.ndarray, lengths: np.ndarray, mtu: int,
                 large: np.ndarray | None = None) -> np.ndarray:
    """The stream position just after each message (start ``positions``, payload ``lengths``)
    as a publisher with this ``mtu`` frames it: fragments of mtu - 32 payload bytes, each
    frame 32-byte aligned; a ``large`` one (its payload in shared memory) is one reference
    frame, whatever its length."""
    chunk = mtu - HEADER_LENGTH
    lengths = lengths.astype(np.int64)
    if large is not None:
        lengths = np.where(large, RECORDED_REFERENCE_LENGTH, lengths)
    full = np.maximum(lengths - 1, 0) // chunk  # fragments before the last one
    last = lengths - full * chunk
    ends: np.ndarray = positions + full * align(mtu) + (
        (last + HEADER_LENGTH + FRAME_ALIGNMENT - 1) & -FRAME_ALIGNMENT)
    return ends


def _check_message_start(reader: RecordingReader, position: int) -> int:
    """``position`` (or the recording's start, if it starts later) when a message of the
    recording starts there; ValueError naming the session otherwise."""
    d = reader.descriptor
    if position <= d.start_position:
        return d.start_position
    end = reader.stop_position
    if position > end:
        raise ValueError(f"from_position {position} is past the end of session "
                         f"{d.session_id}'s recording {d.recording_id} (at {end} now)")
    if position < end:
        found = reader.read_batch(position, position + FRAME_ALIGNMENT).positions
        if not len(found) or int(found[0]) != position:
            raise ValueError(f"from_position {position} is not the start of a message of "
                             f"session {d.session_id} (recording {d.recording_id})")
    return position


def _last_messages_start(reader: RecordingReader, n: int) -> int:
    """The start of the last ``n`` messages of a recording as it stands (its end for 0)."""
    end = reader.stop_position
    if n == 0:
        return end
    start = reader.start_position
    span = 64 * 1024
    while True:
        lo = max(start, end - span)
        lo -= lo % reader.descriptor.term_length if lo != start else 0
        positions = reader.read_batch(lo, end).positions
        if len(positions) >= n or lo <= start:
            return int(positions[-n]) if len(positions) >= n else (
                int(positions[0]) if len(positions) else end)
        span *= 4
