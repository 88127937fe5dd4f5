"""``shmbus streams`` shows subscription groups: their claim position, members and claims, the
messages handed on, and the group as what holds a publisher back."""

from __future__ import annotations

import time
from typing import Any

import pytest
from typer.testing import CliRunner

import shmbus
from shmbus.cli.app import app
from tests.support.waits import wait_until

pytestmark = pytest.mark.timeout(120)
WINDOW = 32768  # term length 65536 (bus_context) / 2


def streams_json(directory: str) -> list[dict[str, Any]]:
    import json

    result = CliRunner().invoke(app, ["streams", "--dir", directory, "--json"],
                                catch_exceptions=False)
    return json.loads(result.stdout)["streams"]


def test_streams_shows_a_group_its_members_and_the_claim_holding_the_publisher(
        bus_context: shmbus.Context, driver: Any) -> None:
    with shmbus.connect(bus_context) as bus:
        slow = bus.add_subscription("aeron:ipc", 30, group="workers")
        fast = bus.add_subscription("aeron:ipc", 30, group="workers")
        publication = bus.add_publication("aeron:ipc", 30)
        wait_until(lambda: slow.images and fast.images and publication.is_connected, 5,
                   "the members' images")
        deadline = time.monotonic() + 5
        for _ in range(4):
            publication.publish(bytes(100), timeout=5)

        def stop(buffer: memoryview, header: shmbus.Header) -> None:
            raise RuntimeError("the slow member stops mid-claim")

        with pytest.raises(RuntimeError):
            slow.poll(stop, 4)  # it keeps the rest of its claim, unfinished
        claim = slow.images[0].claim[0]
        # the fast member takes everything else; the publisher stops a window past the claim
        while publication.offer(bytes(100)) > 0 or fast.poll(lambda b, h: None, 64):
            assert time.monotonic() < deadline + 10

        def sampled() -> dict[str, Any] | None:  # the driver samples pub-pos on its duty cycle
            [view] = [s for s in streams_json(bus_context.dir) if s["stream_id"] == 30]
            return view if view["pub_pos"] == publication.position else None

        view = wait_until(sampled, 20, "pub-pos sampled")
        [group] = view["groups"]
        assert group["name"] == "workers" and group["position"] == claim
        assert group["claimed"] == publication.position > claim
        members = {m["subscription_id"]: m["claim"] for m in group["members"]}
        assert members == {slow.registration_id: claim, fast.registration_id: None}
        assert view["state"] == "held" and "group workers" in view["verdict"]
        assert [s["group"] for s in view["subscribers"]] == ["workers"]
        text = CliRunner().invoke(app, ["streams", "--dir", bus_context.dir]).stdout
        assert f"group workers claimed to {publication.position:,} (2 members:" in text
        assert f"claim at {claim:,}" in text and "0 redelivered" in text
        assert publication.position_limit <= claim + WINDOW
