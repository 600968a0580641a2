"""A persistent AMQP 1.0 message in a durable queue survives a broker restart with its
sections intact (the store keeps the ``amqp-1.0`` encoded form), with real proton
clients over TCP and a real store in a temporary data directory."""

from __future__ import annotations

import uuid

import pika
import pytest
from proton import Message as ProtonMessage, Timeout, symbol
from proton.utils import BlockingConnection

from leveret import BlockingBroker


def _connect(broker: BlockingBroker) -> BlockingConnection:
    return BlockingConnection(f"amqp://guest:guest@127.0.0.1:{broker.amqp_port}", allowed_mechs="PLAIN")


def test_persistent_amqp10_message_survives_a_restart_with_its_sections(tmp_path):
    sent = [
        ProtonMessage(
            body={"k": [1, 2.5, "three"]},  # an amqp-value body
            durable=True,
            priority=7,
            id=uuid.UUID(int=9),
            correlation_id="corr-9",
            subject="subj",
            reply_to="/queues/replies",
            content_type="application/json",
            group_id="g-1",
            annotations={symbol("x-opt-app"): "kept"},
            properties={"colour": "red", "n": 42},
        ),
        ProtonMessage(body=b"\x00\x01binary" * 100, inferred=True, durable=True, properties={"i": 2}),
    ]
    transient = ProtonMessage(body="not durable: gone after the restart", durable=False)
    with BlockingBroker(amqp_port=0, data_dir=str(tmp_path)) as broker:
        pika_conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.amqp_port))
        pika_conn.channel().queue_declare("kept", durable=True)
        pika_conn.close()
        conn = _connect(broker)
        sender = conn.create_sender("/queues/kept")
        for message in sent:
            sender.send(message)  # waits for accepted: on disk
        sender.send(transient)
        conn.close()
    with BlockingBroker(amqp_port=0, data_dir=str(tmp_path)) as broker:
        conn = _connect(broker)
        receiver = conn.create_receiver("/queues/kept", credit=10)
        got = [receiver.receive(timeout=5) for _ in sent]
        with pytest.raises(Timeout):  # the transient message is gone
            receiver.receive(timeout=0.5)
        receiver.accept()
        conn.close()
    first, second = got
    assert first.body == {"k": [1, 2.5, "three"]}
    assert first.durable and first.priority == 7
    assert (first.id, first.correlation_id, first.subject) == (uuid.UUID(int=9), "corr-9", "subj")
    assert (first.reply_to, first.content_type) == ("/queues/replies", "application/json")
    assert first.group_id == "g-1"
    assert first.annotations.get(symbol("x-opt-app")) == "kept"
    assert first.properties == {"colour": "red", "n": 42}
    assert second.body == b"\x00\x01binary" * 100 and second.durable
    assert second.properties == {"i": 2}


def test_delayed_persistent_amqp10_message_survives_a_restart(tmp_path):
    """Held by the scheduler (``x-opt-delivery-delay``) when the broker stops: after the
    restart it is routed when due, as an AMQP 1.0 message with its sections."""
    delayed = ProtonMessage(
        body="later",
        durable=True,
        subject="held",
        annotations={symbol("x-opt-delivery-delay"): 1500, symbol("x-opt-app"): "kept"},
        properties={"colour": "blue"},
    )
    with BlockingBroker(amqp_port=0, data_dir=str(tmp_path)) as broker:
        pika_conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.amqp_port))
        pika_conn.channel().queue_declare("held", durable=True)
        pika_conn.close()
        conn = _connect(broker)
        conn.create_sender("/queues/held").send(delayed)
        conn.close()
    with BlockingBroker(amqp_port=0, data_dir=str(tmp_path)) as broker:
        conn = _connect(broker)
        receiver = conn.create_receiver("/queues/held", credit=10)
        got = receiver.receive(timeout=8)
        receiver.accept()
        conn.close()
    assert got.body == "later" and got.subject == "held" and got.durable
    assert got.annotations.get(symbol("x-opt-app")) == "kept"
    assert got.properties == {"colour": "blue"}
