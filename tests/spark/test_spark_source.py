"""The leveret Spark source: streams (batch and streaming), leased queues, DLQ browse."""

from __future__ import annotations

import pika
import pytest
from spark_support import drain

from leveret.amqp.client import BlockingClient as Client

pytestmark = pytest.mark.timeout(180)


def _publish(channel, queue, n, start=0, **props):
    for i in range(start, start + n):
        channel.basic_publish("", queue, f"m{i}".encode(), pika.BasicProperties(
            message_id=f"id{i}", headers={"i": i, "s": "x"}, content_type="text/plain",
            delivery_mode=2, **props))


def test_batch_read_of_a_stream_by_offset_ranges(spark, leveret_broker, channel):
    channel.queue_declare("events", durable=True, arguments={"x-queue-type": "stream"})
    _publish(channel, "events", 30)
    url = leveret_broker.amqp_url
    df = (spark.read.format("leveret").option("url", url).option("stream", "events")
          .option("partitionSize", 10).load())
    rows = sorted(df.collect(), key=lambda r: r.offset)
    assert [r.offset for r in rows] == list(range(30))
    assert [r.body for r in rows] == [f"m{i}".encode() for i in range(30)]
    first = rows[0]
    assert first.message_id == "id0" and first.content_type == "text/plain"
    assert first.headers == {"i": "0", "s": "x"}  # non-strings JSON-encoded
    assert first.delivery_mode == 2 and first.redelivered is False
    some = (spark.read.format("leveret").option("url", url).option("stream", "events")
            .option("startingOffset", 10).option("endingOffset", 20).load())
    assert sorted(r.offset for r in some.select("offset").collect()) == list(range(10, 20))
    # the stream is not consumed
    assert df.count() == 30


def test_streaming_read_of_a_stream_is_incremental(spark, leveret_broker, channel, tmp_path):
    channel.queue_declare("log", durable=True, arguments={"x-queue-type": "stream"})
    _publish(channel, "log", 20)
    url = leveret_broker.amqp_url
    seen: list[int] = []

    def run():
        query = (spark.readStream.format("leveret").option("url", url).option("stream", "log")
                 .option("startingOffset", "first").option("maxOffsetsPerTrigger", 8).load()
                 .writeStream.foreachBatch(
                     lambda df, _: seen.extend(r.offset for r in df.select("offset").collect()))
                 .option("checkpointLocation", str(tmp_path / "ck"))
                 .trigger(availableNow=True).start())
        query.awaitTermination(60)
        assert query.exception() is None

    run()
    assert sorted(seen) == list(range(20))
    _publish(channel, "log", 5, start=20)
    run()
    assert sorted(seen) == list(range(25))


def test_streaming_read_of_a_queue_with_leases_into_the_sink(spark, leveret_broker, channel,
                                                             tmp_path):
    channel.queue_declare("jobs", durable=True)
    channel.queue_declare("done", durable=True, arguments={"x-message-deduplication": True})
    _publish(channel, "jobs", 25)
    url = leveret_broker.amqp_url
    query = (spark.readStream.format("leveret").option("url", url).option("queue", "jobs")
             .option("group", "copier").option("maxMessagesPerTrigger", 10).load()
             .selectExpr("body", "'done' AS routing_key")
             .writeStream.format("leveret").option("url", url)
             .option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    query.awaitTermination(60)
    assert query.exception() is None
    assert sorted(b.decode() for _, _, b in drain(channel, "done")) == \
        sorted(f"m{i}" for i in range(25))
    with Client(url) as client:
        info = client.rpc("lease.info", {"queue": "jobs", "group": "copier"})
        # every batch was committed and acknowledged, the last one too: Spark asks for
        # the next offset once more after it (and finds nothing), which acks it
        assert info["held"] == 0
        assert client.queue_exists("jobs").message_count == 0


def test_browse_a_dlq_with_death_history(spark, leveret_broker, channel):
    channel.queue_declare("work", arguments={"x-dead-letter-exchange": "",
                                             "x-dead-letter-routing-key": "work.dlq"})
    channel.queue_declare("work.dlq")
    _publish(channel, "work", 3)
    for _ in range(3):
        method, _, _ = channel.basic_get("work")
        channel.basic_reject(method.delivery_tag, requeue=False)
    url = leveret_broker.amqp_url
    df = spark.read.format("leveret").option("url", url).option("queue", "work.dlq").load()
    rows = sorted(df.collect(), key=lambda r: r.body)
    assert [r.body for r in rows] == [b"m0", b"m1", b"m2"]
    death = rows[0].deaths[0]
    assert (death.reason, death.queue, death.exchange, death.routing_keys, death["count"]) == \
        ("rejected", "work", "", ["work"], 1)
    assert death.time is not None
    assert rows[0].headers["x-first-death-reason"] == "rejected"
    # browsing leaves them in place
    assert channel.queue_declare("work.dlq", passive=True).method.message_count == 3


def test_read_errors_name_the_option(spark, leveret_broker):
    url = leveret_broker.amqp_url
    cases = [
        ({"queue": "missing"}, "option queue"),
        ({"stream": "missing"}, "option stream"),
        ({"queue": "a", "stream": "b"}, "exactly one"),
        ({"queue": "a", "bogus": "1"}, "bogus"),
        ({"queue": "q", "url": "amqp://guest:guest@127.0.0.1:1/%2F"}, "127.0.0.1:1"),
    ]
    with Client(url) as client:
        client.queue_declare("q")
    for options, expected in cases:
        with pytest.raises(Exception) as exc_info:
            spark.read.format("leveret").option("url", url).options(**options).load().collect()
        assert expected in str(exc_info.value), (options, str(exc_info.value)[:500])
    # a streaming query fails when it starts, with the same message
    with pytest.raises(Exception) as exc_info:
        query = (spark.readStream.format("leveret").option("url", url).option("stream", "nope")
                 .load().writeStream.format("noop").start())
        query.awaitTermination(60)
    assert "option stream" in str(exc_info.value)
