"""Queue federation, leveret → leveret over real TCP with pika: a downstream queue pulls
from the upstream queue of its name only while it has consumers with room (RabbitMQ's
demand-driven ``rabbitmq_federation`` queue links), defined as RabbitMQ's are: a
``federation-upstream`` parameter and a policy naming it, over the management API."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pika
import pytest
from eventually import eventually, eventually_equal, poll, pumping
from targets import Target, leveret_target, unique

from leveret import BlockingBroker


def leveret() -> Iterator[Target]:
    with BlockingBroker(amqp_port=0, http_port=0) as broker:
        yield leveret_target(broker)


@pytest.fixture
def upstream() -> Iterator[Target]:
    yield from leveret()


@pytest.fixture
def downstream() -> Iterator[Target]:
    yield from leveret()


def federate(downstream: Target, upstream_url: str, federated: str, **settings: Any) -> str:
    """Define an upstream (``settings``: its keys, RabbitMQ's names with ``_`` for ``-``)
    and a policy federating queue ``federated`` from it; returns the upstream's name."""
    name = unique("upstream")
    keys = {key.replace("_", "-"): value for key, value in settings.items()}
    value = {"uri": upstream_url, "reconnect-delay": 1, **keys}
    status, body = downstream.http("PUT", f"/api/parameters/federation-upstream/%2F/{name}", {"value": value})
    assert status == 201, body
    policy = {
        "pattern": f"^{re.escape(federated)}$",
        "apply-to": "queues",
        "definition": {"federation-upstream": name},
    }
    status, body = downstream.http("PUT", f"/api/policies/%2F/{name}", policy)
    assert status == 201, body
    return name


def link_facts(downstream: Target, queue: str) -> dict | None:
    """The queue link's state, read on the downstream broker's thread."""

    def read() -> dict | None:
        for link in downstream.broker.broker.federation.links():
            if link.kind == "queue" and link.name == queue:
                return {
                    "state": link.state,
                    "error": link.error,
                    "consuming": link.consuming,
                    "row": link.status(),
                }
        return None

    return downstream.broker.call(read)


def running(downstream: Target, queue: str) -> dict:
    facts = poll(lambda: link_facts(downstream, queue), lambda f: bool(f) and f["state"] == "running", 10)
    assert facts is not None and facts["state"] == "running", facts
    return facts


def counts(target: Target, queue: str) -> tuple[int, int]:
    """(messages ready, consumers) of ``queue`` on ``target``."""
    connection = target.amqp()
    try:
        declared = connection.channel().queue_declare(queue, passive=True).method
        return declared.message_count, declared.consumer_count
    finally:
        connection.close()


def unacked(target: Target, queue: str) -> int:
    """Messages of ``queue`` delivered and not acknowledged (the link's, upstream)."""
    return target.http("GET", f"/api/queues/%2F/{queue}")[1]["messages_unacknowledged"]


def publish(target: Target, queue: str, count: int, prefix: str = "m") -> None:
    connection = target.amqp()
    channel = connection.channel()
    channel.confirm_delivery()
    for number in range(count):
        channel.basic_publish("", queue, f"{prefix}{number}".encode(), pika.BasicProperties(delivery_mode=2))
    connection.close()


def declare(target: Target, queue: str, **arguments: Any) -> None:
    connection = target.amqp()
    connection.channel().queue_declare(queue, durable=True, arguments=arguments or None)
    connection.close()


class Receiver:
    """A pika consumer of ``queue`` that keeps what it got, acking only when told."""

    def __init__(self, target: Target, queue: str, prefetch: int = 0) -> None:
        self.connection = target.amqp()
        self.channel = self.connection.channel()
        if prefetch:
            self.channel.basic_qos(prefetch_count=prefetch)
        self.got: list[tuple[Any, Any, bytes]] = []
        self.acked = 0
        self.tag = self.channel.basic_consume(queue, lambda _c, m, p, b: self.got.append((m, p, b)))

    def wait_for(self, count: int, timeout: float = 10.0) -> int:
        return poll(lambda: len(self.got), lambda n: n >= count, timeout, wait=pumping(self.connection))

    def pump(self, seconds: float) -> None:
        self.connection.process_data_events(time_limit=seconds)

    def ack_all(self) -> None:
        """Ack what came since the last call."""
        if len(self.got) > self.acked:
            self.channel.basic_ack(self.got[-1][0].delivery_tag, multiple=True)
            self.acked = len(self.got)

    def bodies(self) -> list[str]:
        return [body.decode() for _, _, body in self.got]

    def close(self) -> None:
        if self.connection.is_open:
            self.connection.close()


def drain_all(
    target: Target, queue: str, expected: int, prefetch: int = 20, timeout: float = 10.0
) -> list[str]:
    """Consume ``queue`` on ``target``, acking as it goes, until ``expected`` messages came."""
    receiver = Receiver(target, queue, prefetch)
    try:

        def more() -> int:
            receiver.pump(0.02)
            receiver.ack_all()
            return len(receiver.got)

        poll(more, lambda n: n >= expected, timeout, interval=0)
        return receiver.bodies()
    finally:
        receiver.close()


def test_messages_stay_upstream_until_a_downstream_consumer_comes(upstream, downstream):
    queue = unique("fq")
    declare(downstream, queue, **{"x-max-length": 1000})
    federate(downstream, upstream.url(), queue)
    facts = running(downstream, queue)
    # the link declared the missing upstream queue as the downstream one is
    status, info = upstream.http("GET", f"/api/queues/%2F/{queue}")
    assert status == 200 and info["durable"] is True and info["arguments"] == {"x-max-length": 1000}
    publish(upstream, queue, 20)
    assert not facts["consuming"]
    assert counts(upstream, queue) == (20, 0)  # no consumer upstream: the link is paused
    assert counts(downstream, queue) == (0, 0)
    receiver = Receiver(downstream, queue)
    try:
        assert receiver.wait_for(20) == 20
        assert sorted(receiver.bodies()) == sorted(f"m{n}" for n in range(20))
        _, properties, _ = receiver.got[0]
        headers = properties.headers
        assert headers["x-original-exchange"] == "" and headers["x-original-routing-key"] == queue
        [received] = headers["x-received-from"]
        assert received == {
            "uri": f"amqp://127.0.0.1:{upstream.amqp_port}/%2F",  # no credentials, as RabbitMQ's safe URI
            "queue": queue,
            "redelivered": False,
            "visit-count": 1,
        }
        receiver.ack_all()
        assert eventually_equal(lambda: counts(upstream, queue)[0], 0) == 0
    finally:
        receiver.close()
    row = running(downstream, queue)["row"]
    assert row["type"] == "queue" and row["queue"] == queue and row["upstream_queue"] == queue
    assert row["consumer_tag"].startswith("federation-link-")


def test_the_link_consumes_upstream_at_priority_minus_one_only_while_there_is_demand(upstream, downstream):
    queue = unique("fq")
    declare(downstream, queue)
    name = federate(downstream, upstream.url(), queue)
    running(downstream, queue)
    receiver = Receiver(downstream, queue)
    try:
        assert eventually_equal(lambda: counts(upstream, queue)[1], 1) == 1
        [consumer] = upstream.http("GET", f"/api/queues/%2F/{queue}")[1]["consumer_details"]
        assert consumer["consumer_tag"] == f"federation-link-{name}"
        assert consumer["arguments"] == {"x-priority": -1}
        assert consumer["ack_required"] is True and consumer["prefetch_count"] == 1000
        connections = upstream.http("GET", "/api/connections")[1]
        names = [c["client_properties"].get("connection_name") for c in connections]
        assert f"Federation link (upstream: {name}, policy: {name})" in names  # RabbitMQ's name
        # the downstream consumer leaves: the link cancels its consumer upstream
        receiver.channel.basic_cancel(receiver.tag)
        assert eventually_equal(lambda: counts(upstream, queue)[1], 0) == 0
        publish(upstream, queue, 10)
        assert not link_facts(downstream, queue)["consuming"]
        assert counts(upstream, queue) == (10, 0)
    finally:
        receiver.close()


def test_upstream_consumers_are_preferred_and_messages_go_where_consumers_have_room(upstream, downstream):
    queue = unique("fq")
    declare(upstream, queue)
    declare(downstream, queue)
    federate(downstream, upstream.url(), queue)
    running(downstream, queue)
    local = Receiver(upstream, queue)  # no prefetch limit: always has room
    remote = Receiver(downstream, queue)
    try:
        assert eventually_equal(lambda: counts(upstream, queue)[1], 2) == 2  # the link consumes too
        publish(upstream, queue, 50, "a")
        assert local.wait_for(50) == 50
        remote.pump(0.2)
        assert remote.got == []  # priority -1: the upstream consumer took everything
        local.ack_all()
        local.close()
        # an upstream consumer with a window of 1 that it never acks: the rest moves downstream
        local = Receiver(upstream, queue, prefetch=1)
        publish(upstream, queue, 30, "b")
        assert remote.wait_for(29) == 29
        local.pump(0.1)
        assert len(local.got) == 1
        assert sorted(local.bodies() + remote.bodies()) == sorted(f"b{n}" for n in range(30))
    finally:
        local.close()
        remote.close()


def test_the_pull_is_bounded_by_the_prefetch_counts(upstream, downstream):
    queue = unique("fq")
    declare(upstream, queue)
    declare(downstream, queue)
    federate(downstream, upstream.url(), queue, prefetch_count=10)
    running(downstream, queue)
    publish(upstream, queue, 300)
    receiver = Receiver(downstream, queue, prefetch=5)  # never acks, for now
    try:
        assert receiver.wait_for(5) == 5
        # the consumer is full: the link pauses; past the first message that found no
        # room, at most the link's prefetch of 10 was in flight
        assert eventually(lambda: not link_facts(downstream, queue)["consuming"])
        assert eventually_equal(lambda: counts(upstream, queue)[1], 0) == 0
        moved = 300 - counts(upstream, queue)[0]
        assert 6 <= moved <= 5 + 1 + 10
        assert counts(downstream, queue)[0] == moved - 5
        receiver.pump(0.2)
        assert 300 - counts(upstream, queue)[0] == moved  # still paused: nothing more taken
        receiver.close()
        # a consumer that keeps acking gets everything, each message once
        assert sorted(drain_all(downstream, queue, 300)) == sorted(f"m{n}" for n in range(300))
        assert counts(upstream, queue) == (0, 0)
        assert eventually_equal(lambda: unacked(upstream, queue), 0) == 0
    finally:
        receiver.close()


def test_on_confirm_loses_nothing_when_downstream_consumers_reject_or_vanish(upstream, downstream):
    queue = unique("fq")
    declare(downstream, queue)
    federate(downstream, upstream.url(), queue, prefetch_count=20)
    running(downstream, queue)
    publish(upstream, queue, 100)
    first = Receiver(downstream, queue, prefetch=10)
    try:
        assert first.wait_for(10) == 10
        for method, _, _ in first.got[:5]:
            first.channel.basic_reject(method.delivery_tag, requeue=True)
        first.pump(0.1)
    finally:
        first.close()  # the rest of its window, unacked, goes back to the downstream queue
    everything = drain_all(downstream, queue, 100)
    assert sorted(set(everything)) == sorted(f"m{n}" for n in range(100))
    assert counts(upstream, queue) == (0, 0)
    assert eventually_equal(lambda: unacked(upstream, queue), 0) == 0  # every one acked upstream


def test_the_upstream_definition_can_name_another_queue(upstream, downstream):
    queue, source = unique("fq"), unique("source")
    declare(upstream, source)
    declare(downstream, queue)
    federate(downstream, upstream.url(), queue, queue=source, consumer_tag="my-link")
    row = running(downstream, queue)["row"]
    assert row["upstream_queue"] == source and row["consumer_tag"] == "my-link"
    publish(upstream, source, 5)
    assert sorted(drain_all(downstream, queue, 5)) == [f"m{n}" for n in range(5)]
    assert counts(upstream, source) == (0, 0)


def test_a_message_moved_back_and_forth_counts_its_visits(upstream, downstream):
    """Both brokers federate the queue from each other: a message follows the consumer,
    and ``x-received-from`` keeps one entry per upstream with its visit count."""
    queue = unique("fq")
    declare(upstream, queue)
    declare(downstream, queue)
    federate(downstream, upstream.url(), queue)
    federate(upstream, downstream.url(), queue)
    running(downstream, queue)
    running(upstream, queue)
    publish(upstream, queue, 1, "bounce")
    receiver = Receiver(downstream, queue)
    try:
        assert receiver.wait_for(1) == 1
        method, _, _ = receiver.got[0]
        receiver.channel.basic_reject(method.delivery_tag, requeue=True)
        receiver.close()
        back = Receiver(upstream, queue)
        try:
            assert back.wait_for(1) == 1
            headers = back.got[0][1].headers
            newest, oldest = headers["x-received-from"]
            assert newest["uri"] == f"amqp://127.0.0.1:{downstream.amqp_port}/%2F"
            assert newest["visit-count"] == 1
            assert newest["redelivered"] is True  # it had been rejected downstream
            assert oldest["uri"] == f"amqp://127.0.0.1:{upstream.amqp_port}/%2F"
            assert oldest["visit-count"] == 1
            assert back.got[0][2] == b"bounce0"
            back.ack_all()
        finally:
            back.close()
    finally:
        receiver.close()


@pytest.mark.parametrize("ack_mode", ["on-publish", "no-ack"])
def test_the_other_ack_modes_move_everything_too(upstream, downstream, ack_mode):
    queue = unique("fq")
    declare(upstream, queue)
    declare(downstream, queue)
    name = federate(downstream, upstream.url(), queue, ack_mode=ack_mode)
    running(downstream, queue)
    publish(upstream, queue, 50)
    receiver = Receiver(downstream, queue)
    try:
        assert receiver.wait_for(50) == 50
        assert sorted(receiver.bodies()) == sorted(f"m{n}" for n in range(50))
        [consumer] = upstream.http("GET", f"/api/queues/%2F/{queue}")[1]["consumer_details"]
        assert consumer["consumer_tag"] == f"federation-link-{name}"
        # no-ack: no acknowledgements and no prefetch limit (RabbitMQ sends no basic.qos)
        assert consumer["ack_required"] is (ack_mode != "no-ack")
        assert consumer["prefetch_count"] == (0 if ack_mode == "no-ack" else 1000)
        assert eventually(lambda: upstream.http("GET", f"/api/queues/%2F/{queue}")[1]["messages"] == 0)
        receiver.ack_all()
    finally:
        receiver.close()
