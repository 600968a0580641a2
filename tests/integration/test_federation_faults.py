"""Federation links under faults, leveret → leveret (and RabbitMQ 3.10 → RabbitMQ 3.10 with
the same calls, to prove each test right): a network cut (tests/tcp_proxy.py between the
link and its upstream), kill -9 of the upstream or the downstream broker (processes with
their data on disk, restarted on the same ports), the upstream queue deleted, credentials
revoked. Every link retries after ``reconnect-delay``, shows the failure in
``/api/federation-links`` (``status`` ``error`` with the ``error`` text) and, with
``ack-mode`` ``on-confirm``, loses no message the upstream confirmed: duplicates are
allowed (and printed), loss is not.

What RabbitMQ 3.10.8 showed (docs/federation.md, "Failures and recovery"): after a cut
the link restarts at once and runs again within a second; a refused connection gives
``error`` ``{socket_closed_unexpectedly,'connection.start'}``; a changed password
``{auth_failure,"ACCESS_REFUSED - Login was refused ..."}``; removed permissions
``not_allowed``; a deleted upstream queue ``basic_cancel``, then it is declared again.
"""

from __future__ import annotations

import re
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from eventually import eventually, poll
from federation_load import Consumer, Publisher, Watcher, collect, ranges, report
from federation_sides import TIMEOUT, LeveretSide, RabbitSide, federate, links
from targets import Target, rabbitmq_installed, unique
from tcp_proxy import CuttableProxy

#: seconds between a failed link's attempts in these tests (RabbitMQ accepts fractions too)
DELAY = 0.2

Side = LeveretSide | RabbitSide



@pytest.fixture(scope="module")
def rabbitmq_pair() -> Iterator[tuple[RabbitSide, RabbitSide]]:
    """Two private RabbitMQ nodes with federation (upstream, downstream) for the module."""
    if not rabbitmq_installed():
        pytest.skip("rabbitmq-server is not installed: only leveret is checked")
    upstream = RabbitSide("upstream")
    try:
        downstream = RabbitSide("downstream")
    except Exception:
        upstream.stop()
        raise
    yield upstream, downstream
    upstream.stop()
    downstream.stop()


@pytest.fixture(params=["leveret", "rabbitmq"])
def pair(request, tmp_path) -> Iterator[tuple[Side, Side]]:
    """(upstream, downstream): two ``leveret server`` processes with data directories, or
    the module's RabbitMQ nodes (the reference)."""
    if request.param == "rabbitmq":
        yield request.getfixturevalue("rabbitmq_pair")
        return
    upstream = LeveretSide(tmp_path / "upstream", "upstream")
    downstream = LeveretSide(tmp_path / "downstream", "downstream")
    starting = threading.Thread(target=upstream.start)  # both at once: the fixture is quicker
    starting.start()
    downstream.start()
    starting.join()
    assert upstream.process is not None, "the upstream did not start"
    yield upstream, downstream
    for side in (upstream, downstream):
        side.stop()


@pytest.fixture
def proxy(pair) -> Iterator[CuttableProxy]:
    """The network between the link and its upstream broker."""
    with CuttableProxy(pair[0].amqp_port) as cuttable:
        yield cuttable


@dataclass
class Federated:
    """One federated exchange (or queue) and its single link."""

    upstream: Side
    downstream: Side
    name: str  # the exchange's (or queue's) name on both sides
    sink: str  # the downstream queue the tests read (the federated queue itself for queues)
    upstream_name: str  # the federation-upstream parameter
    kind: str = "exchange"

    def row(self) -> dict:
        for row in links(self.downstream.target):
            if row.get(self.kind) == self.name and row.get("upstream") == self.upstream_name:
                return row
        return {}

    def state(self) -> tuple[str | None, str | None]:
        row = self.row()
        return row.get("status"), row.get("error")

    def wait(self, status: str, timeout: float = TIMEOUT) -> dict:
        row = poll(self.row, lambda r: r.get("status") == status, timeout, 0.05)
        assert row.get("status") == status, f"link not {status}: {row}"
        return row

    def upstream_queue(self) -> str | None:
        """The link's queue on the upstream (``federation: X -> node`` for an exchange)."""
        prefix = f"federation: {self.name} -> " if self.kind == "exchange" else self.name
        status, queues = self.upstream.target.http("GET", "/api/queues")
        assert status == 200
        names = [q["name"] for q in queues if q["name"].startswith(prefix)]
        return names[0] if names else None


