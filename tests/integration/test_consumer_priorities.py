"""Consumer priorities: AMQP's ``x-priority`` consume argument (checked against
RabbitMQ 3.10 when it is installed) and ActiveMQ's ``activemq.priority`` STOMP
subscription header, one mechanism in core. Messages go to the highest-priority
consumers that can take them, round-robin among equals; a lower priority gets messages
only while every higher one is blocked (its prefetch window full)."""

from __future__ import annotations

import pika
import pytest
from eventually import eventually, pumping
from pika.exceptions import ChannelClosedByBroker
from stomp_clients import Client
from targets import Target, unique

from leveret import BlockingBroker


def consume(connection: pika.BlockingConnection, queue: str, prefetch: int, priority: int | None,
            got: list[tuple[str, bytes]], name: str) -> None:
    """A manual-ack consumer on its own channel, recording (name, body) in ``got``."""
    ch = connection.channel()
    ch.basic_qos(prefetch_count=prefetch)
    arguments = {} if priority is None else {"x-priority": priority}
    ch.basic_consume(queue, lambda _ch, _m, _p, body: got.append((name, body)), arguments=arguments)


def publish_and_collect(connection: pika.BlockingConnection, queue: str, count: int,
                        got: list[tuple[str, bytes]], expect: int | None = None) -> None:
    ch = connection.channel()
    ch.confirm_delivery()
    for i in range(count):
        ch.basic_publish("", queue, b"%d" % i)
    eventually(lambda: len(got) >= (count if expect is None else expect), 5, 0.05, pumping(connection))
    connection.process_data_events(time_limit=0.2)  # nothing more comes


def test_a_lower_priority_gets_messages_only_while_the_higher_is_blocked(target: Target):
    queue = unique("prio")
    with target.amqp() as connection:
        connection.channel().queue_declare(queue, auto_delete=True)
        got: list[tuple[str, bytes]] = []
        consume(connection, queue, 3, 10, got, "high")
        consume(connection, queue, 100, None, got, "low")
        publish_and_collect(connection, queue, 10, got)
        assert [body for name, body in got if name == "high"] == [b"0", b"1", b"2"]
        assert [body for name, body in got if name == "low"] == [b"%d" % i for i in range(3, 10)]


def test_equal_priorities_share_round_robin_and_a_lower_one_waits(target: Target):
    queue = unique("prio")
    with target.amqp() as connection:
        connection.channel().queue_declare(queue, auto_delete=True)
        got: list[tuple[str, bytes]] = []
        consume(connection, queue, 100, 5, got, "a")
        consume(connection, queue, 100, 5, got, "b")
        consume(connection, queue, 100, -3, got, "negative")
        consume(connection, queue, 100, None, got, "default")
        publish_and_collect(connection, queue, 8, got)
        assert sorted(got) == sorted([("a" if i % 2 == 0 else "b", b"%d" % i) for i in range(8)])


def test_a_large_priority_is_an_integer_like_any_other(target: Target):
    queue = unique("prio")
    with target.amqp() as connection:
        connection.channel().queue_declare(queue, auto_delete=True)
        got: list[tuple[str, bytes]] = []
        consume(connection, queue, 100, 2**40, got, "huge")
        consume(connection, queue, 100, 1, got, "one")
        publish_and_collect(connection, queue, 4, got)
        assert got == [("huge", b"%d" % i) for i in range(4)]


@pytest.mark.parametrize(
    ("value", "type_name"), [("high", "longstr"), (True, "bool")]
)
def test_a_priority_that_is_not_an_integer_is_refused_as_rabbitmq_does(target: Target, value, type_name):
    queue = unique("prio")
    with target.amqp() as connection:
        ch = connection.channel()
        ch.queue_declare(queue, auto_delete=True)
        with pytest.raises(ChannelClosedByBroker) as refused:
            ch.basic_consume(queue, lambda *a: None, arguments={"x-priority": value})
        assert refused.value.reply_code == 406
        assert refused.value.reply_text == (
            f"PRECONDITION_FAILED - invalid arg 'x-priority' for queue '{queue}' in vhost '/': "
            f'"expected integer, got {type_name}"'
        )
        assert connection.channel().queue_declare(queue, passive=True)  # the connection lives on


def test_the_capability_is_announced(target: Target):
    with target.amqp() as connection:
        capabilities = connection._impl.server_capabilities
        assert capabilities["consumer_priorities"] is True


def test_a_blocked_high_priority_consumer_takes_over_again_once_it_acks(target: Target):
    queue = unique("prio")
    with target.amqp() as connection:
        connection.channel().queue_declare(queue, auto_delete=True)
        high = connection.channel()
        high.basic_qos(prefetch_count=1)
        got: list[tuple[str, bytes]] = []

        def on_high(ch, method, _props, body):
            got.append(("high", body))
            ch.basic_ack(method.delivery_tag)  # acked at once: never blocked for long

        high.basic_consume(queue, on_high, arguments={"x-priority": 1})
        consume(connection, queue, 100, None, got, "low")
        ch = connection.channel()
        ch.confirm_delivery()
        for i in range(5):
            ch.basic_publish("", queue, b"%d" % i)
            eventually(lambda i=i: len(got) > i, 5, 0.05, pumping(connection))
        assert got == [("high", b"%d" % i) for i in range(5)]


# -- STOMP: activemq.priority -------------------------------------------------------------
@pytest.fixture
def stomp_port():
    with BlockingBroker(amqp_port=0, stomp_port=0) as running:
        yield running.broker.stomp_port


def test_activemq_priority_serves_the_highest_subscription_with_room(stomp_port):
    with Client(stomp_port) as high, Client(stomp_port) as low, Client(stomp_port) as producer:
        high.subscribe("/queue/prio", ack="client-individual", **{"activemq.priority": "9",
                                                                   "activemq.prefetchSize": "2"})
        low.subscribe("/queue/prio", ack="client-individual")
        for i in range(6):
            producer.send("/queue/prio", f"m{i}")
        assert [high.message().body for _ in range(2)] == [b"m0", b"m1"]
        assert [low.message().body for _ in range(4)] == [b"m2", b"m3", b"m4", b"m5"]
        high.no_message()


def test_activemq_priority_must_be_an_integer(stomp_port):
    with Client(stomp_port) as bad, Client(stomp_port) as other:
        bad.conn.subscribe("/queue/prio", "1", ack="auto", **{"activemq.priority": "high"})
        error = bad.error()
        assert error.headers["message"] == "Invalid activemq.priority header"
        bad.wait_disconnected()
        other.subscribe("/queue/prio")  # everyone else carries on
        other.send("/queue/prio", "still here")
        assert other.message().body == b"still here"
