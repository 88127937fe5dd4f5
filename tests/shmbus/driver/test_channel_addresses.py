"""Checking a channel's hosts when it is added (shmbus/driver/channel_addresses.py), without a
driver: every bad host is a ChannelUriError naming the parameter and the host."""

from __future__ import annotations

import pytest

from shmbus.driver.channel_addresses import check_addresses
from shmbus.settings.channel_uri import ChannelUri, ChannelUriError


@pytest.mark.parametrize(("channel", "parameter"), [
    ("aeron:udp?endpoint=127.0.0\0.1:40611", "endpoint"),
    ("aeron:udp?endpoint=127.0.0.1:40612|control=lo\0calhost:40613", "control"),
    ("aeron:udp?endpoint=127.0.0.1:40615|interface=\0", "interface"),
])
def test_a_host_with_a_nul_byte_is_refused_by_name(channel: str, parameter: str) -> None:
    """The command fuzzer found one: the resolver raised TypeError, which reached the driver
    conductor's last-resort handler."""
    with pytest.raises(ChannelUriError, match=f"{parameter} host .* holds a NUL byte"):
        check_addresses(ChannelUri.parse(channel), channel)


def test_a_host_that_resolves_passes() -> None:
    channel = "aeron:udp?endpoint=localhost:40616|interface=127.0.0.1"
    check_addresses(ChannelUri.parse(channel), channel)
