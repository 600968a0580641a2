"""Both stores on real databases (SQLite in ``tmp_path``; PostgreSQL on the session's
server, a schema per test): what is written, when it is durable (group commit), and
what ``load()`` recovers after a reopen. Tests that take ``tmp_path`` are the SQLite
store's own (its file, its disk reserve, its integrity check).

Writes need the writer thread (``start(loop)``) and run on an event loop; every test
drives a private loop and waits for durability with ``when_durable``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from eventually import eventually, eventually_equal

from leveret.store import DataDirLock, DataDirLocked, Snapshot, StoreError
from leveret.store.base import ALL_SEQS, ScheduledRow
from leveret.store.batched import BatchedStore, LoopRead, NoRoom
from leveret.store.ops import DeleteRange
from leveret.store.postgresql import PgConnection, PostgreSQLStore
from leveret.store.sqlite import SQLiteStore

TIMEOUT = 10.0


class SQLitePlace:
    """Where a SQLite store lives: a directory."""

    kind = "sqlite"

    def __init__(self, path: Path) -> None:
        self.path = path
        self.name = "leveret.db"  # what error messages name

    def new_store(self) -> BatchedStore:
        return SQLiteStore(self.path)

    @contextlib.contextmanager
    def raw(self) -> Iterator[Any]:
        """The database behind the store's back (``?`` placeholders)."""
        db = sqlite3.connect(self.path / "leveret.db", isolation_level=None)
        try:
            yield db
        finally:
            db.close()


_clusters = itertools.count()


class PostgresPlace:
    """Where a PostgreSQL store lives: the session's server, a schema of its own."""

    kind = "postgresql"

    def __init__(self, url: str) -> None:
        self.url = url
        self.cluster = f"test_store_{next(_clusters)}_{time.time_ns()}"
        self.name = url.rsplit("@", 1)[-1]

    def new_store(self) -> BatchedStore:
        """The store, once it holds the master lock: the previous store's session lets
        the lock go when PostgreSQL has ended it, a moment after its close."""
        store = PostgreSQLStore(self.url, self.cluster)
        cancel = threading.Event()
        timer = threading.Timer(TIMEOUT, cancel.set)
        timer.start()
        try:
            store.wait_for_master(cancel)
        finally:
            timer.cancel()
        return store

    @contextlib.contextmanager
    def raw(self) -> Iterator[Any]:
        import psycopg

        conn = psycopg.connect(self.url, autocommit=True)
        conn.execute(f'SET search_path TO "{self.cluster}"')
        try:
            yield PgConnection(conn)
        finally:
            conn.close()


Place = SQLitePlace | PostgresPlace


@pytest.fixture(params=["sqlite", "postgresql"])
def place(request, tmp_path: Path) -> Place:
    if request.param == "sqlite":
        return SQLitePlace(tmp_path)
    return PostgresPlace(request.getfixturevalue("postgres").url)


class Opened:
    """A started store and the loop its callbacks run on."""

    def __init__(self, place: Place) -> None:
        self.place = place
        self.loop = asyncio.new_event_loop()
        self.store = place.new_store()
        self.snapshot = self.store.load()
        self.store.start(self.loop)

    def durable(self) -> bool:
        """Wait until everything queued so far is on disk; the callback's ``ok``."""
        future = self.loop.create_future()
        self.store.when_durable(future.set_result)
        return self.loop.run_until_complete(asyncio.wait_for(future, TIMEOUT))

    def turn(self) -> None:
        """Run one event-loop turn (the store submits a batch per turn)."""
        self.loop.run_until_complete(asyncio.sleep(0))

    def close(self) -> None:
        self.store.close()
        self.loop.close()


@pytest.fixture
def opened(place: Place) -> Iterator[Opened]:
    handle = Opened(place)
    yield handle
    if handle.store._db is not None:
        handle.close()


def reopen(handle: Opened) -> Snapshot:
    """Close the store and read a fresh snapshot from disk, as at the next start."""
    handle.close()
    store = handle.place.new_store()
    try:
        return store.load()
    finally:
        store.close()


def raw(path: Path) -> sqlite3.Connection:
    """A SQLite store's file behind its back."""
    return sqlite3.connect(path / "leveret.db", isolation_level=None)


def add(store: BatchedStore, queue_id: int, seq: int, body: bytes = b"", **kwargs) -> int:
    return store.add_message(
        queue_id,
        seq,
        "ex",
        f"rk.{seq}",
        b"HDR" + bytes([seq % 256]),
        body or f"body {seq}".encode(),
        **kwargs,
    )


# -- opening --------------------------------------------------------------------------
def test_new_directory_loads_an_empty_snapshot_and_creates_the_database(tmp_path):
    store = SQLiteStore(tmp_path / "data")
    snapshot = store.load()
    store.close()
    assert (snapshot.definitions, snapshot.queues, snapshot.dedup) == ({}, {}, {})
    assert (tmp_path / "data" / "leveret.db").is_file()


def test_unopenable_path_raises_store_error_naming_the_file(tmp_path):
    (tmp_path / "leveret.db").mkdir()  # a directory where the database file should be
    with pytest.raises(StoreError, match=r"leveret\.db"):
        SQLiteStore(tmp_path).load()


