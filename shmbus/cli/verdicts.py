"""What limits a publication now (held by its slowest reader, free with room left, or not
connected), how a network image's subscribers keep up, and the rules a view read live keeps.

The positions a snapshot reads agree by construction
(:func:`shmbus.cli.snapshot.read_publication`): lag >= 0, free <= window, and pub-pos -
pub-lmt is below one claim (a message may end past the limit); :func:`stream_problems` checks
a view against them.
"""

from __future__ import annotations

from collections.abc import Sequence

from shmbus.cli.formatting import format_bytes
from shmbus.cli.stream_views import (
    FREE,
    HELD,
    NOT_CONNECTED,
    RECEIVING,
    UNKNOWN,
    ReceiverView,
    SenderView,
    StreamView,
    SubscriberView,
    Verdict,
)


def verdict(pub_pos: int | None, pub_lmt: int | None, window: int | None,
            subscribers: Sequence[SubscriberView],
            sender: SenderView | None = None) -> Verdict:
    """What limits one publisher now.

    Its limit is the slowest of its counted subscribers (and, on a network channel, of its
    sender once a receiver is connected) plus the window; the publisher raises pub-lmt up to
    there itself. It is held, by the slowest, once its position reaches pub-lmt or the
    slowest is a window behind; otherwise it is free, with window - (pub-pos - slowest) left
    to write (without a window: pub-lmt - pub-pos). Subscribers that are not counted never
    hold it.
    """
    counted = [s for s in subscribers if s.counted]
    sender_counts = sender is not None and sender.position is not None and (
        sender.connected is not False)
    if not counted and not sender_counts:
        if sender is not None:
            return Verdict(NOT_CONNECTED, "not connected: no receiver has answered the sender")
        return Verdict(NOT_CONNECTED, "not connected: no subscriber")
    if pub_pos is None or pub_lmt is None:
        return Verdict(UNKNOWN, "unknown: the pub-pos or pub-lmt counter is missing")
    positions = [s.position for s in counted]
    if sender_counts:
        assert sender is not None and sender.position is not None
        positions.append(sender.position)
    slowest = min(positions)
    room = window - (pub_pos - slowest) if window is not None else pub_lmt - pub_pos
    if pub_pos < pub_lmt and room > 0:
        return Verdict(FREE, f"free: {format_bytes(room)} of window left", free=room)
    held_by = tuple(s for s in counted if s.position == slowest)
    by_sender = sender_counts and sender is not None and sender.position == slowest
    names = []
    if by_sender:
        assert sender is not None
        holder = sender.holding_receiver
        if not sender.at_limit:
            names.append("the sender")
        elif holder is None:
            names.append("the sender (waiting at snd-lmt for the receivers)")
        else:
            names.append(f"the sender (waiting at snd-lmt for {holder.who} at "
                         f"{holder.position:,}, fc {sender.flow_control})")
    if held_by:
        noun = "subscriber" if len(held_by) == 1 else "subscribers"
        names.append(f"{noun} " + ", ".join(s.who for s in held_by))
    window_text = f"; window {format_bytes(window)}" if window is not None else ""
    sentence = (f"held by {' and '.join(names)}, {format_bytes(pub_pos - slowest)} "
                f"behind{window_text}")
    return Verdict(HELD, sentence, held_by, by_sender)


def stream_problems(view: StreamView, max_claim: int) -> list[str]:
    """How a publication's view breaks the rules its snapshot guarantees (empty: none).

    The rules, for a view whose positions were read live (``position_source`` "log"): every
    subscriber's lag is >= 0 (an image's too), and the sender's; while connected, pub-pos -
    pub-lmt is below ``max_claim`` (the longest claim a publisher makes: one message's
    frames, rounded up); free is within (0, window]; a held verdict names the slowest counted
    reader, and only it.
    """
    if view.position_source != "log":
        return []
    head = "rcv-pos" if view.kind == "image" else "pub-pos"
    problems = [f"{s.who} is {format_bytes(-s.lag)} ahead of {head}"
                for s in view.subscribers if s.lag < 0]
    if view.pub_pos is None:
        return problems
    sender = view.sender
    if sender is not None and sender.position is not None and sender.position > view.pub_pos:
        problems.append(f"snd-pos {sender.position:,} is ahead of pub-pos {view.pub_pos:,}")
    v = view.verdict
    if v.state in (HELD, FREE) and view.pub_lmt is not None and (
            view.pub_pos - view.pub_lmt >= max_claim):
        problems.append(f"pub-pos {view.pub_pos:,} is a claim or more past pub-lmt "
                        f"{view.pub_lmt:,}")
    if v.state == FREE and (v.free is None or not 0 < v.free <= (view.window or 0)):
        problems.append(f"free {v.free} is not within the window {view.window}")
    if v.state == HELD:
        counted = [s.position for s in view.subscribers if s.counted]
        if v.held_by_sender and sender is not None and sender.position is not None:
            counted.append(sender.position)
        slowest = min(counted, default=None)
        if not (v.held_by or v.held_by_sender):
            problems.append(f"held, but the verdict names no holder: {v.sentence}")
        elif any(s.position != slowest for s in v.held_by):
            problems.append(f"the verdict names a holder that is not the slowest counted "
                            f"reader (at {slowest}): {v.sentence}")
    return problems


def image_verdict(receiver: ReceiverView, subscribers: Sequence[SubscriberView]) -> Verdict:
    """How the subscribers of a network image keep up with what the netbridge received."""
    gap = ""
    if receiver.hwm is not None and receiver.position is not None and (
            receiver.hwm > receiver.position):
        gap = (f"; {format_bytes(receiver.hwm - receiver.position)} between rcv-pos and "
               f"rcv-hwm (loss being repaired)")
    if not subscribers:
        return Verdict(NOT_CONNECTED, f"no subscriber{gap}")
    slowest = subscribers[0]  # sorted by position
    held_by = tuple(s for s in subscribers if s.position == slowest.position)
    return Verdict(RECEIVING, f"receiving; slowest subscriber {slowest.who}, "
                              f"{format_bytes(slowest.lag)} behind rcv-pos{gap}", held_by)

