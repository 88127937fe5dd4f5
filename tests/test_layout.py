"""The import rules that keep the three processes apart, read from the source (no imports run).

* The plain settings and values of the top package (context, errors, codes, channel_uri,
  idle_strategy, keyring) and shmbus/shm/ (what every process maps, with the control protocol
  ``shmbus.shm.control_protocol``) are what every process may share.
* shmbus/driver/ (the driver process) imports no client module: only itself, shmbus/shm/ and
  the plain settings; never the top package itself, whose __init__ pulls in the client.
* The client (the top-level modules of shmbus/, but ``__main__``, the ``shmbus`` command) never
  imports shmbus/driver/, shmbus/cli/ or netbridge/: it starts a driver as a process, and the
  commands import the client, not the other way round.
* netbridge/ (the netbridge process) imports shmbus only through the public API (the top
  package, ``from shmbus import Client``), shmbus/shm/ and the plain settings; never the
  driver, the CLI or a client module by its own name.
* shmbus/shm/ imports only itself, the standard library and numpy.
* shmbus/archive/ imports no driver module.
* netbridge/sender.py and netbridge/receiver.py (the sans-IO state machines) reach logs only
  through netbridge.log_port: they import neither the native cores (shmbus.shm._native,
  netbridge._io), nor the log buffer, nor
  the counters, nor netbridge.shared_log (the port over shared memory).
* examples/ and tools/ use the public API only: names in ``shmbus.__all__``, ``shmbus.spark``
  and names in ``netbridge.__all__``; never the tests.
* tools/ is programs (a module with an ``if __name__ == "__main__":`` block, run as
  ``python -m tools.bench.ipc``) and the shared modules they import; no program imports another.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import netbridge
import shmbus

ROOT = Path(__file__).resolve().parents[1]
PLAIN_SETTINGS = {f"shmbus.{name}" for name in
                  ("context", "errors", "codes", "channel_uri", "idle_strategy", "keyring")}
PUBLIC = {"shmbus": {*shmbus.__all__, "spark"}, "netbridge": set(netbridge.__all__)}


def _python_files(root: Path, folder: str) -> list[Path]:
    """The files under ``folder``; for ``shmbus`` (the client) only its top-level modules."""
    if folder == "shmbus":
        files = sorted(path for path in (root / folder).glob("*.py") if path.stem != "__main__")
    else:
        files = sorted((root / folder).rglob("*.py"))
    assert files, f"no Python files under {folder}"
    return files


def _imports(root: Path, path: Path) -> Iterator[tuple[int, str]]:
    """(line, module) for each module a file imports, in functions too: ``from m import n``
    imports the submodule ``m.n`` when there is one, else ``m``."""
    def is_module(dotted: str) -> bool:
        file = root.joinpath(*dotted.split("."))
        return file.with_suffix(".py").is_file() or (file / "__init__.py").is_file()

    package = path.relative_to(root).parent.parts
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            parts = [*package[:len(package) - node.level + 1]] if node.level else []
            module = ".".join([*parts, node.module] if node.module else parts)
            for alias in node.names:
                submodule = f"{module}.{alias.name}"
                yield node.lineno, submodule if is_module(submodule) else module


def _violations(root: Path, folder: str, allowed: Callable[[str], bool]) -> list[str]:
    """``file:line imports module`` for each import under ``folder`` that ``allowed`` refuses."""
    return sorted(f"{path.relative_to(root)}:{line} imports {module}"
                  for path in _python_files(root, folder)
                  for line, module in _imports(root, path) if not allowed(module))


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _driver_may_import(module: str) -> bool:
    return (not _within(module, "shmbus") or _within(module, "shmbus.driver")
            or _within(module, "shmbus.shm") or module in PLAIN_SETTINGS)


def _client_may_import(module: str) -> bool:
    return not any(_within(module, package)
                   for package in ("shmbus.driver", "shmbus.cli", "netbridge"))


def _netbridge_may_import(module: str) -> bool:
    return (not _within(module, "shmbus") or module == "shmbus"
            or _within(module, "shmbus.shm") or module in PLAIN_SETTINGS)


def _shm_may_import(module: str) -> bool:
    top = module.split(".")[0]
    return _within(module, "shmbus.shm") or top in sys.stdlib_module_names or top == "numpy"


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


def test_the_driver_imports_no_client_module() -> None:
    assert _violations(ROOT, "shmbus/driver", _driver_may_import) == []


def test_the_client_imports_neither_the_driver_nor_the_commands_nor_the_netbridge() -> None:
    assert _violations(ROOT, "shmbus", _client_may_import) == []


def test_the_netbridge_uses_shmbus_through_the_public_api_shm_and_settings() -> None:
    assert _violations(ROOT, "netbridge", _netbridge_may_import) == []


def test_shared_memory_structures_import_only_themselves_stdlib_and_numpy() -> None:
    assert _violations(ROOT, "shmbus/shm", _shm_may_import) == []


def test_the_archive_imports_no_driver_module() -> None:
    assert _violations(ROOT, "shmbus/archive",
                       lambda module: not _within(module, "shmbus.driver")) == []


SANS_IO = ("netbridge/sender.py", "netbridge/receiver.py")
SANS_IO_REFUSED = ("shmbus.shm._native", "netbridge._io", "shmbus.shm.log_buffer",
                   "shmbus.shm.counters", "netbridge.shared_log")


def _sans_io_violations(root: Path) -> list[str]:
    """``file:line imports module`` for each log or shared-memory import of the netbridge's
    sans-IO state machines."""
    return sorted(f"{name}:{line} imports {module}" for name in SANS_IO
                  for line, module in _imports(root, root / name)
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
        "shmbus/client.py": (
            "import psutil\nfrom shmbus.shm import control_protocol\n"
            "from shmbus.driver.conductor import X\nfrom . import cli\n"
            "def f():\n    import netbridge\n"),
        "shmbus/codes.py": "",
        "shmbus/cli/__init__.py": "",
        "shmbus/driver/__init__.py": "",
        "shmbus/driver/bad.py": (
            "import os\nimport shmbus\nfrom shmbus import client, codes, connect\n"
            "from shmbus.shm.counters import SUB_POS\nfrom . import other\n"
            "def f():\n    from ..publication import Publication\n"),
        "shmbus/shm/bad.py": "import struct, numpy\nimport psutil\nfrom shmbus import codes\n",
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
        "netbridge/bad.py": (
            "import socket\nfrom shmbus import Client\nfrom shmbus.client import Client\n"
            "from shmbus.shm import control_protocol\nfrom shmbus.context import Context\n"
            "from shmbus.driver.conductor import X\nfrom shmbus.image import Image\n"
            "from netbridge.frames import Nak\n"),
        "examples/bad.py": (
            "import shmbus\nfrom shmbus import Publication, LogBufferReader\n"
            "from shmbus.shm.counters import SUB_POS\nimport tests.conftest\n"
            "from netbridge.frames import Nak\nfrom netbridge import Nak\n"
            "import shmbus.spark\nprint(shmbus.client, shmbus.Client)\n"),
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert _violations(tmp_path, "shmbus/driver", _driver_may_import) == [
        "shmbus/driver/bad.py:2 imports shmbus",
        "shmbus/driver/bad.py:3 imports shmbus",  # connect: a name of the top package
        "shmbus/driver/bad.py:3 imports shmbus.client",
        "shmbus/driver/bad.py:7 imports shmbus.publication",
    ]
    assert _violations(tmp_path, "shmbus", _client_may_import) == [
        "shmbus/client.py:3 imports shmbus.driver.conductor",
        "shmbus/client.py:4 imports shmbus.cli",
        "shmbus/client.py:6 imports netbridge",
    ]
    assert _violations(tmp_path, "netbridge", _netbridge_may_import) == [
        "netbridge/bad.py:3 imports shmbus.client",
        "netbridge/bad.py:6 imports shmbus.driver.conductor",
        "netbridge/bad.py:7 imports shmbus.image",
    ]
    assert _violations(tmp_path, "shmbus/shm", _shm_may_import) == [
        "shmbus/shm/bad.py:2 imports psutil",
        "shmbus/shm/bad.py:3 imports shmbus.codes",
    ]
    assert _violations(tmp_path, "shmbus/archive",
                       lambda module: not _within(module, "shmbus.driver")) == [
        "shmbus/archive/bad.py:1 imports shmbus.driver.conductor"]
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
