"""numpy arrays as messages: a header with dtype, shape and order, then the array's bytes.

The header says what numpy's ``.npy`` header says (``descr``, ``fortran_order``, ``shape``:
structured, datetime and every other non-object dtype), after a 12-byte prefix (magic
``SBAR``, version, header length), padded so the data starts 64-byte aligned.

A reader builds nothing but plain bytes from a message, whoever wrote it: the header is parsed
as literals only (at most ``MAX_HEADER_LENGTH`` bytes), its dtype must be one of numpy's own
fixed-size kinds (bool, integers, floats, complex, datetime, timedelta, bytes, str, void, and
structures and subarrays of them: :func:`plain_dtype`), never an object dtype, a dtype holding
objects in a field or a user-defined dtype (numpy would save those by pickling), and its shape
a tuple of at most ``MAX_DIMS`` lengths >= 0. Anything else is refused with ValueError before an
array is made, so the bytes of a message are never taken for pointers or run as code. Pure
functions:
:func:`array_parts` for a writer, :func:`decode_array` (a view or a new copy) and
:func:`copy_array_into` (into a caller's array) for a reader; the publication and subscription
methods (``publish_array``, ``arrays``) sit on top.
"""

from __future__ import annotations

import ast
import functools
import math
import struct
from typing import Any

import numpy as np

_PREFIX = struct.Struct("<4sHHI")
_MAGIC = b"SBAR"
_ALIGN = 64
#: The longest header (prefix included) a writer makes and a reader parses: numpy's .npy reader
#: has such a limit too (10000 by default), as parsing literals costs what they are long.
MAX_HEADER_LENGTH = 1 << 16
#: The most dimensions an array message has (numpy's own limit).
MAX_DIMS = 64
#: The classes of numpy's own fixed-size dtypes: their values are bytes, nothing else.
_PLAIN_DTYPES = frozenset(type(np.dtype(code)) for code in "?bhilqpBHILQPefdgFDGSUVMm")


def plain_dtype(dtype: np.dtype[Any]) -> bool:
    """True when an array of ``dtype`` holds only bytes: one of numpy's fixed-size dtypes
    (bool, integers, floats, complex, datetime, timedelta, bytes, str, void), or a structure
    or subarray of them. False for the object dtype, anything holding objects, and dtypes of
    other classes (numpy's StringDType, user-defined ones)."""
    if dtype.hasobject or type(dtype) not in _PLAIN_DTYPES:
        return False
    if dtype.subdtype is not None:
        return plain_dtype(dtype.subdtype[0])
    if dtype.fields is not None:
        return all(plain_dtype(field[0]) for field in dtype.fields.values())
    return True


def array_header(shape: tuple[int, ...], dtype: np.dtype[Any], fortran_order: bool) -> bytes:
    """The header of an array message (its length a multiple of 64). ValueError for an array
    no reader would take: a dtype that is not :func:`plain_dtype`, a header past
    ``MAX_HEADER_LENGTH``."""
    if not plain_dtype(dtype):
        what = "holds Python objects" if dtype.hasobject else "is not one of numpy's own " \
                                                              "fixed-size dtypes"
        raise ValueError(f"an array of dtype {dtype} {what}: publish it with publish_object")
    header = _header(tuple(int(n) for n in shape), dtype, fortran_order)
    if len(header) > MAX_HEADER_LENGTH:
        raise ValueError(f"the header of an array of dtype {dtype} takes {len(header)} bytes, "
                         f"more than an array message has room for ({MAX_HEADER_LENGTH})")
    return header


