"""Subscription groups, the client's side: competing consumers on one stream.

``bus.add_subscription(channel, stream_id, group="workers")`` makes this process a member of the
group ``workers`` on that channel and stream: each message goes to exactly one member. A member
claims a run of whole messages at the group's shared claim position (natively, see
``shmbus/shm/native/group_member.c``), hands them to its handler and marks each done as its
handler returns. The driver counts the group for flow control like one subscriber, so a
publisher waits for the group rather than for each member.

Delivery is at least once: when a member leaves with a claim not done (it closes its
subscription, or dies and its client is timed out), the rest of that claim goes to another
member. Each message is marked done as its handler returns, so only the message a member was
handling when it died (at most one per member and publisher) can be delivered twice. A member
that joins finds the group where it is; a group ends when its last member leaves, and one made
anew starts at the end of the stream, as any new subscriber does.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from shmbus.settings.channel_uri import CONSUMER_GROUP, check_group_name
from shmbus.settings.timeouts import deadline_after
from shmbus.shm._native import GroupMemberCore, Header
from shmbus.shm.counters import GROUP_CLAIM_KEY, CountersReader
from shmbus.shm.log_buffer import LogBuffer
from shmbus.shm.position import Position
from shmbus.streams.image import FragmentBatch, FragmentHandler, Image
from shmbus.streams.subscription import Subscription


def group_channel(channel: str, group: str | None) -> tuple[str, str | None]:
    """(channel with ``consumer-group=<group>`` added, the group it names, or None).

    A channel may name the group itself; naming it both ways raises ValueError, as does a bad
    group name.
    """
    _, _, query = channel.partition("?")
    named = [value for key, _, value in (item.partition("=") for item in query.split("|"))
             if key == CONSUMER_GROUP]
    if group is None:
        return channel, named[0] if named else None
    check_group_name(group)
    if named:
        raise ValueError(f"channel {channel!r} names a {CONSUMER_GROUP} already; "
                         f"do not pass group={group!r} too")
    return f"{channel}{'|' if query else '?'}{CONSUMER_GROUP}={group}", group


#: Longest sleep of a waiting member between looks for a claim handed on (seconds).
_HANDED_ON_CHECK_S = 0.1
_WHOLE_CLAIMS = ("a group member delivers with poll(); controlled and batch polls would let a "
                 "claim be split across members")


class _Member(GroupMemberCore):
    """The native member, with its image's large-message callbacks: the native reader calls
    ``_large_payload`` and ``_large_bytes`` on the object it reads with (see image.py)."""

    _image: Image  # a weak proxy of its GroupImage: no cycle keeps either alive

    def _large_payload(self, reference: bytes, position: int) -> memoryview | None:
        """Its image's Image._large_payload: called by the native core (image.c) when this
        member's poll reaches a reference frame."""
        return self._image._large_payload(reference, position)

    def _large_bytes(self, reference: bytes, position: int) -> bytes | None:
        """Its image's Image._large_bytes: called by the native core (image.c) when this
        member's take reaches a reference frame."""
        return self._image._large_bytes(reference, position)


class GroupImage(Image):
    """One publishing session as seen by one member of a subscription group.

    ``position`` is the group's claim position (read-only): everything before it has been
    claimed by some member. ``claim`` is this member's record (start, end). Made by the bus
    client when a publisher appears; read it through :meth:`GroupSubscription.poll`.
    """

    def __init__(self, log: LogBuffer, counters: CountersReader, claim_counter_id: int, *,
                 correlation_id: int = 0, subscription_registration_id: int = 0,
                 source_identity: str = "ipc") -> None:
        group_id, orphan_id, token = GROUP_CLAIM_KEY.unpack_from(
            counters.get_key(claim_counter_id))
        d = log.descriptor
        self._member = _Member(
            log.buffer, d.term_length, d.initial_term_id, counters.values,
            counters.counter_offset(group_id), counters.counter_offset(claim_counter_id),
            counters.counter_offset(orphan_id), token)
        self.claim_counter_id = claim_counter_id
        # the image itself only looks at the group position (what a reader waiting for data
        # sleeps on); the member core claims and delivers
        super().__init__(log, Position(counters.values, counters.counter_offset(group_id)),
                         correlation_id=correlation_id,
                         subscription_registration_id=subscription_registration_id,
                         source_identity=source_identity)
        # a member claims whole messages only: the leading fragments of one whose next
        # fragment is missing (awaiting a retransmission) must not wake a waiting member
        self._whole_messages = True
        self._member._image = weakref.proxy(self)

    @property
    def position(self) -> int:
        """The group's claim position: everything before it was claimed by some member."""
        return self._member.position

    @position.setter
    def position(self, value: int) -> None:
        raise AttributeError("a group's position moves only by its members' claims")

    @property
    def claim(self) -> tuple[int, int]:
        """This member's claim record (start, end): it owns [start, end) while start < end."""
        return self._member.claim

    @property
    def handed_on(self) -> bool:
        """True while the handler gets the first message of a claim handed on from a member
        that left: that member may have been handling it when it went."""
        return self._member.handed_on

    def poll(self, handler: FragmentHandler, fragment_limit: int) -> int:
        """Deliver this member's claim to ``handler(buffer, header)``: the rest of an
        unfinished one, else a claim handed on from a member that left, else a new run of
        whole messages of up to ``fragment_limit`` fragments (more only to finish a
        fragmented message). A message is done when its last fragment's handler returns; if
        a handler raises, its message counts as done, the exception propagates and the rest
        of the claim is delivered by the next poll. Returns the number of fragments."""
        return self._member.poll(handler, fragment_limit)

    def controlled_poll(self, handler: Callable[[memoryview, Header], Any],
                        fragment_limit: int) -> int:
        """Not for group members: raises TypeError (a claim is delivered whole)."""
        raise TypeError(_WHOLE_CLAIMS)

    def poll_batch(self, handler: Callable[[FragmentBatch], Any], fragment_limit: int) -> int:
        """Not for group members: raises TypeError (a claim is delivered whole)."""
        raise TypeError(_WHOLE_CLAIMS)

    def close(self) -> None:
        """Stop reading; the driver hands what this member had not done to another. Idempotent."""
        self._member._close_core()
        super().close()


