"""aio-pika (asyncio, aiormq/pamqp underneath) against leveret over real TCP.

Each test runs its own event loop with ``asyncio.run`` and an in-loop
:class:`leveret.Broker`, so pytest-asyncio is not needed.
"""

from __future__ import annotations

import asyncio
import datetime
import decimal
import uuid
from collections.abc import Awaitable, Callable

import aio_pika
import pytest
from pamqp import commands

import leveret

TIMEOUT = 10


def run(test: Callable[[str], Awaitable[None]]) -> None:
    """Run ``test(amqp_url)`` in a fresh event loop next to an in-loop broker."""

    async def main() -> None:
        async with leveret.Broker(amqp_port=0) as broker:
            await asyncio.wait_for(test(broker.amqp_url), TIMEOUT * 2)

    asyncio.run(main())


async def message_count(channel: aio_pika.abc.AbstractChannel, queue: str) -> int:
    """Ready messages in ``queue`` from a passive queue.declare (through aiormq: a robust
    channel answers a repeated declare_queue from its cache)."""
    underlay = await channel.get_underlay_channel()
    declare_ok = await underlay.queue_declare(queue, passive=True)
    return declare_ok.message_count


async def get_one(queue: aio_pika.abc.AbstractQueue) -> aio_pika.abc.AbstractIncomingMessage:
    """The next message from ``queue`` through a consumer (acked by the caller)."""
    async with queue.iterator() as messages:
        async for message in messages:
            return message
    raise AssertionError("queue iterator ended")


def test_connect_robust_declare_publish_consume_ack():
    async def body(url: str) -> None:
        connection = await aio_pika.connect_robust(url)
        async with connection:
            channel = await connection.channel()
            exchange = await channel.declare_exchange("orders", aio_pika.ExchangeType.TOPIC)
            queue = await channel.declare_queue("order-events", durable=True)
            await queue.bind(exchange, "order.*")
            for i in range(3):
                await exchange.publish(aio_pika.Message(b"order %d" % i), routing_key="order.created")
            await exchange.publish(aio_pika.Message(b"unrouted"), routing_key="invoice.created")

            received = []
            async with queue.iterator() as messages:
                async for message in messages:
                    async with message.process():  # acks on exit
                        received.append(message.body)
                        assert message.routing_key == "order.created"
                        assert message.exchange == "orders"
                    if len(received) == 3:
                        break
            assert received == [b"order 0", b"order 1", b"order 2"]
            # All acked: nothing left, nothing redelivered.
            assert await message_count(channel, "order-events") == 0
            assert await queue.get(fail=False) is None

    run(body)


def test_unacked_message_is_redelivered_after_channel_close():
    async def body(url: str) -> None:
        async with await aio_pika.connect_robust(url) as connection:
            channel = await connection.channel()
            queue = await channel.declare_queue("redeliver")
            await channel.default_exchange.publish(aio_pika.Message(b"x"), routing_key="redeliver")
            first = await queue.get(no_ack=False)
            assert first.redelivered is False
            await channel.close()

            channel = await connection.channel()
            queue = await channel.declare_queue("redeliver")
            again = await queue.get()
            assert again.body == b"x" and again.redelivered is True
            await again.ack()

    run(body)


def test_prefetch_limits_unacked_deliveries():
    async def body(url: str) -> None:
        async with await aio_pika.connect_robust(url) as connection:
            channel = await connection.channel()
            await channel.set_qos(prefetch_count=2)
            queue = await channel.declare_queue("prefetched")
            for i in range(5):
                await channel.default_exchange.publish(aio_pika.Message(b"%d" % i), routing_key="prefetched")

            delivered: asyncio.Queue = asyncio.Queue()
            await queue.consume(delivered.put)
            first = [await asyncio.wait_for(delivered.get(), TIMEOUT) for _ in range(2)]
            await asyncio.sleep(0.3)
            assert delivered.empty(), "a third message arrived with two unacked and prefetch 2"
            await first[0].ack()
            third = await asyncio.wait_for(delivered.get(), TIMEOUT)
            assert [m.body for m in (*first, third)] == [b"0", b"1", b"2"]
            await asyncio.sleep(0.2)
            assert delivered.empty()
            await first[1].ack()
            await third.ack()
            rest = [await asyncio.wait_for(delivered.get(), TIMEOUT) for _ in range(2)]
            assert [m.body for m in rest] == [b"3", b"4"]
            for message in rest:
                await message.ack()

    run(body)


def test_publisher_confirms_ack_every_publish():
    async def body(url: str) -> None:
        async with await aio_pika.connect_robust(url) as connection:
            channel = await connection.channel()  # publisher_confirms=True by default
            queue = await channel.declare_queue("confirmed")
            confirmations = await asyncio.gather(*(
                channel.default_exchange.publish(aio_pika.Message(b"m%d" % i), routing_key="confirmed")
                for i in range(200)))
            assert all(isinstance(c, commands.Basic.Ack) for c in confirmations)
            assert queue.declaration_result.message_count == 0
            assert await message_count(channel, "confirmed") == 200

    run(body)


