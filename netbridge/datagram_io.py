"""Datagram I/O in batches, for the netbridge process: one recvmmsg per socket and duty cycle,
one sendmmsg per batch of DATA (natively: :func:`netbridge.shared_log.receive_batch` and
:meth:`netbridge.shared_log.DataBatch.send`).

Where the kernel has UDP segmentation, a run of equal-length datagrams goes out as one
segmented send (UDP_SEGMENT: one trip through the stack, the same datagrams on the wire).
They are received uncoalesced (no UDP_GRO): coalesced receiving makes a stream of small
messages stop and go at the receiver window.

Receiving: DATA that continues one of a receiver's images exactly at its high-water mark
(:func:`netbridge.placement.in_order`, for
:meth:`netbridge.receiver.NetworkReceiver.in_order_images`) is validated and copied into the
image log natively, and the image is told the result once per batch. From the first datagram
of an image that is anything else (loss, a retransmit, a heartbeat, a SETUP, data past the
window) every later datagram of that image in the batch goes to the sans-IO state machine, in
the order it came; after a datagram that concerns no single image, every later one does. An
image's state depends only on its own datagrams, so the protocol rules end up exactly where one
datagram at a time takes them. With an incoming loss filter every datagram goes through it and
then to the state machine.

Sending: a :class:`netbridge.shared_log.DataBatch` goes out with one sendmmsg straight from the log
(or, through an outgoing loss filter, datagram by datagram); other datagrams with sendto. A
full socket buffer is loss, recovered by NAK as any other. (In its busy window the bridge's
spin sends a publisher's new DATA itself, the same way: see _io.busy_poll.)

Authenticated channels: with a socket's :class:`netbridge._io.Sealer`, every datagram is opened
natively as it is received (one that does not open is dropped and counted there, and named to
``on_drops``) and sealed as it is sent, DATA batches natively, others by :func:`send_to`.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence
from typing import cast

from netbridge._io import Sealer
from netbridge.log_port import Datagrams
from netbridge.loss_filter import LossFilter
from netbridge.receiver import NetworkReceiver
from netbridge.shared_log import DataBatch, receive_batch

#: datagrams taken per receive (one recvmmsg), each into a slot of 64 KiB
RECEIVE_BATCH = 64
_SLOT = 65536


class DatagramIO:
    """The receive slots of one netbridge and its send and receive calls (one thread)."""

    def __init__(self) -> None:
        self._slots = bytearray(RECEIVE_BATCH * _SLOT)
        self._view = memoryview(self._slots)

    def receive(self, sock: socket.socket, now: int,
                handle: Callable[[memoryview, object], None],
                receiver: NetworkReceiver | None = None, loss: LossFilter | None = None,
                sealer: Sealer | None = None,
                on_drops: Callable[[list[tuple[int, object]]], None] | None = None
                ) -> tuple[int, int]:
        """Take up to RECEIVE_BATCH datagrams from ``sock``; returns how many came and how many
        of them went to ``handle``. In-order data of ``receiver``'s images is placed natively
        (without a loss filter); every other datagram is handed to ``handle`` with its source,
        in order, as a memoryview valid only until ``handle`` returns (through ``loss`` first
        when given). With ``sealer`` each is opened first; those that do not open go to
        ``on_drops`` as (drop kind, source)."""
        images = receiver.in_order_images() if receiver is not None and loss is None else []
        received, in_order, rest, dropped = receive_batch(sock.fileno(), self._slots, [
            (image.log, image.rcv_hwm, image.window_limit) for image in images], sealer)
        if dropped and on_drops is not None:
            on_drops(cast("list[tuple[int, object]]", dropped))
        for image, result in zip(images, in_order, strict=True):
            if result is not None:
                image.on_in_order_data(now, *result)
        view = self._view
        for offset, size, source in rest:
            if loss is None:
                handle(view[offset:offset + size], source)
            else:
                for data, address in loss.send(now, view[offset:offset + size], source):
                    handle(memoryview(data), address)
        if rest and receiver is not None:
            for image in receiver.images.values():  # readers of data the receiver placed
                image.log.wake_readers()
        return received, len(rest)

    @staticmethod
    def send(sock: socket.socket, datagrams: Sequence[tuple[bytes | memoryview | Datagrams,
                                                            object]],
             now: int, loss: LossFilter | None = None, sealer: Sealer | None = None) -> int:
        """Send each (datagram or batch of them, destination), sealed with ``sealer``;
        returns how many entries."""
        for data, destination in datagrams:
            each: Sequence[bytes | memoryview]
            if isinstance(data, DataBatch) and loss is None:
                data.send(sock.fileno(), cast("tuple[str, int]", destination), sealer)
                continue
            if isinstance(data, bytes | memoryview):
                each = (data,)
            else:
                each = data.datagrams()
            for datagram in each:
                if loss is None:
                    send_to(sock, datagram, destination, sealer)
                else:
                    for out, address in loss.send(now, datagram, destination):
                        send_to(sock, out, address, sealer)
        return len(datagrams)


def send_to(sock: socket.socket, data: bytes | memoryview, destination: object,
            sealer: Sealer | None = None) -> None:
    """sendto, sealed with ``sealer``, that treats a full socket buffer and an unreachable
    peer as loss (the receiver NAKs it; status messages say who is there)."""
    if sealer is not None:
        data = sealer.seal(data)
    try:
        sock.sendto(data, destination)  # type: ignore[call-overload]
    except OSError:
        pass


def release_held(now: int, sock: socket.socket, sealer: Sealer | None,
                 loss_out: LossFilter | None, loss_in: LossFilter | None,
                 deliver: Callable[[bytes, object], None]) -> tuple[int, int | None]:
    """What a channel's loss filters held back and is due at ``now``: ``loss_out``'s datagrams
    sent on ``sock`` (sealed with ``sealer``), then ``loss_in``'s handed to ``deliver`` with
    their source. Returns how many, and when either filter holds the next one (None:
    neither holds any)."""
    count = 0
    deadline: int | None = None
    for loss, outgoing in ((loss_out, True), (loss_in, False)):
        if loss is None:
            continue
        for data, address in loss.due(now):
            count += 1
            if outgoing:
                send_to(sock, data, address, sealer)
            else:
                deliver(data, address)
        next_loss = loss.next_deadline()
        if next_loss is not None:
            deadline = next_loss if deadline is None else min(deadline, next_loss)
    return count, deadline

