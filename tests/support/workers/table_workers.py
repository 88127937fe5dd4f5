"""Spawn targets of test_table_messages.py, and the tables they send: random schemas (nested,
strings, dictionaries, nulls everywhere), small and large, all made from a seed so that the
reading process rebuilds what the writer sent."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import numpy as np
import pyarrow as pa

import shmbus
from tests.support.workers.large_workers import guard

#: rows of table_for(seed): small ones in the log, large ones (test bus: 8 KiB max message)
#: through a block
ROWS = [0, 1, 7, 150, 3_000, 40_000]


def _mask(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.random(n) < 0.2


def _strings(rng: np.random.Generator, n: int) -> list[str | None]:
    words = ["", "a", "zz", "héllo", "日本", "x" * 40]
    picks = rng.integers(0, len(words), n)
    nulls = _mask(rng, n)
    return [None if nulls[i] else words[picks[i]] + str(i) for i in range(n)]


def column(rng: np.random.Generator, kind: str, n: int) -> pa.Array:
    """A column of ``n`` values of ``kind``, about a fifth of them null."""
    if kind == "int64":
        return pa.array(rng.integers(-2**62, 2**62, n), mask=_mask(rng, n))
    if kind == "int8":
        return pa.array(rng.integers(-128, 127, n, dtype=np.int8), mask=_mask(rng, n))
    if kind == "float64":
        values = rng.standard_normal(n)
        values[rng.random(n) < 0.05] = np.nan
        return pa.array(values, mask=_mask(rng, n))
    if kind == "bool":
        return pa.array(rng.random(n) < 0.5, mask=_mask(rng, n))
    if kind == "string":
        return pa.array(_strings(rng, n), pa.string())
    if kind == "large_string":
        return pa.array(_strings(rng, n), pa.large_string())
    if kind == "binary":
        nulls = _mask(rng, n)
        return pa.array([None if nulls[i] else bytes(rng.integers(0, 256, i % 9, np.uint8))
                         for i in range(n)], pa.binary())
    if kind == "timestamp":
        return pa.array(rng.integers(0, 2**50, n), mask=_mask(rng, n)).cast(
            pa.timestamp("us", tz="UTC"))
    if kind == "list":
        nulls = _mask(rng, n)
        return pa.array([None if nulls[i] else [int(v) for v in rng.integers(0, 99, i % 4)]
                         for i in range(n)], pa.list_(pa.int32()))
    if kind == "struct":
        return pa.StructArray.from_arrays(
            [column(rng, "int8", n), column(rng, "string", n)], ["x", "y"],
            mask=pa.array(_mask(rng, n)))
    if kind == "list_of_struct":
        inner = pa.StructArray.from_arrays([column(rng, "float64", 3 * n)], ["v"])
        offsets = pa.array(np.arange(0, 3 * n + 1, 3, dtype=np.int32))
        return pa.ListArray.from_arrays(offsets, inner)
    if kind == "dictionary":
        indices = pa.array(rng.integers(0, 4, n, dtype=np.int32), mask=_mask(rng, n))
        return pa.DictionaryArray.from_arrays(indices, pa.array(["red", "green", "blue", ""]))
    if kind == "map":
        nulls = _mask(rng, n)
        return pa.array([None if nulls[i] else [(f"k{j}", int(j * i)) for j in range(i % 3)]
                         for i in range(n)], pa.map_(pa.string(), pa.int64()))
    if kind == "fixed_binary":
        return pa.array([bytes([i % 256] * 3) for i in range(n)], pa.binary(3))
    if kind == "null":
        return pa.nulls(n)
    raise ValueError(kind)


KINDS = ["int64", "int8", "float64", "bool", "string", "large_string", "binary", "timestamp",
         "list", "struct", "list_of_struct", "dictionary", "map", "fixed_binary", "null"]


def table_for(seed: int) -> pa.Table | pa.RecordBatch:
    """The seed-th table: 1 to 6 columns of random kinds, ROWS[seed % len(ROWS)] rows; odd
    seeds as a RecordBatch, every third table in two chunks."""
    rng = np.random.default_rng(seed)
    n = ROWS[seed % len(ROWS)]
    kinds = rng.choice(KINDS, rng.integers(1, 7))
    columns = [column(rng, str(kind), n) for kind in kinds]
    names = [f"{kind}_{i}" for i, kind in enumerate(kinds)]
    batch = pa.RecordBatch.from_arrays(columns, names=names)
    if seed % 2:
        return batch
    if seed % 3 == 0 and n > 1:
        return pa.Table.from_batches([batch.slice(0, n // 2), batch.slice(n // 2)])
    return pa.Table.from_batches([batch])


def as_table(data: pa.Table | pa.RecordBatch) -> pa.Table:
    return data if isinstance(data, pa.Table) else pa.Table.from_batches([data])


def _same_value(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (a != a and b != b)  # NaN is NaN
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(map(_same_value, a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_value(a[k], b[k]) for k in a)
    return bool(type(a) is type(b) and a == b)


def same_table(got: pa.Table, expected: pa.Table) -> None:
    """Same schema, same values (NaN equal to NaN, which Table.equals does not count)."""
    assert got.schema.equals(expected.schema), f"{got.schema} != {expected.schema}"
    got.validate(full=True)
    if not got.equals(expected):
        for name in expected.column_names:
            assert _same_value(got.column(name).to_pylist(),
                               expected.column(name).to_pylist()), f"column {name} differs"


def table_writer(context: shmbus.Context, stream: int, seeds: list[int], use_async: bool,
                 results: Any) -> None:
    """Publish table_for(seed) for each seed with publish_table (or publish_table_async), then
    wait until no subscriber is left."""
    def body() -> None:
        with shmbus.connect(context) as bus:
            pub = bus.add_exclusive_publication("aeron:ipc", stream)
            deadline = time.monotonic() + 20
            while not pub.is_connected:
                assert time.monotonic() < deadline, "no subscriber"
                time.sleep(0.005)
            large = 0
            for seed in seeds:
                data = table_for(seed)
                if use_async:
                    asyncio.run(pub.publish_table_async(data, timeout=30.0))
                else:
                    pub.publish_table(data, timeout=30.0)
                large += int(_longer(data, pub))
            results.put({"kind": "sent", "name": "table writer", "count": len(seeds),
                         "large": large})
            # stay until the readers are done: a closed publication's log goes after its
            # linger timeout, read or not
            deadline = time.monotonic() + 120
            while pub.is_connected and time.monotonic() < deadline:
                time.sleep(0.05)
    guard(results, "sent", "table writer", body)


def _longer(data: Any, pub: Any) -> bool:
    from shmbus.codecs.table_messages import stream_length
    return stream_length(data) > pub.max_message_length


def table_reader(context: shmbus.Context, stream: int, seeds: list[int], mode: str,
                 results: Any) -> None:
    """Read len(seeds) tables (``mode``: "views", "copy" or "async") and check each equals
    table_for(seed), schema and values, in order; report how many were zero-copy views."""
    name = f"table reader {mode}"

    def check(i: int, table: pa.Table) -> None:
        try:
            same_table(table, as_table(table_for(seeds[i])))
        except AssertionError as e:
            raise AssertionError(f"seed {seeds[i]}: {e}") from None

    def body() -> None:
        with shmbus.connect(context) as bus:
            sub = bus.add_subscription("aeron:ipc", stream)
            results.put({"kind": "ready", "name": name, "pid": os.getpid()})
            got = 0
            if mode == "async":
                async def run() -> int:
                    n = 0
                    async for table in sub.tables_async(timeout=60):
                        check(n, table)
                        n += 1
                        if n == len(seeds):
                            break
                    return n
                got = asyncio.run(run())
            else:
                for table in sub.tables(timeout=60, copy=mode == "copy"):
                    check(got, table)
                    got += 1
                    if got == len(seeds):
                        break
            results.put({"kind": "read", "name": name, "count": got})
    guard(results, "read", name, body)
