"""Networks on one machine, for the network benchmarks and the netbridge tests: free UDP and
TCP ports on loopback, and hosts as Linux network namespaces on a bridge, each with a bus and
a driver that starts the host's netbridge. The one copy: fanout.py and tests/netbridge import
it from here (tools/ imports nothing from tests/). Runs in the parent process of a benchmark or
in the test process; the namespaces need root (``ip netns``).
"""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from tools.bench.harness import start_driver, stop_driver

_calls = itertools.count()


def free_udp_ports(count: int) -> list[int]:
    """``count`` distinct UDP ports free on 127.0.0.1 now (all held open together while they
    are chosen: one at a time, the kernel may hand out the same port twice)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def free_tcp_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ip(*args: str) -> None:
    """Run ``ip ARGS``; CalledProcessError if it fails."""
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@dataclass(frozen=True)
class Host:
    """A namespace with one address on the hosts' network."""

    name: str
    address: str

    @property
    def exec_prefix(self) -> tuple[str, ...]:
        return ("ip", "netns", "exec", self.name)


@contextmanager
def hosts(count: int, subnet: int) -> Iterator[list[Host]]:
    """``count`` namespaces on 10.<subnet>.0.0/24, joined by a Linux bridge in the root
    namespace, each with a route for multicast; all removed on exit, also after a failure."""
    # unique per call: a deleted namespace's veth pairs go away asynchronously, so the next
    # call in the same process must not reuse their names
    tag = f"{os.getpid() % 100000}x{next(_calls) % 100}"
    bridge = f"sb{tag}"
    made: list[Host] = []
    ip("link", "add", bridge, "type", "bridge")
    try:
        ip("link", "set", bridge, "up")
        for i in range(count):
            host = Host(f"shmbus-{tag}-{i}", f"10.{subnet}.0.{i + 1}")
            outside, inside = f"sv{tag}h{i}", f"sv{tag}n{i}"
            ip("netns", "add", host.name)
            made.append(host)
            ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            ip("link", "set", outside, "master", bridge, "up")
            ip("link", "set", inside, "netns", host.name)
            ip("-n", host.name, "addr", "add", f"{host.address}/24", "dev", inside)
            ip("-n", host.name, "link", "set", inside, "up")
            ip("-n", host.name, "link", "set", "lo", "up")
            ip("-n", host.name, "route", "add", "224.0.0.0/4", "dev", inside)
        yield made
    finally:
        for i, host in enumerate(made):
            subprocess.run(["ip", "link", "del", f"sv{tag}h{i}"], capture_output=True)
            subprocess.run(["ip", "netns", "del", host.name], capture_output=True)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)


class HostBuses(NamedTuple):
    """Hosts, each with a bus (its context) and a driver process serving it in the host's
    namespace (the driver starts the host's netbridge when a udp channel appears)."""

    hosts: list[Host]
    contexts: list[Any]  # shmbus.Context
    drivers: list[subprocess.Popen[bytes]]


@contextmanager
def host_buses(root: Path, count: int, subnet: int,
               settings: dict[int, dict[str, Any]] | None = None) -> Iterator[HostBuses]:
    """``count`` hosts (see :func:`hosts`), each with a bus directory under ``root`` and a
    driver in its namespace; host ``i``'s context takes ``settings[i]`` too. Drivers stopped
    (they stop their netbridges) and namespaces removed on exit, also after a failure; a driver
    that does not start raises harness.BenchError."""
    import shmbus

    settings = settings or {}
    with hosts(count, subnet) as made, ExitStack() as running:
        contexts = [shmbus.Context(dir=str(root / host.name), embedded_driver=False,
                                   driver_idle_timeout=600, **settings.get(i, {}))
                    for i, host in enumerate(made)]
        drivers = []
        for context, host in zip(contexts, made, strict=True):
            drivers.append(start_driver(context, host.exec_prefix))
            running.callback(stop_driver, drivers[-1])
        yield HostBuses(made, contexts, drivers)