def test_garbage_database_file_raises_store_error_naming_the_file(tmp_path):
    (tmp_path / "leveret.db").write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match=r"cannot open store .*leveret\.db"):
        SQLiteStore(tmp_path).load()


def test_close_marks_a_clean_shutdown_and_reopen_clears_the_mark(tmp_path):
    Opened(SQLitePlace(tmp_path)).close()
    with raw(tmp_path) as db:
        assert db.execute("SELECT value FROM meta WHERE key='clean_shutdown'").fetchone() == (1,)
    store = SQLiteStore(tmp_path)
    store.load()
    with raw(tmp_path) as db:  # running: a crash from now on must be detected
        assert db.execute("SELECT value FROM meta WHERE key='clean_shutdown'").fetchone() == (0,)
    store.close()


def test_reopen_after_close_keeps_writing(opened):
    add(opened.store, 1, 1)
    assert opened.durable()
    opened.close()
    again = Opened(opened.place)
    try:
        assert again.snapshot.queues == {1: (1, 1, len(b"body 1"))}
        store_id = add(again.store, 1, 2)
        assert store_id == 2  # ids continue after the highest one on disk
        assert again.durable()
    finally:
        again.close()
    assert reopen(again).queues == {1: (2, 2, 2 * len(b"body 1"))}


# -- the data-directory lock ------------------------------------------------------------
def test_lock_refuses_a_second_opener_naming_the_directory(tmp_path):
    first = DataDirLock(tmp_path / "data")
    first.acquire()
    try:
        with pytest.raises(DataDirLocked, match=str(tmp_path / "data")):
            DataDirLock(tmp_path / "data").acquire()
        assert (tmp_path / "data" / "leveret.lock").read_text().strip().isdigit()  # the pid
    finally:
        first.release()


def test_lock_can_be_taken_again_after_release(tmp_path):
    first = DataDirLock(tmp_path)
    first.acquire()
    first.release()
    second = DataDirLock(tmp_path)
    second.acquire()  # the first one's release freed it
    with pytest.raises(DataDirLocked):
        DataDirLock(tmp_path).acquire()  # and now the second one holds it
    second.release()
    second.release()  # releasing twice is harmless
    third = DataDirLock(tmp_path)
    third.acquire()
    third.release()


# -- definitions ------------------------------------------------------------------------
def test_definitions_saved_replaced_and_deleted_are_what_load_returns(opened):
    store = opened.store
    store.save_definition("vhost", "/", "/", {})
    store.save_definition("queue", "/", "a", {"durable": True, "arguments": {"x-message-ttl": 100}})
    store.save_definition("queue", "/", "b", {"durable": True})
    store.save_definition("queue", "other", "a", {"durable": False})
    store.save_definition("exchange", "/", "ex", {"type": "topic", "internal": False})
    store.delete_definition("queue", "/", "b")
    store.delete_definition("queue", "/", "never-saved")  # deleting nothing is fine
    assert opened.durable()
    snapshot = reopen(opened)
    assert snapshot.definitions == {
        "vhost": [("/", "/", {})],
        "queue": [
            ("/", "a", {"durable": True, "arguments": {"x-message-ttl": 100}}),
            ("other", "a", {"durable": False}),
        ],
        "exchange": [("/", "ex", {"type": "topic", "internal": False})],
    }


def test_replacing_a_definition_keeps_the_order_it_was_first_saved_in(opened):
    store = opened.store
    for name in ("first", "second", "third"):
        store.save_definition("queue", "/", name, {"version": 1})
    assert opened.durable()
    store.save_definition("queue", "/", "first", {"version": 2})  # a later batch
    assert opened.durable()
    snapshot = reopen(opened)
    assert snapshot.definitions["queue"] == [
        ("/", "first", {"version": 2}),
        ("/", "second", {"version": 1}),
        ("/", "third", {"version": 1}),
    ]


def test_definition_field_types_survive_the_round_trip(opened):
    data = {
        "arguments": {
            "x-binary": bytearray(b"\x00\xff"),
            "x-long": 2**40,
            "x-neg": -3,
            "x-list": [1, "a", None],
            "x-table": {"t": True},
        },
        "flag": False,
    }
    opened.store.save_definition("queue", "/", "q", data)
    assert opened.durable()
    assert reopen(opened).definitions == {"queue": [("/", "q", data)]}


def test_definition_saved_and_deleted_in_one_batch_is_gone(opened):
    opened.store.save_definition("queue", "/", "q", {"durable": True})
    opened.store.delete_definition("queue", "/", "q")
    assert opened.durable()
    assert reopen(opened).definitions == {}


def test_new_queue_ids_are_never_reused_after_reopen(opened):
    ids = [opened.store.new_queue_id() for _ in range(3)]
    assert ids == [1, 2, 3]
    assert opened.durable()
    opened.close()
    again = Opened(opened.place)
    try:
        assert again.store.new_queue_id() == 4
    finally:
        again.close()


