"""MQTT and AMQP 1.0 on every node (issue 32: "the adapters of the earlier issues work on
every node"): three active nodes on a real PostgreSQL, a durable queue owned by n1, the
MQTT and AMQP 1.0 clients on the other nodes.

- MQTT (RabbitMQ's plugin: topic ``sensors/a`` is routing key ``sensors.a`` on
  ``amq.topic``): paho QoS 1 publishes on n2 reach n1's queue bound with ``sensors.#``
  (every PUBACK'd message is consumed from n1 with pika); a QoS 1 subscriber on n3 gets
  what pika publishes on n1 to ``amq.topic``; its subscription queue lives on n3 (an
  MQTT session queue is auto-delete/exclusive: it stays on its connection's node).
- AMQP 1.0 (RabbitMQ 4 v2 addresses, ``/queues/NAME``): unsettled sends on n2 are each
  ``accepted``; a receiver on n3 with credit gets them all in order; a ``released`` or
  ``modified`` outcome on n3 returns the message to n1, which delivers it again.
"""

from __future__ import annotations

import types
import uuid

import paho.mqtt.client as paho
import pika
from amqp10_clients import blocking, pop, receiver, send, settle, wait_messages
from cluster_clients import PERSISTENT
from cluster_nodes import Cluster, ClusterNode
from eventually import eventually
from mqtt_clients import Paho
from proton import Delivery, Message

COUNT = 50
GUEST = ("guest", "guest")


def durable_queue_on(node: ClusterNode, cluster: Cluster, bind: str | None = None) -> str:
    """A new durable queue declared on ``node`` (its owner: client-local), bound to
    ``amq.topic`` with ``bind`` if given."""
    name = f"q-{uuid.uuid4().hex[:8]}"
    connection = pika.BlockingConnection(pika.URLParameters(node.url))
    channel = connection.channel()
    channel.queue_declare(name, durable=True)
    if bind is not None:
        channel.queue_bind(name, "amq.topic", bind)
    connection.close()
    assert cluster.owner(name) == node.name
    return name


def mqtt_broker(node: ClusterNode) -> types.SimpleNamespace:
    """What mqtt_clients.Paho needs of a broker: host and MQTT port."""
    return types.SimpleNamespace(host="127.0.0.1", port=node.mqtt_port)


def consume(node: ClusterNode, queue: str, count: int) -> list[str]:
    """Up to ``count`` bodies consumed (acked) from ``queue`` on ``node`` (stops after
    3 s without a message)."""
    connection = pika.BlockingConnection(pika.URLParameters(node.url))
    channel = connection.channel()
    bodies: list[str] = []
    for method, _, body in channel.consume(queue, inactivity_timeout=3):
        if method is None:
            break
        bodies.append(body.decode())
        channel.basic_ack(method.delivery_tag)
        if len(bodies) == count:
            break
    channel.cancel()
    connection.close()
    return bodies


def test_mqtt_publish_on_n2_reaches_a_queue_owned_by_n1(cluster_of):
    cluster = cluster_of()
    queue = durable_queue_on(cluster["n1"], cluster, bind="sensors.#")
    bodies = [f"a{i}" for i in range(COUNT)]
    with Paho(mqtt_broker(cluster["n2"]), protocol=paho.MQTTv311, credentials=GUEST) as client:
        assert client.connected()[1] == 0
        for body in bodies:
            client.publish("sensors/a", body.encode(), qos=1)  # waits for the PUBACK
    assert consume(cluster["n1"], queue, COUNT) == bodies, cluster.logs()


