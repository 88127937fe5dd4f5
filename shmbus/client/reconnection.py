"""A client's reconnection to a new driver, what it lost when its driver died, and the report
it gives once back.

A client connected with ``reconnect=True`` (see :class:`shmbus.Client`) that finds its driver
dead does not fail: :class:`Reconnection` detaches it, recording where each publication's
session ended and how far each subscription had read each image (:class:`DriverLoss`), looks
for a new live driver (or starts one) and re-adds every publication and subscription there,
then the application gets a :class:`Reconnected`. The client runs it on its conductor thread.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shmbus.client.driver_launch import open_or_launch
from shmbus.settings.errors import (
    DriverTimeoutError,
    DriverUnavailableError,
    RegistrationError,
    ShmbusError,
)
from shmbus.shm import control_protocol as cp
from shmbus.shm.cnc import CncError, CncFile
from shmbus.streams.publication import ExclusivePublication

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from shmbus.client.conductor_proxy import ConductorProxy
    from shmbus.client.log_mappings import LogMappings
    from shmbus.settings.context import Context
    from shmbus.streams.publication import Publication
    from shmbus.streams.subscription import Subscription


@dataclass(frozen=True)
class LostImage:
    """An image a subscription lost with the driver: what it had not read is gone."""

    session_id: int
    #: how far the subscription had read (bytes of the stream)
    position: int


@dataclass(frozen=True)
class RenewedPublication:
    """A publication moved to the new driver: same object, channel and stream, new session."""

    channel: str
    stream_id: int
    old_session_id: int
    #: None when the new driver refused it (``error`` says why); the publication is closed
    new_session_id: int | None
    #: where the old session ended: everything appended before it is in the lost log
    old_position: int
    error: str | None = None


@dataclass(frozen=True)
class RenewedSubscription:
    """A subscription re-added to the new driver; its images arrive from it as usual."""

    channel: str
    stream_id: int
    lost_images: tuple[LostImage, ...]
    #: set when the new driver refused it; the subscription is closed
    error: str | None = None


@dataclass(frozen=True)
class Reconnected:
    """Given to ``Client.on_reconnect`` after the client moved to a new driver."""

    old_driver_pid: int
    new_driver_pid: int
    publications: tuple[RenewedPublication, ...]
    subscriptions: tuple[RenewedSubscription, ...]


@dataclass
class DriverLoss:
    """What the driver took with it, recorded as the client detaches from it.

    Keyed by the publication and subscription objects (their registration ids change). A
    driver lost again before the client got back keeps what was recorded first.
    """

    old_driver_pid: int
    #: publication -> (its session id, where that session ended)
    sessions: dict[Publication, tuple[int, int]] = field(default_factory=dict)
    #: subscription -> images it lost
    images: dict[Subscription, list[LostImage]] = field(default_factory=dict)

    def publication_lost(self, publication: Publication, session_id: int,
                         position: int) -> None:
        self.sessions.setdefault(publication, (session_id, position))

    def image_lost(self, subscription: Subscription, session_id: int, position: int) -> None:
        self.images.setdefault(subscription, []).append(LostImage(session_id, position))

    def report(self, new_driver_pid: int, publications: Iterable[Publication],
               subscriptions: Iterable[Subscription],
               refused: dict[Publication | Subscription, str]) -> Reconnected:
        """The report once ``publications`` and ``subscriptions`` are on the new driver;
        ``refused`` maps those it refused (now closed) to its reason."""
        renewed = []
        for publication in publications:
            session_id, position = self.sessions.get(publication, (publication.session_id, 0))
            error = refused.get(publication)
            renewed.append(RenewedPublication(
                publication.channel, publication.stream_id, session_id,
                None if error else publication.session_id, position, error))
        return Reconnected(
            self.old_driver_pid, new_driver_pid, tuple(renewed),
            tuple(RenewedSubscription(s.channel, s.stream_id, tuple(self.images.get(s, ())),
                                      refused.get(s)) for s in subscriptions))


class Reconnection:
    """The reconnecting of one client (``Context.reconnect``): from the driver's death, noticed
    by the client's duty cycle (:meth:`lose_driver`), until a new driver has everything again
    (:meth:`reconnect`, called by the duty cycle meanwhile).

    ``publications`` and ``subscriptions`` are the client's, by registration id: re-adding
    one gives it a new id, under which it is then found there. Everything here runs under the
    proxy's lock but the looking for (or starting of) a driver.
    """

    def __init__(self, context: Context, directory: Path, proxy: ConductorProxy,
                 logs: LogMappings, publications: dict[int, Publication],
                 subscriptions: dict[int, Subscription]) -> None:
        self._context = context
        self._directory = directory
        self._proxy = proxy
        self._logs = logs
        self._publications = publications
        self._subscriptions = subscriptions
        #: what a dead driver took, while reconnecting (None: connected)
        self.lost: DriverLoss | None = None
        #: how many times a new driver took over
        self.reconnects = 0

    def lose_driver(self) -> None:
        """The driver died: detach from it and record what is lost.

        Publications refuse offers (NOT_CONNECTED) and each image is removed (its
        on_unavailable_image runs); :meth:`reconnect` then looks for a new driver.
        """
        proxy = self._proxy
        with proxy.lock:
            proxy.detach()
            loss = self.lost = self.lost or DriverLoss(proxy.cnc.pid)
            # the next driver names its logs as this one did: keep the old mappings apart
            self._logs.set_aside(f"driver {proxy.cnc.pid}, lost")
            for publication in self._publications.values():
                loss.publication_lost(publication, publication.session_id, publication.position)
                publication._detach()
            proxy.answered.notify_all()  # requests to the dead driver give up
            for subscription in self._subscriptions.values():
                for image in subscription.images:
                    loss.image_lost(subscription, image.session_id, image.position)
                    try:
                        subscription._remove_image(image.correlation_id)
                    except Exception:
                        traceback.print_exc()  # an image callback raised: the others still run
                    self._logs.unmap(image.log, linger=True)

    def reconnect(self) -> Reconnected | None:
        """At most every DRIVER_CHECK_INTERVAL_S, look for a live driver in the directory
        (start one with embedded_driver) and, once there is one, re-add everything to it.
        Returns what was lost once it reconnected, else None. The lock is not held while a
        driver is looked for or started."""
        proxy = self._proxy
        if not proxy.check_due(time.monotonic()):
            return None
        try:
            cnc = open_or_launch(self._context)
        except (DriverUnavailableError, CncError):
            return None  # none yet (or one that cannot start, or of another version): later
        with proxy.lock:
            loss, self.lost = self.lost, None
            if loss is None or proxy.closed:
                cnc.close()
                return None
            try:
                report = self._rejoin(cnc, loss)
            except (ShmbusError, OSError, ValueError):
                # the new driver died too (or its logs went with it): detach, look again
                self.lost = loss
                self.lose_driver()
                return None
            self.reconnects += 1
            proxy.answered.notify_all()  # requests waiting for the reconnection go on
        return report

    def _rejoin(self, cnc: CncFile, loss: DriverLoss) -> Reconnected:
        """Introduce the client to the driver of ``cnc`` and re-add every publication (same
        kind, channel and stream; the same object rebound to its new log) and subscription
        (same callbacks; a new registration id). What the new driver refuses is closed."""
        proxy = self._proxy
        proxy.attach(cnc)
        publications = list(self._publications.items())
        subscriptions = list(self._subscriptions.items())
        refused: dict[Publication | Subscription, str] = {}
        for old_id, publication in publications:
            command = (cp.AddExclusivePublication if isinstance(publication, ExclusivePublication)
                       else cp.AddPublication)
            try:
                ready = proxy.request(command(proxy.client_id, proxy.correlation(),
                                              publication.stream_id, publication.channel))
            except RegistrationError as e:
                refused[publication] = str(e)
                publication.close()
                continue
            assert isinstance(ready, cp.OnPublicationReady)
            old_log = publication.log
            log = self._logs.map(ready.log_file)
            publication._rebind(log, proxy.position(ready.limit_counter_id),
                                proxy.counters.values, ready.correlation_id)
            del self._publications[old_id]
            self._publications[ready.correlation_id] = publication
            self._logs.unmap(old_log)
        for old_id, subscription in subscriptions:
            correlation_id = proxy.correlation()
            # registered before the request: image events follow the ready response at once
            del self._subscriptions[old_id]
            subscription.registration_id = correlation_id
            self._subscriptions[correlation_id] = subscription
            proxy.lease(subscription)
            try:
                proxy.request(cp.AddSubscription(proxy.client_id, correlation_id, 0,
                                                 subscription.stream_id, subscription.channel))
            except RegistrationError as e:
                refused[subscription] = str(e)
                subscription.close()
        return loss.report(cnc.pid, [p for _, p in publications],
                           [s for _, s in subscriptions], refused)

    def wait(self, check: Callable[[], None]) -> None:
        """Before a request: while reconnecting, wait for the new driver (at most
        driver_timeout), then raise DriverTimeoutError; at once on the duty thread (it does
        the reconnecting). ``check`` raises the client's error, before and after waiting."""
        proxy = self._proxy
        deadline = time.monotonic() + self._context.driver_timeout
        with proxy.answered:
            check()
            while self.lost is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or proxy.on_duty_thread():
                    raise self.error()
                proxy.answered.wait(remaining)
                check()

    def error(self) -> DriverTimeoutError:
        """What a request meets while reconnecting."""
        return DriverTimeoutError(
            f"the driver (pid {self._proxy.cnc.pid}) in {self._directory} died and this client "
            f"is reconnecting (reconnect=True): no new driver has taken over yet")