def declare(target: Target, *calls: Callable) -> None:
    connection = target.amqp()
    channel = connection.channel()
    for call in calls:
        call(channel)
    connection.close()


@pytest.fixture
def federated(pair, request) -> Iterator[Callable[..., Federated]]:
    """``federated(uri_port=..., user=..., password=..., kind=..., uri_query=..., **settings)``: a
    durable direct exchange ``fed.x-...`` on both sides (downstream: a durable queue bound
    with key ``k``) or a durable queue ``fed.q-...`` on both sides, federated downstream
    from the upstream (``reconnect-delay`` DELAY, ``ack-mode`` ``on-confirm`` unless
    ``settings`` say otherwise); returns once its link runs. Policies and upstream
    parameters go at teardown (the RabbitMQ nodes serve the whole module)."""
    upstream, downstream = pair
    made: list[Federated] = []

    def make(uri_port: int | None = None, user: str = "guest", password: str = "guest",
             kind: str = "exchange", uri_query: str = "", **settings: object) -> Federated:
        name = unique("fed.x" if kind == "exchange" else "fed.q")
        sink = unique("sink") if kind == "exchange" else name
        if kind == "exchange":
            for side in (upstream, downstream):
                declare(side.target, lambda ch: ch.exchange_declare(name, "direct", durable=True))
            declare(downstream.target, lambda ch: ch.queue_declare(sink, durable=True),
                    lambda ch: ch.queue_bind(sink, name, "k"))
        else:
            for side in (upstream, downstream):
                declare(side.target, lambda ch: ch.queue_declare(name, durable=True))
        fed = Federated(upstream, downstream, name, sink, unique("up"), kind)
        uri = f"amqp://{user}:{password}@127.0.0.1:{uri_port or upstream.amqp_port}{uri_query}"
        options = {"reconnect-delay": DELAY, "ack-mode": "on-confirm", **settings}
        apply_to = "exchanges" if kind == "exchange" else "queues"
        federate(downstream.target, uri, f"^{re.escape(name)}$", apply_to, fed.upstream_name, **options)
        made.append(fed)
        fed.wait("running")
        return fed

    yield make
    for fed in made:
        try:
            downstream.target.http("DELETE", f"/api/policies/%2F/fed-{fed.upstream_name}")
            downstream.target.http("DELETE", f"/api/parameters/federation-upstream/%2F/{fed.upstream_name}")
        except OSError:
            pass


def check_nothing_lost(fed: Federated, confirmed: set[str], what: str) -> None:
    assert confirmed, "nothing was confirmed: the test did not load the link"
    received = collect(fed.downstream.url, fed.sink, confirmed, TIMEOUT)
    missing, duplicates = report(received, confirmed)
    counts = f"{len(confirmed)} confirmed, {len(received)} received"
    print(f"{what}: {counts}, {duplicates} duplicates, {missing} lost")
    lost = ranges(confirmed - set(received))
    assert missing == 0, f"{missing} confirmed messages lost ({duplicates} duplicates): {lost}"


