"""Spark pipeline jobs over a leveret broker (``leveret pipeline ...``).

- :func:`dlq_report`: dead letters of a DLQ (browsed, left in place) counted by
  original queue, reason, hour and chosen headers; Parquet, a table and a PNG chart.
- :func:`dlq_replay`: lease a DLQ's messages, republish those a Spark SQL filter selects
  to their original exchange and routing key (from x-death) through the confirming sink,
  with their x-death history, then acknowledge exactly those leases and release the rest.
- :func:`archive`: copy a stream to Parquet partitioned by date; incremental through a
  checkpoint (each run copies what arrived since the last).

Each takes a SparkSession; :func:`session` builds one (``local[*]`` unless a master is
given or the process runs under spark-submit).
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from typing import Any

from ..amqp.client import BlockingClient

__all__ = ["ReplayResult", "archive", "dlq_replay", "dlq_report", "session"]

_HEADER_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")


def session(master: str | None = None, app_name: str = "leveret-pipeline") -> Any:
    """A SparkSession with the ``leveret`` data source registered."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from . import register

    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    elif "PYSPARK_GATEWAY_PORT" not in os.environ:  # not under spark-submit
        builder = builder.master("local[*]")
    builder = builder.config("spark.ui.showConsoleProgress", "false")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    register(spark)
    return spark


def _origin_columns(df: Any) -> Any:
    """Adds original_queue, reason, original_exchange, original_routing_key and
    died_at, from x-first-death-* headers or the oldest x-death entry."""
    from pyspark.sql import functions as F

    oldest = F.element_at(F.col("deaths"), -1)
    return (
        df.withColumn("original_queue", F.coalesce(F.col("headers")["x-first-death-queue"], oldest["queue"]))
        .withColumn(
            "reason", F.coalesce(F.col("headers")["x-first-death-reason"], oldest["reason"], F.lit("unknown"))
        )
        .withColumn(
            "original_exchange",
            F.coalesce(F.col("headers")["x-first-death-exchange"], oldest["exchange"], F.lit("")),
        )
        .withColumn("original_routing_key", F.coalesce(F.element_at(oldest["routing_keys"], 1), F.lit("")))
        .withColumn("died_at", F.coalesce(F.element_at(F.col("deaths"), 1)["time"], F.col("timestamp")))
    )


def dlq_report(
    spark: Any,
    url: str,
    queue: str,
    output: str | None = None,
    headers: list[str] | tuple[str, ...] = (),
    chart: str | None = None,
    limit: int | None = None,
) -> Any:
    """Counts of the dead letters of ``queue`` by original queue, reason, hour (when they
    last died) and each header in ``headers``; a pandas DataFrame. Writes Parquet to
    ``output`` and a PNG chart (dead letters per hour by reason) to ``chart`` if given.
    The DLQ is browsed: its messages stay in place."""
    from pyspark.sql import functions as F

    for name in headers:
        if not _HEADER_NAME.match(name):
            raise ValueError(f"bad header name {name!r}")
    reader = spark.read.format("leveret").option("url", url).option("queue", queue)
    if limit is not None:
        reader = reader.option("limit", limit)
    letters = _origin_columns(reader.load())
    keys = [F.col("original_queue"), F.col("reason"), F.date_trunc("hour", F.col("died_at")).alias("hour")]
    keys += [F.col("headers")[h].alias(h) for h in headers]
    report = (
        letters.groupBy(*keys)
        .agg(
            F.count(F.lit(1)).alias("dead_letters"),
            F.sum(F.coalesce(F.element_at(F.col("deaths"), 1)["count"], F.lit(1))).alias("deaths"),
        )
        .orderBy("hour", "original_queue", "reason")
    )
    table = report.toPandas()
    if output:
        spark.createDataFrame(table, report.schema).coalesce(1).write.mode("overwrite").parquet(output)
    if chart:
        draw_chart(table, chart, title=f"dead letters of {queue} per hour, by reason")
    return table


