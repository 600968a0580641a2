"""Priority queues (``x-max-priority``) over real TCP, each AMQP case against leveret and
RabbitMQ 3.10 (the ``target`` fixture): the accepted values and 406 texts, the delivery
order (highest first, FIFO within a priority; none counts as 0, above the maximum as the
maximum), requeues, length limits, dead-lettering and a lazy queue whose backlog leveret
pages out. Then aio-pika, a STOMP consumer, and a restart after ``kill -9``."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import aio_pika
import pika
import pytest
from eventually import eventually, pumping
from pika.exceptions import ChannelClosedByBroker
from servers import ServerProcess
from stomp_clients import Client
from targets import Target, unique

from leveret import BlockingBroker

#: Message priorities published in this order, and the order both brokers deliver them
#: in with x-max-priority 10 (read from RabbitMQ 3.10.8).
PRIORITIES = [None, 0, 5, 10, 11, 200, 3, 5, 255, 10, None, 1]
ORDER_10 = ["3:10", "4:11", "5:200", "8:255", "9:10", "2:5", "7:5", "6:3", "11:1", "0:None", "1:0",
            "10:None"]


def publish(ch, queue: str, priorities, persistent: bool = False) -> None:
    for i, priority in enumerate(priorities):
        ch.basic_publish("", queue, f"{i}:{priority}".encode(),
                         pika.BasicProperties(priority=priority, delivery_mode=2 if persistent else None))


def get_all(ch, queue: str) -> list[str]:
    out = []
    while True:
        method, _, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            return out
        out.append(body.decode())


def confirming(connection: pika.BlockingConnection):
    ch = connection.channel()
    ch.confirm_delivery()  # every publish is in the queue once basic_publish returns
    return ch


# -- declaring ----------------------------------------------------------------------------
@pytest.mark.parametrize("value", [0, 1, 10, 255])
def test_max_priority_from_0_to_255_is_accepted(target: Target, value):
    queue = unique("prio")
    with target.amqp() as connection:
        ch = connection.channel()
        ch.queue_declare(queue, auto_delete=True, arguments={"x-max-priority": value})
        ch.queue_declare(queue, auto_delete=True, arguments={"x-max-priority": value})  # equivalent
        ch.queue_delete(queue)


@pytest.mark.parametrize(("value", "detail"), [
    (256, "{max_value_exceeded,256}"),
    (2**40, "{max_value_exceeded,1099511627776}"),
    (-1, "{value_negative,-1}"),
    ("10", '"expected integer, got longstr"'),
    (True, '"expected integer, got bool"'),
    (None, '"expected integer, got void"'),
])
def test_an_invalid_max_priority_is_refused_with_rabbitmqs_406(target: Target, value, detail):
    queue = unique("prio")
    with target.amqp() as connection, pytest.raises(ChannelClosedByBroker) as caught:
        connection.channel().queue_declare(queue, arguments={"x-max-priority": value})
    assert caught.value.reply_code == 406
    assert caught.value.reply_text == (
        f"PRECONDITION_FAILED - invalid arg 'x-max-priority' for queue '{queue}' in vhost '/': {detail}")


def test_a_different_max_priority_is_an_inequivalent_redeclaration(target: Target):
    queue = unique("prio")
    with target.amqp() as connection:
        connection.channel().queue_declare(queue, auto_delete=True, arguments={"x-max-priority": 10})
        texts = []
        for arguments in ({"x-max-priority": 5}, {}):
            with pytest.raises(ChannelClosedByBroker) as caught:
                connection.channel().queue_declare(queue, auto_delete=True, arguments=arguments)
            texts.append(caught.value.reply_text)
        connection.channel().queue_delete(queue)
    where = f"for queue '{queue}' in vhost '/'"
    assert texts == [
        f"PRECONDITION_FAILED - inequivalent arg 'x-max-priority' {where}: received '5' but current is '10'",
        f"PRECONDITION_FAILED - inequivalent arg 'x-max-priority' {where}: received none but current "
        "is the value '10' of type 'signedint'",
    ]


def test_a_stream_refuses_max_priority(target: Target):
    queue = unique("prio-stream")
    with target.amqp() as connection, pytest.raises(ChannelClosedByBroker) as caught:
        connection.channel().queue_declare(
            queue, durable=True, arguments={"x-queue-type": "stream", "x-max-priority": 5})
    assert caught.value.reply_text == (
        f"PRECONDITION_FAILED - invalid arg 'x-max-priority' for queue '{queue}' in vhost '/' "
        "of queue type rabbit_stream_queue")


# -- order ------------------------------------------------------------------------------------
def test_basic_get_takes_the_highest_priority_first_and_fifo_within_one(target: Target):
    queue = unique("prio")
    with target.amqp() as connection:
        ch = confirming(connection)
        ch.queue_declare(queue, auto_delete=True, arguments={"x-max-priority": 10})
        publish(ch, queue, PRIORITIES)
        assert get_all(ch, queue) == ORDER_10
        ch.queue_delete(queue)


@pytest.mark.parametrize(("max_priority", "order"), [
    (0, [f"{i}:{p}" for i, p in enumerate(PRIORITIES)]),  # one level: FIFO
    (1, ["2:5", "3:10", "4:11", "5:200", "6:3", "7:5", "8:255", "9:10", "11:1", "0:None", "1:0",
         "10:None"]),
    (255, ["8:255", "5:200", "4:11", "3:10", "9:10", "2:5", "7:5", "6:3", "11:1", "0:None", "1:0",
           "10:None"]),
])
def test_the_maximum_caps_message_priorities(target: Target, max_priority, order):
    queue = unique("prio")
    with target.amqp() as connection:
        ch = confirming(connection)
        ch.queue_declare(queue, auto_delete=True, arguments={"x-max-priority": max_priority})
        publish(ch, queue, PRIORITIES)
        assert get_all(ch, queue) == order
        ch.queue_delete(queue)


def test_a_consumer_gets_the_highest_priority_first_and_keeps_the_message_priority(target: Target):
    queue = unique("prio")
    with target.amqp() as connection:
        ch = confirming(connection)
        ch.queue_declare(queue, auto_delete=True, arguments={"x-max-priority": 10})
        publish(ch, queue, PRIORITIES)
        got: list[tuple[str, int | None]] = []
        consumer = connection.channel()
        consumer.basic_qos(prefetch_count=3)

        def on_message(channel, method, properties, body):
            got.append((body.decode(), properties.priority))
            channel.basic_ack(method.delivery_tag)

        consumer.basic_consume(queue, on_message)
        eventually(lambda: len(got) >= len(PRIORITIES), 5, 0.05, pumping(connection))
        assert [body for body, _ in got] == ORDER_10
        assert [priority for _, priority in got] == [10, 11, 200, 255, 10, 5, 5, 3, 1, None, 0, None]
        ch.queue_delete(queue)


def test_a_requeued_message_goes_back_to_its_place_within_its_priority(target: Target):
    queue = unique("prio")
    with target.amqp() as connection:
        ch = confirming(connection)
        ch.queue_declare(queue, auto_delete=True, arguments={"x-max-priority": 5})
        publish(ch, queue, [1, 5, 3, 5, 1, 3, 9])
        taken = [ch.basic_get(queue) for _ in range(4)]
        assert [body for _, _, body in taken] == [b"1:5", b"3:5", b"6:9", b"2:3"]
        ch.basic_ack(taken[0][0].delivery_tag)
        for index in (1, 3, 2):
            ch.basic_nack(taken[index][0].delivery_tag, requeue=True)
        out = []
        while (got := ch.basic_get(queue, auto_ack=True))[0] is not None:
            out.append((got[2].decode(), got[0].redelivered))
        assert out == [("3:5", True), ("6:9", True), ("2:3", True), ("5:3", False), ("0:1", False),
                       ("4:1", False)]
        ch.queue_delete(queue)


# -- length limits, dead-lettering, paging -------------------------------------------------
def test_drop_head_drops_the_highest_priority_message(target: Target):
    queue = unique("prio")
    with target.amqp() as connection:
        ch = confirming(connection)
        ch.queue_declare(queue, auto_delete=True, arguments={"x-max-priority": 10, "x-max-length": 3})
        publish(ch, queue, [1, 5, 3, 9, 0, 5])
        # 9 arrives: the head (9 itself) goes; then 0 and 5 push out a 5 each
        assert get_all(ch, queue) == ["2:3", "0:1", "4:0"]
        ch.queue_delete(queue)


def test_reject_publish_nacks_whatever_the_priority(target: Target):
    queue = unique("prio")
    with target.amqp() as connection:
        ch = confirming(connection)
        ch.queue_declare(queue, auto_delete=True, arguments={
            "x-max-priority": 10, "x-max-length": 3, "x-overflow": "reject-publish"})
        results = []
        for i, priority in enumerate([1, 5, 3, 9, 0]):
            try:
                ch.basic_publish("", queue, f"{i}:{priority}".encode(),
                                 pika.BasicProperties(priority=priority))
                results.append("ack")
            except pika.exceptions.NackError:
                results.append("nack")
        assert results == ["ack", "ack", "ack", "nack", "nack"]
        assert get_all(ch, queue) == ["1:5", "2:3", "0:1"]
        ch.queue_delete(queue)


def test_dead_letters_keep_their_priority(target: Target):
    source, dlq = unique("prio-src"), unique("prio-dlq")
    with target.amqp() as connection:
        ch = confirming(connection)
        ch.queue_declare(dlq, auto_delete=True, arguments={"x-max-priority": 10})
        ch.queue_declare(source, auto_delete=True, arguments={
            "x-max-priority": 10, "x-message-ttl": 50, "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": dlq})
        publish(ch, source, [1, 7, 3, 20])
        eventually(lambda: ch.queue_declare(dlq, passive=True).method.message_count >= 4, 5, 0.05)
        got = []
        while (message := ch.basic_get(dlq, auto_ack=True))[0] is not None:
            got.append((message[2].decode(), message[1].priority))
        assert got == [("3:20", 20), ("1:7", 7), ("2:3", 3), ("0:1", 1)]
        ch.queue_delete(source)
        ch.queue_delete(dlq)


def test_a_lazy_priority_queue_with_a_large_backlog_delivers_in_priority_order(target: Target):
    """leveret keeps 1,000 messages of a lazy queue in memory and pages out the rest:
    high-priority messages published last, all on disk, still come first."""
    queue = unique("prio-lazy")
    rng = random.Random(7)
    priorities = [rng.randrange(10) for _ in range(3000)] + [9] * 20
    with target.amqp() as connection:
        ch = confirming(connection)
        ch.queue_declare(queue, auto_delete=True, arguments={"x-max-priority": 9, "x-queue-mode": "lazy"})
        publish(ch, queue, priorities)
        got: list[str] = []
        consumer = connection.channel()
        consumer.basic_qos(prefetch_count=200)

        def on_message(channel, method, properties, body):
            got.append(body.decode())
            channel.basic_ack(method.delivery_tag)

        consumer.basic_consume(queue, on_message)
        deadline = time.monotonic() + 60
        while len(got) < len(priorities) and time.monotonic() < deadline:
            connection.process_data_events(time_limit=0.05)
        expected = [f"{i}:{p}" for i, p in sorted(enumerate(priorities), key=lambda ip: (-ip[1], ip[0]))]
        assert got == expected
        ch.queue_delete(queue)


# -- other clients ---------------------------------------------------------------------------
def test_aio_pika_consumer_gets_the_highest_priority_first(target: Target):
    queue_name = unique("prio-aio")

    async def run() -> list[bytes]:
        connection = await aio_pika.connect(target.url())
        async with connection:
            channel = await connection.channel(publisher_confirms=True)
            queue = await channel.declare_queue(queue_name, auto_delete=True,
                                                arguments={"x-max-priority": 9})
            for i, priority in enumerate([2, 9, 0, 5, 9, 2]):
                await channel.default_exchange.publish(
                    aio_pika.Message(b"%d" % i, priority=priority), routing_key=queue_name)
            got = []
            async with queue.iterator() as messages:
                async for message in messages:
                    async with message.process():
                        got.append(message.body)
                    if len(got) == 6:
                        break
            return got

    assert asyncio.run(asyncio.wait_for(run(), 30)) == [b"1", b"4", b"3", b"0", b"5", b"2"]


def test_a_stomp_consumer_gets_the_highest_stomp_priority_first():
    """SEND's ``priority`` header (0-9, 4 when absent as in JMS) is the message priority."""
    with BlockingBroker(amqp_port=0, stomp_port=0) as running:
        with pika.BlockingConnection(pika.URLParameters(running.amqp_url)) as connection:
            connection.channel().queue_declare("stomp-prio", arguments={"x-max-priority": 9})
        port = running.broker.stomp_port
        with Client(port) as producer, Client(port) as consumer:
            for body, priority in [("a", "1"), ("b", "9"), ("c", None), ("d", "7"), ("e", "9"), ("f", "0")]:
                headers = {"priority": priority} if priority is not None else {}
                producer.send("/queue/stomp-prio", body, **headers)
            consumer.subscribe("/queue/stomp-prio", ack="client-individual")
            frames = [consumer.message() for _ in range(6)]
            assert [f.body for f in frames] == [b"b", b"e", b"d", b"c", b"a", b"f"]
            assert [f.headers["priority"] for f in frames] == ["9", "9", "7", "4", "1", "0"]


