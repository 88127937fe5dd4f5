"""The layout of tests/, read from the source (no test module is imported here):

* No module under tests/ imports a test module (``test_*``) or a conftest.py: what tests share
  is in tests/support/, and fixtures reach a test through pytest, from the conftest.py files
  of its folder and the folders above.
* Outside tests/support/, a module of tests/ is a test module, a conftest.py or an
  __init__.py; at the top of tests/ also a script run on its own (a module with an
  ``if __name__ == "__main__":`` block: wheel_smoke.py).
* A process a test spawns runs a function of tests/support/workers/, never one of a test
  module (the child imports the module of its target).
* The test tree mirrors the repository: a test module in tests/<folder>/ tests what is in
  <folder>/ (tests/shmbus/streams/ shmbus/streams/, tests/netbridge/ netbridge/,
  tests/tools/bench/ tools/bench/, tests/docs/ docs/). tests/support/ holds no test.
* Directly in the mirror of a folder whose code is split into subfolders (shmbus/), a test
  module tests one of that folder's own modules: it is named test_<module>.py or
  test_<module>_<topic>.py (tests/shmbus/test_spark.py for shmbus/spark.py).
* The test modules at the top of tests/ check the whole repository (layout, packaging,
  examples, protocol citations, docs): they import shmbus and netbridge only as the top
  packages, never one of their modules, and nothing of tools/.
* Every folder of tests/ that holds Python files is a package (an __init__.py), so two test
  modules of one name in two folders stay apart.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.imports import imports

ROOT = Path(__file__).resolve().parents[1]
#: the packages a whole-repository check may import only as themselves
SOURCE_PACKAGES = ("shmbus", "netbridge", "tools")


def _is_test(path: Path) -> bool:
    return path.name.startswith("test_") and path.suffix == ".py"


def _tests_modules(root: Path) -> list[Path]:
    return sorted(path for path in (root / "tests").rglob("*.py")
                  if "__pycache__" not in path.parts)


def _where(root: Path, path: Path) -> str:
    return str(path.relative_to(root))


def _imported_tests(root: Path) -> list[str]:
    """``file:line imports module`` for each import of a test module or a conftest.py by a
    module under tests/."""
    return sorted({f"{_where(root, path)}:{line} imports {module}"
                   for path in _tests_modules(root)
                   for line, module in imports(root, path)
                   if module.split(".")[0] == "tests"
                   and (module.rpartition(".")[2].startswith("test_")
                        or module.rpartition(".")[2] == "conftest")})


def _is_script(path: Path) -> bool:
    """Whether the module at ``path`` has an ``if __name__ == "__main__":`` block."""
    return any(isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
               and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__"
               for node in ast.parse(path.read_text(), str(path)).body)


def _helpers_outside_support(root: Path) -> list[str]:
    """The modules of tests/ outside tests/support/ that are neither a test module, a
    conftest.py, an __init__.py nor a script at the top of tests/."""
    found = []
    for path in _tests_modules(root):
        folder = path.relative_to(root / "tests").parent.parts
        if folder[:1] == ("support",) or _is_test(path):
            continue
        if path.name in ("conftest.py", "__init__.py") or (not folder and _is_script(path)):
            continue
        found.append(f"{_where(root, path)} is a helper: it belongs in tests/support/")
    return found


#: the calls that start a process with a target given first (``procs.start(target, ...)``,
#: ``start_process(target, ...)``, ``pool.apply_async(target, ...)``) or as ``target=`` of
#: a ``Process``
_STARTS = {"start", "start_process", "apply_async", "apply", "map_async", "starmap_async"}


def _spawn_targets_in_tests(root: Path) -> list[str]:
    """``file:line`` for each process started with a function of the test module itself."""
    found = []
    for path in _tests_modules(root):
        if not _is_test(path):
            continue
        tree = ast.parse(path.read_text(), str(path))
        own = {node.name for node in tree.body
               if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = (node.func.attr if isinstance(node.func, ast.Attribute)
                    else node.func.id if isinstance(node.func, ast.Name) else "")
            targets = [k.value for k in node.keywords if k.arg == "target"] if (
                name == "Process") else node.args[:1] if name in _STARTS else []
            found += [f"{_where(root, path)}:{node.lineno} spawns {target.id}"
                      for target in targets
                      if isinstance(target, ast.Name) and target.id in own]
    return sorted(found)


def _unmirrored_tests(root: Path) -> list[str]:
    """The test modules whose folder mirrors no folder of the repository, or that sit at the
    top of the mirror of a folder split into subfolders without naming one of its modules."""
    found = []
    for path in _tests_modules(root):
        if not _is_test(path):
            continue
        folder = path.relative_to(root / "tests").parent
        if not folder.parts:
            continue
        source = root / folder
        if folder.parts[0] == "support":
            found.append(f"{_where(root, path)}: tests/support/ holds no test")
        elif not source.is_dir():
            found.append(f"{_where(root, path)}: there is no {folder}/ to mirror")
        elif any((sub / "__init__.py").is_file() for sub in source.iterdir() if sub.is_dir()):
            own = {module.stem for module in source.glob("*.py") if module.stem != "__init__"}
            name = path.stem.removeprefix("test_")
            if not any(name == module or name.startswith(module + "_") for module in own):
                found.append(f"{_where(root, path)}: names no module at the top of {folder}/; "
                             f"it belongs in the folder of the module it tests")
    return sorted(found)


def _top_level_tests_of_one_module(root: Path) -> list[str]:
    """``file:line imports module`` for each import of a shmbus, netbridge or tools module
    (anything but the top packages shmbus and netbridge) by a test module at the top of
    tests/."""
    return sorted(f"{_where(root, path)}:{line} imports {module}"
                  for path in sorted((root / "tests").glob("test_*.py"))
                  for line, module in imports(root, path)
                  if module.split(".")[0] in SOURCE_PACKAGES
                  and module not in ("shmbus", "netbridge"))


def _folders_without_init(root: Path) -> list[str]:
    """The folders of tests/ that hold Python files but no __init__.py."""
    folders = {path.parent for path in _tests_modules(root)}
    return sorted(f"{_where(root, folder)}/ has no __init__.py" for folder in folders
                  if not (folder / "__init__.py").is_file())


def test_no_module_of_the_tests_imports_a_test_module_or_a_conftest() -> None:
    assert _imported_tests(ROOT) == []


def test_helpers_and_spawn_targets_are_in_tests_support() -> None:
    assert _helpers_outside_support(ROOT) == []


def test_spawned_processes_run_functions_of_tests_support_workers() -> None:
    assert _spawn_targets_in_tests(ROOT) == []


def test_the_test_tree_mirrors_the_repository() -> None:
    assert _unmirrored_tests(ROOT) == []
    mirrors = {path.relative_to(ROOT / "tests").parent.as_posix()
               for path in _tests_modules(ROOT) if _is_test(path)}
    assert {"shmbus/streams", "shmbus/calls", "netbridge", "tools/bench", "."} <= mirrors


def test_the_tests_at_the_top_check_the_whole_repository() -> None:
    assert _top_level_tests_of_one_module(ROOT) == []


def test_every_folder_of_tests_is_a_package() -> None:
    assert _folders_without_init(ROOT) == []


def test_the_rules_refuse_what_they_must(tmp_path: Path) -> None:
    """On a made-up tree, each rule names every file it must refuse, and only those."""
    files = {
        "shmbus/__init__.py": "",
        "shmbus/spark.py": "",
        "shmbus/streams/__init__.py": "",
        "shmbus/streams/image.py": "",
        "netbridge/__init__.py": "",
        "netbridge/frames.py": "",
        "docs/index.md": "",
        "tests/__init__.py": "",
        "tests/conftest.py": "",
        "tests/wheel_smoke.py": "import shmbus\nif __name__ == '__main__':\n    pass\n",
        "tests/standalone.py": "import os\n",
        "tests/test_layout.py": "import shmbus\nimport netbridge\nfrom shmbus import connect\n",
        "tests/test_image.py": "from shmbus.streams import image\nimport tools.bench\n",
        "tests/support/__init__.py": "",
        "tests/support/waits.py": "from tests.shmbus.streams.test_image import helper\n",
        "tests/support/test_waits.py": "",
        "tests/shmbus/__init__.py": "",
        "tests/shmbus/conftest.py": "from tests.support import waits\n",
        "tests/shmbus/test_spark.py": "",
        "tests/shmbus/test_spark_sessions.py": "",
        "tests/shmbus/test_sparkle.py": "",
        "tests/shmbus/test_image.py": "",
        "tests/shmbus/streams/__init__.py": "",
        "tests/shmbus/streams/image_workers.py": "",
        "tests/shmbus/streams/test_image.py": (
            "from tests.conftest import start_driver\nfrom tests.support.waits import x\n"
            "def f():\n    from . import test_publication\n"),
        "tests/shmbus/streams/test_publication.py": (
            "import tests.shmbus.test_spark\nfrom .test_image import helper\n"
            "import multiprocessing, threading\nfrom tests.support.workers import w\n"
            "def child():\n    pass\n"
            "def test_x(procs, start_process):\n"
            "    multiprocessing.get_context('spawn').Process(target=child).start()\n"
            "    procs.start(child, 1)\n    start_process(w.child)\n"
            "    threading.Thread(target=child).start()\n    procs.start(w.child)\n"),
        "tests/shmbus/nowhere/__init__.py": "",
        "tests/shmbus/nowhere/test_x.py": "",
        "tests/netbridge/test_frames.py": "from tests.shmbus.streams import image_workers\n",
        "tests/docs/__init__.py": "",
        "tests/docs/test_site.py": "",
        "tests/fixtures/capture.pcap": "",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert _imported_tests(tmp_path) == [
        "tests/shmbus/streams/test_image.py:1 imports tests.conftest",
        "tests/shmbus/streams/test_image.py:4 imports tests.shmbus.streams.test_publication",
        "tests/shmbus/streams/test_publication.py:1 imports tests.shmbus.test_spark",
        "tests/shmbus/streams/test_publication.py:2 imports tests.shmbus.streams.test_image",
        "tests/support/waits.py:1 imports tests.shmbus.streams.test_image",
    ]
    assert _spawn_targets_in_tests(tmp_path) == [
        "tests/shmbus/streams/test_publication.py:8 spawns child",
        "tests/shmbus/streams/test_publication.py:9 spawns child",
    ]
    assert _helpers_outside_support(tmp_path) == [
        "tests/shmbus/streams/image_workers.py is a helper: it belongs in tests/support/",
        "tests/standalone.py is a helper: it belongs in tests/support/",
    ]
    assert _unmirrored_tests(tmp_path) == [
        "tests/shmbus/nowhere/test_x.py: there is no shmbus/nowhere/ to mirror",
        "tests/shmbus/test_image.py: names no module at the top of shmbus/; it belongs in the "
        "folder of the module it tests",
        "tests/shmbus/test_sparkle.py: names no module at the top of shmbus/; it belongs in the "
        "folder of the module it tests",
        "tests/support/test_waits.py: tests/support/ holds no test",
    ]
    assert _top_level_tests_of_one_module(tmp_path) == [
        "tests/test_image.py:1 imports shmbus.streams.image",
        "tests/test_image.py:2 imports tools.bench",
    ]
    assert _folders_without_init(tmp_path) == ["tests/netbridge/ has no __init__.py"]
