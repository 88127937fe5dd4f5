"""The checked message of the C test programs, in Python (tools/aeron_c/message.py) and in C
(tools/aeron_c/c/message.h, through message_probe): the layout the docstrings state, the
two encoders byte for byte the same, each checker refusing what the other's encoder did not
write, and the sequence rules of aeron_subscribe."""

from __future__ import annotations

import json
import subprocess
import zlib
from pathlib import Path

import pytest

from tests.support.aeron_c import (
    HEADER_LENGTH,
    MessageError,
    SequenceChecker,
    check_message,
    encode_message,
)


def _probe(probe: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(probe), *args], capture_output=True, text=True, timeout=30)


def test_the_layout_is_the_documented_one() -> None:
    """Publisher 7, sequence 3, 24 bytes: the payload bytes 20..23 are
    (3 * 31 + i + 7) & 0xFF = 120..123, "xyz{"."""
    message = encode_message(7, 3, 24)
    assert message == (bytes.fromhex("07000000" "18000000" "0300000000000000")
                       + zlib.crc32(b"xyz{").to_bytes(4, "little") + b"xyz{")
    assert check_message(message) == (7, 3)


def test_a_message_without_payload_is_its_header() -> None:
    message = encode_message(1, 0, HEADER_LENGTH)
    assert len(message) == 20 and message[16:20] == bytes(4)  # crc32(b"") == 0
    assert check_message(message) == (1, 0)
    with pytest.raises(ValueError, match="at least 20 bytes"):
        encode_message(1, 0, 19)


@pytest.mark.parametrize("publisher_id, sequence, length", [
    (0, 0, 20), (1, 1, 21), (7, 3, 24), (2, 255, 300), (4_294_967_295, 2**40 + 5, 1_000),
    (12, 99, 20_000)])
def test_the_c_and_python_encoders_agree(message_probe: Path, publisher_id: int, sequence: int,
                                         length: int) -> None:
    encoded = _probe(message_probe, "encode", str(publisher_id), str(sequence), str(length))
    assert encoded.returncode == 0, encoded.stderr
    assert bytes.fromhex(encoded.stdout.strip()) == encode_message(publisher_id, sequence, length)


def test_the_c_checker_takes_python_messages(message_probe: Path) -> None:
    checked = _probe(message_probe, "check", encode_message(9, 12_345, 64).hex())
    assert checked.returncode == 0, checked.stdout
    assert json.loads(checked.stdout) == {"publisher_id": 9, "sequence": 12_345}


def test_every_flipped_bit_is_caught_and_both_checkers_agree(message_probe: Path) -> None:
    """A bit flipped anywhere in a 40-byte message breaks a rule: the length, the CRC (the
    payload), the pattern (the low bytes of the publisher id and sequence make it), else the
    sequence rules (the high bytes, which the pattern does not see, name another publisher or
    sequence). On each, the C checker and the Python one give the same verdict."""
    message = encode_message(5, 77, 40)
    for position in range(len(message)):
        for bit in (0x01, 0x80):
            corrupt = bytearray(message)
            corrupt[position] ^= bit
            checker = SequenceChecker({5: 78})
            checker.received[5] = 77
            with pytest.raises(MessageError):
                checker.check(corrupt)
            try:
                python_verdict: object = check_message(corrupt)
            except MessageError:
                python_verdict = "refused"
            checked = _probe(message_probe, "check", corrupt.hex())
            c_verdict = json.loads(checked.stdout)
            if python_verdict == "refused":
                assert checked.returncode == 1 and "error" in c_verdict, (position, bit)
            else:
                assert checked.returncode == 0, (position, bit, c_verdict)
                assert (c_verdict["publisher_id"], c_verdict["sequence"]) == python_verdict


def test_the_checker_names_what_is_wrong() -> None:
    message = encode_message(5, 77, 40)
    with pytest.raises(MessageError, match="shorter than the 20-byte header"):
        check_message(message[:19])
    with pytest.raises(MessageError, match="length field 40 differs"):
        check_message(message[:39])
    payload_flipped = message[:-1] + bytes([message[-1] ^ 1])
    with pytest.raises(MessageError, match="publisher 5: message of 40 bytes with sequence 77: "
                                           "CRC-32"):
        check_message(payload_flipped)
    # a consistent CRC over the wrong pattern: only the pattern check sees it
    wrong_pattern = bytearray(message)
    wrong_pattern[20:] = bytes(20)
    wrong_pattern[16:20] = zlib.crc32(bytes(20)).to_bytes(4, "little")
    with pytest.raises(MessageError, match="payload differs from the pattern"):
        check_message(wrong_pattern)


def test_the_sequence_checker_follows_each_publisher() -> None:
    checker = SequenceChecker({1: 2, 2: 1})
    assert checker.check(encode_message(1, 0, 32)) == (1, 0)
    assert checker.check(encode_message(2, 0, 32)) == (2, 0)
    assert not checker.complete
    assert checker.check(encode_message(1, 1, 32)) == (1, 1)
    assert checker.complete and checker.received == {1: 2, 2: 1}


@pytest.mark.parametrize("sequences, expected_error", [
    ([0, 2], "publisher 1: expected sequence 1, got sequence 2 (lost)"),
    ([0, 0], "publisher 1: expected sequence 1, got sequence 0 (duplicated or reordered)"),
    ([0, 1, 2], "publisher 1: expected 2 messages, got sequence 2 beyond them"),
])
def test_the_sequence_checker_names_the_broken_rule(sequences: list[int],
                                                    expected_error: str) -> None:
    checker = SequenceChecker({1: 2})
    *good, bad = sequences
    for sequence in good:
        checker.check(encode_message(1, sequence, 32))
    with pytest.raises(MessageError) as refused:
        checker.check(encode_message(1, bad, 32))
    assert str(refused.value) == expected_error


def test_the_sequence_checker_refuses_an_unexpected_publisher() -> None:
    with pytest.raises(MessageError, match="publisher 3: not expected, got its sequence 0"):
        SequenceChecker({1: 1}).check(encode_message(3, 0, 32))
