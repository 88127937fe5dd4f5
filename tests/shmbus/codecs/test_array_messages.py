"""numpy arrays and Python objects as messages: exact round trips, property-tested.

The codec (shmbus/codecs/array_messages.py, object_messages.py) against numpy's own idea of
equality, byte for byte; then through a bus (``publish_array``/``arrays``,
``publish_object``/``objects``) in one process and across processes, small messages in the log
and large ones through shared memory.
"""

from __future__ import annotations

import asyncio
import pickle
import zlib
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shmbus
from shmbus.codecs.array_messages import array_parts, copy_array_into, decode_array
from shmbus.codecs.object_messages import decode_object, object_parts
from tests.support.messages import arrays
from tests.support.workers import large_workers as lw

pytestmark = pytest.mark.timeout(300)

def same(a: np.ndarray, b: np.ndarray) -> None:
    """Equal bit for bit, with the same dtype and shape (a structured array field by field:
    the padding between fields is not data); Fortran order kept."""
    assert b.dtype == a.dtype and b.shape == a.shape
    if a.dtype.names:
        for name in a.dtype.names:
            same(a[name], b[name])
    else:
        assert np.ascontiguousarray(b).tobytes() == np.ascontiguousarray(a).tobytes()
    if a.flags.f_contiguous and not a.flags.c_contiguous:
        assert b.flags.f_contiguous


def message(array: np.ndarray) -> bytes:
    header, data = array_parts(array)
    return header + data.tobytes()


@given(arrays(), st.booleans())
@settings(max_examples=400, deadline=None)
def test_the_array_codec_round_trips_exactly(array: np.ndarray, copy: bool) -> None:
    got = decode_array(message(array), copy)
    same(array, got)
    assert got.flags.writeable == copy


@given(arrays(), st.sampled_from(["C", "F"]))
@settings(max_examples=300, deadline=None)
def test_the_array_codec_copies_exactly_into_an_out_array_of_any_order(array: np.ndarray,
                                                                        order: str) -> None:
    out = np.empty(array.shape, array.dtype, order=order)
    got = copy_array_into(memoryview(message(array)), out)
    assert got is out
    same(np.asanyarray(array, order="K").copy(order=order), out)


def test_the_array_codec_refuses_objects_and_foreign_messages() -> None:
    with pytest.raises(ValueError, match="publish_object"):
        array_parts(np.array([object()]))
    with pytest.raises(ValueError, match="publish_array"):
        decode_array(b"not an array message at all", False)
    good = message(np.arange(10))
    with pytest.raises(ValueError, match="header says"):
        decode_array(good[:-8], False)


OBJECTS = st.recursive(
    st.one_of(st.none(), st.integers(), st.text(), st.binary(),
              arrays(max_side=40, max_dims=2).filter(lambda a: a.dtype.kind not in "mM" or a.size)),
    lambda children: st.one_of(st.lists(children, max_size=4),
                               st.dictionaries(st.text(max_size=5), children, max_size=4)),
    max_leaves=8,
)


