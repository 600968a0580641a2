"""The message path between two nodes of a cluster (leveret.cluster.peers, RemoteQueue):
two in-process brokers wired by hand (tests/cluster_pair.py), node "b" owning the
queues, clients on node "a" with pika and stomp.py, over real TCP."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest
import stomp
from cluster_pair import Pair
from eventually import eventually as _eventually


def eventually(predicate, timeout: float = 15.0, **kwargs):
    """tests/eventually.py's, with room for a loaded machine (two brokers, a client)."""
    return _eventually(predicate, timeout=timeout, **kwargs)


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


def test_auto_ack_consumer_on_a_acks_the_owner(pair: Pair) -> None:
    pair.declare("q", "b", "x", ("k",))
    a = connect(pair, "a")
    channel = a.channel()
    channel.confirm_delivery()
    for i in range(50):
        channel.basic_publish("x", "k", b"m%d" % i, PERSISTENT)
    consumer = a.channel()
    got: list[bytes] = []
    consumer.basic_consume("q", lambda ch, m, p, body: got.append(body), auto_ack=True)
    eventually(lambda: len(got) == 50, wait=pump(a))
    assert got == [b"m%d" % i for i in range(50)]
    assert eventually(lambda: owner_figures(pair, "q") == (0, 0, 1), wait=pump(a))
    a.close()


def test_queue_deleted_on_owner_cancels_the_consumer_on_a(pair: Pair) -> None:
    pair.declare("q", "b", "x", ("k",))
    a = connect(pair, "a")
    consumer = a.channel()
    cancelled: list[str] = []
    consumer.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    tag = consumer.basic_consume("q", lambda ch, m, p, body: None)
    assert eventually(lambda: owner_figures(pair, "q")[2] == 1, wait=pump(a))
    b = connect(pair, "b")
    b.channel().queue_delete("q")
    assert eventually(lambda: cancelled == [tag], wait=pump(a))
    a.close()
    b.close()


def test_exclusive_consumer_on_a_holds_the_owners_queue(pair: Pair) -> None:
    pair.declare("q", "b", "x", ("k",))
    a = connect(pair, "a")
    a.channel().basic_consume("q", lambda ch, m, p, body: None, exclusive=True)
    assert eventually(lambda: owner_figures(pair, "q")[2] == 1, wait=pump(a))
    b = connect(pair, "b")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        b.channel().basic_consume("q", lambda ch, m, p, body: None)
    assert refused.value.reply_code == 403
    a.close()
    b.close()


def test_large_and_empty_bodies_pass_through_untouched(pair: Pair) -> None:
    pair.declare("q", "b", "x", ("k",))
    a = connect(pair, "a")
    channel = a.channel()
    channel.confirm_delivery()
    bodies = [bytes(range(256)) * 1200, b"", b"small"]  # 300 KiB: several frames
    headers = {"int": 7, "text": "é", "nested": {"list": [1, "two"]}, "bytes": b"\x00\xff"}
    properties = pika.BasicProperties(delivery_mode=2, headers=headers, content_type="x/y", priority=3)
    for body in bodies:
        channel.basic_publish("x", "k", body, properties)
    got: list[tuple[bytes, dict, str]] = []
    for _ in bodies:  # basic.get over the link
        _, props, body = channel.basic_get("q", auto_ack=True)
        got.append((body, props.headers, props.content_type))
    for body in bodies:
        channel.basic_publish("x", "k", body, properties)
    consumer = a.channel()  # relayed
    consumer.basic_consume(
        "q", lambda ch, m, p, body: got.append((body, p.headers, p.content_type)), auto_ack=True)
    eventually(lambda: len(got) == 6, wait=pump(a))
    assert [body for body, _, _ in got] == bodies + bodies
    assert all(h == headers and t == "x/y" for _, h, t in got)
    a.close()


def test_stomp_publisher_on_a_reaches_the_queue_on_b(pair: Pair) -> None:
    pair.declare("q", "b", "x", ("k",))
    stomp_port = int(pair.brokers["a"].stomp_url.rsplit(":", 1)[1])
    client = stomp.Connection([("127.0.0.1", stomp_port)])
    client.connect("guest", "guest", wait=True)
    for i in range(3):
        client.send("/exchange/x/k", f"from stomp {i}", headers={"persistent": "true", "app": "s"})
    client.disconnect()  # with a receipt: every SEND was handled
    b = connect(pair, "b")
    channel = b.channel()
    got = []
    bodies = []
    assert eventually(lambda: owner_figures(pair, "q")[0] == 3)
    for _ in range(3):
        _, props, body = channel.basic_get("q", auto_ack=True)
        bodies.append(body)
        got.append(props.headers.get("app"))
    assert bodies == [b"from stomp %d" % i for i in range(3)]
    assert got == ["s", "s", "s"]
    b.close()