def test_mqtt_subscriber_on_n3_gets_a_publish_on_n1(cluster_of):
    cluster = cluster_of()
    with Paho(mqtt_broker(cluster["n3"]), protocol=paho.MQTTv311, credentials=GUEST) as client:
        assert client.connected()[1] == 0
        assert list(client.subscribe("sensors/b", qos=1)) == [1]
        # its session queue (RabbitMQ's name) is n3's: in queue_owners or, not durable,
        # among n3's transient definitions
        session_queue = f"mqtt-subscription-{client.client_id}qos1"
        rows = cluster.postgres.sql(
            f'SELECT node FROM "{cluster.name}".queue_owners WHERE name = %s UNION ALL '
            f'SELECT node FROM "{cluster.name}".transient_definitions WHERE name = %s',
            session_queue,
            session_queue,
        )
        assert rows and all(node == "n3" for (node,) in rows), rows
        # n1 knows the binding (replicated) before anything is published there
        connection = pika.BlockingConnection(pika.URLParameters(cluster["n1"].url))
        channel = connection.channel()
        channel.confirm_delivery()
        bodies = [f"b{i}" for i in range(COUNT)]

        def routed() -> bool:
            try:
                channel.basic_publish("amq.topic", "sensors.b", b"probe", PERSISTENT, mandatory=True)
            except pika.exceptions.UnroutableError:
                return False
            return True

        assert eventually(routed, 5), "the MQTT subscription's binding never reached n1"
        for body in bodies:
            channel.basic_publish("amq.topic", "sensors.b", body.encode(), PERSISTENT, mandatory=True)
        connection.close()
        received = []
        while len(received) < COUNT + 1:
            received.append(client.message().payload.decode())
    assert received[0] == "probe" and received[1:] == bodies, cluster.logs()


def test_amqp10_send_on_n2_receive_on_n3_of_a_queue_owned_by_n1(cluster_of):
    cluster = cluster_of()
    queue = durable_queue_on(cluster["n1"], cluster)
    address = f"/queues/{queue}"
    bodies = [f"c{i}" for i in range(COUNT)]
    n2, n3 = cluster["n2"], cluster["n3"]
    url = "amqp://guest:guest@127.0.0.1:{}"
    with blocking(None, url.format(n2.amqp_port)) as conn:  # type: ignore[arg-type]
        outcomes = send(conn, address, *[Message(body=b.encode(), durable=True) for b in bodies])
    assert outcomes == [Delivery.ACCEPTED] * COUNT, outcomes
    with blocking(None, url.format(n3.amqp_port)) as conn:  # type: ignore[arg-type]
        rcv = receiver(conn, address, credit=COUNT)
        wait_messages(conn, rcv, COUNT)
        received = []
        for _ in range(COUNT):
            message, delivery = pop(rcv)
            received.append(bytes(message.body).decode())
            settle(delivery, Delivery.ACCEPTED)
        assert received == bodies
    assert eventually(lambda: _ready(cluster["n1"], queue) == 0, 5)


def _ready(node: ClusterNode, queue: str) -> int:
    connection = pika.BlockingConnection(pika.URLParameters(node.url))
    try:
        return connection.channel().queue_declare(queue, passive=True).method.message_count
    finally:
        connection.close()


def test_amqp10_released_and_modified_on_n3_return_to_the_owner(cluster_of):
    """released then modified (delivery-failed) on n3 of n1's queue: each time n1
    delivers the message again; as on one node (tests/integration/test_amqp10_behaviour.py)
    released is not counted (header delivery-count stays 0), delivery-failed is
    (delivery-count 1 next time), and first-acquirer is false after the first."""
    cluster = cluster_of()
    queue = durable_queue_on(cluster["n1"], cluster)
    address = f"/queues/{queue}"
    url = "amqp://guest:guest@127.0.0.1:{}"
    with blocking(None, url.format(cluster["n2"].amqp_port)) as conn:  # type: ignore[arg-type]
        assert send(conn, address, Message(body=b"x", durable=True)) == [Delivery.ACCEPTED]
    with blocking(None, url.format(cluster["n3"].amqp_port)) as conn:  # type: ignore[arg-type]
        rcv = receiver(conn, address, credit=1)
        seen = []
        for outcome in (Delivery.RELEASED, Delivery.MODIFIED, Delivery.ACCEPTED):
            wait_messages(conn, rcv, 1)
            message, delivery = pop(rcv)
            seen.append((bytes(message.body), message.delivery_count, message.first_acquirer))
            settle(delivery, outcome, failed=outcome == Delivery.MODIFIED)
            rcv.link.flow(1)
    assert seen == [(b"x", 0, True), (b"x", 0, False), (b"x", 1, False)], seen
    assert eventually(lambda: _ready(cluster["n1"], queue) == 0, 5)
