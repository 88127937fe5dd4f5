"""``shmbus streams`` shows request/reply services (responders, calls in flight, answered,
failed, timed out) and ``shmbus stat`` lists their counters under their stream."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from typer.testing import CliRunner

import shmbus
from shmbus.cli.app import app

pytestmark = pytest.mark.timeout(120)
STREAM = 5301


def handler(request: bytes) -> bytes:
    if request == b"raise":
        raise KeyError("no such key")
    if request == b"slow":
        time.sleep(0.3)  # a slow handler: its call is in flight meanwhile (what is shown)
    return request


def test_streams_and_stat_show_a_service(bus_context: shmbus.Context, driver: Any) -> None:
    with shmbus.connect(bus_context) as bus, \
            bus.add_responder("aeron:ipc", STREAM, handler) as svc, \
            bus.add_requester("aeron:ipc", STREAM) as client:
        serving = threading.Thread(target=svc.serve, args=(10,))
        serving.start()
        try:
            for i in range(5):
                assert client.request(b"%d" % i, timeout=5) == b"%d" % i
            with pytest.raises(shmbus.RemoteError, match="KeyError"):
                client.request(b"raise", timeout=5)
            with pytest.raises(shmbus.RequestTimeoutError):
                client.request(b"slow", timeout=0.05)
            pending = client.submit(b"slow", timeout=5)  # in flight while we look
            result = CliRunner().invoke(app, ["streams", "--dir", bus_context.dir, "--json"],
                                        catch_exceptions=False)
            [service] = json.loads(result.stdout)["services"]
            text = CliRunner().invoke(app, ["streams", "--dir", bus_context.dir],
                                      catch_exceptions=False).stdout
            stat = CliRunner().invoke(app, ["stat", "--once", "--json", "--dir",
                                            bus_context.dir, "--stream", str(STREAM)],
                                      catch_exceptions=False)
            assert pending.result() == b"slow"
        finally:
            svc.close()
            serving.join(10)
    assert service["stream_id"] == STREAM and service["channel"] == "aeron:ipc"
    assert len(service["responders"]) == 1 and len(service["requesters"]) == 1
    assert (service["answered"], service["failed"], service["timed_out"],
            service["in_flight"]) == (5, 1, 1, 1)
    assert service["handler_errors"] == 1 and service["reflections_refused"] == 0
    assert (f"service aeron:ipc stream {STREAM}: 1 responder(s)" in text
            and "in flight 1, answered 5, failed 1, timed out 1" in text
            and "reflections refused 0" in text)
    types = {c["type"]: c["value"] for c in json.loads(stat.stdout)["counters"]
             if c["stream_id"] == STREAM}
    assert types["rr-answered"] == 5 and types["rr-timed-out"] == 1
    assert {"rr-served", "rr-handler-errors", "rr-replies-dropped", "rr-reflections-refused",
            "rr-in-flight", "rr-failed", "rr-late"} <= set(types)