# -- messages ---------------------------------------------------------------------------
def test_added_messages_are_recovered_with_every_field(opened):
    store = opened.store
    first = store.add_message(7, 1, "amq.direct", "key", b"\x00\x3c header", b"hello", expires_at=1234.5)
    second = store.add_message(7, 2, "", "q", b"h2", b"")
    other = store.add_message(9, 5, "x", "y", b"h3", b"abc")
    assert 0 < first < second < other
    assert opened.durable()
    snapshot = reopen(opened)
    assert snapshot.queues == {7: (2, 2, 5), 9: (1, 5, 3)}
    store = opened.place.new_store()
    store.load()
    try:
        messages = store.read_queue(7, 0, 10)
    finally:
        store.close()
    assert [
        (
            m.store_id,
            m.queue_id,
            m.seq,
            m.delivery_count,
            m.exchange,
            m.routing_key,
            m.header,
            m.body,
            m.expires_at,
        )
        for m in messages
    ] == [
        (first, 7, 1, 0, "amq.direct", "key", b"\x00\x3c header", b"hello", 1234.5),
        (second, 7, 2, 0, "", "q", b"h2", b"", 0.0),
    ]


def test_removed_message_is_not_recovered(opened):
    kept, gone = add(opened.store, 1, 1), add(opened.store, 1, 2)
    assert opened.durable()
    opened.store.remove_message(gone)
    assert opened.durable()
    snapshot = reopen(opened)
    assert snapshot.queues == {1: (1, 1, len(b"body 1"))}
    with opened.place.raw() as db:
        assert db.execute("SELECT id FROM messages").fetchall() == [(kept,)]


def test_message_removed_before_its_batch_is_written_never_reaches_the_disk(opened):
    store_id = add(opened.store, 1, 1)
    opened.store.set_delivery_count(store_id, 3)
    opened.store.remove_message(store_id)  # same loop turn: acked before the write
    assert opened.durable()
    with opened.place.raw() as db:
        assert db.execute("SELECT count(*) FROM messages").fetchone() == (0,)
    assert reopen(opened).queues == {}


def test_delivery_count_is_recovered_whether_set_before_or_after_the_write(opened):
    store = opened.store
    written = add(store, 1, 1)
    assert opened.durable()
    store.set_delivery_count(written, 2)
    pending = add(store, 1, 2)
    store.set_delivery_count(pending, 5)  # still in the batch being built
    assert opened.durable()
    store.set_delivery_count(written, 3)  # the last count wins
    assert opened.durable()
    opened.close()
    store = opened.place.new_store()
    store.load()
    try:
        assert [(m.seq, m.delivery_count) for m in store.read_queue(1, 0, 10)] == [(1, 3), (2, 5)]
    finally:
        store.close()


def test_delivery_count_of_a_removed_message_is_dropped(opened):
    store_id = add(opened.store, 1, 1)
    assert opened.durable()
    opened.store.set_delivery_count(store_id, 4)
    opened.store.remove_message(store_id)
    assert opened.durable()
    assert reopen(opened).queues == {}


def test_transient_messages_are_readable_while_running_and_deleted_at_the_next_start(opened):
    add(opened.store, 1, 1)
    add(opened.store, 1, 2, transient=True)
    assert opened.durable()
    assert [m.seq for m in opened.store.read_queue(1, 0, 10)] == [1, 2]
    snapshot = reopen(opened)
    assert snapshot.queues == {1: (1, 1, len(b"body 1"))}


def test_store_ids_after_reopen_follow_the_highest_id_on_disk(opened):
    ids = [add(opened.store, 1, seq) for seq in range(1, 4)]
    opened.store.remove_message(ids[0])
    assert opened.durable()
    opened.close()
    again = Opened(opened.place)
    try:
        assert add(again.store, 1, 4) == ids[-1] + 1
    finally:
        again.close()


# -- when_durable: group commit ---------------------------------------------------------
def test_when_durable_fires_after_the_rows_are_committed(opened):
    seen = []

    def callback(ok: bool) -> None:  # runs on the loop, after the writer committed
        with opened.place.raw() as db:
            seen.append((ok, db.execute("SELECT count(*) FROM messages").fetchone()[0]))

    add(opened.store, 1, 1)
    add(opened.store, 1, 2)
    opened.store.when_durable(callback)
    assert not seen  # never synchronously
    assert opened.durable()
    assert seen == [(True, 2)]


def test_when_durable_callbacks_fire_once_each_in_call_order_across_batches(opened):
    order: list[tuple[str, bool]] = []
    add(opened.store, 1, 1)
    opened.store.when_durable(lambda ok: order.append(("a", ok)))
    opened.store.when_durable(lambda ok: order.append(("b", ok)))
    opened.turn()  # batch 1 goes to the writer; the next one accumulates meanwhile
    add(opened.store, 1, 2)
    opened.store.when_durable(lambda ok: order.append(("c", ok)))
    assert opened.durable()
    assert order == [("a", True), ("b", True), ("c", True)]


def test_when_durable_with_nothing_queued_still_answers(opened):
    assert opened.durable() is True


