"""The Sealer (netbridge/native/sealing.c) and the netbridge's rules around it
(netbridge/sealing.py), driven directly: no sockets."""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netbridge import _io
from netbridge.frames import data_frame, encode_datagram
from netbridge.sealing import (
    REPORTS_PER_SECOND,
    REPORTS_PER_SOURCE,
    DropReports,
    KeyringWatch,
    new_sealer,
    rekey,
)
from shmbus.settings.keyring import KeyringError, new_key_line, parse_keyring

OPENED, PLAINTEXT, UNKNOWN_KEY, BAD_TAG, REPLAYED = range(5)
HEADER, OVERHEAD = 44, 60
SECRET = bytes(range(32))
KEYS = [(7, SECRET, True)]


def test_a_sealed_datagram_opens_to_its_plaintext_once() -> None:
    sender, receiver = _io.Sealer(KEYS), _io.Sealer(KEYS)
    plain = b"an Aeron datagram" * 10
    sealed = sender.seal(plain)
    assert len(sealed) == len(plain) + OVERHEAD
    assert receiver.open(sealed) == (OPENED, plain)
    assert receiver.open(sealed) == (REPLAYED, None)
    assert (sender.sealed, receiver.opened, receiver.replayed) == (1, 1, 1)


def test_the_envelope_is_as_documented_and_hides_the_payload() -> None:
    sender = _io.Sealer(KEYS)
    plain = b"secret payload!!" * 4
    before = time.time_ns()
    first, second = sender.seal(plain), sender.seal(plain)
    length, version, flags, kind, key_id = struct.unpack_from("<iBBHI", first)
    assert (length, version, flags, kind, key_id) == (len(first), 1, 0, 0x5EA1, 7)
    assert first[12:28] == sender.session
    assert struct.unpack_from("<Q", first, 28)[0] == 1
    assert struct.unpack_from("<Q", second, 28)[0] == 2
    assert before <= struct.unpack_from("<q", first, 36)[0] <= time.time_ns()
    assert b"secret payload" not in first
    assert first[HEADER:] != second[HEADER:]  # the same plaintext, another nonce


def test_every_sealer_has_its_own_session_so_nonces_never_repeat_across_restarts() -> None:
    sessions = {_io.Sealer(KEYS).session for _ in range(100)}
    assert len(sessions) == 100 and all(len(s) == 16 for s in sessions)
    sender = _io.Sealer(KEYS)
    counters = [struct.unpack_from("<Q", sender.seal(b"x"), 28)[0] for _ in range(1000)]
    assert counters == list(range(1, 1001))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=1500), st.data())
def test_a_flipped_bit_anywhere_never_opens_and_the_original_still_does(
        plain: bytes, data: st.DataObject) -> None:
    sender, receiver = _io.Sealer(KEYS), _io.Sealer(KEYS)
    sealed = sender.seal(plain)
    at = data.draw(st.integers(0, len(sealed) - 1))
    bit = data.draw(st.integers(0, 7))
    forged = bytearray(sealed)
    forged[at] ^= 1 << bit
    result, opened = receiver.open(bytes(forged))
    assert opened is None and result in (PLAINTEXT, UNKNOWN_KEY, BAD_TAG, REPLAYED)
    assert receiver.open(sealed) == (OPENED, plain)


@settings(max_examples=100, deadline=None)
@given(st.binary(min_size=1, max_size=600), st.data())
def test_a_truncated_or_extended_datagram_never_opens(plain: bytes, data: st.DataObject) -> None:
    sender, receiver = _io.Sealer(KEYS), _io.Sealer(KEYS)
    sealed = sender.seal(plain)
    cut = data.draw(st.integers(0, len(sealed) - 1))
    assert receiver.open(sealed[:cut])[1] is None
    assert receiver.open(sealed + b"\0")[0] == BAD_TAG
    assert receiver.open(sealed) == (OPENED, plain)


def test_datagrams_open_in_any_order_inside_the_window_and_never_below_it() -> None:
    sender, receiver = _io.Sealer(KEYS), _io.Sealer(KEYS)
    sealed = [sender.seal(i.to_bytes(4, "little")) for i in range(1100)]
    assert all(receiver.open(d)[0] == OPENED for d in reversed(sealed[1000:]))
    assert receiver.open(sealed[1099 - 1023])[0] == OPENED  # the oldest the window holds
    assert receiver.open(sealed[1099 - 1024])[0] == REPLAYED  # below the window
    assert receiver.open(sealed[0])[0] == REPLAYED
    assert receiver.replayed == 2


def test_another_key_is_unknown_and_the_same_id_with_another_secret_fails_its_tag() -> None:
    receiver = _io.Sealer(KEYS)
    assert receiver.open(_io.Sealer([(8, SECRET, True)]).seal(b"x"))[0] == UNKNOWN_KEY
    assert receiver.open(_io.Sealer([(7, os.urandom(32), True)]).seal(b"x"))[0] == BAD_TAG
    assert (receiver.unknown_key, receiver.bad_tag, receiver.opened) == (1, 1, 0)


def test_a_plain_aeron_datagram_is_dropped_as_plaintext() -> None:
    receiver = _io.Sealer(KEYS)
    data = encode_datagram([data_frame(session_id=1, stream_id=2, term_id=3, term_offset=0,
                                       payload=b"12345678")])
    assert receiver.open(data) == (PLAINTEXT, None)
    assert receiver.open(b"") == (PLAINTEXT, None)
    assert receiver.plaintext == 2


