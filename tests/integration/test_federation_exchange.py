"""Exchange federation between leverets over real TCP, as RabbitMQ 3.10's
``rabbitmq_federation`` does it: the topology a downstream declares on its upstream
(names, arguments, ``x-bound-from`` bindings), messages moving by the downstream's
binding keys, bindings kept in step, ``max-hops`` along a line and no loop round a
cycle, ``x-received-from``, ``trust-user-id`` and the ack modes; and the
``x-federation-upstream`` exchange type a RabbitMQ downstream declares on leveret."""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Iterator
from contextlib import ExitStack

import pika
import pytest
from targets import Target

from leveret import BlockingBroker

TIMEOUT = 8.0  # seconds for a link or a message to get somewhere


class Node:
    """One leveret broker (AMQP and HTTP on free ports) named ``cluster_name``."""

    def __init__(self, broker: BlockingBroker, cluster_name: str) -> None:
        self.broker, self.target = broker, Target.of(broker)
        self.name = cluster_name
        status, _ = self.target.http("PUT", "/api/global-parameters/cluster_name", {"value": cluster_name})
        assert status in (201, 204)
        self.connection = self.target.amqp()
        self.channel = self.connection.channel()
        self.opened = [self.connection]

    def publisher(self) -> pika.adapters.blocking_connection.BlockingChannel:
        """A channel on a connection of its own (closed with the node: a broker waits
        for a client's close-ok when it stops)."""
        self.opened.append(self.target.amqp())
        return self.opened[-1].channel()

    def federate(self, upstream: Node, pattern: str = "^fx$", **options: object) -> None:
        """An upstream named after ``upstream`` and a policy federating ``pattern``."""
        value = {"uri": upstream.target.url(), "reconnect-delay": 1, **options}
        path = f"/api/parameters/federation-upstream/%2F/{upstream.name}"
        assert self.target.http("PUT", path, {"value": value})[0] in (201, 204)
        definition = {"federation-upstream-set": "all"}
        policy = {"pattern": pattern, "apply-to": "exchanges", "definition": definition}
        assert self.target.http("PUT", "/api/policies/%2F/federate", policy)[0] in (201, 204)

    def links(self) -> list:
        return self.broker.broker.federation.links()

    def wait_running(self, count: int = 1) -> None:
        wait(lambda: sum(link.state == "running" for link in self.links()) == count, "links running")

    def depth(self, queue: str) -> int:
        return self.channel.queue_declare(queue, passive=True).method.message_count

    def bodies(self, queue: str) -> list[bytes]:
        out = []
        while True:
            method, _, body = self.channel.basic_get(queue, auto_ack=True)
            if method is None:
                return out
            out.append(body)

    def upstream_bindings(self, exchange: str) -> list[dict]:
        """Bindings from ``exchange`` (on this broker as an upstream) over HTTP."""
        status, rows = self.target.http("GET", f"/api/exchanges/%2F/{quote(exchange)}/bindings/source")
        assert status == 200, rows
        return rows


