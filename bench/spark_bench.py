"""Throughput of the leveret Spark connector against a "ceiling": a trivial Python data
source (pyspark.sql.datasource) that makes the same rows inside Spark, with the same
number of partitions, so the ratio shows what talking to the broker costs.

    python bench/spark_bench.py                      # 200,000 rows of 100 B
    python bench/spark_bench.py --rows 50000 --body-size 1000 --master local[2]

(a) batch read of a stream into a Spark aggregation, (b) streaming read of a queue
through leases (trigger availableNow) into the noop sink, (c) the sink publishing the
rows (with publisher confirms) to a queue, as persistent and as transient messages.
The broker is a ``leveret server``
subprocess; its CPU time (from /proc/PID/stat) is reported per row. Each case runs
once after a small warm-up of the same kind; the table goes to stdout, progress to
stderr.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def log(*args: object) -> None:
    print(*args, file=sys.stderr, flush=True)


# -- the broker ---------------------------------------------------------------------

class Server:
    def __init__(self, data_dir: Path) -> None:
        # The child keeps its own copy of the descriptor: ours is closed at once.
        with open(data_dir.parent / "server.log", "a") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "leveret", "server", "--amqp-port", "0", "--stomp-port", "0",
                 "--mqtt-port", "0", "--web-mqtt-port", "0",
                 "--web-stomp-port", "0", "--prometheus-port", "0", "--data-dir", str(data_dir),
                 "--log-level", "warning"],
                stdout=subprocess.PIPE, stderr=log, text=True)
        line = self.proc.stdout.readline()
        match = re.match(r"leveret ready: amqp://([\d.]+):(\d+)", line)
        if not match:
            self.proc.kill()
            raise SystemExit(f"leveret server did not start: {line!r}")
        self.url = f"amqp://guest:guest@{match.group(1)}:{match.group(2)}/%2F"

    def cpu(self) -> float:
        """User + system CPU seconds of the broker process so far."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def fill(url: str, queue: str, rows: int, body_size: int, stream: bool) -> None:
    from pamqp.commands import Basic

    from leveret.amqp.client import BlockingClient as Client

    with Client(url, timeout=60) as client:
        args = {"x-queue-type": "stream"} if stream else None
        client.queue_declare(queue, durable=True, arguments=args)
        client.confirm_select()
        props = Basic.Properties(delivery_mode=2, content_type="application/octet-stream")
        for i in range(rows):
            body = f"{i:012d}".encode().ljust(body_size, b".")
            client.publish("", queue, body, props)
            if client.unconfirmed >= 5000:
                client.wait_confirms(2500)
        client.wait_confirms(0, timeout=300)


# -- the ceiling: the same rows made inside Spark ---------------------------------