def test_exchange_missing_on_the_owner_nacks_then_the_link_forwards_again(pair: Pair) -> None:
    pair.declare("q", "b", "x", ("k",))
    b = connect(pair, "b")
    b.channel().exchange_delete("x")  # on b only: a's copy still routes to q
    a = connect(pair, "a")
    channel = a.channel()
    channel.confirm_delivery()
    with pytest.raises(pika.exceptions.NackError):
        channel.basic_publish("x", "k", b"lost", PERSISTENT)
    again = b.channel()
    again.exchange_declare("x", "direct", durable=True)
    again.queue_bind("q", "x", "k")
    channel.basic_publish("x", "k", b"kept", PERSISTENT)
    assert owner_figures(pair, "q") == (1, 0, 0)
    assert channel.basic_get("q", auto_ack=True)[2] == b"kept"
    assert channel.basic_get("q", auto_ack=True) == (None, None, None)
    a.close()
    b.close()


def test_delete_over_the_link_honours_if_empty(pair: Pair) -> None:
    pair.declare("q", "b", "x", ("k",))
    a = connect(pair, "a")
    channel = a.channel()
    channel.confirm_delivery()
    channel.basic_publish("x", "k", b"one", PERSISTENT)
    channel.basic_publish("x", "k", b"two", PERSISTENT)
    broker = pair.brokers["a"]
    link = pair.peers["a"].link("b", "/")

    def delete(if_empty: bool):
        async def run():
            done = asyncio.get_running_loop().create_future()
            link.delete("q", False, if_empty, lambda count, error: done.set_result((count, error)))
            return await done
        return asyncio.run_coroutine_threadsafe(run(), broker._loop).result(10)

    _, error = delete(if_empty=True)
    assert error is not None and error[0] == 406
    assert delete(if_empty=False) == (2, None)
    assert "q" not in pair.brokers["b"].call(lambda: dict(pair.brokers["b"].core.vhosts["/"].queues))
    a.close()


