"""The ``--json`` documents of ``shmbus stat``, ``streams``, ``clients`` and ``errors``.

Each is one JSON object on one line: the command, the time of the sample, the bus directory
and the bus's state (driver pid, heartbeat, ...), then the command's own list: ``stat`` the
counters with their rates, ``streams`` the publications and network images with their
subscribers and verdicts (and the request/reply services), ``clients`` the attached clients
and their processes, ``errors`` the driver's distinct errors, oldest first. Every field is
described in the JSON Schema (draft 2020-12) of its command, shipped with the package as
``shmbus/cli/schema/<command>.schema.json`` (:func:`schema_path`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

from shmbus.cli.bus_status import BusStatus
from shmbus.cli.snapshot import BusSnapshot
from shmbus.shm.error_log import ErrorObservation

#: The commands with a ``--json`` document, each with a schema file.
COMMANDS = ("stat", "streams", "clients", "errors")

#: The ``shmbus stat --json`` document, as ``shmbus stat --help`` shows it (valid JSON).
STAT_JSON_EXAMPLE = """\
{"command": "stat", "time_ms": 1718000000123,
 "directory": "/dev/shm/shmbus-me",
 "bus": {"state": "running", "reason": null,
         "cnc": "/dev/shm/shmbus-me/cnc.dat", "layout_version": 2,
         "driver_pid": 4200, "driver_start_time_ms": 1717999990000,
         "heartbeat_ms": 1718000000111, "heartbeat_age_ms": 12,
         "client_liveness_timeout_ms": 10000},
 "counters": [
   {"id": 9, "type": "pub-lmt", "type_id": 1,
    "label": "pub-lmt: 5 -77 7 aeron:ipc", "value": 43008, "rate": 2048.0,
    "registration_id": 5, "owner_id": 3, "reference_id": -77,
    "stream_id": 7, "session_id": -77, "channel": "aeron:ipc",
    "client_pid": 4240, "client_name": "pub"}]}"""


def schema_path(command: str) -> Traversable:
    """The JSON Schema file of ``command``'s ``--json`` document (one of :data:`COMMANDS`)."""
    if command not in COMMANDS:
        raise ValueError(f"no JSON document for {command!r}: one of {', '.join(COMMANDS)}")
    return resources.files("shmbus.cli").joinpath("schema", f"{command}.schema.json")


def load_schema(command: str) -> dict[str, Any]:
    """The JSON Schema of ``command``'s ``--json`` document, parsed."""
    schema: dict[str, Any] = json.loads(schema_path(command).read_text(encoding="utf-8"))
    return schema


def bus_json(snapshot: BusSnapshot, status: BusStatus) -> dict[str, Any]:
    """The ``bus`` object every document has: the bus's state and its driver."""
    driver = snapshot.driver
    return {
        "state": status.state,
        "reason": status.reason,
        "cnc": driver.cnc_path,
        "layout_version": driver.layout_version,
        "driver_pid": driver.pid,
        "driver_start_time_ms": driver.start_time_ms,
        "heartbeat_ms": driver.heartbeat_ms,
        "heartbeat_age_ms": status.heartbeat_age_ms,
        "client_liveness_timeout_ms": driver.client_liveness_timeout_ms,
    }


def document(command: str, snapshot: BusSnapshot, status: BusStatus,
             **body: Any) -> dict[str, Any]:
    """The document of ``command``: the keys every document has, then ``body`` (the
    command's own lists, already in their JSON form)."""
    return {"command": command, "time_ms": snapshot.time_ms, "directory": snapshot.directory,
            "bus": bus_json(snapshot, status), **body}


def errors_json(errors: Sequence[ErrorObservation]) -> list[dict[str, Any]]:
    """The ``errors`` of ``shmbus errors --json``, in the order given (the log's: oldest
    first)."""
    return [{"count": e.observation_count, "first_ms": e.first_observation_ms,
             "last_ms": e.last_observation_ms, "text": e.text} for e in errors]