def test_pending_is_true_until_the_batch_is_written(opened):
    assert not opened.store.pending
    add(opened.store, 1, 1)
    assert opened.store.pending
    opened.turn()  # handed to the writer: in flight until the loop hears back
    assert opened.durable()
    assert not opened.store.pending


def test_failed_write_answers_false_names_the_file_and_later_writes_succeed(opened):
    # Another writer behind the store's back takes the id the store hands out next:
    # the batch's INSERT fails with a UNIQUE constraint and is rolled back.
    with opened.place.raw() as db:
        db.execute(
            "INSERT INTO messages (id, queue_id, seq, delivery_count, exchange, routing_key, header, body, "
            "transient, expires_at, published_at, size) VALUES (1, 99, 1, 0, '', '', ?, ?, 0, 0, 0, 0)",
            (b"", b""),
        )
    results = []
    add(opened.store, 1, 1)
    opened.store.save_definition("queue", "/", "lost", {})  # same batch: rolled back too
    opened.store.when_durable(results.append)
    assert opened.durable() is False
    assert results == [False]
    assert opened.store.failed is not None
    assert opened.place.name in opened.store.failed and "unique" in opened.store.failed.lower()
    opened.store.save_definition("queue", "/", "kept", {})
    assert opened.durable() is True  # the store carries on
    opened.close()
    if opened.place.kind == "sqlite":
        with opened.place.raw() as db:  # not a clean shutdown: the next start checks the pages
            assert db.execute("SELECT value FROM meta WHERE key='clean_shutdown'").fetchone() == (0,)
    snapshot = reopen(opened)
    assert snapshot.definitions == {"queue": [("/", "kept", {})]}
    assert snapshot.queues == {99: (1, 1, 0)}  # only the intruder's row


def test_close_writes_what_is_still_queued(opened):
    add(opened.store, 1, 1)
    opened.store.save_definition("queue", "/", "q", {"durable": True})
    snapshot = reopen(opened)  # no durable() wait: close() itself must write it
    assert snapshot.queues == {1: (1, 1, len(b"body 1"))}
    assert snapshot.definitions == {"queue": [("/", "q", {"durable": True})]}


# -- read_queue: paging -----------------------------------------------------------------
def test_read_queue_pages_in_seq_order_from_disk_and_unwritten_batches(opened):
    store = opened.store
    for seq in (5, 1, 3):  # written out of seq order
        add(store, 1, seq)
    add(store, 2, 2)  # another queue
    assert opened.durable()
    for seq in (4, 2, 6):  # not written yet
        add(store, 1, seq)
    pages, after = [], 0
    while page := store.read_queue(1, after, 2):
        pages.append([m.seq for m in page])
        after = page[-1].seq
    assert pages == [[1, 2], [3, 4], [5, 6]]
    assert [m.body for m in store.read_queue(1, 3, 1)] == [b"body 4"]
    assert [m.seq for m in store.read_queue(2, 0, 10)] == [2]
    assert store.read_queue(3, 0, 10) == []


def test_read_queue_stops_at_upto_seq_on_disk_and_in_unwritten_batches(opened):
    store = opened.store
    block = 1 << 54  # a priority queue's next level
    for seq in (1, 2, block + 1):
        add(store, 1, seq)
    assert opened.durable()
    for seq in (3, block + 2):
        add(store, 1, seq)
    assert [m.seq for m in store.read_queue(1, 0, 10, block - 1)] == [1, 2, 3]
    assert [m.seq for m in store.read_queue(1, block, 10, 2 * block - 1)] == [block + 1, block + 2]


def test_count_blocks_groups_a_queues_committed_messages_by_seq_block(place):
    handle = Opened(place)
    block = 1 << 54
    for seq in (1, 2, block + 7, 3 * block + 9):
        add(handle.store, 1, seq, b"x" * 10)
    add(handle.store, 2, 5)
    assert handle.durable()
    handle.close()
    store = place.new_store()
    try:
        store.load()
        assert store.count_blocks(1) == {0: (2, 2, 20), 1: (1, block + 7, 10), 3: (1, 3 * block + 9, 10)}
        assert store.count_blocks(9) == {}
    finally:
        store.close()


def test_each_seq_block_takes_its_store_ids_from_its_own_range_across_restarts(place):
    handle = Opened(place)
    block = 1 << 54
    ids = [add(handle.store, 1, seq) for seq in (1, block + 1, 2, 3 * block + 1, block + 2)]
    assert ids == [1, block + 1, 2, 3 * block + 1, block + 2]  # a block's rows lie together
    assert handle.durable()
    handle.close()
    again = Opened(place)
    try:
        assert [add(again.store, 1, seq) for seq in (4, block + 3, 3 * block + 2, 2 * block + 1)] == [
            3,
            block + 3,
            3 * block + 2,
            2 * block + 1,
        ]
        assert again.durable()
        assert [m.seq for m in again.store.read_queue(1, block, 10, 2 * block - 1)] == [
            block + 1,
            block + 2,
            block + 3,
        ]
    finally:
        again.close()


