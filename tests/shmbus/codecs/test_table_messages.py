"""Arrow tables as messages (``publish_table``/``tables()``, shmbus/codecs/table_messages.py):
random schemas round-trip exactly across real processes, small ones in the log and large ones
written in place into a block and read as views of it."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

import shmbus
from shmbus.codecs.table_messages import decode_table, stream_length
from tests.support.drivers import start_driver, stop_driver
from tests.support.waits import wait_until
from tests.support.workers import table_workers as tw

pytestmark = pytest.mark.timeout(300)

SEEDS = list(range(36))


@pytest.mark.parametrize("use_async", [False, True])
def test_random_schemas_round_trip_across_processes(bus_context, driver, procs, use_async):
    for mode in ("views", "copy", "async"):
        procs.start(tw.table_reader, bus_context, 32, SEEDS, mode, procs.queue)
    procs.wait("ready", 3)
    procs.start(tw.table_writer, bus_context, 32, SEEDS, use_async, procs.queue)
    sent = procs.wait("sent", timeout=120)[0]
    assert 0 < sent["large"] < len(SEEDS), "both paths taken"
    for report in procs.wait("read", 3, timeout=120):
        assert report["count"] == len(SEEDS), report


def test_a_large_table_s_buffers_are_views_of_the_block(stream):
    pub, sub = stream
    n = 1_000_000
    table = pa.table({"i": np.arange(n), "s": pa.array([str(i) for i in range(n)])})
    assert stream_length(table) > pub.max_message_length
    pub.publish_table(table, timeout=5)
    view = sub.take_view()
    assert view is not None and view.zero_copy
    block = np.frombuffer(view.buffer, np.uint8)
    start, end = block.ctypes.data, block.ctypes.data + block.nbytes
    got = decode_table(view.buffer, copy=False)
    assert got.equals(table)
    for chunked in got.columns:
        for chunk in chunked.chunks:
            for buffer in chunk.buffers():
                if buffer is not None and buffer.size:
                    assert start <= buffer.address and buffer.address + buffer.size <= end
    copied = decode_table(view.buffer, copy=True)
    address = copied.column("i").chunks[0].buffers()[1].address
    assert not start <= address < end, "copy=True: a private copy"
    del got, block
    view.release()
    assert copied.equals(table)


def test_tables_refuses_other_messages_and_publish_table_other_types(stream):
    pub, sub = stream
    pub.publish(b"not arrow")
    with pytest.raises(ValueError, match="not an Arrow IPC stream.*publish_table"):
        next(sub.tables(timeout=1))
    with pytest.raises(TypeError, match="pyarrow.Table or pyarrow.RecordBatch, not dict"):
        pub.publish_table({"a": [1]})
    pub.publish_table(pa.table({"a": [1]}))
    assert next(sub.tables(timeout=1)).equals(pa.table({"a": [1]}))


def test_a_table_past_the_limit_names_the_setting(bus_context):
    context = bus_context.with_(max_large_message_length=1 << 20)
    driver = start_driver(context)
    try:
        with shmbus.connect(context) as bus:
            pub = bus.add_publication("aeron:ipc", 33)
            bus.add_subscription("aeron:ipc", 33)
            wait_until(lambda: pub.is_connected, 10, "the subscriber")
            table = pa.table({"x": np.zeros(1 << 20)})  # 8 MiB
            limit = pub._block_ring(1 << 23).max_message_length
            assert stream_length(table) > limit
            with pytest.raises(ValueError, match=r"Context\.max_large_message_length"):
                pub.publish_table(table)
            with pytest.raises(ValueError, match=r"Context\.max_large_message_length"):
                asyncio.run(pub.publish_table_async(table))
            pub.publish_table(table.slice(0, 100_000))
    finally:
        stop_driver(driver)


def test_without_pyarrow_the_error_names_it(tmp_path):
    """In a process where pyarrow cannot be imported, both calls raise an ImportError naming
    it (the rest of shmbus imports without it)."""
    script = tmp_path / "no_arrow.py"
    script.write_text(
        "import sys\n"
        "sys.modules['pyarrow'] = None\n"
        "import shmbus\n"
        "from shmbus.codecs.table_messages import decode_table, require_pyarrow\n"
        "for call in (require_pyarrow, lambda: decode_table(memoryview(b'x'), False)):\n"
        "    try:\n"
        "        call()\n"
        "    except ImportError as e:\n"
        "        assert 'pip install pyarrow' in str(e), e\n"
        "    else:\n"
        "        raise SystemExit('no ImportError')\n"
        "print('ok')\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
