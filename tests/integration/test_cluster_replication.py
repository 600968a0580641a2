"""Shared metadata of a cluster (leveret.cluster.replication): two in-process nodes of
one cluster on the session's real PostgreSQL, real pika clients on each. A definition
declared on node A exists on node B before A's -ok is back (no waiting in the test),
deletes follow, transient entities are visible, ``balanced`` placement puts a queue on
B, and two nodes racing to declare one queue end with one owner."""

from __future__ import annotations

import threading

import pika
import pika.exceptions
import pytest
from eventually import eventually
from targets import Target, put, unique

from leveret.core.queues.remote import RemoteQueue
from leveret.server.broker import BlockingBroker

pytest.importorskip("psycopg")


def start_node(postgres, tmp_path, cluster: str, name: str) -> BlockingBroker:
    broker = BlockingBroker(
        store_url=postgres.url,
        store_cluster=cluster,
        node_name=name,
        data_dir=str(tmp_path / name),
        amqp_port=0,
        stomp_port=0,
        http_port=0,
    )
    broker.start()
    return broker


@pytest.fixture
def nodes(postgres, tmp_path):
    """Nodes "a" and "b" of a new cluster (b started once a is ready)."""
    cluster = unique("repl").replace("-", "_")
    started = [start_node(postgres, tmp_path, cluster, name) for name in ("a", "b")]
    yield started
    while OPEN:
        connection = OPEN.pop()
        try:
            if connection.is_open:
                connection.close()
        except pika.exceptions.AMQPError:  # (closed by the broker meanwhile)
            pass
    for broker in reversed(started):
        broker.stop()


OPEN: list[pika.BlockingConnection] = []


def channel_of(broker: BlockingBroker) -> pika.adapters.blocking_connection.BlockingChannel:
    connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
    OPEN.append(connection)
    return connection.channel()


def owner(broker: BlockingBroker, queue: str, vhost: str = "/") -> str | None:
    """The node ``broker`` believes owns ``queue`` (None: no such queue there)."""

    def look() -> str | None:
        found = broker.core.vhosts[vhost].queues.get(queue)
        if found is None:
            return None
        return found.owner if isinstance(found, RemoteQueue) else broker.broker.settings.node_name

    return broker.call(look)


def test_declarations_on_a_exist_on_b_before_the_ok(nodes) -> None:
    a, b = nodes
    on_a, on_b = channel_of(a), channel_of(b)
    on_a.exchange_declare("orders", "topic", durable=True)
    on_a.queue_declare("eu", durable=True)
    on_a.queue_bind("eu", "orders", "eu.#")
    # at once on B: no wait, no retry
    on_b.exchange_declare("orders", "topic", passive=True)
    on_b.queue_declare("eu", passive=True)
    assert owner(b, "eu") == "a"
    on_b.confirm_delivery()
    on_b.basic_publish("orders", "eu.fr", b"routed by the binding on B", mandatory=True)
    assert eventually(lambda: on_a.basic_get("eu", auto_ack=True)[2]) == b"routed by the binding on B"

    on_a.queue_unbind("eu", "orders", "eu.#")
    with pytest.raises(pika.exceptions.UnroutableError):
        on_b.basic_publish("orders", "eu.fr", b"no binding now", mandatory=True)
    on_a.queue_delete("eu")
    on_a.exchange_delete("orders")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as gone:
        on_b.queue_declare("eu", passive=True)
    assert gone.value.reply_code == 404
    on_b = channel_of(b)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker):
        on_b.exchange_declare("orders", "topic", passive=True)


def test_users_vhosts_permissions_and_policies_reach_b(nodes) -> None:
    """Through A's HTTP API: each 201/204 comes once B has the change."""
    a, b = nodes
    api = Target.of(a)
    put(api, "/api/vhosts/shop", {})
    put(api, "/api/users/clerk", {"password": "counter", "tags": "management"})
    put(api, "/api/permissions/shop/clerk", {"configure": "^c", "write": ".*", "read": ".*"})
    policy = {"pattern": "^capped$", "definition": {"max-length": 2}, "apply-to": "queues", "priority": 1}
    put(api, "/api/policies/shop/cap", policy)
    # at once on B: a login of the new user in the new vhost, the policy applied
    url = b.amqp_url.replace("guest:guest", "clerk:counter").rsplit("/", 1)[0] + "/shop"
    clerk = pika.BlockingConnection(pika.URLParameters(url))
    OPEN.append(clerk)
    channel = clerk.channel()
    channel.queue_declare("capped", durable=True)
    channel.confirm_delivery()
    for number in range(3):
        channel.basic_publish("", "capped", str(number).encode())
    assert channel.queue_declare("capped", passive=True).method.message_count == 2
    assert b.call(lambda: b.core.users.permissions[("shop", "clerk")].configure) == "^c"

    assert api.http("DELETE", "/api/users/clerk")[0] == 204
    users = b.core.users
    assert b.call(lambda: "clerk" not in users.users and ("shop", "clerk") not in users.permissions)
    assert api.http("DELETE", "/api/vhosts/shop")[0] == 204
    assert b.call(lambda: "shop" not in b.core.vhosts)


