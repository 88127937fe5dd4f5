"""Table messages from a hostile writer (shmbus/codecs/table_messages.py): a field typed as
pyarrow's pickled extension type never unpickles, a pyarrow that would is refused, and random or
mutated IPC streams give a clean ValueError or a table that reads within its memory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shmbus.codecs.table_messages import check_pyarrow_version, decode_table, serialize
from tests.support.messages import pickled_extension_table

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("validate", [False, True])
def test_a_pickled_extension_type_is_read_as_its_storage_and_never_unpickled(
        tmp_path: Path, validate: bool) -> None:
    marker = tmp_path / "pwned"
    message = pickled_extension_table(marker)
    table = decode_table(memoryview(message), copy=False, validate=validate)
    assert not marker.exists()
    assert table.schema.field("x").type == pa.binary()  # the storage type, no extension
    assert table.column("x").to_pylist() == [b"a", b"b"]


@pytest.mark.parametrize("version, ok", [
    ("13.0.0", False), ("14.0.0", False), ("0.17.1", False), ("14.0.1", True),
    ("14.0.2", True), ("15.0.0.dev12", True), ("26.0.1", True), ("not a version", False),
])
def test_a_pyarrow_older_than_the_cve_fix_is_refused(version: str, ok: bool) -> None:
    if ok:
        check_pyarrow_version(version)
        return
    with pytest.raises(ImportError, match="CVE-2023-47248") as refused:
        check_pyarrow_version(version)
    assert version in str(refused.value) and "pyarrow>=14.0.1" in str(refused.value)


def test_tables_refuse_to_run_on_an_old_pyarrow(monkeypatch: pytest.MonkeyPatch) -> None:
    message = serialize(pa.table({"i": [1, 2]}))
    monkeypatch.setattr(pa, "__version__", "14.0.0")
    with pytest.raises(ImportError, match="CVE-2023-47248"):
        decode_table(memoryview(message), copy=False)


# -- properties ---------------------------------------------------------------------------------

TABLES = [
    pa.table({"i": pa.array(range(20)), "s": pa.array([str(i) * (i % 4) for i in range(20)]),
              "l": pa.array([[i, None, i] for i in range(20)]),
              "d": pa.array(["x", "y"] * 10).dictionary_encode(),
              "f": pa.array([float(i) if i % 3 else None for i in range(20)])}),
    pa.table({"b": pa.array([b"\x00" * i for i in range(9)]),
              "st": pa.array([{"a": i, "b": str(i)} for i in range(9)])}),
]
MESSAGES = [serialize(table).to_pybytes() for table in TABLES]


def read_or_refuse(data: bytes) -> None:
    """decode_table validating gives a table whose every value reads, or ValueError."""
    try:
        table = decode_table(memoryview(data), copy=False, validate=True)
    except ValueError:
        return
    assert isinstance(table, pa.Table)
    for column in table.columns:  # every value, read: within the message's memory
        for chunk in column.chunks:
            read_every_value(chunk)


def read_every_value(array: pa.Array) -> None:
    """Every value of `array` as Python objects. A struct whose fields repeat a name is valid
    Arrow that pyarrow will not turn into dicts: its children are read instead."""
    try:
        array.to_pylist()
        return
    except ValueError as refused:
        if "duplicate field names" not in str(refused):
            raise
    array.is_valid().to_pylist()
    kind = array.type
    if pa.types.is_struct(kind) or pa.types.is_union(kind):
        for index in range(kind.num_fields):
            read_every_value(array.field(index))
    elif pa.types.is_dictionary(kind):
        array.indices.to_pylist()
        read_every_value(array.dictionary)
    else:  # lists, large lists, fixed-size lists and maps
        read_every_value(array.flatten())


@st.composite
def mutated_streams(draw: Any) -> bytes:
    data = bytearray(draw(st.sampled_from(MESSAGES)))
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["byte", "int32", "truncate", "splice"]))
        at = draw(st.integers(0, len(data) - 1))
        if kind == "byte":
            data[at] = draw(st.integers(0, 255))
        elif kind == "int32":
            value = draw(st.sampled_from([0, 1, -1, 2**31 - 1, -(2**31), 8, 1 << 20]))
            data[at:at + 4] = value.to_bytes(4, "little", signed=True)
        elif kind == "truncate":
            del data[at:]
        else:
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        if not data:
            break
    return bytes(data)


@given(mutated_streams())
@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_mutated_ipc_streams_give_a_valid_table_or_a_value_error(data: bytes) -> None:
    read_or_refuse(data)


@given(st.binary(max_size=600))
@settings(max_examples=500, deadline=None)
def test_random_bytes_give_a_value_error_or_a_valid_table(data: bytes) -> None:
    read_or_refuse(data)


def test_a_nested_field_name_that_is_not_utf8_is_refused_when_validating() -> None:
    """validate() leaves names unchecked, and reading the values decodes them."""
    table = pa.table({"s": pa.array([{"zq": 1}], pa.struct([("zq", pa.int64())]))})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    data = sink.getvalue().to_pybytes()
    assert data.count(b"zq") == 1
    with pytest.raises(ValueError, match="utf-8"):
        decode_table(memoryview(data.replace(b"zq", b"\x80q")), copy=False, validate=True)


def test_the_unmutated_streams_read_back_exactly() -> None:
    for table, message in zip(TABLES, MESSAGES, strict=True):
        assert decode_table(memoryview(message), copy=False, validate=True).equals(table)


def test_a_struct_with_a_repeated_field_name_is_a_valid_table_whose_values_read() -> None:
    """The shape a mutated stream once gave: pyarrow's to_pylist refuses it, the values read."""
    twice = pa.StructArray.from_arrays([pa.array([1, 2]), pa.array(["x", "y"])], names=["a", "a"])
    message = serialize(pa.table({"st": twice})).to_pybytes()
    with pytest.raises(ValueError, match="duplicate field names"):
        decode_table(memoryview(message), copy=False, validate=True).to_pylist()
    read_or_refuse(message)
