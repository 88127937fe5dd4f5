"""numpy arrays as messages: a header with dtype, shape and order, then the array's bytes.

The header says what numpy's ``.npy`` header says (``descr``, ``fortran_order``, ``shape``:
structured, datetime and every other non-object dtype), after a 12-byte prefix (magic
``SBAR``, version, header length), padded so the data starts 64-byte aligned. Pure functions:
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


def array_header(shape: tuple[int, ...], dtype: np.dtype[Any], fortran_order: bool) -> bytes:
    """The header of an array message (its length a multiple of 64)."""
    if dtype.hasobject:
        raise ValueError(f"an array of dtype {dtype} holds Python objects: publish it with "
                         f"publish_object")
    return _header(tuple(int(n) for n in shape), dtype, fortran_order)


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
    return int(length)


@functools.lru_cache(maxsize=256)
def _fields(text: bytes) -> tuple[np.dtype[Any], tuple[int, ...], bool]:
    """(dtype, shape, Fortran order) of a header's text (parsed once per distinct header: a
    stream of like arrays pays it once)."""
    try:
        fields = ast.literal_eval(text.decode("utf-8").strip())
        dtype = np.lib.format.descr_to_dtype(fields["descr"])
        shape = tuple(int(n) for n in fields["shape"])
        return dtype, shape, bool(fields["fortran_order"])
    except (ValueError, SyntaxError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise ValueError(f"corrupt array message header: {e}") from None


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
        empty: np.ndarray[Any, Any] = np.empty(shape, dtype, order="F" if fortran else "C")
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