class GroupSubscription(Subscription):
    """A member of the subscription group ``group`` on a channel and stream: each message goes
    to exactly one member (at least once, see the module docs). Made by
    ``Client.add_subscription(..., group=name)``; ``images`` are :class:`GroupImage`."""

    # a claim handed on from a departed member does not ring the data word of a sleeper
    _wait_slice_s = _HANDED_ON_CHECK_S

    def __init__(self, channel: str, stream_id: int, group: str, **kwargs: Any) -> None:
        super().__init__(channel, stream_id, **kwargs)
        self.group = group

    def poll(self, handler: FragmentHandler, fragment_limit: int = 10,
             timeout: float | None = 0) -> int:
        """Call ``handler(buffer, header)`` for the fragments of whole messages this member
        claims, up to about ``fragment_limit`` in all (a fragmented message is delivered
        whole); see :meth:`GroupImage.poll`. With ``timeout`` (seconds; None: forever), sleep
        until there is something to claim, at most that long. Returns the number of
        fragments; raises the client's error once it failed (driver or client timeout)."""
        fragments = self._claim(handler, fragment_limit)
        if fragments:
            return fragments
        if timeout == 0:
            self.wait(0)  # raises the client's failure, as a plain poll does
            return 0
        deadline = deadline_after(timeout)
        while (remaining := deadline - time.monotonic()) > 0 and not self.is_closed:
            self.wait(min(remaining, self._wait_slice_s))
            fragments = self._claim(handler, fragment_limit)
            if fragments:
                return fragments
        self._ended()  # closed by the client's failure: raises it
        return 0

    def _claim(self, handler: FragmentHandler, fragment_limit: int) -> int:
        return self._each_image(GroupImage.poll, handler, fragment_limit)

    def messages(self, timeout: float | None = 1.0) -> Iterator[bytes]:
        """Whole messages this member claims, as bytes, until none arrives for ``timeout``
        seconds (None: until closed). Sleeps while there is nothing to claim. A message counts
        as done when it is taken from its claim, just before it is yielded (see the module
        docs)."""
        take, idle_since = self._take, None
        while not self._ended():
            message = take()
            if message is not None:
                idle_since = None
                yield message
                continue
            now = time.monotonic()
            idle_since = now if idle_since is None else idle_since
            remaining = None if timeout is None else idle_since + timeout - now
            if remaining is not None and remaining <= 0:
                return
            self.wait(_HANDED_ON_CHECK_S if remaining is None
                      else min(remaining, _HANDED_ON_CHECK_S))

    def _take(self) -> bytes | None:
        """The next whole message this member claims, or None: claims one message at most,
        from the images round-robin (natively: one call per image)."""
        for image in self._images_round_robin():
            message: bytes | None = image._member.take()
            if message is not None:
                return message
        return None

    def controlled_poll(self, handler: Callable[[memoryview, Header], Any],
                        fragment_limit: int = 10, timeout: float | None = 0) -> int:
        """Not for group members: raises TypeError."""
        raise TypeError(_WHOLE_CLAIMS)

    def poll_batch(self, handler: Callable[[FragmentBatch], Any],
                   fragment_limit: int = 4096) -> int:
        """Not for group members: raises TypeError."""
        raise TypeError(_WHOLE_CLAIMS)

    def __repr__(self) -> str:
        return (f"GroupSubscription(channel={self.channel!r}, stream_id={self.stream_id}, "
                f"group={self.group!r}, images={len(self.images)})")