# -- network cut ---------------------------------------------------------------------------
def test_a_cut_network_loses_no_confirmed_message(pair, proxy, federated):
    """Publishing upstream while the proxy resets the link's connection three times, then
    refuses connections for a while: the link shows ``error`` with its text while it
    cannot connect, retries, runs again once the network is back, and every confirmed
    message reaches the downstream queue."""
    upstream, _ = pair
    fed = federated(uri_port=proxy.port)
    with Publisher(upstream.url, fed.name, "k") as publisher:
        for cut in range(3):
            publisher.wait_for(200 * (cut + 1))
            assert proxy.cut() >= 1
            # a status row may still say running just after the cut: wait for the new connection
            assert eventually(proxy.open_count, TIMEOUT), "the link did not connect again"
            fed.wait("running")
        proxy.block("refuse")
        proxy.cut()
        row = fed.wait("error")
        assert row["error"], row
        print("refused network: link error", repr(row["error"]))
        attempts = proxy.accepted
        assert eventually(lambda: proxy.accepted >= attempts + 2, 10), "the link stopped retrying"
        proxy.unblock()
        fed.wait("running")
        publisher.wait_for(len(publisher.confirmed) + 100)
        confirmed = publisher.stop()
    check_nothing_lost(fed, confirmed, "cut")


def test_a_partition_is_noticed_through_heartbeats(proxy, federated):
    """The link's connection stops carrying anything, with no RST (the proxy freezes it):
    only AMQP heartbeats tell. With ``?heartbeat=1`` in the upstream URI the link leaves
    ``running`` within seconds and runs again on a new connection (RabbitMQ's Erlang
    client misses two heartbeats; aiormq allows three intervals and a second)."""
    fed = federated(uri_port=proxy.port, uri_query="?heartbeat=1")
    assert proxy.freeze() >= 1
    began, attempts = time.monotonic(), proxy.accepted
    # noticed: the row leaves running, or (RabbitMQ restarts a link at once, faster than
    # a poll may see) the link has already opened a new connection through the proxy
    noticed_it = lambda: proxy.accepted > attempts or fed.row().get("status") != "running"  # noqa: E731
    assert eventually(noticed_it, 30, 0.1), "still running 30 s after the partition"
    noticed = time.monotonic() - began
    row = fed.row()
    fed.wait("running")
    print(f"partition: noticed after {noticed:.1f} s ({row.get('error')!r}), running again after "
          f"{time.monotonic() - began:.1f} s")


# -- kill -9 -------------------------------------------------------------------------------
class Load:
    """Confirmed messages published to the upstream side of ``fed`` (its exchange with key
    ``k``, or its queue) from a thread; for a queue link also a consumer downstream (the
    demand that makes a queue link pull). ``check(what)`` stops publishing and asserts
    that every confirmed message arrived downstream (printing the duplicates)."""

    def __init__(self, fed: Federated) -> None:
        self.fed = fed
        exchange, key = (fed.name, "k") if fed.kind == "exchange" else ("", fed.name)
        self.publisher = Publisher(fed.upstream.url, exchange, key)
        self.consumer = Consumer(fed.downstream.url, fed.sink) if fed.kind == "queue" else None

    def __enter__(self) -> Publisher:
        if self.consumer is not None:
            self.consumer.__enter__()
        return self.publisher.__enter__()

    def __exit__(self, *exc: object) -> None:
        self.publisher.stop()
        if self.consumer is not None:
            self.consumer.__exit__()

    def check(self, what: str) -> None:
        confirmed = self.publisher.stop()
        if self.consumer is None:
            check_nothing_lost(self.fed, confirmed, what)
            return
        received = self.consumer.wait_for(confirmed, TIMEOUT)
        missing, duplicates = report(received, confirmed)
        print(f"{what}: {len(confirmed)} confirmed, {len(received)} received, {duplicates} duplicates")
        lost = ranges(confirmed - set(received))
        assert missing == 0, f"{missing} confirmed messages lost ({duplicates} duplicates): {lost}"


@pytest.mark.parametrize("kind", ["exchange", "queue"])
def test_a_killed_upstream_loses_no_confirmed_message(pair, federated, kind):
    """kill -9 of the upstream broker while messages are published to it: the link shows
    ``error`` while the upstream is down, runs again after its restart (the link's queue
    there is durable), and every message confirmed before or after the kill arrives."""
    upstream, _ = pair
    fed = federated(kind=kind)
    load = Load(fed)
    with load as publisher:
        publisher.wait_for(300)
        upstream.kill()
        row = fed.wait("error")
        assert row["error"], row
        print(f"upstream killed ({kind}): link error", repr(row["error"]))
        began = time.monotonic()
        upstream.restart()
        restarted = time.monotonic()
        fed.wait("running")
        back = time.monotonic() - restarted
        print(f"upstream killed ({kind}): down {restarted - began:.1f} s, running {back:.2f} s after restart")
        publisher.wait_for(len(publisher.confirmed) + 200)
        load.check(f"upstream killed ({kind})")


