"""Queue federation between leveret and RabbitMQ 3.10 (skipped without rabbitmq-server):
a RabbitMQ upstream feeding a leveret downstream queue, and RabbitMQ's own
``rabbitmq_federation`` pulling from a leveret upstream queue, which shows what
RabbitMQ's link does to an upstream that this module's leveret link does as well
(consumer tag, ``x-priority`` -1, prefetch, headers). The full four-way matrix is
``test_federation_matrix*``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from eventually import eventually, eventually_equal, poll
from targets import Target, rabbitmq_installed, start_rabbitmq, unique
from test_federation_queue import Receiver, counts, declare, federate, leveret, publish, running


@pytest.fixture
def leveret_broker() -> Iterator[Target]:
    yield from leveret()


@pytest.fixture(scope="module")
def rabbitmq_federation() -> Iterator[Target]:
    """A private RabbitMQ node with ``rabbitmq_federation`` (and statistics every 0.2 s,
    for its consumer listings)."""
    if not rabbitmq_installed():
        pytest.skip("rabbitmq-server is not installed: only leveret is checked")
    node, target = start_rabbitmq(federation=True, conf="collect_statistics_interval = 200\n")
    try:
        yield target
    finally:
        node.stop()


def test_a_rabbitmq_upstream_feeds_a_leveret_queue_only_while_it_has_consumers(
    leveret_broker, rabbitmq_target
):
    queue = unique("fq")
    declare(leveret_broker, queue)
    federate(leveret_broker, rabbitmq_target.url(), queue)
    running(leveret_broker, queue)
    try:
        assert counts(rabbitmq_target, queue) == (0, 0)  # declared there by the link, not consumed
        publish(rabbitmq_target, queue, 20)
        assert counts(rabbitmq_target, queue) == (20, 0)
        receiver = Receiver(leveret_broker, queue)
        try:
            assert receiver.wait_for(20) == 20
            assert sorted(receiver.bodies()) == sorted(f"m{n}" for n in range(20))
            [received] = receiver.got[0][1].headers["x-received-from"]
            assert received["uri"] == f"amqp://127.0.0.1:{rabbitmq_target.amqp_port}/%2F"
            receiver.ack_all()
            receiver.channel.basic_cancel(receiver.tag)
            assert eventually_equal(lambda: counts(rabbitmq_target, queue), (0, 0)) == (0, 0)
            publish(rabbitmq_target, queue, 5, "late")
            receiver.pump(0.2)
            assert counts(rabbitmq_target, queue) == (5, 0)  # nobody downstream: they stay
        finally:
            receiver.close()
    finally:
        rabbitmq_target.http("DELETE", f"/api/queues/%2F/{queue}")


def put_rabbitmq_federation(rabbitmq: Target, upstream_url: str, queue: str) -> str:
    name = unique("upstream")
    status, body = rabbitmq.http(
        "PUT", f"/api/parameters/federation-upstream/%2F/{name}", {"value": {"uri": upstream_url}}
    )
    assert status == 201, body
    policy = {"pattern": f"^{queue}$", "apply-to": "queues", "definition": {"federation-upstream": name}}
    status, body = rabbitmq.http("PUT", f"/api/policies/%2F/{name}", policy)
    assert status == 201, body
    return name


def test_rabbitmqs_link_pulls_from_a_leveret_upstream_as_leverets_own_link_does(
    leveret_broker, rabbitmq_federation
):
    queue = unique("fq")
    declare(rabbitmq_federation, queue)
    name = put_rabbitmq_federation(rabbitmq_federation, leveret_broker.url(), queue)
    try:
        rows = poll(
            lambda: rabbitmq_federation.http("GET", "/api/federation-links")[1],
            lambda rows: any(r.get("queue") == queue and r["status"] == "running" for r in rows),
            15,
        )
        [row] = [r for r in rows if r.get("queue") == queue]
        assert row["status"] == "running" and row["consumer_tag"] == f"federation-link-{name}", row
        # RabbitMQ's link declared the queue on leveret, and does not consume: no demand
        assert counts(leveret_broker, queue) == (0, 0)
        publish(leveret_broker, queue, 20)
        assert counts(leveret_broker, queue) == (20, 0)
        receiver = Receiver(rabbitmq_federation, queue, prefetch=5)
        try:
            assert receiver.wait_for(5) == 5

            def acking() -> int:
                receiver.ack_all()
                receiver.pump(0.02)
                return len(receiver.got)

            assert poll(acking, lambda n: n >= 20, 10, interval=0) == 20
            receiver.ack_all()
            assert sorted(receiver.bodies()) == sorted(f"m{n}" for n in range(20))
            headers = receiver.got[0][1].headers
            [received] = headers["x-received-from"]
            # what leveret's link writes too (test_federation_queue): the same keys and values
            assert received == {
                "uri": f"amqp://127.0.0.1:{leveret_broker.amqp_port}/%2F",  # the URI given, no credentials
                "queue": queue,
                "redelivered": False,
                "visit-count": 1,
            }
            assert headers["x-original-exchange"] == "" and headers["x-original-routing-key"] == queue
            # while the RabbitMQ consumer waits with room, RabbitMQ's link consumes from
            # leveret as leveret's link does: tag, x-priority -1, prefetch 1000, acks
            details = poll(
                lambda: leveret_broker.http("GET", f"/api/queues/%2F/{queue}")[1]["consumer_details"],
                lambda d: len(d) == 1,
            )
            [consumer] = details
            assert consumer["consumer_tag"] == f"federation-link-{name}"
            assert consumer["arguments"] == {"x-priority": -1}
            assert consumer["ack_required"] is True and consumer["prefetch_count"] == 1000
            connections = leveret_broker.http("GET", "/api/connections")[1]
            names = [c["client_properties"].get("connection_name") for c in connections]
            assert f"Federation link (upstream: {name}, policy: {name})" in names
            receiver.channel.basic_cancel(receiver.tag)
            assert eventually(lambda: counts(leveret_broker, queue) == (0, 0))
        finally:
            receiver.close()
    finally:
        rabbitmq_federation.http("DELETE", f"/api/policies/%2F/{name}")
        rabbitmq_federation.http("DELETE", f"/api/parameters/federation-upstream/%2F/{name}")
        rabbitmq_federation.http("DELETE", f"/api/queues/%2F/{queue}")
