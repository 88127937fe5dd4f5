"""Array messages from a hostile writer (shmbus/codecs/array_messages.py): a header naming objects,
a structure holding them, a dtype numpy would pickle, deep nesting, absurd shapes, or random
and mutated bytes gives a clean ValueError or a correct array, never an object array, never a
crash. Property-tested with hypothesis, then through a bus (``arrays()``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shmbus
from shmbus.codecs.array_messages import (
    MAX_HEADER_LENGTH,
    array_parts,
    copy_array_into,
    decode_array,
    plain_dtype,
)
from tests.support.messages import ARRAY_PREFIX, arrays, forged, header_text
from tests.support.waits import wait_until

pytestmark = pytest.mark.timeout(300)


def decoded_or_refused(buffer: bytes) -> np.ndarray | None:
    """decode_array's array (checked to hold plain bytes, both ways of reading), or None when
    it refused with ValueError; any other exception fails the test."""
    results = []
    for copy in (False, True):
        try:
            results.append(decode_array(buffer, copy))
        except ValueError:
            results.append(None)
    view, copied = results
    assert (view is None) == (copied is None)
    for array in (view, copied):
        if array is not None:
            assert isinstance(array, np.ndarray)
            assert not array.dtype.hasobject and plain_dtype(array.dtype), array.dtype
    if view is not None and copied is not None:
        same_values(view, copied)
    return view


def same_values(a: np.ndarray, b: np.ndarray) -> None:
    """Equal dtype, shape and values; a structure field by field (its padding, even all of it
    when it has no fields, is not data: a copy need not keep it)."""
    assert a.dtype == b.dtype and a.shape == b.shape
    if a.dtype.names is not None:
        for name in a.dtype.names:
            same_values(a[name], b[name])
    else:
        assert a.tobytes() == b.tobytes()


# -- the named attacks ------------------------------------------------------------------------

OBJECT_HEADERS = [
    header_text("|O", (2,)),
    header_text("O", (0,)),  # zero bytes: numpy would make the object array from nothing
    header_text("|O", ()),
    header_text([("a", "<i4"), ("b", "|O")], (1,)),
    header_text([("a", "<i4"), ("b", [("c", "|O")])], (0,)),
    header_text([("a", "|O", (2,))], (1,)),
    header_text(("|O", (2,)), (1,)),
    header_text("T", (1,)),  # numpy's StringDType: pointers into an arena
    header_text("object", (1,)),
    header_text({"names": ["a"], "formats": ["O"], "offsets": [0]}, (1,)),
    header_text(("|V8", {"names": ["a"], "formats": ["O"], "offsets": [0]}), (1,)),
]


@pytest.mark.parametrize("text", OBJECT_HEADERS)
def test_a_header_naming_objects_is_refused_before_any_array_is_made(text: str) -> None:
    for data in (b"", bytes(8), bytes(16), bytes(64)):
        with pytest.raises(ValueError, match="refused array message|corrupt array message"):
            decode_array(forged(text, data), copy=False)
        with pytest.raises(ValueError):
            copy_array_into(forged(text, data), np.empty(1))


def test_a_writer_cannot_make_what_a_reader_refuses() -> None:
    for dtype in (np.dtype("O"), np.dtype([("a", "<i4"), ("b", "O")]), np.dtype("T")):
        with pytest.raises(ValueError, match="publish_object"):
            array_parts(np.empty(2, dtype))
    wide = np.dtype([(f"field_{i:05}", "<f8") for i in range(4000)])
    with pytest.raises(ValueError, match="more than an array message has room for"):
        array_parts(np.zeros(1, wide))


@pytest.mark.parametrize("text, why", [
    ("-" * 50_000 + "1", "parser stack"),
    ("[" * 1000 + "]" * 1000, "nesting"),
    (header_text("<f8", (1e999,)), "an infinite length"),
    (header_text("<f8", (-1, -1)), "negative lengths"),
    (header_text("<f8", (2.0,)), "a float length"),
    (header_text("<f8", (True,)), "a bool length"),
    (header_text("<f8", (1,) * 65), "past numpy's dimensions"),
    (header_text("<f8", (0, 2**62, 2**62)), "past what numpy indexes"),
    (header_text("<f8", (2**64,)), "past int64"),
    (header_text("<f8", [1]), "a list shape"),
    (header_text("<f8", (1,), fortran=1), "a fortran_order that is no bool"),
    ("{'descr': '<f8', 'shape': (1,)}", "a missing key"),
    ("{'descr': '<f8', 'fortran_order': False, 'shape': (1,), 'x': 1}", "an extra key"),
    ("['<f8', False, (1,)]", "no dict"),
    ("__import__('os').system('touch /tmp/x')", "a call"),
    ("{'descr': '<f8', 'fortran_order': False, 'shape': (1,)}\xff", "bad UTF-8"),
    (header_text("<V99999999999", (1,)), "a giant void"),
    (header_text("<i4", (4,)), "data of another length"),
])
def test_hostile_headers_give_a_clean_value_error(text: str, why: str) -> None:
    data = bytes(8)
    buffer = forged(text.encode("latin-1") if "\xff" in text else text, data)
    with pytest.raises(ValueError):
        decode_array(buffer, copy=False)


def test_header_length_past_the_limit_is_refused_unread() -> None:
    huge = forged(header_text("<f8", (1,)), bytes(8), length=MAX_HEADER_LENGTH + 64)
    huge += bytes(MAX_HEADER_LENGTH)
    with pytest.raises(ValueError, match="past the"):
        decode_array(huge, copy=False)


# -- properties ---------------------------------------------------------------------------------

HOSTILE_LEAVES = st.sampled_from(["|O", "O", "O8", "object", "T", "i4,O", "|V0", "<U0",
                                  "M8[generic]", "a", "p", "=i8", "<m8", "V"])
PLAIN_LEAVES = st.sampled_from(["<i4", ">i2", "|b1", "<f8", "|V8", "<M8[ns]", "<U3", "|S2",
                                "<c16", "<f2", "|u1"])
DESCR_LEAVES = st.one_of(HOSTILE_LEAVES, PLAIN_LEAVES, PLAIN_LEAVES, st.text(max_size=6))
DESCRS = st.recursive(
    DESCR_LEAVES,
    lambda children: st.one_of(
        st.lists(st.tuples(st.text(max_size=3), children), max_size=3),
        st.lists(st.tuples(st.text(max_size=3), children,
                           st.tuples(st.integers(-2, 4))), max_size=2),
        st.tuples(children, st.tuples(st.integers(-1, 3))),
        st.fixed_dictionaries({"names": st.lists(st.text(max_size=2), max_size=2),
                               "formats": st.lists(children, max_size=2)}),
    ),
    max_leaves=6,
)
SHAPES = st.one_of(
    st.lists(st.integers(0, 6), max_size=4).map(tuple),
    st.lists(st.integers(-3, 6), max_size=4).map(tuple),
    st.lists(st.integers(-(2**65), 2**65), max_size=3).map(tuple),
    st.integers(), st.none(), st.floats(), st.lists(st.integers(0, 3), max_size=2),
    st.tuples(st.floats(allow_nan=True)),
)
FORTRAN = st.one_of(st.booleans(), st.sampled_from([0, 1, None, "", "F"]))


@given(DESCRS, SHAPES, FORTRAN, st.integers(0, 96), st.booleans())
@settings(max_examples=2000, deadline=None)
def test_any_header_of_the_right_form_decodes_plainly_or_is_refused(
        descr: Any, shape: Any, fortran: Any, extra: int, fit: bool) -> None:
    text = header_text(descr, shape, fortran)
    # data of the length the header would need (when it computes), else anything
    data = bytes(extra)
    if fit:
        try:
            dtype = np.lib.format.descr_to_dtype(descr)
            count = int(np.prod(shape, dtype=object)) if isinstance(shape, tuple) else 0
            if 0 <= count * dtype.itemsize <= 4096:
                data = bytes(range(256)) * (count * dtype.itemsize // 256 + 1)
                data = data[:count * dtype.itemsize]
        except Exception:  # numpy makes no dtype of it: the header goes with no data
            pass
    array = decoded_or_refused(forged(text, data))
    if array is not None:
        assert array.shape == shape and array.nbytes == len(data)
        assert array.tobytes(order="A") == data  # the message's bytes, in its order


def numpy_dtype(descr: Any) -> np.dtype | None:
    """What numpy's own .npy reader would make of ``descr``, or None when it makes nothing."""
    try:
        return np.lib.format.descr_to_dtype(descr)
    except Exception:
        return None


