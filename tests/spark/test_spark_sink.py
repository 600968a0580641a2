"""The leveret Spark sink: batch and streaming writes, confirms, failures, exactly-once."""

from __future__ import annotations

import json

import pika
import pytest
from spark_support import drain

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def channel(leveret_broker):
    conn = pika.BlockingConnection(pika.URLParameters(leveret_broker.amqp_url))
    yield conn.channel()
    if conn.is_open:
        conn.close()


def _spark_error(exc_info) -> str:
    return str(exc_info.value)


def test_batch_write_publishes_every_row_with_headers_and_properties(spark, leveret_broker,
                                                                     channel):
    channel.queue_declare("out.a", durable=True)
    channel.queue_declare("out.b", durable=True)
    df = spark.createDataFrame(
        [(f"m{i}", "out.a" if i % 2 else "out.b", {"n": str(i)},
          {"content_type": "text/plain", "correlation_id": f"c{i}", "priority": "3"})
         for i in range(200)],
        "body string, routing_key string, headers map<string,string>, "
        "properties map<string,string>").repartition(2)
    df.write.format("leveret").option("url", leveret_broker.amqp_url).mode("append").save()

    a, b = drain(channel, "out.a"), drain(channel, "out.b")
    assert len(a) == len(b) == 100
    bodies = sorted(body.decode() for _, _, body in a + b)
    assert bodies == sorted(f"m{i}" for i in range(200))
    for _, props, body in a:
        i = int(body[1:])
        assert i % 2 == 1
        assert props.headers == {"n": str(i)}
        assert props.content_type == "text/plain"
        assert props.correlation_id == f"c{i}"
        assert props.priority == 3
        assert props.delivery_mode == 2
    ids = [props.message_id for _, props, _ in a + b]
    assert len(set(ids)) == 200 and all(ids)


def test_default_routing_key_exchange_option_and_transient(spark, leveret_broker, channel):
    channel.exchange_declare("ex", "direct")
    channel.queue_declare("routed")
    channel.queue_bind("routed", "ex", "rk")
    df = spark.createDataFrame([(bytearray(b"\x00\x01"),), (bytearray(b"\x02"),)], "body binary")
    (df.write.format("leveret").option("url", leveret_broker.amqp_url).option("exchange", "ex")
     .option("routingKey", "rk").option("persistent", "false").mode("append").save())
    got = drain(channel, "routed")
    assert sorted(body for _, _, body in got) == [b"\x00\x01", b"\x02"]
    assert {props.delivery_mode for _, props, _ in got} == {1}


def test_rewriting_a_batch_with_the_same_job_id_is_deduplicated(spark, leveret_broker,
                                                                channel):
    channel.queue_declare("dedup", durable=True, arguments={"x-message-deduplication": True})
    df = spark.range(0, 300, numPartitions=3).selectExpr("cast(id as string) AS body")
    for _ in range(2):  # the second run is a retry of the same job
        (df.write.format("leveret").option("url", leveret_broker.amqp_url)
         .option("routingKey", "dedup").option("jobId", "nightly-2024-01-01")
         .mode("append").save())
    got = drain(channel, "dedup")
    assert sorted(int(body) for _, _, body in got) == list(range(300))
    # without a jobId, each write is a new job
    (df.write.format("leveret").option("url", leveret_broker.amqp_url)
     .option("routingKey", "dedup").mode("append").save())
    assert len(drain(channel, "dedup")) == 300


def test_a_nack_fails_the_task(spark, leveret_broker, channel):
    channel.queue_declare("tiny", arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    df = spark.range(20, numPartitions=1).selectExpr("cast(id as string) AS body")
    with pytest.raises(Exception) as exc_info:
        (df.write.format("leveret").option("url", leveret_broker.amqp_url)
         .option("routingKey", "tiny").mode("append").save())
    assert "nacked" in _spark_error(exc_info)


def test_unreachable_broker_and_bad_login_fail_before_the_query(spark, leveret_broker):
    df = spark.range(3).selectExpr("cast(id as string) AS body")
    with pytest.raises(Exception) as exc_info:
        df.write.format("leveret").option("url", "amqp://guest:secret@127.0.0.1:1/%2F") \
            .mode("append").save()
    text = _spark_error(exc_info)
    assert "option url" in text and "127.0.0.1:1" in text and "secret" not in text
    bad = leveret_broker.amqp_url.replace("guest:guest", "guest:wrong")
    with pytest.raises(Exception) as exc_info:
        df.write.format("leveret").option("url", bad).mode("append").save()
    assert "refused" in _spark_error(exc_info)


def test_bad_options_and_columns_are_named(spark, leveret_broker):
    url = leveret_broker.amqp_url
    df = spark.range(3).selectExpr("cast(id as string) AS body")
    cases = [
        (df, {"routingkee": "x"}, "routingkee"),
        (df, {"persistent": "maybe"}, "persistent"),
        (df, {"exchange": "no.such.exchange"}, "no.such.exchange"),
        (spark.range(3), {}, "'body' column"),
        (df.selectExpr("body", "1 AS routing_key"), {}, "routing_key"),
    ]
    for frame, options, expected in cases:
        with pytest.raises(Exception) as exc_info:
            frame.write.format("leveret").option("url", url).options(**options) \
                .mode("append").save()
        assert expected in _spark_error(exc_info), (options, _spark_error(exc_info))


def test_streaming_write_exactly_once_across_a_replayed_batch(spark, leveret_broker, channel,
                                                              tmp_path):
    channel.queue_declare("events", durable=True, arguments={"x-message-deduplication": True})
    source, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    source.mkdir()
    for n in range(3):
        (source / f"part{n}.json").write_text(
            "\n".join(json.dumps({"body": f"f{n}-{i}"}) for i in range(50)))

    def run() -> None:
        query = (spark.readStream.schema("body string").option("maxFilesPerTrigger", 1)
                 .json(str(source)).writeStream.format("leveret")
                 .option("url", leveret_broker.amqp_url).option("routingKey", "events")
                 .option("checkpointLocation", str(checkpoint))
                 .trigger(availableNow=True).start())
        query.awaitTermination(60)
        assert query.exception() is None

    run()
    assert len(drain(channel, "events")) == 150
    # Simulate a crash after the last batch was written but before it was committed:
    # Spark replays it from the offset log, republishing the same message ids.
    commits = sorted((checkpoint / "commits").iterdir(), key=lambda p: p.name)
    last = [p for p in commits if p.name.isdigit()][-1]
    last.unlink()
    for crc in (checkpoint / "commits").glob(f".{last.name}.crc"):
        crc.unlink()
    run()
    assert drain(channel, "events") == []  # the replay was dropped by the dedup queue
