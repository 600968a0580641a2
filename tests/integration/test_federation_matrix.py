"""The federation matrix: every case runs four ways (tests/federation_brokers.py) —
leveret → leveret, RabbitMQ → leveret, leveret → RabbitMQ, RabbitMQ → RabbitMQ — with
the same AMQP and HTTP calls, and the same expectations (read from RabbitMQ 3.10.8,
which passes them all). The results are in docs/federation.md, "Compatibility matrix".

Waiting: a link is "up" for a routing key once a probe message published upstream with
that key has come through (:func:`until_flowing`), so no test sleeps for a link; absence
is shown with a marker published after the message that must not arrive, on the same
path (a link keeps order), never with a sleep — but for queue federation's "no
demand, no move", which can only be shown by waiting (1 s).
"""

from __future__ import annotations

import json
import re
import time
import uuid

import federation_brokers
import pika
import pytest
from eventually import eventually
from federation_brokers import LINK_TIMEOUT, Pairing, Site, q

#: the fixtures (federation_brokers.py): a matrix cell, and the session's RabbitMQ node
pairing = federation_brokers.pairing
federation_rabbitmq = federation_brokers.federation_rabbitmq

PROBE = b"probe-"


# -- messages ---------------------------------------------------------------------------
def publish(site: Site, exchange: str, key: str, *bodies: bytes, persistent: bool = False) -> None:
    """Publish ``bodies`` with confirms (each one confirmed before this returns)."""
    connection = site.amqp()
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        properties = pika.BasicProperties(delivery_mode=2 if persistent else 1)
        for body in bodies:
            channel.basic_publish(exchange, key, body, properties)
    finally:
        connection.close()


def take(site: Site, queue: str) -> list[tuple[bytes, pika.BasicProperties]]:
    """Every message of ``queue`` now (basic.get, acked), as (body, properties)."""
    connection = site.amqp()
    found = []
    try:
        channel = connection.channel()
        while True:
            method, properties, body = channel.basic_get(queue, auto_ack=True)
            if method is None:
                return found
            found.append((body, properties))
    finally:
        connection.close()


class Inbox:
    """What a downstream queue has received so far (probes set aside)."""

    def __init__(self, site: Site, queue: str) -> None:
        self.site, self.queue = site, queue
        self.messages: list[tuple[bytes, dict]] = []
        self.user_ids: dict[bytes, str | None] = {}
        self.probes: list[bytes] = []

    def poll(self) -> list[tuple[bytes, dict]]:
        for body, properties in take(self.site, self.queue):
            if body.startswith(PROBE):
                self.probes.append(body)
            else:
                self.messages.append((body, dict(properties.headers or {})))
                self.user_ids[body] = properties.user_id
        return self.messages

    def bodies(self) -> list[bytes]:
        return [body for body, _ in self.messages]

    def wait_for(self, body: bytes, timeout: float = LINK_TIMEOUT) -> list[bytes]:
        """Poll until ``body`` has arrived (a probe or a message); the bodies so far."""
        def arrived() -> bool:
            self.poll()
            return body in self.probes or body in self.bodies()

        eventually(arrived, timeout, 0.05)
        assert body in self.probes or body in self.bodies(), (
            f"{body!r} did not reach {self.site}/{self.queue} in {timeout} s; got {self.bodies()}"
        )
        return self.bodies()


def until_flowing(upstream: Site, exchange: str, key: str, inbox: Inbox,
                  timeout: float = LINK_TIMEOUT) -> None:
    """Publish probes on ``upstream`` with ``key`` until one reaches ``inbox``: the link
    is up and carries ``key``. Probes are kept apart from the messages."""
    deadline = time.monotonic() + timeout
    while True:
        probe = PROBE + uuid.uuid4().hex.encode()
        publish(upstream, exchange, key, probe)
        if eventually(lambda probe=probe: inbox.poll() is not None and probe in inbox.probes, 1.0, 0.05):
            return
        if time.monotonic() > deadline:
            raise AssertionError(
                f"no probe with {key!r} came from {upstream}/{exchange} to {inbox.site}/{inbox.queue} "
                f"in {timeout} s; links: {inbox.site.links()}"
            )


