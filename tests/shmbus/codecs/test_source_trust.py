"""Which subscriptions may unpickle what they read (shmbus/codecs/source_trust.py): the channel
decides, and the refusal names the channel, the source and the opt-in."""

from __future__ import annotations

import pytest

import shmbus
from shmbus.codecs.source_trust import TRUST_OPTION, refusal, unkeyed_network


@pytest.mark.parametrize("channel", [
    "aeron:udp?endpoint=10.0.0.2:40123",
    "aeron:udp?endpoint=224.0.1.1:40457|interface=10.0.0.1",
    "aeron:udp?control=10.0.0.1:40001|control-mode=dynamic",
    "aeron:udp?endpoint=10.0.0.2:40123|consumer-group=rr-5",
    "not a channel",
])
def test_unkeyed_network_channels_and_unparseable_ones_are_untrusted(channel: str) -> None:
    assert unkeyed_network(channel)


@pytest.mark.parametrize("channel", [
    "aeron:ipc",
    "aeron:ipc?term-length=64k",
    "aeron:ipc?consumer-group=workers",
    "aeron:udp?endpoint=10.0.0.2:40123|key=prod-a",
    "aeron-spy:aeron:udp?endpoint=10.0.0.2:40123|key=prod-a",
    "aeron-spy:aeron:udp?endpoint=10.0.0.2:40123",  # this host's own publications
])
def test_ipc_spies_and_keyed_channels_are_trusted(channel: str) -> None:
    assert not unkeyed_network(channel)


def test_the_refusal_names_the_channel_the_source_and_the_opt_in() -> None:
    error = refusal("aeron:udp?endpoint=10.0.0.2:40123", "10.9.9.9:5555")
    assert isinstance(error, shmbus.UntrustedSourceError)
    assert isinstance(error, shmbus.ShmbusError)
    assert (error.channel, error.source, error.option) == (
        "aeron:udp?endpoint=10.0.0.2:40123", "10.9.9.9:5555", TRUST_OPTION)
    for named in ("'aeron:udp?endpoint=10.0.0.2:40123'", "10.9.9.9:5555",
                  f"{TRUST_OPTION}=True", "key=", "shmbus keygen"):
        assert named in str(error), named
