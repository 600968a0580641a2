"""Long queues in bounded memory: past ``x-max-in-memory-length`` (or the small window of
``x-queue-mode: lazy``) a queue keeps bodies in the store and only counts in memory."""

from __future__ import annotations

import time

import pika
import pytest
from eventually import eventually_equal

from leveret import BlockingBroker


@pytest.fixture
def broker(tmp_path):
    with BlockingBroker(amqp_port=0, data_dir=str(tmp_path / "data")) as broker:
        yield broker


def open_channel(broker):
    conn = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
    return conn, conn.channel()


def in_memory(broker, name: str) -> int:
    return broker.call(lambda: len(broker.core.vhosts["/"].queues[name].backlog.ready))


@pytest.mark.parametrize("durable,persistent", [(True, True), (True, False), (False, False)])
def test_backlog_beyond_limit_is_paged_and_delivered_in_order(broker, durable, persistent):
    conn, ch = open_channel(broker)
    ch.queue_declare("long", durable=durable, arguments={"x-max-in-memory-length": 10})
    ch.confirm_delivery()
    props = pika.BasicProperties(delivery_mode=2 if persistent else 1)
    for i in range(500):
        ch.basic_publish("", "long", b"m%04d" % i, props)
    assert ch.queue_declare("long", passive=True).method.message_count == 500
    assert in_memory(broker, "long") == 10

    bodies = []
    ch.basic_qos(prefetch_count=50)
    for method, _, body in ch.consume("long", inactivity_timeout=5):
        assert method is not None
        bodies.append(body)
        ch.basic_ack(method.delivery_tag)
        if len(bodies) == 500:
            break
    ch.cancel()
    assert bodies == [b"m%04d" % i for i in range(500)]
    assert ch.queue_declare("long", passive=True).method.message_count == 0
    conn.close()


def test_large_messages_page_out_past_the_byte_budget(broker):
    """x-max-in-memory-bytes: a few large messages page too, not only many small ones;
    they are read back in order, a byte budget's worth at a time."""
    conn, ch = open_channel(broker)
    ch.queue_declare("large", arguments={"x-max-in-memory-bytes": 1_000_000})
    ch.confirm_delivery()
    bodies = [bytes([i]) * 300_000 for i in range(12)]
    for body in bodies:
        ch.basic_publish("", "large", body)
    assert in_memory(broker, "large") == 4  # 3 × 300 kB under 1 MB, the 4th crosses it
    got = []
    for _ in bodies:
        _method, _, body = ch.basic_get("large", auto_ack=True)
        got.append(body)
        assert in_memory(broker, "large") <= 4
    assert got == bodies
    conn.close()


def test_lazy_queue_basic_get_and_purge(broker):
    conn, ch = open_channel(broker)
    ch.queue_declare("lazy", arguments={"x-queue-mode": "lazy"})
    for i in range(3000):
        ch.basic_publish("", "lazy", b"%d" % i)
    assert ch.queue_declare("lazy", passive=True).method.message_count == 3000
    assert in_memory(broker, "lazy") <= 1000
    method, _, body = ch.basic_get("lazy", auto_ack=True)
    assert body == b"0" and method.message_count == 2999
    assert ch.queue_purge("lazy").method.message_count == 2999
    assert ch.basic_get("lazy") == (None, None, None)
    ch.basic_publish("", "lazy", b"after purge")
    assert ch.basic_get("lazy", auto_ack=True)[2] == b"after purge"
    conn.close()


def test_paged_persistent_messages_survive_restart(tmp_path):
    data = str(tmp_path / "data")
    with BlockingBroker(amqp_port=0, data_dir=data) as broker:
        conn, ch = open_channel(broker)
        ch.queue_declare("long", durable=True, arguments={"x-max-in-memory-length": 5})
        ch.confirm_delivery()
        for i in range(100):
            ch.basic_publish("", "long", b"%d" % i, pika.BasicProperties(delivery_mode=2 if i % 2 else 1))
        conn.close()
    with BlockingBroker(amqp_port=0, data_dir=data) as broker:
        conn, ch = open_channel(broker)
        # Only the persistent ones (odd bodies) come back, in order.
        assert ch.queue_declare("long", durable=True, arguments={"x-max-in-memory-length": 5}
                                ).method.message_count == 50
        got = [ch.basic_get("long", auto_ack=True)[2] for _ in range(50)]
        assert got == [b"%d" % i for i in range(1, 100, 2)]
        conn.close()


def dead_letters(ch, queue: str) -> list[tuple[bytes, str]]:
    got = []
    while (message := ch.basic_get(queue, auto_ack=True))[0] is not None:
        got.append((message[2], message[1].headers["x-death"][0]["reason"]))
    return got


def wait_for_count(ch, queue: str, count: int, arguments: dict, timeout: float = 5.0) -> int:
    def found() -> int:
        return ch.queue_declare(queue, durable=True, arguments=arguments).method.message_count

    return eventually_equal(found, count, timeout, 0.05)


TTL_ARGUMENTS = {
    "x-max-in-memory-length": 10,
    "x-message-ttl": 400,
    "x-dead-letter-exchange": "",
    "x-dead-letter-routing-key": "expired",
}


@pytest.mark.parametrize("priority", [False, True])
def test_paged_out_messages_expire_when_due_without_a_consumer(broker, priority):
    """Before, a paged-out message expired only when read back: with no consumer, never."""
    conn, ch = open_channel(broker)
    arguments = {**TTL_ARGUMENTS, **({"x-max-priority": 5} if priority else {})}
    ch.queue_declare("expired", durable=True)
    ch.queue_declare("ttl", durable=True, arguments=arguments)
    ch.confirm_delivery()
    for i in range(60):  # 50 of them paged out
        ch.basic_publish("", "ttl", b"%d" % i, pika.BasicProperties(delivery_mode=2, priority=i % 3))
    assert broker.call(lambda: broker.core.vhosts["/"].queues["ttl"].backlog.paged) == 50
    assert wait_for_count(ch, "ttl", 0, arguments) == 0
    dead = dead_letters(ch, "expired")
    assert sorted(int(body) for body, _ in dead) == list(range(60)) and {r for _, r in dead} == {"expired"}
    ch.basic_publish("", "ttl", b"fresh", pika.BasicProperties(delivery_mode=2))
    assert ch.basic_get("ttl", auto_ack=True)[2] == b"fresh"  # nothing dead comes back from the store
    conn.close()


def test_paged_out_messages_that_expired_during_a_restart_die_at_once(tmp_path):
    data = str(tmp_path / "data")
    arguments = {**TTL_ARGUMENTS, "x-message-ttl": 1000}
    with BlockingBroker(amqp_port=0, data_dir=data) as broker:
        conn, ch = open_channel(broker)
        ch.queue_declare("expired", durable=True)
        ch.queue_declare("ttl", durable=True, arguments=arguments)
        ch.confirm_delivery()
        for i in range(30):
            ch.basic_publish("", "ttl", b"%d" % i, pika.BasicProperties(delivery_mode=2))
        conn.close()
    time.sleep(1.2)
    with BlockingBroker(amqp_port=0, data_dir=data) as broker:
        conn, ch = open_channel(broker)
        assert wait_for_count(ch, "ttl", 0, arguments) == 0  # no consumer needed
        assert len(dead_letters(ch, "expired")) == 30
        conn.close()