def same_object(a: Any, b: Any) -> None:
    if isinstance(a, np.ndarray):
        same(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            same_object(a[key], b[key])
    elif isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            same_object(x, y)
    else:
        assert a == b


@given(OBJECTS, st.booleans())
@settings(max_examples=200, deadline=None)
def test_the_object_codec_round_trips_with_out_of_band_buffers(obj: Any, copy: bool) -> None:
    parts = object_parts(obj)
    got = decode_object(memoryview(b"".join(parts)), copy)
    # what pickle itself gives back (numpy's pickling has its own quirks: a 0-d big-endian
    # datetime comes back native-endian)
    same_object(pickle.loads(pickle.dumps(obj, protocol=5)), got)


def test_object_buffers_travel_out_of_band_aligned() -> None:
    array = np.arange(100_000, dtype=np.float64)
    parts = object_parts({"a": array})
    assert any(isinstance(p, memoryview) and p.nbytes == array.nbytes for p in parts)
    whole = memoryview(b"".join(parts))
    got = decode_object(whole, False)["a"]
    assert not got.flags.writeable  # a view of the message, not a copy
    offset = np.frombuffer(whole, np.uint8).ctypes.data
    assert (got.ctypes.data - offset) % 64 == 0


# -- through a bus ------------------------------------------------------------------------------

@given(st.lists(arrays(max_side=700, max_dims=2), min_size=1, max_size=4))
@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
def test_arrays_of_every_size_round_trip_through_the_bus(stream, batch) -> None:
    pub, sub = stream
    for array in batch:
        pub.publish_array(array, timeout=5)
    got = sub.arrays(timeout=1.0)
    for array in batch:
        received = next(got)
        large = len(message(array)) > pub.max_message_length
        assert received.flags.writeable == (not large), "large: a view; small: a copy"
        same(array, received)
    got.close()


def test_a_256_mib_array_arrives_as_a_read_only_view_of_the_block(stream) -> None:
    pub, sub = stream
    array = np.random.default_rng(1).integers(0, 2**63, (4096, 8192), dtype=np.int64)
    assert array.nbytes == 256 << 20
    pub.publish_array(array, timeout=10)
    for received in sub.arrays(timeout=2):
        assert not received.flags.writeable and not received.flags.owndata
        assert np.array_equal(received, array)
        break
    # (the 256 MiB block is freed by the driver once the reader moved on: until then a claim
    # that goes in the warm beginning is back-pressured, so it waits)
    with pub.claim_array((1000, 3000), np.float32, order="F", timeout=5) as claim:
        claim.array[:] = np.arange(3000, dtype=np.float32)
    [filled] = [a.copy(order="K") for a in sub.arrays(timeout=0.5)]
    assert filled.flags.f_contiguous and filled[999, 2999] == 2999


@given(st.lists(OBJECTS, min_size=1, max_size=3), st.booleans())
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
def test_objects_round_trip_through_the_bus(stream, batch, copy) -> None:
    pub, sub = stream
    big = {"frame": np.ones((700, 700)), "batch": batch}  # 3.9 MB: the large path
    for obj in [*batch, big]:
        pub.publish_object(obj, timeout=5)
    got = sub.objects(timeout=1.0, copy=copy)
    for obj in batch:
        same_object(pickle.loads(pickle.dumps(obj, protocol=5)), next(got))
    received = next(got)
    same_object(pickle.loads(pickle.dumps(big, protocol=5)), received)
    assert received["frame"].flags.writeable == copy
    got.close()


def test_asyncio_arrays_and_objects(stream) -> None:
    pub, sub = stream

    async def main() -> list[Any]:
        await pub.publish_array_async(np.arange(1_000_000))
        await pub.publish_object_async({"x": np.arange(10)})
        out: list[Any] = []
        async for array in sub.arrays_async(timeout=1.0, copy=True):
            out.append(array)
            break
        async for obj in sub.objects_async(timeout=1.0):
            out.append(obj)
            break
        return out

    array, obj = asyncio.run(main())
    assert np.array_equal(array, np.arange(1_000_000))
    assert np.array_equal(obj["x"], np.arange(10))


def test_arrays_copied_into_out_release_their_block_before_they_are_handed_out(stream) -> None:
    """With ``out`` (and ``copy=True``) the position moves past a large message as soon as it is
    copied: the writer can reuse its block while the caller works; a view holds it."""
    pub, sub = stream
    frames = [lw.frame_for(i) for i in range(3)]
    ends = [pub.publish_array(frame, timeout=5) for frame in frames]
    image = sub.images[0]
    out = np.empty(lw.FRAME_SHAPE)
    got = sub.arrays(timeout=1.0, out=out)
    assert next(got) is out and np.array_equal(out, frames[0])
    assert image.position == ends[0], "out holds a copy: nothing is held"
    got.close()
    copies = sub.arrays(timeout=1.0, copy=True)
    copied = next(copies)
    assert np.array_equal(copied, frames[1]) and copied.flags.writeable
    assert image.position == ends[1]
    copies.close()
    views = sub.arrays(timeout=1.0)
    view = next(views)
    assert np.array_equal(view, frames[2]) and not view.flags.writeable
    assert image.position == ends[1], "a view holds the position before its message"
    views.close()
    assert image.position == ends[2]


def test_bad_out_arrays_are_refused_naming_what_is_wrong(stream) -> None:
    pub, sub = stream
    with pytest.raises(TypeError, match="out must be a numpy array, not list"):
        sub.arrays(out=[0.0] * 10)
    read_only = np.zeros(10)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match=r"out \(shape \(10,\), dtype float64\) is read-only"):
        sub.arrays(out=read_only)
    with pytest.raises(ValueError, match="dtype object"):
        sub.arrays(out=np.empty(3, object))
    with pytest.raises(ValueError, match="out is the copy"):
        sub.arrays(copy=True, out=np.empty(3))
    frame = lw.frame_for(0)
    small = np.arange(12, dtype=np.int32).reshape(3, 4)
    for array in (frame, frame, frame, small, small):
        pub.publish_array(array, timeout=5)
    out = np.zeros(lw.FRAME_SHAPE[::-1])
    with pytest.raises(ValueError, match=r"out has shape \(800, 600\) where the message's is "
                                         r"\(600, 800\)$"):
        next(sub.arrays(timeout=1.0, out=out))
    assert not out.any(), "out is left as it was"
    with pytest.raises(ValueError, match="out has dtype float32 where the message's is float64$"):
        next(sub.arrays(timeout=1.0, out=np.zeros(lw.FRAME_SHAPE, np.float32)))
    out = np.zeros(lw.FRAME_SHAPE)
    assert next(sub.arrays(timeout=1.0, out=out)) is out and np.array_equal(out, frame)
    with pytest.raises(ValueError, match=r"out has shape \(600, 800\) where the message's is "
                                         r"\(3, 4\) and dtype float64 where the message's is "
                                         r"int32"):
        next(sub.arrays(timeout=1.0, out=out))
    fits = np.zeros((3, 4), np.int32, order="F")
    assert next(sub.arrays(timeout=1.0, out=fits)) is fits, "a small message goes into out too"
    assert np.array_equal(fits, small)


