"""The message path between two nodes of a cluster (leveret.cluster.peers, RemoteQueue):
two in-process brokers wired by hand (tests/cluster_pair.py), node "b" owning the
queues, clients on node "a" with pika and stomp.py, over real TCP."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest
import stomp
from cluster_pair import Pair
from eventually import eventually


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Pair]:
    nodes = Pair(tmp_path)
    yield nodes
    nodes.close()


def connect(pair: Pair, node: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(pair.url(node)))


def pump(connection: pika.BlockingConnection):
    return lambda seconds: connection.process_data_events(time_limit=seconds)


def owner_figures(pair: Pair, queue: str) -> tuple[int, int, int]:
    """(ready, unacked, consumers) of the real queue on node b."""
    def read() -> tuple[int, int, int]:
        real = pair.brokers["b"].core.vhosts["/"].queues[queue]
        return real.message_count, real.unacked_count, len(real.consumers)
    return pair.brokers["b"].call(read)


PERSISTENT = pika.BasicProperties(delivery_mode=2)


def test_publish_on_a_consumed_on_b_and_on_a_with_prefetch(pair: Pair) -> None:
    pair.declare("q", "b", "x", ("k",))
    a = connect(pair, "a")
    channel = a.channel()
    channel.confirm_delivery()
    for i in range(40):
        channel.basic_publish("x", "k", b"m%d" % i, pika.BasicProperties(delivery_mode=2, headers={"n": i}))
    assert owner_figures(pair, "q") == (40, 0, 0)
    # on b itself: headers and body as published on a
    b = connect(pair, "b")
    method, props, body = b.channel().basic_get("q", auto_ack=True)
    assert (body, props.headers, props.delivery_mode, method.exchange, method.routing_key) == (
        b"m0", {"n": 0}, 2, "x", "k")
    # relayed to a consumer on a: no more than its prefetch unacknowledged
    consumer = a.channel()
    consumer.basic_qos(prefetch_count=5)
    got: list[tuple[int, bytes]] = []
    consumer.basic_consume("q", lambda ch, m, p, body: got.append((m.delivery_tag, body)))
    eventually(lambda: len(got) >= 5, wait=pump(a))
    a.process_data_events(time_limit=0.3)
    assert [body for _, body in got] == [b"m%d" % i for i in range(1, 6)]
    assert owner_figures(pair, "q") == (34, 5, 1)
    consumer.basic_ack(got[-1][0], multiple=True)
    eventually(lambda: len(got) >= 10, wait=pump(a))
    a.process_data_events(time_limit=0.3)
    assert len(got) == 10
    assert owner_figures(pair, "q")[1] == 5
    a.close()
    b.close()


def test_acks_nacks_rejects_reach_the_owner(pair: Pair) -> None:
    pair.declare("q", "b", "x", ("k",))
    pair.declare("dead", "b")
    b = connect(pair, "b")
    b.channel().queue_declare("q2", durable=True, arguments={"x-dead-letter-exchange": "",
                                                               "x-dead-letter-routing-key": "dead"})
    a = connect(pair, "a")
    channel = a.channel()
    channel.confirm_delivery()
    for i in range(3):
        channel.basic_publish("x", "k", b"m%d" % i, PERSISTENT)
    consumer = a.channel()
    consumer.basic_qos(prefetch_count=10)
    got: list[tuple[int, bool, bytes]] = []
    consumer.basic_consume("q", lambda ch, m, p, body: got.append((m.delivery_tag, m.redelivered, body)))
    eventually(lambda: len(got) == 3, wait=pump(a))
    assert [r for _, r, _ in got] == [False, False, False]
    consumer.basic_nack(got[0][0], requeue=True)  # comes back, redelivered
    eventually(lambda: len(got) == 4, wait=pump(a))
    assert got[3][1:] == (True, b"m0")
    consumer.basic_ack(got[1][0])
    consumer.basic_reject(got[2][0], requeue=False)  # dropped on the owner (no DLX on q)
    consumer.basic_ack(got[3][0])
    assert eventually(lambda: owner_figures(pair, "q") == (0, 0, 1), wait=pump(a))
    a.close()
    assert eventually(lambda: owner_figures(pair, "q") == (0, 0, 0))


def test_channel_close_returns_unacked_to_the_owner(pair: Pair) -> None:
    pair.declare("q", "b", "x", ("k",))
    a = connect(pair, "a")
    channel = a.channel()
    channel.confirm_delivery()
    for i in range(4):
        channel.basic_publish("x", "k", b"m%d" % i, PERSISTENT)
    consumer = a.channel()
    got: list[bytes] = []
    consumer.basic_consume("q", lambda ch, m, p, body: got.append(body))
    eventually(lambda: len(got) == 4, wait=pump(a))
    consumer.close()
    assert eventually(lambda: owner_figures(pair, "q") == (4, 0, 0), wait=pump(a))
    b = connect(pair, "b")
    method, _, body = b.channel().basic_get("q", auto_ack=True)
    assert (body, method.redelivered) == (b"m0", True)
    a.close()
    b.close()


def test_basic_get_on_a(pair: Pair) -> None:
    pair.declare("q", "b", "x", ("k",))
    a = connect(pair, "a")
    channel = a.channel()
    channel.confirm_delivery()
    for i in range(3):
        properties = pika.BasicProperties(delivery_mode=2, message_id=f"id{i}")
        channel.basic_publish("x", "k", b"m%d" % i, properties)
    method, props, body = channel.basic_get("q")
    assert (body, props.message_id, method.redelivered) == (b"m0", "id0", False)
    assert method.message_count == 2
    channel.basic_nack(method.delivery_tag, requeue=True)
    method, props, body = channel.basic_get("q")
    assert (body, method.redelivered) == (b"m0", True)
    channel.basic_ack(method.delivery_tag)
    method, _, body = channel.basic_get("q", auto_ack=True)
    assert body == b"m1"
    method, _, body = channel.basic_get("q", auto_ack=True)
    assert body == b"m2"
    assert channel.basic_get("q") == (None, None, None)
    assert eventually(lambda: owner_figures(pair, "q") == (0, 0, 0), wait=pump(a))
    a.close()


def test_per_channel_order_over_10k_messages(pair: Pair) -> None:
    pair.declare("q", "b", "x", ("k",), durable=False)
    a = connect(pair, "a")
    publisher = a.channel()
    total = 10000
    for i in range(total):
        publisher.basic_publish("x", "k", str(i).encode())
    consumer = a.channel()
    consumer.basic_qos(prefetch_count=500)
    got: list[int] = []

    def on_message(ch, method, props, body):
        got.append(int(body))
        if len(got) % 100 == 0:
            ch.basic_ack(method.delivery_tag, multiple=True)

    consumer.basic_consume("q", on_message)
    eventually(lambda: len(got) >= total, timeout=30, wait=pump(a))
    assert got == list(range(total))
    a.close()


def test_confirm_on_a_only_once_b_stored_it(pair: Pair, tmp_path: Path) -> None:
    pair.declare("q", "b", "x", ("k",))
    a = connect(pair, "a")
    channel = a.channel()
    channel.confirm_delivery()
    database = sqlite3.connect(tmp_path / "b" / "leveret.db")
    try:
        for i in range(30):
            channel.basic_publish("x", "k", b"persistent %d" % i, PERSISTENT)  # waits for the confirm
            stored = database.execute(
                "SELECT count(*) FROM messages WHERE body = ?", (b"persistent %d" % i,)).fetchone()[0]
            assert stored == 1, f"message {i} confirmed on a before b stored it"
    finally:
        database.close()
    a.close()


def test_owner_stopped_gives_negative_confirms_and_cancels_consumers(pair: Pair) -> None:
    pair.declare("q", "b", "x", ("k",))
    a = connect(pair, "a")
    channel = a.channel()
    channel.confirm_delivery()
    channel.basic_publish("x", "k", b"before", PERSISTENT)
    consumer = a.channel()
    cancelled: list[str] = []
    got: list[bytes] = []
    consumer.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    tag = consumer.basic_consume("q", lambda ch, m, p, body: got.append(body))
    eventually(lambda: got == [b"before"], wait=pump(a))
    pair.stop("b")
    assert eventually(lambda: cancelled == [tag], wait=pump(a))
    with pytest.raises(pika.exceptions.NackError):
        channel.basic_publish("x", "k", b"after", PERSISTENT)
    time.sleep(1.1)  # past the link's retry delay: it tries to connect again, and fails
    with pytest.raises(pika.exceptions.NackError):
        channel.basic_publish("x", "k", b"later", PERSISTENT)
    a.close()


def test_fanout_to_queues_on_two_owners_forwards_once_per_owner(tmp_path: Path) -> None:
    nodes = Pair(tmp_path, ("a", "b", "c"))
    try:
        nodes.declare("q1", "b", "f", ("",), exchange_type="fanout")
        nodes.declare("q2", "b", "f", ("",), exchange_type="fanout")
        nodes.declare("q3", "c", "f", ("",), exchange_type="fanout")
        a = connect(nodes, "a")
        channel = a.channel()
        channel.confirm_delivery()
        for i in range(20):
            channel.basic_publish("f", "", b"m%d" % i, PERSISTENT)

        def counts(node: str, *queues: str) -> list[int]:
            def read() -> list[int]:
                vhost = nodes.brokers[node].core.vhosts["/"]
                return [vhost.queues[name].message_count for name in queues]
            return nodes.brokers[node].call(read)

        assert counts("b", "q1", "q2") == [20, 20]
        assert counts("c", "q3") == [20]
        sent = nodes.brokers["a"].call(
            lambda: {key: link.sent for key, link in nodes.peers["a"].links.items()})
        assert sent == {("b", "/"): 20, ("c", "/"): 20}
        a.close()
    finally:
        nodes.close()


def test_stomp_subscriber_on_a_of_a_queue_on_b(pair: Pair) -> None:
    pair.declare("q", "b", "x", ("k",))
    a = connect(pair, "a")
    channel = a.channel()
    channel.confirm_delivery()
    for i in range(5):
        properties = pika.BasicProperties(delivery_mode=2, headers={"n": i})
        channel.basic_publish("x", "k", b"stomp %d" % i, properties)
    stomp_port = int(pair.brokers["a"].stomp_url.rsplit(":", 1)[1])
    received: list[tuple[str, dict]] = []

    class Listener(stomp.ConnectionListener):
        def on_message(self, frame) -> None:
            received.append((frame.body, frame.headers))

    client = stomp.Connection([("127.0.0.1", stomp_port)])
    client.set_listener("", Listener())
    client.connect("guest", "guest", wait=True)
    client.subscribe("/amq/queue/q", id="1", ack="client-individual")
    eventually(lambda: len(received) == 5)
    assert [body for body, _ in received] == [f"stomp {i}" for i in range(5)]
    assert received[0][1]["n"] == "0"
    for _, headers in received:
        client.ack(headers["message-id"], "1")
    assert eventually(lambda: owner_figures(pair, "q") == (0, 0, 1))
    client.disconnect()
    a.close()
