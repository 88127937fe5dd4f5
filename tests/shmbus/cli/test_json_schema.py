"""The ``--json`` documents of ``shmbus stat``, ``streams``, ``clients`` and ``errors`` match
their JSON Schemas (shmbus/cli/schema/<command>.schema.json), and the schemas are strict.

The commands run through typer's runner against a real bus: a driver, a publication with a
subscriber and a subscription group, a request/reply service and two rejected registrations
(driver errors), so that every list the documents hold has entries. The network parts of a
stream (a sender with the receivers its flow control knows, a network image's receiver) come
from a snapshot of the netbridge's counters, as ``shmbus streams`` would build them.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from typer.testing import CliRunner

import shmbus
from shmbus.cli import snapshot as bussnapshot
from shmbus.cli.app import app
from shmbus.cli.bus_status import RUNNING, STALE, BusStatus
from shmbus.cli.json_documents import COMMANDS, document, load_schema, schema_path
from shmbus.cli.stream_analysis import analyse_streams
from shmbus.shm.counters import FC_RCV_POS
from tests.support.stream_counters import network_stream_counters
from tests.support.waits import wait_until

pytestmark = pytest.mark.timeout(120)
STREAM = 41
SERVICE = 42
#: the list each command's document adds to the keys they all have
LISTS = {"stat": "counters", "streams": "streams", "clients": "clients", "errors": "errors"}


def validator(command: str) -> Draft202012Validator:
    return Draft202012Validator(load_schema(command))


def problems(command: str, doc: dict[str, Any]) -> list[str]:
    """What the schema of ``command`` finds wrong with ``doc`` (empty: it is valid)."""
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator(command).iter_errors(doc)]


def run_json(*args: str) -> list[dict[str, Any]]:
    """The documents a command prints with ``--json``, one per line."""
    result = CliRunner().invoke(app, [*args, "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


# -- the schemas themselves --------------------------------------------------------------------


def objects(schema: Any, where: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema of an object in ``schema``, with where it is."""
    if isinstance(schema, dict):
        if schema.get("type") == "object":
            yield where or "/", schema
        for key, value in schema.items():
            yield from objects(value, f"{where}/{key}")
    elif isinstance(schema, list):
        for i, value in enumerate(schema):
            yield from objects(value, f"{where}/{i}")


@pytest.mark.parametrize("command", COMMANDS)
def test_each_schema_is_draft_2020_12_closed_and_describes_every_field(command: str) -> None:
    schema = load_schema(command)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(schema)
    assert schema_path(command).name == f"{command}.schema.json"
    for where, node in objects(schema):
        # every field is always printed: all required, nothing else allowed
        assert node["additionalProperties"] is False, where
        assert sorted(node["required"]) == sorted(node["properties"]), where
        for name, field in node["properties"].items():
            assert field.get("description") or "$ref" in field, f"{where}/{name}"


def test_the_keys_every_document_has_are_described_alike() -> None:
    schemas = {command: load_schema(command) for command in COMMANDS}
    stat = schemas["stat"]
    for command, schema in schemas.items():
        assert schema["properties"]["command"]["const"] == command
        assert schema["$defs"]["bus"] == stat["$defs"]["bus"], command
        for key in ("time_ms", "directory"):
            assert schema["properties"][key] == stat["properties"][key], (command, key)


def test_an_unknown_command_has_no_schema() -> None:
    with pytest.raises(ValueError, match="stat, streams, clients, errors"):
        schema_path("export")


# -- real documents ----------------------------------------------------------------------------