def declare(site: Site, exchange: str | None = None, queue: str | None = None, keys: tuple[str, ...] = (),
            exchange_type: str = "direct", durable: bool = False) -> None:
    connection = site.amqp()
    try:
        channel = connection.channel()
        if exchange:
            channel.exchange_declare(exchange, exchange_type, durable=durable)
        if queue:
            channel.queue_declare(queue, durable=durable)
            for key in keys:
                channel.queue_bind(queue, exchange, key)
    finally:
        connection.close()


def bind(site: Site, queue: str, exchange: str, key: str, unbind: bool = False) -> None:
    connection = site.amqp()
    try:
        channel = connection.channel()
        (channel.queue_unbind if unbind else channel.queue_bind)(queue, exchange, key)
    finally:
        connection.close()


#: the keys of one ``x-received-from`` entry (RabbitMQ 3.10.8)
RECEIVED_FROM_KEYS = {"uri", "exchange", "redelivered", "cluster-name", "vhost"}


# -- exchange federation ------------------------------------------------------------------
def test_federation_matrix_exchange_routes_by_binding_key(pairing: Pairing):
    """Only what the downstream's bindings ask for crosses, with one ``x-received-from``
    entry naming the upstream (its URI without credentials, exchange and vhost)."""
    up, down = pairing.upstream(), pairing.downstream()
    declare(up, "fx")
    declare(down, "fx", "dq", keys=("k1",))
    down.federate(up, "^fx$")
    inbox = Inbox(down, "dq")
    until_flowing(up, "fx", "k1", inbox)
    publish(up, "fx", "k2", b"not-bound")
    publish(up, "fx", "k1", b"bound")
    assert inbox.wait_for(b"bound") == [b"bound"]  # k2 was published first and did not come
    [(_, headers)] = inbox.messages
    [entry] = headers["x-received-from"]
    assert set(entry) == RECEIVED_FROM_KEYS, entry
    assert entry["exchange"] == "fx" and entry["vhost"] == up.vhost and entry["redelivered"] is False
    assert entry["uri"] == up.redacted_uri() and "guest" not in entry["uri"]
    assert isinstance(entry["cluster-name"], str) and entry["cluster-name"]


def test_federation_matrix_exchange_follows_binding_changes(pairing: Pairing):
    """A binding added downstream starts its key flowing; one removed stops it."""
    up, down = pairing.upstream(), pairing.downstream()
    declare(up, "fx", exchange_type="topic")
    declare(down, "fx", "dq", keys=("a.*",), exchange_type="topic")
    down.federate(up, "^fx$")
    inbox = Inbox(down, "dq")
    until_flowing(up, "fx", "a.probe", inbox)
    publish(up, "fx", "b.one", b"b-before")
    bind(down, "dq", "fx", "b.#")
    until_flowing(up, "fx", "b.probe", inbox)
    bind(down, "dq", "fx", "a.*", unbind=True)
    bind(down, "dq", "fx", "c.#")  # processed after the unbind by the link
    until_flowing(up, "fx", "c.probe", inbox)
    publish(up, "fx", "a.x", b"a-after")
    publish(up, "fx", "b.x", b"b-after")
    assert inbox.wait_for(b"b-after") == [b"b-after"]