def test_a_slow_owner_holds_the_publishers_on_a(pair: Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from leveret.cluster import peers

    monkeypatch.setattr(peers, "FLOW_HIGH", 20)
    monkeypatch.setattr(peers, "FLOW_LOW", 5)
    pair.declare("q", "b", "x", ("k",), durable=False)
    a = connect(pair, "a")
    channel = a.channel()
    channel.basic_publish("x", "k", b"warm")  # the link is up
    assert eventually(lambda: owner_figures(pair, "q")[0] == 1)
    core = pair.brokers["a"].core
    stall = threading.Thread(target=pair.brokers["b"].call, args=(time.sleep, 1.5))
    stall.start()  # b's loop reads nothing for 1.5 s: no confirms
    for i in range(50):
        channel.basic_publish("x", "k", b"m%d" % i)
    assert eventually(lambda: pair.brokers["a"].call(lambda: core.flow.active), wait=pump(a))
    stall.join()
    assert eventually(lambda: not pair.brokers["a"].call(lambda: core.flow.active), wait=pump(a))
    assert eventually(lambda: owner_figures(pair, "q")[0] == 51, wait=pump(a))
    a.close()


def test_stomp_selector_on_a_is_applied_by_the_owner(pair: Pair) -> None:
    pair.declare("q", "b", "x", ("k",))
    a = connect(pair, "a")
    channel = a.channel()
    channel.confirm_delivery()
    for i in range(6):
        properties = pika.BasicProperties(delivery_mode=2, headers={"colour": "red" if i % 2 else "blue"})
        channel.basic_publish("x", "k", b"m%d" % i, properties)
    stomp_port = int(pair.brokers["a"].stomp_url.rsplit(":", 1)[1])
    received: list[str] = []

    class Listener(stomp.ConnectionListener):
        def on_message(self, frame) -> None:
            received.append(frame.body)

    client = stomp.Connection([("127.0.0.1", stomp_port)])
    client.set_listener("", Listener())
    client.connect("guest", "guest", wait=True)
    client.subscribe("/amq/queue/q", id="1", ack="auto", headers={"selector": "colour = 'red'"})
    eventually(lambda: len(received) == 3)
    time.sleep(0.2)
    assert received == ["m1", "m3", "m5"]
    assert eventually(lambda: owner_figures(pair, "q")[0] == 3)
    client.disconnect()
    a.close()


def test_links_are_not_listed_nor_limited_as_client_connections(pair: Pair) -> None:
    pair.declare("q", "b", "x", ("k",))
    b_core = pair.brokers["b"].core
    pair.brokers["b"].call(lambda: b_core.vhosts["/"].limits.update({"max-connections": 1}))
    client_on_b = connect(pair, "b")  # the one client connection b allows
    a = connect(pair, "a")
    channel = a.channel()
    channel.confirm_delivery()
    channel.basic_publish("x", "k", b"through the link", PERSISTENT)  # the link is not refused
    assert owner_figures(pair, "q")[0] == 1
    assert pair.brokers["b"].call(lambda: len(b_core.connections)) == 1
    a.close()
    client_on_b.close()


def test_acks_after_basic_cancel_still_reach_the_owner(pair: Pair) -> None:
    pair.declare("q", "b", "x", ("k",))
    a = connect(pair, "a")
    channel = a.channel()
    channel.confirm_delivery()
    for i in range(10):
        channel.basic_publish("x", "k", b"m%d" % i, PERSISTENT)
    consumer = a.channel()
    consumer.basic_qos(prefetch_count=3)
    got: list[int] = []
    tag = consumer.basic_consume("q", lambda ch, m, p, body: got.append(m.delivery_tag))
    eventually(lambda: len(got) == 3, wait=pump(a))
    consumer.basic_cancel(tag)
    assert eventually(lambda: owner_figures(pair, "q") == (7, 3, 0), wait=pump(a))
    for delivery_tag in got:  # settled after the cancel: acknowledged on the owner, not requeued
        consumer.basic_ack(delivery_tag)
    assert eventually(lambda: owner_figures(pair, "q") == (7, 0, 0), wait=pump(a))
    a.close()


def test_node_lost_drops_the_link_at_once(pair: Pair) -> None:
    pair.declare("q", "b", "x", ("k",))
    a = connect(pair, "a")
    consumer = a.channel()
    cancelled: list[str] = []
    consumer.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    tag = consumer.basic_consume("q", lambda ch, m, p, body: None)
    assert eventually(lambda: owner_figures(pair, "q")[2] == 1, wait=pump(a))
    pair.brokers["a"].call(pair.peers["a"].node_lost, "b")  # as the node runtime says when b's lock went
    assert eventually(lambda: cancelled == [tag], wait=pump(a))
    assert eventually(lambda: owner_figures(pair, "q")[2] == 0, wait=pump(a))  # b saw the link go
    a.close()


def test_a_full_queue_on_the_owner_nacks_the_publish_on_a(pair: Pair) -> None:
    pair.declare("q", "b", "x", ("k",), arguments={"x-max-length": 2, "x-overflow": "reject-publish"})
    a = connect(pair, "a")
    channel = a.channel()
    channel.confirm_delivery()
    channel.basic_publish("x", "k", b"one", PERSISTENT)
    channel.basic_publish("x", "k", b"two", PERSISTENT)
    with pytest.raises(pika.exceptions.NackError):
        channel.basic_publish("x", "k", b"three", PERSISTENT)
    assert owner_figures(pair, "q")[0] == 2
    channel.basic_get("q", auto_ack=True)
    channel.basic_publish("x", "k", b"four", PERSISTENT)  # room again: confirmed
    a.close()


def test_cc_and_bcc_keys_route_on_the_owner(pair: Pair) -> None:
    pair.declare("main", "b", "x", ("k",))
    pair.declare("copied", "b", "x", ("k2",))
    pair.declare("hidden", "b", "x", ("k3",))
    a = connect(pair, "a")
    channel = a.channel()
    channel.confirm_delivery()
    properties = pika.BasicProperties(delivery_mode=2, headers={"CC": ["k2"], "BCC": ["k3"]})
    channel.basic_publish("x", "k", b"m", properties)
    for queue in ("main", "copied", "hidden"):
        assert owner_figures(pair, queue)[0] == 1, queue
        _, props, body = channel.basic_get(queue, auto_ack=True)
        assert body == b"m" and props.headers == {"CC": ["k2"]}  # BCC never reaches a consumer
    a.close()


def test_two_nodes_forwarding_persistent_messages_to_each_other_both_get_their_confirms(pair: Pair) -> None:
    """a publishes to b's queue while b publishes to a's, with confirms in a window: an
    owner's confirm of a forwarded publish waits for its own store only, not for its own
    forwards the other way (which waited for this one: both stalled after a few)."""
    from leveret.amqp.client import Connection

    pair.declare("on-a", "a")
    pair.declare("on-b", "b")

    async def publish(node: str, queue: str) -> int:
        connection = await Connection.connect(pair.url(node))
        channel = await connection.channel()
        await channel.confirm_select()
        for _ in range(40):
            channel.publish_many("", queue, [b"x" * 100] * 50, {"delivery_mode": 2})
            await channel.wait_confirms(timeout=10)
        confirmed = channel.settled_below - 1
        await connection.close()
        return confirmed

    async def both() -> list[int]:
        return list(await asyncio.gather(publish("a", "on-b"), publish("b", "on-a")))

    assert asyncio.run(asyncio.wait_for(both(), 60)) == [2000, 2000]
