"""x-message-deduplication: duplicates by message_id (or a header) are dropped, yet
confirmed; the cache is bounded, expires, and survives a restart for durable queues."""

from __future__ import annotations

import time

import pika

from leveret import BlockingBroker


def publish(ch, queue: str, message_id: str | None = None, headers: dict | None = None,
            persistent: bool = False) -> None:
    ch.basic_publish("", queue, (message_id or "-").encode(), pika.BasicProperties(
        message_id=message_id, headers=headers, delivery_mode=2 if persistent else 1))


def count(ch, queue: str) -> int:
    return ch.queue_declare(queue, passive=True).method.message_count


def test_duplicates_by_message_id_are_dropped_but_confirmed(channel):
    channel.queue_declare("dedup", arguments={"x-message-deduplication": True})
    channel.confirm_delivery()
    for message_id in ("a", "b", "a", "c", "b", None, None):
        publish(channel, "dedup", message_id)  # raises if nacked
    assert count(channel, "dedup") == 5  # a, b, c and the two without an id


def test_header_key_cache_size_and_ttl(channel):
    channel.queue_declare("dedup-h", arguments={
        "x-message-deduplication": True, "x-deduplication-header": "order",
        "x-cache-size": 2, "x-cache-ttl": 300})
    publish(channel, "dedup-h", headers={"order": 1})
    publish(channel, "dedup-h", headers={"order": 1})
    assert count(channel, "dedup-h") == 1
    publish(channel, "dedup-h", headers={"order": 2})
    publish(channel, "dedup-h", headers={"order": 3})  # evicts 1 (size 2)
    publish(channel, "dedup-h", headers={"order": 1})
    assert count(channel, "dedup-h") == 4
    time.sleep(0.4)  # past the TTL: 3 is new again
    publish(channel, "dedup-h", headers={"order": 3})
    assert count(channel, "dedup-h") == 5


def test_cache_survives_restart_of_a_durable_queue(tmp_path):
    data = str(tmp_path / "data")
    args = {"x-message-deduplication": True}
    with BlockingBroker(amqp_port=0, data_dir=data) as broker:
        conn = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
        ch = conn.channel()
        ch.queue_declare("orders", durable=True, arguments=args)
        ch.confirm_delivery()
        publish(ch, "orders", "o-1", persistent=True)
        ch.basic_get("orders", auto_ack=True)  # consumed: the key is still remembered
        conn.close()
    with BlockingBroker(amqp_port=0, data_dir=data) as broker:
        conn = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
        ch = conn.channel()
        ch.confirm_delivery()
        publish(ch, "orders", "o-1", persistent=True)
        publish(ch, "orders", "o-2", persistent=True)
        assert count(ch, "orders") == 1
        assert ch.basic_get("orders", auto_ack=True)[2] == b"o-2"
        conn.close()