def test_a_datagram_stamped_out_of_the_skew_or_before_the_receiver_started_is_a_replay() -> None:
    sender = _io.Sealer(KEYS)
    early = sender.seal(b"recorded before the receiver started")
    time.sleep(0.002)  # the clock is what is tested: the receiver starts after the stamp
    receiver = _io.Sealer(KEYS, max_skew_ns=1_000_000_000)
    assert receiver.open(early)[0] == REPLAYED
    strict = _io.Sealer(KEYS, max_skew_ns=1_000_000)
    late = sender.seal(b"late")
    time.sleep(0.01)  # the clock is what is tested: the datagram ages past the 1 ms skew
    assert strict.open(late)[0] == REPLAYED


def test_rotation_a_receive_only_key_opens_but_never_seals() -> None:
    old, new = (1, os.urandom(32)), (2, os.urandom(32))
    host_a = _io.Sealer([(*old, True), (*new, False)])  # step 1: new is receive-only
    host_b = _io.Sealer([(*old, True), (*new, False)])
    assert struct.unpack_from("<I", host_a.seal(b"x"), 8)[0] == 1
    host_a.set_keys([(*old, True), (*new, True)])  # step 2 on host a first: it seals with new
    sealed = host_a.seal(b"with the new key")
    assert struct.unpack_from("<I", sealed, 8)[0] == 2
    assert host_b.open(sealed) == (OPENED, b"with the new key")
    assert host_a.open(host_b.seal(b"with the old key")) == (OPENED, b"with the old key")
    host_b.set_keys([(*new, True)])  # step 3: the old key is gone
    assert host_b.open(_io.Sealer([(*old, True)]).seal(b"old"))[0] == UNKNOWN_KEY
    # each host's keyring loads: made (1), then a step it took (1 more each)
    assert (host_a.key_sets, host_b.key_sets) == (2, 2)
    with pytest.raises(ValueError):
        host_b.set_keys([])  # refused: the keys (and the count) stay as they were
    assert host_b.key_sets == 2 and host_b.open(host_a.seal(b"still"))[0] == OPENED


def test_bad_keys_are_refused_clearly_and_a_sealer_without_a_sealing_key_cannot_seal() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        _io.Sealer([(1, b"short", True)])
    with pytest.raises(ValueError, match="1 to 16 keys"):
        _io.Sealer([])
    with pytest.raises(ValueError, match="id of 1"):
        _io.Sealer([(0, SECRET, True)])
    receive_only = _io.Sealer([(7, SECRET, False)])
    with pytest.raises(ValueError, match="cannot seal"):
        receive_only.seal(b"x")
    assert receive_only.open(_io.Sealer(KEYS).seal(b"x")) == (OPENED, b"x")


def test_new_sealer_and_rekey_take_the_keys_of_a_name_from_the_keyring() -> None:
    keyring = parse_keyring(new_key_line("a") + "\n" + new_key_line("b"))
    sealer = new_sealer(keyring, "a")
    other = new_sealer(keyring, "b")
    assert other.open(sealer.seal(b"x"))[0] == UNKNOWN_KEY
    with pytest.raises(KeyringError, match="no key named 'c'"):
        rekey(sealer, keyring, "c")
    assert _io.Sealer([(k.key_id, k.secret, True) for k in keyring.keys_of("a")]).open(
        sealer.seal(b"y")) == (OPENED, b"y")


def test_drop_reports_name_a_few_drops_per_source_and_second() -> None:
    reports = DropReports()
    lines = reports.reports(10**9, "aeron:udp?endpoint=h:1|key=k",
                            [(BAD_TAG, ("10.0.0.1", 5))] * 10)
    assert lines == ["aeron:udp?endpoint=h:1|key=k: dropped a datagram from 10.0.0.1:5: "
                     "bad tag"] * REPORTS_PER_SOURCE
    assert reports.reports(10**9 + 5, "c", [(REPLAYED, ("10.0.0.1", 5))]) == []
    flood = [(PLAINTEXT, ("10.0.1.1", port)) for port in range(100)]
    assert len(reports.reports(2 * 10**9, "c", flood)) == REPORTS_PER_SECOND
    assert reports.reports(3 * 10**9, "c", [(UNKNOWN_KEY, ("10.0.0.1", 5))]) == [
        "c: dropped a datagram from 10.0.0.1:5: unknown key"]


def test_the_keyring_watch_rereads_a_changed_file_and_keeps_the_keys_on_a_bad_one(
        tmp_path: Path) -> None:
    path = tmp_path / "keyring"
    path.write_text(new_key_line("k") + "\n")
    path.chmod(0o600)
    watch = KeyringWatch(path)
    first = watch.keyring()
    assert watch.changed() is None
    path.write_text(path.read_text() + new_key_line("k") + " receive-only\n")
    reread = watch.changed()
    assert reread is not None and len(reread.keys_of("k")) == 2 and reread != first
    path.write_text("k 1 not-base64\n")
    with pytest.raises(KeyringError, match="line 1"):
        watch.changed()
    assert watch.keyring() == reread