def test_federation_matrix_max_hops(pairing: Pairing):
    """A line up1 → up2 → down: with ``max-hops`` 1 on down's upstream a message that came
    to up2 by federation goes no further; with 2 it does, with two ``x-received-from``
    entries, the latest hop first."""
    up1, up2, down = pairing.upstream(), pairing.upstream(), pairing.downstream()
    declare(up1, "fx")
    declare(up2, "fx", "local", keys=("k",))
    declare(down, "fx", "dq", keys=("k",))
    up2.federate(up1, "^fx$")
    local = Inbox(up2, "local")
    until_flowing(up1, "fx", "k", local)
    down.federate(up2, "^fx$", max_hops=1)
    inbox = Inbox(down, "dq")
    until_flowing(up2, "fx", "k", inbox)
    publish(up1, "fx", "k", b"two-hops")
    local.wait_for(b"two-hops")  # in up2's exchange, ahead of the marker
    publish(up2, "fx", "k", b"marker")
    assert inbox.wait_for(b"marker") == [b"marker"]
    down.put_upstream("up", up2.uri(), max_hops=2)  # the link restarts with it
    inbox.messages.clear()
    until_flowing(up1, "fx", "k", inbox)
    publish(up1, "fx", "k", b"two-hops-again")
    inbox.wait_for(b"two-hops-again")
    [(_, headers)] = [m for m in inbox.messages if m[0] == b"two-hops-again"]
    assert [entry["vhost"] for entry in headers["x-received-from"]] == [up2.vhost, up1.vhost]


def test_federation_matrix_cycle_is_broken(pairing: Pairing):
    """Two exchanges federated from each other (``max-hops`` 10): a message crosses once
    and does not come back (``x-received-from`` names where it has been)."""
    a, b = pairing.upstream(), pairing.downstream()
    declare(a, "fx", "qa", keys=("k",))
    declare(b, "fx", "qb", keys=("k",))
    b.federate(a, "^fx$", max_hops=10)
    a.federate(b, "^fx$", max_hops=10)
    inbox_a, inbox_b = Inbox(a, "qa"), Inbox(b, "qb")
    until_flowing(a, "fx", "k", inbox_b)
    until_flowing(b, "fx", "k", inbox_a)
    publish(a, "fx", "k", b"from-a")
    inbox_b.wait_for(b"from-a")
    publish(b, "fx", "k", b"marker-b")  # behind any echo of from-a on b → a
    inbox_a.wait_for(b"marker-b")
    assert inbox_a.bodies() == [b"from-a", b"marker-b"]  # its own copy, then the marker only
    publish(a, "fx", "k", b"marker-a")  # behind any echo of marker-b on a → b
    inbox_b.wait_for(b"marker-a")
    assert inbox_b.bodies() == [b"from-a", b"marker-b", b"marker-a"]


def test_federation_matrix_upstream_exchange_rename(pairing: Pairing):
    """``exchange`` in the upstream definition: the downstream ``fx`` federates upstream ``ux``."""
    up, down = pairing.upstream(), pairing.downstream()
    declare(up, "ux")
    declare(up, "fx")  # same name upstream: must not be the one used
    declare(down, "fx", "dq", keys=("k",))
    down.federate(up, "^fx$", exchange="ux")
    inbox = Inbox(down, "dq")
    until_flowing(up, "ux", "k", inbox)
    publish(up, "fx", "k", b"same-name")
    publish(up, "ux", "k", b"renamed")
    assert inbox.wait_for(b"renamed") == [b"renamed"]
    [row] = down.links()
    assert (row["exchange"], row["upstream_exchange"]) == ("fx", "ux")


def test_federation_matrix_on_confirm_acks_upstream_after_downstream_confirms(pairing: Pairing):
    """``ack-mode: on-confirm``: 200 persistent messages arrive once each and the
    upstream queue of the link ends empty, nothing left unacknowledged."""
    up, down = pairing.upstream(), pairing.downstream()
    declare(up, "fx", durable=True)
    declare(down, "fx", "dq", keys=("k",), durable=True)
    down.federate(up, "^fx$", ack_mode="on-confirm", prefetch_count=20)
    inbox = Inbox(down, "dq")
    until_flowing(up, "fx", "k", inbox)
    sent = [f"m{n}".encode() for n in range(200)]
    publish(up, "fx", "k", *sent, persistent=True)
    inbox.wait_for(sent[-1])
    eventually(lambda: len(inbox.poll()) >= 200, LINK_TIMEOUT, 0.05)
    assert inbox.bodies() == sent
    _, queues = up.http("GET", "/api/queues/{v}")
    [link_queue] = [row["name"] for row in queues if row["name"].startswith("federation: fx -> ")]
    assert eventually(lambda: up.depth(link_queue) == (0, 0), LINK_TIMEOUT, 0.1), up.depth(link_queue)


