"""The netbridge as its driver sees it: the process the driver starts, the client registered as
the netbridge, and the network images it rebuilds from the network (their logs and counters).

The driver starts a netbridge (``python -c BRIDGE_COMMAND '<context as JSON>'``) when a udp
channel is first used and none is registered or starting (``Context.netbridge_auto_start``);
it registers as a client of the bus. One that dies, or is timed out, with udp channels in use
is replaced.
"""

from __future__ import annotations

import subprocess
import sys

from shmbus.driver.client_proxy import ClientProxy, CommandError
from shmbus.driver.counter_allocation import free_all, position
from shmbus.driver.log_files import LOGS_DIR, LogFiles
from shmbus.driver.network_image import NetworkImage
from shmbus.settings.channel_uri import ChannelUri
from shmbus.settings.context import Context
from shmbus.shm import control_protocol as cp
from shmbus.shm.counters import RCV_HWM, RCV_POS, CountersManager

#: ``python -c BRIDGE_COMMAND '<context as JSON>'``: how the driver starts a netbridge.
BRIDGE_COMMAND = "from netbridge.bridge import embedded_main; embedded_main()"
#: how long a netbridge the driver started may take to register before another is started
_BRIDGE_START_MS = 10_000


class BridgeLink:
    """The netbridge of one bus: its process, its client id once registered, and the network
    images by id. Single-threaded: the conductor's."""

    def __init__(self, context: Context, counters: CountersManager, proxy: ClientProxy,
                 files: LogFiles) -> None:
        self._context = context
        self._counters = counters
        self._proxy = proxy
        self._files = files
        #: the client registered as the netbridge (None: none is)
        self.client_id: int | None = None
        self.images: dict[int, NetworkImage] = {}
        self._process: subprocess.Popen[bytes] | None = None
        self._started_ms = 0

    # -- the process ---------------------------------------------------------------------------

    def ensure(self) -> None:
        """Start a netbridge for this directory unless one is registered or starting."""
        if self.client_id is not None or not self._context.netbridge_auto_start:
            return
        now_ms = self._counters.clock()
        process = self._process
        if process is not None and process.poll() is None and (
                now_ms - self._started_ms < _BRIDGE_START_MS):
            return
        self._process = subprocess.Popen(
            [sys.executable, "-c", BRIDGE_COMMAND, self._context.to_json()],
            stdin=subprocess.DEVNULL, start_new_session=True)
        self._started_ms = now_ms

    def died_unregistered(self) -> bool:
        """The netbridge this driver started exited before it registered as a client."""
        process = self._process
        return (self.client_id is None and process is not None
                and process.poll() is not None)

    def start_again(self) -> None:
        """The one started is gone (it died starting up, or was declared dead): start
        another (see :meth:`ensure`)."""
        self._process = None
        self.ensure()

    def gone(self, client_id: int, pid: int, now_ms: int, network_in_use: bool) -> None:
        """The registered netbridge (client ``client_id``, process ``pid``) went away at
        ``now_ms``: its images close (their subscribers read what is left), and with udp
        channels in use another is started (the old process killed, if the driver started it
        and it still runs: declared dead, it must not come back beside the new one)."""
        self.client_id = None
        for image in self.images.values():
            if image.closing_since_ms is None:
                image.closing_since_ms = now_ms
        if not network_in_use:
            return
        # it died (or hung): a new one takes over every udp channel as it registers
        then = ("starting another" if self._context.netbridge_auto_start
                else "start one by hand (netbridge_auto_start is off)")
        self._proxy.error_log.record(f"netbridge (client {client_id}, pid {pid}) went away "
                                     f"with udp channels in use; {then}")
        old = self._process
        if old is not None and old.pid == pid and old.poll() is None:
            old.kill()
        self.start_again()

    def require(self, client_id: int) -> None:
        """CommandError unless ``client_id`` is the registered netbridge."""
        if client_id != self.client_id:
            raise CommandError(cp.GENERIC_ERROR, "only the registered netbridge may do this")

    def register(self, client_id: int) -> None:
        """The client ``client_id`` is the netbridge (CommandError when another is)."""
        if self.client_id is not None and self.client_id != client_id:
            raise CommandError(cp.GENERIC_ERROR, f"a netbridge (client "
                                                 f"{self.client_id}) is already registered")
        self.client_id = client_id

    # -- network images ------------------------------------------------------------------------

    def create_image(self, command: cp.CreateImage) -> NetworkImage:
        """The image the netbridge asks for (its log, rcv-hwm and rcv-pos at the join
        position), answered; not yet linked to subscriptions."""
        uri = ChannelUri.parse(command.channel)
        image_id = command.correlation_id
        log_file = f"{LOGS_DIR}/{image_id}.log"
        log = self._files.create_log(
            log_file, term_length=command.term_length, initial_term_id=command.initial_term_id,
            mtu=command.mtu, session_id=command.session_id, stream_id=command.stream_id,
            registration_id=image_id)
        label = (f"{image_id} {command.session_id} {command.stream_id} {uri.canonical()} "
                 f"{command.source_identity}")
        hwm = self._counters.allocate(f"rcv-hwm: {label}", RCV_HWM, registration_id=image_id,
                                      owner_id=command.client_id,
                                      reference_id=command.session_id)
        pos = self._counters.allocate(f"rcv-pos: {label}", RCV_POS, registration_id=image_id,
                                      owner_id=command.client_id,
                                      reference_id=command.session_id)
        rcv_pos = position(self._counters, pos)
        rcv_pos.set(command.join_position)
        position(self._counters, hwm).set(command.join_position)
        image = NetworkImage(image_id, uri.canonical(), command.session_id, command.stream_id,
                             command.source_identity, log, log_file, hwm, pos, rcv_pos,
                             command.join_position)
        self.images[image_id] = image
        self._proxy.send(cp.OnImageReady(command.correlation_id, image_id, hwm, pos, log_file))
        return image

    def close_image(self, image_id: int) -> None:
        """The netbridge closed the image: its subscribers read what is left (CommandError
        for an unknown image)."""
        image = self.images.get(image_id)
        if image is None:
            raise CommandError(cp.GENERIC_ERROR, f"unknown image {image_id}")
        if image.closing_since_ms is None:
            image.closing_since_ms = self._counters.clock()

    def subscribers_changed(self, image: NetworkImage) -> None:
        """Tell the netbridge which counters its receiver of ``image`` follows now."""
        self._proxy.send(cp.OnImageSubscribers(image.image_id, image.subscriber_counter_ids()))

    def on_timer(self, now_ms: int, linger_ms: int) -> int:
        """Groups hand on the claims of departed members, and a closed image whose
        subscribers read to the end (or lingered ``linger_ms``) is deleted. Returns the work
        done."""
        work = 0
        for image in list(self.images.values()):
            for group in image.groups.values():
                handed_on = group.hand_on(image.log)
                if handed_on:  # the receiver no longer follows the departed record
                    self.subscribers_changed(image)
                    free_all(self._counters, handed_on)
            if image.is_done(now_ms, linger_ms):
                self._delete_image(image)
                work += 1
        return work

    def _delete_image(self, image: NetworkImage) -> None:
        del self.images[image.image_id]
        for link in image.subscribers.values():
            self._proxy.send(cp.OnUnavailableImage(link.link_id, link.subscription_id,
                                                   image.stream_id, image.channel))
            if link.group is None:
                self._counters.free(link.counter_id)
        for group in image.groups.values():
            free_all(self._counters, group.counter_ids())
        self._counters.free(image.rcv_hwm_counter_id)
        self._counters.free(image.rcv_pos_counter_id)
        self._files.delete(image.log, image.log_file)

    def close(self) -> None:
        """Unmap every image's log and stop the netbridge this driver started, if it runs."""
        for image in self.images.values():
            image.log.close()
        self.images.clear()
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
