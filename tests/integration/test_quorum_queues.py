"""Quorum queues (``x-queue-type: quorum``) as RabbitMQ 3.10 accepts them, checked
against a RabbitMQ node when it is installed: the declaration rules and their 406
texts, the delivery limit with ``x-delivery-count``, RabbitMQ's dead-letter
strategies, no global QoS; and, on leveret, that every message is kept across a
``kill -9``, persistent or not."""

from __future__ import annotations

import pika
import pytest
from eventually import eventually, poll, pumping
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker
from servers import ServerProcess
from targets import Target, unique

QUORUM = {"x-queue-type": "quorum"}


def refusal(target: Target, queue: str, arguments: dict, **properties) -> tuple[int, str]:
    with target.amqp() as connection:
        with pytest.raises(ChannelClosedByBroker) as refused:
            connection.channel().queue_declare(queue, arguments=arguments, **properties)
        return refused.value.reply_code, refused.value.reply_text


@pytest.mark.parametrize(
    ("properties", "arguments", "text"),
    [
        ({"durable": False}, {}, "invalid property 'non-durable' for queue '{q}' in vhost '/'"),
        ({"durable": True, "exclusive": True}, {},
         "invalid property 'exclusive-owner' for queue '{q}' in vhost '/'"),
        ({"durable": True, "auto_delete": True}, {},
         "invalid property 'auto-delete' for queue '{q}' in vhost '/'"),
        ({"durable": False, "exclusive": True, "auto_delete": True}, {},
         "invalid property 'auto-delete' for queue '{q}' in vhost '/'"),
        ({"durable": False}, {"x-max-priority": 5},
         "invalid arg 'x-max-priority' for queue '{q}' in vhost '/' of queue type rabbit_quorum_queue"),
        ({"durable": True}, {"x-queue-mode": "lazy"},
         "invalid arg 'x-queue-mode' for queue '{q}' in vhost '/' of queue type rabbit_quorum_queue"),
        ({"durable": True}, {"x-max-age": "1D"},
         "invalid arg 'x-max-age' for queue '{q}' in vhost '/' of queue type rabbit_quorum_queue"),
        ({"durable": True}, {"x-dead-letter-strategy": "sometimes"},
         "invalid arg 'x-dead-letter-strategy' for queue '{q}' in vhost '/': invalid_dlx_strategy"),
        ({"durable": True}, {"x-quorum-initial-group-size": 0},
         "invalid arg 'x-quorum-initial-group-size' for queue '{q}' in vhost '/': {{value_zero,0}}"),
        ({"durable": True}, {"x-quorum-initial-group-size": "3"},
         "invalid arg 'x-quorum-initial-group-size' for queue '{q}' in vhost '/': "
         "\"expected integer, got longstr\""),
    ],
)
def test_declarations_rabbitmq_refuses_are_refused_in_its_words(target: Target, properties, arguments, text):
    queue = unique("qq")
    code, reply = refusal(target, queue, {**QUORUM, **arguments}, **properties)
    assert (code, reply) == (406, "PRECONDITION_FAILED - " + text.format(q=queue))


def test_a_quorum_queue_cannot_be_server_named(target: Target):
    code, reply = refusal(target, "", QUORUM, durable=True)
    assert (code, reply) == (
        406, "PRECONDITION_FAILED - Cannot declare a server-named queue for type rabbit_quorum_queue"
    )


def test_rabbitmqs_dead_letter_strategies_belong_to_quorum_queues(target: Target):
    queue = unique("classic")
    code, reply = refusal(target, queue, {"x-dead-letter-strategy": "at-least-once"}, durable=True)
    assert (code, reply) == (
        406,
        f"PRECONDITION_FAILED - invalid arg 'x-dead-letter-strategy' for queue '{queue}' in vhost '/' "
        "of queue type rabbit_classic_queue",
    )
    with target.amqp() as connection:
        ch = connection.channel()
        for strategy in ("at-most-once", "at-least-once"):
            name = unique("qq")
            ch.queue_declare(name, durable=True, arguments={
                **QUORUM, "x-dead-letter-strategy": strategy, "x-dead-letter-exchange": "",
                "x-overflow": "reject-publish", "x-quorum-initial-group-size": 3,
            })
            ch.queue_delete(name)