@pytest.mark.parametrize("ack_mode", ["on-publish", "no-ack"])
def test_federation_matrix_other_ack_modes_move_every_message(pairing: Pairing, ack_mode: str):
    """``on-publish`` (acked upstream once sent downstream) and ``no-ack`` (consumed
    without acks): with both brokers up, every message arrives once, in order."""
    up, down = pairing.upstream(), pairing.downstream()
    declare(up, "fx")
    declare(down, "fx", "dq", keys=("k",))
    down.federate(up, "^fx$", ack_mode=ack_mode)
    inbox = Inbox(down, "dq")
    until_flowing(up, "fx", "k", inbox)
    sent = [f"m{n}".encode() for n in range(50)]
    publish(up, "fx", "k", *sent)
    inbox.wait_for(sent[-1])
    assert inbox.bodies() == sent


def test_federation_matrix_trust_user_id(pairing: Pairing):
    """A message's ``user-id`` crosses only with ``trust-user-id: true``; without it the
    link drops the property (the publisher's user means nothing downstream)."""
    up, kept, dropped = pairing.upstream(), pairing.downstream(), pairing.downstream()
    declare(up, "fx", exchange_type="fanout")
    inboxes = []
    for site, trust in ((kept, True), (dropped, False)):
        declare(site, "fx", "dq", keys=("",), exchange_type="fanout")
        site.federate(up, "^fx$", trust_user_id=trust)
        inboxes.append(Inbox(site, "dq"))
        until_flowing(up, "fx", "", inboxes[-1])
    connection = up.amqp()
    signed = pika.BasicProperties(user_id="guest", app_id="app")
    connection.channel().basic_publish("fx", "", b"signed", signed)
    connection.close()
    for inbox in inboxes:
        inbox.wait_for(b"signed")
    assert (inboxes[0].user_ids, inboxes[1].user_ids) == ({b"signed": "guest"}, {b"signed": None})


def test_federation_matrix_upstream_set_federates_from_each_member(pairing: Pairing):
    """A policy naming a ``federation-upstream-set`` of two upstreams: one link per
    upstream, messages from both."""
    one, two, down = pairing.upstream(), pairing.upstream(), pairing.downstream()
    for up in (one, two):
        declare(up, "fx")
    declare(down, "fx", "dq", keys=("k",))
    down.put_upstream("one", one.uri())
    down.put_upstream("two", two.uri())
    down.put_upstream_set("both", [{"upstream": "one"}, {"upstream": "two"}])
    down.put_policy("fed", "^fx$", {"federation-upstream-set": "both"})
    inbox = Inbox(down, "dq")
    until_flowing(one, "fx", "k", inbox)
    until_flowing(two, "fx", "k", inbox)
    publish(one, "fx", "k", b"from-one")
    publish(two, "fx", "k", b"from-two")
    inbox.wait_for(b"from-one")
    inbox.wait_for(b"from-two")
    assert sorted(inbox.bodies()) == [b"from-one", b"from-two"]
    rows = down.links()
    assert sorted((row["upstream"], row["exchange"], row["status"]) for row in rows) == [
        ("one", "fx", "running"), ("two", "fx", "running")]
    assert {entry["vhost"] for _, headers in inbox.messages for entry in headers["x-received-from"]} == {
        one.vhost, two.vhost}