def test_read_queue_sees_a_batch_while_the_writer_has_it(opened):
    add(opened.store, 1, 1)
    opened.turn()  # handed to the writer, maybe not committed yet
    assert [m.seq for m in opened.store.read_queue(1, 0, 10)] == [1]
    add(opened.store, 1, 2)
    assert [m.seq for m in opened.store.read_queue(1, 0, 10)] == [1, 2]
    assert opened.durable()
    assert [m.seq for m in opened.store.read_queue(1, 0, 10)] == [1, 2]


def test_find_offset_gives_the_first_seq_published_at_or_after_a_time(opened):
    for seq, when in ((1, 100.0), (2, 200.0), (3, 300.0)):
        add(opened.store, 1, seq, published_at=when)
    assert opened.durable()
    assert opened.store.find_offset(1, 150.0) == 2
    assert opened.store.find_offset(1, 0.0) == 1
    assert opened.store.find_offset(1, 301.0) is None


# -- range deletions (queue.delete, purge of a paged-out tail, stream retention) ---------
def wait_for_seqs(handle: Opened, queue_id: int, expected: list[int]) -> list[int]:
    """The background deletion runs when the writer is idle: poll until it is done."""
    return eventually_equal(
        lambda: [m.seq for m in handle.store.read_queue(queue_id, 0, 10_000)], expected, TIMEOUT, 0.01
    )


def test_remove_queue_forgets_written_and_unwritten_messages_and_dedup_keys(opened):
    store = opened.store
    for seq in range(1, 6):
        add(store, 1, seq)
    add(store, 2, 1)
    store.save_dedup(1, "k1", 0.0)
    store.save_dedup(2, "k2", 0.0)
    assert opened.durable()
    add(store, 1, 6)  # not written yet
    store.remove_queue(1)
    assert opened.durable()
    assert wait_for_seqs(opened, 1, []) == []
    assert [m.seq for m in store.read_queue(2, 0, 10)] == [1]
    snapshot = reopen(opened)
    assert snapshot.queues == {2: (1, 1, len(b"body 1"))}
    assert snapshot.dedup == {2: [("k2", 0.0)]}


def test_remove_paged_forgets_only_the_range_after_and_up_to(opened):
    store = opened.store
    for seq in range(1, 9):
        add(store, 1, seq)
    assert opened.durable()
    add(store, 1, 9)
    store.remove_paged(1, 3, 6)  # 4, 5, 6 go
    assert opened.durable()
    assert wait_for_seqs(opened, 1, [1, 2, 3, 7, 8, 9]) == [1, 2, 3, 7, 8, 9]
    assert reopen(opened).queues == {1: (6, 9, 6 * len(b"body 1"))}


def test_remove_range_forgets_a_streams_head(opened):
    for seq in range(1, 6):
        add(opened.store, 1, seq)
    assert opened.durable()
    opened.store.remove_range(1, 3)  # seq <= 3
    assert opened.durable()
    assert wait_for_seqs(opened, 1, [4, 5]) == [4, 5]


def test_background_deletion_removes_large_ranges_in_chunks(place):
    handle = Opened(place)
    for seq in range(1, 13):
        add(handle.store, 1, seq)
    assert handle.durable()
    handle.close()
    with place.raw() as db:
        db.execute("INSERT INTO pending_deletes (queue_id, low, high) VALUES (1, 2, 11)")  # 3..11: 9 rows
        steps = []
        while type(handle.store)._delete_chunk(db, limit=4):
            steps.append(db.execute("SELECT count(*) FROM messages").fetchone()[0])
        assert steps == [8, 4, 3]  # 4 rows, 4 rows, the last 1 (then the range is done)
        assert db.execute("SELECT count(*) FROM pending_deletes").fetchone() == (0,)
        assert db.execute("SELECT seq FROM messages ORDER BY seq").fetchall() == [(1,), (2,), (12,)]


def test_range_deletion_cut_short_by_a_crash_is_finished_at_the_next_load(place):
    handle = Opened(place)
    for seq in range(1, 11):
        add(handle.store, 1, seq)
    assert handle.durable()
    handle.close()
    with place.raw() as db:  # recorded durably, but no chunk ran before the "crash"
        db.execute("INSERT INTO pending_deletes (queue_id, low, high) VALUES (1, 0, 8)")
    store = place.new_store()
    try:
        snapshot = store.load()
        assert snapshot.queues == {1: (2, 10, len(b"body 9") + len(b"body 10"))}
        assert [m.seq for m in store.read_queue(1, 0, 100)] == [9, 10]
    finally:
        store.close()
    with place.raw() as db:
        assert db.execute("SELECT count(*) FROM pending_deletes").fetchone() == (0,)


# -- deduplication keys -----------------------------------------------------------------
def test_dedup_keys_saved_replaced_and_deleted_are_recovered_oldest_first(opened):
    store = opened.store
    store.save_dedup(1, "a", 0.0)
    store.save_dedup(1, "b", 50.5)
    store.save_dedup(1, "c", 0.0)
    store.save_dedup(2, "a", 7.0)
    store.delete_dedup(1, "b")
    store.delete_dedup(1, "missing")
    assert opened.durable()
    store.save_dedup(1, "a", 99.0)  # saved again: new expiry
    assert opened.durable()
    snapshot = reopen(opened)
    assert snapshot.dedup[2] == [("a", 7.0)]
    assert snapshot.dedup[1] == [("c", 0.0), ("a", 99.0)]  # saved again: the newest


