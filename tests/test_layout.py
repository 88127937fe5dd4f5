"""The import rules that keep the processes and the layers apart, read from the source (no
imports run). Each rule is about folders, never a list of module names.

The folders of shmbus/, from the bottom up:

* shm/: what every process maps (with the control protocol); only itself, the standard
  library and numpy.
* settings/: what every process shares (Context, channel URIs, codes, errors, keyrings);
  only itself and shm/.
* codecs/: message bytes to and from arrays, objects and tables; only settings/ below it.
* streams/: publications, subscriptions, images, groups, large messages; never the client
  facade, calls/, history/ or archive/.
* calls/ (request/reply) and history/ (late joiners) are built on streams/; archive/
  (recorder, recording files) on the client; client/ (the facade) makes them all.
* driver/ (the driver process) imports only itself, shm/ and settings/: never the top package,
  whose __init__ pulls in the client.
* No client-side folder imports driver/, cli/ (the commands import the client, not the other
  way round) or netbridge/ (started as a process).
* netbridge/ (its own process) imports shmbus only through the public API (the top package),
  shm/ and settings/. Its sans-IO state machines (sender.py, receiver.py, receiver_image.py)
  reach logs only through netbridge.log_port.
* At the top of shmbus/: the public face (__init__), the command (__main__) and the Spark
  connector (spark); everything else is in a folder.
* No module imports itself in a circle, counting imports under ``TYPE_CHECKING``.
* examples/ and tools/ use the public API only: names in ``shmbus.__all__``, ``shmbus.spark``
  and names in ``netbridge.__all__``; never the tests.
* tools/ is programs (a module with an ``if __name__ == "__main__":`` block, run as
  ``python -m tools.bench.ipc``) and the shared modules they import; no program imports another.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Callable
from pathlib import Path

import netbridge
import shmbus
from tests.support.imports import imports

ROOT = Path(__file__).resolve().parents[1]
#: the folders of shmbus/ that run in a user's process
CLIENT_SIDE = ("client", "streams", "codecs", "calls", "history", "archive")
#: the modules at the top of shmbus/
TOP_MODULES = {"__init__", "__main__", "spark"}
PUBLIC = {"shmbus": {*shmbus.__all__, "spark"}, "netbridge": set(netbridge.__all__)}


def _python_files(root: Path, folder: str) -> list[Path]:
    """The files under ``folder``, its subfolders included."""
    files = sorted((root / folder).rglob("*.py"))
    assert files, f"no Python files under {folder}"
    return files


def _violations(root: Path, folder: str, allowed: Callable[[str], bool]) -> list[str]:
    """``file:line imports module`` for each import under ``folder`` that ``allowed`` refuses."""
    return sorted(f"{path.relative_to(root)}:{line} imports {module}"
                  for path in _python_files(root, folder)
                  for line, module in imports(root, path) if not allowed(module))


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _only(*packages: str, stdlib: bool = False, third_party: tuple[str, ...] = ()
          ) -> Callable[[str], bool]:
    """A rule that allows the shmbus or netbridge ``packages`` and, for anything else, every
    module (or with ``stdlib``, the standard library and ``third_party``)."""
    def allowed(module: str) -> bool:
        top = module.split(".")[0]
        if top in ("shmbus", "netbridge"):
            return any(_within(module, package) for package in packages)
        return not stdlib or top in sys.stdlib_module_names or top in third_party
    return allowed


def _never(*packages: str) -> Callable[[str], bool]:
    return lambda module: not any(_within(module, package) for package in packages)


def _client_side_violations(root: Path) -> list[str]:
    return sorted(violation for folder in ("shmbus/" + name for name in CLIENT_SIDE)
                  for violation in _violations(root, folder,
                                               _never("shmbus.driver", "shmbus.cli", "netbridge")))


def _top_level_violations(root: Path) -> list[str]:
    """The client modules at the top of shmbus/ besides the public face, the command and spark
    (``shmbus.spark``, a public module); they import as the client side does."""
    found = [f"shmbus/{path.name} is not in a folder" for path in (root / "shmbus").glob("*.py")
             if path.stem not in TOP_MODULES]
    return found + sorted(
        f"{path.relative_to(root)}:{line} imports {module}"
        for path in (root / "shmbus").glob("*.py") if path.stem != "__main__"
        for line, module in imports(root, path)
        if not _never("shmbus.driver", "shmbus.cli", "netbridge")(module))


def _circles(root: Path) -> list[list[str]]:
    """The import circles among the modules of shmbus/ and netbridge/ (Tarjan's strongly
    connected components with more than one module), each sorted."""
    modules = {".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__"):
               path for folder in ("shmbus", "netbridge") for path in _python_files(root, folder)}
    graph = {name: sorted({module for _, module in imports(root, path)
                           if module in modules and module != name})
             for name, path in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        for other in graph[name]:
            if other not in index:
                visit(other)
                low[name] = min(low[name], low[other])
            elif other in stack:
                low[name] = min(low[name], index[other])
        if low[name] == index[name]:
            component = []
            while True:
                other = stack.pop()
                component.append(other)
                if other == name:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for name in graph:
        if name not in index:
            visit(name)
    return sorted(circles)


def _public_api_violations(root: Path, folder: str) -> list[str]:
    """Imports of private shmbus or netbridge modules or names, or of the tests, and uses of
    ``shmbus.X`` (or ``netbridge.X``) for an X that is not public, under ``folder``."""
    found = []
    for path in _python_files(root, folder):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            where = f"{path.relative_to(root)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Import):
                found += [f"{where} imports {alias.name}" for alias in node.names
                          if alias.name.split(".")[0] in (*PUBLIC, "tests")
                          and alias.name not in (*PUBLIC, "shmbus.spark")]
            elif isinstance(node, ast.ImportFrom) and node.module is not None:
                top = node.module.split(".")[0]
                if top == "tests" or (top in PUBLIC
                                      and node.module not in (*PUBLIC, "shmbus.spark")):
                    found.append(f"{where} imports from {node.module}")
                elif node.module in PUBLIC:
                    found += [f"{where} imports {node.module}.{alias.name}"
                              for alias in node.names if alias.name not in PUBLIC[node.module]]
            elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                  and node.value.id in PUBLIC and node.attr not in PUBLIC[node.value.id]):
                found.append(f"{where} uses {node.value.id}.{node.attr}")
    return sorted(found)


SHM = _only("shmbus.shm", stdlib=True, third_party=("numpy",))
SETTINGS = _only("shmbus.settings", "shmbus.shm")
CODECS = _only("shmbus.codecs", "shmbus.settings")
STREAMS = _never("shmbus.client", "shmbus.calls", "shmbus.history", "shmbus.archive")
DRIVER = _only("shmbus.driver", "shmbus.shm", "shmbus.settings")
NETBRIDGE = _only("netbridge", "shmbus.shm", "shmbus.settings")


def test_shared_memory_structures_import_only_themselves_stdlib_and_numpy() -> None:
    assert _violations(ROOT, "shmbus/shm", SHM) == []


def test_settings_import_only_themselves_and_shared_memory() -> None:
    assert _violations(ROOT, "shmbus/settings", SETTINGS) == []


def test_codecs_import_no_client_module() -> None:
    assert _violations(ROOT, "shmbus/codecs", CODECS) == []


def test_streams_import_nothing_built_on_them() -> None:
    assert _violations(ROOT, "shmbus/streams", STREAMS) == []


def test_the_driver_imports_no_client_module() -> None:
    assert _violations(ROOT, "shmbus/driver", DRIVER) == []


def test_the_client_side_imports_neither_the_driver_nor_the_commands_nor_the_netbridge() -> None:
    assert _client_side_violations(ROOT) == []


def test_every_client_module_is_in_a_folder_by_concept() -> None:
    assert _top_level_violations(ROOT) == []


def test_the_netbridge_uses_shmbus_through_the_public_api_shm_and_settings() -> None:
    def allowed(module: str) -> bool:
        return module == "shmbus" or NETBRIDGE(module)
    assert _violations(ROOT, "netbridge", allowed) == []


def test_no_module_imports_itself_in_a_circle() -> None:
    assert _circles(ROOT) == []


def test_the_archive_imports_no_driver_module() -> None:
    assert _violations(ROOT, "shmbus/archive", _never("shmbus.driver")) == []


SANS_IO = ("netbridge/sender.py", "netbridge/receiver.py", "netbridge/receiver_image.py")
SANS_IO_REFUSED = ("shmbus.shm._native", "netbridge._io", "shmbus.shm.log_buffer",
                   "shmbus.shm.counters", "netbridge.shared_log")


def _sans_io_violations(root: Path) -> list[str]:
    """``file:line imports module`` for each log or shared-memory import of the netbridge's
    sans-IO state machines."""
    return sorted(f"{name}:{line} imports {module}" for name in SANS_IO
                  for line, module in imports(root, root / name)
                  if any(_within(module, refused) for refused in SANS_IO_REFUSED))


def test_the_netbridge_state_machines_reach_logs_only_through_the_port() -> None:
    assert _sans_io_violations(ROOT) == []


def test_examples_import_only_the_public_api() -> None:
    assert _public_api_violations(ROOT, "examples") == []


def test_tools_import_only_the_public_api() -> None:
    assert _public_api_violations(ROOT, "tools") == []


def _is_program(path: Path) -> bool:
    """Whether the module at ``path`` has an ``if __name__ == "__main__":`` block."""
    return any(isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
               and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__"
               for node in ast.parse(path.read_text(), str(path)).body)


def test_no_program_in_tools_imports_another() -> None:
    programs = {".".join(path.relative_to(ROOT).with_suffix("").parts)
                for path in _python_files(ROOT, "tools") if _is_program(path)}
    assert {"tools.bench.ipc", "tools.bench.netbridge", "tools.nemesis.run"} <= programs
    assert _violations(ROOT, "tools", lambda module: module not in programs) == []


def test_the_rules_refuse_what_they_must(tmp_path: Path) -> None:
    """On a made-up tree, each rule names every import it must refuse, and only those."""
    files = {
        "shmbus/__init__.py": "",
        "shmbus/__main__.py": "from shmbus.cli import main\n",
        "shmbus/loose.py": "import os\nfrom shmbus.driver import conductor\n",
        "shmbus/client/__init__.py": "",
        "shmbus/client/client.py": (
            "import psutil\nfrom shmbus.shm import control_protocol\n"
            "from shmbus.driver.conductor import X\nfrom .. import cli\n"
            "def f():\n    import netbridge\n"),
        "shmbus/streams/__init__.py": "",
        "shmbus/streams/a.py": (
            "from shmbus.streams import b\nfrom shmbus.codecs import c\n"
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from shmbus.client.client import Client\n"),
        "shmbus/streams/b.py": "from shmbus.streams import a\nfrom shmbus.calls import r\n",
        "shmbus/codecs/__init__.py": "",
        "shmbus/codecs/c.py": (
            "import json\nfrom shmbus.settings import codes\nfrom shmbus.streams import a\n"
            "from shmbus.shm import counters\n"),
        "shmbus/settings/__init__.py": "",
        "shmbus/calls/r.py": "",
        "shmbus/history/__init__.py": "",
        "shmbus/settings/codes.py": "from shmbus.shm import counters\nfrom shmbus import codecs\n",
        "shmbus/cli/__init__.py": "",
        "shmbus/driver/__init__.py": "",
        "shmbus/driver/conductor.py": "",
        "shmbus/driver/bad.py": (
            "import os\nimport shmbus\nfrom shmbus import client, connect\n"
            "from shmbus.shm.counters import SUB_POS\nfrom . import conductor\n"
            "from shmbus.settings import codes\n"
            "def f():\n    from ..streams import publication\n"),
        "shmbus/shm/__init__.py": "",
        "shmbus/shm/counters.py": "",
        "shmbus/shm/control_protocol.py": "",
        "shmbus/shm/bad.py": (
            "import struct, numpy\nimport psutil\nfrom shmbus.settings import codes\n"),
        "shmbus/archive/bad.py": "from shmbus.driver.conductor import X\nimport shmbus\n",
        "shmbus/shm/_native.py": "",
        "shmbus/shm/log_buffer.py": "",
        "netbridge/__init__.py": "",
        "netbridge/log_port.py": "",
        "netbridge/sender.py": (
            "from shmbus.shm import _native\nfrom netbridge.log_port import Scan\n"
            "import shmbus.shm.counters\n"),
        "netbridge/receiver.py": (
            "from shmbus.shm.log_buffer import LogBuffer\n"
            "def f():\n    from .shared_log import SharedImageLog\n"),
        "netbridge/receiver_image.py": "",
        "netbridge/bad.py": (
            "import socket\nfrom shmbus import Client\nfrom shmbus.client.client import Client\n"
            "from shmbus.shm import control_protocol\nfrom shmbus.settings.context import Context\n"
            "from shmbus.driver.conductor import X\nfrom shmbus.streams.image import Image\n"
            "from netbridge.frames import Nak\n"),
        "examples/bad.py": (
            "import shmbus\nfrom shmbus import Publication, LogBufferReader\n"
            "from shmbus.shm.counters import SUB_POS\nimport tests.conftest\n"
            "from netbridge.frames import Nak\nfrom netbridge import Nak\n"
            "import shmbus.spark\nprint(shmbus.client.client, shmbus.Client)\n"),
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert _violations(tmp_path, "shmbus/driver", DRIVER) == [
        "shmbus/driver/bad.py:2 imports shmbus",
        "shmbus/driver/bad.py:3 imports shmbus",  # connect: a name of the top package
        "shmbus/driver/bad.py:3 imports shmbus.client",
        "shmbus/driver/bad.py:8 imports shmbus.streams",
    ]
    assert _client_side_violations(tmp_path) == [
        "shmbus/archive/bad.py:1 imports shmbus.driver.conductor",
        "shmbus/client/client.py:3 imports shmbus.driver.conductor",
        "shmbus/client/client.py:4 imports shmbus.cli",
        "shmbus/client/client.py:6 imports netbridge",
    ]
    assert _top_level_violations(tmp_path) == [
        "shmbus/loose.py is not in a folder",
        "shmbus/loose.py:2 imports shmbus.driver.conductor",
    ]
    assert _violations(tmp_path, "shmbus/streams", STREAMS) == [
        "shmbus/streams/a.py:5 imports shmbus.client.client",
        "shmbus/streams/b.py:2 imports shmbus.calls.r",
    ]
    assert _violations(tmp_path, "shmbus/codecs", CODECS) == [
        "shmbus/codecs/c.py:3 imports shmbus.streams.a",
        "shmbus/codecs/c.py:4 imports shmbus.shm.counters",
    ]
    assert _violations(tmp_path, "shmbus/settings", SETTINGS) == [
        "shmbus/settings/codes.py:2 imports shmbus.codecs",
    ]
    assert _circles(tmp_path) == [["shmbus.codecs.c", "shmbus.streams.a", "shmbus.streams.b"]]
    assert _violations(tmp_path, "netbridge", NETBRIDGE) == [
        "netbridge/bad.py:2 imports shmbus",
        "netbridge/bad.py:3 imports shmbus.client.client",
        "netbridge/bad.py:6 imports shmbus.driver.conductor",
        "netbridge/bad.py:7 imports shmbus.streams.image",
    ]
    assert _violations(tmp_path, "shmbus/shm", SHM) == [
        "shmbus/shm/bad.py:2 imports psutil",
        "shmbus/shm/bad.py:3 imports shmbus.settings.codes",
    ]
    assert _sans_io_violations(tmp_path) == [
        "netbridge/receiver.py:1 imports shmbus.shm.log_buffer",
        "netbridge/receiver.py:3 imports netbridge.shared_log",
        "netbridge/sender.py:1 imports shmbus.shm._native",
        "netbridge/sender.py:3 imports shmbus.shm.counters",
    ]
    assert _public_api_violations(tmp_path, "examples") == [
        "examples/bad.py:2 imports shmbus.LogBufferReader",
        "examples/bad.py:3 imports from shmbus.shm.counters",
        "examples/bad.py:4 imports tests.conftest",
        "examples/bad.py:5 imports from netbridge.frames",
        "examples/bad.py:8 uses shmbus.client",
    ]