def test_federation_matrix_upstream_topology_as_rabbitmq_names_it(pairing: Pairing):
    """What an exchange link declares upstream, as RabbitMQ's federation does: the queue
    ``federation: X -> CLUSTER:VHOST:X`` (``expires``/``message-ttl`` as ``x-expires``/
    ``x-message-ttl``), the internal ``x-federation-upstream`` exchange ``... B`` carrying
    the hop limit, and one binding per downstream binding with ``x-bound-from``."""
    up, down = pairing.upstream(), pairing.downstream()
    declare(up, "fx", exchange_type="topic")
    declare(down, "fx", "dq", keys=("a.#",), exchange_type="topic")
    bind(down, "dq", "fx", "b")
    down.federate(up, "^fx$", expires=600000, message_ttl=30000, max_hops=2)
    until_flowing(up, "fx", "a.probe", Inbox(down, "dq"))
    cluster = down.target.http("GET", "/api/overview")[1]["cluster_name"]
    queue = f"federation: fx -> {cluster}:{down.vhost}:fx"
    status, row = up.http("GET", f"/api/queues/{{v}}/{q(queue)}")
    assert status == 200, (queue, row)
    assert (row["durable"], row["auto_delete"], row["arguments"]) == (
        True, False, {"x-expires": 600000, "x-internal-purpose": "federation", "x-message-ttl": 30000})
    status, row = up.http("GET", f"/api/exchanges/{{v}}/{q(queue + ' B')}")
    assert status == 200, (queue + " B", row)
    assert (row["type"], row["durable"], row["auto_delete"], row["internal"]) == (
        "x-federation-upstream", True, True, True)
    assert row["arguments"] == {"x-downstream-name": cluster, "x-downstream-vhost": down.vhost,
                                "x-internal-purpose": "federation", "x-max-hops": 2}
    bound_from = [{"cluster-name": cluster, "exchange": f"{down.vhost}:fx B", "hops": 2, "vhost": down.vhost}]
    status, bindings = up.http("GET", "/api/exchanges/{v}/fx/bindings/source")
    assert status == 200, bindings
    assert sorted((b["destination"], b["routing_key"], json.dumps(b["arguments"], sort_keys=True))
                  for b in bindings) == [
        (queue + " B", key, json.dumps({"x-bound-from": bound_from}, sort_keys=True)) for key in ("a.#", "b")]
    status, bindings = up.http("GET", f"/api/exchanges/{{v}}/{q(queue + ' B')}/bindings/source")
    assert [(b["destination"], b["routing_key"]) for b in bindings] == [(queue, "")]


# -- queue federation ---------------------------------------------------------------------
def consume(site: Site, queue: str, count: int, timeout: float = LINK_TIMEOUT) -> list[tuple[bytes, dict]]:
    """Consume (prefetch 10, acks) until ``count`` messages came or ``timeout`` s passed;
    (body, headers) of each."""
    connection = site.amqp()
    got: list[tuple[bytes, dict]] = []
    try:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=10)
        deadline = time.monotonic() + timeout
        for method, properties, body in channel.consume(queue, inactivity_timeout=0.1):
            if method is not None:
                got.append((body, dict(properties.headers or {})))
                channel.basic_ack(method.delivery_tag)
            if len(got) >= count or time.monotonic() > deadline:
                break
        channel.cancel()
    finally:
        connection.close()
    return got


def test_federation_matrix_queue_moves_messages_only_to_demand(pairing: Pairing):
    """A federated queue pulls from the upstream queue only while it has a consumer:
    nothing moves before, every message once while it consumes, nothing after."""
    up, down = pairing.upstream(), pairing.downstream()
    declare(up, queue="fq", durable=True)
    declare(down, queue="fq", durable=True)
    publish(up, "", "fq", *(f"m{n}".encode() for n in range(5)), persistent=True)
    down.federate(up, "^fq$", apply_to="queues")
    [row] = down.wait_links(1)
    assert (row["type"], row["queue"], row["upstream_queue"]) == ("queue", "fq", "fq")
    time.sleep(1.0)  # no consumer: nothing may move (only a wait can show it)
    assert (up.depth("fq"), down.depth("fq")) == ((5, 0), (0, 0))
    got = consume(down, "fq", 5)
    assert [body for body, _ in got] == [f"m{n}".encode() for n in range(5)]
    for _, headers in got:  # as RabbitMQ 3.10.8 marks a message a queue link moved
        assert (headers["x-original-exchange"], headers["x-original-routing-key"]) == ("", "fq"), headers
        [entry] = headers["x-received-from"]
        expected = {"uri": up.redacted_uri(), "queue": "fq", "redelivered": False, "visit-count": 1}
        assert entry == expected, entry
    publish(up, "", "fq", b"later-1", b"later-2", b"later-3", persistent=True)
    time.sleep(1.0)  # the consumer is gone: nothing may move
    assert (up.depth("fq"), down.depth("fq")) == ((3, 0), (0, 0))


