"""Any node, any client (issue 32): three active nodes on a real PostgreSQL, a queue owned
by node n1, clients on the other nodes. A publish on n2 reaches n1's queue and is
confirmed once n1 has it; a consumer on n3 gets n1's messages in the order they were
published on one channel, with its prefetch honoured and its acks applied on n1. The
same with pika, aio-pika and stomp.py (RabbitMQ's STOMP: ``/queue/x`` is queue ``x``).
"""

from __future__ import annotations

import asyncio
import time
import uuid

import aio_pika
import pika
from cluster_clients import PERSISTENT
from cluster_nodes import Cluster, NodeProcess
from eventually import eventually, pumping
from stomp_clients import Client

COUNT = 200


def queue_on(node: NodeProcess, cluster: Cluster) -> str:
    """A new durable queue declared on ``node`` (which owns it: client-local)."""
    name = f"q-{uuid.uuid4().hex[:8]}"
    connection = pika.BlockingConnection(pika.URLParameters(node.url))
    connection.channel().queue_declare(name, durable=True)
    connection.close()
    assert cluster.owner(name) == node.name
    return name


def ready_count(node: NodeProcess, queue: str) -> int:
    """Messages ready in ``queue`` as ``node`` reports them (a passive queue.declare)."""
    connection = pika.BlockingConnection(pika.URLParameters(node.url))
    try:
        return connection.channel().queue_declare(queue, passive=True).method.message_count
    finally:
        connection.close()


def publish_confirmed(node: NodeProcess, queue: str, bodies: list[str]) -> None:
    """Publish each body persistent and mandatory with confirms (pika raises on a nack
    or a return)."""
    connection = pika.BlockingConnection(pika.URLParameters(node.url))
    channel = connection.channel()
    channel.confirm_delivery()
    for body in bodies:
        channel.basic_publish("", queue, body.encode(), PERSISTENT, mandatory=True)
    connection.close()


def test_pika_publish_on_n2_consume_on_n3_of_a_queue_owned_by_n1(cluster_of):
    cluster = cluster_of()
    queue = queue_on(cluster["n1"], cluster)
    bodies = [f"m{i}" for i in range(COUNT)]
    publish_confirmed(cluster["n2"], queue, bodies)
    ready = eventually(lambda: ready_count(cluster["n1"], queue) == COUNT, 5)
    assert ready, ready_count(cluster["n1"], queue)

    connection = pika.BlockingConnection(pika.URLParameters(cluster["n3"].url))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=20)
    received: list[tuple[str, bool]] = []
    for method, _, body in channel.consume(queue, inactivity_timeout=5):
        assert method is not None, f"only {len(received)} of {COUNT} came"
        received.append((body.decode(), method.redelivered))
        channel.basic_ack(method.delivery_tag)
        if len(received) == COUNT:
            break
    channel.cancel()
    connection.close()
    assert [body for body, _ in received] == bodies  # one publishing channel: its order
    assert not any(redelivered for _, redelivered in received)
    # the acks went back to n1: nothing is left there, nothing comes back
    assert eventually(lambda: ready_count(cluster["n1"], queue) == 0, 5)
    time.sleep(0.3)
    assert ready_count(cluster["n1"], queue) == 0


