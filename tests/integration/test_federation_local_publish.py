"""The federation links' two shortcuts, on a real broker with real clients: publishing
into this broker through core (``LocalPublisher``: confirms, negative confirms, refusals,
resource alarms) and acknowledging upstream deliveries in batches (``UpstreamAcks``:
one ``basic.ack multiple=True`` per loop turn, never past an unsettled delivery)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import aiormq
import pika
import pytest
from pamqp import commands
from pamqp.commands import Basic

from leveret import BlockingBroker
from leveret.federation.acks import UpstreamAcks
from leveret.federation.local_publish import LocalPublisher


@pytest.fixture
def broker() -> Iterator[BlockingBroker]:
    with BlockingBroker(amqp_port=0) as running:
        yield running


def on_broker(broker: BlockingBroker, coroutine: Any, timeout: float = 10.0) -> Any:
    """Run ``coroutine`` on the broker's own loop (LocalPublisher lives there)."""
    loop = broker.call(asyncio.get_running_loop)
    return asyncio.run_coroutine_threadsafe(coroutine, loop).result(timeout)


def declare(broker: BlockingBroker, queue: str, **arguments: Any) -> None:
    with pika.BlockingConnection(pika.URLParameters(broker.amqp_url)) as connection:
        connection.channel().queue_declare(queue, arguments=arguments or None)


def depth(broker: BlockingBroker, queue: str) -> int:
    return broker.call(lambda: broker.core.vhosts["/"].queues[queue].message_count)


def test_local_publish_is_confirmed_and_keeps_properties(broker):
    declare(broker, "q")

    async def publish() -> list[Any]:
        publisher = LocalPublisher(broker.core, "/", confirms=True)
        properties = Basic.Properties(headers={"a": 1, "b": "x"}, message_type="t", delivery_mode=2)
        answers = await asyncio.gather(
            *(publisher.basic_publish(b"m%d" % i, routing_key="q", properties=properties) for i in range(3))
        )
        await publisher.close()
        return answers

    assert [type(a) for a in on_broker(broker, publish())] == [commands.Basic.Ack] * 3
    with pika.BlockingConnection(pika.URLParameters(broker.amqp_url)) as connection:
        _method, properties, body = connection.channel().basic_get("q", auto_ack=True)
    assert body == b"m0" and properties.headers == {"a": 1, "b": "x"}
    assert properties.type == "t" and properties.delivery_mode == 2


def test_a_full_reject_publish_queue_is_a_nack(broker):
    declare(broker, "full", **{"x-max-length": 1, "x-overflow": "reject-publish"})

    async def publish() -> list[Any]:
        publisher = LocalPublisher(broker.core, "/", confirms=True)
        answers = [await publisher.basic_publish(b"m", routing_key="full") for _ in range(2)]
        await publisher.close()
        return answers

    assert [type(a) for a in on_broker(broker, publish())] == [commands.Basic.Ack, commands.Basic.Nack]


def test_a_missing_exchange_ends_the_session_as_a_closed_channel(broker):
    async def publish() -> tuple[str, str]:
        publisher = LocalPublisher(broker.core, "/", confirms=True)
        with pytest.raises(ConnectionError) as raised:
            await publisher.basic_publish(b"m", exchange="nowhere", routing_key="k")
        with pytest.raises(ConnectionError) as closing:
            await publisher.closing
        await publisher.close()
        return str(raised.value), str(closing.value)

    raised, closing = on_broker(broker, publish())
    assert raised == closing == "NOT_FOUND - no exchange 'nowhere' in vhost '/'"


@pytest.mark.parametrize("hold", ["alarm", "flow"])
def test_an_alarm_or_flow_control_holds_the_publish_until_it_ends(broker, hold):
    declare(broker, "q")
    core = broker.core

    def holding(active: bool) -> None:
        if hold == "alarm":
            core.set_alarm(active, "disk")
        else:
            core.flow.set(active)

    broker.call(holding, True)

    async def start() -> tuple[LocalPublisher, asyncio.Future]:
        publisher = LocalPublisher(core, "/", confirms=True)
        return publisher, asyncio.ensure_future(publisher.basic_publish(b"m", routing_key="q"))

    publisher, task = on_broker(broker, start())
    for _ in range(3):  # a few turns of the broker's loop: still held
        on_broker(broker, asyncio.sleep(0))
    assert not task.done() and depth(broker, "q") == 0
    broker.call(holding, False)

    async def finish() -> Any:
        answer = await task
        await publisher.close()
        return answer

    assert isinstance(on_broker(broker, finish()), commands.Basic.Ack)
    assert depth(broker, "q") == 1
    assert broker.call(lambda: publisher._on_alarm not in core.alarm_listeners and not core.flow.held)


def test_without_confirms_a_publish_answers_none_at_once(broker):
    declare(broker, "q")

    async def publish() -> Any:
        publisher = LocalPublisher(broker.core, "/", confirms=False)
        answer = await publisher.basic_publish(b"m", routing_key="q")
        await publisher.close()
        return answer

    assert on_broker(broker, publish()) is None
    assert depth(broker, "q") == 1


async def _consume(url: str, queue: str, n: int, settle: Any) -> int:
    """Take ``n`` deliveries of ``queue`` with aiormq, hand their tags to ``settle(acks,
    tags)``, let the acks go out, close; returns the basic.ack frames sent."""
    connection = await aiormq.connect(url)
    channel = await connection.channel()
    await channel.basic_qos(prefetch_count=n)
    tags: list[int] = []
    got = asyncio.get_running_loop().create_future()

    async def on_message(message: Any) -> None:
        tags.append(message.delivery.delivery_tag)
        if len(tags) == n and not got.done():
            got.set_result(None)

    await channel.basic_consume(queue, on_message)
    await asyncio.wait_for(got, 10)
    acks = UpstreamAcks(channel)
    settle(acks, sorted(tags))
    await asyncio.sleep(0)  # the flush (call_soon)
    while acks._tasks:
        await asyncio.wait(set(acks._tasks))
    await asyncio.wait_for(channel.basic_qos(prefetch_count=n), 10)  # a round trip: the ack is in
    await connection.close()
    return acks.sent


def _fill(broker: BlockingBroker, queue: str, n: int) -> None:
    declare(broker, queue)
    with pika.BlockingConnection(pika.URLParameters(broker.amqp_url)) as connection:
        channel = connection.channel()
        for i in range(n):
            channel.basic_publish("", queue, b"%d" % i)


def test_acks_of_one_turn_go_as_one_multiple_ack(broker):
    _fill(broker, "up", 50)

    def settle(acks: UpstreamAcks, tags: list[int]) -> None:
        for tag in tags:
            acks.ack(tag)

    assert asyncio.run(_consume(broker.amqp_url, "up", 50, settle)) == 1
    assert depth(broker, "up") == 0


def test_an_unsettled_delivery_holds_back_the_acks_after_it(broker):
    _fill(broker, "up", 4)

    def settle(acks: UpstreamAcks, tags: list[int]) -> None:
        acks.ack(tags[0])
        acks.settled(tags[1])  # (as after a basic.nack: covered, not re-acked)
        acks.ack(tags[3])  # the third is still in flight

    assert asyncio.run(_consume(broker.amqp_url, "up", 4, settle)) == 1
    assert depth(broker, "up") == 2  # the third and the fourth came back on close
