"""The clients users have follow the master after a kill -9, each the way its users
configure failover (docs/operations.md, "Clients that follow the master"): kombu and celery with failover
URLs, stomp.py with a host list, aio-pika's robust connection through a load balancer
(:class:`ha.FirstAlive` in HAProxy's place)."""

from __future__ import annotations

import asyncio
import time

import aio_pika
import kombu
import pika
import pytest
import stomp
from celery import Celery
from eventually import eventually
from ha import FirstAlive, Node
from stomp_clients import Collector

TIMEOUT = 30.0


def failover_urls(cluster: list[Node]) -> str:
    """kombu's and celery's form: the brokers' URLs joined by ``;``."""
    return ";".join(f"amqp://guest:guest@127.0.0.1:{node.amqp_port}//" for node in cluster)


def kill_master(cluster: list[Node]) -> None:
    master, standby = cluster
    master.kill()
    standby.wait_for("leveret ready")


def count(cluster: list[Node], queue: str) -> int:
    """Messages ready in ``queue`` on the master now (the second node)."""
    connection = pika.BlockingConnection(pika.URLParameters(cluster[1].url))
    try:
        return connection.channel().queue_declare(queue, passive=True).method.message_count
    finally:
        connection.close()


def test_kombu_with_failover_urls_publishes_to_the_new_master(cluster):
    queue = kombu.Queue("kombu-orders", durable=True)
    with kombu.Connection(
        failover_urls(cluster), failover_strategy="round-robin", transport_options={"confirm_publish": True}
    ) as connection:
        producer = connection.Producer()
        publish = connection.ensure(producer, producer.publish, max_retries=50, interval_start=0.1,
                                    interval_step=0.1, interval_max=0.5)  # fmt: skip
        publish({"n": 1}, routing_key=queue.name, declare=[queue], delivery_mode=2)
        kill_master(cluster)
        publish({"n": 2}, routing_key=queue.name, declare=[queue], delivery_mode=2)
        received = []
        with connection.SimpleQueue(queue) as simple:
            for _ in range(2):
                message = simple.get(timeout=TIMEOUT)
                received.append(message.payload["n"])
                message.ack()
    assert sorted(received) == [1, 2]


def test_celery_with_failover_urls_sends_tasks_to_the_new_master(cluster):
    app = Celery("failover", broker=failover_urls(cluster))
    app.conf.broker_transport_options = {"confirm_publish": True}
    app.conf.broker_connection_retry_on_startup = True
    app.conf.task_default_queue = "celery-failover"
    retry = {"max_retries": 50, "interval_start": 0.1, "interval_step": 0.1, "interval_max": 0.5}
    app.send_task("tasks.add", args=(1, 2), retry=True, retry_policy=retry)
    kill_master(cluster)
    app.send_task("tasks.add", args=(3, 4), retry=True, retry_policy=retry)
    app.close()
    assert count(cluster, "celery-failover") == 2  # the first survived the kill, the second came


def test_stomp_py_with_a_host_list_reconnects_to_the_new_master(cluster):
    hosts = [("127.0.0.1", node.stomp_port) for node in cluster]
    conn = stomp.Connection12(hosts, reconnect_sleep_initial=0.1, reconnect_sleep_max=0.5,
                              reconnect_attempts_max=100, auto_decode=False)  # fmt: skip
    events = Collector()
    conn.set_listener("collector", events)
    conn.connect("guest", "guest", wait=True)
    conn.send("/queue/stomp-orders", b"before", headers={"persistent": "true", "receipt": "r1"})
    assert events.receipts.get(timeout=TIMEOUT) == "r1"
    kill_master(cluster)
    eventually(lambda: events.disconnected, TIMEOUT, 0.05)
    conn.connect("guest", "guest", wait=True)  # tries the hosts in turn
    conn.send("/queue/stomp-orders", b"after", headers={"persistent": "true", "receipt": "r2"})
    assert events.receipts.get(timeout=TIMEOUT) == "r2"
    conn.subscribe("/queue/stomp-orders", "1", ack="client-individual")
    bodies = []
    for _ in range(2):
        frame = events.messages.get(timeout=TIMEOUT)
        bodies.append(frame.body)
        conn.ack(frame.headers["ack"])
    conn.disconnect()
    assert sorted(bodies) == [b"after", b"before"]


@pytest.mark.timeout(120)
def test_aio_pika_robust_connection_through_a_load_balancer_follows_the_master(cluster):
    balancer = FirstAlive([node.amqp_port for node in cluster])

    async def scenario() -> list[bytes]:
        connection = await aio_pika.connect_robust(
            f"amqp://guest:guest@127.0.0.1:{balancer.port}/", reconnect_interval=0.2
        )
        received: asyncio.Queue[bytes] = asyncio.Queue()
        async with connection:
            channel = await connection.channel()  # publisher confirms on
            queue = await channel.declare_queue("robust-orders", durable=True)

            async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                async with message.process():
                    await received.put(message.body)

            await queue.consume(on_message)  # restored by the robust channel after a reconnect
            await channel.default_exchange.publish(
                aio_pika.Message(b"before", delivery_mode=aio_pika.DeliveryMode.PERSISTENT), "robust-orders"
            )
            bodies = [await asyncio.wait_for(received.get(), TIMEOUT)]
            await asyncio.to_thread(kill_master, cluster)
            deadline = time.monotonic() + TIMEOUT
            while True:  # publishing fails until the connection is restored
                try:
                    await channel.default_exchange.publish(
                        aio_pika.Message(b"after", delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                        "robust-orders",
                    )
                    break
                except (aio_pika.exceptions.AMQPError, ConnectionError, RuntimeError):
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.2)
            # "before" may come again (its ack may not have reached the old master):
            # duplicates are allowed, so wait for "after"
            while bodies[-1] != b"after":
                bodies.append(await asyncio.wait_for(received.get(), TIMEOUT))
            return bodies

    try:
        bodies = asyncio.run(scenario())
        assert bodies[0] == b"before" and bodies[-1] == b"after"
        assert set(bodies) == {b"before", b"after"}
    finally:
        balancer.close()
