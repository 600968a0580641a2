"""Large deletions (queue.delete, purge of a paged-out backlog) run in the background,
in chunks: other publishers' confirms do not wait for them, and what was deleted stays
deleted across a restart even if the broker stops before the chunks are done."""

from __future__ import annotations

import time

import pika

from leveret import BlockingBroker

N = 30_000


def fill(ch, queue: str, n: int, arguments: dict | None = None) -> None:
    ch.queue_declare(queue, durable=True, arguments=arguments)
    props = pika.BasicProperties(delivery_mode=2)
    for _ in range(n):
        ch.basic_publish("", queue, b"x" * 200, props)
    ch.queue_declare(queue, passive=True)  # a round trip: all routed


def test_deleting_a_large_queue_does_not_stall_confirms(tmp_path):
    data = str(tmp_path / "data")
    with BlockingBroker(amqp_port=0, data_dir=data) as broker:
        conn = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
        ch = conn.channel()
        fill(ch, "big", N)
        fill(ch, "paged", N, {"x-max-in-memory-length": 100})
        ch.queue_declare("other", durable=True)
        ch.confirm_delivery()
        ch.basic_publish("", "other", b"sync", pika.BasicProperties(delivery_mode=2))

        ch.queue_delete("big")
        assert ch.queue_purge("paged").method.message_count == N
        started = time.monotonic()
        ch.basic_publish("", "other", b"after", pika.BasicProperties(delivery_mode=2))
        assert time.monotonic() - started < 1.0
        ch.basic_publish("", "paged", b"new", pika.BasicProperties(delivery_mode=2))
        conn.close()
    # The broker stopped right away: the deletions finish (or are redone) at start.
    with BlockingBroker(amqp_port=0, data_dir=data) as broker:
        conn = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
        ch = conn.channel()
        assert ch.queue_declare("other", passive=True).method.message_count == 2
        assert ch.queue_declare("paged", passive=True).method.message_count == 1
        assert ch.basic_get("paged", auto_ack=True)[2] == b"new"
        ch.queue_declare("big", durable=True)
        assert ch.queue_declare("big", passive=True).method.message_count == 0
        conn.close()
