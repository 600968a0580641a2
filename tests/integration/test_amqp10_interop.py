"""A message sent over AMQP 1.0 (proton) and consumed over AMQP 0-9-1 (pika) and STOMP
(stomp.py), and back: the body byte for byte, content-type, message-id, correlation-id
and application properties ↔ headers, against leveret and RabbitMQ 3.10
(tests/amqp10_brokers.py).

RabbitMQ 4 (leveret's model, its ``mc`` conversions) maps AMQP 1.0 application
properties to AMQP 0-9-1 headers and STOMP headers and back. RabbitMQ 3.10 does not: it
carries the AMQP 1.0 properties and application-properties sections, encoded, in the
binary headers ``x-amqp-1.0-properties`` and ``x-amqp-1.0-app-properties`` (which break
STOMP framing: a STOMP consumer gets an empty body and garbage frames), and drops AMQP
0-9-1 / STOMP headers on the way to AMQP 1.0.
"""

from __future__ import annotations

import queue as queues
from collections.abc import Iterator
from contextlib import contextmanager

import pika
import pytest
import stomp
from amqp10_brokers import Amqp10Broker
from amqp10_clients import blocking, pop, receiver, send, settle, wait_messages
from proton import Delivery, Message
from stomp_clients import Collector

pytestmark = pytest.mark.timeout(30)

#: Every byte value, NUL and newlines included: no protocol may touch the body.
BODY = bytes(range(256)) * 4 + b"\r\n\0end"
CONTENT_TYPE = "application/x-leveret-test"


@contextmanager
def stomp_client(broker: Amqp10Broker) -> Iterator[tuple[stomp.Connection12, Collector]]:
    """A STOMP 1.2 connection (vhost ``/``: RabbitMQ reads the host header as the vhost)
    collecting what the broker sends."""
    conn = stomp.Connection12([(broker.host, broker.stomp_port)], vhost="/", auto_decode=False)
    collector = Collector()
    conn.set_listener("collector", collector)
    conn.connect(broker.user, broker.password, wait=True)
    try:
        yield conn, collector
    finally:
        if conn.is_connected():
            conn.disconnect()


def stomp_queue(name: str) -> str:
    """The STOMP destination of an existing queue (RabbitMQ's, which leveret also takes)."""
    return f"/amq/queue/{name}"


def amqp10_message(**properties: object) -> Message:
    """A data-section message with every mapped property set."""
    return Message(
        body=BODY,
        inferred=True,
        content_type=CONTENT_TYPE,
        id="msg-1",
        correlation_id="corr-1",
        properties=dict(properties) or {"color": "red", "count": 7, "flag": True},
    )


def receive_amqp10(broker: Amqp10Broker, queue: str) -> Message:
    with blocking(broker) as conn:
        rcv = receiver(conn, broker.queue(queue), credit=1)
        wait_messages(conn, rcv, 1)
        message, delivery = pop(rcv)
        settle(delivery, Delivery.ACCEPTED)
        return message


def test_amqp10_to_amqp091(amqp10_broker: Amqp10Broker) -> None:
    queue = amqp10_broker.declare()
    with blocking(amqp10_broker) as conn:
        assert send(conn, amqp10_broker.queue(queue), amqp10_message()) == [Delivery.ACCEPTED]
    with amqp10_broker.pika() as pconn:
        method, props, body = pconn.channel().basic_get(queue, auto_ack=True)
    assert method is not None
    assert body == BODY
    assert props.content_type == CONTENT_TYPE
    assert props.message_id == "msg-1"
    assert props.correlation_id == "corr-1"
    headers = props.headers or {}
    if amqp10_broker.name == "rabbitmq":
        assert "color" not in headers
        assert isinstance(headers["x-amqp-1.0-app-properties"], bytes)
    else:
        assert (headers["color"], headers["count"], headers["flag"]) == ("red", 7, True)