@pytest.mark.parametrize("kind", ["exchange", "queue"])
def test_a_killed_downstream_loses_no_confirmed_message(pair, federated, kind):
    """kill -9 of the downstream broker (where the link runs) while messages are
    published upstream: after its restart the link comes back from the stored policy and
    upstream parameter, and what was not confirmed downstream is redelivered upstream."""
    downstream = pair[1]
    fed = federated(kind=kind)
    load = Load(fed)
    with load as publisher:
        publisher.wait_for(300)
        downstream.kill()
        publisher.wait_for(len(publisher.confirmed) + 200)  # queued upstream meanwhile
        downstream.restart()
        restarted = time.monotonic()
        fed.wait("running")
        back = time.monotonic() - restarted
        print(f"downstream killed ({kind}): link running {back:.2f} s after the restart")
        publisher.wait_for(len(publisher.confirmed) + 200)
        load.check(f"downstream killed ({kind})")


# -- the upstream queue deleted ------------------------------------------------------------
def test_a_deleted_upstream_queue_is_reported_and_declared_again(pair, federated):
    """Someone deletes the link's queue on the upstream: the consumer is cancelled, the
    link goes through a failed state (RabbitMQ: ``error`` ``basic_cancel``), reconnects,
    declares the queue again and carries messages once more."""
    upstream, _ = pair
    fed = federated(**{"reconnect-delay": 1})
    queue = fed.upstream_queue()
    assert queue is not None
    with Watcher(fed.state) as watcher:
        time.sleep(0.1)
        path = f"/api/queues/%2F/{urllib.parse.quote(queue, safe='')}"
        assert upstream.target.http("DELETE", path)[0] == 204
        noticed = eventually(lambda: {"error", "starting"} & set(watcher.states()), 5)
        assert noticed, watcher.changes
        assert eventually(lambda: watcher.states()[-1] == "running", TIMEOUT), watcher.changes
    assert eventually(lambda: fed.upstream_queue() == queue, 5)
    print("deleted upstream queue: states", watcher.changes)
    with Publisher(upstream.url, fed.name, "k", limit=100) as publisher:
        publisher.wait_for(100)
        confirmed = publisher.stop()
    check_nothing_lost(fed, confirmed, "deleted upstream queue")


# -- credentials revoked -------------------------------------------------------------------
def new_user(side: Side) -> str:
    user = unique("fed-user")
    assert side.target.http("PUT", f"/api/users/{user}", {"password": "pw", "tags": ""})[0] == 201
    grant_all(side, user)
    return user


def grant_all(side: Side, user: str) -> None:
    everything = {"configure": ".*", "write": ".*", "read": ".*"}
    assert side.target.http("PUT", f"/api/permissions/%2F/{user}", everything)[0] in (201, 204)


def test_a_changed_password_is_reported_as_access_refused_until_restored(pair, proxy, federated):
    """The link's user gets another password upstream: the running connection goes on
    (as RabbitMQ's), the next connection is refused (``ACCESS_REFUSED`` in the link's
    error), retried every reconnect-delay; with the password back it runs again, and what
    was published meanwhile arrives."""
    upstream, _ = pair
    user = new_user(upstream)
    fed = federated(uri_port=proxy.port, user=user, password="pw")
    assert upstream.target.http("PUT", f"/api/users/{user}", {"password": "other", "tags": ""})[0] == 204
    proxy.cut()
    row = poll(fed.row, lambda r: "ACCESS_REFUSED" in (r.get("error") or ""), TIMEOUT, 0.02)
    assert row.get("status") in ("error", "starting") and "ACCESS_REFUSED" in row["error"], row
    print("password changed: link error", repr(row["error"]))
    attempts = proxy.accepted
    assert eventually(lambda: proxy.accepted >= attempts + 2, 10), "the link stopped retrying"
    with Publisher(upstream.url, fed.name, "k", limit=50) as publisher:
        publisher.wait_for(50)
        confirmed = publisher.stop()
    assert upstream.target.http("PUT", f"/api/users/{user}", {"password": "pw", "tags": ""})[0] == 204
    fed.wait("running")
    check_nothing_lost(fed, confirmed, "password changed")


