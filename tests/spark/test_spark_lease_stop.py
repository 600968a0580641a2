"""Leases of a streaming read of a queue: stopping the query hands its unacknowledged
leases back at once; two queries sharing a lease group are refused."""

from __future__ import annotations

import signal
import time

import pytest

from leveret.amqp.client import AMQPError, BlockingClient as Client
from leveret.spark.source import LeveretStreamReader, _ReadConfig

pytestmark = pytest.mark.timeout(180)


def _ready(channel, queue: str) -> int:
    return channel.queue_declare(queue, passive=True).method.message_count


def _held(url: str, queue: str, group: str) -> int:
    with Client(url) as client:
        return int(client.rpc("lease.info", {"queue": queue, "group": group})["held"])


def _reader(url: str, queue: str) -> LeveretStreamReader:
    return LeveretStreamReader(_ReadConfig.from_options(
        {"url": url, "queue": queue, "group": "etl", "leaseTtlMs": "600000",
         "maxMessagesPerTrigger": "10"}, streaming=True))


def test_stop_releases_what_spark_did_not_commit(leveret_broker, channel):
    """The reader as Spark's source runner drives it: two batches planned, the first
    committed (acknowledged when the second is planned), then stop()."""
    url = leveret_broker.amqp_url
    channel.queue_declare("jobs", durable=True)
    for i in range(30):
        channel.basic_publish("", "jobs", f"m{i}".encode())
    with Client(url) as client:  # another group's leases: m0..m4
        client.rpc("lease.acquire", {"queue": "jobs", "group": "other", "max": 5})
    _reader(url, "jobs").stop()  # planned nothing: releases nothing
    reader = _reader(url, "jobs")
    first = reader.latestOffset(reader.initialOffset(), None)  # m5..m14
    second = reader.latestOffset(first, None)  # m15..m24; the first batch is acked
    assert (first, second) == ({"seq": 11, "first": 1}, {"seq": 21, "first": 1})
    assert _ready(channel, "jobs") == 5

    handler = signal.getsignal(signal.SIGTERM)
    reader.stop()
    assert signal.getsignal(signal.SIGTERM) is handler
    # the second batch is back, redelivered; the first is gone for good; the other
    # group's leases are still held
    assert _ready(channel, "jobs") == 15
    assert (_held(url, "jobs", "etl"), _held(url, "jobs", "other")) == (0, 5)
    got = [channel.basic_get("jobs", auto_ack=True) for _ in range(15)]
    assert sorted(body for method, _, body in got if method.redelivered) == \
        sorted(f"m{i}".encode() for i in range(15, 25))
    reader.stop()  # again: nothing left to release


def test_leases_taken_before_the_query_are_neither_acked_nor_released(leveret_broker,
                                                                        channel):
    url = leveret_broker.amqp_url
    channel.queue_declare("jobs", durable=True)
    for i in range(30):
        channel.basic_publish("", "jobs", f"m{i}".encode())
    with Client(url) as client:  # the group's leases from before the query: seqs 1..3
        client.rpc("lease.acquire", {"queue": "jobs", "group": "etl", "max": 3})
    reader = _reader(url, "jobs")
    start = reader.initialOffset()
    first = reader.latestOffset(start, None)  # seqs 4..13
    assert (start, first) == ({"seq": 4, "first": 4}, {"seq": 14, "first": 4})
    assert reader.latestOffset(first, None) == {"seq": 24, "first": 4}  # acks 4..13
    assert (_ready(channel, "jobs"), _held(url, "jobs", "etl")) == (7, 13)
    reader.stop()  # releases 14..23, the batch not committed
    assert (_ready(channel, "jobs"), _held(url, "jobs", "etl")) == (17, 3)
    # a restarted query's reader knows its first offset from the checkpoint's
    restarted = _reader(url, "jobs")
    end = restarted.latestOffset({"seq": 24, "first": 4}, None)
    assert end == {"seq": 34, "first": 4} and _held(url, "jobs", "etl") == 13


def test_query_stop_returns_an_unfinished_batch_to_the_queue(spark, leveret_broker, channel,
                                                             tmp_path):
    from pyspark.sql import functions as F

    url = leveret_broker.amqp_url
    channel.queue_declare("slow.jobs", durable=True)
    for i in range(30):
        channel.basic_publish("", "slow.jobs", f"m{i}".encode())
    slow = F.udf(lambda body: time.sleep(30) or len(body), "int")  # a batch that never ends
    query = (spark.readStream.format("leveret").option("url", url).option("queue", "slow.jobs")
             .option("group", "g").option("leaseTtlMs", 600_000)
             .option("maxMessagesPerTrigger", 10).load()
             .select(slow("body").alias("n")).writeStream.format("noop")
             .option("checkpointLocation", str(tmp_path / "ck")).start())
    try:  # stop it while its first batch runs (leased, planned, never committed)
        tracker = spark.sparkContext.statusTracker()
        deadline = time.monotonic() + 60
        while (_held(url, "slow.jobs", "g") < 10 or not tracker.getActiveStageIds()) \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1)
        assert _ready(channel, "slow.jobs") == 20
    finally:
        query.stop()
    deadline = time.monotonic() + 20  # Spark ends the source's process; slow on a busy machine
    while _ready(channel, "slow.jobs") < 30 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _ready(channel, "slow.jobs") == 30
    assert _held(url, "slow.jobs", "g") == 0


def test_two_readers_in_one_group_are_refused(leveret_broker, channel):
    url = leveret_broker.amqp_url
    channel.queue_declare("shared", durable=True)
    for i in range(40):
        channel.basic_publish("", "shared", f"m{i}".encode())
    a, b = _reader(url, "shared"), _reader(url, "shared")
    first = a.latestOffset(a.initialOffset(), None)
    b.latestOffset(b.initialOffset(), None)  # b leases seqs 11..20 in the same group
    with pytest.raises(AMQPError, match="option group: another reader leases queue "
                                        "'shared' as group 'etl' too"):
        a.latestOffset(first, None)