def quote(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def wait(condition, what: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def nodes() -> Iterator[list[Node]]:
    """Three brokers, ``a``, ``b`` and ``c``."""
    with ExitStack() as stack:
        made = []
        for name in ("a", "b", "c"):
            broker = stack.enter_context(BlockingBroker(amqp_port=0, http_port=0))
            made.append(Node(broker, f"{name}@fed"))
        yield made
        for node in made:
            for connection in node.opened:
                connection.close()


def route_keys(bindings: list[dict]) -> list[str]:
    return sorted(b["routing_key"] for b in bindings if b["destination_type"] == "exchange")


@pytest.mark.parametrize(
    ("kind", "bind_key", "bind_args", "hit", "miss"),
    [
        ("direct", "k1", {}, ("k1", {}), ("k2", {})),
        ("topic", "a.*", {}, ("a.b", {}), ("b.a", {})),
        ("fanout", "", {}, ("any", {}), None),
        ("headers", "", {"x-match": "all", "h": "v"}, ("", {"h": "v"}), ("", {"h": "w"})),
    ],
)
def test_messages_reach_downstream_queues_by_their_bindings(nodes, kind, bind_key, bind_args, hit, miss):
    up, down, _ = nodes
    down.channel.exchange_declare("fx", kind, durable=True)
    down.channel.queue_declare("q")
    down.channel.queue_bind("q", "fx", bind_key, arguments=bind_args)
    down.federate(up, expires=60000, **{"message-ttl": 30000})
    down.wait_running()
    wait(lambda: len(up.upstream_bindings("fx")) == 1, "the binding upstream")
    # the topology, as a RabbitMQ downstream declares it
    queue = "federation: fx -> b@fed"
    declared = up.target.http("GET", f"/api/queues/%2F/{quote(queue)}")[1]
    assert declared["durable"] is True and declared["auto_delete"] is False
    assert declared["arguments"] == {
        "x-expires": 60000,
        "x-message-ttl": 30000,
        "x-internal-purpose": "federation",
    }
    internal = up.target.http("GET", f"/api/exchanges/%2F/{quote(queue + ' B')}")[1]
    assert (internal["type"], internal["durable"], internal["auto_delete"], internal["internal"]) == (
        "x-federation-upstream",
        True,
        True,
        True,
    )
    assert internal["arguments"] == {
        "x-max-hops": 1,
        "x-downstream-name": "b@fed",
        "x-downstream-vhost": "/",
        "x-internal-purpose": "federation",
    }
    [binding] = up.upstream_bindings("fx")
    assert binding["destination"] == queue + " B" and binding["routing_key"] == bind_key
    assert binding["arguments"] == {
        **bind_args,
        "x-bound-from": [{"cluster-name": "b@fed", "vhost": "/", "exchange": "/:fx B", "hops": 1}],
    }
    # the upstream exchange was there already: left as it was (the downstream's type
    # only when the link had to declare it)
    assert up.target.http("GET", "/api/exchanges/%2F/fx")[1]["type"] == kind
    publisher = up.publisher()
    publisher.basic_publish("fx", hit[0], b"hit", pika.BasicProperties(headers=hit[1]))
    if miss is not None:
        publisher.basic_publish("fx", miss[0], b"miss", pika.BasicProperties(headers=miss[1]))
    wait(lambda: down.depth("q") == 1, "the message downstream")
    time.sleep(0.2)
    assert down.bodies("q") == [b"hit"]
    assert up.depth(queue) == 0


@pytest.mark.parametrize("nowait", [False, True])
def test_upstream_bindings_follow_the_downstream_ones(nodes, nowait):
    up, down, _ = nodes
    down.channel.exchange_declare("fx", "direct")
    down.channel.queue_declare("q1")
    down.channel.queue_declare("q2")
    down.channel.queue_bind("q1", "fx", "k1")
    down.federate(up, **{"bind-nowait": nowait})
    down.wait_running()
    wait(lambda: route_keys(up.upstream_bindings("fx")) == ["k1"], "k1 upstream")
    # a second destination with the same key adds no binding; a new key does
    down.channel.queue_bind("q2", "fx", "k1")
    down.channel.queue_bind("q2", "fx", "k2")
    down.channel.exchange_declare("other", "fanout")
    down.channel.exchange_bind("other", "fx", "k3")  # exchange-to-exchange bindings count
    wait(lambda: route_keys(up.upstream_bindings("fx")) == ["k1", "k2", "k3"], "k2 and k3 upstream")
    publisher = up.publisher()
    for key in ("k1", "k2", "k4"):
        publisher.basic_publish("fx", key, key.encode())
    wait(lambda: down.depth("q2") == 2, "k1 and k2 in q2")
    assert down.bodies("q1") == [b"k1"]
    # k1 stays while q2 is bound with it; unbinding k2 and deleting q2 take keys away
    down.channel.queue_unbind("q1", "fx", "k1")
    down.channel.queue_unbind("q2", "fx", "k2")
    down.channel.exchange_unbind("other", "fx", "k3")
    wait(lambda: route_keys(up.upstream_bindings("fx")) == ["k1"], "only k1 upstream")
    down.channel.queue_delete("q2")
    wait(lambda: route_keys(up.upstream_bindings("fx")) == [], "no binding upstream")
    publisher.basic_publish("fx", "k1", b"late")
    time.sleep(0.3)
    assert up.depth("federation: fx -> b@fed") == 0  # nothing routed to the link's queue
    assert down.bodies("q1") == []


@pytest.mark.parametrize("trust", [False, True])
def test_x_received_from_and_user_id(nodes, trust):
    up, down, _ = nodes
    down.channel.exchange_declare("fx", "fanout")
    down.channel.queue_declare("q")
    down.channel.queue_bind("q", "fx")
    down.federate(up, **{"trust-user-id": trust})
    down.wait_running()
    wait(lambda: len(up.upstream_bindings("fx")) == 1, "the binding upstream")
    publisher = up.publisher()
    properties = pika.BasicProperties(user_id="guest", headers={"mine": "kept"})
    publisher.basic_publish("fx", "key", b"m", properties)
    wait(lambda: down.depth("q") == 1, "the message downstream")
    method, received, _ = down.channel.basic_get("q", auto_ack=True)
    assert method.routing_key == "key" and method.exchange == "fx"
    assert received.user_id == ("guest" if trust else None)
    assert received.message_id is None  # none added on the way
    assert received.headers == {
        "mine": "kept",
        "x-received-from": [
            {
                "uri": f"amqp://127.0.0.1:{up.target.amqp_port}/%2F",  # no credentials
                "exchange": "fx",
                "redelivered": False,
                "cluster-name": "a@fed",
                "vhost": "/",
            }
        ],
    }


def test_an_x_received_from_of_another_type_is_kept_in_x_invalid_headers(nodes):
    """A publisher's ``x-received-from`` that is not an array: the link's hop replaces
    it and the old value goes to ``x-invalid-headers``, as RabbitMQ's
    ``prepend_table_header`` does."""
    up, down, _ = nodes
    down.channel.exchange_declare("fx", "fanout")
    down.channel.queue_declare("q")
    down.channel.queue_bind("q", "fx")
    down.federate(up)
    down.wait_running()
    wait(lambda: len(up.upstream_bindings("fx")) == 1, "the binding upstream")
    up.publisher().basic_publish("fx", "", b"m", pika.BasicProperties(headers={"x-received-from": "forged"}))
    wait(lambda: down.depth("q") == 1, "the message downstream")
    _, received, _ = down.channel.basic_get("q", auto_ack=True)
    assert [hop["cluster-name"] for hop in received.headers["x-received-from"]] == ["a@fed"]
    assert received.headers["x-invalid-headers"] == {"x-received-from": ["forged"]}


@pytest.mark.parametrize("hops", [1, 2])
def test_max_hops_along_a_line_of_three(nodes, hops):
    a, b, c = nodes
    for node in nodes:
        node.channel.exchange_declare("fx", "topic", durable=True)
    c.channel.queue_declare("qc")
    c.channel.queue_bind("qc", "fx", "#")
    c.federate(b, **{"max-hops": hops})
    b.federate(a, **{"max-hops": hops})
    c.wait_running()
    b.wait_running()
    # c's binding travels to b, and on to a only if a message may make two hops
    wait(lambda: len(b.upstream_bindings("fx")) == 1, "c's binding on b")
    time.sleep(0.3)
    on_a = a.upstream_bindings("fx")
    if hops == 1:
        assert on_a == []
        # b binds on a for itself: a's messages then reach b, but stop there
        b.channel.queue_declare("qb")
        b.channel.queue_bind("qb", "fx", "#")
        wait(lambda: len(a.upstream_bindings("fx")) == 1, "b's binding on a")
    else:
        [bound] = on_a
        assert bound["arguments"]["x-bound-from"] == [
            {"cluster-name": "b@fed", "vhost": "/", "exchange": "/:fx B", "hops": 1},
            {"cluster-name": "c@fed", "vhost": "/", "exchange": "/:fx B", "hops": 2},
        ]
    a.publisher().basic_publish("fx", "x.y", b"from a")
    b.publisher().basic_publish("fx", "x.y", b"from b")
    if hops == 1:
        wait(lambda: b.depth("qb") == 2, "both in b")
        time.sleep(0.5)
        assert c.bodies("qc") == [b"from b"]
    else:
        wait(lambda: c.depth("qc") == 2, "both in c")
        _, properties, body = c.channel.basic_get("qc", auto_ack=True)
        assert body == b"from a"
        assert [hop["cluster-name"] for hop in properties.headers["x-received-from"]] == ["b@fed", "a@fed"]


def test_a_cycle_of_two_brokers_delivers_once_without_looping(nodes):
    a, b, _ = nodes
    for node in (a, b):
        node.channel.exchange_declare("fx", "fanout")
        node.channel.queue_declare("q")
        node.channel.queue_bind("q", "fx")
    a.federate(b, **{"max-hops": 10})
    b.federate(a, **{"max-hops": 10})
    a.wait_running()
    b.wait_running()
    # each side's binding reaches the other, and is not sent back
    wait(lambda: len(a.upstream_bindings("fx")) == 2 and len(b.upstream_bindings("fx")) == 2, "bindings")
    time.sleep(0.3)
    assert len(a.upstream_bindings("fx")) == 2  # q, and b's link
    a.publisher().basic_publish("fx", "", b"once")
    wait(lambda: b.depth("q") == 1, "the message in b")
    time.sleep(0.5)
    assert a.bodies("q") == [b"once"] and b.bodies("q") == [b"once"]
    for node in (a, b):
        assert all(link.forwarded <= 1 for link in node.links())


@pytest.mark.parametrize("ack_mode", ["on-confirm", "on-publish", "no-ack"])
def test_ack_modes_move_every_message_and_leave_the_upstream_queue_empty(nodes, ack_mode):
    up, down, _ = nodes
    down.channel.exchange_declare("fx", "direct", durable=True)
    down.channel.queue_declare("q", durable=True)
    down.channel.queue_bind("q", "fx", "k")
    down.federate(up, **{"ack-mode": ack_mode, "prefetch-count": 10})
    down.wait_running()
    wait(lambda: len(up.upstream_bindings("fx")) == 1, "the binding upstream")
    publisher = up.publisher()
    for i in range(300):
        publisher.basic_publish("fx", "k", str(i).encode(), pika.BasicProperties(delivery_mode=2))
    wait(lambda: down.depth("q") == 300, "300 messages downstream")
    assert down.bodies("q") == [str(i).encode() for i in range(300)]  # in order
    queue = up.target.http("GET", f"/api/queues/%2F/{quote('federation: fx -> b@fed')}")[1]
    assert queue["messages"] == 0 or ack_mode != "no-ack"
    wait(lambda: up.depth("federation: fx -> b@fed") == 0, "the upstream queue empty")
    consumers = up.target.http("GET", "/api/consumers")[1]
    [consumer] = [c for c in consumers if c["queue"]["name"].startswith("fed")]
    assert consumer["ack_required"] is (ack_mode != "no-ack")
    assert consumer["prefetch_count"] == (0 if ack_mode == "no-ack" else 10)


def test_the_upstream_exchange_type_filters_by_hops_and_visited_downstream(nodes):
    up = nodes[0]
    channel = up.channel
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        channel.exchange_declare("fu", "x-federation-upstream")
    assert refused.value.args == (406, "PRECONDITION_FAILED - Argument x-max-hops missing")
    channel = up.channel = up.connection.channel()
    arguments = {"x-max-hops": 2, "x-downstream-name": "down", "x-downstream-vhost": "/"}
    channel.exchange_declare("fu", "x-federation-upstream", arguments=arguments)
    channel.queue_declare("q")
    channel.queue_bind("q", "fu", "ignored")
    hop = lambda name, vhost="/": {"cluster-name": name, "vhost": vhost}  # noqa: E731
    cases = [
        (None, True),
        ([hop("other")], True),
        ([hop("other"), hop("third")], False),  # two hops made of two allowed
        ([hop("down")], False),  # been there
        ([hop("down", "elsewhere")], True),  # same name, another vhost
        ("not an array", True),
    ]
    for received, _ in cases:
        headers = None if received is None else {"x-received-from": received}
        channel.basic_publish("fu", "any", repr(received).encode(), pika.BasicProperties(headers=headers))
    time.sleep(0.2)
    assert up.bodies("q") == [repr(received).encode() for received, passes in cases if passes]


def test_a_restart_swaps_the_internal_exchange_and_unfederating_cleans_the_upstream(nodes):
    up, down, _ = nodes
    down.channel.exchange_declare("fx", "direct")
    down.channel.queue_declare("q")
    down.channel.queue_bind("q", "fx", "k")
    down.federate(up)
    down.wait_running()
    queue = "federation: fx -> b@fed"

    def internal() -> list[str]:
        exchanges = up.target.http("GET", "/api/exchanges/%2F")[1]
        return sorted(x["name"] for x in exchanges if x["name"].startswith(queue))

    wait(lambda: internal() == [f"{queue} B"], "exchange B")
    [link] = down.links()
    down.broker.call(link.restart)
    wait(lambda: internal() == [f"{queue} A"], "exchange A instead of B")
    wait(lambda: [b["destination"] for b in up.upstream_bindings("fx")] == [f"{queue} A"], "k bound to A")
    up.publisher().basic_publish("fx", "k", b"after restart")
    wait(lambda: down.depth("q") == 1, "the message downstream")
    # the policy removed deletes them, as RabbitMQ 3.10 does
    assert down.target.http("DELETE", "/api/policies/%2F/federate")[0] == 204
    wait(lambda: internal() == [], "the internal exchange deleted")
    assert up.target.http("GET", f"/api/queues/%2F/{quote(queue)}")[0] == 404