def mutations(command: str, doc: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Copies of ``doc`` that its schema must refuse: a field removed or mistyped, at the top,
    in ``bus`` and in the first entry of the command's list, and an unknown field added."""
    entries = LISTS[command]
    first = doc[entries][0]
    field = next(k for k, v in first.items() if isinstance(v, int) and not isinstance(v, bool))
    cases: list[tuple[str, Callable[[dict[str, Any]], None]]] = [
        ("time_ms removed", lambda d: d.pop("time_ms")),
        (f"{entries} removed", lambda d: d.pop(entries)),
        ("bus.heartbeat_ms removed", lambda d: d["bus"].pop("heartbeat_ms")),
        ("bus.driver_pid a string", lambda d: d["bus"].update(driver_pid="4242")),
        ("bus.state not a state", lambda d: d["bus"].update(state="fine")),
        (f"{entries}[0].{field} removed", lambda d: d[entries][0].pop(field)),
        (f"{entries}[0].{field} a string", lambda d: d[entries][0].update({field: "7"})),
        (f"{entries}[0].{field} a float", lambda d: d[entries][0].update({field: 7.5})),
        (f"{entries}[0] with an unknown field", lambda d: d[entries][0].update(extra=1)),
        ("an unknown top-level field", lambda d: d.update(extra=[])),
        ("another command", lambda d: d.update(command="export")),
    ]
    for what, change in cases:
        mutated = copy.deepcopy(doc)
        change(mutated)
        yield what, mutated


def handler(request: bytes) -> bytes:
    return request


def test_real_documents_match_their_schemas_and_mutated_ones_do_not(
        bus_context: shmbus.Context, driver: Any) -> None:
    d = bus_context.dir
    with shmbus.connect(bus_context) as bus, \
            bus.add_responder("aeron:ipc", SERVICE, handler), \
            bus.add_requester("aeron:ipc", SERVICE):
        subscriber = bus.add_subscription("aeron:ipc", STREAM)
        member = bus.add_subscription("aeron:ipc", STREAM, group="workers")
        publication = bus.add_publication("aeron:ipc", STREAM)
        wait_until(lambda: subscriber.images and member.images and publication.is_connected,
                   10, "the images")
        publication.publish(bytes(100), timeout=5)
        for bad in (lambda: bus.add_publication("aeron:ipc", 0),
                    lambda: bus.add_subscription("aeron:ipx", 3)):
            with pytest.raises(shmbus.RegistrationError):
                bad()

        docs = {"stat": run_json("stat", "--dir", d, "--interval", "0.05", "--count", "2"),
                "streams": run_json("streams", "--dir", d),
                "clients": run_json("clients", "--dir", d),
                "errors": run_json("errors", "--dir", d)}

    assert len(docs["stat"]) == 2 and all(len(lines) == 1 for c, lines in docs.items()
                                          if c != "stat")
    assert any(c["rate"] is not None for c in docs["stat"][1]["counters"])
    (stream,) = [s for s in docs["streams"][0]["streams"] if s["stream_id"] == STREAM]
    assert stream["subscribers"] and [g["name"] for g in stream["groups"]] == ["workers"]
    assert [s["stream_id"] for s in docs["streams"][0]["services"]] == [SERVICE]
    assert docs["clients"][0]["clients"][0]["process"] is not None
    assert len(docs["errors"][0]["errors"]) == 2
    for command, lines in docs.items():
        for doc in lines:
            assert doc[LISTS[command]], (command, "nothing to validate")
            assert problems(command, doc) == [], command
            for what, mutated in mutations(command, doc):
                assert problems(command, mutated), f"{command}: {what} was accepted"


def test_a_stale_bus_and_the_network_parts_of_streams_match_the_schema() -> None:
    udp = "aeron:udp?endpoint=224.0.1.1:40|fc=min"
    source = "aeron:udp?endpoint=h:1"
    counters = network_stream_counters(udp, source, sender_limit=8064, flow_control=(
        (17, f"fc-receivers: 5 -77 9 {udp}", 2, 5, 99, -77),
        (FC_RCV_POS, f"fc-rcv-pos: 5 -77 9 {udp} receiver 71 at 10.0.0.2:40", 7000, 5, 99, -77),
        (FC_RCV_POS, f"fc-rcv-pos: 5 -77 9 {udp} receiver 72 at 10.0.0.3:40 (not counted)", 4000, 5,
         99, -77)))
    logs = {5: bussnapshot.LogInfo(5, -77, 9, 65536, 1408, True, 32768)}
    driver = bussnapshot.DriverInfo("d/cnc.dat", 1, 4200, 1, 0, 10_000)
    snap = bussnapshot.BusSnapshot("d", 2, 0.0, driver, tuple(counters), logs)
    views = analyse_streams(snap)
    assert [(v.kind, v.sender is not None, v.receiver is not None) for v in views] == [
        ("publication", True, False), ("image", False, True)]
    assert views[0].sender is not None and views[0].sender.holding_receiver is not None

    for status in (BusStatus(RUNNING, None, 2), BusStatus(STALE, "driver pid 4200: gone", 2)):
        doc = json.loads(json.dumps(document("streams", snap, status,
                                             streams=[v.to_json() for v in views],
                                             services=[])))
        assert problems("streams", doc) == []

    sender = doc["streams"][0]["sender"]
    for change in (lambda s: s.update(flow_control="fastest"),
                   lambda s: s["receivers"][0].pop("counted"),
                   lambda s: s["holding_receiver"].update(position=None),
                   lambda s: s.update(connected="yes")):
        mutated = copy.deepcopy(doc)
        change(mutated["streams"][0]["sender"])
        assert problems("streams", mutated), sender
    mutated = copy.deepcopy(doc)
    mutated["streams"][1]["receiver"]["source"] = None
    assert problems("streams", mutated)
