"""The serving side of request/reply: ``bus.add_responder(channel, stream_id, handler)``.

A responder is a member of the service's subscription group (``rr-<stream id>`` on the
request stream), so the responders of a service share its requests, each to exactly one of
them (the group's claim, shmbus/streams/subscription_group.py). For each request it calls
``handler(request: bytes) -> bytes`` and publishes the answer, with the call's correlation
id, on the response stream the request names: only the requester that asked reads it.

What the handler's outcome becomes: its bytes are the reply; an exception becomes an error
reply ("ExceptionType: message") that the caller gets as RemoteError. When a responder leaves
with requests claimed and not answered (it closed, or died and the driver timed it out), the
group hands them to another responder; the first of them may have been in the departed
responder's handler, so unless the requester marked it idempotent, it is answered with a
"lost" reply (the caller gets ResponderLostError) rather than run a second time. A reply
whose requester is gone (its response stream has no subscriber) is dropped and counted
(``rr-replies-dropped``).

Across hosts (a service on ``aeron:udp``, shmbus/calls/remote_calls.py) the group is on the network
image of the requests, and each request carries its reply-to channel (the requester's UDP
response endpoint): the reply goes out on a UDP publication to that channel and the request's
response stream, made at the first reply to that requester (waiting up to ``REPLY_TIMEOUT``
for the requester's host to answer its SETUP) and kept while it stays connected; an idle
serve() closes those that are no longer connected (the requester left). A request without a
valid reply-to on a UDP service, or with one on an IPC service, is malformed: counted
(``rr-handler-errors``) and dropped, never answered elsewhere. On a service channel without a
key, a request whose reply-to names another host than the one it came from (its image's
source) is dropped before its handler runs and counted (``rr-reflections-refused``), and no
publication is made toward that host; on a keyed one, replies carry the service's key (the
rule and why: shmbus/calls/remote_calls.py).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from shmbus.calls.remote_calls import check_reply_to, keyed_reply_channel, may_answer
from shmbus.settings.codes import NOT_CONNECTED
from shmbus.settings.errors import PublicationError, RegistrationError
from shmbus.settings.timeouts import deadline_after
from shmbus.shm import call_header
from shmbus.shm._native import answer_requests as _answer_requests
from shmbus.shm._native import offer_call as _offer_call
from shmbus.shm.block_ring import CorruptReferenceError
from shmbus.shm.counters import (
    RR_HANDLER_ERRORS,
    RR_REFLECTIONS_REFUSED,
    RR_REPLIES_DROPPED,
    RR_SERVED,
)
from shmbus.streams.context_managers import Closeable
from shmbus.streams.fragment_assembler import FragmentAssembler
from shmbus.streams.subscription_group import GroupSubscription

if TYPE_CHECKING:
    from shmbus.calls.call_counters import CallCounters
    from shmbus.shm._native import GroupMemberCore, Header
    from shmbus.streams.publication import Publication

#: handler(request) -> reply
RequestHandler = Callable[[bytes], Any]
_sched_yield = os.sched_yield
#: How long a reply may wait for a requester that does not read, seconds, before it is dropped.
REPLY_TIMEOUT = 1.0
_unpack_from = call_header.HEADER.unpack_from
_HEADER_LENGTH = call_header.HEADER_LENGTH
_REQUEST, _REPLY, _VERSION = call_header.REQUEST, call_header.REPLY, call_header.VERSION
_REPLY_TO = call_header.REPLY_TO
# what answer_request did (shmbus/shm/native/calls.c)
_ANSWER_NOTHING, _ANSWER_REPLIED, _ANSWER_DELIVER, _ANSWER_MALFORMED = 0, 1, 2, 3
#: The requests a serve() loop answers between two looks at its deadline.
_SERVE_LIMIT = 16
#: A waiting responder looks for requests handed on from a departed responder this often.
_HANDED_ON_CHECK_S = 0.1
#: An idle UDP responder closes its reply publications that lost their requester this often.
_SWEEP_S = 1.0
#: Where a reply goes: an IPC response stream id, or (reply-to channel, stream id) over UDP.
Destination = int | tuple[str, int]


def group_name(stream_id: int) -> str:
    """The subscription group the responders of a stream share."""
    return f"rr-{stream_id}" if stream_id >= 0 else f"rr-m{-stream_id}"


class Responder(Closeable):
    """Serves one service (channel + stream) with ``handler``. Made by
    ``Client.add_responder``; a context manager. Not for concurrent use by several threads:
    run one ``serve`` (or ``poll`` loop) per responder."""

    def __init__(self, channel: str, stream_id: int, handler: RequestHandler, *,
                 requests: GroupSubscription, counters: CallCounters,
                 reply_publication: Callable[[str, int], Publication],
                 on_close: Callable[[], None], remote: bool = False) -> None:
        if not callable(handler):
            raise TypeError(f"handler must be callable, not {type(handler).__name__}")
        self.channel = channel
        self.stream_id = stream_id
        self.handler = handler
        self._requests = requests
        self._counters = counters
        self._add_reply_publication = reply_publication
        self._on_close = on_close
        self._replies: dict[Destination, Publication] = {}
        self._member: GroupMemberCore | None = None  # the one polled now
        self._source = ""  # the source identity of the image polled now (UDP)
        #: a service on aeron:udp: requests name their reply-to channel
        self.remote = remote
        self._sweep_at = 0.0
        self._assembler = FragmentAssembler(
            self._on_remote_request if remote else self._on_request)
        self._closed = False
        #: requests answered (replies published); the rr-served counter follows per poll
        self.served = 0
        self._counted = 0
        self._add_served = counters.adder(RR_SERVED)

    # -- serving --------------------------------------------------------------------------------

    def poll(self, limit: int = 16) -> int:
        """Answer up to about ``limit`` requests waiting now, without sleeping. Returns how
        many fragments were read.

        Each request is claimed and answered natively (``answer_request``, one at a time, so
        the responders of a service share a burst; ``answer_requests`` loops over it, one
        call from here for a burst); what it leaves to this side (a fragmented or large
        request, one handed on from a responder that left) is delivered by the member's
        poll to :meth:`_on_request`. A service on aeron:udp reads every request with the
        member's poll (:meth:`_on_remote_request`)."""
        if self.remote:
            return self._poll_remote(limit)
        fragments = 0
        handler, replies = self.handler, self._replies
        for image in self._requests.images:
            member = image._member
            while fragments < limit:
                replied, outcome = _answer_requests(member, handler, replies, self,
                                                    limit - fragments)
                if replied:
                    self.served += replied
                    fragments += replied
                if outcome == _ANSWER_NOTHING:
                    break
                if outcome == _ANSWER_DELIVER:
                    self._member = member
                    try:
                        fragments += member.poll(self._assembler, 1)
                    except CorruptReferenceError:  # its frame dropped: malformed, counted
                        self._counters.add(RR_HANDLER_ERRORS)
                        fragments += 1
                    finally:
                        self._member = None
                elif outcome != _ANSWER_REPLIED:  # malformed, or answered from this side
                    if outcome == _ANSWER_MALFORMED:
                        self._counters.add(RR_HANDLER_ERRORS)
                    fragments += 1
            if fragments >= limit:
                break
        if self.served != self._counted:
            self._add_served(self.served - self._counted)
            self._counted = self.served
        return fragments

    def _poll_remote(self, limit: int) -> int:
        fragments = 0
        assembler = self._assembler
        for image in self._requests.images:
            member = self._member = image._member
            self._source = image.source_identity
            try:
                fragments += member.poll(assembler, max(1, limit - fragments))
            except CorruptReferenceError:  # its frame dropped: malformed, counted
                self._counters.add(RR_HANDLER_ERRORS)
                fragments += 1
            if fragments >= limit:
                break
        self._member = None
        self._count_served()
        return fragments

    def _count_served(self) -> None:
        if self.served != self._counted:
            self._add_served(self.served - self._counted)
            self._counted = self.served

    def serve(self, timeout: float | None = None) -> int:
        """Answer requests as they come, sleeping in between (woken by the requesters), until
        ``timeout`` seconds passed (None: until closed). Returns the requests served."""
        before = self.served
        deadline = deadline_after(timeout)
        requests = self._requests
        poll, wait, monotonic = self.poll, requests.wait, time.monotonic
        # spinning waits (Context.wait_spin): after answering, give the CPU up once before
        # the spin, so a requester on this very CPU reads its reply (and sends the next)
        # now rather than after the spin's first look, which makes no system call
        spinning = requests._wait_spin_ns > 0
        while not self._closed:
            answered = poll(_SERVE_LIMIT)
            if answered >= _SERVE_LIMIT:
                continue
            # a poll below its limit drained the images: no second look before the wait,
            # which returns at once if a request came meanwhile
            if answered and spinning:
                _sched_yield()
            now = monotonic()
            remaining = deadline - now
            if remaining <= 0:
                break
            if self.remote and now >= self._sweep_at:
                self._sweep(now)
            wait(min(remaining, _HANDED_ON_CHECK_S))
        return self.served - before

    async def serve_async(self, timeout: float | None = None) -> int:
        """:meth:`serve` for asyncio: the event loop runs while it waits (the handler runs on
        the loop's thread)."""
        before = self.served
        deadline = deadline_after(timeout)
        while not self._closed:
            if self.poll():
                continue
            now = time.monotonic()
            if now >= deadline:
                break
            if self.remote and now >= self._sweep_at:
                self._sweep(now)
            await self._requests._readable(min(deadline, now + _HANDED_ON_CHECK_S))
        return self.served - before

    def _on_request(self, buffer: memoryview, header: Header) -> None:
        if len(buffer) >= _HEADER_LENGTH:
            kind, flags, version, stream_id, correlation_id = _unpack_from(buffer)
            if version != _VERSION:
                kind = 0
        else:
            kind = 0
        # malformed, not a request, or not for IPC (a reply-to, or flags version 1 has not)
        if kind != _REQUEST or flags & ~call_header.IDEMPOTENT:
            self._counters.add(RR_HANDLER_ERRORS)
            return
        reply = self._answer(stream_id, flags, correlation_id, buffer[_HEADER_LENGTH:])
        if reply is None:
            return
        publication = self._replies.get(stream_id)
        if publication is not None and _offer_call(publication, _REPLY, 0, 0, correlation_id,
                                                   reply) > 0:
            self.served += 1
            return
        self._reply(stream_id, _REPLY, correlation_id, reply)

    def _on_remote_request(self, buffer: memoryview, header: Header) -> None:
        """A request to a service on aeron:udp: answer it on the reply-to channel it names,
        if it may be answered there (see shmbus/calls/remote_calls.py)."""
        try:
            kind, flags, stream_id, correlation_id = call_header.unpack(buffer)
            if kind != _REQUEST or not flags & _REPLY_TO:
                raise call_header.MalformedCall("not a request with a reply-to")
            channel, at = call_header.read_reply_to(buffer)
            reply_to = check_reply_to(channel)
        except ValueError:  # MalformedCall among them
            self._counters.add(RR_HANDLER_ERRORS)
            return
        if not may_answer(reply_to, self._source, self.channel):
            self._counters.add(RR_REFLECTIONS_REFUSED)
            return
        destination = (keyed_reply_channel(reply_to, self.channel), stream_id)
        reply = self._answer(destination, flags, correlation_id, buffer[at:])
        if reply is not None:
            self._reply(destination, _REPLY, correlation_id, reply)

    def _answer(self, destination: Destination, flags: int, correlation_id: int,
                request: memoryview) -> Any:
        """The handler's reply to ``request``, or None when the caller was answered otherwise:
        LOST for a request that is not idempotent and that this member took over from one that
        left (the handler may have run there), the error when the handler raised."""
        member = self._member
        if member is not None and member.handed_on and not flags & call_header.IDEMPOTENT:
            self._reply(destination, call_header.LOST, correlation_id, b"")
            return None
        try:
            reply = self.handler(bytes(request))
            memoryview(reply)  # a reply is anything with the buffer protocol
        except Exception as error:  # the caller gets it as RemoteError
            self._reply_error(destination, correlation_id, error)
            return None
        return reply

    def _open_reply(self, destination: Destination) -> Publication:
        """The publication replies to ``destination`` go on (RegistrationError as
        add_publication). Over UDP it waits up to REPLY_TIMEOUT for the connection."""
        if isinstance(destination, int):
            return self._add_reply_publication(call_header.RESPONSE_CHANNEL, destination)
        publication = self._add_reply_publication(*destination)
        until = time.monotonic() + REPLY_TIMEOUT
        pause = 0.0002
        while not publication.is_connected and (now := time.monotonic()) < until:
            time.sleep(min(pause, until - now))
            pause = min(pause * 2, 0.01)
        return publication

    def _sweep(self, now: float) -> None:
        """Close the UDP reply publications whose requester is gone (not connected)."""
        self._sweep_at = now + _SWEEP_S
        for destination, publication in list(self._replies.items()):
            # pop, not del: close() on another thread may have taken it out meanwhile
            if not publication.is_connected and self._replies.pop(destination, None) is not None:
                publication.close()

    def _reply_error(self, destination: Destination, correlation_id: int, error: Exception
                     ) -> None:
        """The handler raised ``error``: the caller gets it as RemoteError. Called by the
        native core (calls.c) when the handler it ran raised an Exception, and by the requests
        handled in Python (_on_request, _on_remote_request)."""
        self._counters.add(RR_HANDLER_ERRORS)
        self._reply(destination, call_header.ERROR, correlation_id,
                    f"{type(error).__qualname__}: {error}".encode())

    def _reply(self, destination: Destination, kind: int, correlation_id: int, body: Any
               ) -> None:
        """Offer the reply ``body`` (of ``kind``) to the call ``correlation_id`` on the reply
        publication of ``destination``, opened on first use, publishing for up to
        REPLY_TIMEOUT when back-pressured; a reply that cannot go (the requester is gone, or
        it timed out) is counted as dropped. Called by the native core (calls.c) when the
        reply publication is not open yet or refused its offer, and by the requests handled
        in Python (_on_request, _on_remote_request)."""
        publication = self._replies.get(destination)
        if publication is None:
            try:
                publication = self._replies[destination] = self._open_reply(destination)
            except RegistrationError:
                self._counters.add(RR_REPLIES_DROPPED)
                return
            if self._closed and self._replies.pop(destination, None) is not None:
                publication.close()  # close() ran on another thread meanwhile and missed it
                return
        result = _offer_call(publication, kind, 0, 0, correlation_id, body)
        if result == NOT_CONNECTED:  # the requester is gone
            self._drop_reply(destination)
            return
        if result < 0:
            try:
                publication.publish(call_header.encode_reply(kind, correlation_id), body,
                                    timeout=REPLY_TIMEOUT)
            except PublicationError:
                self._drop_reply(destination)
                return
        self.served += 1

    def _drop_reply(self, destination: Destination) -> None:
        self._counters.add(RR_REPLIES_DROPPED)
        publication = self._replies.pop(destination, None)
        if publication is not None:
            publication.close()

    # -- lifecycle ------------------------------------------------------------------------------

    @property
    def is_closed(self) -> bool:
        """True once closed."""
        return self._closed

    def close(self) -> None:
        """Stop serving: requests this responder claimed and did not answer go to another
        responder. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._requests.close()
        # serve() may be opening a reply publication on another thread meanwhile: take them
        # out one at a time (atomic under the GIL) rather than iterate the dict
        while True:
            try:
                _, publication = self._replies.popitem()
            except KeyError:  # empty (serve() may have dropped the last one itself)
                break
            publication.close()
        self._counters.close()
        self._on_close()

    def __repr__(self) -> str:
        return (f"Responder(channel={self.channel!r}, stream_id={self.stream_id}, "
                f"served={self.served})")
