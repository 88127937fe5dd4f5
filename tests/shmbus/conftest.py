"""Fixtures of the shmbus tests: spawned client processes, and one local Spark session."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.support.processes import Processes


@pytest.fixture
def procs() -> Iterator[Processes]:
    """Spawned member processes and their result queue; every one stopped after the test."""
    processes = Processes()
    try:
        yield processes
    finally:
        processes.close()


@pytest.fixture
def start_process(procs: Processes) -> Callable[..., Any]:
    """Starts a spawn process ``start_process(target, *args, **kwargs)``; any still alive at
    teardown is killed."""
    return procs.start


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local SparkSession (local[2], 127.0.0.1, no UI) with shmbus's data sources
    registered, for the whole run. Fails (never skips) without Java."""
    java = shutil.which("java", path=os.pathsep.join(filter(None, [
        os.path.join(os.environ.get("JAVA_HOME", ""), "bin"), os.environ.get("PATH")])))
    if java is None:
        pytest.fail("java is not installed: the Spark tests need a Java 17 (or 21) runtime on "
                    "PATH or in JAVA_HOME, e.g. apt-get install openjdk-17-jre-headless")
    version = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    if version.returncode != 0:
        pytest.fail(f"{java} -version failed: {version.stderr}")
    from pyspark.sql import SparkSession

    import shmbus.spark as ss

    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (SparkSession.builder.master("local[2]").appName("shmbus-tests")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.pyspark.python", sys.executable)
               .config("spark.pyspark.driver.python", sys.executable)
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    ss.register(session)
    try:
        yield session
    finally:
        session.stop()