def test_removed_permissions_are_reported_until_restored(pair, proxy, federated):
    """The link's user loses its permissions on the upstream vhost: after the next
    reconnection the link shows ``error`` (RabbitMQ: ``not_allowed``, the vhost access
    refusal); with permissions back it runs again. Then read permission alone is taken:
    the link's consume is refused with 403 ACCESS_REFUSED."""
    upstream, _ = pair
    user = new_user(upstream)
    fed = federated(uri_port=proxy.port, user=user, password="pw")
    assert upstream.target.http("DELETE", f"/api/permissions/%2F/{user}")[0] == 204
    proxy.cut()
    row = poll(fed.row, lambda r: re.search("refused|not_allowed", r.get("error") or "", re.I), TIMEOUT, 0.02)
    assert row.get("status") == "error" and re.search("refused|not_allowed", row["error"], re.I), row
    print("permissions removed: link error", repr(row["error"]))
    grant_all(upstream, user)
    fed.wait("running")
    everything_but_read = {"configure": ".*", "write": ".*", "read": "^$"}
    assert upstream.target.http("PUT", f"/api/permissions/%2F/{user}", everything_but_read)[0] == 204
    proxy.cut()
    row = poll(fed.row, lambda r: "ACCESS_REFUSED" in (r.get("error") or ""), TIMEOUT, 0.02)
    assert "ACCESS_REFUSED" in (row.get("error") or ""), row
    print("read refused: link error", repr(row["error"]))
    grant_all(upstream, user)
    fed.wait("running")
    with Publisher(upstream.url, fed.name, "k", limit=50) as publisher:
        publisher.wait_for(50)
        confirmed = publisher.stop()
    check_nothing_lost(fed, confirmed, "permissions removed")


# -- reconnect-delay -----------------------------------------------------------------------
@pytest.mark.parametrize("delay", [0.2, 1])
def test_reconnect_delay_spaces_the_attempts(pair, proxy, federated, delay):
    """While the upstream refuses connections the link tries once per reconnect-delay,
    loosely: over 3 s, ``3 / delay`` attempts give or take (RabbitMQ's first restart is
    immediate, then one per delay; wall time here is noisy, so the bounds are wide)."""
    fed = federated(uri_port=proxy.port, **{"reconnect-delay": delay})
    proxy.block("refuse")
    proxy.cut()
    fed.wait("error")
    start, began = proxy.accepted, time.monotonic()
    time.sleep(3)
    attempts = (proxy.accepted - start) / (time.monotonic() - began) * 3
    print(f"reconnect-delay {delay}: {attempts:.1f} attempts in 3 s")
    assert 3 / delay / 3 <= attempts <= 3 / delay * 1.5 + 1, attempts
    proxy.unblock()
    fed.wait("running")


# -- queue federation ----------------------------------------------------------------------
def test_a_queue_link_cut_and_refused_loses_no_confirmed_message(proxy, federated):
    """Queue federation: the downstream queue has a consumer, the upstream queue gets
    confirmed messages; the link's connection is cut and refused for a while: every
    confirmed message reaches the downstream consumer (duplicates allowed)."""
    fed = federated(uri_port=proxy.port, kind="queue")
    load = Load(fed)
    with load as publisher:
        publisher.wait_for(200)
        proxy.cut()
        publisher.wait_for(400)
        proxy.block("refuse")
        proxy.cut()
        fed.wait("error")
        proxy.unblock()
        fed.wait("running")
        publisher.wait_for(len(publisher.confirmed) + 100)
        load.check("queue link cut")
