"""What only the PostgreSQL store does, on the session's real server: the master lock,
fencing when the session is lost, the schema version table, the URL kept out of logs."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from eventually import eventually
from hypothesis import given, strategies as st
from test_stores import TIMEOUT, Opened, PostgresPlace, add, answer_of

from leveret.store import StoreError
from leveret.store.base import ALL_SEQS
from leveret.store.postgresql import MIGRATIONS, PostgreSQLStore, escape_text, redact, unescape_text


@pytest.fixture
def place(postgres) -> PostgresPlace:
    return PostgresPlace(postgres.url)


def test_redact_hides_the_password_only():
    assert redact("postgresql://app:s3cret@db.example:5432/mq") == "postgresql://app:***@db.example:5432/mq"
    assert redact("postgresql://app@db/mq") == "postgresql://app@db/mq"


def test_a_second_store_of_the_cluster_is_a_standby_until_the_master_closes(place):
    master = Opened(place)
    standby = place.new_store()
    try:
        assert isinstance(standby, PostgreSQLStore)
        assert standby.try_master() is False
        with pytest.raises(StoreError, match="not the master"):
            standby.load()
        took = threading.Event()
        cancel = threading.Event()
        waiter = threading.Thread(target=lambda: standby.wait_for_master(cancel) and took.set())
        waiter.start()
        assert not took.wait(0.3)  # still the other's
        master.close()  # its session ends: the lock is free
        assert took.wait(TIMEOUT)
        waiter.join(TIMEOUT)
        assert standby.load().definitions == {}
    finally:
        standby.close()


def test_other_clusters_have_their_own_lock_and_tables(postgres):
    first, second = Opened(PostgresPlace(postgres.url)), Opened(PostgresPlace(postgres.url))
    try:
        first.store.save_definition("queue", "/", "only-in-first", {})
        assert first.durable()
        assert second.snapshot.definitions == {}
    finally:
        first.close()
        second.close()


def test_wait_for_master_gives_up_when_cancelled(place):
    master = Opened(place)
    standby = place.new_store()
    assert isinstance(standby, PostgreSQLStore)
    try:
        cancel = threading.Event()
        threading.Timer(0.2, cancel.set).start()
        started = time.monotonic()
        assert standby.wait_for_master(cancel) is False
        assert time.monotonic() - started < 2
    finally:
        standby.close()
        master.close()


def test_a_master_whose_session_is_ended_is_fenced_and_writes_nothing_more(place, postgres):
    opened = Opened(place)
    fenced: list[str] = []
    opened.store.on_fenced = fenced.append
    try:
        add(opened.store, 1, 1)
        assert opened.durable()
        [(pid,)] = postgres.sql(
            "SELECT pid FROM pg_locks WHERE locktype='advisory' AND granted AND objid=hashtext(%s)::oid",
            place.cluster,
        )
        postgres.sql("SELECT pg_terminate_backend(%s)", pid)  # as if cut off
        # the idle ping finds out, on the store's loop
        eventually(lambda: fenced, TIMEOUT, 0.05, lambda s: opened.loop.run_until_complete(asyncio.sleep(s)))
        assert fenced and opened.store.fenced
        add(opened.store, 1, 2)  # never written: no session, no lock
        opened.loop.run_until_complete(asyncio.sleep(0.3))
        standby = Opened(place)  # the lock went with the session: another may take over
        try:
            assert standby.snapshot.queues == {1: (1, 1, len(b"body 1"))}
        finally:
            standby.close()
    finally:
        opened.close()


def test_the_schema_is_created_at_the_latest_version_and_newer_ones_are_refused(place):
    Opened(place).close()
    with place.raw() as db:
        assert db.execute("SELECT max(version) FROM schema_version").fetchone() == (len(MIGRATIONS),)
        db.execute("INSERT INTO schema_version VALUES (?)", (len(MIGRATIONS) + 1,))
    store = place.new_store()
    try:
        with pytest.raises(StoreError, match="newer than this leveret"):
            store.load()
    finally:
        store.close()


def test_an_unreachable_database_is_a_store_error_without_the_password():
    store = PostgreSQLStore("postgresql://app:s3cret@127.0.0.1:1/none")
    with pytest.raises(StoreError) as raised:
        store.load()
    assert "cannot open store postgresql://app:***@127.0.0.1:1/none" in str(raised.value)
    assert "s3cret" not in str(raised.value)


def test_reads_go_on_after_the_readers_session_is_ended(place, postgres):
    opened = Opened(place)
    try:
        add(opened.store, 1, 1)
        assert opened.durable()
        postgres.sql(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name='leveret-reader'"
        )
        assert [m.seq for m in opened.store.read_queue(1, 0, 10)] == [1]  # a new session
        # the reader thread's session too: its next read reconnects
        rows = answer_of(opened, lambda answer: opened.store.request_queue(1, 0, 10, ALL_SEQS, answer))
        assert [m.seq for m in rows] == [1]
        assert opened.store.fenced is None  # the writer's session (the lock) is untouched
    finally:
        opened.close()


@given(st.text())
def test_escaped_text_never_holds_nul_and_comes_back_the_same(text):
    escaped = escape_text(text)
    assert "\x00" not in escaped and unescape_text(escaped) == text


def test_the_writers_session_has_short_keepalives_on_the_servers_side_too(place, postgres):
    opened = Opened(place)
    try:
        [(default,)] = postgres.sql("SHOW tcp_keepalives_idle")  # another session: the server's
        assert default != "2"
        assert opened.store._db is not None
        names = ("tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_keepalives_count", "tcp_user_timeout")
        values = [opened.store._db.execute(f"SHOW {name}").fetchone()[0] for name in names]
        assert values == ["2", "1", "3", "5000"]  # PostgreSQL ends a dead master's session in ~5 s
    finally:
        opened.close()
