"""The calling side of request/reply: ``bus.add_requester(channel, stream_id)``.

A requester publishes each request on the service's stream with a 16-byte call header
(shmbus/shm/call_header.py: its correlation id and the requester's own response stream) and
reads the replies on that response stream, which only it subscribes to: a reply goes to the
requester that asked, and is matched to its call by correlation id, never by order. The calls
in flight live in a :class:`~shmbus.calls.pending_calls.PendingCalls` table.

Waiting follows the subscriptions' rules: a caller spins for ``Context.wait_spin``, then
sleeps until the responder's reply wakes it. Many threads may share one requester: whichever
waiting caller holds the reader's turn reads every reply and hands each to its call; the
others sleep until theirs is settled or the turn is free. A caller of ``request()`` alone on
the requester (no other call in flight, the common case) skips the hand-off: it takes replies
straight from its response stream until its own comes (natively, shmbus/shm/native/calls.c),
and its call enters the table only if the reply is not there within its first look.

No call outlives its responders: when the last one has gone (it closed, or died and the driver
timed it out, ``client_liveness_timeout``), the driver clears the request log's is-connected
word and wakes whoever sleeps on it. Every wait for replies (a lone caller's, the reader's
turn, the asyncio reader's) sleeps on that word too (``_watch_word``), so the reader wakes,
finds no responder connected and fails every call in flight with ResponderLostError, waking
the others. The waits still look at least every ``_BACKSTOP_S`` (a wake-up that never comes:
a log rebound to a restarted driver).

Across hosts (a service on ``aeron:udp``, shmbus/calls/remote_calls.py) the same requester sends
each request with the reply-to extension naming its response channel, a UDP endpoint of its
own host, and reads its replies from the network image there. Its request publication is
connected while the service's host has a responder subscribed (the netbridge there sends
status messages); a requester made less than ``CONNECT_WAIT_S`` ago waits that long for the
first connection before a call fails with NoResponderError (the SETUP/status exchange takes a
round trip). When the last responder there leaves (it closed, or died and that host's driver
timed it out, ``client_liveness_timeout``), the netbridge there closes its image of the requests
and tells this host's netbridge so (a status message with the EOS flag), which ends the
publication's connection at once: the driver clears the is-connected word as on IPC, and the
calls in flight fail with ResponderLostError within the liveness timeout. A service host that
goes silent instead (its netbridge or host died, or those status messages were all lost) ends
the connection after ``Context.publication_connection_timeout`` (5 s) without status messages.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from shmbus.calls.pending_calls import PendingCall, PendingCalls
from shmbus.settings.codes import ADMIN_ACTION, BACK_PRESSURED, CLOSED, NOT_CONNECTED
from shmbus.settings.errors import (
    ClientClosedError,
    PublicationError,
    RequestTimeoutError,
    ResponderLostError,
    ShmbusError,
)
from shmbus.settings.timeouts import deadline_after
from shmbus.shm import call_header
from shmbus.shm._native import await_reply as _await_reply
from shmbus.shm._native import offer_call as _offer_call
from shmbus.shm.block_ring import CorruptReferenceError
from shmbus.shm.counters import (
    RR_ANSWERED,
    RR_FAILED,
    RR_IN_FLIGHT,
    RR_LATE,
    RR_TIMED_OUT,
)
from shmbus.shm.log_buffer import IS_CONNECTED_OFFSET
from shmbus.streams.context_managers import Closeable

if TYPE_CHECKING:
    from shmbus.calls.call_counters import CallCounters
    from shmbus.shm._native import Buffer  # a type of the stub only
    from shmbus.streams.publication import Publication
    from shmbus.streams.subscription import Subscription

#: The default deadline of a call, seconds.
DEFAULT_CALL_TIMEOUT = 5.0
#: A lone caller counts its call in flight once it has waited this long (seconds).
_IN_FLIGHT_AFTER_S = 0.05
#: The longest a waiting caller sleeps without looking whether a responder is still connected
#: (it is woken when the last one leaves: this covers a wake-up that never comes).
_BACKSTOP_S = 1.0
_HEADER_LENGTH = call_header.HEADER_LENGTH
_REQUEST = call_header.REQUEST
_IDEMPOTENT = call_header.IDEMPOTENT
_INF = float("inf")
_monotonic = time.monotonic
#: The longest a back-pressured request waits for room before it reads replies and retries.
_SEND_RETRY_S = 0.005
#: How long a new requester on aeron:udp lets its first calls wait for the connection, seconds.
CONNECT_WAIT_S = 1.0


class Call:
    """A request in flight, from :meth:`Requester.submit`: ``result()`` waits for its reply."""

    __slots__ = ("_pending", "_requester")

    def __init__(self, requester: Requester, pending: PendingCall) -> None:
        self._requester = requester
        self._pending = pending

    @property
    def correlation_id(self) -> int:
        """The call's id, unique within its requester."""
        return self._pending.correlation_id

    def done(self) -> bool:
        """True once the call is settled (answered, failed or timed out). Does not wait."""
        return self._pending.settled

    def result(self, timeout: float | None = None) -> bytes:
        """The reply, waiting at most ``timeout`` seconds (None: until the call settles, which
        it does by its own deadline at the latest). Raises the call's error (RemoteError,
        ResponderLostError, NoResponderError, RequestTimeoutError), or TimeoutError when
        ``timeout`` passes first (the call stays in flight)."""
        pending = self._pending
        if not pending.settled:
            self._requester._wait(pending, timeout)
        if pending.error is not None:
            raise pending.error
        assert pending.reply is not None
        return pending.reply

    def __repr__(self) -> str:
        state = "settled" if self._pending.settled else "in flight"
        return f"Call(correlation_id={self.correlation_id}, {state})"


