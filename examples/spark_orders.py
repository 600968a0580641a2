"""An order pipeline on leveret and Spark, end to end.

1. A shop publishes orders (JSON) to the stream ``orders``.
2. A Spark streaming job reads the stream with ``format("leveret")``, enriches each order
   (``total`` = quantity × price, ``region`` from a country lookup) and publishes it
   through the leveret sink to the topic exchange ``orders.enriched`` with routing key
   ``order.<region>``. The job keeps a checkpoint, and the queue it feeds deduplicates
   on the sink's deterministic message ids, so a rerun of a batch is not delivered twice.
3. The fulfilment service consumes ``orders.fulfil`` and rejects invalid orders
   (quantity <= 0) with requeue. The queue's ActiveMQ-style redelivery policy retries
   them with exponential back-off (100, 200, 400 ms), and after 3 redeliveries the
   ``individual`` strategy moves them to ``DLQ.orders.fulfil``.
4. ``dlq_report`` counts the dead letters by original queue, reason, hour and region
   (a table, Parquet and a PNG chart); ``dlq_replay`` moves them to ``orders.review``,
   where someone fixes them, and each dead letter is acknowledged only once its copy is
   confirmed.

Run it::

    pip install -e '.[spark]'
    python examples/spark_orders.py                  # an embedded broker, data in a temp dir
    python examples/spark_orders.py --orders 2000 --out ./orders-out
    python examples/spark_orders.py --url amqp://guest:guest@127.0.0.1:5672/%2F

With ``--url`` it uses a running ``leveret server``; afterwards
``leveret dlq show DLQ.orders.fulfil`` and ``leveret pipeline dlq-report
DLQ.orders.fulfil --header region`` work on what it left. :func:`run` is the same
pipeline for a SparkSession you already have (the test suite calls it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pika

STREAM = "orders"
EXCHANGE = "orders.enriched"
QUEUE = "orders.fulfil"
DLQ = f"DLQ.{QUEUE}"
REVIEW = "orders.review"
RETRY_POLICY = {  # ActiveMQ's redelivery policy, as queue arguments
    "x-max-redeliveries": 3,
    "x-redelivery-delay": 100,             # ms before the first redelivery
    "x-redelivery-exponential": True,
    "x-redelivery-backoff-multiplier": 2,  # 100, 200, 400 ms
    "x-dead-letter-strategy": "individual",  # -> DLQ.orders.fulfil
    "x-message-deduplication": True,       # Spark reruns of a batch are dropped
}
REGIONS = {"DE": "emea", "FR": "emea", "GB": "emea", "US": "amer", "BR": "amer",
           "JP": "apac", "AU": "apac"}
SKUS = {"tea": 4.5, "cup": 7.25, "pot": 31.0, "spoon": 2.1}


def order(i: int) -> dict:
    """Order ``i``: deterministic; every 10th has a negative quantity (invalid)."""
    countries = sorted(REGIONS)
    sku = sorted(SKUS)[i % len(SKUS)]
    return {"order_id": f"o-{i:05d}", "customer": f"c-{i % 37}",
            "country": countries[i % len(countries)], "sku": sku,
            "quantity": -1 if i % 10 == 7 else 1 + i % 5, "price": SKUS[sku]}


def declare(channel) -> None:
    channel.queue_declare(STREAM, durable=True, arguments={"x-queue-type": "stream"})
    channel.exchange_declare(EXCHANGE, "topic", durable=True)
    channel.queue_declare(QUEUE, durable=True, arguments=RETRY_POLICY)
    channel.queue_bind(QUEUE, EXCHANGE, "order.*")
    channel.queue_declare(DLQ, durable=True)  # the broker would create it on demand
    channel.queue_declare(REVIEW, durable=True)


def publish_orders(channel, first: int, count: int) -> None:
    channel.confirm_delivery()
    for i in range(first, first + count):
        o = order(i)
        channel.basic_publish("", STREAM, json.dumps(o).encode(), pika.BasicProperties(
            delivery_mode=2, message_id=o["order_id"], content_type="application/json"))


def enrich(spark, url: str, checkpoint: str) -> int:
    """The streaming job: stream ``orders`` -> enriched -> exchange ``orders.enriched``.
    availableNow: processes what is there and stops; run it again for new orders (the
    checkpoint remembers where it was). Returns the number of orders read."""
    from pyspark.sql import functions as F

    schema = ("order_id string, customer string, country string, sku string, "
              "quantity int, price double")
    regions = spark.createDataFrame(sorted(REGIONS.items()), "country string, region string")
    orders = (spark.readStream.format("leveret").option("url", url).option("stream", STREAM)
              .option("startingOffset", "first").option("maxOffsetsPerTrigger", 500).load()
              .select(F.from_json(F.col("body").cast("string"), schema).alias("o"))
              .select("o.*"))
    enriched = (orders.join(F.broadcast(regions), "country", "left")
                .withColumn("region", F.coalesce("region", F.lit("other")))
                .withColumn("total", F.round(F.col("quantity") * F.col("price"), 2)))
    out = enriched.select(
        F.to_json(F.struct(*[F.col(c) for c in enriched.columns])).alias("body"),
        F.concat(F.lit("order."), F.col("region")).alias("routing_key"),
        F.create_map(F.lit("order_id"), F.col("order_id"),
                     F.lit("region"), F.col("region")).alias("headers"),
        F.create_map(F.lit("content_type"), F.lit("application/json"),
                     F.lit("correlation_id"), F.col("order_id")).alias("properties"))
    query = (out.writeStream.format("leveret").option("url", url).option("exchange", EXCHANGE)
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    query.awaitTermination()
    return sum(int(p.get("numInputRows", 0)) for p in query.recentProgress)


@dataclass
class Fulfilment:
    fulfilled: set[str] = field(default_factory=set)
    attempts: dict[str, int] = field(default_factory=dict)  # rejected order -> deliveries


def fulfil(channel, expected: int, timeout: float = 60.0, verbose: bool = True) -> Fulfilment:
    """The downstream service: ack valid orders, reject invalid ones with requeue (the
    queue retries them with back-off, then dead-letters them). Returns once ``expected``
    orders have been either fulfilled or dead-lettered (or after ``timeout``)."""
    result = Fulfilment()

    def on_order(ch, method, properties, body) -> None:
        o = json.loads(body)
        attempt = int((properties.headers or {}).get("x-delivery-count", 0)) + 1
        if o["quantity"] <= 0:
            result.attempts[o["order_id"]] = attempt
            if verbose and attempt == 1:
                print(f"  {o['order_id']}: quantity {o['quantity']} is invalid, rejected "
                      "(retried with back-off)")
            ch.basic_reject(method.delivery_tag, requeue=True)
        else:
            result.fulfilled.add(o["order_id"])
            ch.basic_ack(method.delivery_tag)

    channel.basic_qos(prefetch_count=100)
    tag = channel.basic_consume(QUEUE, on_order)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        channel.connection.process_data_events(time_limit=0.1)
        dead = channel.queue_declare(DLQ, passive=True).method.message_count
        if len(result.fulfilled) + dead >= expected:
            break
    channel.basic_cancel(tag)
    return result


@dataclass
class Summary:
    published: int
    enriched: int
    fulfilled: int
    dead_lettered: int
    replayed: int
    in_review: int
    report: object  # pandas DataFrame from dlq_report


def run(spark, url: str, orders: int = 200, out: str | None = None,
        verbose: bool = True) -> Summary:
    """The whole pipeline on ``spark`` against the broker at ``url``."""
    from leveret.spark import register
    from leveret.spark.jobs import dlq_replay, dlq_report

    register(spark)
    say = print if verbose else (lambda *a, **k: None)
    work = Path(out or tempfile.mkdtemp(prefix="leveret-orders-"))
    work.mkdir(parents=True, exist_ok=True)
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    try:
        declare(channel)
        start = channel.queue_declare(STREAM, passive=True).method.message_count
        publish_orders(channel, start, orders)
        say(f"1. published {orders} orders to the stream {STREAM!r}")

        enriched = enrich(spark, url, str(work / "checkpoint"))
        say(f"2. Spark enriched {enriched} orders and published them to {EXCHANGE!r}")

        result = fulfil(channel, enriched, verbose=verbose)
        dead = channel.queue_declare(DLQ, passive=True).method.message_count
        say(f"3. fulfilled {len(result.fulfilled)} orders; {dead} invalid ones were tried "
            f"{max(result.attempts.values(), default=0)} times each (with back-off) and were "
            f"dead-lettered to {DLQ!r}")

        report = dlq_report(spark, url, DLQ, output=str(work / "dlq-report"),
                            headers=["region"], chart=str(work / "dlq-report.png"))
        say(f"4. dead letters of {DLQ} (also in {work / 'dlq-report'} and "
            f"{work / 'dlq-report.png'}):")
        say(report.to_string(index=False))

        replay = dlq_replay(spark, url, DLQ, where="reason = 'delivery_limit'",
                            exchange="", routing_key=REVIEW)
        review = channel.queue_declare(REVIEW, passive=True).method.message_count
        say(f"5. replayed {replay.replayed} dead letter(s) to {REVIEW!r} for review "
            f"({review} waiting there); {DLQ} has "
            f"{channel.queue_declare(DLQ, passive=True).method.message_count} left")
        return Summary(orders, enriched, len(result.fulfilled), dead, replay.replayed,
                       review, report)
    finally:
        connection.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="AMQP URL of a running leveret (default: an embedded "
                        "broker with its data in a temporary directory)")
    parser.add_argument("--orders", type=int, default=200, help="orders to publish")
    parser.add_argument("--master", default="local[2]", help="Spark master")
    parser.add_argument("--out", help="directory for the checkpoint and the DLQ report")
    args = parser.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    from leveret.spark.jobs import session

    broker = None
    url = args.url
    if url is None:
        import leveret

        data = tempfile.mkdtemp(prefix="leveret-orders-data-")
        broker = leveret.BlockingBroker(amqp_port=0, data_dir=data)
        broker.__enter__()
        url = broker.amqp_url
        print(f"embedded broker at {url} (data in {data})")
    spark = session(args.master, "leveret-orders")
    try:
        run(spark, url, args.orders, args.out)
    finally:
        spark.stop()
        if broker is not None:
            broker.__exit__(None, None, None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
