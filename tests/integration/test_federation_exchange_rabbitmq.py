"""Exchange federation between leveret and RabbitMQ 3.10 (``rabbitmq_federation``):
RabbitMQ as the upstream of a leveret downstream, and leveret as the upstream of a
RabbitMQ downstream; each side declares its topology on the other and messages cross
with ``x-received-from``. Skipped without RabbitMQ."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pika
import pytest
from targets import Target, rabbitmq_installed, start_rabbitmq, unique
from test_federation_exchange import quote, wait

from leveret import BlockingBroker

pytestmark = pytest.mark.skipif(not rabbitmq_installed(), reason="RabbitMQ is not installed")

TIMEOUT = 15.0  # seconds: RabbitMQ starts its links a little after the policy


@pytest.fixture(scope="module")
def rabbit() -> Iterator[Target]:
    node, target = start_rabbitmq(federation=True)
    try:
        yield target
    finally:
        node.stop()


OPENED: list[pika.BlockingConnection] = []


def channel_of(target: Target) -> pika.adapters.blocking_connection.BlockingChannel:
    """A channel on a connection of its own, closed after the test (a broker stopping
    waits for its clients' close-ok)."""
    OPENED.append(target.amqp())
    return OPENED[-1].channel()


@pytest.fixture
def leveret() -> Iterator[Target]:
    with BlockingBroker(amqp_port=0, http_port=0) as broker:
        target = Target.of(broker)
        target.broker = broker
        named = target.http("PUT", "/api/global-parameters/cluster_name", {"value": "leveret@fed"})
        assert named[0] in (201, 204)
        yield target
        while OPENED:
            OPENED.pop().close()


def federate(downstream: Target, upstream: Target, exchange: str) -> None:
    value = {"uri": upstream.url(), "reconnect-delay": 1, "max-hops": 2, "expires": 60000}
    upstream_name = unique("up")
    path = f"/api/parameters/federation-upstream/%2F/{upstream_name}"
    assert downstream.http("PUT", path, {"value": value})[0] in (201, 204)
    policy = {
        "pattern": f"^{exchange}$",
        "apply-to": "exchanges",
        "definition": {"federation-upstream": upstream_name},
    }
    assert downstream.http("PUT", f"/api/policies/%2F/{unique('fed')}", policy)[0] in (201, 204)


def exchange_bindings(target: Target, exchange: str) -> list[dict]:
    rows = target.http("GET", f"/api/exchanges/%2F/{quote(exchange)}/bindings/source")[1]
    return [row for row in rows if row["destination_type"] == "exchange"]


def check_upstream_topology(upstream: Target, exchange: str, node: str) -> None:
    """What a downstream named ``node`` declared on ``upstream`` for ``exchange``."""
    queue = f"federation: {exchange} -> {node}"
    declared = upstream.http("GET", f"/api/queues/%2F/{quote(queue)}")[1]
    assert declared["arguments"] == {"x-expires": 60000, "x-internal-purpose": "federation"}
    [binding] = exchange_bindings(upstream, exchange)
    assert binding["routing_key"] == "a.*" and binding["destination"] == f"{queue} B"
    assert binding["arguments"]["x-bound-from"] == [
        {"cluster-name": node, "vhost": "/", "exchange": f"/:{exchange} B", "hops": 2}
    ]
    internal = upstream.http("GET", f"/api/exchanges/%2F/{quote(queue + ' B')}")[1]
    assert internal["type"] == "x-federation-upstream"
    assert internal["arguments"] == {
        "x-max-hops": 2,
        "x-downstream-name": node,
        "x-downstream-vhost": "/",
        "x-internal-purpose": "federation",
    }


def cross(upstream: Target, downstream: Target, exchange: str, queue: str, upstream_name: str) -> None:
    """Publish a hit and a miss upstream; the hit arrives in ``queue`` (bound with
    ``a.*`` downstream) with ``x-received-from``."""
    channel = channel_of(downstream)
    publisher = channel_of(upstream)
    publisher.basic_publish(exchange, "a.b", b"hit", pika.BasicProperties(headers={"mine": 1}))
    publisher.basic_publish(exchange, "b.a", b"miss")
    received: list = []

    def arrived() -> bool:
        method, properties, body = channel.basic_get(queue, auto_ack=True)
        if method is not None:
            received.append((method.routing_key, properties.headers, body))
        return bool(received)

    wait(arrived, "the message downstream", TIMEOUT)
    time.sleep(0.3)
    assert channel.basic_get(queue, auto_ack=True)[0] is None
    [(key, headers, body)] = received
    assert (key, body, headers["mine"]) == ("a.b", b"hit", 1)
    [hop] = headers["x-received-from"]
    assert hop == {
        "uri": f"amqp://127.0.0.1:{upstream.amqp_port}/%2F",
        "exchange": exchange,
        "redelivered": False,
        "cluster-name": upstream_name,
        "vhost": "/",
    }


def test_rabbitmq_upstream_leveret_downstream(rabbit, leveret):
    exchange = unique("fx")
    channel_of(leveret).exchange_declare(exchange, "topic")
    channel = channel_of(leveret)
    queue = unique("q")
    channel.queue_declare(queue)
    channel.queue_bind(queue, exchange, "a.*")
    federate(leveret, rabbit, exchange)
    wait(lambda: exchange_bindings(rabbit, exchange), "leveret's binding on RabbitMQ", TIMEOUT)
    check_upstream_topology(rabbit, exchange, "leveret@fed")
    # declared by leveret as the downstream exchange is
    assert rabbit.http("GET", f"/api/exchanges/%2F/{exchange}")[1]["type"] == "topic"
    cross(rabbit, leveret, exchange, queue, rabbit.http("GET", "/api/overview")[1]["cluster_name"])


def test_leveret_upstream_rabbitmq_downstream(rabbit, leveret):
    exchange = unique("fx")
    channel = channel_of(rabbit)
    channel.exchange_declare(exchange, "topic")
    queue = unique("q")
    channel.queue_declare(queue)
    channel.queue_bind(queue, exchange, "a.*")
    federate(rabbit, leveret, exchange)
    wait(lambda: exchange_bindings(leveret, exchange), "RabbitMQ's binding on leveret", TIMEOUT)
    node = rabbit.http("GET", "/api/overview")[1]["cluster_name"]
    check_upstream_topology(leveret, exchange, node)
    [link] = [row for row in rabbit.http("GET", "/api/federation-links")[1] if row["exchange"] == exchange]
    assert link["status"] == "running"
    cross(leveret, rabbit, exchange, queue, "leveret@fed")
