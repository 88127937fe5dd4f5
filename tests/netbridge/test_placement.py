"""The placement rule (netbridge.placement) against a model, and the native fast path's share
of it: an image fed any mix of in-order, reordered, duplicated and missing datagrams holds
exactly the bytes a set of received ranges says, and placing the in-order ones as the native
batch does (copy, then ReceiverImage.on_in_order_data) leaves it as on_datagram does."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from netbridge.frames import data_frame, encode_datagram
from netbridge.log_port import FrameWalk, valid_geometry
from netbridge.placement import Placement, in_order, placement
from netbridge.receiver import NetworkReceiver
from netbridge.receiver_image import ReceiverImage
from shmbus.shm.log_buffer import LogBufferError, check_mtu, check_term_length
from tests.support.fake_log_port import FakeImageHost, FakeImageLog
from tests.support.sans_io import INITIAL, SENDER, SESSION, STREAM, TERM, setup

MS = 1_000_000


def stream_of(sizes: list[int]) -> tuple[bytes, list[int]]:
    """The sender's log from position 0: one DATA frame per payload size, and where each frame
    starts (then where the last ends)."""
    frames, starts, position = [], [], 0
    for i, size in enumerate(sizes):
        starts.append(position)
        frames.append(data_frame(term_offset=position, session_id=SESSION, stream_id=STREAM,
                                 term_id=INITIAL, payload=bytes([i % 251 + 1]) * size))
        position += (32 + size + 31) & ~31
    starts.append(position)
    return encode_datagram(frames), starts


datagram_plans = st.lists(st.integers(0, 180), min_size=1, max_size=60).flatmap(
    lambda sizes: st.tuples(
        st.just(sizes),
        st.lists(st.integers(1, 4), min_size=len(sizes), max_size=len(sizes)),
        st.lists(st.integers(0, len(sizes) - 1), max_size=3 * len(sizes))))


def datagrams_of(sizes: list[int], groups: list[int]) -> tuple[bytes, list[tuple[int, int]]]:
    """The log, and its datagrams as (start, end) of whole frames, up to ``groups[i]`` frames
    each from frame i on (as a sender packs them, smaller than any mtu)."""
    log, starts = stream_of(sizes)
    spans, frame = [], 0
    while frame < len(sizes):
        last = min(frame + groups[frame], len(sizes))
        spans.append((starts[frame], starts[last]))
        frame = last
    return log, spans


def joined() -> tuple[NetworkReceiver, ReceiverImage, FakeImageLog]:
    host = FakeImageHost()
    receiver = NetworkReceiver(host, receiver_id=1)
    receiver.add_subscription(STREAM)
    receiver.on_datagram(0, setup(0), SENDER)
    return receiver, receiver.images[(SESSION, STREAM)], host.image(SESSION, STREAM)


def image_state(image: ReceiverImage, log: FakeImageLog) -> tuple[object, ...]:
    return (image.rcv_pos, image.rcv_hwm, [(g.start, g.end) for g in image.loss.gaps],
            image.duplicates, image.datagrams_received, image.bytes_received,
            image.gaps_detected, image.bytes_lost, bytes(log.memory[:TERM]))


@settings(max_examples=200, deadline=None)
@given(datagram_plans)
def test_an_image_holds_what_a_model_of_received_ranges_says(plan: tuple) -> None:
    sizes, groups, order = plan
    log_bytes, spans = datagrams_of(sizes, groups)
    by_datagram, image, log = joined()
    natively, fast_image, fast_log = joined()
    covered: set[int] = set()  # the model: every 32-byte block received
    duplicates = 0
    for now, index in enumerate(order, start=1):
        start, end = spans[index % len(spans)]
        datagram = log_bytes[start:end]
        blocks = set(range(start // 32, end // 32))
        duplicates += blocks <= covered
        covered |= blocks

        walk = fast_log.walk(memoryview(datagram), start, INITIAL, fast_image.rcv_pos - start)
        assert walk == FrameWalk(end - start, end - start, walk.skip if walk else 0)
        if in_order(start, walk, fast_image.rcv_hwm, fast_image.window_limit,
                    fast_image.end_of_stream_position):
            # what the native batch does: copy whole, then the image accounts for it
            assert placement(start, walk, fast_image.rcv_pos, fast_image.window_limit,
                             None) is Placement.PLACE and walk.skip == 0
            fast_log.insert(start, memoryview(datagram))
            fast_image.on_in_order_data(now, start + walk.span, 1, len(datagram), SENDER)
        else:
            natively.on_datagram(now, datagram, SENDER)
        by_datagram.on_datagram(now, datagram, SENDER)

        rebuild = 0
        while rebuild // 32 in covered:
            rebuild += 32
        hwm = 32 * (max(covered) + 1)
        assert (image.rcv_pos, image.rcv_hwm) == (rebuild, hwm)
        assert log.memory[:rebuild] == log_bytes[:rebuild]
        assert image.duplicates == duplicates
        assert image_state(fast_image, fast_log) == image_state(image, log)


def test_placement_verdicts() -> None:
    walk = FrameWalk(end=256, span=256, skip=0)
    assert placement(0, walk, 256, 4096, None) is Placement.DUPLICATE
    assert placement(0, walk, 128, 4096, None) is Placement.PLACE
    assert placement(4096 - 128, walk, 0, 4096, None) is Placement.OVERRUN
    assert placement(0, walk, 0, 4096, 128) is Placement.PAST_END
    assert in_order(512, walk, 512, 768, None)
    assert not in_order(512, walk, 512, 767, None)
    assert not in_order(512, walk, 256, 4096, None)
    assert not in_order(512, walk, 512, 4096, 4096)


def test_valid_geometry_is_the_log_buffers_rule() -> None:
    def log_buffer_takes(term_length: int, mtu: int) -> bool:
        try:
            check_term_length(term_length)
            check_mtu(mtu, term_length)
        except LogBufferError:
            return False
        return True

    for term_length in (0, 32 * 1024, 64 * 1024, 64 * 1024 + 32, 96 * 1024, 128 * 1024,
                        1 << 30, 1 << 31):
        for mtu in (0, 32, 64, 96, 100, 1408, 8192, 8224, 65504, 65536):
            assert valid_geometry(term_length, mtu) == log_buffer_takes(term_length, mtu), (
                term_length, mtu)
