"""Hosts for network benchmarks: Linux network namespaces on a bridge, each with a bus and a
driver (started with the public command line, ``python -m shmbus.driver``) that starts the
host's netbridge. Runs in the benchmark's parent process; needs root (``ip netns``).

The tests have their own copy of the namespace set-up (tests/netbridge/namespaces.py): tools/
imports nothing from tests/.
"""

from __future__ import annotations

import itertools
import os
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from bench_netbridge import start_driver, stop_driver

_calls = itertools.count()


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@dataclass(frozen=True)
class Host:
    """A namespace with one address on the benchmark's network."""

    name: str
    address: str

    @property
    def exec_prefix(self) -> tuple[str, ...]:
        return ("ip", "netns", "exec", self.name)


@contextmanager
def hosts(count: int, subnet: int) -> Iterator[list[Host]]:
    """``count`` namespaces on 10.<subnet>.0.0/24 joined by a Linux bridge, each with a route
    for multicast; all removed on exit, also after a failure."""
    tag = f"{os.getpid() % 100000}b{next(_calls) % 100}"  # veth names must not be reused
    bridge = f"sb{tag}"
    made: list[Host] = []
    _ip("link", "add", bridge, "type", "bridge")
    try:
        _ip("link", "set", bridge, "up")
        for i in range(count):
            host = Host(f"shmbus-bench-{tag}-{i}", f"10.{subnet}.0.{i + 1}")
            outside, inside = f"sv{tag}h{i}", f"sv{tag}n{i}"
            _ip("netns", "add", host.name)
            made.append(host)
            _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            _ip("link", "set", outside, "master", bridge, "up")
            _ip("link", "set", inside, "netns", host.name)
            _ip("-n", host.name, "addr", "add", f"{host.address}/24", "dev", inside)
            _ip("-n", host.name, "link", "set", inside, "up")
            _ip("-n", host.name, "link", "set", "lo", "up")
            _ip("-n", host.name, "route", "add", "224.0.0.0/4", "dev", inside)
        yield made
    finally:
        for i, host in enumerate(made):
            subprocess.run(["ip", "link", "del", f"sv{tag}h{i}"], capture_output=True)
            subprocess.run(["ip", "netns", "del", host.name], capture_output=True)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)


class HostBuses(NamedTuple):
    """Hosts, each with a bus (its context) and the driver serving it in the host's namespace."""

    hosts: list[Host]
    contexts: list[Any]  # shmbus.Context
    drivers: list[subprocess.Popen]


@contextmanager
def host_buses(root: Path, count: int, subnet: int) -> Iterator[HostBuses]:
    """``count`` hosts, each with a bus directory under ``root`` and a driver in its
    namespace; drivers stopped and namespaces removed on exit, also after a failure."""
    import shmbus

    with hosts(count, subnet) as made, ExitStack() as running:
        contexts = [shmbus.Context(dir=str(root / host.name), embedded_driver=False,
                                   driver_idle_timeout=600) for host in made]
        drivers = []
        for context, host in zip(contexts, made, strict=True):
            drivers.append(start_driver(context, host.exec_prefix))
            running.callback(stop_driver, drivers[-1])
        yield HostBuses(made, contexts, drivers)
