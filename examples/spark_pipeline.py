"""A bus -> Spark -> bus pipeline: per-symbol tick aggregates over one-second windows.

    .venv/bin/python examples/spark_pipeline.py [--seconds 30] [--workers 2]

* ``--workers`` processes publish ticks on stream 1001: numpy records (time, symbol, quantity,
  price), a batch of records per ``offer_many``;
* a recorder process records stream 1001 into a recording directory (``--recordings``, by
  default a temporary one in /dev/shm);
* a Spark structured streaming query reads the recording (``format("shmbus")``, which decodes
  the tick records into columns with option ``record_dtype``), computes per-symbol 1-second
  windows (trades, volume, VWAP, low, high) with a 2-second watermark and publishes each
  finished window as JSON on stream 1002 (``writeStream.format("shmbus")``);
* a subscriber process prints the windows as they arrive, dropping replays with
  ``shmbus.spark.ReplayFilter``.

On a cluster (``--master spark://...``), put ``--recordings`` on storage every executor reads
and give ``--results-channel`` a UDP channel that reaches the subscriber's host (the writers
run on the executors' hosts, each with its own bus); docs/guides/recordings-and-spark.md says
more.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import shmbus  # noqa: E402

TICKS_STREAM = 1001
RESULTS_STREAM = 1002
SYMBOLS = ["AAPL", "AMZN", "GOOG", "META", "MSFT", "NVDA"]
#: a tick: time in ns since the epoch (int64: offer_many cannot take datetime64 fields),
#: symbol index, quantity, price
TICK = np.dtype([("time", "<i8"), ("symbol", "<i4"), ("quantity", "<i4"), ("price", "<f8")])
#: the same record for the shmbus source's record_dtype option (time read as a timestamp)
RECORD_DTYPE = "time:M8[ns],symbol:i4,quantity:i4,price:f8"


# -- bus processes ------------------------------------------------------------------------------


def tick_worker(context: shmbus.Context, index: int, rate: float, stop) -> None:
    """Publish about ``rate`` ticks/s as batches of numpy records until ``stop`` is set."""
    rng = np.random.default_rng(index)
    base = 100.0 + 50 * np.random.default_rng(0).random(len(SYMBOLS))  # the same in every worker
    phase = np.arange(len(SYMBOLS))
    with shmbus.connect(context) as bus:
        publication = bus.add_publication("aeron:ipc", TICKS_STREAM)
        batch = 100
        while not stop.is_set():
            ticks = np.empty(batch, TICK)
            ticks["time"] = time.time_ns()
            ticks["symbol"] = rng.integers(0, len(SYMBOLS), batch)
            ticks["quantity"] = rng.integers(1, 500, batch)
            prices = base * (1 + 0.02 * np.sin(time.time() / 7 + phase))
            ticks["price"] = prices[ticks["symbol"]] * (1 + rng.normal(0, 0.0002, batch))
            try:
                publication.publish_many(ticks, timeout=5.0)
            except shmbus.PublicationError:
                if stop.is_set():
                    break
                raise
            time.sleep(batch / rate)


def recorder_process(context: shmbus.Context, directory: str, stop) -> None:
    with shmbus.connect(context) as bus, \
            bus.add_recorder(directory, "aeron:ipc", TICKS_STREAM) as recorder:
        recorder.run(stop=stop)


def printer(context: shmbus.Context, channel: str, stop) -> None:
    """Print every window once (replays from task retries are dropped)."""
    from shmbus.spark import ReplayFilter

    first_time = ReplayFilter()
    with shmbus.connect(context) as bus:
        subscription = bus.add_subscription(channel, RESULTS_STREAM)

        def show(buffer, header) -> None:
            if not first_time(header.reserved_value):
                return
            w = json.loads(bytes(buffer))
            print(f"{w['start'][11:19]}-{w['end'][11:19]} {w['symbol']:<5} "
                  f"trades {w['trades']:>5}  volume {w['volume']:>8}  vwap {w['vwap']:9.3f}  "
                  f"low {w['low']:9.3f}  high {w['high']:9.3f}", flush=True)

        assembler = shmbus.FragmentAssembler(show)
        idle = shmbus.idle_strategies.BackoffIdleStrategy()
        while not stop.is_set():
            idle.idle(subscription.poll(assembler, 100))


# -- the Spark job ------------------------------------------------------------------------------


def start_query(spark, recordings: str, context: shmbus.Context, channel: str,
                checkpoint: str):
    from pyspark.sql import functions as F

    import shmbus.spark

    shmbus.spark.register(spark)
    # the source decodes the tick records into columns itself (numpy, no loop per row)
    symbols = F.array(*[F.lit(s) for s in SYMBOLS])
    ticks = (spark.readStream.format("shmbus").option("path", recordings)
             .option("stream_id", TICKS_STREAM).option("maxBytesPerTrigger", 64 << 20)
             .option("record_dtype", RECORD_DTYPE).load()
             .select("time", F.element_at(symbols, F.col("symbol") + 1).alias("symbol"),
                     "quantity", "price"))
    windows = (ticks.withWatermark("time", "2 seconds")
               .groupBy(F.window("time", "1 second"), "symbol")
               .agg(F.count("*").alias("trades"), F.sum("quantity").alias("volume"),
                    (F.sum(F.col("price") * F.col("quantity")) / F.sum("quantity")).alias("vwap"),
                    F.min("price").alias("low"), F.max("price").alias("high")))
    results = windows.select(F.to_json(F.struct(
        F.date_format("window.start", "yyyy-MM-dd HH:mm:ss").alias("start"),
        F.date_format("window.end", "yyyy-MM-dd HH:mm:ss").alias("end"),
        "symbol", "trades", "volume", "vwap", "low", "high")).cast("binary").alias("payload"))
    return (results.writeStream.format("shmbus")
            .option("context", shmbus.spark.context_option(context))
            .option("channel", channel).option("stream_id", RESULTS_STREAM)
            .option("checkpointLocation", checkpoint).outputMode("append")
            .trigger(processingTime="1 second").start())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="how long to run")
    parser.add_argument("--workers", type=int, default=2, help="tick publisher processes")
    parser.add_argument("--rate", type=float, default=20_000, help="ticks/s per worker")
    parser.add_argument("--recordings", help="recording directory (default: a temporary one; "
                        "on a cluster: shared storage)")
    parser.add_argument("--checkpoint", help="checkpoint directory (default: temporary)")
    parser.add_argument("--master", default="local[2]", help="Spark master")
    parser.add_argument("--results-channel", default="aeron:ipc",
                        help="channel of the results stream (a UDP channel on a cluster)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="shmbus-pipeline-", dir="/dev/shm"))
    recordings = args.recordings or str(work / "recordings")
    checkpoint = args.checkpoint or str(work / "checkpoint")
    context = shmbus.Context.resolve(dir=str(work / "bus"), driver_idle_timeout=2.0)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spawn = mp.get_context("spawn")
    stop_bus = spawn.Event()
    stop_printer = spawn.Event()
    processes = []
    bus = shmbus.connect(context)  # keeps the embedded driver up for the whole run
    try:
        processes.append(spawn.Process(target=recorder_process,
                                       args=(context, recordings, stop_bus)))
        processes.append(spawn.Process(target=printer, args=(context, args.results_channel,
                                                             stop_printer)))
        for process in processes:
            process.start()
        time.sleep(1.0)  # the recorder subscribes before the ticks start
        for index in range(args.workers):
            worker = spawn.Process(target=tick_worker,
                                   args=(context, index, args.rate, stop_bus))
            worker.start()
            processes.append(worker)

        from pyspark.sql import SparkSession

        spark = (SparkSession.builder.master(args.master).appName("shmbus-pipeline")
                 .config("spark.driver.host", "127.0.0.1")
                 .config("spark.driver.bindAddress", "127.0.0.1")
                 .config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false")
                 .config("spark.sql.shuffle.partitions", "2")
                 .config("spark.sql.session.timeZone", "UTC")
                 .getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        query = start_query(spark, recordings, context, args.results_channel, checkpoint)
        print(f"ticks: {args.workers} workers on stream {TICKS_STREAM}, recorded into "
              f"{recordings}; windows on stream {RESULTS_STREAM}", flush=True)
        try:
            query.awaitTermination(args.seconds)
        except KeyboardInterrupt:
            pass
        stop_bus.set()  # ticks stop; the query finishes the windows the watermark closes
        time.sleep(4.0)
        query.stop()
        spark.stop()
        time.sleep(1.0)  # the last windows reach the printer
    finally:
        stop_bus.set()
        stop_printer.set()
        for process in processes:
            process.join(10)
            if process.is_alive():
                process.terminate()
        bus.close()
        if args.recordings is None and args.checkpoint is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