def draw_chart(table: Any, path: str, title: str) -> None:
    """A stacked bar chart of dead letters per hour by reason (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 5))
    if len(table):
        pivot = table.pivot_table(
            index="hour", columns="reason", values="dead_letters", aggfunc="sum", fill_value=0
        ).sort_index()
        pivot.index = [str(h)[:16] for h in pivot.index]
        pivot.plot(kind="bar", stacked=True, ax=ax)
        ax.legend(title="reason")
    else:
        ax.text(0.5, 0.5, "no dead letters", ha="center", va="center")
    ax.set_title(title)
    ax.set_xlabel("hour (UTC)")
    ax.set_ylabel("dead letters")
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)


@dataclass
class ReplayResult:
    leased: int
    replayed: int
    released: int


def dlq_replay(
    spark: Any,
    url: str,
    queue: str,
    where: str | None = None,
    exchange: str | None = None,
    routing_key: str | None = None,
    max_messages: int = 100_000,
    group: str = "leveret-dlq-replay",
    lease_ttl_ms: int = 600_000,
) -> ReplayResult:
    """Republish the dead letters of ``queue`` that ``where`` (Spark SQL over the read
    schema plus original_queue, reason, original_exchange, original_routing_key,
    died_at) selects, to their original exchange and routing key (or ``exchange`` /
    ``routing_key``). A copy keeps the body, the headers (``x-death`` and
    ``x-first-death-*`` included, so a copy that dies again adds to that history),
    ``content_type`` and ``correlation_id``; it gets the headers ``x-replayed-from``
    (``queue``) and ``x-original-message-id`` (the dead letter's ``message_id``; a copy
    replayed again keeps the first). A dead letter is acknowledged only after its copy
    is confirmed; the others are released back to the DLQ. A crash leaves the leases to
    expire after ``lease_ttl_ms``, so nothing is lost."""
    from pyspark.sql import functions as F

    with BlockingClient(url) as client:
        if client.queue_exists(queue) is None:
            raise ValueError(f"no queue {queue!r} on the broker")
        lease = client.rpc(
            "lease.acquire", {"queue": queue, "group": group, "max": max_messages, "ttl_ms": lease_ttl_ms}
        )
    start, end = int(lease["start"]), int(lease["end"])
    if end <= start:
        return ReplayResult(0, 0, 0)
    try:
        letters = _origin_columns(
            spark.read.format("leveret")
            .option("url", url)
            .option("queue", queue)
            .option("group", group)
            .option("leaseFrom", start)
            .option("leaseTo", end)
            .load()
        ).cache()
        leased = {r.lease_seq for r in letters.select("lease_seq").collect()}
        selected = letters.where(where) if where else letters
        chosen = sorted(r.lease_seq for r in selected.select("lease_seq").collect())
        ours = ["x-replayed-from", "x-original-message-id"]  # set again on a re-replay
        headers = F.map_concat(
            F.map_filter(F.col("headers"), lambda k, v: ~k.isin(ours)),
            F.create_map(
                F.lit("x-replayed-from"),
                F.lit(queue),
                F.lit("x-original-message-id"),
                F.coalesce(F.col("headers")["x-original-message-id"], F.col("message_id"), F.lit("")),
            ),
        )
        props = F.map_filter(
            F.create_map(
                F.lit("content_type"), F.col("content_type"), F.lit("correlation_id"), F.col("correlation_id")
            ),
            lambda k, v: v.isNotNull(),
        )
        out = selected.where(F.col("lease_seq").isin(chosen) if chosen else F.lit(False)).select(
            F.col("body"),
            (F.lit(exchange) if exchange is not None else F.col("original_exchange")).alias("exchange"),
            (F.lit(routing_key) if routing_key is not None else F.col("original_routing_key")).alias(
                "routing_key"
            ),
            headers.alias("headers"),
            props.alias("properties"),
            F.col("deaths"),
        )
        if chosen:
            (
                out.write.format("leveret")
                .option("url", url)
                .option("jobId", f"dlq-replay-{queue}-{group}-{start}-{end}")
                .mode("append")
                .save()
            )
        with BlockingClient(url) as client:
            if chosen:
                client.rpc("lease.ack", {"queue": queue, "group": group, "seqs": chosen})
            rest = sorted(leased - set(chosen))
            if rest:  # not chosen by the filter: a plain return, not a failed delivery
                client.rpc("lease.release", {"queue": queue, "group": group, "seqs": rest, "failed": False})
        letters.unpersist()
    except BaseException:
        # give back what was not acknowledged now rather than after the TTL
        try:
            with BlockingClient(url) as client:
                info = client.rpc("lease.info", {"queue": queue, "group": group})
                if int(info.get("held", 0)):
                    client.rpc(
                        "lease.release", {"queue": queue, "group": group, "seqs": list(range(start, end))}
                    )
        except Exception:
            pass
        raise
    return ReplayResult(len(leased), len(chosen), len(leased) - len(chosen))


def archive(
    spark: Any,
    url: str,
    stream: str,
    output: str,
    checkpoint: str,
    starting_offset: str = "first",
    max_per_batch: int | None = None,
) -> int:
    """Copy the messages of ``stream`` added since the last run (from ``starting_offset``
    on the first run) to Parquet under ``output``, partitioned by ``date`` (UTC day of
    the message's timestamp, or of the archiving if it has none). Returns the number of
    messages copied. Exactly once through the checkpoint and Spark's file sink."""
    from pyspark.sql import functions as F

    reader = (
        spark.readStream.format("leveret")
        .option("url", url)
        .option("stream", stream)
        .option("startingOffset", starting_offset)
    )
    if max_per_batch:
        reader = reader.option("maxOffsetsPerTrigger", max_per_batch)
    df = reader.load().withColumn("date", F.to_date(F.coalesce(F.col("timestamp"), F.current_timestamp())))
    query = (
        df.writeStream.format("parquet")
        .option("path", output)
        .option("checkpointLocation", checkpoint)
        .partitionBy("date")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    if query.exception() is not None:  # pragma: no cover - awaitTermination raises
        raise query.exception()
    return sum(int(p.get("numInputRows", 0)) for p in query.recentProgress)
