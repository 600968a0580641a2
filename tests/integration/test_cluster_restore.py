"""A queue's stand-in swapped in place (leveret.cluster.restore), on a real broker with
its store: the real queue becomes a RemoteQueue of another node (a move away) and is
restored from the store again (a takeover): bindings follow, every persistent message
comes back, redelivered set on those delivered before."""

from __future__ import annotations

import threading

import pika
import pytest

from leveret.cluster.restore import make_remote, restore_queue, totals
from leveret.core.queues.remote import RemoteQueue
from leveret.server.broker import BlockingBroker


@pytest.fixture
def broker(tmp_path):
    with BlockingBroker(amqp_port=0, data_dir=str(tmp_path / "data")) as running:
        yield running


def committed(broker: BlockingBroker) -> None:
    """Until the store wrote everything it holds now."""
    done = threading.Event()
    broker.call(lambda: broker.core.store.when_durable(lambda ok: done.set()))
    assert done.wait(5)


def test_a_queue_moved_away_and_restored_keeps_bindings_and_messages(broker):
    connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
    channel = connection.channel()
    channel.queue_declare("q", durable=True)
    channel.queue_bind("q", "amq.direct", "k")
    channel.confirm_delivery()
    for number in range(20):
        channel.basic_publish("amq.direct", "k", f"m{number}".encode(), pika.BasicProperties(delivery_mode=2))
    channel.basic_qos(prefetch_count=5)
    held = []
    channel.basic_consume("q", lambda ch, method, props, body: held.append(body.decode()))
    while len(held) < 5:
        connection.process_data_events(time_limit=0.05)
    connection.close()  # the 5 go back, delivered once
    committed(broker)
    vhost = broker.core.vhosts["/"]

    def away():
        remote = make_remote(vhost, vhost.queues["q"], "n2", None)
        return remote, [b.source.name for b in remote.bindings]

    remote, sources = broker.call(away)
    assert isinstance(remote, RemoteQueue) and remote.owner == "n2"
    assert "amq.direct" in sources
    queue_id = remote.queue_id
    counts = broker.call(lambda: broker.core.store.count_blocks(queue_id))
    assert totals(counts)[0] == 20

    def back():
        queue = restore_queue(vhost, vhost.queues["q"], queue_id, broker.core.store, counts)
        return queue, [b.source.name for b in queue.bindings], remote.bindings

    queue, sources, left = broker.call(back)
    assert not isinstance(queue, RemoteQueue) and "amq.direct" in sources and not left
    connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
    channel = connection.channel()
    channel.basic_publish("amq.direct", "k", b"after", pika.BasicProperties(delivery_mode=2))
    found = []
    while True:
        method, _, body = channel.basic_get("q", auto_ack=True)
        if method is None:
            break
        found.append((body.decode(), method.redelivered))
    connection.close()
    assert [body for body, _ in found] == [f"m{n}" for n in range(20)] + ["after"]
    assert {body for body, again in found if again} == set(held)


def test_a_restored_queue_keeps_its_deduplication_keys(broker):
    connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
    channel = connection.channel()
    channel.queue_declare("once", durable=True, arguments={"x-message-deduplication": True})
    channel.confirm_delivery()
    channel.basic_publish("", "once", b"first", pika.BasicProperties(delivery_mode=2, message_id="k1"))
    committed(broker)
    vhost = broker.core.vhosts["/"]
    store = broker.core.store

    def swap_both_ways():
        remote = make_remote(vhost, vhost.queues["once"], "n2", None)
        queue_id = remote.queue_id
        counts, keys = store.count_blocks(queue_id), store.read_dedup(queue_id)
        restore_queue(vhost, remote, queue_id, store, counts, keys)

    broker.call(swap_both_ways)
    channel.basic_publish("", "once", b"again", pika.BasicProperties(delivery_mode=2, message_id="k1"))
    channel.basic_publish("", "once", b"other", pika.BasicProperties(delivery_mode=2, message_id="k2"))
    found = []
    while (got := channel.basic_get("once", auto_ack=True))[0] is not None:
        found.append(got[2])
    connection.close()
    assert found == [b"first", b"other"]
