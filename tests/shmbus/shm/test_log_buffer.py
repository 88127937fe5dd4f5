"""Log buffer files: layout, validation on open, and the position formula."""

from __future__ import annotations

import os
import struct

import pytest

from shmbus.shm import _native, log_buffer
from shmbus.shm.log_buffer import (
    LAYOUT_VERSION_OFFSET,
    LOG_META_DATA_LENGTH,
    TERM_LENGTH_OFFSET,
    LogBuffer,
    LogBufferError,
    compute_position,
    encode_data_header,
    log_length,
    max_message_length,
)


def test_the_native_layout_is_the_python_layout() -> None:
    # the C sources and log_buffer.py each name every offset: one value for each name
    assert _native.LAYOUT
    assert {name: getattr(log_buffer, name, None) for name in _native.LAYOUT} == _native.LAYOUT


def test_data_header_golden_bytes() -> None:
    # length, version, flags, type, term offset, session, stream, term id, reserved value;
    # little-endian (docs/protocol.md, Frame header)
    expected = bytes.fromhex(
        "84000000"          # frame length 132
        "00"                # version 0
        "c0"                # flags B|E
        "0100"              # type DATA
        "a0000000"          # term offset 160
        "efbeadde"          # session id 0xdeadbeef as i32
        "e9030000"          # stream id 1001
        "feffffff"          # term id -2
        "0807060504030201"  # reserved value
    )
    header = encode_data_header(132, 0xC0, 1, 160, 0xDEADBEEF - 2**32, 1001, -2,
                                0x0102030405060708)
    assert header == expected
    assert len(header) == 32


def test_pad_header_golden_bytes() -> None:
    header = encode_data_header(352, 0xC0, 0, 65184, 7, 8, 9)
    assert header[:8] == bytes.fromhex("60010000" "00" "c0" "0000")
    assert struct.unpack_from("<iiii", header, 8) == (65184, 7, 8, 9)


@pytest.mark.parametrize(
    ("term_id", "offset", "term_length", "initial", "expected"),
    [
        (0, 0, 65536, 0, 0),
        (0, 96, 65536, 0, 96),
        (3, 32, 65536, 0, 3 * 65536 + 32),
        (-2997, 64, 65536, -2999, 2 * 65536 + 64),
        # across the int32 wrap: initial term id near the top
        (-(2**31), 0, 65536, 2**31 - 1, 65536),
        (-(2**31) + 5, 128, 1 << 20, 2**31 - 3, 8 * (1 << 20) + 128),
    ],
)
def test_position_formula(term_id: int, offset: int, term_length: int, initial: int,
                          expected: int) -> None:
    assert compute_position(term_id, offset, term_length, initial) == expected


def test_max_message_length() -> None:
    assert max_message_length(65536) == 8192
    assert max_message_length(1 << 30) == 16 * 1024 * 1024


def test_create_and_open_round_trip(shm_dir) -> None:
    path = shm_dir / "a.log"
    with LogBuffer.create(path, term_length=65536, initial_term_id=-5, mtu=4096, session_id=3,
                          stream_id=4, registration_id=99) as log:
        assert os.path.getsize(path) == log_length(65536)
        assert os.stat(path).st_mode & 0o777 == 0o600
        assert log.producer_position() == 0
        assert log.active_term_count() == 0
    with LogBuffer.open(path) as log:
        d = log.descriptor
        assert (d.term_length, d.initial_term_id, d.mtu, d.session_id, d.stream_id,
                d.registration_id) == (65536, -5, 4096, 3, 4, 99)


@pytest.mark.parametrize("term_length", [0, 1000, 32768, 65536 + 32, 2**31])
def test_create_rejects_bad_term_length(shm_dir, term_length: int) -> None:
    with pytest.raises(LogBufferError, match="term length"):
        LogBuffer.create(shm_dir / "a.log", term_length=term_length)
    assert not (shm_dir / "a.log").exists()


@pytest.mark.parametrize("mtu", [33, 32, 1000, 65536])
def test_create_rejects_bad_mtu(shm_dir, mtu: int) -> None:
    with pytest.raises(LogBufferError, match="mtu"):
        LogBuffer.create(shm_dir / "a.log", term_length=65536, mtu=mtu)


def _corrupt(path, offset: int, value: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(struct.pack("<i", value))


@pytest.mark.parametrize(("field_offset", "value", "named"), [
    (LAYOUT_VERSION_OFFSET, 77, "layout version 77"),
    (TERM_LENGTH_OFFSET, 1000, "term length 1000"),
], ids=["layout version", "term length"])
def test_open_names_a_wrong_metadata_field(shm_dir, field_offset: int, value: int,
                                           named: str) -> None:
    path = shm_dir / "a.log"
    LogBuffer.create(path, term_length=65536).close()
    _corrupt(path, 3 * 65536 + field_offset, value)
    with pytest.raises(LogBufferError, match=named):
        LogBuffer.open(path)


def test_open_names_a_wrong_size(shm_dir) -> None:
    path = shm_dir / "a.log"
    LogBuffer.create(path, term_length=65536).close()
    with open(path, "r+b") as f:
        f.truncate(log_length(65536) + 4096)
    # the metadata is read from the end, so a longer file finds no valid version there
    with pytest.raises(LogBufferError, match="layout version|size"):
        LogBuffer.open(path)
    with open(path, "r+b") as f:
        f.truncate(LOG_META_DATA_LENGTH)
    with pytest.raises(LogBufferError, match="size 4096 is too small"):
        LogBuffer.open(path)


def test_create_on_a_full_filesystem_says_how_much_and_leaves_nothing(tiny_tmpfs) -> None:
    with pytest.raises(OSError, match=r"3149824 bytes needed, \d+ bytes free"):
        LogBuffer.create(tiny_tmpfs / "big.log", term_length=1 << 20)
    assert list(tiny_tmpfs.iterdir()) == []
    LogBuffer.create(tiny_tmpfs / "small.log", term_length=65536).close()