class Consumer:
    """A pika consumer whose deliveries are pumped by :meth:`pump` (no thread); acks
    only if ``ack``."""

    def __init__(self, site: Site, queue: str, prefetch: int, ack: bool = True) -> None:
        self.connection = site.amqp()
        self.channel = self.connection.channel()
        self.channel.basic_qos(prefetch_count=prefetch)
        self.bodies: list[bytes] = []

        def received(channel, method, _properties, body: bytes) -> None:
            self.bodies.append(body)
            if ack:
                channel.basic_ack(method.delivery_tag)

        self.channel.basic_consume(queue, received)

    def pump(self) -> None:
        self.connection.process_data_events(time_limit=0)

    def close(self) -> None:
        self.connection.close()


def test_federation_matrix_queue_upstream_consumers_come_first(pairing: Pairing):
    """The link consumes from the upstream queue with a lower priority than its own
    consumers: while an upstream consumer has room, messages stay where they were
    published, though the downstream queue has a consumer waiting."""
    up, down = pairing.upstream(), pairing.downstream()
    declare(up, queue="fq", durable=True)
    declare(down, queue="fq", durable=True)
    down.federate(up, "^fq$", apply_to="queues")
    far = Consumer(down, "fq", prefetch=10)
    near: Consumer | None = None
    try:
        probe = PROBE + b"demand"
        publish(up, "", "fq", probe)  # crosses: the downstream consumer is the only one
        eventually(lambda: far.pump() or probe in far.bodies, LINK_TIMEOUT, 0.02)
        assert far.bodies == [probe]
        near = Consumer(up, "fq", prefetch=500, ack=False)
        sent = [f"m{n}".encode() for n in range(100)]
        publish(up, "", "fq", *sent)

        def all_near() -> bool:
            far.pump()
            near.pump()
            return len(near.bodies) >= len(sent)

        eventually(all_near, LINK_TIMEOUT, 0.02)
        assert (near.bodies, far.bodies) == (sent, [probe])
    finally:
        far.close()
        if near is not None:
            near.close()


def test_federation_matrix_upstream_queue_rename(pairing: Pairing):
    """``queue`` in the upstream definition: the downstream ``fq`` federates upstream ``uq``."""
    up, down = pairing.upstream(), pairing.downstream()
    declare(up, queue="uq", durable=True)
    declare(up, queue="fq", durable=True)
    declare(down, queue="fq", durable=True)
    publish(up, "", "fq", b"same-name", persistent=True)
    publish(up, "", "uq", b"renamed", persistent=True)
    down.federate(up, "^fq$", apply_to="queues", queue="uq")
    [row] = down.wait_links(1)
    assert (row["queue"], row["upstream_queue"]) == ("fq", "uq")
    assert [body for body, _ in consume(down, "fq", 1)] == [b"renamed"]
    assert up.depth("fq") == (1, 0)


# -- definitions and status ---------------------------------------------------------------
UPSTREAM_VALUE = {
    "uri": ["amqp://guest:secret@127.0.0.1:1/%2F", "amqp://127.0.0.1:2"],
    "ack-mode": "on-publish", "prefetch-count": 50, "reconnect-delay": 2, "max-hops": 3,
    "expires": 3600000, "message-ttl": 60000, "exchange": "ux", "queue": "uq",
    "trust-user-id": True,
}  # fmt: skip
SET_VALUE = [{"upstream": "u1"}, {"upstream": "u2", "exchange": "other", "max-hops": 2}]


