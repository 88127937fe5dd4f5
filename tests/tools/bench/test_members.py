"""tools/bench/members.BatchCheck with every_byte: a batch of frames as poll_batch hands them
over passes, and one wrong byte anywhere in a payload fails it (fragmented or not)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from tools.bench.members import BEGIN_FLAG, END_FLAG, FRAME_HEADER, BatchCheck

WHOLE = BEGIN_FLAG | END_FLAG


def frames(payloads: list[bytes], flags: list[int]) -> SimpleNamespace:
    """A FragmentBatch-like batch: each payload after a 32-byte header (filled with 0xff), in
    one term, 32-byte aligned."""
    term = bytearray()
    offsets, lengths = [], []
    for payload in payloads:
        term += b"\xff" * FRAME_HEADER
        offsets.append(len(term))
        lengths.append(len(payload))
        term += payload + bytes(-len(payload) % 32)
    return SimpleNamespace(term=np.frombuffer(bytes(term), np.uint8),
                           offsets=np.array(offsets, np.int64),
                           lengths=np.array(lengths, np.int64),
                           flags=np.array(flags, np.uint8), position=0)


def message(seq: int, size: int) -> bytes:
    word = seq.to_bytes(8, "little", signed=True)
    return word + bytes(size - 16) + word


def test_whole_messages_pass_and_a_wrong_middle_byte_fails():
    payloads = [message(seq, 64) for seq in range(4)]
    check = BatchCheck(64, False, every_byte=True)
    check(frames(payloads, [WHOLE] * 4))
    assert check.expected == 4 and check.errors == 0
    for index in range(8, 56):
        bad = [bytearray(p) for p in payloads]
        bad[2][index] = 1
        check = BatchCheck(64, False, every_byte=True)
        check(frames([bytes(p) for p in bad], [WHOLE] * 4))
        assert check.errors == 1, index
    lenient = BatchCheck(64, False)  # head and tail only
    lenient(frames([bytes(p) for p in bad], [WHOLE] * 4))
    assert lenient.errors == 0


@pytest.mark.parametrize("fragment", range(3))
def test_a_wrong_byte_in_any_fragment_of_a_message_fails(fragment: int):
    whole = message(0, 96)
    parts = [whole[:32], whole[32:64], whole[64:]]
    flags = [BEGIN_FLAG, 0, END_FLAG]
    check = BatchCheck(96, True, every_byte=True)
    check(frames(parts, flags))
    assert check.errors == 0 and check.expected == 1
    bad = [bytearray(p) for p in parts]
    bad[fragment][12 if fragment == 0 else 3] = 7
    check = BatchCheck(96, True, every_byte=True)
    check(frames([bytes(p) for p in bad], flags))
    assert check.errors == 1