class Requester(Closeable):
    """Calls a service (channel + stream) and gets its responders' replies. Thread-safe.

    Made by ``Client.add_requester``; a context manager (closing it fails the calls still in
    flight with ClientClosedError).
    """

    def __init__(self, channel: str, stream_id: int, *, publication: Publication,
                 replies: Subscription, response_stream_id: int, counters: CallCounters,
                 on_close: Callable[[], None], reply_to: str | None = None) -> None:
        self.channel = channel
        #: where the responders answer over UDP (None: aeron:ipc, the response stream here)
        self.reply_to = reply_to
        if reply_to is not None:
            call_header.encode_reply_to(reply_to)  # ValueError now, not at the first call
        self._connect_until = 0.0 if reply_to is None else _monotonic() + CONNECT_WAIT_S
        self.stream_id = stream_id
        self.response_stream_id = response_stream_id
        self._publication = publication
        self._replies = replies
        self._counters = counters
        self._on_close = on_close
        self._table = PendingCalls(f"{channel} stream {stream_id}")
        self._open = self._table._open  # the calls in flight, read without a call
        self._counts = self._table.counts
        #: the correlation id of a lone call outside the table (0: none), and what an
        #: asyncio reader read for it meanwhile: (kind, correlation id, body)
        self._alone = 0
        self._alone_early: tuple[int, int, bytes] | None = None
        spin_s = getattr(replies, "_wait_spin_ns", 0) * 1e-9
        self._first_look_s = min(spin_s, _IN_FLIGHT_AFTER_S)
        self._on_reply = self._on_reply_message  # bound once: the lone call path's handler
        self._add_answered = counters.adder(RR_ANSWERED)
        self._add_in_flight = counters.adder(RR_IN_FLIGHT)
        self._count_settled = self._count  # bound once: every call's on_settled
        self._ids = itertools.count(1)
        self._lock = threading.Lock()  # the table
        self._settled = threading.Condition(self._lock)
        self._followers = 0  # callers sleeping on _settled
        self._reader = threading.Lock()  # the turn to read replies
        self._async_reading = False
        self._async_waiters: set[asyncio.Future[None]] = set()
        self._closed = False
        self._watched = publication.log
        self._watch_connection()

    # -- calls ----------------------------------------------------------------------------------

    def submit(self, data: Buffer, *, timeout: float | None = DEFAULT_CALL_TIMEOUT,
               idempotent: bool = False) -> Call:
        """Send a request and return at once: the :class:`Call`'s ``result()`` waits for the
        reply. ``timeout`` (seconds; None: forever) is the call's deadline. ``idempotent`` lets a
        request whose responder left be run by another responder instead of failing with
        ResponderLostError. A call with no responder connected fails at once
        (NoResponderError, raised by ``result()``). Raises ClientClosedError once closed."""
        correlation_id = next(self._ids)
        deadline = deadline_after(timeout)
        with self._lock:
            if self._closed:
                raise ClientClosedError(f"the requester of {self._table.service} is closed")
            pending = self._table.open(correlation_id, deadline, idempotent=idempotent)
        pending.on_settled = self._count_settled
        self._add_in_flight(1)
        result = self._offer_request(_IDEMPOTENT if idempotent else 0, correlation_id, data)
        if result < 0:
            self._send_refused(pending, data, result)
        return Call(self, pending)

    def request(self, data: Buffer, *, timeout: float | None = DEFAULT_CALL_TIMEOUT,
                idempotent: bool = False) -> bytes:
        """Send a request and wait for its reply (bytes): :meth:`submit` then ``result()``,
        with the same errors.

        A caller alone on the requester (no other call in flight) takes the reader's turn
        and reads its reply itself, without a hand-off, spinning then sleeping as
        ``messages()`` does. Its first look (the spin of ``Context.wait_spin``, at most
        ``_IN_FLIGHT_AFTER_S``) runs with the call outside the table of calls in flight: a
        reply there by then costs no table entry and no lock. Only the holder of the turn
        reads replies, except an asyncio reader that started meanwhile: one that reads this
        call's answer leaves it in ``_alone_early`` (see :meth:`_on_reply_message`). After
        the first look the call enters the table like any other (:meth:`_request_waiting`),
        so close(), its deadline and departed responders settle it as they settle any call.
        Other threads may submit meanwhile: this caller holds the turn, so it reads their
        replies into the table for them."""
        reader = self._reader
        if not self._open and not self._async_reading and reader.acquire(False):
            try:
                if not self._open:
                    correlation_id = next(self._ids)
                    start = _monotonic()
                    if self._closed:
                        raise ClientClosedError(
                            f"the requester of {self._table.service} is closed")
                    self._alone = correlation_id
                    flags = _IDEMPOTENT if idempotent else 0
                    if self.reply_to is None:
                        result = _offer_call(self._publication, _REQUEST, flags,
                                             self.response_stream_id, correlation_id, data)
                    else:
                        result = self._offer_request(flags, correlation_id, data)
                    if result > 0:
                        look = self._first_look_s
                        if timeout is not None and timeout < look:
                            look = timeout
                        try:
                            reply = _await_reply(self._replies, correlation_id, look,
                                                 self._on_reply)
                        except CorruptReferenceError:  # a reply frame no writer made:
                            self._counters.add(RR_LATE)  # dropped (read past), counted
                            reply = None
                        if reply is not None:
                            self._alone = 0
                            # answered is counted by readers only (the holder of the turn,
                            # or an asyncio reader under the lock, which leaves this call's
                            # answer to this caller): no lock
                            self._counts.answered += 1
                            self._add_answered(1)
                            return reply
                    return self._request_waiting(
                        correlation_id, start, _INF if timeout is None else start + timeout,
                        idempotent, result, data)
            finally:
                reader.release()
                if self._followers:
                    with self._lock:
                        self._settled.notify_all()
        return self.submit(data, timeout=timeout, idempotent=idempotent).result()

    def _request_waiting(self, correlation_id: int, start: float, deadline: float,
                         idempotent: bool, result: int, data: Buffer) -> bytes:
        """The rest of a lone :meth:`request` (made at ``start``) for a call whose reply was
        not there within its first look (or whose offer was refused with ``result``): in the
        table from now. The in-flight counter counts it once it has waited
        ``_IN_FLIGHT_AFTER_S`` (a shorter call shows only as answered)."""
        table = self._table
        pending = PendingCall(correlation_id, deadline, idempotent)
        with self._lock:
            self._alone = 0
            self._open[correlation_id] = pending  # table.open without its check: ids are unique
            early, self._alone_early = self._alone_early, None
            if early is not None:
                kind, early_id, body = early
                if table.on_reply(kind, early_id, body) is None:
                    self._counters.add(RR_LATE)  # an older lone call's, answered twice
            if self._closed and not pending.settled:
                table.fail(correlation_id, ClientClosedError(
                    f"call {correlation_id}: the requester of {table.service} closed"))
        if result < 0:
            self._count_from_now(pending)
            self._send_refused(pending, data, result)
        replies = self._replies
        on_other = self._on_reply
        check_at = start + _IN_FLIGHT_AFTER_S
        now = _monotonic()
        if now >= check_at and not pending.settled:
            self._count_from_now(pending)
        while not pending.settled:
            # natively: take replies, spin for Context.wait_spin, then sleep; another call's
            # reply (or an error reply) goes to on_other, and None comes back
            try:
                reply = _await_reply(replies, correlation_id, min(deadline, check_at) - now,
                                     on_other)
            except CorruptReferenceError:  # a reply frame no writer made: dropped, counted
                self._counters.add(RR_LATE)
                reply = None
            if reply is not None:
                with self._lock:
                    if self._open.pop(correlation_id, None) is not None:
                        table.counts.answered += 1
                        pending.reply = reply
                        pending.settled = True
                        if pending.on_settled is not None:
                            self._add_in_flight(-1)
                        self._add_answered(1)
                        return reply
                self._counters.add(RR_LATE)  # settled meanwhile (by close)
                continue
            now = _monotonic()
            if now >= check_at or now >= deadline or not self._publication.is_connected:
                self._count_from_now(pending)
                self._pump(pending)
                check_at = now + _IN_FLIGHT_AFTER_S
        self._count_from_now(pending)
        return Call(self, pending).result()

    def _count_from_now(self, pending: PendingCall) -> None:
        """Count a lone call of :meth:`request` in flight (once), and its end: at once if
        it is settled already, else when it settles."""
        with self._lock:
            if pending.on_settled is None:
                pending.on_settled = self._count_settled
                self._add_in_flight(1)
                if pending.settled:
                    self._count(pending)

    async def request_async(self, data: Buffer, *,
                            timeout: float | None = DEFAULT_CALL_TIMEOUT,
                            idempotent: bool = False) -> bytes:
        """:meth:`request` for asyncio: the event loop runs while the call waits."""
        call = self.submit(data, timeout=timeout, idempotent=idempotent)
        pending = call._pending
        loop = asyncio.get_running_loop()
        while not pending.settled:
            if self._async_reading:
                await self._await_settled(pending, loop)
                continue
            self._async_reading = True
            try:
                while not pending.settled:
                    self._pump(pending)
                    if pending.settled:
                        break
                    wake = min(pending.deadline, time.monotonic() + _BACKSTOP_S)
                    await self._replies._readable(wake)
            finally:
                self._async_reading = False
                for waiter in self._async_waiters:  # one of them reads next
                    if not waiter.done():
                        waiter.set_result(None)
        return call.result()

    async def _await_settled(self, pending: PendingCall, loop: asyncio.AbstractEventLoop
                             ) -> None:
        """Sleep until ``pending`` settles, the async reader's turn is free, or a slice."""
        waiter = loop.create_future()

        def wake() -> None:
            if not waiter.done():
                waiter.set_result(None)

        def fire(_: PendingCall) -> None:
            self._count(pending)
            loop.call_soon_threadsafe(wake)

        pending.on_settled = fire
        self._async_waiters.add(waiter)
        try:
            if not pending.settled:
                await asyncio.wait([waiter], timeout=_BACKSTOP_S)
        finally:
            self._async_waiters.discard(waiter)
            if not pending.settled:
                pending.on_settled = self._count_settled

    @property
    def in_flight(self) -> int:
        """Calls sent and not settled yet (a lone ``request()`` counts from the end of its
        first look, the spin of ``Context.wait_spin``: a call answered within it never
        shows here)."""
        return len(self._table)

    # -- waiting --------------------------------------------------------------------------------

    def _wait(self, pending: PendingCall, timeout: float | None) -> None:
        """Until ``pending`` settles; TimeoutError if ``timeout`` (seconds) passes first."""
        until = deadline_after(timeout)
        replies = self._replies
        while not pending.settled:
            now = time.monotonic()
            if now >= until and now < pending.deadline:
                raise TimeoutError(f"call {pending.correlation_id} not settled within "
                                   f"{timeout} s (it stays in flight)")
            if self._reader.acquire(blocking=False):
                try:
                    self._pump(pending)
                    if not pending.settled:
                        now = time.monotonic()
                        replies.wait(max(0.0, min(pending.deadline, until,
                                                  now + _BACKSTOP_S) - now))
                        self._read_replies()
                finally:
                    self._reader.release()
                    if self._followers:
                        with self._lock:
                            self._settled.notify_all()
            else:
                with self._lock:
                    if pending.settled or not self._reader.locked():
                        continue
                    self._followers += 1
                    try:
                        self._settled.wait(max(0.0, min(pending.deadline, until,
                                                        now + _BACKSTOP_S) - now))
                    finally:
                        self._followers -= 1

    def _watch_connection(self) -> None:
        """Have every wait for replies also end when the request log's is-connected word
        leaves 1 (the driver wakes its sleepers as it clears it: the last responder left)."""
        log = self._watched = self._publication.log
        self._replies._watch_word(log.metadata_view(), IS_CONNECTED_OFFSET, 1)

    def _pump(self, pending: PendingCall) -> None:
        """One look without sleeping: read the replies, settle the calls past their
        deadline, fail everything if no responder is connected any more. The caller holds
        the reader's turn (or is the async reader)."""
        if self._publication.log is not self._watched and not self._closed:
            self._watch_connection()  # rebound to a restarted driver's log
        self._read_replies()
        if pending.settled:
            return
        now = time.monotonic()
        if now >= pending.deadline:
            with self._lock:
                self._table.expire(now)
        elif not self._publication.is_connected:
            self._read_replies()  # a reply written just before its responder left
            with self._lock:
                self._table.fail_all(self._lost)
                self._wake_followers()

    def _lost(self, call: PendingCall) -> ResponderLostError:
        return ResponderLostError(
            f"call {call.correlation_id} to {self._table.service}: no responder is connected "
            f"any more (they closed, or died and were timed out) and none answered it")

    def _read_replies(self) -> None:
        take = self._replies._take
        while True:
            try:
                message = take()
            except CorruptReferenceError:  # a reply frame no writer made: dropped, counted
                self._counters.add(RR_LATE)
                continue
            if message is None:
                return
            self._on_reply_message(message)

    def _on_reply_message(self, message: bytes) -> None:
        """Settle the call ``message`` answers, or count it late (malformed, a request, or
        for no open call)."""
        try:
            kind, _, _, correlation_id = call_header.unpack(message)
        except call_header.MalformedCall:
            self._counters.add(RR_LATE)
            return
        if kind == call_header.REQUEST:
            self._counters.add(RR_LATE)
            return
        with self._lock:
            # a lone call's, not in the table yet (0: no lone call, and no call has id 0; a
            # second reply to it is late, as any reply to a settled call)
            if self._alone and correlation_id == self._alone and self._alone_early is None:
                self._alone_early = (kind, correlation_id, message[_HEADER_LENGTH:])
                return
            if self._table.on_reply(kind, correlation_id,
                                    message[_HEADER_LENGTH:]) is None:
                self._counters.add(RR_LATE)
            else:
                self._wake_followers()

    def _wake_followers(self) -> None:
        if self._followers:
            self._settled.notify_all()

    def _offer_request(self, flags: int, correlation_id: int, data: Buffer) -> int:
        """Offer one request: the header packed natively on IPC, with the reply-to extension
        on UDP. The offer's result."""
        if self.reply_to is None:
            return _offer_call(self._publication, _REQUEST, flags, self.response_stream_id,
                               correlation_id, data)
        return self._publication.offer(call_header.encode_request(
            correlation_id, self.response_stream_id, idempotent=bool(flags & _IDEMPOTENT),
            reply_to=self.reply_to), data)

    def _send_refused(self, pending: PendingCall, data: Buffer, result: int) -> None:
        """The offer of a request was refused with ``result``. Back-pressure: offer again
        until the call's deadline, reading replies meanwhile (the responders may be waiting
        for this requester to read before they take more requests); else fail the call with
        the reason."""
        publication = self._publication
        header = call_header.encode_request(pending.correlation_id, self.response_stream_id,
                                            idempotent=pending.idempotent,
                                            reply_to=self.reply_to)
        if result == NOT_CONNECTED and _monotonic() < self._connect_until:
            result = self._await_first_connection(pending, header, data)
        while result in (BACK_PRESSURED, ADMIN_ACTION):
            remaining = pending.deadline - time.monotonic()
            if remaining <= 0:
                with self._lock:
                    self._table.expire(pending.deadline)
                return
            if self._reader.acquire(blocking=False):
                try:
                    self._read_replies()
                finally:
                    self._reader.release()
            if result == BACK_PRESSURED:
                publication._await_progress(min(remaining, _SEND_RETRY_S))
            result = publication.offer(header, data)
        if result > 0:
            return
        with self._lock:
            if result == NOT_CONNECTED:
                error: ShmbusError = self._table.no_responder()
            elif result == CLOSED:
                error = ClientClosedError(f"the requester of {self._table.service} is closed")
            else:
                error = PublicationError(result)
            self._table.fail(pending.correlation_id, error)

    def _await_first_connection(self, pending: PendingCall, header: bytes, data: Buffer
                                ) -> int:
        """A new UDP requester's request found no connection: wait for the first one until
        ``_connect_until`` (or the call's deadline), sleeping in growing steps, then offer
        again. Returns the offer's result."""
        publication = self._publication
        until = min(self._connect_until, pending.deadline)
        pause = 0.0002
        while not publication.is_connected and (now := _monotonic()) < until:
            time.sleep(min(pause, until - now))
            pause = min(pause * 2, 0.01)
        return publication.offer(header, data)

    def _count(self, call: PendingCall) -> None:
        """Counters for a call just settled (called by the table, under the lock)."""
        self._add_in_flight(-1)
        if call.error is None:
            self._add_answered(1)
            return
        counters = self._counters
        if isinstance(call.error, RequestTimeoutError):
            counters.add(RR_TIMED_OUT)
        else:
            counters.add(RR_FAILED)

    # -- lifecycle ------------------------------------------------------------------------------

    @property
    def is_closed(self) -> bool:
        """True once closed."""
        return self._closed

    def close(self) -> None:
        """Stop: fail the calls in flight with ClientClosedError, drop the response stream
        and the request publication. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._table.fail_all(lambda call: ClientClosedError(
                f"call {call.correlation_id}: the requester of {self._table.service} closed"))
            self._wake_followers()
        self._replies._watch_word(None)  # before the request log's mapping may go
        self._replies.close()
        self._publication.close()
        self._counters.close()
        self._on_close()

    def __repr__(self) -> str:
        return (f"Requester(channel={self.channel!r}, stream_id={self.stream_id}, "
                f"in_flight={self.in_flight})")