def test_federation_matrix_definitions_round_trip(pairing: Pairing):
    """``federation-upstream``/``-set`` parameters and a federation policy defined on the
    upstream's broker, exported from its ``/api/definitions/{vhost}`` and imported into
    the downstream's: the same parameters and policy come out of the second export."""
    source, destination = pairing.upstream(), pairing.downstream()
    keys = {k: v for k, v in UPSTREAM_VALUE.items() if k != "uri"}
    source.put_upstream("u1", UPSTREAM_VALUE["uri"], **keys)
    source.put_upstream("u2", "amqp://127.0.0.1:3")
    source.put_upstream_set("pair", SET_VALUE)
    source.put_policy("fed", "^nothing-matches$", {"federation-upstream-set": "pair"})
    status, exported = source.http("GET", "/api/definitions/{v}")
    assert status == 200, exported
    status, answer = destination.http("POST", "/api/definitions/{v}", exported)
    assert status in (200, 201, 204), (status, answer)
    status, again = destination.http("GET", "/api/definitions/{v}")
    assert status == 200, again

    def federation(document: dict) -> list[tuple]:
        parameters = [p for p in document.get("parameters", []) if p["component"].startswith("federation-")]
        return sorted((p["component"], p["name"], json.dumps(p["value"], sort_keys=True)) for p in parameters)

    assert federation(again) == federation(exported)
    assert federation(exported) == sorted([
        ("federation-upstream", "u1", json.dumps(UPSTREAM_VALUE, sort_keys=True)),
        ("federation-upstream", "u2", json.dumps({"uri": "amqp://127.0.0.1:3"})),
        ("federation-upstream-set", "pair", json.dumps(SET_VALUE, sort_keys=True)),
    ]), federation(exported)
    [policy] = again["policies"]
    assert (policy["name"], policy["definition"]) == ("fed", {"federation-upstream-set": "pair"})
    for site in (source, destination):
        assert site.http("GET", "/api/parameters/federation-upstream/{v}/u1")[1]["value"] == UPSTREAM_VALUE


#: the shape of ``/api/federation-links`` rows (RabbitMQ 3.10.8): key → value pattern;
#: ids, timestamps, node names and connection names differ between brokers. The hour of
#: ``timestamp`` has no leading zero (``2026-11-28 8:05:39``, local time).
ID = re.compile(r"^[0-9a-f]{8}$")
TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2} (?:\d|1\d|2[0-3]):\d{2}:\d{2}$")
ANY = re.compile(r"^.+$")
COMMON = {"node": ANY, "type": None, "vhost": None, "upstream": None, "id": ID, "status": None,
          "uri": None, "timestamp": TIMESTAMP}  # fmt: skip
EXCHANGE_ROW = {**COMMON, "exchange": None, "upstream_exchange": None, "local_connection": ANY}
QUEUE_ROW = {**COMMON, "queue": None, "upstream_queue": None, "consumer_tag": None, "local_connection": ANY}
ERROR_ROW = {**COMMON, "exchange": None, "upstream_exchange": None, "error": ANY}


def check_row(row: dict, shape: dict, expected: dict, optional: tuple[str, ...] = ()) -> None:
    """``row`` has exactly ``shape``'s keys (and ``local_channel``, which RabbitMQ adds
    once the local connection's channel has statistics: that channel's row), every
    value a string matching its pattern or, for a None pattern, equal to ``expected``;
    keys in ``optional`` may be missing."""
    row = dict(row)
    channel = row.pop("local_channel", None)
    wanted = set(shape) - {key for key in optional if key not in row}
    assert set(row) == wanted, f"keys differ from RabbitMQ's: extra {set(row) - wanted}, " \
                               f"missing {wanted - set(row)}: {row}"
    for key in wanted:
        pattern = shape[key]
        assert isinstance(row[key], str), (key, row[key])
        if pattern is None:
            assert row[key] == expected[key], (key, row[key], expected[key])
        else:
            assert pattern.match(row[key]), (key, row[key])
    if channel is not None:
        assert "local_connection" in row, row
        assert channel["connection_details"]["name"] == row["local_connection"], channel
        assert (channel["vhost"], channel["number"]) == (expected["vhost"], 1), channel


