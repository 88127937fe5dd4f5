"""The wire codec against real Aeron traffic: a capture of Aeron's C media driver
(tests/fixtures/aeron-c-unicast-loss.pcap.gz, described in tests/fixtures/README.md).

The capture holds two publication sessions on stream 1001 (one SETUP each): the first carries
20,000 messages of 32 bytes, the second 1,000 messages of 3,000 bytes; the receiver dropped 5%
of DATA datagrams, so it also holds NAKs and retransmitted copies.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from netbridge import frames as F
from netbridge.frames import (
    DataHeader,
    MalformedFrame,
    Nak,
    SetupFrame,
    StatusMessage,
    decode_frames,
    encode_datagram,
)
from tests.support.pcap import read_udp
from tests.support.wireshark import COLUMNS, EXTRA_COLUMNS, Decoded, expected_columns

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CAPTURE = FIXTURES / "aeron-c-unicast-loss.pcap.gz"
ENDPOINT_PORT = 40123


@pytest.fixture(scope="module")
def decoded() -> list[Decoded]:
    assert CAPTURE.is_file(), f"missing fixture {CAPTURE}"
    return [Decoded(d, list(decode_frames(d.payload))) for d in read_udp(CAPTURE)]


def data_frames(decoded: list[Decoded]) -> Iterator[DataHeader]:
    for item in decoded:
        for frame in item.frames:
            if isinstance(frame, DataHeader):
                yield frame


def test_capture_is_all_aeron_udp(decoded: list[Decoded]) -> None:
    assert len(decoded) == 5535
    assert [d.datagram.number for d in decoded] == list(range(1, 5536))
    for item in decoded:
        assert ENDPOINT_PORT in (item.datagram.src_port, item.datagram.dst_port)
        assert item.frames, f"packet {item.datagram.number} decoded to no frame"


def test_frame_counts_match_the_fixture_readme(decoded: list[Decoded]) -> None:
    counts: Counter[str] = Counter()
    for item in decoded:
        payload = item.datagram.payload
        if F.is_heartbeat(payload):
            counts["eos heartbeat" if F.is_end_of_stream(payload) else "heartbeat"] += 1
        if any(
            isinstance(f, DataHeader) and f.type == F.HDR_TYPE_DATA and f.frame_length
            for f in item.frames
        ):
            counts["datagrams with data"] += 1
        for frame in item.frames:
            if isinstance(frame, DataHeader) and frame.is_padding:
                counts["pad"] += 1
            elif not isinstance(frame, DataHeader):
                counts[type(frame).__name__] += 1
    assert counts == {
        "SetupFrame": 2,
        "StatusMessage": 1187,
        "Nak": 172,
        "pad": 52,
        "eos heartbeat": 34,
        "heartbeat": 9,
        # The README's 4,164 "datagrams with DATA frames" is Wireshark's count, which shows the
        # 34 end-of-stream heartbeats as Data Frames (a heartbeat is a DATA frame:
        # docs/protocol.md, Frames on the wire).
        "datagrams with data": 4164 - 34,
    }


def test_exact_lengths_the_real_driver_sent(decoded: list[Decoded]) -> None:
    for item in decoded:
        size = len(item.datagram.payload)
        first = item.frames[0]
        if isinstance(first, SetupFrame):
            assert size == 40 and first.flags == 0 and first.ttl == 0 and first.mtu == 1408
            assert first.term_length == 65536
        elif isinstance(first, StatusMessage):
            assert size == 36 and first.group_tag is None
            assert first.flags in (0, F.SM_FLAG_EOS)
        elif isinstance(first, Nak):
            assert size == 28 and first.flags == 0
            assert 0 < first.length <= 65536 and first.length % 32 == 0  # whole frames
        else:
            assert 32 <= size <= 1408
            assert item.datagram.dst_port == ENDPOINT_PORT
        for frame in item.frames:
            if isinstance(frame, DataHeader) and frame.is_padding:
                assert frame is item.frames[-1]
                assert frame.term_offset + frame.frame_length == 65536


def test_reencoding_gives_the_captured_bytes(decoded: list[Decoded]) -> None:
    for item in decoded:
        payload = item.datagram.payload
        assert encode_datagram(item.frames) == payload, f"packet {item.datagram.number}"
        offset = 0
        for frame in item.frames:
            encoded = frame.encode()  # for PAD: only the 32-byte header
            assert encoded == payload[offset : offset + len(encoded)]
            offset += F.align(len(encoded))


def decode_or_malformed(datagram: bytes) -> None:
    try:
        list(decode_frames(datagram))
    except MalformedFrame:
        pass


def test_every_truncation_of_sample_datagrams(decoded: list[Decoded]) -> None:
    samples: dict[str, bytes] = {}
    for item in decoded:
        first = item.frames[0]
        kind = f"{type(first).__name__}/{len(item.frames)}/{item.frames[-1].frame_length}"
        samples.setdefault(kind, item.datagram.payload)
    assert len(samples) >= 8
    for payload in samples.values():
        for cut in range(len(payload)):
            decode_or_malformed(payload[:cut])


# --- field-by-field comparison with Wireshark's Aeron dissector --------------------------------

@functools.cache
def tshark_rows() -> dict[int, dict[str, list[int]]]:
    """tshark's fields for every packet, by frame number. Fails (never skips) without tshark."""
    tshark = shutil.which("tshark")
    if tshark is None:
        pytest.fail(
            "tshark is not installed: this test compares the codec with Wireshark's Aeron "
            "dissector. `make test` installs it (Debian package tshark); by hand: "
            "DEBIAN_FRONTEND=noninteractive apt-get install -y tshark"
        )
    command = [
        tshark,
        "-n",
        "-r",
        str(CAPTURE),
        "-d",
        f"udp.port=={ENDPOINT_PORT},aeron",
        "-T",
        "fields",
        "-E",
        "separator=/t",
        "-E",
        "occurrence=a",
        "-E",
        "aggregator=,",
        "-e",
        "frame.number",
    ]
    for column in COLUMNS + EXTRA_COLUMNS:
        command += ["-e", column]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, f"tshark failed: {result.stderr}"
    rows: dict[int, dict[str, list[int]]] = {}
    for line in result.stdout.splitlines():
        number, *cells = line.split("\t")
        assert len(cells) == len(COLUMNS + EXTRA_COLUMNS), line
        rows[int(number)] = {
            column: [int(value, 0) for value in cell.split(",")] if cell else []
            for column, cell in zip(COLUMNS + EXTRA_COLUMNS, cells, strict=True)
        }
    return rows