def test_pages_are_checked_in_the_background_after_an_unclean_shutdown_only(tmp_path):
    """Start-up does not read every page (it would grow with the backlog); after a
    crash a background quick_check gives its verdict once the store runs."""
    first = Opened(SQLitePlace(tmp_path))
    first.store.save_definition("vhost", "/", "", {})
    assert first.durable()
    first.store._thread = None  # a crash: no clean-shutdown mark is written
    first.store.close()
    first.loop.close()
    again = Opened(SQLitePlace(tmp_path))
    try:
        eventually(lambda: again.store.integrity is not None, TIMEOUT, 0.01)
        assert again.store.integrity == "ok"
    finally:
        again.close()
    clean = Opened(SQLitePlace(tmp_path))  # closed cleanly just now: nothing to check
    try:
        time.sleep(0.1)
        assert clean.store.integrity is None
    finally:
        clean.close()


def test_a_stalled_batch_drops_the_inserts_a_later_range_deletion_covers(tmp_path):
    """While a batch waits for room, a purge lands in the next one: merging them must
    drop the stalled inserts the purge covers, or they would be written after the
    range deletion ran and come back (found by review)."""
    store = SQLiteStore(tmp_path, reserve=10**18)  # never room for messages
    store.load()
    db = store._db
    stalled = store._batch
    store.add_message(7, 1, "", "q", b"h", b"body")
    store._batch = newer = type(stalled)()
    store.remove_paged(7, 0, 10)
    stalled.absorb(newer)
    assert not stalled.inserts and DeleteRange(7, 0, 10) in stalled.ops
    store.reserve = 0
    store._write_with_room(db, stalled)
    while store._delete_chunk(db):
        pass
    assert db.execute("SELECT COUNT(*) FROM messages").fetchone() == (0,)
    store.close()


def test_a_redelivery_back_off_is_kept(opened):
    first = add(opened.store, 1, 1)
    add(opened.store, 1, 2)
    opened.store.set_available_at(first, 1_900_000_000.5)  # in the same batch as the insert
    assert opened.durable() is True
    assert [r.available_at for r in opened.store.read_queue(1, 0, 10)] == [1_900_000_000.5, 0.0]
    opened.close()
    reopened = Opened(opened.place)
    try:
        assert [r.available_at for r in reopened.store.read_queue(1, 0, 10)] == [1_900_000_000.5, 0.0]
    finally:
        reopened.close()


def test_an_older_sqlite_store_gets_the_back_off_column(tmp_path):
    opened = Opened(SQLitePlace(tmp_path))
    add(opened.store, 1, 1)
    add(opened.store, 1, 2)
    assert opened.durable() is True
    opened.close()
    with raw(tmp_path) as db:  # a store written before the column existed
        db.execute("ALTER TABLE messages DROP COLUMN available_at")
    reopened = Opened(opened.place)
    try:
        rows = reopened.store.read_queue(1, 0, 10)
        assert [(r.seq, r.available_at) for r in rows] == [(1, 0.0), (2, 0.0)]  # the old rows
        reopened.store.set_available_at(rows[1].store_id, 1_900_000_001.0)
        assert reopened.durable() is True
        assert [r.available_at for r in reopened.store.read_queue(1, 0, 10)] == [0.0, 1_900_000_001.0]
    finally:
        reopened.close()


# -- scheduled rows -----------------------------------------------------------------------
def scheduled_row(store_id: int, due_at: float) -> ScheduledRow:
    return ScheduledRow(store_id, "/", f"job-{store_id}", due_at, "ex", "rk", b"HDR", b"body", None, "{}")


def test_a_short_read_of_scheduled_rows_means_the_end_even_with_pending_deletes_and_moves(opened):
    # The scheduler takes a batch shorter than it asked for as "nothing more in the
    # store": committed rows that a change not written yet deletes or moves must not
    # make a batch short while later rows remain (they would be left behind).
    store = opened.store
    for store_id in range(1, 11):
        store.save_scheduled(scheduled_row(store_id, 100.0 + store_id))
    assert opened.durable()
    for store_id in (1, 2, 3):
        store.remove_scheduled(store_id)  # delivered: the deletes wait for the next write
    store.save_scheduled(scheduled_row(4, 500.0))  # rescheduled after every other row
    first = store.read_scheduled((float("-inf"), 0), 4)
    assert [row.store_id for row in first] == [5, 6, 7, 8]
    rest = store.read_scheduled(first[-1].key(), 4)
    assert [row.store_id for row in rest] == [9, 10, 4]  # short: the end
    assert opened.durable()  # the same once written
    assert [row.store_id for row in store.read_scheduled((float("-inf"), 0), 4)] == [5, 6, 7, 8]


