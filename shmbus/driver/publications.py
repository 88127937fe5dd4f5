"""The publication logs of a bus, from creation to deletion (the driver's side).

A concurrent publication of a channel and stream is shared by every client that adds it (one
log, one session); an exclusive one has its own. Each has a pub-lmt and a pub-pos counter; an
IPC one a block ring for its large messages; a udp one the netbridge's snd-pos, snd-lmt and
snd-bpe counters, and is announced to the netbridge, which sends it. When its last owner
removes it, it drains (its subscribers read to the end) and is then deleted with its files.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

from shmbus.driver.client_proxy import ClientProxy, CommandError
from shmbus.driver.counter_allocation import free_all, position
from shmbus.driver.ipc_flow_control import IpcFlowControl
from shmbus.driver.ipc_publication import (
    ImageEvent,
    IpcPublication,
    NetworkPublication,
    PublicationOwner,
    PublicationState,
    Timeouts,
)
from shmbus.driver.log_files import LOGS_DIR, LogFiles
from shmbus.driver.system_counters import SystemCounter
from shmbus.settings.channel_uri import ChannelUri
from shmbus.settings.context import Context
from shmbus.shm import control_protocol as cp
from shmbus.shm.counters import (
    PUB_LIMIT,
    PUB_POS,
    SND_BPE,
    SND_LMT,
    SND_POS,
    CountersFullError,
    CountersManager,
)


class Publications:
    """The publications of the bus (IPC and udp), their owners, and the destinations added to
    manual-control udp ones. Single-threaded: the conductor's."""

    def __init__(self, context: Context, counters: CountersManager, proxy: ClientProxy,
                 files: LogFiles) -> None:
        self._context = context
        self._counters = counters
        self._proxy = proxy
        self._files = files
        self.timeouts = Timeouts(
            unblock_ms=int(context.publication_unblock_timeout * 1000),
            linger_ms=int(context.publication_linger_timeout * 1000),
            window_limit_ms=int(context.untethered_window_limit_timeout * 1000),
            resting_ms=int(context.untethered_resting_timeout * 1000),
        )
        self.publications: list[IpcPublication] = []
        #: the publication of each owner (a client's add_publication) by its registration id
        self._owner_index: dict[int, IpcPublication] = {}
        #: manual MDC destinations by publication: told again to a netbridge that registers
        #: after they were added (the one the publication starts, or a restarted one)
        self._destinations: dict[int, list[str]] = {}
        self._random = random.Random()

    # -- owners --------------------------------------------------------------------------------

    def find_concurrent(self, uri: ChannelUri, stream_id: int) -> IpcPublication | None:
        """The active concurrent publication a new owner of ``uri`` and ``stream_id`` shares
        (with a session-id, of that session), if there is one."""
        session = uri.int_param("session-id") if "session-id" in uri.params else None
        for publication in self.publications:
            if (not publication.exclusive and publication.stream_id == stream_id
                    and publication.endpoint_key == uri.endpoint_key()
                    and publication.state is PublicationState.ACTIVE
                    and (session is None or publication.session_id == session)):
                return publication
        return None

    def add_owner(self, publication: IpcPublication, registration_id: int,
                  client_id: int) -> None:
        """The client ``client_id`` added ``publication`` as ``registration_id``."""
        publication.owners.append(PublicationOwner(registration_id, client_id))
        self._owner_index[registration_id] = publication

    def owned(self, registration_id: int) -> IpcPublication | None:
        """The publication an owner added as ``registration_id``."""
        return self._owner_index.get(registration_id)

    def remove_owner(self, registration_id: int) -> bool:
        """Drop the owner ``registration_id``; when the last one goes, the publication drains
        (a network publication's stream ends). False for an unknown owner."""
        publication = self._owner_index.pop(registration_id, None)
        if publication is None or not publication.remove_owner(registration_id,
                                                               self._counters.clock()):
            return False
        if (isinstance(publication, NetworkPublication)
                and publication.state is PublicationState.DRAINING):
            self._proxy.send(cp.OnNetworkPublicationClosed(
                publication.registration_id, publication.log.end_of_stream_position))
        return True

    # -- creation ------------------------------------------------------------------------------

    def create(self, command: cp.AddPublication, uri: ChannelUri,
               exclusive: bool) -> IpcPublication:
        """A new publication for ``command`` (its log, counters and, for IPC, block ring):
        CommandError for a session-id in use on the stream; CountersFullError or OSError
        (no room for its files), leaving nothing behind. Not yet linked, nor announced."""
        registration_id = command.correlation_id
        term_length = uri.int_param("term-length", self._context.ipc_term_length if uri.is_ipc
                                    else self._context.udp_term_length)
        mtu = uri.int_param("mtu", self._context.mtu)
        if "session-id" in uri.params:
            session_id = uri.int_param("session-id")
            if any(p.session_id == session_id and p.stream_id == command.stream_id
                   for p in self.publications):
                raise CommandError(cp.GENERIC_ERROR,
                                   f"session-id {session_id} is already in use on stream "
                                   f"{command.stream_id}")
        else:
            session_id = self._new_session_id(command.stream_id)
        log_file = f"{LOGS_DIR}/{registration_id}.log"
        initial_term_id = self._random.randint(-(2**31), 2**31 - 1)
        log = self._files.create_log(
            log_file, term_length=term_length, initial_term_id=initial_term_id, mtu=mtu,
            session_id=session_id, stream_id=command.stream_id, registration_id=registration_id)
        label = f"{registration_id} {session_id} {command.stream_id} {uri.canonical()}"
        counter_ids: list[int] = []
        try:
            for type_id, name in ((PUB_LIMIT, "pub-lmt"), (PUB_POS, "pub-pos")):
                counter_ids.append(self._counters.allocate(
                    f"{name}: {label}", type_id, registration_id=registration_id,
                    owner_id=command.client_id, reference_id=session_id))
        except CountersFullError:
            free_all(self._counters, counter_ids)
            self._files.discard(log, log_file)
            raise
        limit = position(self._counters, counter_ids[0])
        fields: dict[str, Any] = dict(
            registration_id=registration_id, session_id=session_id,
            stream_id=command.stream_id, channel=uri.canonical(), exclusive=exclusive,
            log=log, log_file=log_file, limit_counter_id=counter_ids[0], limit=limit,
            pub_pos_counter_id=counter_ids[1],
            pub_pos=position(self._counters, counter_ids[1]), endpoint_key=uri.endpoint_key())
        publication: IpcPublication
        if uri.is_ipc:
            try:
                blocks = self._files.create_ring(log_file)
            except OSError:
                free_all(self._counters, counter_ids)
                self._files.discard(log, log_file)
                raise
            publication = IpcPublication(
                **fields, flow=IpcFlowControl(log, limit, self._context.ipc_window or None),
                blocks=blocks)
        else:
            snd = [self._counters.allocate(f"{name}: {label}", type_id,
                                           registration_id=registration_id,
                                           owner_id=command.client_id, reference_id=session_id)
                   for type_id, name in ((SND_POS, "snd-pos"), (SND_LMT, "snd-lmt"),
                                         (SND_BPE, "snd-bpe"))]
            publication = NetworkPublication(
                **fields, flow=IpcFlowControl(log, limit, clean_lag=term_length),
                snd_pos_counter_id=snd[0], snd_lmt_counter_id=snd[1],
                snd_bpe_counter_id=snd[2], snd_pos=position(self._counters, snd[0]))
        log.publication_window = publication.flow.window
        self.publications.append(publication)
        self._counters.add(SystemCounter.PUBLICATIONS.value, 1)
        return publication

    def _new_session_id(self, stream_id: int) -> int:
        used = {p.session_id for p in self.publications if p.stream_id == stream_id}
        while True:
            session_id = self._random.randint(-(2**31), 2**31 - 1)
            if session_id not in used:
                return session_id

    # -- udp publications and the netbridge ----------------------------------------------------

    def network(self) -> Iterator[NetworkPublication]:
        """The udp publications, active or draining."""
        for publication in self.publications:
            if isinstance(publication, NetworkPublication):
                yield publication

    def network_active(self) -> bool:
        """Whether an active publication is on a udp channel."""
        return any(p.state is PublicationState.ACTIVE for p in self.network())

    def announce(self, publication: NetworkPublication) -> None:
        """Tell the netbridge to send ``publication``, with its destinations."""
        self._proxy.send(cp.OnNetworkPublication(
            publication.registration_id, publication.session_id, publication.stream_id,
            publication.snd_pos_counter_id, publication.snd_lmt_counter_id,
            publication.snd_bpe_counter_id, publication.channel, publication.log_file))

    def destinations(self, publication: NetworkPublication) -> list[str]:
        """The destinations added to a manual-control publication, oldest first."""
        return self._destinations.get(publication.registration_id, [])

    def set_destination(self, publication: NetworkPublication, endpoint: str,
                        added: bool) -> None:
        """Add ``endpoint`` to the destinations of ``publication`` (or remove it)."""
        known = self._destinations.setdefault(publication.registration_id, [])
        if added and endpoint not in known:
            known.append(endpoint)
        elif not added and endpoint in known:
            known.remove(endpoint)

    # -- the duty cycle ------------------------------------------------------------------------

    def update_limits(self) -> int:
        """Move each publication's limit on (what its readers let it write); returns the
        bytes published since the last call."""
        published = 0
        for publication in self.publications:
            published += publication.update_limit()
        return published

    def on_timer(self, now_ms: int) -> int:
        """Each publication's timers: groups hand on the claims of departed members, dead
        writers' frames are passed over, untethered readers linger and rest, and a drained
        publication is deleted. Returns the work done."""
        work = 0
        for publication in list(self.publications):
            for group in publication.groups.values():
                free_all(self._counters, group.hand_on(publication.log))
            events, unblocked = publication.on_timer(now_ms, self.timeouts)
            if unblocked:
                self._counters.add(SystemCounter.UNBLOCKED_PUBLICATIONS.value, 1)
                work += 1
            for event in events:
                self.send_image_event(publication, event)
                work += 1
            if publication.state is PublicationState.DONE:
                self._delete(publication)
                work += 1
        return work

    def send_image_event(self, publication: IpcPublication, event: ImageEvent) -> None:
        """Tell a subscriber its image of ``publication`` became available or unavailable."""
        link = event.link
        if event.available:
            self._proxy.send(cp.OnAvailableImage(link.link_id, publication.session_id,
                                                 publication.stream_id, link.subscription_id,
                                                 link.counter_id, publication.log_file, "ipc"))
        else:
            self._proxy.send(cp.OnUnavailableImage(link.link_id, link.subscription_id,
                                                   publication.stream_id, publication.channel))

    def _delete(self, publication: IpcPublication) -> None:
        self.publications.remove(publication)
        self._destinations.pop(publication.registration_id, None)
        for link in publication.subscribers.values():
            if link.group is None:
                self._counters.free(link.counter_id)
        for group in publication.groups.values():
            free_all(self._counters, group.counter_ids())
        self._counters.free(publication.limit_counter_id)
        self._counters.free(publication.pub_pos_counter_id)
        if isinstance(publication, NetworkPublication):
            for counter_id in (publication.snd_pos_counter_id, publication.snd_lmt_counter_id,
                               publication.snd_bpe_counter_id):
                self._counters.free(counter_id)
        self._files.delete(publication.log, publication.log_file, publication.blocks)

    def close(self) -> None:
        """Unmap every log (the driver deletes the directory's files after)."""
        for publication in self.publications:
            publication.log.close()
        self.publications.clear()