def test_amqp091_to_amqp10(amqp10_broker: Amqp10Broker) -> None:
    queue = amqp10_broker.declare()
    with amqp10_broker.pika() as pconn:
        pconn.channel().basic_publish(
            "",
            queue,
            BODY,
            pika.BasicProperties(
                content_type=CONTENT_TYPE,
                message_id="msg-2",
                correlation_id="corr-2",
                headers={"color": "blue", "count": 8},
            ),
        )
    message = receive_amqp10(amqp10_broker, queue)
    assert message.inferred  # a data section
    assert message.body == BODY
    assert message.content_type == CONTENT_TYPE
    assert message.id == "msg-2"
    assert message.correlation_id == "corr-2"
    if amqp10_broker.name == "rabbitmq":
        assert not message.properties
    else:
        assert message.properties == {"color": "blue", "count": 8}


def test_amqp10_to_stomp(amqp10_broker: Amqp10Broker, request: pytest.FixtureRequest) -> None:
    """The STOMP MESSAGE has the body (content-length), content-type, correlation-id,
    the message id (RabbitMQ: ``amqp-message-id``; leveret, as ActiveMQ: ``message-id``)
    and a header per application property. RabbitMQ 3.10 breaks the frame with its binary
    ``x-amqp-1.0-*`` headers (expected to fail there)."""
    if amqp10_broker.name == "rabbitmq":
        request.applymarker(
            pytest.mark.xfail(
                strict=True, reason="RabbitMQ 3.10 sends AMQP 1.0 sections as binary STOMP headers"
            )
        )
    queue = amqp10_broker.declare()
    with blocking(amqp10_broker) as conn:
        send(conn, amqp10_broker.queue(queue), amqp10_message(color="red", count=7))
    with stomp_client(amqp10_broker) as (conn, collector):
        conn.subscribe(stomp_queue(queue), "1", ack="auto")
        try:
            frame = collector.messages.get(timeout=5)
        except queues.Empty:
            raise AssertionError("no MESSAGE in 5 s") from None
    headers = frame.headers
    assert frame.body == BODY
    assert headers["content-type"] == CONTENT_TYPE
    assert headers["correlation-id"] == "corr-1"
    id_header = "amqp-message-id" if amqp10_broker.name == "rabbitmq" else "message-id"
    assert headers[id_header] == "msg-1"
    assert (headers["color"], headers["count"]) == ("red", "7")


def test_stomp_to_amqp10(amqp10_broker: Amqp10Broker) -> None:
    queue = amqp10_broker.declare()
    with stomp_client(amqp10_broker) as (conn, collector):
        conn.send(
            stomp_queue(queue),
            BODY,
            headers={
                "content-type": CONTENT_TYPE,
                "correlation-id": "corr-3",
                "color": "green",
                "receipt": "r1",
            },
        )
        assert collector.receipts.get(timeout=5) == "r1"
    message = receive_amqp10(amqp10_broker, queue)
    assert message.body == BODY
    assert message.content_type == CONTENT_TYPE
    assert message.correlation_id == "corr-3"
    if amqp10_broker.name == "rabbitmq":
        assert not message.properties
    else:
        assert (message.properties or {}).get("color") == "green"


def test_amqp10_round_trip_through_amqp091(amqp10_broker: Amqp10Broker) -> None:
    """AMQP 1.0 → AMQP 0-9-1 consumer → republished over AMQP 0-9-1 as it came →
    AMQP 1.0: the body and the mapped properties are unchanged."""
    first, second = amqp10_broker.declare(), amqp10_broker.declare()
    with blocking(amqp10_broker) as conn:
        send(conn, amqp10_broker.queue(first), amqp10_message())
    with amqp10_broker.pika() as pconn:
        channel = pconn.channel()
        _, props, body = channel.basic_get(first, auto_ack=True)
        channel.basic_publish("", second, body, props)
    message = receive_amqp10(amqp10_broker, second)
    assert message.body == BODY
    assert (message.content_type, message.id, message.correlation_id) == (CONTENT_TYPE, "msg-1", "corr-1")
    if amqp10_broker.name != "rabbitmq":
        assert message.properties == {"color": "red", "count": 7, "flag": True}