def test_a_batch_held_back_for_room_keeps_the_back_off_of_its_messages(tmp_path):
    """Without room for messages, the rest of a batch is written and the inserts wait:
    a back-off set on one of those waiting rows must wait with it (found by review)."""
    store = SQLiteStore(tmp_path, reserve=10**18)  # never room for messages
    store.load()
    db = store._db
    waiting = store.add_message(7, 1, "", "q", b"h", b"body")
    store.set_available_at(waiting, 1_900_000_000.0)
    batch = store._batch
    with pytest.raises(NoRoom):
        store._write_with_room(db, batch)
    assert batch.delays == {waiting: 1_900_000_000.0}  # kept with its insert
    store.reserve = 0
    store._write_with_room(db, batch)
    assert db.execute("SELECT available_at FROM messages WHERE id=?", (waiting,)).fetchone() == (
        1_900_000_000.0,
    )
    store.close()


def test_nul_and_backslashes_in_names_and_keys_survive(opened):
    # AMQP short strings may hold NUL (a binding's name joins its parts with it);
    # PostgreSQL's text cannot, so that store escapes them
    name = "ex\x00queue\x00key\\0\\"
    opened.store.save_definition("binding", "/", name, {"k": "v\x00"})
    add(opened.store, 1, 1)
    opened.store.add_message(1, 2, "ex\x00", "rk\\\x00", b"h", b"b")
    opened.store.save_dedup(1, "id\x00\\", 0.0)
    assert opened.durable()
    rows = opened.store.read_queue(1, 1, 10)
    assert [(m.exchange, m.routing_key) for m in rows] == [("ex\x00", "rk\\\x00")]
    snapshot = reopen(opened)
    assert snapshot.definitions == {"binding": [("/", name, {"k": "v\x00"})]}
    assert snapshot.dedup == {1: [("id\x00\\", 0.0)]}


def test_a_batch_operation_of_no_known_kind_is_an_error_not_a_counter_write(opened):
    from leveret.store.ops import write_op

    with opened.place.raw() as db, pytest.raises(TypeError, match="not a batch operation"):
        write_op(db, ("meta", "next_queue_id", 9))  # the old string-tagged form


# -- reads answered by callback (page-ins, the scheduler's window, stream offsets) -----------
def answer_of(handle: Opened, request) -> Any:
    """Ask with ``request(answer)`` and run the loop until the answer comes; the answer
    must come on the loop's thread."""
    future = handle.loop.create_future()
    loop_thread = threading.get_ident()

    def answer(result: Any) -> None:
        assert threading.get_ident() == loop_thread
        future.set_result(result)

    request(answer)
    return handle.loop.run_until_complete(asyncio.wait_for(future, TIMEOUT))


def test_request_queue_answers_on_the_loop_with_disk_and_unwritten_rows_in_seq_order(opened):
    store = opened.store
    for seq in (1, 2, 3):
        add(store, 1, seq)
    assert opened.durable()
    add(store, 1, 4)  # still in the current batch
    add(store, 2, 5)  # another queue's
    rows = answer_of(opened, lambda answer: store.request_queue(1, 1, 10, ALL_SEQS, answer))
    assert [(m.seq, m.body) for m in rows] == [(2, b"body 2"), (3, b"body 3"), (4, b"body 4")]
    assert [m.seq for m in answer_of(opened, lambda a: store.request_queue(1, 0, 2, ALL_SEQS, a))] == [1, 2]
    assert answer_of(opened, lambda a: store.request_queue(1, 0, 10, 2, a))[-1].seq == 2  # upto_seq
    assert store.reads_in_flight == 0


def test_request_queue_leaves_out_a_row_deleted_while_the_read_was_on_its_way(opened):
    store = opened.store
    ids = [add(store, 1, seq) for seq in (1, 2, 3)]
    assert opened.durable()
    future = opened.loop.create_future()
    store.request_queue(1, 0, 10, ALL_SEQS, future.set_result)
    store.remove_message(ids[1])  # expired on disk meanwhile: its deletion is on its way
    rows = opened.loop.run_until_complete(asyncio.wait_for(future, TIMEOUT))
    assert [m.seq for m in rows] == [1, 3]


def test_answers_come_in_the_order_asked(opened):
    store = opened.store
    for seq in range(1, 6):
        add(store, 1, seq)
    assert opened.durable()
    got: list[Any] = []
    store.request_queue(1, 0, 1, ALL_SEQS, lambda rows: got.append([m.seq for m in rows]))
    store.request_offset(1, 0.0, got.append)
    store.request_queue(1, 3, 1, ALL_SEQS, lambda rows: got.append([m.seq for m in rows]))
    deadline = time.monotonic() + TIMEOUT
    while len(got) < 3 and time.monotonic() < deadline:
        opened.turn()
    assert got == [[1], 1, [4]]


def test_request_offset_gives_the_first_seq_published_at_or_after_a_time(opened):
    store = opened.store
    for seq, when in ((1, 100.0), (2, 200.0), (3, 300.0)):
        add(store, 1, seq, published_at=when)
    assert opened.durable()
    assert answer_of(opened, lambda a: store.request_offset(1, 150.0, a)) == 2
    assert answer_of(opened, lambda a: store.request_offset(1, 301.0, a)) is None


