"""The distributions: a wheel with the compiled extensions that works in a clean venv, and an
sdist that carries their C sources and builds that wheel.

Built once per module from this checkout into temporary folders (pip and build fetch setuptools
and the dependencies from pip's cache or the index, as a user's install would).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parents[1]
PACKAGES = ["shmbus", "shmbus/driver", "shmbus/shm", "shmbus/archive", "shmbus/cli", "netbridge"]
# PYTHONPATH could put the checkout before the installed package; SHMBUS_* would change settings.
CLEAN_ENV = {name: value for name, value in os.environ.items()
             if name not in ("PYTHONPATH", "VIRTUAL_ENV") and not name.startswith("SHMBUS_")}
CLEAN_ENV["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"


def run(*command: str | Path, cwd: Path, timeout: float = 120, path: Path | None = None) -> str:
    """Run a command (``path`` first on PATH); its output, or a failure showing that output."""
    env = dict(CLEAN_ENV)
    if path is not None:
        env["PATH"] = f"{path}{os.pathsep}{env.get('PATH', os.defpath)}"
    result = subprocess.run([str(part) for part in command], cwd=cwd, env=env,
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{command} exited {result.returncode}:\n" \
                                   f"{result.stdout}\n{result.stderr}"
    return result.stdout


def only(folder: Path, pattern: str) -> Path:
    """The one file in ``folder`` matching ``pattern``."""
    found = sorted(folder.glob(pattern))
    assert len(found) == 1, f"expected one {pattern} in {folder}, found {found}"
    return found[0]


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with the sdist and the wheel (`pip wheel .`) built from the checkout.

    Built from a copy without the checkout's build/ and egg-info, as a fresh clone has none:
    stale ones would put into the wheel or sdist files the configuration no longer does.
    """
    source = tmp_path_factory.mktemp("source") / "shmbus"
    shutil.copytree(CHECKOUT, source, ignore=shutil.ignore_patterns(
        ".*", "build", "*.egg-info", "__pycache__"))
    folder = tmp_path_factory.mktemp("dist")
    run(sys.executable, "-m", "build", "--sdist", "--outdir", folder, source, cwd=folder)
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", folder, source,
        cwd=folder)
    return folder


def test_wheel_holds_every_package_and_the_compiled_core_but_no_tests(dist: Path) -> None:
    wheel = zipfile.ZipFile(only(dist, "shmbus-*.whl"))
    names = wheel.namelist()
    for package in PACKAGES:
        assert f"{package}/__init__.py" in names, package
    # the compiled extensions and their stubs for type checkers, not their C sources
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    assert sorted(n for n in names if n.startswith("shmbus/shm/_native.")) == \
        sorted(["shmbus/shm/_native" + suffix, "shmbus/shm/_native.pyi"])
    assert sorted(n for n in names if n.startswith("netbridge/_io.")) == \
        sorted(["netbridge/_io" + suffix, "netbridge/_io.pyi"])
    assert not [n for n in names if n.endswith((".c", ".h"))]
    assert "shmbus/py.typed" in names
    assert not [n for n in names if n.split("/")[0] in ("tests", "tools", "examples")]
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    text = wheel.read(entry_points).decode()
    assert "shmbus = shmbus.cli:app" in text and "netbridge = netbridge.cli:app" in text


def test_sdist_carries_the_c_sources_and_builds_the_wheel(dist: Path, tmp_path: Path) -> None:
    sdist = only(dist, "shmbus-*.tar.gz")
    names = {name.split("/", 1)[1] for name in tarfile.open(sdist).getnames() if "/" in name}
    sources = {str(path.relative_to(CHECKOUT))
               for folder in ("shmbus/shm/native", "netbridge/native")
               for path in (CHECKOUT / folder).glob("*.[ch]")}
    assert sources and sources <= names
    assert {"setup.py", "pyproject.toml", "README.md"} <= names
    assert {f"{package}/__init__.py" for package in PACKAGES} <= names
    assert not [n for n in names if n.split("/")[0] in ("tests", "tools", "examples")]
    assert not [n for n in names if n.endswith(".so")], "a compiled module leaked into the sdist"

    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", tmp_path, sdist,
        cwd=tmp_path)
    built = zipfile.ZipFile(only(tmp_path, "shmbus-*.whl")).namelist()
    assert [n for n in built if n.startswith("shmbus/shm/_native.") and n.endswith(".so")]
    assert [n for n in built if n.startswith("netbridge/_io.") and n.endswith(".so")]


def test_wheel_installed_in_a_clean_venv_runs_a_pub_sub_and_the_cli(dist: Path,
                                                                     tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)
    bin_dir = venv / "bin"
    # This pip installs into the venv (--python): quicker than bootstrapping pip inside it.
    run(sys.executable, "-m", "pip", "--python", bin_dir / "python", "install", "--quiet",
        only(dist, "shmbus-*.whl"), cwd=tmp_path, timeout=300)

    # cibuildwheel's test-command, run as cibuildwheel runs it: by sh, with the venv's python
    # first on PATH, from a folder outside the checkout, so only the installed shmbus imports.
    config = tomllib.loads((CHECKOUT / "pyproject.toml").read_text())["tool"]["cibuildwheel"]
    command = config["test-command"].replace("{project}", str(CHECKOUT))
    output = run("sh", "-c", command, cwd=tmp_path, path=bin_dir)
    site_packages = venv / "lib" / f"python{sysconfig.get_python_version()}" / "site-packages"
    assert f"shmbus from {site_packages / 'shmbus' / '__init__.py'}" in output, output
    assert f"native core from {site_packages / 'shmbus' / 'shm' / '_native.'}" in output, output
    assert f"netbridge natives from {site_packages / 'netbridge' / '_io.'}" in output, output
    assert "1000 messages received exactly" in output, output

    assert "driver" in run(bin_dir / "shmbus", "--help", cwd=tmp_path)
    assert "Usage" in run(bin_dir / "netbridge", "--help", cwd=tmp_path)
