"""AMQP 1.0 messages across protocols, with real clients over TCP: a proton sender's
message reaches pika and stomp.py consumers with its body byte for byte and its
properties mapped as RabbitMQ 4 maps them, a pika publisher's reaches a proton
receiver, and AMQP 1.0 to AMQP 1.0 keeps every section (protocol/amqp10/message.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pika
import pytest
from proton import Message as ProtonMessage, symbol
from proton.utils import BlockingConnection
from stomp_clients import Client

from leveret import BlockingBroker


@pytest.fixture(scope="module")
def broker() -> Iterator[BlockingBroker]:
    with BlockingBroker(amqp_port=0, stomp_port=0, mqtt_port=0) as running:
        yield running


@pytest.fixture
def amqp10(broker) -> Iterator[BlockingConnection]:
    conn = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{broker.amqp_port}", allowed_mechs="PLAIN")
    yield conn
    conn.close()


@pytest.fixture
def channel(broker):
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.amqp_port))
    yield conn.channel()
    conn.close()


def fresh_queue(channel) -> str:
    name = f"q-{uuid.uuid4().hex[:8]}"
    channel.queue_declare(name)
    return name


def test_a_proton_message_reaches_pika_mapped_and_byte_for_byte(amqp10, channel):
    queue = fresh_queue(channel)
    body = bytes(range(256)) * 20
    sender = amqp10.create_sender(f"/queues/{queue}")
    sender.send(
        ProtonMessage(
            body=body,
            inferred=True,
            durable=True,
            priority=6,
            id=uuid.UUID(int=5),
            correlation_id="corr-1",
            reply_to="/queues/replies",
            content_type="application/octet-stream",
            group_id="app-1",
            properties={"k": "v", "n": 3},
            annotations={symbol("x-opt-z"): "a"},
        )
    )
    sender.send(ProtonMessage(body="a string"))
    _, props, got = channel.basic_get(queue, auto_ack=True)
    assert got == body
    assert props.message_id == "urn:uuid:00000000-0000-0000-0000-000000000005"
    assert (props.correlation_id, props.reply_to, props.app_id) == ("corr-1", "replies", "app-1")
    assert (props.delivery_mode, props.priority, props.type) == (2, 6, None)
    assert props.content_type == "application/octet-stream"
    assert props.headers == {"k": "v", "n": 3, "x-opt-z": "a"}
    _, props, got = channel.basic_get(queue, auto_ack=True)
    # an amqp-value body: its AMQP encoding, type amqp-1.0 (RabbitMQ 4's)
    assert got == b"\x00\x53\x77\xa1\x08a string" and props.type == "amqp-1.0"


def test_a_pika_message_reaches_a_proton_receiver_as_rabbitmq_4_converts_it(amqp10, channel):
    queue = fresh_queue(channel)
    corr = uuid.UUID(int=9)
    channel.basic_publish(
        "",
        queue,
        b"from 0-9-1 \x00\x01",
        pika.BasicProperties(
            headers={"h": 1, "x-hh": "y"},
            message_id="m1",
            correlation_id=f"urn:uuid:{corr}",
            delivery_mode=2,
            priority=4,
            type="t1",
            reply_to="rq",
            expiration="60000",
        ),
    )
    receiver = amqp10.create_receiver(f"/queues/{queue}")
    got = receiver.receive(timeout=5)
    receiver.accept()
    assert bytes(got.body) == b"from 0-9-1 \x00\x01" and got.inferred is True
    assert (got.id, got.correlation_id, got.reply_to) == ("m1", corr, "/queues/rq")
    assert (got.durable, got.priority, got.first_acquirer, got.delivery_count) == (True, 4, True, 0)
    assert 0 < got.ttl <= 60
    assert got.properties == {"h": 1}
    assert got.annotations == {"x-hh": "y", "x-basic-type": "t1", "x-exchange": "", "x-routing-key": queue}


def test_amqp_1_0_to_amqp_1_0_keeps_every_section(amqp10, channel):
    queue = fresh_queue(channel)
    sender = amqp10.create_sender(f"/queues/{queue}")
    sent = ProtonMessage(
        body={"map": [1, 2.5, None]},
        subject="subj",
        address="/queues/elsewhere",
        properties={"a": True},
        annotations={symbol("x-opt-a"): 7},
        creation_time=1700000000.5,
    )
    sender.send(sent)
    receiver = amqp10.create_receiver(f"/queues/{queue}")
    got = receiver.receive(timeout=5)
    receiver.accept()
    assert got.body == sent.body and got.subject == "subj" and got.address == "/queues/elsewhere"
    assert got.properties == {"a": True} and got.creation_time == 1700000000.5
    assert got.annotations == {"x-opt-a": 7, "x-exchange": "", "x-routing-key": queue}


def test_a_proton_message_reaches_a_stomp_subscriber(broker, amqp10, channel):
    queue = fresh_queue(channel)
    stomp = Client(broker.broker.stomp_port)
    try:
        stomp.subscribe(f"/queue/{queue}")
        sender = amqp10.create_sender(f"/queues/{queue}")
        sender.send(ProtonMessage(body=b"stomp body", inferred=True, properties={"color": "red"}, id="id-7"))
        frame = stomp.message()
        assert frame.body == b"stomp body"
        assert frame.headers["color"] == "red" and frame.headers["message-id"] == "id-7"
    finally:
        stomp.conn.disconnect()