def test_request_scheduled_counts_changes_made_while_the_read_was_on_its_way(opened):
    store = opened.store
    for store_id in range(1, 7):
        store.save_scheduled(scheduled_row(store_id, 100.0 + store_id))
    assert opened.durable()
    store.remove_scheduled(1)  # not written yet when asked
    future = opened.loop.create_future()
    store.request_scheduled((float("-inf"), 0), 4, future.set_result)
    store.remove_scheduled(3)  # cancelled meanwhile
    store.save_scheduled(scheduled_row(7, 50.0))  # a new job, due first
    store.save_scheduled(scheduled_row(2, 900.0))  # rescheduled past the read
    rows = opened.loop.run_until_complete(asyncio.wait_for(future, TIMEOUT))
    assert [row.store_id for row in rows] == [7, 4, 5, 6]
    assert opened.durable()
    assert [r.store_id for r in store.read_scheduled((float("-inf"), 0), 4)] == [7, 4, 5, 6]


def test_the_debug_guard_refuses_blocking_reads_on_the_loop_thread_only(opened):
    store = opened.store
    add(store, 1, 1)
    assert opened.durable()
    store.forbid_loop_reads = True
    for read in (
        lambda: store.read_queue(1, 0, 10),
        lambda: store.find_offset(1, 0.0),
        lambda: store.read_scheduled((0.0, 0), 1),
        lambda: store.find_scheduled("job"),
    ):
        with pytest.raises(LoopRead, match="synchronously on the event loop"):
            read()
    result: list[Any] = []
    reader = threading.Thread(target=lambda: result.append(store.read_queue(1, 0, 10)))
    reader.start()
    reader.join(TIMEOUT)
    assert [m.seq for m in result[0]] == [1]
    assert [m.seq for m in answer_of(opened, lambda a: store.request_queue(1, 0, 10, ALL_SEQS, a))] == [1]


# -- flow control ---------------------------------------------------------------------
def test_the_backlog_of_unwritten_messages_raises_flow_above_the_high_mark_and_ends_it_under_the_low(opened):
    """Messages added while the writer is busy count (body + ROW_OVERHEAD) in
    ``backlog_bytes``; past ``flow_high`` ``on_flow(True)`` is called once, and once the
    writes are committed and the backlog is under ``flow_low``, ``on_flow(False)``."""
    from leveret.store.batched import ROW_OVERHEAD

    store = opened.store
    flows: list[bool] = []
    store.on_flow = flows.append
    store.flow_high, store.flow_low = 10 * (1000 + ROW_OVERHEAD), 5 * (1000 + ROW_OVERHEAD)
    for seq in range(1, 10):
        add(store, 1, seq, b"b" * 1000)
    assert flows == [] and store.backlog_bytes == 9 * (1000 + ROW_OVERHEAD)
    for seq in range(10, 13):  # the 11th passes the high mark; more do not call again
        add(store, 1, seq, b"b" * 1000)
    assert flows == [True] and store.flowing
    assert opened.durable()
    assert flows == [True, False] and store.backlog_bytes == 0 and not store.flowing


def test_failed_count_is_recovered_with_the_delivery_count(opened):
    """RabbitMQ 4.3's two counts (deliveries, failed deliveries) are written together,
    for a row still in the batch being built and for one on disk, and read back."""
    store = opened.store
    written = add(store, 1, 1)
    assert opened.durable()
    store.set_delivery_count(written, 3, 1)
    pending = add(store, 1, 2)
    store.set_delivery_count(pending, 2, 2)  # still in the batch being built
    assert opened.durable()
    store.set_delivery_count(written, 4, 2)  # the last counts win
    assert opened.durable()
    opened.close()
    store = opened.place.new_store()
    store.load()
    try:
        rows = store.read_queue(1, 0, 10)
        assert [(m.seq, m.delivery_count, m.failed_count) for m in rows] == [(1, 4, 2), (2, 2, 2)]
    finally:
        store.close()


def test_an_older_store_gets_the_failed_count_column(place):
    """A data directory (or PostgreSQL schema at version 1) written before failed
    deliveries were counted apart: migrated at start, its rows with no failure."""
    opened = Opened(place)
    add(opened.store, 1, 1)
    assert opened.durable() is True
    opened.close()
    with place.raw() as db:  # as the store was before the column existed
        db.execute("ALTER TABLE messages DROP COLUMN failed_count")
        if place.kind == "postgresql":  # version 1: what later migrations made goes too
            db.execute("DELETE FROM schema_version WHERE version >= 2")
            db.execute("DROP TABLE cluster_nodes, queue_owners, changes, transient_definitions, cluster_meta")
            db.execute("ALTER TABLE scheduled DROP COLUMN node")
    reopened = Opened(place)
    try:
        rows = reopened.store.read_queue(1, 0, 10)
        assert [(r.seq, r.failed_count) for r in rows] == [(1, 0)]
        reopened.store.set_delivery_count(rows[0].store_id, 2, 1)
        assert reopened.durable() is True
        assert [r.failed_count for r in reopened.store.read_queue(1, 0, 10)] == [1]
    finally:
        reopened.close()
