"""The driver's conductor: the duty cycle that serves the clients of one bus directory.

Each cycle reads the clients' commands and hands each to its handler, by kind (the clients'
in client_commands.py, the netbridge's in bridge_commands.py), moves the publications' limits
on, wakes the sleepers on the streams of Aeron's clients (aeron_client_streams.py), and every
timer interval runs the timers: client liveness (client_sessions.py),
publications' tethering, unblocking and end of life (publications.py), network images' end of
life and the netbridge process (bridge_link.py), and subscriptions waiting for the netbridge
(subscription_links.py, which also links subscriptions to what they read). What the driver
tells clients goes through client_proxy.py; the files of the bus are made in log_files.py.

It is driven by ``do_work(now_ms)`` from the driver's loop (the clock is an argument, so tests
drive it), and never blocks, except to resolve the host names of a udp channel being added.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from shmbus.driver.aeron_client_streams import AeronClientStreams
from shmbus.driver.bridge_commands import BridgeCommands
from shmbus.driver.bridge_link import BridgeLink
from shmbus.driver.client_commands import ClientCommands
from shmbus.driver.client_proxy import ClientProxy, CommandError
from shmbus.driver.client_sessions import ClientSessions
from shmbus.driver.log_files import LogFiles
from shmbus.driver.publications import Publications
from shmbus.driver.subscription_links import SubscriptionLinks
from shmbus.driver.system_counters import SystemCounter
from shmbus.settings.channel_uri import ChannelUriError
from shmbus.settings.context import Context
from shmbus.shm import control_protocol as cp
from shmbus.shm.broadcast import BroadcastTransmitter
from shmbus.shm.counters import CountersFullError, CountersManager
from shmbus.shm.error_log import DistinctErrorLog
from shmbus.shm.log_buffer import LogBufferError
from shmbus.shm.ring_buffer import ManyToOneRingBuffer, RingBufferCorruptError

#: the commands an Aeron client joins with (it sends no ClientConnect)
_JOINING = (cp.AddPublication, cp.AddSubscription, cp.AddCounter)


class DriverConductor:
    """Handles commands and timers for one bus directory. Single-threaded; the driver owns it.

    A subscription on a udp channel that is the first of its stream on its endpoint is answered
    once the netbridge has taken the endpoint (ReceiveChannelStatus): then it is ready, or it
    is refused with the netbridge's reason (CHANNEL_ENDPOINT_ERROR: e.g. another process holds
    the address). It waits while a netbridge is registered or being started, at most a share of
    the driver timeout; with no netbridge and auto-start off it is ready at once, and a
    netbridge started later reports what it cannot take to the error log.
    """

    def __init__(
        self,
        context: Context,
        directory: Path,
        to_driver: ManyToOneRingBuffer,
        events: BroadcastTransmitter,
        to_clients: BroadcastTransmitter,
        counters: CountersManager,
        error_log: DistinctErrorLog,
        ring_clients: Callable[[], None] = lambda: None,
    ) -> None:
        self.context = context
        self.directory = directory
        self.to_driver = to_driver
        self.counters = counters
        self._proxy = ClientProxy(events, to_clients, counters, error_log, ring_clients,
                                  directory)
        files = LogFiles(context, directory, counters)
        self._clients = ClientSessions(context, counters, to_driver, self._proxy)
        self._publications = Publications(context, counters, self._proxy, files)
        self._bridge = BridgeLink(context, counters, self._proxy, files)
        self._links = SubscriptionLinks(context, counters, to_driver, self._proxy, self._clients,
                                        self._publications, self._bridge)
        clients = self._client_commands = ClientCommands(
            context, counters, self._proxy, self._clients, self._publications, self._links,
            self._bridge)
        bridge = BridgeCommands(self._proxy, self._publications, self._links, self._bridge)
        #: each command type's handler (it takes a command of that type)
        self._handlers: dict[type[cp.Message], Callable[[Any], None]] = {
            cp.AddDestination: clients.on_destination,
            cp.RemoveDestination: clients.on_destination,
            cp.RegisterBridge: bridge.on_register_bridge,
            cp.AddLinkedCounter: self._clients.on_add_linked_counter,
            cp.FreeCounter: self._clients.on_free_counter,
            cp.AddCounter: self._clients.on_add_counter,
            cp.RemoveCounter: self._clients.on_remove_counter,
            cp.ClientKeepalive: self._clients.on_keepalive,
            cp.CreateImage: bridge.on_create_image,
            cp.CloseImage: bridge.on_close_image,
            cp.ReceiveChannelStatus: bridge.on_receive_channel_status,
            cp.ReportError: bridge.on_report_error,
            cp.ClientConnect: self._clients.on_client_connect,
            cp.AddPublication: clients.on_add_publication,
            cp.AddExclusivePublication: clients.on_add_publication,
            cp.RemovePublication: clients.on_remove_publication,
            cp.AddSubscription: clients.on_add_subscription,
            cp.RemoveSubscription: clients.on_remove_subscription,
            cp.ClientClose: clients.on_client_close,
        }
        self._aeron_streams = AeronClientStreams()
        self._next_timer_ms = 0
        self._last_client_ms = counters.clock()

    # -- the loop ------------------------------------------------------------------------------

    def do_work(self, now_ms: int) -> int:
        """One duty cycle: commands, limits, and (every timer interval) timers. Returns work."""
        try:
            work = self.to_driver.read(self._on_command, 50)
        except RingBufferCorruptError as e:  # a client scribbled on the records: skipped
            self._proxy.record(f"to-driver ring buffer: {e}")
            work = 1
        published = self._publications.update_limits()
        if published:
            self.counters.add(SystemCounter.BYTES_PUBLISHED.value, published)
            work += 1
        self._aeron_streams.on_cycle(self._publications.publications,
                                     self._clients.aeron_client_ids(), now_ms)
        if now_ms >= self._next_timer_ms:
            self._next_timer_ms = now_ms + int(self.context.timer_interval * 1000)
            work += self._on_timer(now_ms)
        self._proxy.ring_if_sent()
        return work

    def ms_until_due(self, now_ms: int) -> int:
        """How long the driver may sleep before its timers, or its look at the streams of
        Aeron's clients, are due (0: due now)."""
        timer = max(0, self._next_timer_ms - now_ms)
        streams = self._aeron_streams.ms_until_due(now_ms)
        return timer if streams is None else min(timer, streams)

    def _on_timer(self, now_ms: int) -> int:
        self.to_driver.consumer_heartbeat_time = now_ms
        work = self._client_commands.check_clients(now_ms)
        if self._bridge.died_unregistered() and self._links.network_in_use():
            self._bridge.start_again()  # it died starting up: no client timeout will tell
        work += self._publications.on_timer(now_ms)
        work += self._bridge.on_timer(now_ms, self._publications.timeouts.linger_ms)
        work += self._links.on_timer(now_ms)
        if self._has_users():
            self._last_client_ms = now_ms
        return work

    def _has_users(self) -> bool:
        """Clients other than the netbridge (which serves them, and ends with the driver)."""
        return any(client_id != self._bridge.client_id for client_id in self._clients.clients)

    def idle_for_ms(self, now_ms: int) -> int:
        """How long the driver has had no client (0 while it has one)."""
        return 0 if self._has_users() else now_ms - self._last_client_ms

    # -- commands ------------------------------------------------------------------------------

    def _on_command(self, msg_type: int, payload: memoryview) -> None:
        correlation_id = 0
        try:
            command = cp.decode(msg_type, payload)
            correlation_id = getattr(command, "correlation_id", 0)
            handler = self._handlers.get(type(command))
            if handler is None or not isinstance(command, cp.Command):
                raise CommandError(cp.UNKNOWN_COMMAND_TYPE_ID,
                                   f"command type 0x{msg_type:x} is not a command")
            if isinstance(command, _JOINING):
                self._clients.session_or_join(command.client_id)
            elif not isinstance(command, cp.ClientConnect):
                self._clients.session(command.client_id)
            handler(command)
        except cp.UnknownMessageType as e:
            # every command starts with client id and correlation id: the sender hears why
            if len(payload) >= 16:
                correlation_id = int.from_bytes(payload[8:16], "little", signed=True)
            self._proxy.error(correlation_id, cp.UNKNOWN_COMMAND_TYPE_ID, str(e))
        except cp.MalformedMessage as e:
            self._proxy.error(correlation_id, cp.MALFORMED_COMMAND, str(e))
        except CommandError as e:
            self._proxy.error(correlation_id, e.code, str(e))
        except ChannelUriError as e:
            self._proxy.error(correlation_id, cp.INVALID_CHANNEL, str(e))
        except (OSError, LogBufferError, CountersFullError) as e:
            code = cp.STORAGE_SPACE if isinstance(e, OSError) else cp.GENERIC_ERROR
            self._proxy.error(correlation_id, code, str(e))
        except Exception as e:  # a bug must not take the driver down: record it, go on
            self._proxy.error(correlation_id, cp.GENERIC_ERROR, f"{type(e).__name__}: {e}", e)

    def close(self) -> None:
        """Unmap every log (the driver deletes the directory's files after), and stop the
        netbridge it started; clients of every language see the driver closed (heartbeat -1)."""
        self.to_driver.consumer_heartbeat_time = -1
        self._publications.close()
        self._bridge.close()
