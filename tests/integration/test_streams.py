"""Stream queues over AMQP 0-9-1 (RabbitMQ's semantics) with pika."""

from __future__ import annotations

import datetime
import json
import time

import pika
import pytest
from eventually import eventually, pumping

from leveret import BlockingBroker

STREAM = {"x-queue-type": "stream"}


def read(ch, stream: str, count: int, offset="next", end=None, timeout: float = 5.0):
    """(offset, body) of up to ``count`` deliveries starting at ``offset``."""
    ch.basic_qos(prefetch_count=100)
    args = {"x-stream-offset": offset}
    if end is not None:
        args["x-stream-offset-end"] = end
    got = []
    for method, props, body in ch.consume(stream, arguments=args, inactivity_timeout=timeout):
        if method is None:
            break
        got.append((props.headers["x-stream-offset"], body))
        ch.basic_ack(method.delivery_tag)
        if len(got) == count:
            break
    ch.cancel()
    return got


def publish(ch, stream: str, bodies) -> None:
    for body in bodies:
        ch.basic_publish("", stream, body)


def test_readers_do_not_remove_and_choose_where_to_start(channel):
    channel.queue_declare("events", durable=True, arguments=STREAM)
    publish(channel, "events", [b"e%d" % i for i in range(10)])
    first = read(channel, "events", 10, "first")
    assert first == [(i, b"e%d" % i) for i in range(10)]
    assert read(channel, "events", 10, "first") == first  # a second reader sees it all
    assert read(channel, "events", 3, 7) == first[7:]
    assert read(channel, "events", 1, "last") == [(9, b"e9")]
    assert channel.queue_declare("events", passive=True).method.message_count == 10


def test_next_offset_only_sees_new_messages(connection):
    pub, sub = connection.channel(), connection.channel()
    pub.queue_declare("news", durable=True, arguments=STREAM)
    publish(pub, "news", [b"old"])
    sub.basic_qos(prefetch_count=10)
    received = []
    sub.basic_consume("news", lambda ch, m, p, b: (received.append((p.headers["x-stream-offset"], b)),
                                                   ch.basic_ack(m.delivery_tag)),
                      arguments={"x-stream-offset": "next"})
    connection.process_data_events(time_limit=0.2)
    publish(pub, "news", [b"new"])
    eventually(lambda: received, 5, 0.1, pumping(connection))
    assert received == [(1, b"new")]


def test_timestamp_offset(channel):
    channel.queue_declare("ts", durable=True, arguments=STREAM)
    publish(channel, "ts", [b"before"])
    channel.queue_declare("ts", passive=True)  # a round trip: "before" is appended
    time.sleep(1.1)
    since = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    time.sleep(0.1)
    publish(channel, "ts", [b"after"])
    assert [b for _, b in read(channel, "ts", 5, since, timeout=1)] == [b"after"]


def test_offset_end_reads_a_range_then_cancels(channel):
    channel.queue_declare("ranged", durable=True, arguments=STREAM)
    publish(channel, "ranged", [b"%d" % i for i in range(20)])
    started = time.monotonic()
    got = read(channel, "ranged", 100, 5, end=12, timeout=3)
    assert [o for o, _ in got] == list(range(5, 12))
    # pika's consume generator ended on the broker's basic.cancel, not on the timeout
    assert time.monotonic() - started < 2


@pytest.mark.parametrize("bad", [
    dict(queue_arguments={"x-queue-type": "stream"}, durable=False),
    dict(queue_arguments={"x-queue-type": "stream", "x-max-age": "7 days"}),
])
def test_invalid_stream_declarations_are_406(channel, bad):
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        channel.queue_declare("bad", durable=bad.get("durable", True),
                              arguments=bad["queue_arguments"])
    assert info.value.reply_code == 406


def test_stream_consumers_need_manual_ack_and_prefetch(connection):
    ch = connection.channel()
    ch.queue_declare("strict", durable=True, arguments=STREAM)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.basic_consume("strict", lambda *a: None, auto_ack=True)
        connection.process_data_events(time_limit=0.5)
    assert info.value.reply_code == 406
    ch = connection.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.basic_get("strict")
    assert info.value.reply_code == 406


def test_retention_drops_whole_old_segments(channel):
    channel.queue_declare("short", durable=True, arguments={
        **STREAM, "x-max-length-bytes": 3000, "x-stream-max-segment-size-bytes": 1000})
    publish(channel, "short", [b"x" * 100 for _ in range(100)])  # 10000 bytes, 10 segments
    count = channel.queue_declare("short", passive=True).method.message_count
    assert 30 <= count <= 40
    first = read(channel, "short", 1, "first")[0][0]
    assert first == 100 - count


def test_stream_survives_restart_and_info_api(tmp_path):
    data = str(tmp_path / "data")
    with BlockingBroker(amqp_port=0, data_dir=data) as broker:
        conn = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
        ch = conn.channel()
        ch.queue_declare("log", durable=True, arguments=STREAM)
        publish(ch, "log", [b"%d" % i for i in range(15_000)])  # more than the memory tail
        ch.queue_declare("log", passive=True)  # all appended; a clean stop writes them
        conn.close()
    with BlockingBroker(amqp_port=0, data_dir=data) as broker:
        conn = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
        ch = conn.channel()
        got = read(ch, "log", 15_000, "first")
        assert [o for o, _ in got] == list(range(15_000))
        assert got[-1][1] == b"14999"
        replies = []
        ch.basic_consume("amq.rabbitmq.reply-to", lambda c, m, p, b: replies.append(json.loads(b)),
                         auto_ack=True)
        ch.basic_publish("amq.leveret.api", "stream.info", json.dumps({"stream": "log"}),
                         pika.BasicProperties(reply_to="amq.rabbitmq.reply-to"))
        while not replies:
            conn.process_data_events(time_limit=0.1)
        assert replies[0] == {"ok": True, "first": 0, "next": 15_000, "messages": 15_000}
        conn.close()
