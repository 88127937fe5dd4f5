"""The netbridge process: the socket layer around the sans-IO sender and receiver.

It is a client of its bus's driver with extra rights (it registers as the bridge). The driver
tells it about publications on udp channels (it sends them from their logs) and subscriptions
on udp channels (it listens on their endpoints and asks the driver for an image log when a
SETUP arrives). Here is the loop, which runs the bridge's duties in turn:

* the driver's side, its commands, events and counters: :mod:`netbridge.driver_link`;
* the send side, one socket per endpoint and key with the publications sent on it:
  :mod:`netbridge.send_channels`;
* the receive side, one socket per endpoint with the images rebuilt from it:
  :mod:`netbridge.receive_channels`;
* authenticated channels' keys: :class:`netbridge.sealing.ChannelSealers`.

The protocol's rules live elsewhere:

* what a sender sends and when, and what a receiver answers, places and NAKs: the sans-IO
  state machines :mod:`netbridge.sender`, :mod:`netbridge.receiver` and
  :mod:`netbridge.receiver_image` (with :mod:`netbridge.flow_control`,
  :mod:`netbridge.congestion_control`, :mod:`netbridge.loss_detector`), which touch logs only
  through :mod:`netbridge.log_port`;
* where a received datagram goes in an image: :mod:`netbridge.placement`;
* who a multi-destination-cast channel sends to: :mod:`netbridge.destinations`, fed by the
  send side (which reads each control datagram's type and key to route it); a dynamic MDC
  receiver's announcements, status messages for no stream, the receive side sends itself;
* the frame layout on the wire: :mod:`netbridge.frames`;
* the per-frame loops over logs and datagrams (the sender's scan into datagrams, the
  receiver's check of frame headers and copy into the log): native, behind
  :mod:`netbridge.shared_log`, the ports over the shared-memory logs;
* two fast paths the bridge runs natively as batches of those same steps, accounted by the
  state machines: in-order DATA placed as it is received (:mod:`netbridge.datagram_io`,
  ``ReceiverImage.on_in_order_data``), and a sender's new DATA scanned and sent by the busy
  spin (:meth:`Bridge.run`, ``NetworkSender.spin_send`` and ``on_data_sent``).

Authenticated channels (``key=<name>``): each of their sockets has a Sealer
(:mod:`netbridge.sealing`) that seals what it sends and opens what it receives, before any
protocol rule sees a datagram; the keyring (``Context.keyring``) is reread when it changes.
A receive endpoint is keyed or not by its first subscription's channel, and a send channel is
one socket per endpoint and key.

Start it by hand with ``netbridge --dir DIR``, or let the driver start it when the first udp
channel appears.
"""

from __future__ import annotations

import dataclasses
import os
import select
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from netbridge import _io
from netbridge.datagram_io import DatagramIO
from netbridge.driver_link import DriverLink
from netbridge.loss_filter import LossFilter, LossSpec
from netbridge.receive_channels import ProgressWatch, ReceiveChannels
from netbridge.sealing import ChannelSealers, KeyringError, KeyringWatch
from netbridge.send_channels import DataWatch, SendChannels
from netbridge.shared_log import sent
from shmbus.settings.context import Context
from shmbus.settings.errors import ShmbusError
from shmbus.settings.keyring import keyring_path
from shmbus.shm import control_protocol as cp
from shmbus.shm.log_watchers import new_log_watcher

#: driver events are serviced, and channel statistics mirrored, at most this often (not at
#: every duty cycle: under load a duty cycle takes a few microseconds)
_SERVICE_INTERVAL_NS = 200_000
_STATS_INTERVAL_NS = 1_000_000
#: with nothing to do the bridge sleeps until a datagram, a publisher's frame where a sender
#: waits, subscribers reading up to where a status message falls due, or its next deadline,
#: but at most this long: driver events (new channels) have no wake-up of their own
_IDLE_WAIT_MAX_NS = 20_000_000
#: the keyring file is looked at this often for a change
_KEYRING_CHECK_NS = 1_000_000_000
#: the log watcher's (data, progress) watches: see Bridge._watches
Watches = tuple[tuple[DataWatch, ...], tuple[ProgressWatch, ...]]