@functools.lru_cache(maxsize=256)
def _header(shape: tuple[int, ...], dtype: np.dtype[Any], fortran_order: bool) -> bytes:
    """(Made once per distinct header: a stream of like arrays pays it once.)"""
    text = repr({"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": fortran_order,
                 "shape": shape}).encode("utf-8")
    length = -(-(_PREFIX.size + len(text)) // _ALIGN) * _ALIGN
    return _PREFIX.pack(_MAGIC, 1, 0, length) + text.ljust(length - _PREFIX.size)


def array_parts(array: np.ndarray[Any, Any]) -> tuple[bytes, np.ndarray[Any, Any]]:
    """(header, data): the message is the header followed by data's bytes (a uint8 view of the
    array when it is C- or Fortran-contiguous, of a C-ordered copy otherwise)."""
    array = np.asanyarray(array)
    fortran = bool(array.flags.f_contiguous and not array.flags.c_contiguous)
    if fortran:
        data = array.T
    elif array.flags.c_contiguous:
        data = array
    else:
        data = np.ascontiguousarray(array)
    header = array_header(array.shape, array.dtype, fortran)
    if data.dtype.itemsize == 0 or data.size == 0:
        return header, np.empty(0, np.uint8)
    return header, data.reshape(-1).view(np.uint8)


def header_length(buffer: Any) -> int:
    """The length of the header at the start of an array message; ValueError if it is none."""
    if len(buffer) < _PREFIX.size:
        raise ValueError(f"not an array message: {len(buffer)} bytes")
    magic, version, _, length = _PREFIX.unpack(bytes(buffer[:_PREFIX.size]))
    if magic != _MAGIC or version != 1 or not _PREFIX.size <= length <= len(buffer):
        raise ValueError("not an array message (no SBAR header): was it sent with "
                         "publish_array?")
    if length > MAX_HEADER_LENGTH:
        raise ValueError(f"corrupt array message header: {length} bytes, past the "
                         f"{MAX_HEADER_LENGTH} a writer makes")
    return int(length)


@functools.lru_cache(maxsize=256)
def _fields(text: bytes) -> tuple[np.dtype[Any], tuple[int, ...], bool]:
    """(dtype, shape, Fortran order) of a header's text (parsed once per distinct header: a
    stream of like arrays pays it once). ValueError for anything but the three keys, a
    :func:`plain_dtype` that an array can have (not a subarray, not a str of length 0), a shape
    of at most MAX_DIMS lengths >= 0 and a bool."""
    try:
        fields = ast.literal_eval(text.decode("utf-8").strip())
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as e:
        # (MemoryError and RecursionError: the parser's stack overflowed on deep nesting)
        raise ValueError(f"corrupt array message header: {type(e).__name__}") from None
    if not isinstance(fields, dict) or set(fields) != {"descr", "fortran_order", "shape"}:
        raise ValueError("corrupt array message header: not a dict of descr, fortran_order "
                         "and shape")
    shape, fortran = fields["shape"], fields["fortran_order"]
    if not (isinstance(shape, tuple) and len(shape) <= MAX_DIMS
            and all(type(n) is int and 0 <= n < 2**63 for n in shape)):
        raise ValueError(f"corrupt array message header: shape {shape!r:.80} is not a tuple "
                         f"of at most {MAX_DIMS} lengths >= 0")
    if not isinstance(fortran, bool):
        raise ValueError(f"corrupt array message header: fortran_order {fortran!r:.80} is "
                         f"not a bool")
    try:  # (numpy's parser of the literals: any failure of it is a corrupt header)
        dtype = np.lib.format.descr_to_dtype(fields["descr"])
    except Exception as e:
        raise ValueError(f"corrupt array message header: descr {fields['descr']!r:.80} is "
                         f"not a dtype ({type(e).__name__})") from None
    if not plain_dtype(dtype):
        raise ValueError(f"refused array message: dtype {dtype} "
                         f"{'holds Python objects' if dtype.hasobject else 'is not plain'}; "
                         f"an array message carries only numpy's fixed-size dtypes (objects "
                         f"travel with publish_object)")
    made = np.empty(0, dtype).dtype
    if made != dtype:  # a subarray (numpy makes it dimensions), a str or bytes of length 0
        raise ValueError(f"corrupt array message header: no array has dtype {dtype} (numpy "
                         f"makes it {made})")
    return dtype, shape, fortran


def decode_array(buffer: Any, copy: bool) -> np.ndarray[Any, Any]:
    """The array in an array message: a read-only view of ``buffer`` (``copy`` False; it is
    valid as long as the buffer's memory is) or a writable copy with the same order."""
    length = header_length(buffer)
    dtype, shape, fortran = _fields(bytes(buffer[_PREFIX.size:length]))
    count = math.prod(shape)
    nbytes = count * dtype.itemsize
    if len(buffer) - length != nbytes:
        raise ValueError(f"array message of {len(buffer) - length} data bytes, header says "
                         f"{shape} of {dtype} ({nbytes} bytes)")
    if nbytes == 0:
        try:
            empty: np.ndarray[Any, Any] = np.zeros(shape, dtype, order="F" if fortran else "C")
        except ValueError as e:  # lengths past what numpy indexes, zero bytes or not
            raise ValueError(f"corrupt array message header: shape {shape}: {e}") from None
        empty.flags.writeable = copy  # as a view would be
        return empty
    flat = np.frombuffer(buffer, dtype, count=count, offset=length)
    array = flat.reshape(shape[::-1]).T if fortran else flat.reshape(shape)
    return array.copy(order="K") if copy else array


def check_out(out: Any) -> np.ndarray[Any, Any]:
    """``out`` if it can take arrays copied in (a writable numpy array of a dtype without
    Python objects); TypeError or ValueError saying what it is not."""
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy array, not {type(out).__name__}")
    if not out.flags.writeable:
        raise ValueError(f"out (shape {out.shape}, dtype {out.dtype}) is read-only: pass a "
                         f"writable array")
    if out.dtype.hasobject:
        raise ValueError(f"out has dtype {out.dtype}, which holds Python objects: no array "
                         f"message has one")
    return out


def copy_array_into(buffer: Any, out: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Copy the array in an array message into ``out`` and return ``out``; ``out`` must have
    the message's shape and dtype (its memory layout is its own: values are copied by index),
    else ValueError naming what differs, ``out`` left as it was."""
    length = header_length(buffer)
    dtype, shape, _ = _fields(bytes(buffer[_PREFIX.size:length]))
    if out.shape != shape or out.dtype != dtype:
        differs = []
        if out.shape != shape:
            differs.append(f"shape {out.shape} where the message's is {shape}")
        if out.dtype != dtype:
            differs.append(f"dtype {out.dtype} where the message's is {dtype}")
        raise ValueError(f"out does not fit the array message: out has {' and '.join(differs)}")
    np.copyto(out, decode_array(buffer, copy=False), casting="no")
    return out
