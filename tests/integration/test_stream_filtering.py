"""Stream filtering (RabbitMQ 3.13's x-stream-filter-value / x-stream-filter /
x-stream-match-unfiltered) and x-selector on stream consumers, over AMQP 0-9-1 with
pika. RabbitMQ 3.10, the one installed here, has no stream filtering, so these run
against leveret only; leveret filters exactly where RabbitMQ's Bloom filters let a few
others through, so the assertions are exact."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3

import aio_pika
import pika
import pytest
from servers import ServerProcess

import leveret
from leveret import BlockingBroker
from leveret.core.queues.stream_index import CHUNK_SIZE

STREAM = {"x-queue-type": "stream"}


def publish(ch, stream: str, values, first: int = 0) -> None:
    """One message per item: body ``<offset>`` (the stream's offsets counted from
    ``first``) and filter value ``value`` (None: no header; another type: that header
    value)."""
    for i, value in enumerate(values, first):
        headers = None if value is None else {"x-stream-filter-value": value}
        ch.basic_publish("", stream, b"%d" % i, pika.BasicProperties(headers=headers))
    ch.queue_declare(stream, passive=True)  # a round trip: all appended


def read(ch, stream: str, timeout: float = 1.0, **arguments) -> list[int]:
    """The offsets a consumer with ``arguments`` gets until ``timeout`` s of silence
    (or the broker cancels it)."""
    ch.basic_qos(prefetch_count=50)
    got = []
    for method, props, body in ch.consume(stream, arguments=arguments, inactivity_timeout=timeout):
        if method is None:
            break
        assert int(body) == props.headers["x-stream-offset"]
        got.append(props.headers["x-stream-offset"])
        ch.basic_ack(method.delivery_tag)
    ch.cancel()
    return got


VALUES = ["a", "b", None, "a", "c", None, "b", "a"]


def test_a_single_filter_value(channel):
    channel.queue_declare("fruit", durable=True, arguments=STREAM)
    publish(channel, "fruit", VALUES)
    assert read(channel, "fruit", **{"x-stream-offset": "first", "x-stream-filter": "a"}) == [0, 3, 7]
    assert read(channel, "fruit", **{"x-stream-offset": "first", "x-stream-filter": "zzz"}) == []


def test_a_list_of_values_and_match_unfiltered(channel):
    channel.queue_declare("fruit", durable=True, arguments=STREAM)
    publish(channel, "fruit", VALUES)
    args = {"x-stream-offset": "first", "x-stream-filter": ["a", "c"]}
    assert read(channel, "fruit", **args) == [0, 3, 4, 7]
    assert read(channel, "fruit", **args, **{"x-stream-match-unfiltered": True}) == [0, 2, 3, 4, 5, 7]
    assert read(channel, "fruit", **args, **{"x-stream-match-unfiltered": False}) == [0, 3, 4, 7]


def test_filters_combine_with_offsets_end_and_next(connection):
    ch = connection.channel()
    ch.queue_declare("fruit", durable=True, arguments=STREAM)
    values = ["a" if i % 100 == 0 else "b" for i in range(3 * CHUNK_SIZE)]
    publish(ch, "fruit", values)
    wanted = [i for i in range(len(values)) if i % 100 == 0]
    assert read(ch, "fruit", **{"x-stream-offset": 1500, "x-stream-filter": "a"}) == [
        o for o in wanted if o >= 1500]
    # a range ends with the broker's cancel, whatever matched in it
    assert read(ch, "fruit", **{"x-stream-offset": 150, "x-stream-offset-end": 2050,
                                "x-stream-filter": "a"}) == [o for o in wanted if 150 <= o < 2050]
    assert read(ch, "fruit", **{"x-stream-offset": "last", "x-stream-filter": "a"}) == []
    # next: only what comes after, filtered
    sub = connection.channel()
    sub.basic_qos(prefetch_count=10)
    got = []
    sub.basic_consume("fruit", lambda c, m, p, b: (got.append(int(b)), c.basic_ack(m.delivery_tag)),
                      arguments={"x-stream-offset": "next", "x-stream-filter": "a"})
    connection.process_data_events(time_limit=0.2)
    publish(ch, "fruit", ["b", "a", None, "a"])  # bodies 0..3 at offsets 3072..3075
    for _ in range(50):
        if len(got) == 2:
            break
        connection.process_data_events(time_limit=0.1)
    assert got == [1, 3]


def test_x_selector_on_stream_consumers_alone_and_with_a_filter(channel):
    channel.queue_declare("fruit", durable=True, arguments=STREAM)
    for i, value in enumerate(VALUES):
        channel.basic_publish("", "fruit", b"%d" % i, pika.BasicProperties(
            headers={"n": i, **({} if value is None else {"x-stream-filter-value": value})}))
    assert read(channel, "fruit", **{"x-stream-offset": "first", "x-selector": "n >= 4"}) == [4, 5, 6, 7]
    assert read(channel, "fruit", **{"x-stream-offset": "first", "x-selector": "n >= 3",
                                     "x-stream-filter": ["a", "b"]}) == [3, 6, 7]
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        read(channel, "fruit", **{"x-selector": "n >>> 3"})
    assert info.value.reply_code == 406


def test_values_that_are_not_strings_and_binary_values(channel):
    channel.queue_declare("typed", durable=True, arguments=STREAM)
    publish(channel, "typed", ["a", 7, b"a", None, True])
    # an integer or boolean value is no filter value (unfiltered); binary is its text
    assert read(channel, "typed", **{"x-stream-offset": "first", "x-stream-filter": "a"}) == [0, 2]
    assert read(channel, "typed", **{"x-stream-offset": "first", "x-stream-filter": "zzz",
                                     "x-stream-match-unfiltered": True}) == [1, 3, 4]


def test_ill_typed_consume_arguments_are_ignored_as_rabbitmq_does(channel):
    """rabbit_stream_queue reads x-stream-filter leniently: a value that is neither a
    string nor an array means no filter, array items that are not strings are dropped,
    a non-boolean x-stream-match-unfiltered is false; the consumer is not refused."""
    channel.queue_declare("fruit", durable=True, arguments=STREAM)
    publish(channel, "fruit", VALUES)
    everything = list(range(len(VALUES)))
    assert read(channel, "fruit", **{"x-stream-offset": "first", "x-stream-filter": 12}) == everything
    assert read(channel, "fruit", **{"x-stream-offset": "first", "x-stream-filter": ["c", 3]}) == [4]
    assert read(channel, "fruit", **{"x-stream-offset": "first", "x-stream-filter": "c",
                                     "x-stream-match-unfiltered": "yes"}) == [4]
    assert read(channel, "fruit", **{"x-stream-offset": "first",
                                     "x-stream-match-unfiltered": True}) == everything


@pytest.mark.parametrize(("size", "text"), [
    ("big", "expected integer, got longstr"),
    (-1, "value_negative"),
    (8, "Invalid value for x-stream-filter-size-bytes"),
    (256, "Invalid value for x-stream-filter-size-bytes"),
])
def test_bad_filter_size_is_refused_with_rabbitmqs_errors(connection, size, text):
    ch = connection.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_declare("sized", durable=True, arguments={**STREAM, "x-stream-filter-size-bytes": size})
    assert info.value.reply_code == 406
    assert text in info.value.reply_text


def test_a_filter_size_in_range_is_taken(channel):
    channel.queue_declare("sized", durable=True, arguments={**STREAM, "x-stream-filter-size-bytes": 255})
    publish(channel, "sized", [f"v{i}" for i in range(100)])  # past the exact values: Bloom
    assert read(channel, "sized", **{"x-stream-offset": "first", "x-stream-filter": "v42"}) == [42]


def _rows_read(broker: BlockingBroker, name: str) -> list[int]:
    """Counts the rows the stream ``name`` gets from its store (the real store's reads,
    observed, not replaced)."""
    rows: list[int] = []

    def install() -> None:
        queue = broker.core.vhosts["/"].queues[name]
        store = queue.store
        real = store.request_queue

        def counted(queue_id, after_seq, limit, upto_seq, answer):
            return real(queue_id, after_seq, limit, upto_seq,
                        lambda got: (rows.append(len(got)), answer(got))[1])

        store.request_queue = counted

    broker.call(install)
    return rows


def test_restart_keeps_the_chunk_index(tmp_path):
    data = str(tmp_path / "data")
    count = 5 * CHUNK_SIZE + 300  # five sealed chunks (saved) and an open one (rebuilt)
    rare = {10, 3 * CHUNK_SIZE + 7, count - 5}
    values = ["rare" if i in rare else ("x" if i % 2 else None) for i in range(count)]
    with BlockingBroker(amqp_port=0, data_dir=data) as broker:
        conn = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
        ch = conn.channel()
        ch.queue_declare("log", durable=True, arguments=STREAM)
        publish(ch, "log", values)
        conn.close()
    with BlockingBroker(amqp_port=0, data_dir=data) as broker:
        chunks = broker.call(lambda: sorted(broker.core.vhosts["/"].queues["log"].index.chunks))
        assert chunks == list(range(6))
        rows = _rows_read(broker, "log")
        conn = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
        ch = conn.channel()
        assert read(ch, "log", **{"x-stream-offset": "first", "x-stream-filter": "rare"}) == sorted(rare)
        # read from the store: the three matches, not the messages between them
        assert sum(rows) == len(rare)
        assert read(ch, "log", **{"x-stream-offset": "first", "x-stream-filter": "rare",
                                  "x-stream-match-unfiltered": True}) == sorted(
            rare | {i for i in range(count) if i % 2 == 0})
        # appending after the restart goes on in the rebuilt open chunk
        publish(ch, "log", [None] * (CHUNK_SIZE - 300) + ["rare"], first=count)
        assert read(ch, "log", **{"x-stream-offset": count, "x-stream-filter": "rare"}) == [
            count + CHUNK_SIZE - 300]
        conn.close()
    with BlockingBroker(amqp_port=0, data_dir=data) as broker:
        chunks = broker.call(lambda: sorted(broker.core.vhosts["/"].queues["log"].index.chunks))
        assert chunks == list(range(7))  # the chunk sealed after the restart was saved
        conn = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
        assert read(conn.channel(), "log", **{"x-stream-offset": "first", "x-stream-filter": "rare"}) == [
            *sorted(rare), count + CHUNK_SIZE - 300]
        conn.close()


def _saved_chunks(data: str) -> int:
    files = [f for f in os.listdir(data) if f.endswith((".db", ".sqlite", ".sqlite3"))]
    assert files, os.listdir(data)
    with contextlib.closing(sqlite3.connect(os.path.join(data, files[0]))) as db:
        return db.execute("SELECT count(*) FROM definitions WHERE kind = 'stream_chunk'").fetchone()[0]


def test_deleting_a_stream_forgets_its_saved_index(tmp_path):
    data = str(tmp_path / "data")
    with BlockingBroker(amqp_port=0, data_dir=data) as broker:
        conn = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
        ch = conn.channel()
        for name in ("gone", "kept"):
            ch.queue_declare(name, durable=True, arguments=STREAM)
            publish(ch, name, ["a"] * (2 * CHUNK_SIZE))
        ch.queue_delete("gone")
        conn.close()
    assert _saved_chunks(data) == 2  # kept's two chunks


def test_aio_pika_filtered_stream_consumer():
    """aio-pika passes x-stream-filter as its consume arguments, as with RabbitMQ 3.13."""

    async def main() -> list[tuple[int, bytes]]:
        async with leveret.Broker(amqp_port=0) as broker:
            connection = await aio_pika.connect(broker.amqp_url)
            async with connection:
                channel = await connection.channel()
                await channel.set_qos(prefetch_count=10)
                queue = await channel.declare_queue("fruit", durable=True, arguments=STREAM)
                for i, value in enumerate(VALUES):
                    headers = {} if value is None else {"x-stream-filter-value": value}
                    await channel.default_exchange.publish(
                        aio_pika.Message(b"%d" % i, headers=headers), routing_key="fruit")
                got: list[tuple[int, bytes]] = []
                async with queue.iterator(arguments={"x-stream-offset": "first",
                                                     "x-stream-filter": ["b", "c"]}) as messages:
                    async for message in messages:
                        await message.ack()
                        got.append((message.headers["x-stream-offset"], message.body))
                        if len(got) == 3:
                            break
                return got

    assert asyncio.run(asyncio.wait_for(main(), 10)) == [(1, b"1"), (4, b"4"), (6, b"6")]


def test_retention_drops_the_index_of_dropped_chunks(leveret_broker, channel):
    channel.queue_declare("short", durable=True, arguments={
        **STREAM, "x-max-length-bytes": 3000, "x-stream-max-segment-size-bytes": 1000})
    values = ["a" if i % 7 == 0 else None for i in range(3 * CHUNK_SIZE)]
    publish(channel, "short", values)
    first = channel.queue_declare("short", passive=True).method.message_count
    first = len(values) - first
    assert first > 2 * CHUNK_SIZE
    chunks = leveret_broker.call(lambda: sorted(leveret_broker.core.vhosts["/"].queues["short"].index.chunks))
    assert chunks == [2]
    assert read(channel, "short", **{"x-stream-offset": "first", "x-stream-filter": "a"}) == [
        i for i in range(first, len(values)) if i % 7 == 0]


def test_kill_9_keeps_the_chunk_index_correct(tmp_path):
    """Confirmed messages and the summaries of the chunks they sealed are on disk
    together; the open chunk is rebuilt at start-up, so a filter finds exactly the
    matches after a crash, including those appended after it."""
    data = tmp_path / "data"
    count = 2 * CHUNK_SIZE + 500
    rare = {3, CHUNK_SIZE + 1, count - 1}
    values = ["rare" if i in rare else ("x" if i % 3 else None) for i in range(count)]
    server = ServerProcess(data)
    try:
        conn = pika.BlockingConnection(pika.URLParameters(server.url))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("log", durable=True, arguments=STREAM)
        publish(ch, "log", values)
    finally:
        server.kill()  # SIGKILL: no clean stop
    server = ServerProcess(data)
    try:
        conn = pika.BlockingConnection(pika.URLParameters(server.url))
        ch = conn.channel()
        args = {"x-stream-offset": "first", "x-stream-filter": "rare"}
        assert read(ch, "log", **args) == sorted(rare)
        publish(ch, "log", [None] * (CHUNK_SIZE - 500 - 1) + ["rare"], first=count)
        assert read(ch, "log", **args) == [*sorted(rare), 3 * CHUNK_SIZE - 1]
        conn.close()
    finally:
        server.kill()