def test_the_delivery_limit_dead_letters_with_the_delivery_count(target: Target):
    queue, dlq = unique("qq"), unique("qq-dlq")
    with target.amqp() as connection:
        ch = connection.channel()
        ch.queue_declare(dlq, durable=True)
        ch.queue_declare(queue, durable=True, arguments={
            **QUORUM, "x-delivery-limit": 2, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq,
        })
        ch.confirm_delivery()
        ch.basic_publish("", queue, b"poison", pika.BasicProperties(delivery_mode=1, headers={"h": 1}))
        got = []

        def reject(channel, method, properties, body):
            got.append((method.redelivered, (properties.headers or {}).get("x-delivery-count")))
            # a failure in RabbitMQ 4.3 (basic.nack is a return there), in 3.10 as well
            channel.basic_reject(method.delivery_tag, requeue=True)

        ch.basic_consume(queue, reject)
        eventually(lambda: len(got) >= 3, 5, 0.05, pumping(connection))
        connection.process_data_events(time_limit=0.3)
        assert got == [(False, None), (True, 1), (True, 2)]  # then it is dead
        dead = poll(lambda: ch.basic_get(dlq, auto_ack=True), lambda dead: dead[0] is not None, 5, 0)
        assert dead[0] is not None
        _, properties, body = dead
        assert body == b"poison" and properties.delivery_mode == 1  # kept as it was sent
        death = properties.headers["x-death"][0]
        assert (death["reason"], death["queue"], death["count"]) == ("delivery_limit", queue, 1)
        assert properties.headers["x-first-death-reason"] == "delivery_limit"
        ch.queue_delete(queue)
        ch.queue_delete(dlq)


def test_a_global_prefetch_is_not_supported(target: Target):
    """RabbitMQ's 540; leveret's with ``global_qos = "refuse"`` (its default applies a
    global prefetch per consumer: test_global_qos_per_consumer.py)."""
    if target.broker is not None:
        target.broker.core.limits.global_qos = "refuse"
    queue = unique("qq")
    with target.amqp() as connection:
        connection.channel().queue_declare(queue, durable=True, arguments=QUORUM)
    with target.amqp() as connection:
        ch = connection.channel()
        ch.basic_qos(prefetch_count=10, global_qos=True)
        with pytest.raises(ConnectionClosedByBroker) as closed:
            ch.basic_consume(queue, lambda *a: None)
        assert closed.value.reply_code == 540
        assert closed.value.reply_text == (
            f"NOT_IMPLEMENTED - queue '{queue}' in vhost '/' does not support global qos"
        )
    with target.amqp() as connection:
        connection.channel().queue_delete(queue)


def test_a_redeclaration_as_classic_is_inequivalent(target: Target):
    queue = unique("qq")
    with target.amqp() as connection:
        ch = connection.channel()
        ch.queue_declare(queue, durable=True, arguments=QUORUM)
        with pytest.raises(ChannelClosedByBroker) as refused:
            ch.queue_declare(queue, durable=True)
        assert refused.value.reply_text == (
            f"PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue '{queue}' in vhost '/': "
            "received none but current is the value 'quorum' of type 'longstr'"
        )
    with target.amqp() as connection:
        connection.channel().queue_delete(queue)


def test_every_message_survives_a_kill_persistent_or_not(tmp_path):
    data = tmp_path / "data"
    server = ServerProcess(data)
    try:
        connection = pika.BlockingConnection(pika.URLParameters(server.url))
        ch = connection.channel()
        ch.queue_declare("orders", durable=True, arguments=QUORUM)
        ch.queue_declare("classic", durable=True)
        ch.confirm_delivery()
        for i in range(20):
            mode = 2 if i % 2 else 1
            ch.basic_publish("", "orders", b"%d" % i, pika.BasicProperties(delivery_mode=mode))
            ch.basic_publish("", "classic", b"%d" % i, pika.BasicProperties(delivery_mode=mode))
        server.kill()  # every publish above was confirmed
        server = ServerProcess(data)
        connection = pika.BlockingConnection(pika.URLParameters(server.url))
        ch = connection.channel()
        bodies, modes = [], []
        while (got := ch.basic_get("orders", auto_ack=True))[0] is not None:
            bodies.append(got[2])
            modes.append(got[1].delivery_mode)
        assert bodies == [b"%d" % i for i in range(20)]
        assert modes == [2 if i % 2 else 1 for i in range(20)]  # delivery modes as sent
        # a classic queue keeps only the persistent ones
        assert ch.queue_declare("classic", passive=True).method.message_count == 10
        connection.close()
    finally:
        server.kill()
