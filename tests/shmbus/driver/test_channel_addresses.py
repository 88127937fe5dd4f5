"""Checking a channel's hosts when it is added (shmbus/driver/channel_addresses.py), without a
driver: every bad host is a ChannelUriError naming the parameter and the host."""

from __future__ import annotations

import pytest

from shmbus.driver.channel_addresses import check_addresses
from shmbus.settings.channel_uri import ChannelUri, ChannelUriError


@pytest.mark.parametrize(("params", "parameter"), [
    ({"endpoint": "127.0.0\0.1:40611"}, "endpoint"),
    ({"endpoint": "127.0.0.1:40612", "control": "lo\0calhost:40613"}, "control"),
    ({"endpoint": "127.0.0.1:40615", "interface": "\0"}, "interface"),
])
def test_a_host_with_a_nul_byte_is_refused_by_name(params: dict[str, str],
                                                    parameter: str) -> None:
    """ChannelUri.parse refuses control characters; a ChannelUri built from its parts is
    checked here too, since the resolver raises TypeError on a NUL byte."""
    channel = ChannelUri("udp", params, False)
    with pytest.raises(ChannelUriError, match=f"{parameter} host .* holds a NUL byte"):
        check_addresses(channel, str(params))


def test_a_host_that_resolves_passes() -> None:
    channel = "aeron:udp?endpoint=localhost:40616|interface=127.0.0.1"
    check_addresses(ChannelUri.parse(channel), channel)