def test_asyncio_arrays_into_out(stream) -> None:
    pub, sub = stream
    out = np.empty(lw.FRAME_SHAPE)

    async def main() -> list[float]:
        for i in range(3):
            await pub.publish_array_async(lw.frame_for(i))
        firsts = []
        async for array in sub.arrays_async(timeout=1.0, out=out):
            assert array is out
            assert np.array_equal(array, lw.frame_for(len(firsts)))
            firsts.append(float(array[0, 0]))
            if len(firsts) == 3:
                break
        return firsts

    assert asyncio.run(main()) == [0.0, 1.0, 2.0]


def test_arrays_into_out_cross_to_four_reader_processes_exactly(bus_context, driver,
                                                                 procs) -> None:
    count = 24
    for order in ("C", "F", "C", "F"):
        procs.start(lw.frame_reader, bus_context, 23, count, order, procs.queue)
    procs.wait("ready", 4)
    procs.start(lw.frame_writer, bus_context, 23, count, procs.queue)
    procs.wait("sent", timeout=120)
    expected = [zlib.crc32(np.ascontiguousarray(lw.frame_for(i)).tobytes())
                for i in range(count)]
    for report in procs.wait("read", 4, timeout=120):
        assert report["crcs"] == expected, report["name"]
        assert report["same_out"] and report["out_order_kept"], report


def test_arrays_cross_processes(bus_context, driver, procs) -> None:
    procs.start(lw.array_writer, bus_context, 22, 40, procs.queue)
    with shmbus.connect(bus_context) as bus:
        sub = bus.add_subscription("aeron:ipc", 22)
        got = 0
        for array in sub.arrays(timeout=20):
            same(lw.array_for(got), array)
            got += 1
            if got == 40:
                break
        assert got == 40
    procs.wait("sent")

