"""A client's conversation with its driver: commands out, answers and events in, its lease.

:class:`ConductorProxy` talks to the driver through cnc.dat: commands on the to-driver ring
buffer (then it rings the driver's doorbell), answers and events on the broadcast buffer (the
driver rings the clients' doorbell). Its conductor thread, asleep on that doorbell between
events, runs its client's duty cycle as Aeron's client conductor does, so images appear and go
and a dead driver is noticed whether or not the application ever polls. A request waits for
the conductor thread to hand it its answer; without a conductor thread (invoker mode), or on
that thread, it runs the duty cycle itself until the answer comes. The heartbeat that keeps the
client's lease runs in a native thread without the GIL.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from shmbus.settings.context import Context
from shmbus.settings.errors import DriverTimeoutError, RegistrationError, ShmbusError
from shmbus.shm import control_protocol as cp
from shmbus.shm._native import Heartbeat, epoch_ms
from shmbus.shm.broadcast import BroadcastReceiver
from shmbus.shm.cnc import (
    CLIENTS_DOORBELL_OFFSET,
    COUNTERS_METADATA,
    COUNTERS_VALUES,
    DRIVER_DOORBELL_OFFSET,
    EVENTS,
    TO_DRIVER,
    CncFile,
)
from shmbus.shm.counters import REGISTRATION_ID_OFFSET, CountersReader
from shmbus.shm.doorbell import Doorbell
from shmbus.shm.position import Position
from shmbus.shm.ring_buffer import ManyToOneRingBuffer

if TYPE_CHECKING:
    from shmbus.streams.subscription import Subscription

_T = TypeVar("_T")
#: how often the driver's heartbeat is looked at (and, while reconnecting, for a new driver);
#: the longest the conductor thread sleeps between duty cycles
DRIVER_CHECK_INTERVAL_S = 0.1
#: driver events handed to the client before any answer is looked for: they are never answers
_EVENTS = (cp.OnAvailableImage, cp.OnUnavailableImage, cp.OnClientTimeout)


class ConductorProxy:
    """One client's link to the driver of its directory: the driver's cnc.dat, the command
    ring, the broadcast receiver, the counters, the client id, the heartbeat, the answers
    awaited and the conductor thread. :meth:`attach` links it to a driver, again to a new one
    after the old one died (the client id, heartbeat and counters are the new driver's then).

    Its owner (the client) gives it its duty cycle (``service``, which handles events by
    :meth:`receive`), its check of whether requests may still wait (``check``, raising the
    reason they may not) and what to do once the driver timed the client out (``timed_out``).
    They are held weakly: the proxy never keeps its client alive, so an abandoned client is
    still collected, and then its conductor thread ends.
    """

    #: the driver's cnc.dat (the new driver's once reconnected)
    cnc: CncFile
    #: the driver's counters
    counters: CountersReader
    #: this client's id at the driver
    client_id: int
    #: the counter the heartbeat stores the time in; its registration id is the client id
    heartbeat_counter_id: int
    #: the clients' doorbell, which the driver rings after it broadcast
    clients_bell: Doorbell

    def __init__(self, context: Context, *, service: Callable[[], int],
                 check: Callable[[], None], timed_out: Callable[[], None]) -> None:
        self.context = context
        #: the client's lock: its state, held while events are handled
        self.lock = threading.RLock()
        #: notified when answers arrive, and whenever waiting requests should look again
        self.answered = threading.Condition(self.lock)
        self._service = _weakly(service)
        self._check = _weakly(check)
        self._timed_out = _weakly(timed_out)
        self._responses: dict[int, cp.Message] = {}
        self._awaiting: set[int] = set()
        self._driver_timeout_ms = int(context.driver_timeout * 1000)
        self._next_driver_check = 0.0
        self._heartbeat: Heartbeat | None = None
        self._thread: threading.Thread | None = None
        #: set by close: no heartbeat, no conductor thread
        self.closed = False

    def attach(self, cnc: CncFile) -> None:
        """Map the driver's cnc.dat and introduce this client to it (a new client id, a
        heartbeat). Raises as :meth:`request` does."""
        self.cnc = cnc
        self._to_driver = ManyToOneRingBuffer(cnc.section(TO_DRIVER))
        self._to_clients = BroadcastReceiver(cnc.section(EVENTS))
        self.counters = CountersReader(cnc.section(COUNTERS_METADATA),
                                       cnc.section(COUNTERS_VALUES))
        self._driver_bell = cnc.doorbell(DRIVER_DOORBELL_OFFSET)
        self.clients_bell = cnc.doorbell(CLIENTS_DOORBELL_OFFSET)
        self.client_id = self._to_driver.next_correlation_id()
        ready = self.request(cp.ClientConnect(self.client_id, self.correlation(), os.getpid(),
                                              _process_name()))
        assert isinstance(ready, cp.OnClientReady)
        self.heartbeat_counter_id = ready.heartbeat_counter_id
        self._heartbeat = Heartbeat(self.counters.values,
                                    self.counters.counter_offset(ready.heartbeat_counter_id),
                                    self.context.keepalive_interval, owner_id=self.client_id)

    def start(self) -> None:
        """Start the conductor thread (without it, the owner runs its duty cycle itself)."""
        self._thread = threading.Thread(
            target=_run_conductor, args=(weakref.ref(self),),
            name=f"shmbus-conductor-{self.client_id}", daemon=True)
        self._thread.start()

    def on_duty_thread(self) -> bool:
        """Whether the calling thread runs the duty cycle: the conductor thread, or any thread
        in invoker mode."""
        return self._thread is None or threading.current_thread() is self._thread

    # -- commands ------------------------------------------------------------------------------

    def correlation(self) -> int:
        """A correlation id no other command of this driver's clients has."""
        return self._to_driver.next_correlation_id()

    def request(self, command: cp.Message) -> cp.Message:
        """Send a command and wait for the driver's answer (at most driver_timeout seconds).

        Raises RegistrationError for the driver's refusal, DriverTimeoutError without an
        answer, and what the owner's ``check`` raises (the client failed, closed or lost its
        driver) while it waits.
        """
        correlation_id = command.correlation_id  # type: ignore[attr-defined]
        with self.lock:
            self._awaiting.add(correlation_id)
        try:
            deadline = time.monotonic() + self.context.driver_timeout
            while not self._to_driver.write(command.TYPE_ID, command.encode()):
                if time.monotonic() > deadline:
                    raise DriverTimeoutError(f"the driver in {Path(self.context.dir)} is not "
                                             f"reading commands (its queue stayed full)")
                time.sleep(0.001)
            self._driver_bell.ring()
            if self.on_duty_thread():
                self._service_until_answered(correlation_id, deadline)
            else:
                self._wait_for_answer(correlation_id, deadline)
            with self.lock:
                response = self._responses.pop(correlation_id)
        finally:
            with self.lock:
                self._awaiting.discard(correlation_id)
                self._responses.pop(correlation_id, None)
        if isinstance(response, cp.OnError):
            raise RegistrationError(response.code, response.message)
        return response

    def send(self, command: cp.Message) -> None:
        """Send without waiting for the answer (removals). DriverTimeoutError when the
        driver's command ring is full."""
        if not self._to_driver.write(command.TYPE_ID, command.encode()):
            raise DriverTimeoutError(f"the driver in {Path(self.context.dir)} is not reading "
                                     f"commands")
        self._driver_bell.ring()

    def ring_driver(self) -> None:
        """Wake the driver for a duty cycle (a writer waiting for it to free blocks)."""
        self._driver_bell.ring()

    def _wait_for_answer(self, correlation_id: int, deadline: float) -> None:
        """Sleep until the conductor thread hands over the answer."""
        with self.answered:
            while correlation_id not in self._responses:
                self._check()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._no_answer()
                self.answered.wait(remaining)

    def _service_until_answered(self, correlation_id: int, deadline: float) -> None:
        """Run the duty cycle on this thread until the answer is among the events (invoker
        mode, or a request from inside an image callback on the conductor thread)."""
        while correlation_id not in self._responses:
            seen = self.clients_bell.value()
            if not self._service():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._no_answer()
                self.clients_bell.wait(seen, min(remaining, DRIVER_CHECK_INTERVAL_S))

    def _no_answer(self) -> None:
        raise DriverTimeoutError(f"no answer from the driver in {Path(self.context.dir)} within "
                                 f"{self.context.driver_timeout} s")

    # -- events and liveness -------------------------------------------------------------------

    def receive(self, on_event: Callable[[cp.Message], None]) -> int:
        """Take what the driver broadcast (under the lock): answers to this client's requests
        are kept for them, every other message is handed to ``on_event`` (a message of a
        newer driver this one does not know is skipped). Returns the messages taken."""
        events = 0
        receiver = self._to_clients
        while receiver.receive_next():
            events += 1
            try:
                message = cp.decode(receiver.msg_type, receiver.buffer)
            except cp.MalformedMessage:
                continue  # a newer driver's event we do not know: not ours to act on
            correlation_id = getattr(message, "correlation_id", None)
            if not isinstance(message, _EVENTS) and correlation_id in self._awaiting:
                self._responses[correlation_id] = message
            else:
                on_event(message)
        if events and self._awaiting:
            self.answered.notify_all()
        return events

    def check_due(self, now: float) -> bool:
        """Whether it is time (``time.monotonic()``) to look at the driver: at its heartbeat,
        or while reconnecting, for a new one. True at most once every
        DRIVER_CHECK_INTERVAL_S."""
        if now < self._next_driver_check:
            return False
        self._next_driver_check = now + DRIVER_CHECK_INTERVAL_S
        return True

    def driver_silence(self) -> DriverTimeoutError | None:
        """The error saying how long the driver has been silent when it has not heartbeated
        within driver_timeout; None while it does."""
        age = epoch_ms() - self.cnc.driver_heartbeat_ms()
        if age <= self._driver_timeout_ms:
            return None
        return DriverTimeoutError(
            f"the driver (pid {self.cnc.pid}) in {Path(self.context.dir)} has not heartbeated for "
            f"{age} ms (timeout {self._driver_timeout_ms} ms)")

    def lease(self, subscription: Subscription) -> None:
        """Have every poll of ``subscription`` check that the driver has not timed this client
        out (its heartbeat counter is still this client's), so a process stopped past its
        liveness learns it before it reads a log no longer held for it (the owner's
        ``timed_out`` then runs)."""
        subscription._set_lease(
            self.counters.values,
            self.counters.counter_offset(self.heartbeat_counter_id) + REGISTRATION_ID_OFFSET,
            self.client_id, self._timed_out)

    def position(self, counter_id: int) -> Position:
        """The driver's counter ``counter_id`` as a position."""
        return Position(self.counters.values, self.counters.counter_offset(counter_id))

    # -- the end -------------------------------------------------------------------------------

    def detach(self) -> None:
        """The driver died: stop the heartbeat (a new driver gets one of its own)."""
        if self._heartbeat is not None:
            self._heartbeat.stop()

    def close(self, *, goodbye: bool) -> None:
        """Done with the driver: with ``goodbye`` say so (ClientClose; a driver not reading
        commands is not waited for), then stop the heartbeat. The conductor thread ends at
        its next look (:meth:`join` wakes it)."""
        if goodbye:
            try:
                self.send(cp.ClientClose(self.client_id, self.correlation()))
            except ShmbusError:
                pass
        self.closed = True
        self.detach()

    def join(self) -> None:
        """Wake the conductor thread and wait (at most 1 s) until it ended, unless it is the
        calling thread."""
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            self.clients_bell.ring()
            thread.join(1.0)


