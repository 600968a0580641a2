"""FastStream's RabbitBroker (aio-pika underneath) against leveret and a RabbitMQ 3.10
node: subscribers on queues bound to direct, topic, fanout and headers exchanges and to
exchange-to-exchange bindings, publishers chained from handlers, RPC with
``broker.request`` (direct reply-to), acknowledgement policies with dead-lettering, a
quorum queue's delivery limit, leveret's built-in ``x-delayed-message`` exchange, and
``TestRabbitBroker(broker, with_real=True)``.

Every test runs its own event loop (``asyncio.run``) and names its queues and exchanges
uniquely, since the RabbitMQ node is shared by the session.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from aio_pika.exceptions import DeliveryError
from faststream import AckPolicy
from faststream.rabbit import (
    Channel,
    ExchangeType,
    QueueType,
    RabbitBroker,
    RabbitExchange,
    RabbitMessage,
    RabbitQueue,
    TestRabbitBroker,
)
from framework_brokers import AmqpBroker, _amqp_broker, _framework_rabbitmq, run, unique, until  # noqa: F401 (fixtures)

pytestmark = pytest.mark.timeout(60)


def new_broker(amqp: AmqpBroker) -> RabbitBroker:
    return RabbitBroker(amqp.url, logger=None)


def collect(into: list) -> Callable[[Any], Coroutine[Any, Any, None]]:
    """A handler appending each decoded body to ``into`` (FastStream reads the handler's
    signature to decode: a plain ``list.append`` or a lambda with defaults would not do)."""

    async def handle(payload: Any) -> None:
        into.append(payload)

    return handle


def test_direct_exchange_round_trip_with_json_and_properties(amqp_broker):
    async def body():
        broker = new_broker(amqp_broker)
        exchange = RabbitExchange(unique("fs-direct"), auto_delete=True)
        queue = RabbitQueue(unique("fs-q"), auto_delete=True, routing_key="orders")
        got: list[tuple[Any, str, dict, int | None, str | None]] = []

        @broker.subscriber(queue, exchange)
        async def handle(payload: dict, message: RabbitMessage) -> None:
            raw = message.raw_message
            got.append((payload, raw.routing_key, raw.headers, raw.priority, message.correlation_id))

        async with broker:
            await broker.start()
            await broker.publish({"id": 1, "items": ["a"]}, exchange=exchange, routing_key="orders",
                                 headers={"tenant": "acme"}, priority=3, correlation_id="c-1")
            await broker.publish({"id": 2}, exchange=exchange, routing_key="other")  # unroutable
            await until(lambda: got, what="the order")
            await asyncio.sleep(0.05)  # the unroutable one never comes
        assert got == [({"id": 1, "items": ["a"]}, "orders", {"tenant": "acme"}, 3, "c-1")]

    run(body)


def test_topic_exchange_patterns(amqp_broker):
    async def body():
        broker = new_broker(amqp_broker)
        exchange = RabbitExchange(unique("fs-topic"), type=ExchangeType.TOPIC, auto_delete=True)
        seen: dict[str, list[str]] = {"star": [], "hash": [], "exact": []}
        for name, key in (("star", "orders.*"), ("hash", "#.eu"), ("exact", "orders.created.eu")):
            queue = RabbitQueue(unique(f"fs-{name}"), auto_delete=True, routing_key=key)

            def handler(name: str = name):
                async def handle(payload: str, message: RabbitMessage) -> None:
                    seen[name].append(message.raw_message.routing_key)
                return handle

            broker.subscriber(queue, exchange)(handler())

        keys = ["orders.created", "orders.created.eu", "eu", "orders", "billing.eu", "orders.x.y"]
        async with broker:
            await broker.start()
            for key in keys:
                await broker.publish("x", exchange=exchange, routing_key=key)
            await until(lambda: sum(map(len, seen.values())) == 5, what="5 deliveries")
            await asyncio.sleep(0.05)
        # (aio-pika runs each delivery's handler as a task: compare without order)
        assert {name: sorted(keys) for name, keys in seen.items()} == {
            "star": ["orders.created"], "hash": ["billing.eu", "eu", "orders.created.eu"],
            "exact": ["orders.created.eu"]}

    run(body)


def test_fanout_reaches_every_bound_queue(amqp_broker):
    async def body():
        broker = new_broker(amqp_broker)
        exchange = RabbitExchange(unique("fs-fanout"), type=ExchangeType.FANOUT, auto_delete=True)
        got: dict[int, list[int]] = {0: [], 1: [], 2: []}
        for n in got:
            broker.subscriber(RabbitQueue(unique(f"fs-f{n}"), auto_delete=True), exchange)(
                collect(got[n]))
        async with broker:
            await broker.start()
            for i in range(3):
                await broker.publish(i, exchange=exchange, routing_key="ignored")
            await until(lambda: all(len(v) == 3 for v in got.values()), what="3 x 3 deliveries")
        assert all(sorted(v) == [0, 1, 2] for v in got.values())

    run(body)


def test_headers_exchange_all_and_any(amqp_broker):
    async def body():
        broker = new_broker(amqp_broker)
        exchange = RabbitExchange(unique("fs-headers"), type=ExchangeType.HEADERS, auto_delete=True)
        seen: dict[str, list[str]] = {"all": [], "any": []}
        matches = {"all": {"x-match": "all", "region": "eu", "kind": "order"},
                   "any": {"x-match": "any", "region": "us", "kind": "refund"}}
        for name, bind in matches.items():
            queue = RabbitQueue(unique(f"fs-h{name}"), auto_delete=True, bind_arguments=bind)
            broker.subscriber(queue, exchange)(collect(seen[name]))
        async with broker:
            await broker.start()
            for label, headers in (("eu-order", {"region": "eu", "kind": "order"}),
                                   ("eu-refund", {"region": "eu", "kind": "refund"}),
                                   ("us-order", {"region": "us", "kind": "order", "extra": 1}),
                                   ("none", {"region": "asia"})):
                await broker.publish(label, exchange=exchange, headers=headers)
            await until(lambda: len(seen["all"]) == 1 and len(seen["any"]) == 2, what="3 deliveries")
            await asyncio.sleep(0.05)
        assert {name: sorted(v) for name, v in seen.items()} == {"all": ["eu-order"],
                                                                 "any": ["eu-refund", "us-order"]}

    run(body)


def test_exchange_to_exchange_binding(amqp_broker):
    async def body():
        broker = new_broker(amqp_broker)
        upstream = RabbitExchange(unique("fs-up"), type=ExchangeType.TOPIC, auto_delete=True)
        downstream = RabbitExchange(unique("fs-down"), type=ExchangeType.FANOUT, auto_delete=True,
                                    bind_to=upstream, routing_key="audit.#")
        got: list[str] = []
        broker.subscriber(RabbitQueue(unique("fs-audit"), auto_delete=True), downstream)(collect(got))
        async with broker:
            await broker.start()
            await broker.publish("a", exchange=upstream, routing_key="audit.login")
            await broker.publish("b", exchange=upstream, routing_key="metrics.cpu")
            await broker.publish("c", exchange=upstream, routing_key="audit.logout.eu")
            await until(lambda: len(got) == 2, what="2 audit messages")
            await asyncio.sleep(0.05)
        assert sorted(got) == ["a", "c"]

    run(body)


def test_rpc_request_reply_and_chained_publisher(amqp_broker):
    async def body():
        broker = new_broker(amqp_broker)
        square_q, results_q = unique("fs-square"), unique("fs-results")
        chained: list[int] = []

        @broker.subscriber(RabbitQueue(square_q, auto_delete=True))
        @broker.publisher(results_q)
        async def square(n: int) -> int:
            return n * n

        broker.subscriber(RabbitQueue(results_q, auto_delete=True))(collect(chained))

        async with broker:
            await broker.start()
            # request(): publishes with reply_to amq.rabbitmq.reply-to, waits on that
            # pseudo-queue (direct reply-to: no reply queue is declared)
            replies = [await broker.request(n, square_q, timeout=5) for n in (3, 4)]
            assert [await r.decode() for r in replies] == [9, 16]
            assert all(r.correlation_id for r in replies)
            # the return value also goes to the @publisher's queue
            await until(lambda: len(chained) == 2, what="the chained publishes")
        assert sorted(chained) == [9, 16]

    run(body)


def test_concurrent_requests_get_their_own_replies(amqp_broker):
    async def body():
        broker = new_broker(amqp_broker)
        queue = unique("fs-echo")

        @broker.subscriber(RabbitQueue(queue, auto_delete=True))
        async def echo(text: str) -> str:
            await asyncio.sleep(0.001 * (len(text) % 5))
            return text.upper()

        async with broker:
            await broker.start()
            words = [f"word{i}" for i in range(30)]
            replies = await asyncio.gather(*(broker.request(w, queue, timeout=5) for w in words))
            assert [await r.decode() for r in replies] == [w.upper() for w in words]

    run(body)


def test_reject_on_error_dead_letters(amqp_broker):
    async def body():
        broker = new_broker(amqp_broker)
        dlx = RabbitExchange(unique("fs-dlx"), type=ExchangeType.FANOUT, auto_delete=True)
        dead_q = RabbitQueue(unique("fs-dead"), auto_delete=True)
        work_q = RabbitQueue(unique("fs-work"), auto_delete=True,
                             arguments={"x-dead-letter-exchange": dlx.name})
        attempts: list[int] = []
        dead: list[tuple[int, str]] = []

        @broker.subscriber(work_q, ack_policy=AckPolicy.REJECT_ON_ERROR)
        async def work(n: int) -> None:
            attempts.append(n)
            if n % 2:
                raise ValueError("odd")

        @broker.subscriber(dead_q, dlx)
        async def on_dead(n: int, message: RabbitMessage) -> None:
            death = message.raw_message.headers["x-death"][0]
            dead.append((n, death["reason"]))

        async with broker:
            await broker.start()
            for n in range(4):
                await broker.publish(n, work_q)
            await until(lambda: len(dead) == 2, what="2 dead letters")
        assert sorted(attempts) == [0, 1, 2, 3]
        assert sorted(dead) == [(1, "rejected"), (3, "rejected")]

    run(body)


def test_nack_on_error_requeues_up_to_a_quorum_delivery_limit(amqp_broker):
    async def body():
        broker = new_broker(amqp_broker)
        dead_q = RabbitQueue(unique("fs-qdead"), auto_delete=True)
        work_q = RabbitQueue(unique("fs-quorum"), queue_type=QueueType.QUORUM,
                             arguments={"x-delivery-limit": 2, "x-dead-letter-exchange": "",
                                        "x-dead-letter-routing-key": dead_q.name})
        attempts: list[bool] = []
        dead: list[str] = []

        @broker.subscriber(work_q, ack_policy=AckPolicy.NACK_ON_ERROR)
        async def work(text: str, message: RabbitMessage) -> None:
            attempts.append(message.raw_message.redelivered)
            raise RuntimeError("always")

        broker.subscriber(dead_q)(collect(dead))
        async with broker:
            await broker.start()
            await broker.publish("poison", work_q.name)
            await until(lambda: dead, what="the dead letter")
        # delivered once and redelivered up to the limit (2), then dead-lettered
        assert attempts == [False, True, True]
        assert dead == ["poison"]
        await _delete_queue(amqp_broker, work_q.name)

    run(body)


def test_delayed_message_exchange(amqp_broker):
    amqp_broker.require_delayed_exchange()

    async def body():
        broker = new_broker(amqp_broker)
        exchange = RabbitExchange(unique("fs-delayed"), type=ExchangeType.X_DELAYED_MESSAGE,
                                  arguments={"x-delayed-type": "direct"}, auto_delete=True)
        got: list[tuple[str, float, Any]] = []

        @broker.subscriber(RabbitQueue(unique("fs-later"), auto_delete=True, routing_key="later"),
                           exchange)
        async def later(text: str, message: RabbitMessage) -> None:
            got.append((text, time.monotonic(), message.raw_message.headers.get("x-delay")))

        async with broker:
            await broker.start()
            sent = time.monotonic()
            await broker.publish("slow", exchange=exchange, routing_key="later", headers={"x-delay": 400})
            await broker.publish("fast", exchange=exchange, routing_key="later", headers={"x-delay": 50})
            await until(lambda: len(got) == 2, what="2 delayed messages")
        assert [text for text, _, _ in got] == ["fast", "slow"]
        assert got[1][1] - sent >= 0.4
        assert got[1][2] == -400  # the plugin's negated x-delay on delivery

    run(body)


def test_test_broker_with_real_connection(amqp_broker):
    async def body():
        broker = new_broker(amqp_broker)
        queue, out = unique("fs-real"), unique("fs-out")

        @broker.subscriber(RabbitQueue(queue, auto_delete=True))
        @broker.publisher(out)
        async def handle(payload: dict) -> dict:
            return {"seen": payload["n"]}

        outputs: list[dict] = []
        broker.subscriber(RabbitQueue(out, auto_delete=True))(collect(outputs))

        async with TestRabbitBroker(broker, with_real=True) as test_broker:
            await test_broker.publish({"n": 1}, queue)
            await handle.wait_call(timeout=5)
            handle.mock.assert_called_once_with({"n": 1})
            await until(lambda: outputs, what="the published result")
            assert outputs == [{"seen": 1}]
            reply = await test_broker.request({"n": 2}, queue, timeout=5)
            assert await reply.decode() == {"seen": 2}

    run(body)


def test_stream_queue_replayed_from_the_first_offset(amqp_broker):
    async def body():
        name = unique("fs-stream")
        stream = RabbitQueue(name, queue_type=QueueType.STREAM, durable=True)
        publisher = new_broker(amqp_broker)
        async with publisher:
            await publisher.declare_queue(stream)
            for i in range(5):
                await publisher.publish(f"event-{i}", name)
        broker = new_broker(amqp_broker)
        got: list[tuple[str, Any]] = []

        # a stream is read with a prefetch (QoS) and manual acks; the offset is a
        # consumer argument; each delivery carries its x-stream-offset
        @broker.subscriber(stream, channel=Channel(prefetch_count=10),
                           consume_args={"x-stream-offset": "first"})
        async def read(text: str, message: RabbitMessage) -> None:
            got.append((text, message.raw_message.headers.get("x-stream-offset")))

        async with broker:
            await broker.start()
            await until(lambda: len(got) == 5, what="5 stream entries")
            await broker.publish("event-5", name)
            await until(lambda: len(got) == 6, what="the live entry")
        # aio-pika runs each delivery's callback as its own task, so handlers may finish
        # out of order; the offsets say the stream's order: entry i at offset i
        assert sorted(got, key=lambda entry: entry[1]) == [(f"event-{i}", i) for i in range(6)]
        await _delete_queue(amqp_broker, name)

    run(body)


def test_expired_message_is_dead_lettered_with_reason_expired(amqp_broker):
    async def body():
        broker = new_broker(amqp_broker)
        dead_q = RabbitQueue(unique("fs-expired"), auto_delete=True)
        parked = unique("fs-parked")  # no consumer: messages only expire there
        dead: list[tuple[str, str, str]] = []

        @broker.subscriber(dead_q)
        async def on_dead(text: str, message: RabbitMessage) -> None:
            death = message.raw_message.headers["x-death"][0]
            dead.append((text, death["reason"], death["queue"]))

        async with broker:
            await broker.start()
            await broker.declare_queue(RabbitQueue(parked, auto_delete=False, arguments={
                "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead_q.name}))
            await broker.publish("stale", parked, expiration=0.05)  # seconds: "50" ms on the wire
            await until(lambda: dead, what="the expired message")
        assert dead == [("stale", "expired", parked)]
        await _delete_queue(amqp_broker, parked)

    run(body)


def test_reply_to_a_named_queue(amqp_broker):
    async def body():
        broker = new_broker(amqp_broker)
        work, replies_q = unique("fs-work"), unique("fs-replies")
        replies: list[tuple[Any, str | None]] = []

        @broker.subscriber(RabbitQueue(work, auto_delete=True))
        async def handle(n: int) -> int:
            return n + 1

        @broker.subscriber(RabbitQueue(replies_q, auto_delete=True))
        async def on_reply(n: int, message: RabbitMessage) -> None:
            replies.append((n, message.correlation_id))

        async with broker:
            await broker.start()
            await broker.publish(41, work, reply_to=replies_q, correlation_id="ask-1")
            await until(lambda: replies, what="the reply")
        assert replies == [(42, "ask-1")]

    run(body)


def test_unroutable_mandatory_publish_raises_with_on_return_raises(amqp_broker):
    """FastStream publishes ``mandatory=True``; on a channel with ``on_return_raises`` the
    broker's basic.return (312 NO_ROUTE, sent before the confirm) fails the publish."""

    async def body():
        broker = RabbitBroker(amqp_broker.url, logger=None,
                              default_channel=Channel(on_return_raises=True))
        exchange = RabbitExchange(unique("fs-nowhere"), auto_delete=True)
        queue = RabbitQueue(unique("fs-somewhere"), auto_delete=True, routing_key="there")
        got: list[str] = []
        broker.subscriber(queue, exchange)(collect(got))
        async with broker:
            await broker.start()
            await broker.publish("ok", exchange=exchange, routing_key="there")
            with pytest.raises(DeliveryError) as raised:
                await broker.publish("lost", exchange=exchange, routing_key="nowhere")
            returned = raised.value.message
            assert returned is not None and returned.body == b"lost"
            await broker.publish("not mandatory", exchange=exchange, routing_key="nowhere",
                                 mandatory=False)  # dropped silently, confirmed
            await until(lambda: got, what="the routable one")
        assert got == ["ok"]

    run(body)


def test_single_active_consumer_fails_over_to_the_next(amqp_broker):
    async def body():
        name = unique("fs-sac")
        queue = RabbitQueue(name, auto_delete=False, arguments={"x-single-active-consumer": True})
        got: dict[str, list[int]] = {"first": [], "second": []}
        first, second = new_broker(amqp_broker), new_broker(amqp_broker)
        first.subscriber(queue)(collect(got["first"]))
        second.subscriber(queue)(collect(got["second"]))
        await first.start()
        await second.start()  # its consumer waits, inactive
        for n in range(5):
            await first.publish(n, name)
        await until(lambda: len(got["first"]) == 5, what="5 to the active consumer")
        await first.stop()  # the waiting consumer becomes the active one
        for n in range(5, 8):
            await second.publish(n, name)
        await until(lambda: len(got["second"]) == 3, what="3 to the next consumer")
        await second.stop()
        assert sorted(got["first"]) == [0, 1, 2, 3, 4] and sorted(got["second"]) == [5, 6, 7]
        await _delete_queue(amqp_broker, name)

    run(body)


async def _delete_queue(amqp: AmqpBroker, name: str) -> None:
    await asyncio.to_thread(amqp.delete_queues, name)