def check_local_connection(site: Site, name: str) -> None:
    """``name`` is a connection ``/api/connections`` lists in the site's vhost (RabbitMQ's
    statistics may take a few seconds to show it)."""
    path = f"/api/connections/{q(name)}"
    eventually(lambda: site.target.http("GET", path)[0] == 200, 10, 0.2)
    status, connection = site.target.http("GET", path)
    assert status == 200 and connection["vhost"] == site.vhost, (name, status, connection)


def status_rows(pairing: Pairing) -> tuple[Site, Site, dict[str, dict]]:
    """(up, down, rows by exchange/queue name) of three links of ``down``: exchange
    ``fx`` and queue ``fq`` running, exchange ``bx`` failing (a closed port)."""
    up, down = pairing.upstream(), pairing.downstream()
    declare(up, "fx")
    declare(down, "fx")
    declare(down, queue="fq", durable=True)
    declare(down, "bx")
    down.put_upstream("up", up.uri())
    down.put_upstream("nowhere", "amqp://guest:secret@127.0.0.1:1/%2F", reconnect_delay=1)
    down.put_policy("fx", "^fx$", {"federation-upstream": "up"})
    down.put_policy("fq", "^fq$", {"federation-upstream": "up"}, apply_to="queues")
    down.put_policy("bx", "^bx$", {"federation-upstream": "nowhere"})
    down.wait_links(2)
    eventually(lambda: any(r.get("status") == "error" for r in down.links()), LINK_TIMEOUT, 0.1)
    rows = {row.get("exchange") or row.get("queue"): row for row in down.links()}
    assert set(rows) == {"fx", "fq", "bx"}, rows
    return up, down, rows


def test_federation_matrix_links_status_fields(pairing: Pairing):
    """``/api/federation-links/{vhost}`` rows of a running exchange link, a running queue
    link and a link in error, field by field as RabbitMQ 3.10.8 shows them; the node is
    the one ``/api/overview`` names; the queue link's ``local_connection`` is its
    connection to the downstream (the exchange link's: the next test)."""
    up, down, rows = status_rows(pairing)
    common = {"vhost": down.vhost, "status": "running", "uri": up.redacted_uri(), "upstream": "up"}
    exchange = {**common, "type": "exchange", "exchange": "fx", "upstream_exchange": "fx"}
    check_row(rows["fx"], EXCHANGE_ROW, exchange)
    queue = {**common, "type": "queue", "queue": "fq", "upstream_queue": "fq",
             "consumer_tag": "federation-link-up"}
    check_row(rows["fq"], QUEUE_ROW, queue)
    error = {**exchange, "exchange": "bx", "upstream_exchange": "bx", "status": "error",
             "upstream": "nowhere", "uri": "amqp://127.0.0.1:1/%2F"}
    check_row(rows["bx"], ERROR_ROW, error)
    assert len({row["id"] for row in rows.values()}) == 3
    node = down.target.http("GET", "/api/overview")[1]["node"]
    assert {row["node"] for row in rows.values()} == {node}
    check_local_connection(down, rows["fq"]["local_connection"])


def test_federation_matrix_exchange_link_names_its_local_connection(pairing: Pairing):
    """A running exchange link's row names its connection to the downstream broker
    (``local_connection``, listed by ``/api/connections`` in that vhost): both brokers'
    links publish on a direct connection, which they list."""
    _, down, rows = status_rows(pairing)
    assert "local_connection" in rows["fx"], rows["fx"]
    check_local_connection(down, rows["fx"]["local_connection"])