def _run_conductor(proxy_ref: weakref.ref[ConductorProxy]) -> None:
    """The conductor thread: asleep on the clients' doorbell, it runs the client's duty cycle
    as events come and at least every DRIVER_CHECK_INTERVAL_S. It holds the proxy (and the
    client) only while it works, so an abandoned client is still collected (and the thread
    ends)."""
    while True:
        proxy = proxy_ref()
        if proxy is None or proxy.closed:
            return
        doorbell = proxy.clients_bell  # the new driver's, once the client reconnected
        seen = doorbell.value()
        try:
            if proxy._service() is None:
                return  # the client is gone
        except ShmbusError:
            return  # the client failed; every later call raises its error
        except Exception:
            # an image callback raised: report it (as Aeron's error handler does), go on
            traceback.print_exc()
        del proxy
        doorbell.wait(seen, DRIVER_CHECK_INTERVAL_S)


def _weakly(method: Callable[[], _T]) -> Callable[[], _T | None]:
    """The bound ``method`` as a callable that does not keep its object alive: it returns
    None, doing nothing, once the object is gone."""
    ref = weakref.WeakMethod(method)

    def call() -> _T | None:
        bound = ref()
        return None if bound is None else bound()
    return call


def _process_name() -> str:
    """The script's name; for ``python -c`` and multiprocessing workers, the worker's name."""
    import multiprocessing

    script = sys.argv[0] if sys.argv else ""
    if script not in ("", "-c", "-"):
        return os.path.basename(script)
    worker = multiprocessing.current_process().name
    return "python" if worker == "MainProcess" else worker