def test_prefetch_is_honoured_for_a_consumer_on_another_node(cluster_of):
    cluster = cluster_of()
    queue = queue_on(cluster["n1"], cluster)
    total, prefetch = 40, 5
    publish_confirmed(cluster["n2"], queue, [f"p{i}" for i in range(total)])

    connection = pika.BlockingConnection(pika.URLParameters(cluster["n3"].url))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=prefetch)
    tags: list[int] = []
    acked = 0
    most_unacked = 0

    def on_message(channel, method, properties, body) -> None:
        nonlocal most_unacked
        tags.append(method.delivery_tag)
        most_unacked = max(most_unacked, len(tags) - acked)

    channel.basic_consume(queue, on_message)
    wait = pumping(connection)
    eventually(lambda: len(tags) >= prefetch, 5, wait=wait)
    wait(1.0)  # time enough for more to come, if the prefetch were not honoured
    assert len(tags) == prefetch
    channel.basic_ack(tags[1], multiple=True)  # two acked: two more may come, no more
    acked = 2
    eventually(lambda: len(tags) >= prefetch + 2, 5, wait=wait)
    wait(1.0)
    assert len(tags) == prefetch + 2

    def ack_all_so_far(seconds: float) -> None:  # a consumer acking as it goes
        nonlocal acked
        if len(tags) > acked:
            channel.basic_ack(tags[-1], multiple=True)
            acked = len(tags)
        connection.process_data_events(time_limit=seconds)

    assert eventually(lambda: len(tags) == total and acked == total, 10, wait=ack_all_so_far), len(tags)
    assert most_unacked == prefetch
    connection.close()
    assert eventually(lambda: ready_count(cluster["n1"], queue) == 0, 5)


def test_aio_pika_publish_on_n2_consume_on_n3(cluster_of):
    cluster = cluster_of()
    queue = queue_on(cluster["n1"], cluster)
    bodies = [f"a{i}" for i in range(COUNT)]

    async def main() -> list[str]:
        publisher = await aio_pika.connect(cluster["n2"].url)
        async with publisher:
            channel = await publisher.channel(publisher_confirms=True)
            for body in bodies:  # each awaited: confirmed (a nack or a return raises)
                await channel.default_exchange.publish(
                    aio_pika.Message(body.encode(), delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                    routing_key=queue,
                    mandatory=True,
                )
        consumer = await aio_pika.connect(cluster["n3"].url)
        received: list[str] = []
        async with consumer:
            channel = await consumer.channel()
            await channel.set_qos(prefetch_count=25)
            source = await channel.declare_queue(queue, durable=True)
            async with source.iterator() as messages:
                async for message in messages:
                    async with message.process():
                        received.append(message.body.decode())
                    if len(received) == len(bodies):
                        break
        return received

    received = asyncio.run(asyncio.wait_for(main(), 20))
    assert received == bodies
    assert eventually(lambda: ready_count(cluster["n1"], queue) == 0, 5)


def test_stomp_send_on_n3_subscribe_on_n2_with_client_acks(cluster_of):
    cluster = cluster_of()
    queue = queue_on(cluster["n1"], cluster)  # durable, as STOMP's /queue/ declares it
    total, prefetch = 60, 10
    bodies = [f"s{i}" for i in range(total)]
    with Client(cluster["n2"].stomp_port) as receiver, Client(cluster["n3"].stomp_port) as sender:
        # leveret's STOMP takes ActiveMQ's prefetch header (RabbitMQ's prefetch-count is
        # not read: a single node delivers an eleventh message with it alone)
        receiver.subscribe(f"/queue/{queue}", ack="client", **{"activemq.prefetchSize": prefetch})
        for body in bodies:  # each with a receipt: the owner n1 has it
            sender.send(f"/queue/{queue}", body, persistent="true")
        window = [receiver.message(timeout=5) for _ in range(prefetch)]
        receiver.no_message(1.0)  # nothing acked: the prefetch holds across the link
        receiver.ack(window[-1])  # cumulative: the window's ten
        received = [frame.body.decode() for frame in window]
        unacked = []
        while len(received) < total:
            frame = receiver.message(timeout=5)
            received.append(frame.body.decode())
            unacked.append(frame)
            if len(unacked) == prefetch // 2:  # cumulative ack of the newest
                receiver.ack(unacked[-1])
                unacked.clear()
        if unacked:
            receiver.ack(unacked[-1])
        receiver.no_message(0.3)
        assert received == bodies
    # disconnected: an unacked message would be back in n1's queue
    assert eventually(lambda: ready_count(cluster["n1"], queue) == 0, 5), ready_count(cluster["n1"], queue)
    time.sleep(0.3)  # an unacked message would be back after the disconnect
    assert ready_count(cluster["n1"], queue) == 0
