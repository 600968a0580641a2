"""Active cluster nodes on a real PostgreSQL, as real processes with real clients
(pika): a one-node cluster serves, a second node joins, a killed owner's durable queue
is taken over with its persistent messages, a graceful stop hands queues over at once,
and a node whose database session ends fences itself and exits."""

from __future__ import annotations

import time

import pika
import pika.exceptions
import pytest
from cluster_nodes import GRACE, LEASE, ClusterNode, live_nodes, owner, start_nodes, writer_pid
from eventually import eventually
from targets import unique

QUEUE = "orders"
CLIENT_ERRORS = (pika.exceptions.AMQPError, OSError)


@pytest.fixture
def cluster_name() -> str:
    return unique("nodes").replace("-", "_")


@pytest.fixture
def stop_all():
    """Nodes a test started, killed at its end."""
    started: list[ClusterNode] = []
    yield started
    for node in started:
        node.kill()


def connect(node: ClusterNode) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(node.url))


def fill(node: ClusterNode, count: int, queue: str = QUEUE) -> None:
    """Declare durable ``queue`` on ``node`` and publish ``count`` persistent messages
    with confirms."""
    with connect(node) as connection:
        channel = connection.channel()
        channel.queue_declare(queue, durable=True)
        channel.confirm_delivery()
        for number in range(count):
            channel.basic_publish(
                "", queue, f"m{number}".encode(), pika.BasicProperties(delivery_mode=2), mandatory=True
            )


def get_all(node: ClusterNode, queue: str = QUEUE) -> list[tuple[str, bool]] | None:
    """Every message of ``queue`` by basic.get on ``node`` (acked): (body, redelivered);
    None while the node cannot serve the queue."""
    try:
        with connect(node) as connection:
            channel = connection.channel()
            found = []
            while True:
                method, _, body = channel.basic_get(queue)
                if method is None:
                    return found
                found.append((body.decode(), method.redelivered))
                channel.basic_ack(method.delivery_tag)
    except CLIENT_ERRORS:
        return None


def message_count(node: ClusterNode, queue: str) -> int | None:
    """``queue``'s ready messages on ``node`` (passive queue.declare); None if it has
    no such queue or cannot answer."""
    try:
        with connect(node) as connection:
            return connection.channel().queue_declare(queue, passive=True).method.message_count
    except CLIENT_ERRORS:
        return None


def test_a_one_node_cluster_serves_pika(postgres, tmp_path, cluster_name, stop_all):
    node = ClusterNode(tmp_path / "n1", postgres.url, cluster_name, "n1").start()
    stop_all.append(node)
    assert node.wait_for("leveret ready").rstrip().endswith(" node n1")
    fill(node, 20)
    assert [body for body, _ in get_all(node) or []] == [f"m{n}" for n in range(20)]
    assert live_nodes(postgres, cluster_name) == {"n1"}
    assert owner(postgres, cluster_name, QUEUE) == "n1"


def test_a_second_node_joins(postgres, tmp_path, cluster_name, stop_all):
    first, second = start_nodes(tmp_path, postgres.url, cluster_name, 2)
    stop_all.extend([first, second])
    assert live_nodes(postgres, cluster_name) == {"n1", "n2"}
    fill(second, 5, "on-n2")
    assert owner(postgres, cluster_name, "on-n2") == "n2"  # client-local: the declaring node


def test_kill_9_of_an_owner_moves_its_durable_queue_with_every_persistent_message(
    postgres, tmp_path, cluster_name, stop_all
):
    first, second = start_nodes(tmp_path, postgres.url, cluster_name, 2)
    stop_all.extend([first, second])
    fill(first, 50)
    assert owner(postgres, cluster_name, QUEUE) == "n1"
    with connect(first) as declaring:
        declaring.channel().queue_declare("scratch")  # non-durable: goes with its node
    assert message_count(second, "scratch") == 0
    # 10 delivered and left unacked on the owner: they come back redelivered
    connection = connect(first)
    channel = connection.channel()
    channel.basic_qos(prefetch_count=10)
    held: list[bytes] = []
    channel.basic_consume(QUEUE, lambda ch, method, props, body: held.append(body))
    eventually(lambda: len(held) == 10, wait=lambda s: connection.process_data_events(time_limit=s))
    assert len(held) == 10
    # (a delivery's count reaches the store with the owner's next batch, a few ms later:
    # a message delivered in the instant before a crash may come back unflagged)
    counted = f'SELECT count(*) FROM "{cluster_name}".messages WHERE delivery_count > 0'
    assert eventually(lambda: postgres.sql(counted) == [(10,)])
    killed = time.monotonic()
    first.kill()
    found = eventually(lambda: get_all(second), timeout=15, interval=0.1)
    took = time.monotonic() - killed
    assert found, second.log()[-3000:]
    assert sorted(body for body, _ in found) == sorted(f"m{n}" for n in range(50))
    redelivered = {body for body, again in found if again}
    assert redelivered == {body.decode() for body in held}
    assert took < 10, f"the takeover took {took:.2f} s"
    assert took >= GRACE  # never before the dead node's lease could have run out
    assert owner(postgres, cluster_name, QUEUE) == "n2"
    assert "took over 1 queues of node n1" in second.log()
    assert message_count(second, "scratch") is None  # 404 NOT_FOUND: deleted, as RabbitMQ does


