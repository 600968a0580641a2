"""Long queues in bounded memory: past ``x-max-in-memory-length`` (or the small window of
``x-queue-mode: lazy``) a queue keeps bodies in the store and only counts in memory; a
default queue keeps them in memory until memory pressure (RabbitMQ 3.10's classic
queues), then pages new ones out."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pika
import pytest
from eventually import eventually, eventually_equal

from leveret import BlockingBroker
from leveret.core.queues.backlog import PAGE_IN_BATCH


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


# -- a default queue: in memory until memory pressure (RabbitMQ 3.10's classic queues) ----
BEYOND_THE_OLD_DEFAULT = 55_000  # the in-memory part was 50,000 messages before


def stored_rows(broker) -> int:
    """Message rows committed in the broker's SQLite file (another connection)."""
    with sqlite3.connect(Path(broker.broker.settings.data_dir) / "leveret.db") as db:
        return db.execute("SELECT count(*) FROM messages").fetchone()[0]


def paged(broker, name: str) -> int:
    return broker.call(lambda: broker.core.vhosts["/"].queues[name].backlog.paged)


def publish(ch, name: str, bodies: range) -> None:
    for i in bodies:
        ch.basic_publish("", name, b"m%06d" % i)


def message_count(ch, name: str, count: int) -> int:
    def found() -> int:
        return ch.queue_declare(name, durable=True, passive=True).method.message_count

    return eventually_equal(found, count, 30, 0.05)


def drain(ch, name: str, count: int) -> list[bytes]:
    bodies = []
    ch.basic_qos(prefetch_count=1000)
    for method, _, body in ch.consume(name, inactivity_timeout=10):
        assert method is not None, f"{len(bodies)} of {count} came"
        bodies.append(body)
        if len(bodies) % 500 == 0 or len(bodies) == count:
            ch.basic_ack(method.delivery_tag, multiple=True)
        if len(bodies) == count:
            break
    ch.cancel()
    return bodies


def test_a_default_queue_keeps_a_long_backlog_in_memory_without_writing_it(broker):
    """No x-queue-mode, no x-max-in-memory-*: transient messages past the old 50,000
    default stay in memory, and none of them is written to the store."""
    conn, ch = open_channel(broker)
    ch.queue_declare("default", durable=True)
    publish(ch, "default", range(BEYOND_THE_OLD_DEFAULT))
    assert message_count(ch, "default", BEYOND_THE_OLD_DEFAULT) == BEYOND_THE_OLD_DEFAULT
    assert in_memory(broker, "default") == BEYOND_THE_OLD_DEFAULT
    assert paged(broker, "default") == 0
    assert stored_rows(broker) == 0
    everything = [b"m%06d" % i for i in range(BEYOND_THE_OLD_DEFAULT)]
    assert drain(ch, "default", BEYOND_THE_OLD_DEFAULT) == everything
    conn.close()


@pytest.mark.parametrize("persistent", [False, True])
def test_memory_pressure_pages_a_default_queue_out_and_it_pages_back_in_order(broker, persistent):
    """Past the memory watermark's paging ratio (the memory monitor, fed a resident size
    by hand) the messages in memory but a batch move to the store (a persistent one is
    there already) and new ones go to the store only; once the pressure is over, new
    messages keep going to the store until the paged-out ones are read back, and a
    consumer gets all of them in publication order."""
    resident = [100]
    monitor = broker.broker._memory_monitor

    def feed() -> None:
        monitor.limit = lambda: 1000  # paging above 500 (ratio 0.5)
        monitor._resident = lambda: resident[0]

    broker.call(feed)
    conn, ch = open_channel(broker)
    ch.queue_declare("default", durable=True)
    mode = 2 if persistent else 1

    def publish_range(bodies: range) -> None:
        for i in bodies:
            ch.basic_publish("", "default", b"m%06d" % i, pika.BasicProperties(delivery_mode=mode))

    publish_range(range(3000))
    assert message_count(ch, "default", 3000) == 3000
    assert (in_memory(broker, "default"), paged(broker, "default")) == (3000, 0)
    assert eventually_equal(lambda: stored_rows(broker), 3000 if persistent else 0) == (
        3000 if persistent else 0)

    resident[0] = 600
    eventually(lambda: broker.call(lambda: broker.core.memory_pressure))
    assert eventually_equal(lambda: paged(broker, "default"), 2000) == 2000  # a batch stays
    assert in_memory(broker, "default") == PAGE_IN_BATCH
    kept = 0 if persistent else PAGE_IN_BATCH  # transient ones in memory have no row
    assert eventually_equal(lambda: stored_rows(broker), 3000 - kept) == 3000 - kept
    publish_range(range(3000, 5000))
    assert message_count(ch, "default", 5000) == 5000
    assert (in_memory(broker, "default"), paged(broker, "default")) == (PAGE_IN_BATCH, 4000)
    assert eventually_equal(lambda: stored_rows(broker), 5000 - kept) == 5000 - kept

    resident[0] = 100
    eventually(lambda: not broker.call(lambda: broker.core.memory_pressure))
    publish_range(range(5000, 5500))  # behind the paged-out ones: paged too
    assert message_count(ch, "default", 5500) == 5500
    assert paged(broker, "default") == 4500

    assert drain(ch, "default", 5500) == [b"m%06d" % i for i in range(5500)]
    assert message_count(ch, "default", 0) == 0
    assert eventually_equal(lambda: stored_rows(broker), 0) == 0
    publish_range(range(5500, 5600))  # nothing paged out any more: in memory again
    assert message_count(ch, "default", 100) == 100
    assert (in_memory(broker, "default"), paged(broker, "default")) == (100, 0)
    conn.close()
