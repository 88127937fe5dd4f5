"""Where a received DATA datagram goes in an image's log: the placement rule, pure.

The receiver (:meth:`netbridge.receiver_image.ReceiverImage.on_data`) asks :func:`placement`
about each DATA/PAD datagram that passed :meth:`netbridge.log_port.ImagePort.walk`, then hands what
is placed to its :class:`~netbridge.loss_detector.LossDetector`, which tracks the gaps and
says whether the data above the rebuild position is new (a datagram that fills nothing is a
duplicate too). What is placed is the datagram's bytes [skip, end) at its position + skip.

:func:`in_order` is the one case the bridge places natively, a batch at a time
(``netbridge._io.receive_batch``, through :func:`netbridge.shared_log.receive_batch`):
there :func:`placement` is always :attr:`Placement.PLACE` with nothing skipped, and the loss
detector only moves the high-water mark (and the rebuild position, without a gap) to the
datagram's end, which is what :meth:`~netbridge.receiver_image.ReceiverImage.on_in_order_data`
accounts for. tests/netbridge/test_placement.py checks both against a model.
"""

from __future__ import annotations

import enum

from netbridge.log_port import FrameWalk

__all__ = ["Placement", "in_order", "placement"]


class Placement(enum.Enum):
    #: copy it (what the loss detector does not take as new is a duplicate after all)
    PLACE = "place"
    #: every frame lies below the rebuild position: in the log already
    DUPLICATE = "duplicate"
    #: it ends past the window (the last status message position + the receiver window)
    OVERRUN = "overrun"
    #: it runs past the end of stream a heartbeat announced: invalid
    PAST_END = "past_end"


def placement(position: int, walk: FrameWalk, rebuild: int, window_limit: int,
              end_of_stream: int | None) -> Placement:
    """What to do with a valid datagram at stream ``position`` (see :class:`Placement`), given
    the image's rebuild position, window limit and end of stream (None until announced)."""
    if position + walk.span <= rebuild:
        return Placement.DUPLICATE
    # the window may have shrunk since the sender sent this: only data the log cannot take
    # yet is refused
    if position + walk.end > window_limit:
        return Placement.OVERRUN
    if end_of_stream is not None and position + walk.span > end_of_stream:
        return Placement.PAST_END
    return Placement.PLACE


def in_order(position: int, walk: FrameWalk, hwm: int, window_limit: int,
             end_of_stream: int | None) -> bool:
    """The datagram continues the image exactly at its high-water mark, inside the window,
    before any end of stream is announced: it is placed whole and moves the high-water mark
    to ``position + walk.span``."""
    return position == hwm and position + walk.end <= window_limit and end_of_stream is None