def ceiling_source():
    """A DataSource class ``benchgen``: options rows, partitions, bodySize, arrow; rows in
    the leveret read schema, as tuples or (arrow=true) as the connector hands them to
    Spark: Arrow record batches. Its writer drops what it gets (Rows, or Arrow batches
    with arrow=true, as the connector's sink takes them)."""
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceArrowWriter,
        DataSourceReader,
        DataSourceStreamReader,
        DataSourceWriter,
        InputPartition,
        WriterCommitMessage,
    )

    from leveret.spark import READ_SCHEMA
    from leveret.spark.rows import record_batches

    class Range(InputPartition):
        def __init__(self, start: int, end: int) -> None:
            self.start, self.end = start, end

    def make(start: int, end: int, size: int, arrow: bool) -> Iterator:
        import datetime as dt

        stamp = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
        rows = ((f"{i:012d}".encode().ljust(size, b"."), "", "bench", {}, None, None,
                 "application/octet-stream", stamp, 2, None, False, 0, i, None, [])
                for i in range(start, end))
        return record_batches(rows) if arrow else rows

    def split(rows: int, parts: int) -> list[Range]:
        step = -(-rows // parts)
        return [Range(s, min(rows, s + step)) for s in range(0, rows, step)]

    class Reader(DataSourceReader):
        def __init__(self, options: dict) -> None:
            self.rows = int(options["rows"])
            self.parts = int(options["partitions"])
            self.size = int(options["bodySize"])
            self.arrow = options.get("arrow", "false") == "true"

        def partitions(self):
            return split(self.rows, self.parts)

        def read(self, partition):
            return make(partition.start, partition.end, self.size, self.arrow)

    class StreamReader(DataSourceStreamReader):
        def __init__(self, options: dict) -> None:
            self.rows = int(options["rows"])
            self.parts = int(options["partitions"])
            self.size = int(options["bodySize"])
            self.arrow = options.get("arrow", "false") == "true"

        def initialOffset(self):
            return {"i": 0}

        def latestOffset(self):
            return {"i": self.rows}

        def partitions(self, start, end):
            return [Range(r.start + start["i"], r.end + start["i"])
                    for r in split(end["i"] - start["i"], self.parts)] \
                if end["i"] > start["i"] else []

        def read(self, partition):
            return make(partition.start, partition.end, self.size, self.arrow)

    class Done(WriterCommitMessage):
        pass

    class Writer(DataSourceWriter):
        def write(self, iterator):
            for row in iterator:
                row[0]
            return Done()

    class ArrowWriter(DataSourceArrowWriter):
        def write(self, iterator):
            for batch in iterator:
                batch.column(0).to_pylist()
            return Done()

    class BenchGen(DataSource):
        @classmethod
        def name(cls):
            return "benchgen"

        def schema(self):
            return READ_SCHEMA

        def reader(self, schema):
            return Reader(self.options)

        def streamReader(self, schema):
            return StreamReader(self.options)

        def writer(self, schema, overwrite):
            return ArrowWriter() if self.options.get("arrow") == "true" else Writer()

    return BenchGen


# -- the cases ----------------------------------------------------------------------

def timed(server: Server, fn) -> tuple[float, float]:
    cpu, start = server.cpu(), time.perf_counter()
    fn()
    return time.perf_counter() - start, server.cpu() - cpu


def aggregate(df) -> None:
    from pyspark.sql import functions as F

    df.groupBy((F.col("offset") % 10).alias("k")).agg(F.count("*"), F.sum(F.length("body"))) \
        .collect()


def run(args: argparse.Namespace) -> list[tuple]:
    """[(case, rows, seconds, ceiling seconds (tuples/Rows), ceiling seconds (Arrow),
    broker CPU seconds)]"""
    from pyspark.sql import SparkSession

    from leveret.spark import register

    work = Path(tempfile.mkdtemp(prefix="leveret-spark-bench-"))
    server = Server(work / "data")
    spark = (SparkSession.builder.master(args.master).appName("leveret-spark-bench")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.memory", "2g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    spark.dataSource.register(ceiling_source())
    url, n, size, parts = server.url, args.rows, args.body_size, args.partitions
    part_size = -(-n // parts)

    def gen(arrow: bool, rows: int = n):
        # a new reader each time: DataFrameReader.option() mutates the reader it is called on
        return (spark.read.format("benchgen").option("rows", rows).option("partitions", parts)
                .option("bodySize", size).option("arrow", str(arrow).lower()).load())

    def ceilings(fn) -> tuple[float, float]:
        """Seconds of ``fn(arrow)`` for the tuple/Row and the Arrow ceiling."""
        return timed(server, lambda: fn(False))[0], timed(server, lambda: fn(True))[0]

    results = []
    try:
        log(f"filling the stream and the queue with {n:,} messages of {size} B ...")
        fill(url, "bench.stream", n, size, stream=True)
        fill(url, "bench.warm", 2000, size, stream=False)

        # warm-up: Python workers, the data source, a query of each kind
        aggregate(spark.read.format("leveret").option("url", url).option("stream", "bench.stream")
                  .option("limit", 2000).load())
        aggregate(gen(False, 2000))
        aggregate(gen(True, 2000))

        log("(a) batch read of a stream -> aggregation")
        read = (spark.read.format("leveret").option("url", url).option("stream", "bench.stream")
                .option("partitionSize", part_size).option("prefetch", args.prefetch))
        t, cpu = timed(server, lambda: aggregate(read.load()))
        results.append(("(a) stream batch read -> count/sum", n, t,
                        *ceilings(lambda arrow: aggregate(gen(arrow))), cpu))

        log("(b) streaming read of a queue via leases (availableNow) -> noop")
        fill(url, "bench.queue", n, size, stream=False)

        def noop(df, checkpoint: str) -> None:
            (df.writeStream.format("noop").option("checkpointLocation", str(work / checkpoint))
             .trigger(availableNow=True).start().awaitTermination())

        t, cpu = timed(server, lambda: noop(
            spark.readStream.format("leveret").option("url", url).option("queue", "bench.queue")
            .option("group", "bench").option("maxMessagesPerTrigger", n)
            .option("partitionSize", part_size).load(), "ck-queue"))
        results.append(("(b) queue stream via leases -> noop", n, t, *ceilings(lambda arrow: noop(
            spark.readStream.format("benchgen").option("rows", n).option("partitions", parts)
            .option("bodySize", size).option("arrow", str(arrow).lower()).load(),
            f"ck-gen-{arrow}")), cpu))

        log("(c) the sink: publish with confirms")
        from leveret.amqp.client import BlockingClient as Client

        rows = gen(False).select("body").cache()
        rows.count()

        def sink(queue: str, persistent: str, count: int | None = None) -> None:
            df = rows if count is None else rows.limit(count)
            (df.write.format("leveret").option("url", url).option("routingKey", queue)
             .option("persistent", persistent).mode("append").save())

        def drop(arrow: bool) -> None:
            rows.write.format("benchgen").option("arrow", str(arrow).lower()).mode("append") \
                .save()

        with Client(url) as client:
            for queue in ("bench.out", "bench.out.transient", "bench.warm.out"):
                client.queue_declare(queue, durable=True)
        sink("bench.warm.out", "true", 2000)  # warm-up: the writers' workers
        rows.limit(2000).write.format("benchgen").mode("append").save()
        drop_times = ceilings(drop)
        for queue, persistent, name in (("bench.out", "true", "persistent"),
                                        ("bench.out.transient", "false", "transient")):
            t, cpu = timed(server, lambda queue=queue, persistent=persistent: sink(queue, persistent))
            with Client(url) as client:
                published = client.queue_exists(queue).message_count
            if published != n:
                log(f"warning: {queue} has {published:,} messages, expected {n:,}")
            results.append((f"(c) sink -> queue, {name}, confirmed", n, t, *drop_times, cpu))
    finally:
        spark.stop()
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    return results


def show(results: list[tuple], args: argparse.Namespace) -> None:
    title = (f"leveret Spark connector: {args.rows:,} rows of {args.body_size} B, "
             f"{args.partitions} partitions, {args.master}, {os.cpu_count()} CPU(s)")
    header = ["case", "rows/s", "ceiling rows/s (tuples)", "of ceiling",
              "ceiling rows/s (Arrow)", "of Arrow ceiling", "seconds", "broker CPU µs/row"]
    lines = [[name, f"{n / t:,.0f}", f"{n / t0:,.0f}", f"{t0 / t:.0%}", f"{n / ta:,.0f}",
              f"{ta / t:.0%}", f"{t:.1f}", f"{cpu / n * 1e6:.1f}"]
             for name, n, t, t0, ta, cpu in results]
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # pragma: no cover
        print(title)
        for line in [header, *lines]:
            print(" | ".join(line))
        return
    table = Table(*header, title=title)
    for line in lines:
        table.add_row(*line)
    Console(width=160).print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--body-size", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--prefetch", type=int, default=1000)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args(argv)
    show(run(args), args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