def test_a_queue_of_another_vhost_owned_by_b_is_used_from_a(nodes) -> None:
    """A's RemoteQueue of a queue in vhost ``shop`` links to B's ``shop``, not ``/``:
    a confirmed publish on A lands in it, and a consumer on A gets it back."""
    a, b = nodes
    api = Target.of(a)
    put(api, "/api/vhosts/shop", {})
    put(api, "/api/permissions/shop/guest", {"configure": ".*", "write": ".*", "read": ".*"})

    def connect(broker: BlockingBroker) -> pika.adapters.blocking_connection.BlockingChannel:
        connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url.rsplit("/", 1)[0] + "/shop"))
        OPEN.append(connection)
        return connection.channel()

    on_b = connect(b)
    on_b.queue_declare("parcels", durable=True)  # owned by B (client-local)
    assert owner(a, "parcels", "shop") == "b"
    on_a = connect(a)
    on_a.confirm_delivery()
    for number in range(5):
        on_a.basic_publish("", "parcels", str(number).encode(), mandatory=True)
    assert on_b.queue_declare("parcels", passive=True).method.message_count == 5
    got = [on_a.basic_get("parcels", auto_ack=True)[2] for _ in range(5)]
    assert got == [str(number).encode() for number in range(5)]


def test_a_transient_queue_and_exchange_are_visible_on_b(nodes) -> None:
    a, b = nodes
    on_a, on_b = channel_of(a), channel_of(b)
    on_a.exchange_declare("events", "fanout", durable=False)
    reply = on_a.queue_declare("", exclusive=True).method.queue
    on_a.queue_bind(reply, "events")
    on_b.exchange_declare("events", "fanout", passive=True)
    assert owner(b, reply) == "a"
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as locked:
        on_b.queue_declare(reply, passive=True)
    assert locked.value.reply_code == 405  # another connection's exclusive queue
    on_a.connection.close()  # its exclusive queue goes with it, on every node
    assert eventually(lambda: owner(b, reply) is None)


def test_balanced_placement_puts_a_queue_on_b(nodes) -> None:
    a, b = nodes
    on_a = channel_of(a)
    on_a.queue_declare("local-1", durable=True)  # a owns one queue, b none
    on_a.queue_declare("spread", durable=True, arguments={"x-queue-leader-locator": "balanced"})
    assert owner(a, "spread") == "b" and owner(b, "spread") == "b"
    assert owner(a, "local-1") == "a"
    on_b = channel_of(b)
    on_b.queue_declare("spread", passive=True)
    # exclusive and auto-delete queues stay local whatever the locator
    on_a.queue_declare("mine", auto_delete=True, arguments={"x-queue-leader-locator": "balanced"})
    assert owner(a, "mine") == "a"
    seconds = a.call(lambda: a.broker.cluster.replication.claim_max)
    print(f"longest queue claim on a: {seconds * 1000:.1f} ms")


def test_racing_declares_end_with_one_owner(nodes) -> None:
    a, b = nodes
    channels = [channel_of(a), channel_of(b)]
    names = [f"race-{number}" for number in range(10)]
    errors: list[BaseException] = []

    def declare(channel) -> None:
        try:
            for name in names:
                channel.queue_declare(name, durable=True)
        except BaseException as exc:  # the test reports it
            errors.append(exc)

    threads = [threading.Thread(target=declare, args=(channel,)) for channel in channels]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(15)
    assert errors == []
    for name in names:
        seen = {owner(a, name), owner(b, name)}
        assert len(seen) == 1 and seen <= {"a", "b"}, (name, seen)


def test_a_queue_deleted_on_a_goes_on_its_owner_b_with_its_consumers(nodes) -> None:
    a, b = nodes
    on_b = channel_of(b)
    on_b.queue_declare("jobs", durable=True)  # owned by b
    on_b.basic_publish("", "jobs", b"pending")
    cancelled: list[object] = []
    on_b.add_on_cancel_callback(cancelled.append)
    on_b.basic_consume("jobs", lambda *delivery: None)
    on_a = channel_of(a)
    on_a.queue_delete("jobs")
    # the delete-ok came once b applied it: b's queue is gone, its consumer cancelled
    assert owner(b, "jobs") is None and owner(a, "jobs") is None
    assert eventually(lambda: cancelled, wait=lambda s: on_b.connection.process_data_events(time_limit=s))


def test_a_node_restarted_catches_up_with_what_changed_meanwhile(nodes, postgres, tmp_path) -> None:
    a, b = nodes
    cluster = a.broker.settings.store_cluster
    b.stop()
    on_a = channel_of(a)
    on_a.exchange_declare("late", "direct")  # transient: in a's transient definitions
    on_a.queue_declare("late-q", durable=True)
    on_a.queue_bind("late-q", "late", "k")
    nodes[1] = b = start_node(postgres, tmp_path, cluster, "b")
    assert owner(b, "late-q") == "a"
    on_b = channel_of(b)
    on_b.confirm_delivery()
    on_b.basic_publish("late", "k", b"through the transient exchange", mandatory=True)
    assert eventually(lambda: on_a.basic_get("late-q", auto_ack=True)[2]) == b"through the transient exchange"