def test_mandatory_unroutable_publish_is_returned():
    async def body(url: str) -> None:
        async with await aio_pika.connect_robust(url) as connection:
            channel = await connection.channel(on_return_raises=True)
            with pytest.raises(aio_pika.exceptions.DeliveryError) as info:
                await channel.default_exchange.publish(
                    aio_pika.Message(b"lost"), routing_key="no-such-queue", mandatory=True)
            assert info.value.message.body == b"lost"

    run(body)


def test_rpc_with_direct_reply_to():
    async def body(url: str) -> None:
        async with await aio_pika.connect_robust(url) as connection:
            server_channel = await connection.channel()
            requests = await server_channel.declare_queue("rpc.square")

            async def serve(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                async with message.process():
                    assert message.reply_to.startswith("amq.rabbitmq.reply-to.")
                    n = int(message.body)
                    await server_channel.default_exchange.publish(
                        aio_pika.Message(str(n * n).encode(), correlation_id=message.correlation_id),
                        routing_key=message.reply_to)

            await requests.consume(serve)

            client_channel = await connection.channel()
            reply_queue = await client_channel.get_queue("amq.rabbitmq.reply-to", ensure=False)
            replies: dict[str, asyncio.Future] = {}

            async def on_reply(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                replies.pop(message.correlation_id).set_result(message.body)

            await reply_queue.consume(on_reply, no_ack=True)

            async def call(n: int) -> int:
                correlation_id = str(uuid.uuid4())
                future = replies[correlation_id] = asyncio.get_running_loop().create_future()
                await client_channel.default_exchange.publish(
                    aio_pika.Message(str(n).encode(), correlation_id=correlation_id,
                                     reply_to="amq.rabbitmq.reply-to"),
                    routing_key="rpc.square")
                return int(await asyncio.wait_for(future, TIMEOUT))

            assert await asyncio.gather(*(call(n) for n in range(10))) == [n * n for n in range(10)]

    run(body)


def test_rpc_helper_from_aio_pika_patterns():
    """aio_pika.patterns.RPC uses its own exclusive reply queue and headers."""
    from aio_pika.patterns import RPC

    async def body(url: str) -> None:
        async with await aio_pika.connect_robust(url) as connection:
            channel = await connection.channel()
            # The result queue is auto-delete: RPC.close() cancels its consumer (the
            # queue goes) and then unbinds it, which is unbind-ok, as in RabbitMQ.
            rpc = await RPC.create(channel)

            async def multiply(*, x: int, y: int) -> int:
                return x * y

            await rpc.register("multiply", multiply, auto_delete=True)
            assert await asyncio.wait_for(rpc.call("multiply", kwargs={"x": 6, "y": 7}), TIMEOUT) == 42
            await rpc.close()

    run(body)


def test_large_message_round_trip_split_across_frames():
    payload = bytes(range(256)) * (5 * 1024 * 1024 // 256) + b"tail"

    async def body(url: str) -> None:
        async with await aio_pika.connect_robust(url) as connection:
            channel = await connection.channel()
            queue = await channel.declare_queue("large")
            # frame_max is 131072, so 5 MB travels as ~41 body frames each way.
            assert connection.transport.connection.connection_tune.frame_max <= 131072
            await channel.default_exchange.publish(aio_pika.Message(payload), routing_key="large")
            message = await get_one(queue)
            await message.ack()
            assert message.body_size == len(payload)
            assert message.body == payload

    run(body)


HEADERS = {
    "str": "text ünïcode",
    "empty-str": "",
    "bytes": bytearray(b"\x00\x01raw\xff"),  # pamqp encodes bytearray as 'x'
    "int-tiny": 7,
    "int-negative": -100,
    "int-short": 30000,
    "int-long": 2_000_000_000,
    "int-longlong": 9_000_000_000_000,
    "int-negative-longlong": -9_000_000_000_000,
    "bool-true": True,
    "bool-false": False,
    "float": 2.5,  # pamqp sends a 32-bit float: pick an exact one
    "decimal": decimal.Decimal("12.34"),
    "datetime": datetime.datetime(2024, 5, 17, 12, 30, 45, tzinfo=datetime.UTC),
    "none": None,
    "nested": {"a": 1, "b": "two", "c": {"deep": [1, "x", True]}},
    "list": [1, "two", 3.5, None, bytearray(b"bytes"), {"k": "v"}, [True, False]],
    "empty-list": [],
    "empty-table": {},
}


def assert_headers_equal(received: dict, sent: dict) -> None:
    assert set(received) == set(sent)
    for key, value in sent.items():
        got = received[key]
        if isinstance(value, datetime.datetime):
            # AMQP timestamps are whole seconds; pamqp may decode them naive or aware.
            got_utc = got if got.tzinfo else got.replace(tzinfo=datetime.UTC)
            assert got_utc == value, key
        else:
            assert got == value, key
            assert type(got) is type(value), key


def test_headers_table_with_every_field_type_round_trips():
    async def body(url: str) -> None:
        async with await aio_pika.connect_robust(url) as connection:
            channel = await connection.channel()
            queue = await channel.declare_queue("typed-headers")
            await channel.default_exchange.publish(
                aio_pika.Message(b"h", headers=HEADERS), routing_key="typed-headers")
            message = await get_one(queue)
            await message.ack()
            assert_headers_equal(message.headers, HEADERS)

    run(body)


def test_basic_properties_round_trip():
    timestamp = datetime.datetime(2023, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    # pamqp refuses to encode cluster_id (deprecated in 0-9-1), so this covers the other
    # 13; tests/test_pika_select.py round-trips all 14 with pika.
    properties = commands.Basic.Properties(
        content_type="application/json",
        content_encoding="gzip",
        headers={"x-custom": "v", "n": 42, "nested": {"k": [1, 2]}},
        delivery_mode=2,
        priority=7,
        correlation_id="corr-123",
        reply_to="some-reply-queue",
        expiration="600000",
        message_id="msg-456",
        timestamp=timestamp,
        message_type="order.created",
        user_id="guest",
        app_id="leveret-tests",
    )

    async def body(url: str) -> None:
        async with await aio_pika.connect_robust(url) as connection:
            channel = await connection.channel()
            queue = await channel.declare_queue("props")
            # Publish the raw pamqp properties through the aiormq channel underneath.
            await (await channel.get_underlay_channel()).basic_publish(
                b'{"id": 1}', exchange="", routing_key="props", properties=properties)
            message = await get_one(queue)
            await message.ack()
            assert message.body == b'{"id": 1}'
            assert message.content_type == "application/json"
            assert message.content_encoding == "gzip"
            assert message.headers == {"x-custom": "v", "n": 42, "nested": {"k": [1, 2]}}
            assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
            assert message.priority == 7
            assert message.correlation_id == "corr-123"
            assert message.reply_to == "some-reply-queue"
            assert message.expiration == 600.0  # aio-pika decodes ms to seconds
            assert message.message_id == "msg-456"
            assert message.timestamp.replace(tzinfo=datetime.UTC) == timestamp
            assert message.type == "order.created"
            assert message.user_id == "guest"
            assert message.app_id == "leveret-tests"
            assert not message.cluster_id

    run(body)


def test_properties_set_through_aio_pika_message_round_trip():
    async def body(url: str) -> None:
        async with await aio_pika.connect_robust(url) as connection:
            channel = await connection.channel()
            queue = await channel.declare_queue("message-props")
            sent = aio_pika.Message(
                b"payload", headers={"h": "v"}, content_type="text/plain", content_encoding="utf-8",
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT, priority=3, correlation_id="c",
                reply_to="r", expiration=30, message_id="m",
                timestamp=datetime.datetime(2022, 2, 2, 2, 2, 2, tzinfo=datetime.UTC),
                type="t", user_id="guest", app_id="a")
            await channel.default_exchange.publish(sent, routing_key="message-props")
            got = await get_one(queue)
            await got.ack()
            for name in ("body", "headers", "content_type", "content_encoding", "delivery_mode",
                         "priority", "correlation_id", "reply_to", "expiration", "message_id",
                         "type", "user_id", "app_id"):
                assert getattr(got, name) == getattr(sent, name), name
            assert got.timestamp.replace(tzinfo=datetime.UTC) == sent.timestamp

    run(body)


def test_exchange_to_exchange_and_headers_exchange_with_aio_pika():
    async def body(url: str) -> None:
        async with await aio_pika.connect_robust(url) as connection:
            channel = await connection.channel()
            front = await channel.declare_exchange("front", aio_pika.ExchangeType.FANOUT)
            by_headers = await channel.declare_exchange("by-headers", aio_pika.ExchangeType.HEADERS)
            await by_headers.bind(front)
            queue = await channel.declare_queue("pdf-reports", exclusive=True)
            await queue.bind(by_headers, arguments={"x-match": "all", "format": "pdf", "type": "report"})
            await front.publish(aio_pika.Message(b"yes", headers={"format": "pdf", "type": "report"}), "")
            await front.publish(aio_pika.Message(b"no", headers={"format": "pdf"}), "")
            message = await get_one(queue)
            await message.ack()
            assert message.body == b"yes"
            assert await queue.get(fail=False) is None

    run(body)


def test_queue_delete_cancels_aio_pika_consumer():
    async def body(url: str) -> None:
        async with await aio_pika.connect_robust(url) as connection:
            channel = await connection.channel()
            queue = await channel.declare_queue("doomed")
            async def ignore(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                pass

            await queue.consume(ignore)
            underlay = await channel.get_underlay_channel()
            assert len(underlay.consumers) == 1
            other = await connection.channel()
            assert await other.queue_delete("doomed") is not None
            # The broker's basic.cancel makes aiormq drop the consumer.
            for _ in range(50):
                if not underlay.consumers:
                    break
                await asyncio.sleep(0.05)
            assert not underlay.consumers
            assert not channel.is_closed

    run(body)