def test_a_graceful_stop_hands_the_queues_over_at_once(postgres, tmp_path, cluster_name, stop_all):
    # a long grace: a handover that waited for it would fail the timing below
    first, second = start_nodes(tmp_path, postgres.url, cluster_name, 2, grace=12.0)
    stop_all.extend([first, second])
    fill(first, 30)
    stopped = time.monotonic()
    assert first.terminate() == 0
    found = eventually(lambda: get_all(second), timeout=10, interval=0.05)
    took = time.monotonic() - stopped
    assert [body for body, _ in found or []] == [f"m{n}" for n in range(30)]
    assert took < 8, f"the handover took {took:.2f} s"
    assert owner(postgres, cluster_name, QUEUE) == "n2"
    state = postgres.sql(f"SELECT state FROM \"{cluster_name}\".cluster_nodes WHERE name='n1'")
    assert state == [("left",)]


def test_a_node_whose_session_is_ended_fences_itself_and_exits(postgres, tmp_path, cluster_name, stop_all):
    first, second = start_nodes(tmp_path, postgres.url, cluster_name, 2)
    stop_all.extend([first, second])
    fill(first, 10)
    pid = writer_pid(postgres, cluster_name, "n1")
    assert pid is not None
    postgres.sql("SELECT pg_terminate_backend(%s)", pid)
    assert first.proc is not None
    code = first.proc.wait(LEASE + 10)
    assert code != 0
    assert "fenced: " in first.log()
    with pytest.raises(CLIENT_ERRORS):
        connect(first)
    found = eventually(lambda: get_all(second), timeout=15, interval=0.1)
    assert [body for body, _ in found or []] == [f"m{n}" for n in range(10)]


def test_a_node_whose_database_stops_answering_fences_itself_within_its_lease(
    postgres, tmp_path, cluster_name, stop_all
):
    import os
    import signal

    (node,) = start_nodes(tmp_path, postgres.url, cluster_name, 1)
    stop_all.append(node)
    pid = writer_pid(postgres, cluster_name, "n1")
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)  # its session lives on, but answers nothing: the lease runs out
    try:
        stopped = time.monotonic()
        assert node.proc is not None
        code = node.proc.wait(LEASE + 10)
        took = time.monotonic() - stopped
    finally:
        os.kill(pid, signal.SIGCONT)
    assert code != 0
    assert "fenced: " in node.log() and "no successful round trip" in node.log()
    assert took < LEASE + 5, f"fenced after {took:.2f} s"


def test_a_taken_over_queue_keeps_its_timers_and_the_dead_nodes_delayed_messages(
    postgres, tmp_path, cluster_name, stop_all
):
    first, second = start_nodes(tmp_path, postgres.url, cluster_name, 2)
    stop_all.extend([first, second])
    with connect(first) as connection:
        channel = connection.channel()
        channel.exchange_declare(
            "later", "x-delayed-message", durable=True, arguments={"x-delayed-type": "direct"}
        )
        channel.queue_declare("timed", durable=True)
        channel.queue_bind("timed", "later", "k")
        channel.confirm_delivery()
        published = time.monotonic()
        expiring = pika.BasicProperties(delivery_mode=2, expiration="5000")
        channel.basic_publish("", "timed", b"expires", expiring)
        channel.basic_publish("", "timed", b"stays", pika.BasicProperties(delivery_mode=2))
        channel.basic_publish(
            "later", "k", b"delayed", pika.BasicProperties(delivery_mode=2, headers={"x-delay": 4000})
        )
    assert owner(postgres, cluster_name, "timed") == "n1"
    first.kill()
    # taken over (GRACE after the kill) with both messages, before the TTL runs out
    assert eventually(lambda: message_count(second, "timed") == 2, timeout=10, interval=0.05)
    # the delayed message fires on the survivor at its time, the TTL ends as stored: a
    # TTL counted again from the takeover (>= GRACE after the kill) would end after 6.5 s
    time.sleep(max(0.0, 5.5 - (time.monotonic() - published)))
    reading = time.monotonic() - published
    found = [body for body, _ in get_all(second, "timed") or []]
    assert reading < 5 + GRACE, f"read {reading:.2f} s after the publish: too late to tell"
    assert found == ["stays", "delayed"]


def test_a_dead_nodes_queues_spread_over_the_survivors_each_after_the_grace(
    postgres, tmp_path, cluster_name, stop_all
):
    nodes = start_nodes(tmp_path, postgres.url, cluster_name, 3)
    stop_all.extend(nodes)
    first, second, third = nodes
    for name in ("a", "b"):
        fill(first, 5, name)
    first.kill()
    killed = time.monotonic()
    # one survivor takes the dead node over and gives each survivor a queue (balanced);
    # the other learns it from the change log: both wait the grace before serving
    assert eventually(lambda: {owner(postgres, cluster_name, q) for q in "ab"} == {"n2", "n3"}, timeout=5)
    served = {}
    for name in ("a", "b"):
        holder = second if owner(postgres, cluster_name, name) == "n2" else third
        other = third if holder is second else second
        found = eventually(lambda h=holder, q=name: get_all(h, q), timeout=10, interval=0.05)
        served[name] = time.monotonic() - killed
        assert [body for body, _ in found or []] == [f"m{n}" for n in range(5)]
        fill(other, 1, name)  # published on the other survivor: forwarded to the new owner
        assert [body for body, _ in get_all(other, name) or []] == ["m0"]
    assert min(served.values()) >= GRACE
    logs = second.log() + third.log()
    assert logs.count("took over 1 queues of node n1") == 2, logs[-3000:]
