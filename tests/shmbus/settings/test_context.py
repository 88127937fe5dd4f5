"""Context settings that are checked on their own (shmbus/settings/context.py)."""

from __future__ import annotations

import pytest

import shmbus
from shmbus.shm.block_ring import WARM_SHARE, BlockRing


def test_large_message_warm_share_is_a_share_from_keywords_environment_and_json(
        monkeypatch) -> None:
    assert shmbus.Context().large_message_warm_share == WARM_SHARE == 0.25
    monkeypatch.setenv("SHMBUS_LARGE_MESSAGE_WARM_SHARE", "0.5")
    context = shmbus.Context.resolve()
    assert context.large_message_warm_share == 0.5
    assert shmbus.Context.resolve(large_message_warm_share=1).large_message_warm_share == 1
    assert shmbus.Context.from_json(context.to_json()) == context
    for share in (0, -0.25, 1.01, float("nan")):
        with pytest.raises(ValueError, match=r"large_message_warm_share must be a share of "
                                             r"the free space, 0 < share <= 1"):
            shmbus.Context(large_message_warm_share=share)
    monkeypatch.setenv("SHMBUS_LARGE_MESSAGE_WARM_SHARE", "a quarter")
    with pytest.raises(ValueError, match="SHMBUS_LARGE_MESSAGE_WARM_SHARE='a quarter'"):
        shmbus.Context.resolve()


def test_a_publication_s_block_ring_takes_its_client_s_share(bus_context, driver) -> None:
    context = bus_context.with_(large_message_warm_share=0.125)
    with shmbus.connect(context) as bus:
        pub = bus.add_publication("aeron:ipc", 41)
        ring = pub._blocks
        assert isinstance(ring, BlockRing) and ring.warm_share == 0.125
