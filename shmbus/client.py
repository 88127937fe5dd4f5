"""The bus client: ``shmbus.connect()`` and what it returns.

A :class:`Client` talks to the driver through cnc.dat: commands on the to-driver ring buffer,
responses and image events on the broadcast buffer. Following Aeron's invoker mode, driver
events are processed inside the application's own calls (add_*, poll, close), so callbacks run
on the caller's thread; only the heartbeat runs on its own, in a native thread without the GIL.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import psutil

from shmbus.context import Context
from shmbus.driver import control_protocol as cp
from shmbus.errors import (
    ClientClosedError,
    ClientTimeoutError,
    DriverTimeoutError,
    DriverUnavailableError,
    RegistrationError,
    ShmbusError,
)
from shmbus.idle_strategy import BackoffIdleStrategy
from shmbus.image import Image
from shmbus.publication import ConcurrentPublication, ExclusivePublication, Publication
from shmbus.shm._native import Heartbeat, epoch_ms
from shmbus.shm.broadcast import BroadcastReceiver
from shmbus.shm.bus_directory import prepare_directory
from shmbus.shm.cnc import (
    COUNTERS_METADATA,
    COUNTERS_VALUES,
    TO_CLIENTS,
    TO_DRIVER,
    CncError,
    CncFile,
)
from shmbus.shm.counters import CountersReader
from shmbus.shm.log_buffer import LogBuffer
from shmbus.shm.position import Position
from shmbus.shm.ring_buffer import ManyToOneRingBuffer
from shmbus.subscription import ImageHandler, Subscription

PublicationT = TypeVar("PublicationT", bound=Publication)

LAUNCH_LOCK = "launch.lock"
_DRIVER_CHECK_INTERVAL_S = 0.1
_live_clients: weakref.WeakSet[Client] = weakref.WeakSet()
_launched: list[subprocess.Popen[bytes]] = []


def connect(context: Context | None = None, **settings: Any) -> Client:
    """Connect to the bus in ``context.dir``, starting an embedded driver if none is alive.

    Settings come from ``context`` (a :class:`Context`, e.g. passed to a worker process), or
    from keyword arguments, then ``SHMBUS_*`` variables, then defaults. Raises
    DriverUnavailableError when no driver runs and ``embedded_driver`` is False, or when one
    cannot be started; PermissionError for a directory of another user.
    """
    if context is None:
        context = Context.resolve(**settings)
    elif settings:
        context = context.with_(**settings)
    return Client(context)


class Client:
    """A connection to a driver. Not usable after fork: connect again in the child."""

    def __init__(self, context: Context) -> None:
        self.context = context
        self.directory = Path(context.dir)
        self._pid = os.getpid()
        self._closed = False
        self._closing = False
        self.cnc = _open_or_launch(context)
        self._to_driver = ManyToOneRingBuffer(self.cnc.section(TO_DRIVER))
        self._to_clients = BroadcastReceiver(self.cnc.section(TO_CLIENTS))
        self.counters = CountersReader(self.cnc.section(COUNTERS_METADATA),
                                       self.cnc.section(COUNTERS_VALUES))
        self._driver_timeout_ms = int(context.driver_timeout * 1000)
        self._next_driver_check = 0.0
        self._responses: dict[int, cp.Message] = {}
        self._awaiting: set[int] = set()
        #: called with driver events this client does not handle itself (the netbridge's)
        self.on_driver_event: Callable[[cp.Message], None] | None = None
        self._logs: dict[str, tuple[LogBuffer, int]] = {}
        self._publications: dict[int, Publication] = {}
        self._subscriptions: dict[int, Subscription] = {}
        self._heartbeat: Heartbeat | None = None
        self.client_id = self._to_driver.next_correlation_id()
        ready = self._request(cp.ClientConnect(self.client_id, self._correlation(), os.getpid(),
                                               _process_name()))
        assert isinstance(ready, cp.OnClientReady)
        self.heartbeat_counter_id = ready.heartbeat_counter_id
        self._heartbeat = Heartbeat(self.counters.values,
                                    self.counters.counter_offset(ready.heartbeat_counter_id),
                                    context.keepalive_interval)
        _live_clients.add(self)

    # -- publications and subscriptions --------------------------------------------------------

    def add_publication(self, channel: str, stream_id: int) -> ConcurrentPublication:
        """A publication many threads and processes may share: one log per channel + stream.

        Raises RegistrationError (with the driver's code and message) for a bad channel or
        stream id, or when the driver cannot create the log (e.g. /dev/shm is full).
        """
        return self._add_publication(cp.AddPublication, ConcurrentPublication, channel,
                                     stream_id)

    def add_exclusive_publication(self, channel: str, stream_id: int) -> ExclusivePublication:
        """A publication with its own log and session, for a single writer thread."""
        return self._add_publication(cp.AddExclusivePublication, ExclusivePublication, channel,
                                     stream_id)

    def _add_publication(self, command: type[cp.AddPublication], kind: type[PublicationT],
                         channel: str, stream_id: int) -> PublicationT:
        self._check_usable()
        _check_stream_id(stream_id)
        ready = self._request(command(self.client_id, self._correlation(), stream_id, channel))
        assert isinstance(ready, cp.OnPublicationReady)
        log = self._map_log(ready.log_file)
        limit = Position(self.counters.values, self.counters.counter_offset(
            ready.limit_counter_id))
        publication = kind(log, limit, channel=channel, registration_id=ready.registration_id,
                           on_close=self._on_publication_close,
                           on_destination=self._on_destination, counters=self.counters.values)
        self._publications[ready.registration_id] = publication
        return publication

    def add_subscription(
        self,
        channel: str,
        stream_id: int,
        on_available_image: ImageHandler | None = None,
        on_unavailable_image: ImageHandler | None = None,
    ) -> Subscription:
        """Subscribe to a channel and stream; images appear as publishers do.

        The image callbacks run on the thread that polls (or calls the client).
        """
        self._check_usable()
        _check_stream_id(stream_id)
        correlation_id = self._correlation()
        subscription = Subscription(
            channel, stream_id, registration_id=correlation_id,
            on_available_image=on_available_image, on_unavailable_image=on_unavailable_image,
            service=self._service, on_close=self._on_subscription_close)
        # registered before the request: image events follow the ready response at once
        self._subscriptions[correlation_id] = subscription
        try:
            self._request(cp.AddSubscription(self.client_id, correlation_id, stream_id, channel))
        except BaseException:
            self._subscriptions.pop(correlation_id, None)
            raise
        return subscription

    # -- driver events -------------------------------------------------------------------------

    def _service(self) -> int:
        """Process driver events and check the driver is alive. Returns events handled."""
        self._check_usable()
        events = 0
        receiver = self._to_clients
        while receiver.receive_next():
            events += 1
            self._on_broadcast(receiver.msg_type, receiver.buffer)
        now = time.monotonic()
        if now >= self._next_driver_check:
            self._next_driver_check = now + _DRIVER_CHECK_INTERVAL_S
            age = epoch_ms() - self.cnc.driver_heartbeat_ms()
            if age > self._driver_timeout_ms:
                self._fail(DriverTimeoutError(
                    f"the driver (pid {self.cnc.pid}) in {self.directory} has not "
                    f"heartbeated for {age} ms (timeout {self._driver_timeout_ms} ms)"))
        return events

    def _on_broadcast(self, msg_type: int, payload: bytes) -> None:
        try:
            message = cp.decode(msg_type, payload)
        except cp.MalformedMessage:
            return  # a newer driver's event we do not know: not ours to act on
        if isinstance(message, cp.OnAvailableImage):
            subscription = self._subscriptions.get(message.subscription_registration_id)
            if subscription is not None and not subscription.is_closed:
                self._add_image(subscription, message)
        elif isinstance(message, cp.OnUnavailableImage):
            subscription = self._subscriptions.get(message.subscription_registration_id)
            if subscription is not None:
                image = subscription._remove_image(message.correlation_id)
                if image is not None:
                    self._unmap_log(image.log)
        elif isinstance(message, cp.OnClientTimeout):
            if message.client_id == self.client_id:
                self._fail(ClientTimeoutError(
                    f"the driver timed this client out (no heartbeat for "
                    f"{self.context.client_liveness_timeout} s); connect again"))
        elif getattr(message, "correlation_id", None) in self._awaiting:
            self._responses[message.correlation_id] = message  # type: ignore[attr-defined]
        elif self.on_driver_event is not None:
            self.on_driver_event(message)

    def _add_image(self, subscription: Subscription, event: cp.OnAvailableImage) -> None:
        previous = subscription.image_by_session_id(event.session_id)
        if previous is not None:
            if previous.correlation_id == event.correlation_id:
                return
            # the session came back (rejoined after it was lost): the old image is done
            if subscription._remove_image(previous.correlation_id) is not None:
                self._unmap_log(previous.log)
        log = self._map_log(event.log_file)
        position = Position(self.counters.values,
                            self.counters.counter_offset(event.position_counter_id))
        image = Image(log, position, correlation_id=event.correlation_id,
                      subscription_registration_id=event.subscription_registration_id,
                      source_identity=event.source_identity)
        subscription._add_image(image)

    # -- requests ------------------------------------------------------------------------------

    def _correlation(self) -> int:
        return self._to_driver.next_correlation_id()

    def _request(self, command: cp.Message) -> cp.Message:
        correlation_id = command.correlation_id  # type: ignore[attr-defined]
        self._awaiting.add(correlation_id)
        try:
            return self._await(command, correlation_id)
        finally:
            self._awaiting.discard(correlation_id)

    def _await(self, command: cp.Message, correlation_id: int) -> cp.Message:
        deadline = time.monotonic() + self.context.driver_timeout
        idle = BackoffIdleStrategy()
        while not self._to_driver.write(command.TYPE_ID, command.encode()):
            if time.monotonic() > deadline:
                raise DriverTimeoutError(f"the driver in {self.directory} is not reading "
                                         f"commands (its queue stayed full)")
            idle.idle(0)
        while correlation_id not in self._responses:
            if self._service() == 0:
                if time.monotonic() > deadline:
                    raise DriverTimeoutError(
                        f"no answer from the driver in {self.directory} within "
                        f"{self.context.driver_timeout} s")
                idle.idle(0)
            else:
                idle.reset()
        response = self._responses.pop(correlation_id)
        if isinstance(response, cp.OnError):
            raise RegistrationError(response.code, response.message)
        return response

    def _send(self, command: cp.Message) -> None:
        """Send without waiting for the answer (removals)."""
        if not self._to_driver.write(command.TYPE_ID, command.encode()):
            raise DriverTimeoutError(f"the driver in {self.directory} is not reading commands")

    # -- logs ----------------------------------------------------------------------------------

    def _map_log(self, log_file: str) -> LogBuffer:
        entry = self._logs.get(log_file)
        if entry is None:
            log = LogBuffer.open(self.directory / log_file)
            self._logs[log_file] = (log, 1)
            return log
        self._logs[log_file] = (entry[0], entry[1] + 1)
        return entry[0]

    def _unmap_log(self, log: LogBuffer) -> None:
        """One user fewer; the last one unmaps it (its users are closed by then)."""
        for name, (mapped, count) in list(self._logs.items()):
            if mapped is log:
                if count > 1:
                    self._logs[name] = (mapped, count - 1)
                else:
                    del self._logs[name]
                    mapped.close()
                return

    def _on_publication_close(self, publication: Publication) -> None:
        if self._publications.pop(publication.registration_id, None) is None:
            return
        if not self._closing and os.getpid() == self._pid:
            self._send(cp.RemovePublication(self.client_id, self._correlation(),
                                            publication.registration_id))
        self._unmap_log(publication.log)

    def _on_destination(self, publication: Publication, destination: str, add: bool) -> None:
        self._check_usable()
        command = cp.AddDestination if add else cp.RemoveDestination
        self._request(command(self.client_id, self._correlation(), publication.registration_id,
                              destination))

    def _on_subscription_close(self, subscription: Subscription,
                               images: tuple[Image, ...]) -> None:
        for image in images:
            self._unmap_log(image.log)
        if self._subscriptions.pop(subscription.registration_id, None) is None:
            return
        if not self._closing and os.getpid() == self._pid:
            self._send(cp.RemoveSubscription(self.client_id, self._correlation(),
                                             subscription.registration_id))

    # -- lifecycle -----------------------------------------------------------------------------

    def _check_usable(self) -> None:
        if os.getpid() != self._pid:
            raise ShmbusError(f"this shmbus Client was created in process {self._pid}; after "
                              f"fork, call shmbus.connect() again in the child (pass it the "
                              f"parent's client.context)")
        if self._closed:
            raise ClientClosedError("this shmbus Client is closed")

    def _fail(self, error: ShmbusError) -> None:
        self._release(send_close=False)
        raise error

    @property
    def is_closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Close every publication and subscription made here, then disconnect. Idempotent."""
        if self._closed or os.getpid() != self._pid:
            return
        self._release(send_close=True)

    def _release(self, *, send_close: bool) -> None:
        if self._closed:
            return
        self._closing = True  # what is closed now goes with the ClientClose below
        for publication in list(self._publications.values()):
            publication.close()
        for subscription in list(self._subscriptions.values()):
            subscription.close()
        if send_close:
            try:
                self._send(cp.ClientClose(self.client_id, self._correlation()))
            except ShmbusError:
                pass
        self._closed = True
        if self._heartbeat is not None:
            self._heartbeat.stop()
        self._publications.clear()
        self._subscriptions.clear()
        for log, _ in self._logs.values():
            log.close()
        self._logs.clear()
        _live_clients.discard(self)
        _reap_launched()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client(dir={str(self.directory)!r}, client_id={self.client_id})"


# -- helpers -----------------------------------------------------------------------------------

def _check_stream_id(stream_id: int) -> None:
    if not isinstance(stream_id, int) or isinstance(stream_id, bool):
        raise TypeError(f"stream id must be an int, not {type(stream_id).__name__}")


def _process_name() -> str:
    """The script's name; for ``python -c`` and multiprocessing workers, the worker's name."""
    import multiprocessing

    script = sys.argv[0] if sys.argv else ""
    if script not in ("", "-c", "-"):
        return os.path.basename(script)
    worker = multiprocessing.current_process().name
    return "python" if worker == "MainProcess" else worker


def _driver_alive(cnc: CncFile, context: Context) -> bool:
    age = epoch_ms() - cnc.driver_heartbeat_ms()
    return age <= context.driver_timeout * 1000 and psutil.pid_exists(cnc.pid)


def _try_open(directory: Path, context: Context) -> CncFile | None:
    try:
        cnc = CncFile.open(directory)
    except CncError as e:
        if "layout version" in str(e):
            raise
        return None
    if _driver_alive(cnc, context):
        return cnc
    cnc.close()
    return None


def _open_or_launch(context: Context) -> CncFile:
    directory = Path(context.dir)
    prepare_directory(directory)
    cnc = _try_open(directory, context)
    if cnc is not None:
        return cnc
    if not context.embedded_driver:
        raise DriverUnavailableError(
            f"no live driver in {directory}: start one with `shmbus driver --dir {directory}`, "
            f"or connect with embedded_driver=True")
    lock_fd = os.open(directory / LAUNCH_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)  # one launcher at a time; the others then find it
        cnc = _try_open(directory, context)
        if cnc is None:
            cnc = _launch(context)
        return cnc
    finally:
        os.close(lock_fd)


def _launch(context: Context) -> CncFile:
    directory = Path(context.dir)
    with tempfile.TemporaryFile() as stderr:
        process = subprocess.Popen(
            context.driver_command(),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
            start_new_session=True)
        _launched.append(process)
        deadline = time.monotonic() + max(context.driver_timeout, 5.0)
        while time.monotonic() < deadline:
            if process.poll() is not None:
                stderr.seek(0)
                detail = stderr.read().decode(errors="replace").strip().splitlines()
                raise DriverUnavailableError(
                    f"the embedded driver for {directory} exited with {process.returncode}: "
                    f"{detail[-1] if detail else 'no message'}")
            try:
                cnc = CncFile.open(directory)
            except CncError:
                time.sleep(0.005)
                continue
            if cnc.pid == process.pid:
                return cnc
            cnc.close()
            time.sleep(0.005)
    process.kill()
    raise DriverUnavailableError(f"the embedded driver for {directory} did not start within "
                                 f"{max(context.driver_timeout, 5.0)} s")


def _reap_launched() -> None:
    for process in list(_launched):
        if process.poll() is not None:
            _launched.remove(process)


def _after_fork_in_child() -> None:
    for client in list(_live_clients):
        for publication in client._publications.values():
            publication._close_core()


os.register_at_fork(after_in_child=_after_fork_in_child)
