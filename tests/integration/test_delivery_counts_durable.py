"""Both delivery counts, RabbitMQ 4.3's ``x-delivery-count`` (failed deliveries: what
``x-delivery-limit`` counts) and ``x-acquired-count`` (every delivery), survive a clean
restart of an embedded broker with a data directory, ``kill -9`` of a ``leveret
server``, and a failover to a standby on a shared PostgreSQL; a consumer that vanishes
without closing its connection fails its deliveries, one that closes returns them.
Real pika clients over TCP."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pika
from eventually import eventually
from servers import ServerProcess

from leveret.server.broker import BlockingBroker

QUEUE = "jobs"
#: one failure allowed: the second dead-letters the message
ARGUMENTS = {"x-delivery-limit": 1, "x-dead-letter-strategy": "individual"}


def get(ch, queue: str = QUEUE):
    method, props, body = ch.basic_get(queue)
    deadline = time.monotonic() + 5
    while method is None and time.monotonic() < deadline:
        time.sleep(0.02)
        method, props, body = ch.basic_get(queue)
    assert method is not None, f"nothing in {queue}"
    return method, props, body


def counts(props) -> tuple[int | None, int | None]:
    headers = props.headers or {}
    return headers.get("x-delivery-count"), headers.get("x-acquired-count")


def count_some(url: str, durable_queue_args: dict = ARGUMENTS) -> None:
    """Publish one persistent message, return it twice (basic.recover), fail it once
    (basic.reject), then wait for a confirmed publish: everything is in the store."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(QUEUE, durable=True, arguments=durable_queue_args)
    ch.basic_publish("", QUEUE, b"job", pika.BasicProperties(delivery_mode=2))
    for _ in range(2):
        get(ch)
        ch.basic_recover(requeue=True)
    method, props, _ = get(ch)
    assert counts(props) == (0, 2)
    ch.basic_reject(method.delivery_tag, requeue=True)
    ch.queue_declare("marker", durable=True)
    # confirmed once on disk: the count updates made before it are written too
    ch.basic_publish("", "marker", b"", pika.BasicProperties(delivery_mode=2))
    conn.close()


def check_kept(url: str, durable_queue_args: dict = ARGUMENTS) -> None:
    """After the restart: 1 failure, 3 earlier deliveries; the next failure is the
    second: dead-lettered."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    assert ch.queue_declare(QUEUE, durable=True, arguments=durable_queue_args).method.message_count == 1
    method, props, body = get(ch)
    assert body == b"job" and method.redelivered
    assert counts(props) == (1, 3)
    ch.basic_reject(method.delivery_tag, requeue=True)
    _, props, body = get(ch, f"DLQ.{QUEUE}")
    assert body == b"job" and props.headers["x-death"][0]["reason"] == "delivery_limit"
    conn.close()


def test_both_counts_survive_a_clean_restart(tmp_path: Path):
    with BlockingBroker(amqp_port=0, data_dir=str(tmp_path)) as broker:
        count_some(broker.amqp_url)
    with BlockingBroker(amqp_port=0, data_dir=str(tmp_path)) as broker:
        check_kept(broker.amqp_url)


def test_both_counts_survive_kill_9(tmp_path: Path):
    data = tmp_path / "data"
    server = ServerProcess(data)
    try:
        count_some(server.url)
        time.sleep(0.2)  # the last count update reaches the disk with the marker's batch
        server.kill()
        server = ServerProcess(data)
        check_kept(server.url)
    finally:
        server.kill()


def test_both_counts_survive_a_failover_on_postgresql(cluster):
    master, standby = cluster
    count_some(master.url)
    time.sleep(0.2)
    master.kill()
    standby.wait_for("leveret ready")
    check_kept(standby.url)


CRASHING_CONSUMER = """
import os, sys, pika
conn = pika.BlockingConnection(pika.URLParameters(sys.argv[1]))
ch = conn.channel()
method, _, _ = ch.basic_get(sys.argv[2])
assert method is not None
os._exit(3)  # a crash: the socket closes without connection.close
"""


def test_a_consumer_that_vanishes_fails_one_that_closes_returns(tmp_path: Path):
    """RabbitMQ 4.3 counts a consumer whose process went down as a failed delivery:
    leveret counts a client gone without connection.close so (crash loops end in the
    dead-letter queue); a connection closed in order returns its messages uncounted."""
    with BlockingBroker(amqp_port=0, data_dir=str(tmp_path)) as broker:
        conn = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
        ch = conn.channel()
        ch.queue_declare(QUEUE, durable=True, arguments=ARGUMENTS)
        ch.basic_publish("", QUEUE, b"job", pika.BasicProperties(delivery_mode=2))
        closing = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
        get(closing.channel())
        closing.close()  # in order: a return
        crashed = subprocess.run(
            [sys.executable, "-c", CRASHING_CONSUMER, broker.amqp_url, QUEUE], timeout=30)
        assert crashed.returncode == 3
        eventually(lambda: ch.queue_declare(QUEUE, passive=True).method.message_count == 1)
        method, props, _ = get(ch)
        assert counts(props) == (1, 2)  # the crash failed it, the close did not
        ch.basic_ack(method.delivery_tag)
        conn.close()