class Bridge:
    """The netbridge of one bus. ``run()`` serves until the driver goes away or stop()."""

    def __init__(self, context: Context) -> None:
        self.context = context.with_(embedded_driver=False)
        self._loss_spec = LossSpec.parse(context.netbridge_loss)
        self._busy_window_ns = int(context.netbridge_busy_window * 1e9)
        self._stopped = False
        self._next_service_ns = 0
        self._next_stats_ns = 0
        self._next_keyring_check_ns = 0
        #: poll every sender and receiver in the next duty cycle (after driver events)
        self._poll_all = True
        #: wakes the loop when a publisher commits a frame where a sender waits for data, or
        #: subscribers read up to where a status message falls due
        self._watcher = new_log_watcher()
        #: the fds the loop polled last and a poll object on them (see _polled)
        self._poller: tuple[tuple[int, ...], select.poll] | None = None
        self.driver = DriverLink(self.context)
        self.sealers = ChannelSealers(KeyringWatch(keyring_path(context.keyring)),
                                      self.driver.report)
        io = DatagramIO()
        self.sending = SendChannels(
            self.driver, io, self.sealers, self._watcher, self._loss_filters,
            socket_buffer=context.netbridge_socket_buffer,
            connection_timeout_ns=int(context.publication_connection_timeout * 1e9))
        self.receiving = ReceiveChannels(
            self.driver, io, self.sealers, self._watcher, self._loss_filters,
            socket_buffer=context.netbridge_socket_buffer,
            endpoint_linger_ns=int(context.netbridge_endpoint_linger * 1e9),
            unscheduled_poll_ns=_IDLE_WAIT_MAX_NS)
        #: the side each driver event is for (the bridge ignores the others)
        self._event_handlers: dict[type[cp.Message], Callable[[Any], None]] = {
            cp.OnNetworkPublication: self.sending.add_publication,
            cp.OnNetworkPublicationClosed: self.sending.close_publication,
            cp.OnDestination: self.sending.on_destination,
            cp.OnReceiveChannel: self.receiving.add_subscription,
            cp.OnReceiveChannelClosed: self.receiving.remove_subscription,
            cp.OnImageSubscribers: self.receiving.on_image_subscribers,
        }

    def _loss_filters(self) -> tuple[LossFilter | None, LossFilter | None]:
        """(outgoing, incoming) filters for a new channel, each with its own seed."""
        spec = self._loss_spec
        if spec is None:
            return None, None
        count = 2 * (len(self.sending.channels) + len(self.receiving.channels))
        out = LossFilter(dataclasses.replace(spec, seed=spec.seed * 1000 + count))
        into = LossFilter(dataclasses.replace(spec, seed=spec.seed * 1000 + count + 1))
        return (out if spec.outgoing else None), (into if spec.incoming else None)

    # -- the duty cycle ------------------------------------------------------------------------

    def do_work(self, now: int, readable: set[int] | None = None) -> tuple[int, int]:
        """One duty cycle; returns (work done, when to come back at the latest). ``readable``:
        the file descriptors of the sockets that have datagrams (None: try every socket).

        In the order a datagram's latency wants: what came in (DATA, which wakes subscribers,
        then control, which moves senders' limits); the CPU offered to the subscribers just
        woken (one may answer at once, and its answer goes out below); what goes out (DATA,
        then receivers' NAKs and status messages); then driver events, statistics and the loss
        filters' timers."""
        stats = now >= self._next_stats_ns
        if stats:
            self._next_stats_ns = now + _STATS_INTERVAL_NS
        poll_all = stats or self._poll_all
        self._poll_all = False
        work = self.receiving.receive(now, readable)
        if work:  # a subscriber the data woke may be waiting for this core
            os.sched_yield()
        work += self.sending.receive(now, readable)
        deadline = now + _IDLE_WAIT_MAX_NS
        sent_work, deadline = self.sending.poll(now, deadline, stats=stats, poll_all=poll_all)
        polled_work, deadline = self.receiving.poll(now, deadline, stats=stats,
                                                    poll_all=poll_all)
        work += sent_work + polled_work
        if now >= self._next_service_ns:
            self._next_service_ns = now + _SERVICE_INTERVAL_NS
            work += self.driver.service()
        if now >= self._next_keyring_check_ns:
            self._next_keyring_check_ns = now + _KEYRING_CHECK_NS
            self.sealers.reread([*self.sending.channels.values(),
                                 *self.receiving.channels.values()])
        if self.driver.has_events:  # channels, destinations, subscriptions changed
            self._poll_all = True
            deadline = now
            work += self._handle_driver_events()
        for side in (self.sending, self.receiving):
            held, deadline = side.release_held(now, deadline)
            work += held
        return work, deadline

    def _handle_driver_events(self) -> int:
        """Handle the driver's events in order (those a request made meanwhile brings too);
        returns how many."""
        handled = 0
        while (event := self.driver.next_event()) is not None:
            handled += 1
            try:
                self._on_driver_event(event)
            except OSError as e:  # e.g. an endpoint another process holds: report, go on
                print(f"netbridge: {type(event).__name__}: {e}", file=sys.stderr)
            except KeyringError as e:  # a publication whose key cannot seal: it never connects
                self.driver.report(f"{type(event).__name__}: {e}")
        return handled

    def _on_driver_event(self, message: cp.Message) -> None:
        handler = self._event_handlers.get(type(message))
        if handler is not None:
            handler(message)

    # -- the loop ------------------------------------------------------------------------------

    def run(self) -> None:
        """Serve until stop() or the driver goes away; then close(). After work it spins for
        ``Context.netbridge_busy_window`` (natively, yielding the CPU at every turn: see
        _io.busy_poll) until a socket is readable, a publisher commits where a sender
        waits, or a timer is due; a sender's DATA the spin sends itself when its poll would do
        nothing else, and spins on. With nothing to do, it sleeps in poll() on its sockets and
        the log watcher's fd until the next deadline."""
        watcher = self._watcher
        watching: Watches | None = None
        readable: set[int] | None = None  # the first cycle tries every socket
        busy_until = 0
        try:
            while not self._stopped:
                now = time.monotonic_ns()
                work, deadline = self.do_work(now, readable)
                if work:
                    busy_until = now + self._busy_window_ns
                if work or now < busy_until:  # spin natively until there is something to do
                    if watching is not None:  # awake: publishers need not wake anyone
                        watcher.disarm()
                        watching = None
                    while True:  # a sender the spin sent for needs no duty cycle
                        data, sends, sending = self.sending.spin_sends()
                        found, spun = _io.busy_poll(self._polled()[0], data,
                                                    self.receiving.progress_watches(),
                                                    min(busy_until, deadline), sends)
                        if not spun:
                            break
                        now = time.monotonic_ns()
                        more = self.sending.on_data_sent(sending[spun[0]], now, sent(spun[1:]))
                        busy_until = now + self._busy_window_ns
                        if more or now >= self._next_service_ns:
                            break  # its poll, or the driver's events, are due
                    readable = set(found or ())
                else:
                    watches = self._watches()
                    if watches != watching:  # else it still watches just these
                        watcher.arm(*watches)
                        watching = watches
                    if _io.busy_poll((), *watches, 0)[0] is not None:
                        # a frame or a reader came since the duty cycle (arm leaves out a
                        # watch that is ready: it would never fire): no sleep
                        timeout_ms = 0
                    else:
                        timeout_ns = min(deadline - time.monotonic_ns(), _IDLE_WAIT_MAX_NS)
                        timeout_ms = max(0, -(-timeout_ns // 1_000_000))  # rounded up
                    readable = {fd for fd, _ in self._polled()[1].poll(timeout_ms)}
                    if watching is not None and watcher.clear():  # it fired; it is disarmed
                        watching = None
        except ShmbusError as e:  # the driver went away: nothing left to bridge
            print(f"netbridge: stopping: {e}", file=sys.stderr)
        finally:
            self.close()

    def stop(self) -> None:
        self._stopped = True

    def _polled(self) -> tuple[tuple[int, ...], select.poll]:
        """The fds the loop polls (the watcher's, then every socket's) and a poll object on
        them, made again when channels were opened or closed since."""
        fds = (self._watcher.fileno(),
               *(sock.fileno() for sock in [*self.sending.sockets(), *self.receiving.sockets()]))
        if self._poller is None or self._poller[0] != fds:
            poller = select.poll()
            for fd in fds:
                poller.register(fd, select.POLLIN)
            self._poller = (fds, poller)
        return self._poller

    def _watches(self) -> Watches:
        """What the log watcher wakes the bridge for: where senders wait for a publisher's
        next frame, and how far each image's subscribers must read for a status message to
        fall due."""
        return self.sending.data_watches(), self.receiving.progress_watches()

    def close(self) -> None:
        self._watcher.close()
        self.sending.close()
        self.receiving.close()
        self.driver.close()


def run_bridge(context: Context) -> None:
    """Run a netbridge for ``context.dir`` until SIGINT/SIGTERM or the driver goes away."""
    bridge = Bridge(context)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: bridge.stop())
    bridge.run()


def embedded_main() -> None:
    """How the driver starts a netbridge: the context as JSON in ``sys.argv[1]``."""
    run_bridge(Context.from_json(sys.argv[1]) if len(sys.argv) > 1 else Context())