def test_every_field_matches_wiresharks_aeron_dissector(decoded: list[Decoded]) -> None:
    rows = tshark_rows()
    assert len(rows) == len(decoded)
    mismatches = []
    for item in decoded:
        expected = expected_columns(item)
        actual = rows[item.datagram.number]
        for column, values in expected.items():
            if actual[column] != values:
                mismatches.append((item.datagram.number, column, values, actual[column]))
    assert not mismatches, f"{len(mismatches)} mismatches, first: {mismatches[:5]}"
    frames_seen = sum(
        len(v) for row in rows.values() for k, v in row.items() if k.endswith(".type")
    )
    assert frames_seen == sum(len(item.frames) for item in decoded)


# --- rebuilding the streams ----------------------------------------------------------------------


def test_streams_rebuild_every_message_in_order(decoded: list[Decoded]) -> None:
    setups: dict[int, SetupFrame] = {}
    stored: dict[tuple[int, int, int], DataHeader] = {}
    duplicates = 0
    last_heartbeat: dict[int, DataHeader] = {}
    for frame in (f for item in decoded for f in item.frames):
        if isinstance(frame, SetupFrame):
            setups.setdefault(frame.session_id, frame)
        if not isinstance(frame, DataHeader):
            continue
        if frame.is_heartbeat:
            last_heartbeat[frame.session_id] = frame
            continue
        key = (frame.session_id, frame.term_id, frame.term_offset)
        if key in stored:
            duplicates += 1
            assert stored[key].encode() == frame.encode(), f"retransmission differs at {key}"
        else:
            stored[key] = frame
    assert duplicates > 0  # the loss made the sender retransmit

    streams: list[tuple[list[bytes], list[list[int]]]] = []
    for session_id, setup in setups.items():  # in capture order
        term_length = setup.term_length
        term_id, term_offset = setup.initial_term_id, setup.term_offset
        messages: list[bytes] = []
        fragment_lengths: list[list[int]] = []
        partial: bytearray | None = None
        while (frame := stored.get((session_id, term_id, term_offset))) is not None:
            if frame.is_padding:
                assert frame.term_offset + frame.frame_length == term_length
                term_offset = term_length
            else:
                if frame.is_begin:
                    assert partial is None, "B flag inside a message"
                    partial = bytearray()
                    fragment_lengths.append([])
                assert partial is not None, "fragment without a beginning"
                partial += frame.payload
                fragment_lengths[-1].append(frame.frame_length)
                if frame.is_end:
                    messages.append(bytes(partial))
                    partial = None
                term_offset += F.align(frame.frame_length)
            if term_offset == term_length:
                term_id, term_offset = (term_id + 1 + 2**31) % 2**32 - 2**31, 0
        assert partial is None
        # The stream ends exactly where the sender's final (end-of-stream) heartbeat says.
        beat = last_heartbeat[session_id]
        assert beat.is_end_of_stream
        assert (beat.term_id, beat.term_offset) == (term_id, term_offset)
        streams.append((messages, fragment_lengths))

    (small, small_fragments), (large, large_fragments) = streams
    assert len(small) == 20_000 and all(len(m) == 32 for m in small)
    assert all(lengths == [64] for lengths in small_fragments)
    assert len(large) == 1_000 and all(len(m) == 3_000 for m in large)
    assert all(lengths == [1408, 1408, 280] for lengths in large_fragments)
    for messages in (small, large):
        for index, message in enumerate(messages):
            assert int.from_bytes(message[:8], "little") == index
