"""ChannelUri.parse refuses what no channel may hold, naming it (shmbus/settings/channel_uri.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shmbus.settings.channel_uri import ChannelUri, ChannelUriError

_CONTROL = st.sampled_from([chr(c) for c in range(0x20)] + ["\x7f"])


@given(before=st.text(max_size=20), control=_CONTROL, after=st.text(max_size=20))
def test_a_control_character_anywhere_is_refused_by_position(before: str, control: str,
                                                             after: str) -> None:
    uri = "aeron:udp?endpoint=localhost:40456" + before + control + after
    first = next(i for i, ch in enumerate(uri) if ch < " " or ch == "\x7f")
    with pytest.raises(ChannelUriError, match=f"control character .* at index {first}$"):
        ChannelUri.parse(uri)


@pytest.mark.parametrize("uri", ["aeron:ipc\0", "aeron:udp?endpoint=127.0.0\0.1:40611",
                                 "aeron:udp?endpoint=localhost:40611|alias=a\nb"])
def test_a_nul_byte_or_a_newline_is_refused(uri: str) -> None:
    with pytest.raises(ChannelUriError, match="control character"):
        ChannelUri.parse(uri)


def test_a_channel_without_control_characters_parses() -> None:
    assert ChannelUri.parse("aeron:udp?endpoint=localhost:40611|alias=a b").params == {
        "endpoint": "localhost:40611", "alias": "a b"}
