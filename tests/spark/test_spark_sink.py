"""The leveret Spark sink: batch and streaming writes, confirms, failures, exactly-once."""

from __future__ import annotations

import datetime as dt
import json
import struct

import pika
import pytest
import wire_types
from spark_support import drain

from leveret.amqp.properties import encode_properties
from leveret.spark.sink import _x_death

wire_types.install()

pytestmark = pytest.mark.timeout(180)


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
        (df.selectExpr("body", "array('rejected') AS deaths"), {}, "column 'deaths' must be"),
        (df.selectExpr("body", "array(named_struct('reason', 'rejected', 'queue', 'q', "
                       "'exchange', '', 'routing_keys', array('q'), 'count', 'one', "
                       "'time', current_timestamp())) AS deaths"), {},
         "column 'deaths' must be"),
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


def _dead_letters_with_history(channel) -> None:
    """dlq gets d0 (expired in 'slow', then rejected in 'work': two x-death entries) and
    d1 (rejected in 'work' once)."""
    channel.queue_declare("dlq", durable=True)
    channel.queue_declare("work", durable=True, arguments={
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"})
    channel.queue_declare("slow", durable=True, arguments={
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "work",
        "x-message-ttl": 1})
    channel.basic_publish("", "slow", b"d0", pika.BasicProperties(headers={"n": "0"}))
    channel.basic_publish("", "work", b"d1", pika.BasicProperties(headers={"n": "1"}))
    for _ in range(2):
        method = None
        for _ in range(100):
            method, _, _ = channel.basic_get("work")
            if method is not None:
                break
            channel.connection.sleep(0.02)
        channel.basic_reject(method.delivery_tag, requeue=False)
    for _ in range(100):
        if channel.queue_declare("dlq", passive=True).method.message_count == 2:
            break
        channel.connection.sleep(0.02)


def test_headers_of_other_types_keep_them(spark, leveret_broker, channel):
    channel.queue_declare("typed", durable=True)
    df = spark.createDataFrame([("m", {"raw": b"\x00\xff"}, {"n": 7, "big": 2**40})],
                               "body string, bin map<string,binary>, num map<string,long>")
    (df.selectExpr("body", "'typed' AS routing_key", "bin AS headers")
     .write.format("leveret").option("url", leveret_broker.amqp_url).mode("append").save())
    (df.selectExpr("body", "'typed' AS routing_key", "num AS headers")
     .write.format("leveret").option("url", leveret_broker.amqp_url).mode("append").save())
    (_, first, _), (_, second, _) = drain(channel, "typed")
    assert first.headers == {"raw": b"\x00\xff"}
    assert second.headers == {"n": 7, "big": 2**40}


def test_deaths_column_is_published_as_x_death(spark, leveret_broker, channel):
    _dead_letters_with_history(channel)
    channel.queue_declare("copy", durable=True)
    url = leveret_broker.amqp_url
    letters = spark.read.format("leveret").option("url", url).option("queue", "dlq").load()
    (letters.selectExpr("body", "'copy' AS routing_key", "headers", "deaths")
     .write.format("leveret").option("url", url).mode("append").save())
    originals = {body: (props, wire_types.typed_headers(props))
                 for _, props, body in drain(channel, "dlq")}
    copies = {body: (props, wire_types.typed_headers(props))
              for _, props, body in drain(channel, "copy")}
    assert sorted(originals) == sorted(copies) == [b"d0", b"d1"]
    d0 = copies[b"d0"][0].headers["x-death"]
    assert [(d["reason"], d["queue"], d["count"], d["routing-keys"]) for d in d0] == \
        [("rejected", "work", 1, ["work"]), ("expired", "slow", 1, ["slow"])]
    for body, (props, typed) in copies.items():
        original, original_typed = originals[body]
        # as pika decodes them: the same entries, in the same order, with the same values
        assert props.headers["x-death"] == original.headers["x-death"]
        assert all(isinstance(d["time"], dt.datetime) for d in props.headers["x-death"])
        assert props.headers["x-first-death-reason"] == original.headers["x-first-death-reason"]
        assert props.headers["n"] == original.headers["n"]
        # on the wire as the broker wrote it: long strings, an array of long strings, a
        # long count, a timestamp
        assert wire_types.shape(typed["x-death"]) == wire_types.shape(original_typed["x-death"])
        assert all(entry[1]["count"][0] == "l" for entry in typed["x-death"][1])


def test_x_death_entries_as_rabbitmq_writes_them():
    deaths = [{"reason": "rejected", "queue": "work", "exchange": "", "routing_keys": ["work"],
               "count": 3, "time": dt.datetime(2024, 5, 1, 12, 0, 7)},
              None,
              {"reason": "expired", "queue": "slow", "exchange": "ex",
               "routing_keys": ["a", "b"], "count": 1, "time": None}]
    flags, payload = encode_properties({"headers": {"x-death": _x_death(deaths)}})
    raw = struct.pack(">H", flags) + payload
    props = pika.spec.BasicProperties()
    props.decode(raw)
    assert props.headers["x-death"] == [
        {"reason": "rejected", "queue": "work", "exchange": "", "routing-keys": ["work"],
         "count": 3, "time": dt.datetime(2024, 5, 1, 12, 0, 7, tzinfo=dt.UTC)},
        {"reason": "expired", "queue": "slow", "exchange": "ex", "routing-keys": ["a", "b"],
         "count": 1}]  # a null entry or field is left out; a naive time is UTC
    entry = wire_types.typed_headers(raw)["x-death"][1][0][1]
    assert {k: wire_types.shape(v) for k, v in entry.items()} == \
        {"reason": "S", "queue": "S", "exchange": "S", "routing-keys": ("A", ["S"]),
         "count": "l", "time": "T"}


def test_x_death_count_is_a_long():
    deaths = [{"reason": "rejected", "queue": "work", "exchange": "", "routing_keys": ["work"],
               "count": 3, "time": dt.datetime(2024, 5, 1, 12, 0, 7)}]
    flags, payload = encode_properties({"headers": {"x-death": _x_death(deaths)}})
    typed = wire_types.typed_headers(struct.pack(">H", flags) + payload)
    assert typed["x-death"][1][0][1]["count"] == ("l", 3)
