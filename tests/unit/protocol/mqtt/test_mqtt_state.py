"""MQTT's durable state (leveret.protocol.mqtt.state) on a real SQLite store: retained
messages and persistent sessions written through the store, read back by a fresh
broker core from the same data directory (as at a restart, and after ``kill -9``),
expiry on an injected clock, vhost deletion, and the retained index's filter matching
against topics.matches."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from leveret import BlockingBroker
from leveret.core.broker import BrokerCore
from leveret.core.clock import ManualClock
from leveret.protocol.mqtt.state import (
    HASHED_PREFIX,
    NEVER_EXPIRES,
    MqttState,
    RetainedIndex,
    RetainedMessage,
    SessionRecord,
    SubscriptionOptions,
    store_name,
)
from leveret.protocol.mqtt.topics import matches
from leveret.store.batched import BatchedStore
from leveret.store.sqlite import SQLiteStore

TIMEOUT = 10.0
START = 1_700_000_000.0
SRC = Path(__file__).resolve().parents[4] / "src"


class Node:
    """A broker core on a store, set up as the server does it (``attach_store``, then
    the store's writer started), with the MQTT state of that core."""

    def __init__(self, store: BatchedStore, now: float = START) -> None:
        self.loop = asyncio.new_event_loop()
        self.clock = ManualClock(now)
        self.core = BrokerCore(self.clock)
        self.store = store
        self.core.attach_store(store)
        store.start(self.loop)
        self.state = MqttState.of(self.core)

    def durable(self) -> bool:
        """Wait until every change so far is on disk (MqttState.when_durable)."""
        future = self.loop.create_future()
        self.state.when_durable(future.set_result)
        return self.loop.run_until_complete(asyncio.wait_for(future, TIMEOUT))

    def close(self) -> None:
        self.store.close()
        self.loop.close()


def restart(node: Node, now: float = START) -> Node:
    """Close ``node`` cleanly and start a fresh core on the same data directory."""
    assert node.durable()
    node.close()
    assert isinstance(node.store, SQLiteStore)
    return Node(SQLiteStore(node.store.path.parent), now)


@pytest.fixture
def node(tmp_path: Path):
    opened = Node(SQLiteStore(tmp_path))
    yield opened
    if opened.store._db is not None:
        opened.close()


def topics(messages: list[RetainedMessage]) -> list[str]:
    return sorted(m.topic for m in messages)


# -- retained messages ----------------------------------------------------------------
def test_retained_messages_come_back_after_a_restart_byte_for_byte(node):
    node.core.add_vhost("other")
    state = node.state
    state.retain("/", RetainedMessage("home/kitchen/temp", b"\x00\xff21.5", 1, b"\x01\x01", START + 3600))
    state.retain("/", RetainedMessage("home/hall/temp", b"19", 0))
    state.retain("/", RetainedMessage("home/hall/temp", b"20", 2))  # replaces
    state.retain("/", RetainedMessage("gone", b"x", 0))
    state.clear_retained("/", "gone")
    state.retain("/", RetainedMessage("also-gone", b"x", 0))
    state.retain("/", RetainedMessage("also-gone", b"", 0))  # an empty payload clears
    state.retain("other", RetainedMessage("home/hall/temp", b"elsewhere", 1))
    assert state.retained_count("/") == 2

    again = restart(node)
    try:
        state = again.state
        assert state is not node.state and state is MqttState.of(again.core)
        assert state.retained_count("/") == 2 and state.retained_count("other") == 1
        assert state.retained_matching("/", "home/kitchen/temp", START) == [
            RetainedMessage("home/kitchen/temp", b"\x00\xff21.5", 1, b"\x01\x01", START + 3600)
        ]
        [hall] = state.retained_matching("/", "home/hall/temp", START)
        assert (hall.payload, hall.qos, hall.properties, hall.expires_at) == (b"20", 2, b"", None)
        assert state.retained_matching("/", "gone", START) == []
        assert state.retained_matching("/", "also-gone", START) == []
        assert [m.payload for m in state.retained_matching("other", "#", START)] == [b"elsewhere"]
        assert again.core.adapter_definitions == {}  # MqttState took its kinds
    finally:
        again.close()


def test_an_expired_retained_message_is_dropped_when_matched_swept_and_at_start_up(node):
    state = node.state
    state.retain("/", RetainedMessage("a/soon", b"1", 0, expires_at=START + 10))
    state.retain("/", RetainedMessage("a/later", b"2", 0, expires_at=START + 100))
    state.retain("/", RetainedMessage("a/never", b"3", 0))
    state.retain("/", RetainedMessage("b/swept", b"4", 0, expires_at=START + 20))
    assert state.next_retained_expiry() == START + 10
    assert topics(state.retained_matching("/", "a/+", START + 9)) == ["a/later", "a/never", "a/soon"]
    assert topics(state.retained_matching("/", "a/+", START + 10)) == ["a/later", "a/never"]
    assert state.retained_count("/") == 3  # a/soon deleted
    assert state.expire_retained(START + 30) == 1  # b/swept (a/soon's entry is stale)
    assert state.retained_matching("/", "b/swept", START + 30) == []

    again = restart(node, now=START + 100)  # a/later expires as the broker starts
    try:
        assert topics(again.state.retained_matching("/", "#", START + 100)) == ["a/never"]
    finally:
        again.close()
    db = sqlite3.connect(again.store.path)  # deleted from the store, not only skipped
    try:
        rows = db.execute("SELECT name FROM definitions WHERE kind='mqtt_retained'").fetchall()
    finally:
        db.close()
    assert rows == [("a/never",)]


def test_retaining_one_topic_again_and_again_keeps_the_expiry_heap_small(node):
    for i in range(5000):
        node.state.retain("/", RetainedMessage("t", b"%d" % i, 0, expires_at=START + 3600 + i))
    assert len(node.state._expiring) <= 1024 + 2
    assert node.state.next_retained_expiry() is not None


def test_long_topics_and_client_ids_are_stored_under_a_hashed_name(node):
    long_topic = "x/" + "é" * 600
    odd_topic = HASHED_PREFIX + "abc"  # a short topic that looks like a hashed name
    assert store_name(long_topic).startswith(HASHED_PREFIX) and store_name(odd_topic) != odd_topic
    node.state.retain("/", RetainedMessage(long_topic, b"long", 1))
    node.state.retain("/", RetainedMessage(odd_topic, b"odd", 1))
    node.state.save_session(SessionRecord("/", "c" * 2000, 60, {"f/" + "y" * 1000: SubscriptionOptions(1)}))
    again = restart(node)
    try:
        state = again.state
        assert [m.payload for m in state.retained_matching("/", long_topic, START)] == [b"long"]
        assert [m.payload for m in state.retained_matching("/", odd_topic, START)] == [b"odd"]
        session = state.session("/", "c" * 2000)
        assert session is not None and list(session.subscriptions) == ["f/" + "y" * 1000]
        state.clear_retained("/", long_topic)
        state.clear_retained("/", odd_topic)
        state.delete_session("/", "c" * 2000)
        third = restart(again)
    finally:
        if again.store._db is not None:
            again.close()
    try:
        assert third.state.retained_count("/") == 0 and third.state.sessions() == []
    finally:
        third.close()


# -- filter matching ------------------------------------------------------------------
def test_filters_match_as_mqtt_says_including_dollar_topics(node):
    for topic in ("a", "a/b", "a/b/c", "a//b", "/x", "$SYS/broker/load", "$share-like/x", "b/$x"):
        node.state.retain("/", RetainedMessage(topic, b"p", 0))

    def match(topic_filter: str) -> list[str]:
        return topics(node.state.retained_matching("/", topic_filter, START))

    assert match("#") == ["/x", "a", "a//b", "a/b", "a/b/c", "b/$x"]  # §4.7.2: no $...
    assert match("+/#") == ["/x", "a", "a//b", "a/b", "a/b/c", "b/$x"]
    assert match("+") == ["a"]
    assert match("$SYS/#") == ["$SYS/broker/load"]
    assert match("$SYS/+/load") == ["$SYS/broker/load"]
    assert match("+/broker/load") == []
    assert match("a/#") == ["a", "a//b", "a/b", "a/b/c"]  # "#" matches the parent too
    assert match("a/+") == ["a/b"]
    assert match("a/+/+") == ["a//b", "a/b/c"]
    assert match("+/+") == ["/x", "a/b", "b/$x"]
    assert match("a/b") == ["a/b"] and match("a/b/c/d") == [] and match("A/b") == []


_LEVEL = st.sampled_from(["a", "b", "", "$s", "ab"])
_TOPIC = st.lists(_LEVEL, min_size=1, max_size=4).map("/".join).filter(bool)
_FILTER = st.lists(st.sampled_from(["a", "b", "", "$s", "+"]), min_size=1, max_size=4).flatmap(
    lambda levels: st.sampled_from(["/".join(levels), "/".join([*levels, "#"]), "#"])
)


@given(st.lists(_TOPIC, max_size=30), _FILTER)
def test_the_index_finds_what_topics_matches_finds(names, topic_filter):
    index = RetainedIndex()
    for name in names:
        index.put(RetainedMessage(name, b"p", 0))
    for name in names[::3]:
        index.remove(name)
    kept = set(index.by_topic)
    assert sorted(m.topic for m in index.match(topic_filter)) == sorted(
        t for t in kept if matches(topic_filter, t)
    )


def test_removing_topics_prunes_the_trie():
    index = RetainedIndex()
    for name in ("a/b/c", "a/b", "a/x/y"):
        index.put(RetainedMessage(name, b"p", 0))
    for name in ("a/b/c", "a/x/y", "a/b", "a/b"):
        index.remove(name)
    assert index.root.children == {} and len(index) == 0


# -- sessions -------------------------------------------------------------------------
def test_a_session_comes_back_with_its_subscriptions_and_qos2_packet_ids(node):
    subscriptions = {
        "sensors/+/temp": SubscriptionOptions(2, no_local=True, retain_handling=1, identifier=7),
        "$share/group/jobs/#": SubscriptionOptions(1, retain_as_published=True),
        "t/" + "z" * 300: SubscriptionOptions(0),  # longer than a field table's key
    }
    connected = SessionRecord("/", "device-1", 3600, dict(subscriptions), {1, 65535}, {42})
    away = SessionRecord("/", "device-2", NEVER_EXPIRES, {}, set(), set(), START - 5)
    node.state.save_session(connected)
    node.state.save_session(away)
    again = restart(node, now=START + 50)
    try:
        state = again.state
        record = state.session("/", "device-1")
        assert record == SessionRecord(
            "/", "device-1", 3600, subscriptions, {1, 65535}, {42}, START + 50
        )  # connected when the broker stopped: the expiry counts from the start-up
        assert state.session("/", "device-2") == away
        assert state.session("other", "device-1") is None
        assert sorted(r.client_id for r in state.sessions("/")) == ["device-1", "device-2"]
    finally:
        again.close()


def test_only_the_changed_part_of_a_session_is_written(node):
    state, store = node.state, node.store
    record = SessionRecord("/", "c", 60, {"a/#": SubscriptionOptions(1)})
    before = store.definition_changes
    state.save_session(record)
    assert store.definition_changes - before == 2  # head and packet ids
    before = store.definition_changes
    state.save_session(record)  # nothing changed
    assert store.definition_changes == before
    record.awaiting_rel.add(9)  # a PUBREC: the packet ids only
    state.save_session(record)
    assert store.definition_changes - before == 1
    record.subscriptions["b"] = SubscriptionOptions(0)  # a SUBSCRIBE: the head only
    state.save_session(record)
    assert store.definition_changes - before == 2
    record.awaiting_rel.discard(9)
    record.awaiting_comp.add(3)
    record.disconnected_at = START
    state.save_session(record)
    assert store.definition_changes - before == 4
    again = restart(node)
    try:
        assert again.state.session("/", "c") == record
    finally:
        again.close()


def test_expired_sessions_are_the_disconnected_ones_past_their_interval(node):
    state = node.state
    state.save_session(SessionRecord("/", "soon", 10, disconnected_at=START))
    state.save_session(SessionRecord("/", "first", 5, disconnected_at=START))
    state.save_session(SessionRecord("/", "zero", 0, disconnected_at=START + 1))
    state.save_session(SessionRecord("/", "never", NEVER_EXPIRES, disconnected_at=START - 10**9))
    state.save_session(SessionRecord("/", "connected", 1))
    assert state.next_session_expiry() == START + 1
    assert [r.client_id for r in state.expired_sessions(START)] == []
    assert [r.client_id for r in state.expired_sessions(START + 9)] == ["zero", "first"]
    assert [r.client_id for r in state.expired_sessions(START + 10)] == ["zero", "first", "soon"]
    for record in state.expired_sessions(START + 10):
        state.delete_session(record.vhost, record.client_id)
    state.delete_session("/", "zero")  # again: nothing happens
    assert state.next_session_expiry() is None
    again = restart(node)
    try:
        assert sorted(r.client_id for r in again.state.sessions()) == ["connected", "never"]
    finally:
        again.close()


# -- vhosts ---------------------------------------------------------------------------
def test_deleting_a_vhost_deletes_its_retained_messages_and_sessions(node):
    node.core.add_vhost("iot")
    state = node.state
    state.retain("iot", RetainedMessage("a", b"1", 0, expires_at=START + 5))
    state.retain("/", RetainedMessage("a", b"kept", 0))
    state.save_session(SessionRecord("iot", "dev", 60, {"a": SubscriptionOptions(1)}, {1}))
    state.save_session(SessionRecord("/", "dev", 60))
    assert node.core.delete_vhost("iot")
    assert state.retained_count("iot") == 0 and state.session("iot", "dev") is None
    assert state.expire_retained(START + 10) == 0
    node.core.add_vhost("iot")  # made again: empty
    again = restart(node)
    try:
        assert again.state.retained_count("iot") == 0 and again.state.session("iot", "dev") is None
        assert again.state.retained_count("/") == 1 and again.state.session("/", "dev") is not None
    finally:
        again.close()


def test_a_vhost_deleted_before_any_mqtt_client_came_takes_its_stored_state_along(tmp_path):
    first = Node(SQLiteStore(tmp_path))
    first.core.add_vhost("iot")
    first.state.retain("iot", RetainedMessage("a", b"1", 0))
    first.state.save_session(SessionRecord("iot", "dev", 60))
    assert first.durable()
    first.close()
    # a core whose MqttState is not made yet: core holds the rows, and deletes them
    store = SQLiteStore(tmp_path)
    loop = asyncio.new_event_loop()
    core = BrokerCore(ManualClock(START))
    core.attach_store(store)
    store.start(loop)
    try:
        assert sorted(core.adapter_definitions) == ["mqtt_packet_ids", "mqtt_retained", "mqtt_session"]
        assert core.delete_vhost("iot")
        core.add_vhost("iot")
        assert all(rows == [] for rows in core.adapter_definitions.values())
        future = loop.create_future()
        store.when_durable(future.set_result)
        assert loop.run_until_complete(future)
    finally:
        store.close()
        loop.close()
    third = Node(SQLiteStore(tmp_path))
    try:
        assert third.state.retained_count("iot") == 0 and third.state.sessions() == []
    finally:
        third.close()


# -- crashes and the server -----------------------------------------------------------
_WRITER = textwrap.dedent(
    """
    import asyncio, sys, time
    from leveret.core.broker import BrokerCore
    from leveret.core.clock import ManualClock
    from leveret.protocol.mqtt.state import MqttState, RetainedMessage, SessionRecord, SubscriptionOptions
    from leveret.store.sqlite import SQLiteStore

    loop = asyncio.new_event_loop()
    store = SQLiteStore(sys.argv[1])
    core = BrokerCore(ManualClock(1_700_000_000.0))
    core.attach_store(store)
    store.start(loop)
    state = MqttState.of(core)
    state.retain("/", RetainedMessage("crash/topic", b"kept", 1))
    state.save_session(SessionRecord("/", "dev", 600, {"crash/#": SubscriptionOptions(2)}, {5}))
    future = loop.create_future()
    state.when_durable(future.set_result)  # what the adapter waits for before PUBACK
    assert loop.run_until_complete(future)
    print("durable", flush=True)
    time.sleep(60)  # killed before any close
    """
)


def test_what_was_durable_survives_kill_9(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    writer = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(tmp_path)], stdout=subprocess.PIPE, env=env, text=True
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "durable"
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait(TIMEOUT)
    after = Node(SQLiteStore(tmp_path), now=START + 7)
    try:
        [message] = after.state.retained_matching("/", "crash/+", START + 7)
        assert (message.payload, message.qos) == (b"kept", 1)
        assert after.state.session("/", "dev") == SessionRecord(
            "/", "dev", 600, {"crash/#": SubscriptionOptions(2)}, {5}, set(), START + 7
        )
    finally:
        after.close()


def test_a_restarted_server_broker_has_the_mqtt_state_of_its_data_dir(tmp_path):
    def write(core: BrokerCore) -> None:
        state = MqttState.of(core)
        state.retain("/", RetainedMessage("srv/t", b"v", 0))
        state.save_session(SessionRecord("/", "srv-client", 30, {"srv/#": SubscriptionOptions(1)}))

    with BlockingBroker(data_dir=str(tmp_path), amqp_port=0) as broker:
        broker.call(write, broker.core)
    with BlockingBroker(data_dir=str(tmp_path), amqp_port=0) as broker:

        def read(core: BrokerCore) -> tuple:
            state = MqttState.of(core)
            session = state.session("/", "srv-client")
            return (
                [m.payload for m in state.retained_matching("/", "srv/+", core.clock.time())],
                session and session.subscriptions,
            )

        assert broker.call(read, broker.core) == ([b"v"], {"srv/#": SubscriptionOptions(1)})