@given(DESCRS, st.lists(st.integers(0, 5), max_size=3).map(tuple), st.booleans())
@settings(max_examples=1500, deadline=None)
def test_a_well_formed_header_is_read_exactly_when_its_dtype_is_plain(
        descr: Any, shape: tuple[int, ...], fortran: bool) -> None:
    """The oracle is numpy's reader: a plain dtype gives the array of the message's bytes; a
    dtype with objects (or of another class), or one no array has (a subarray, which numpy
    makes dimensions; a str of length 0, which it makes length 1), is refused, whatever the
    bytes."""
    dtype = numpy_dtype(descr)
    nbytes = (dtype.itemsize if dtype is not None else 8) * int(np.prod(shape))
    data = (bytes(range(256)) * (nbytes // 256 + 1))[:nbytes]
    array = decoded_or_refused(forged(header_text(descr, shape, fortran), data))
    if dtype is None or not plain_dtype(dtype) or np.empty(0, dtype).dtype != dtype:
        assert array is None
        return
    assert array is not None and array.dtype == dtype and array.shape == shape
    if nbytes:
        flat = np.frombuffer(data, dtype)
        expected = flat.reshape(shape[::-1]).T if fortran else flat.reshape(shape)
        assert array.tobytes(order="A") == expected.tobytes(order="A") == data


@given(st.binary(max_size=400), st.binary(max_size=128))
@settings(max_examples=1000, deadline=None)
def test_random_header_bytes_are_refused_cleanly(text: bytes, data: bytes) -> None:
    decoded_or_refused(forged(text, data))


@st.composite
def mutated(draw: Any) -> tuple[np.ndarray, bytes, bool]:
    """(an array, its message with the header text mutated, whether the text is unchanged)."""
    array = draw(arrays(max_side=6, max_dims=3))
    header, data = array_parts(array)
    text = bytearray(header[ARRAY_PREFIX.size:])
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["byte", "splice", "swap-descr"]))
        at = draw(st.integers(0, len(text) - 1))
        if kind == "byte":
            text[at] = draw(st.integers(0, 255))
        elif kind == "splice":
            piece = draw(st.sampled_from([b"'|O'", b"'O'", b"('a', '|O')", b"-", b"1e999",
                                          b"(", b")", b"[", b"]", b",", b"0", b"True",
                                          b"2**64", b"'T'", b"{", b"}", b"\x00"]))
            text[at:at + draw(st.integers(0, 4))] = piece
        else:
            text = bytearray(bytes(text).replace(b"'descr': ", b"'descr': '|O', 'x': ", 1))
    text = bytes(text)
    unchanged = text.rstrip() == header[ARRAY_PREFIX.size:].rstrip()
    return array, forged(text, data.tobytes()), unchanged


@given(mutated())
@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_mutated_headers_decode_plainly_or_are_refused(case: tuple[np.ndarray, bytes, bool]
                                                       ) -> None:
    array, buffer, unchanged = case
    got = decoded_or_refused(buffer)
    if unchanged:
        assert got is not None
        same_values(array, got)


# -- through a bus ------------------------------------------------------------------------------

def test_arrays_on_a_bus_refuse_an_object_header_and_read_on(bus_context, driver) -> None:
    with shmbus.connect(bus_context) as bus, \
            bus.add_exclusive_publication("aeron:ipc", 23) as pub, \
            bus.add_subscription("aeron:ipc", 23) as sub:
        wait_until(lambda: pub.is_connected, 10, "the subscriber")
        pub.publish(forged(header_text("|O", (2,)), bytes(16)), timeout=5)
        pub.publish(forged(header_text("O", (0,))), timeout=5)
        pub.publish_array(np.arange(5), timeout=5)
        for _ in range(2):
            with pytest.raises(ValueError, match="refused array message"):
                next(sub.arrays(timeout=5))
        assert np.array_equal(next(sub.arrays(timeout=5)), np.arange(5))
