"""What a reconnecting client lost when its driver died, and the report it gives once back.

A client connected with ``reconnect=True`` (see :class:`shmbus.Client`) records, when it finds
its driver dead, where each publication's session ended and how far each subscription had
read each image (:class:`DriverLoss`); once it has re-added them to a new driver it hands
the application a :class:`Reconnected`. Pure records: the client does the work, on its
conductor thread.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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