# -- restart ---------------------------------------------------------------------------------
def test_priorities_and_paged_messages_survive_kill_9(tmp_path: Path):
    data = tmp_path / "data"
    rng = random.Random(3)
    priorities = [rng.randrange(6) for _ in range(400)]
    server = ServerProcess(data)
    try:
        with pika.BlockingConnection(pika.URLParameters(server.url)) as connection:
            ch = confirming(connection)
            ch.queue_declare("prio-durable", durable=True,
                             arguments={"x-max-priority": 5, "x-max-in-memory-length": 50})
            publish(ch, "prio-durable", priorities, persistent=True)
            method, _, body = ch.basic_get("prio-durable")
            first = f"{priorities.index(5)}:5"
            assert body.decode() == first
            ch.basic_nack(method.delivery_tag, requeue=True)  # delivered once: redelivered later
            # store writes are durable in order: once this is confirmed, so is the count
            ch.queue_declare("barrier", durable=True)
            ch.basic_publish("", "barrier", b"", pika.BasicProperties(delivery_mode=2))
    finally:
        server.proc.kill()  # kill -9
        server.proc.wait()
    again = ServerProcess(data)
    try:
        with pika.BlockingConnection(pika.URLParameters(again.url)) as connection:
            ch = confirming(connection)
            ch.basic_publish("", "prio-durable", b"new:5", pika.BasicProperties(priority=5, delivery_mode=2))
            got = []
            while (message := ch.basic_get("prio-durable", auto_ack=True))[0] is not None:
                got.append((message[2].decode(), message[0].redelivered))
    finally:
        again.kill()
    expected = [f"{i}:{p}" for i, p in sorted(enumerate(priorities), key=lambda ip: (-ip[1], ip[0]))]
    expected.insert(priorities.count(5), "new:5")
    assert [body for body, _ in got] == expected
    assert [body for body, redelivered in got if redelivered] == [first]
