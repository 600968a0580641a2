"""Any node, any client: two real node processes on a real PostgreSQL; a queue owned by
n2 is published to and consumed from n1 (pika, stomp.py), through the inter-node link."""

from __future__ import annotations

import pika
import pytest
import stomp
from cluster_nodes import start_nodes
from eventually import eventually
from targets import unique

PERSISTENT = pika.BasicProperties(delivery_mode=2)


@pytest.fixture(scope="module")
def nodes(postgres, tmp_path_factory):
    """Two nodes for the module's tests (each uses queues of its own)."""
    tmp_path = tmp_path_factory.mktemp("across")
    started = start_nodes(tmp_path, postgres.url, unique("across").replace("-", "_"), 2)
    yield started
    for node in started:
        node.kill()


def test_publish_and_consume_on_n1_a_queue_owned_by_n2(nodes) -> None:
    n1, n2 = nodes
    with pika.BlockingConnection(pika.URLParameters(n2.url)) as on_n2:
        on_n2.channel().queue_declare("orders", durable=True)  # client-local: owned by n2
    connection = pika.BlockingConnection(pika.URLParameters(n1.url))
    channel = connection.channel()
    channel.confirm_delivery()
    for i in range(20):
        channel.basic_publish("", "orders", b"m%d" % i, PERSISTENT, mandatory=True)
    consumer = connection.channel()
    consumer.basic_qos(prefetch_count=5)
    got: list[bytes] = []

    def on_message(ch, method, properties, body):
        got.append(body)
        ch.basic_ack(method.delivery_tag)

    consumer.basic_consume("orders", on_message)
    eventually(lambda: len(got) == 20, timeout=10,
               wait=lambda s: connection.process_data_events(time_limit=s))
    assert got == [b"m%d" % i for i in range(20)]
    connection.close()
    with pika.BlockingConnection(pika.URLParameters(n2.url)) as on_n2:
        assert on_n2.channel().queue_declare("orders", passive=True).method.message_count == 0


def test_a_stomp_subscriber_on_n1_of_a_queue_owned_by_n2(nodes) -> None:
    n1, n2 = nodes
    with pika.BlockingConnection(pika.URLParameters(n2.url)) as on_n2:
        channel = on_n2.channel()
        channel.queue_declare("tickets", durable=True)
        channel.confirm_delivery()
        for i in range(5):
            channel.basic_publish("", "tickets", b"t%d" % i, PERSISTENT)
    received: list[str] = []

    class Listener(stomp.ConnectionListener):
        def on_message(self, frame) -> None:
            received.append(frame.body)

    client = stomp.Connection([("127.0.0.1", n1.stomp_port)])
    client.set_listener("", Listener())
    client.connect("guest", "guest", wait=True)
    client.subscribe("/amq/queue/tickets", id="1", ack="auto")
    assert eventually(lambda: len(received) == 5, timeout=10)
    assert received == [f"t{i}" for i in range(5)]
    client.disconnect()
