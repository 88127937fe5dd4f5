"""The clients a driver serves: who they are, what each owns, and whether they are alive.

A shmbus client introduces itself (ClientConnect). An Aeron client, in any language, never
does: as in Aeron's driver, it joins with its first add (publication, subscription or
counter), which makes its heartbeat counter (type client-heartbeat, its key the client id,
where Aeron's client looks for it) and announces it with OnCounterReady(client id). A client
that ended (closed, timed out) never joins again under the same id.

A client is alive while it keeps storing the time in its heartbeat counter: one silent for
``Context.client_liveness_timeout`` is timed out (the conductor then removes everything it
owned). The command ring has a liveness too: a client that died between claiming and
committing a command would block every later command, so its record is passed over after the
same timeout.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field

from shmbus.driver.client_proxy import ClientProxy, CommandError
from shmbus.driver.system_counters import SystemCounter
from shmbus.settings.context import Context
from shmbus.shm import control_protocol as cp
from shmbus.shm.counters import CLIENT_HEARTBEAT, MAX_KEY_LENGTH, CountersManager
from shmbus.shm.ring_buffer import ManyToOneRingBuffer


@dataclass
class ClientSession:
    """A connected client: its heartbeat counter and what it owns."""

    client_id: int
    pid: int                 # 0: an Aeron client (it does not say)
    name: str
    heartbeat_counter_id: int
    #: joined Aeron's way, by its first add: it hears Aeron's responses only
    aeron: bool = False
    publications: set[int] = field(default_factory=set)      # owner registration ids
    subscriptions: set[int] = field(default_factory=set)     # subscription ids
    counters: set[int] = field(default_factory=set)          # counters it asked for
    #: the counters it added with Aeron's AddCounter, by registration id
    registered_counters: dict[int, int] = field(default_factory=dict)


class ClientSessions:
    """The connected clients by id, with the counters they asked for, and the liveness of
    clients and of the command ring. Single-threaded: the conductor's."""

    def __init__(self, context: Context, counters: CountersManager,
                 to_driver: ManyToOneRingBuffer, proxy: ClientProxy) -> None:
        self._context = context
        self._counters = counters
        self._to_driver = to_driver
        self._proxy = proxy
        self.clients: dict[int, ClientSession] = {}
        #: clients that closed or timed out: their ids never join again
        self._ended: set[int] = set()
        #: where the command ring's head stood, and since when (for unblocking a dead claim)
        self._command_head = 0
        self._command_head_since_ms = 0

    def session(self, client_id: int) -> ClientSession:
        """The client ``client_id``; CommandError when it is not connected (timed out?)."""
        client = self.clients.get(client_id)
        if client is None:
            raise CommandError(cp.GENERIC_ERROR,
                               f"unknown client {client_id} (timed out? connect again)")
        return client

    def aeron_client_ids(self) -> set[int]:
        """The ids of the attached Aeron clients."""
        return {client.client_id for client in self.clients.values() if client.aeron}

    def session_or_join(self, client_id: int) -> ClientSession:
        """The client ``client_id``, joined now if it is new: an Aeron client's first add
        makes its heartbeat counter, announced by OnCounterReady(client id). CommandError for
        a client that ended."""
        client = self.clients.get(client_id)
        if client is not None or client_id in self._ended:
            return self.session(client_id)
        counter_id = self._counters.allocate(
            f"client-heartbeat: id={client_id}", CLIENT_HEARTBEAT,
            key=struct.pack("<q", client_id), registration_id=client_id, owner_id=client_id)
        self._counters.set_value(counter_id, self._counters.clock())
        client = self.clients[client_id] = ClientSession(client_id, 0, "aeron client",
                                                         counter_id, aeron=True)
        self._proxy.send(cp.OnCounterReady(client_id, counter_id))
        return client

    def check_owns_publication(self, client_id: int, registration_id: int) -> None:
        """A client changes only the publications it added (a wrong id from a buggy client
        must not close another client's): CommandError otherwise."""
        if registration_id not in self.clients[client_id].publications:
            raise CommandError(cp.UNKNOWN_PUBLICATION, f"unknown publication {registration_id} "
                                                       f"(not one client {client_id} added)")

    def who(self, client_id: int) -> str:
        """`` pid=<pid> <name>`` of a connected client, for counter labels ("" if gone)."""
        client = self.clients.get(client_id)
        if client is None:
            return ""
        return f" {client.name}" if client.aeron else f" pid={client.pid} {client.name}"

    # -- commands ------------------------------------------------------------------------------

    def on_client_connect(self, command: cp.ClientConnect) -> None:
        label = f"client-heartbeat: {command.client_id} pid={command.pid} {command.name}"
        counter_id = self._counters.allocate(label, CLIENT_HEARTBEAT,
                                             key=struct.pack("<q", command.client_id),
                                             registration_id=command.client_id,
                                             owner_id=command.client_id,
                                             reference_id=command.pid)
        self._counters.set_value(counter_id, self._counters.clock())
        self.clients[command.client_id] = ClientSession(command.client_id, command.pid,
                                                        command.name, counter_id)
        self._proxy.send(cp.OnClientReady(command.correlation_id, counter_id))

    def on_add_linked_counter(self, command: cp.AddLinkedCounter) -> None:
        counter_id = self._counters.allocate(
            command.label, command.type_id,
            registration_id=command.registration_id or command.correlation_id,
            owner_id=command.client_id, reference_id=command.reference_id)
        self.clients[command.client_id].counters.add(counter_id)
        self._proxy.send(cp.OnCounterReady(command.correlation_id, counter_id))

    def on_add_counter(self, command: cp.AddCounter) -> None:
        """Aeron's ADD_COUNTER: registration id = the correlation id, owner = the client."""
        counter_id = self._counters.allocate(
            command.label, command.type_id, key=command.key[:MAX_KEY_LENGTH],
            registration_id=command.correlation_id, owner_id=command.client_id)
        client = self.clients[command.client_id]
        client.counters.add(counter_id)
        client.registered_counters[command.correlation_id] = counter_id
        self._proxy.send(cp.OnCounterReady(command.correlation_id, counter_id))

    def on_remove_counter(self, command: cp.RemoveCounter) -> None:
        """Aeron's REMOVE_COUNTER, by registration id: OnOperationSuccess, then
        OnUnavailableCounter."""
        client = self.clients[command.client_id]
        counter_id = client.registered_counters.pop(command.registration_id, None)
        if counter_id is None:
            raise CommandError(cp.UNKNOWN_COUNTER,
                               f"unknown counter registration {command.registration_id} (not "
                               f"one client {command.client_id} added)")
        client.counters.discard(counter_id)
        self._proxy.send(cp.OnOperationSuccess(command.correlation_id))
        self._proxy.send(cp.OnUnavailableCounter(command.registration_id, counter_id))
        self._counters.free(counter_id)

    def on_keepalive(self, command: cp.ClientKeepalive) -> None:
        """Aeron's CLIENT_KEEPALIVE: the heartbeat counter takes the time (Aeron's clients
        write the counter themselves; the command is served as Aeron's driver serves it)."""
        client = self.clients[command.client_id]
        self._counters.set_value(client.heartbeat_counter_id, self._counters.clock())

    def on_free_counter(self, command: cp.FreeCounter) -> None:
        owned = self.clients[command.client_id].counters
        if command.counter_id not in owned:
            raise CommandError(cp.GENERIC_ERROR, f"counter {command.counter_id} is not one "
                                                 f"client {command.client_id} allocated")
        owned.discard(command.counter_id)
        self._counters.free(command.counter_id)
        self._proxy.send(cp.OnOperationSuccess(command.correlation_id))

    # -- liveness ------------------------------------------------------------------------------

    def timed_out(self, now_ms: int) -> Iterator[ClientSession]:
        """The clients whose heartbeat is older than the liveness timeout at ``now_ms``, one
        by one (each is looked at when the one before it was dealt with)."""
        timeout_ms = int(self._context.client_liveness_timeout * 1000)
        for client in list(self.clients.values()):
            heartbeat = self._counters.get_value(client.heartbeat_counter_id)
            if now_ms - heartbeat > timeout_ms:
                yield client

    def unblock_commands(self, now_ms: int) -> int:
        """When the command ring's head has not moved for the liveness timeout with commands
        in it, a client died between claiming and committing one: pass its record. Returns
        1 when it did, else 0."""
        timeout_ms = int(self._context.client_liveness_timeout * 1000)
        head = self._to_driver.consumer_position()
        if head != self._command_head or self._to_driver.size() == 0:
            self._command_head, self._command_head_since_ms = head, now_ms
        elif now_ms - self._command_head_since_ms > timeout_ms and self._to_driver.unblock():
            # a client died between claiming and committing a command: pass its record
            self._counters.add(SystemCounter.UNBLOCKED_COMMANDS.value, 1)
            return 1
        return 0

    def pop(self, client_id: int) -> ClientSession | None:
        """Forget the client ``client_id`` (None if it is not connected); what it owns is
        the caller's to remove, then :meth:`free_counters`."""
        self._ended.add(client_id)
        return self.clients.pop(client_id, None)

    def free_counters(self, client: ClientSession) -> None:
        """Free the counters a removed client asked for, and its heartbeat counter; an Aeron
        client hears each go (OnUnavailableCounter), as from Aeron's driver."""
        by_counter = {counter_id: registration_id
                      for registration_id, counter_id in client.registered_counters.items()}
        for counter_id in client.counters:
            if client.aeron:
                self._proxy.send(cp.OnUnavailableCounter(by_counter.get(counter_id, 0),
                                                         counter_id))
            self._counters.free(counter_id)
        if client.aeron:
            self._proxy.send(cp.OnUnavailableCounter(client.client_id,
                                                     client.heartbeat_counter_id))
        self._counters.free(client.heartbeat_counter_id)
