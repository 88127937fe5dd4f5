"""UDP sockets for a channel: unicast, multicast and multi-destination-cast
(docs/protocol.md, Channels and addressing).

* unicast: the sender sends to the endpoint from an ephemeral port (or ``interface``), and
  hears status messages and NAKs on that socket; the receiver binds the endpoint, alone: no
  SO_REUSEADDR, so a second receiver on this host (another bus's netbridge) gets an error that
  names the address and the process holding it, instead of sharing the port and, as Linux
  hands each unicast datagram to one socket only, receiving nothing.
* multicast (``endpoint=<odd group>:port``): data goes to the group, control (status
  messages, NAKs) to the next, even group on the same port. The sender binds the control
  group; a receiver binds the data group, sends control to the control group, and also
  listens there to hear other receivers' NAKs. Sockets join their group on ``interface``.
* multi-destination-cast (``control=host:port|control-mode=manual|dynamic``): the sender binds
  the control address and sends to each destination; receivers bind their own endpoint.
"""

from __future__ import annotations

import errno
import socket
import struct
from dataclasses import dataclass

import psutil

from shmbus.settings.channel_uri import ChannelUri


def parse_address(text: str) -> tuple[str, int]:
    """``host:port`` to an (IPv4 address, port) pair, resolving names."""
    host, _, port = text.rpartition(":")
    return socket.gethostbyname(host.strip("[]")), int(port)


def control_group(data_group: tuple[str, int]) -> tuple[str, int]:
    """The control group of a multicast data group: the next address, same port."""
    host, port = data_group
    a, b, c, d = (int(x) for x in host.split("."))
    return f"{a}.{b}.{c}.{d + 1}", port


def _interface(uri: ChannelUri) -> tuple[str, int]:
    text = uri.params.get("interface", "0.0.0.0:0")
    host, _, port = text.partition(":")
    return socket.gethostbyname(host), int(port or 0)


def _udp_socket(buffer_size: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    if buffer_size:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer_size)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer_size)
    sock.setblocking(False)
    return sock


def _join(sock: socket.socket, group: tuple[str, int], interface: str, ttl: int) -> None:
    """Bind ``group`` (shared with other sockets of this host) and join it on ``interface``."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(group)
    membership = struct.pack("4s4s", socket.inet_aton(group[0]), socket.inet_aton(interface))
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, membership)
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(interface))
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, ttl)
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)


@dataclass
class SendTransport:
    """A sender's socket and where its data goes first (MDC destinations come later)."""

    sock: socket.socket
    destinations: list[tuple[str, int]]
    control_mode: str | None = None   # 'manual' or 'dynamic' for MDC
    group: bool = False               # multicast or MDC: SETUP carries the GROUP flag


@dataclass
class ReceiveTransport:
    """A receiver's data socket, and for multicast the control group (and a socket on it)."""

    sock: socket.socket
    control_address: tuple[str, int] | None = None
    control_sock: socket.socket | None = None
    #: dynamic MDC: where this receiver announces itself
    announce_to: tuple[str, int] | None = None

    def sockets(self) -> list[socket.socket]:
        return [self.sock] + ([self.control_sock] if self.control_sock else [])


def _holders(address: tuple[str, int]) -> list[str]:
    """The processes with a UDP socket bound to ``address`` (or to its port on every
    interface), as "pid N (name: command line)"; empty when none can be seen (sockets of
    another user's processes show no pid)."""
    host, port = address
    found = []
    try:
        connections = psutil.net_connections(kind="udp4")
    except psutil.Error:
        return []
    for connection in connections:
        laddr = connection.laddr
        if (connection.pid is not None and laddr and laddr.port == port
                and laddr.ip in (host, "0.0.0.0")):
            try:
                process = psutil.Process(connection.pid)
                command = " ".join(process.cmdline())
                name = process.name()
            except psutil.Error:
                command, name = "", "?"
            if len(command) > 160:
                command = command[:157] + "..."
            found.append(f"pid {connection.pid} ({name}: {command})" if command
                         else f"pid {connection.pid} ({name})")
    return found


def _bind_endpoint(sock: socket.socket, endpoint: tuple[str, int]) -> None:
    """Bind a unicast receive socket to ``endpoint``; OSError naming the address (and who
    holds it, when it is in use)."""
    try:
        sock.bind(endpoint)
    except OSError as e:
        address = f"{endpoint[0]}:{endpoint[1]}"
        if e.errno == errno.EADDRINUSE:
            who = _holders(endpoint)
            by = ("by " + ", ".join(who)) if who else "by a process this user cannot see"
            raise OSError(e.errno, f"udp endpoint {address} is already bound {by}; only one "
                                   f"process can receive on a unicast endpoint") from None
        raise OSError(e.errno, f"udp endpoint {address}: cannot bind: {e.strerror}") from None


def open_send(uri: ChannelUri, buffer_size: int) -> SendTransport:
    """The socket a publication on ``uri`` sends from. OSError when it cannot be bound."""
    sock = _udp_socket(buffer_size)
    try:
        if uri.control_mode is not None:
            sock.bind(parse_address(uri.params["control"]))
            destinations = ([parse_address(uri.params["endpoint"])]
                            if "endpoint" in uri.params else [])
            return SendTransport(sock, destinations, uri.control_mode, group=True)
        endpoint = parse_address(uri.params["endpoint"])
        if uri.is_multicast:
            _join(sock, control_group(endpoint), _interface(uri)[0],
                  uri.int_param("ttl", 1))
            return SendTransport(sock, [endpoint], group=True)
        sock.bind(_interface(uri))
        return SendTransport(sock, [endpoint])
    except BaseException:
        sock.close()
        raise


def open_receive(uri: ChannelUri, buffer_size: int) -> ReceiveTransport:
    """The sockets a subscription on ``uri`` receives on. OSError when they cannot be bound."""
    sock = _udp_socket(buffer_size)
    try:
        endpoint = parse_address(uri.params["endpoint"])
        if uri.is_multicast:
            interface = _interface(uri)[0]
            ttl = uri.int_param("ttl", 1)
            _join(sock, endpoint, interface, ttl)
            control = control_group(endpoint)
            control_sock = _udp_socket(buffer_size)
            try:
                _join(control_sock, control, interface, ttl)
            except BaseException:
                control_sock.close()
                raise
            return ReceiveTransport(sock, control, control_sock)
        _bind_endpoint(sock, endpoint)
        announce = parse_address(uri.params["control"]) if "control" in uri.params else None
        return ReceiveTransport(sock, announce_to=announce)
    except BaseException:
        sock.close()
        raise
