"""What every SQL store shares: group commit on a writer thread, reads that see
writes still on their way, background range deletions, held batches.

Changes made during an event-loop turn form a batch; while the writer thread commits
one batch (one transaction), the next accumulates, so batches grow with load. A message
acknowledged before its batch is handed to the writer never reaches the database.
Subclasses open the connections and say what differs: :class:`~.sqlite.SQLiteStore`
(embedded file) and :class:`~.postgresql.PostgreSQLStore` (a shared server). SQL here is
written once, with ``?`` placeholders, in the dialect both accept.

Tables: ``definitions`` (AMQP field tables), ``messages`` (content header and body as
they arrived; ``meta``: JSON of what else the message carries, see
:meth:`leveret.core.message.Message.meta`), ``pending_deletes``, ``meta`` (counters),
``dedup``, ``scheduled``.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import operator
import os
import queue as queue_mod
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from pamqp import decode

from ..amqp.field_table import encode_plain_table
from .base import ALL_SEQS, SEQ_BLOCK_BITS, Callback, ScheduledRow, Snapshot, Store, StoredMessage, StoreError
from .ops import (
    BatchOp,
    DeleteDedup,
    DeleteDefinition,
    DeleteQueueDedup,
    DeleteRange,
    SaveDedup,
    SaveDefinition,
    SetCounter,
    write_op,
)

log = logging.getLogger("leveret.store")

_SEQ = operator.itemgetter(2)  # a batch's row: its seq
_STORED_SEQ = operator.attrgetter("seq")

DELETE_CHUNK = 5000  # rows deleted per transaction by a background range deletion
BLOCK = 1 << SEQ_BLOCK_BITS  # seqs (and store ids) per block
RETRY = 0.5  # seconds between attempts to write a batch that did not fit
#: Bytes a row costs in the backlog beyond its body (its list, ids, header, strings):
#: what :attr:`BatchedStore.backlog_bytes` counts per message.
ROW_OVERHEAD = 512
#: Flow control's marks on :attr:`BatchedStore.backlog_bytes` (bytes): above the high
#: mark publishers are held (:mod:`leveret.core.flow`), under the low mark released.
FLOW_HIGH = 32 * 1024 * 1024
FLOW_LOW = 16 * 1024 * 1024


class Connection(Protocol):
    """What the store needs of a DB-API connection (sqlite3's, or psycopg's through
    :class:`~.postgresql.PgConnection`): autocommit, ``?`` placeholders."""

    def execute(self, sql: str, params: Sequence[Any] = ..., /) -> Any: ...

    def executemany(self, sql: str, params: Iterable[Sequence[Any]], /) -> Any: ...

    def close(self) -> None: ...


class Batch:
    __slots__ = ("callbacks", "cost", "counts", "delays", "deletes", "inserts", "ops", "scheduled")

    def __init__(self) -> None:
        #: bytes counted in the store's backlog for this batch (bodies + ROW_OVERHEAD each)
        self.cost = 0
        self.inserts: dict[int, list] = {}
        #: store id -> (deliveries, failed deliveries)
        self.counts: dict[int, tuple[int, int]] = {}
        self.delays: dict[int, float] = {}  # store id -> available_at (redelivery back-off)
        self.deletes: set[int] = set()  # a set: page-in answers look ids up in it
        #: everything else, in the order it was made (see :mod:`.ops`)
        self.ops: list[BatchOp] = []
        self.callbacks: list[Callback] = []
        #: scheduled rows: store id -> the row to write, or None to delete it
        self.scheduled: dict[int, ScheduledRow | None] = {}

    def __bool__(self) -> bool:
        return bool(self.inserts or self.counts or self.deletes or self.ops or self.callbacks) or bool(
            self.scheduled or self.delays
        )

    def absorb(self, newer: Batch) -> None:
        """Take in the changes made after this batch (which could not be written), as
        if they had been made to it: a newer delete of a row this batch inserts drops
        the insert, so the merged batch never deletes what it inserts."""
        for store_id in newer.deletes:
            if self.inserts.pop(store_id, None) is None:
                self.counts.pop(store_id, None)
                self.deletes.add(store_id)
        for store_id, count in newer.counts.items():
            row = self.inserts.get(store_id)
            if row is not None:
                row[3], row[13] = count
            else:
                self.counts[store_id] = count
        for op in newer.ops:
            if isinstance(op, DeleteRange):  # a later purge or truncation: of these inserts too
                for store_id in [i for i, row in self.inserts.items() if op.covers(row[1], row[2])]:
                    del self.inserts[store_id]
        self.inserts.update(newer.inserts)
        self.cost += newer.cost
        self.ops += newer.ops
        self.callbacks += newer.callbacks
        self.scheduled.update(newer.scheduled)  # the later change of a row wins
        self.delays.update(newer.delays)

    def insert_bytes(self) -> int:
        """Bytes of message bodies this batch inserts (scheduled ones included)."""
        return sum(row[11] for row in self.inserts.values()) + sum(
            len(row.body) for row in self.scheduled.values() if row is not None
        )


def _encode_table(data: dict) -> bytes:
    # floats as doubles: pamqp's own encoder keeps them in 32 bits
    return encode_plain_table(data)


def _decode_table(blob: bytes) -> dict:
    return decode.field_table(bytes(blob))[1]


class StoreIds:
    """The union of some sets of store ids, for ``in`` without copying them."""

    __slots__ = ("sets",)

    def __init__(self, *sets: set[int]) -> None:
        self.sets = [ids for ids in sets if ids]

    def __contains__(self, store_id: object) -> bool:
        for ids in self.sets:  # noqa: SIM110 (written out: no generator per lookup)
            if store_id in ids:
                return True
        return False

    def __bool__(self) -> bool:
        return bool(self.sets)


class LoopRead(AssertionError):
    """A synchronous read ran on the event loop's thread while
    :attr:`BatchedStore.forbid_loop_reads` was set (a debug guard for tests)."""


class NoRoom(Exception):
    """Writing a batch's messages would leave less than the reserve free."""


class Fenced(Exception):
    """The store lost its database session (and with it the right to write)."""


class BatchedStore(Store):
    """A store over SQL connections: subclasses give :meth:`_connect` (the writer's
    connection, schema made) and :meth:`_connect_reader`, ``name`` (for messages),
    ``_errors`` (their driver's exception base) and ``_order`` (the column that keeps
    insertion order: SQLite's rowid, a PostgreSQL identity).

    A batch that cannot be written for want of room (:class:`NoRoom`, or an error
    :meth:`_out_of_room` recognises) is kept: later changes join it, its callbacks
    (publisher confirms) wait, ``on_stall(True)`` is called (the broker raises its
    alarm) and it is tried again every :data:`RETRY` seconds until written
    (``on_stall(False)``). A lost session (:class:`Fenced`) calls ``on_fenced``: the
    broker must stop at once."""

    _errors: tuple[type[BaseException], ...] = ()
    _order = "rowid"
    #: seconds the writer waits for a batch before doing idle work
    _idle_every = 2.0

    def __init__(self, name: str) -> None:
        self.name = name
        self.on_stall: Callable[[bool], None] | None = None
        #: called on the loop, once, when the store lost its database session
        self.on_fenced: Callable[[str], None] | None = None
        self.stalled: str | None = None  # why the store cannot write now, if it cannot
        self._retry_at = 0.0  # monotonic time before which a stalled batch is not retried
        self._loop: asyncio.AbstractEventLoop | None = None
        self._batch = Batch()
        self._scheduled = False
        self._writing = False
        self._jobs: queue_mod.Queue = queue_mod.Queue()
        self._thread: threading.Thread | None = None
        self._next_id = 1  # the next store id of seq block 0 (every FIFO queue's)
        self._next_ids: dict[int, int] = {}  # the same for the other seq blocks
        self._next_scheduled_id = 1
        self._next_queue_id = 1
        #: where the ids handed out run out: block 0's (FIFO queues), the other seq
        #: blocks' and the scheduled rows'. A single broker owns every id (block 0 ends
        #: at BLOCK, never reached); a cluster node takes ids in chunks (:meth:`_id_chunk`).
        self._id_end = BLOCK
        self._block_ends: dict[int, int] = {}
        self._scheduled_end = ALL_SEQS
        #: SQL that narrows start-up and scheduler reads to what this broker owns:
        #: ``_owned_sql`` a condition on ``queue_id`` (messages, dedup keys),
        #: ``_mine_sql`` `` AND`` a condition on ``scheduled`` rows (both empty:
        #: everything, a single broker's)
        self._owned_sql = ""
        self._mine_sql = ""
        self._db: Connection | None = None
        self._reader: Connection | None = None
        self._inflight: Batch | None = None
        #: reads answered by callback: (query, finish) jobs for the reader thread
        self._reads: queue_mod.Queue = queue_mod.Queue()
        self._read_thread: threading.Thread | None = None
        self._read_db: Connection | None = None  # the reader thread's own connection
        self._reads_in_flight = 0
        #: scheduled-row changes made while reads were in flight (see request_scheduled)
        self._scheduled_since: dict[int, ScheduledRow | None] = {}
        #: messages deleted while reads were in flight (see request_queue)
        self._removed_since: set[int] = set()
        self._ranges_since: list[DeleteRange] = []
        #: the event loop's thread (see :attr:`forbid_loop_reads`)
        self._loop_thread: int | None = None
        #: Debug guard (tests): a synchronous read on the loop's thread raises LoopRead.
        self.forbid_loop_reads = bool(os.environ.get("LEVERET_FORBID_LOOP_READS"))
        self.failed: str | None = None
        self.fenced: str | None = None
        #: Flow control (:mod:`leveret.core.flow`): called on the loop with True when
        #: :attr:`backlog_bytes` passes ``flow_high``, False when it is back under ``flow_low``.
        self.on_flow: Callable[[bool], None] | None = None
        #: Bytes of messages added but not committed yet (the current and the in-flight
        #: batch): bodies plus :data:`ROW_OVERHEAD` each.
        self.backlog_bytes = 0
        self.flow_high = FLOW_HIGH
        self.flow_low = FLOW_LOW
        self.flowing = False  # above the high mark, not yet back under the low one

    # -- what a subclass provides --------------------------------------------------------
    def _connect(self) -> Connection:
        """The writer's connection, with the schema made (StoreError on failure)."""
        raise NotImplementedError

    def _connect_reader(self) -> Connection:
        """A second connection for reads on the event loop."""
        raise NotImplementedError

    def _out_of_room(self, exc: BaseException) -> bool:
        """Whether a failed write is worth retrying later (the disk is full)."""
        return False

    def _write_batch(self, db: Connection, batch: Batch) -> None:
        """Write ``batch`` (NoRoom to hold its messages back); see SQLiteStore's."""
        self._write(db, batch)

    def _reclaim(self, db: Connection, busy: bool = False) -> bool:
        """Give freed space back (``busy``: between batches, only where it is worth
        the writes it costs); whether more remains to give."""
        return False

    def _idle(self, db: Connection) -> None:
        """Called by the writer thread when it had nothing to do for ``_idle_every`` s
        (raise Fenced if the session is gone)."""

    def _lost_session(self, exc: BaseException) -> bool:
        """Whether a failed write means the database session is gone."""
        return False

    def _closing(self, db: Connection) -> None:
        """Last words on the writer's connection at a clean close."""

    def _started(self) -> None:
        """Called once the writer thread runs."""

    def _error(self, what: str, exc: BaseException) -> StoreError:
        return StoreError(f"cannot {what} store {self.name}: {exc}")

    # -- start-up -------------------------------------------------------------------
    def load(self) -> Snapshot:
        """Open the database (schema made or migrated), drop transient rows, finish
        range deletions a crash cut short, and read definitions, per-queue message
        counts and deduplication keys. Blocks; StoreError naming the store."""
        started = time.monotonic()
        db = self._db = self._connect()
        snapshot = Snapshot()
        order = self._order
        owned, mine = self._owned_sql, self._mine_sql
        where = f" WHERE {owned}" if owned else ""
        try:
            # paged-out, not durable
            db.execute(f"DELETE FROM messages WHERE transient=1{' AND ' + owned if owned else ''}")
            db.execute(f"DELETE FROM scheduled WHERE transient=1{mine}")
            while self._delete_chunk(db, limit=None):  # finish deletions a crash cut short
                pass
            for kind, vhost, name, data in db.execute(
                f"SELECT kind, vhost, name, data FROM definitions ORDER BY {order}"
            ):
                snapshot.definitions.setdefault(kind, []).append((vhost, name, _decode_table(data)))
            for queue_id, count, last_seq, size in db.execute(
                f"SELECT queue_id, count(*), max(seq), CAST(sum(size) AS BIGINT) FROM messages{where} "
                "GROUP BY queue_id"
            ):
                snapshot.queues[queue_id] = (count, last_seq, size or 0)
            for queue_id, key, expires_at in db.execute(
                f"SELECT queue_id, key, expires_at FROM dedup{where} ORDER BY {order}"
            ):
                snapshot.dedup.setdefault(queue_id, []).append((key, expires_at))
            scheduled = db.execute(
                "SELECT count(*) FROM scheduled" + (f" WHERE true{mine}" if mine else "")
            ).fetchone()
            snapshot.scheduled = scheduled[0]
            self._load_ids(db)
            self._reader = self._connect_reader()
        except self._errors as exc:
            raise self._error("read", exc) from None
        log.info(
            "store %s: %d messages in %d queues, indexed in %.2f s",
            self.name,
            sum(q[0] for q in snapshot.queues.values()),
            len(snapshot.queues),
            time.monotonic() - started,
        )
        return snapshot

    def _load_ids(self, db: Connection) -> None:
        """At start-up: where the ids of messages, scheduled rows and queues go on, after
        the highest on disk (a single broker, the only writer)."""
        row = db.execute("SELECT value FROM meta WHERE key='next_queue_id'").fetchone()
        # block 0's ids, then the others' (an index lookup each, so that taking the
        # first id of a block never reads the database on the event loop)
        last = db.execute("SELECT max(id) FROM messages WHERE id < ?", (BLOCK,)).fetchone()[0]
        self._next_ids.clear()
        for block in range(1, ALL_SEQS >> SEQ_BLOCK_BITS):
            low = block << SEQ_BLOCK_BITS
            found = db.execute(
                "SELECT max(id) FROM messages WHERE id >= ? AND id < ?", (low, low + BLOCK)
            ).fetchone()[0]
            if found:
                self._next_ids[block] = found + 1
        last_scheduled = db.execute("SELECT max(id) FROM scheduled").fetchone()[0]
        self._next_id = (last or 0) + 1
        self._next_scheduled_id = (last_scheduled or 0) + 1
        self._next_queue_id = row[0] if row else 1

    def _id_chunk(self, block: int) -> int:
        """The first id of a new chunk of seq block ``block`` (a cluster node's; see
        :class:`~.postgresql.PostgreSQLStore`), its end recorded in :attr:`_id_end` (block 0)
        or :attr:`_block_ends`. A single broker's block is one chunk: the first id of
        the block, and block 0 never runs out (StoreError if it did)."""
        if block == 0:
            raise StoreError(f"store {self.name}: out of message ids")
        return (block << SEQ_BLOCK_BITS) + 1

    def _scheduled_chunk(self) -> int:
        """The first id of a new chunk of scheduled-row ids (a cluster node's), its end
        in :attr:`_scheduled_end`; a single broker never runs out (StoreError)."""
        raise StoreError(f"store {self.name}: out of scheduled ids")

    def read_queue(
        self, queue_id: int, after_seq: int, limit: int, upto_seq: int = ALL_SEQS
    ) -> list[StoredMessage]:
        """Committed rows (read on a second connection) merged with the inserts still in
        the in-flight and the current batch. Blocks: start-up, tests and the console's
        browsing; a queue's page-in uses :meth:`request_queue`."""
        self._check_thread("read_queue")
        assert self._reader is not None
        pending = self._pending_inserts(queue_id, after_seq, upto_seq)
        deleting = self._deletes_on_the_way()
        rows = self._query_queue(self._reader, queue_id, after_seq, upto_seq, limit, deleting)
        return self._merge_queue(rows, pending, limit)

    def request_queue(
        self,
        queue_id: int,
        after_seq: int,
        limit: int,
        upto_seq: int,
        answer: Callable[[list[StoredMessage]], None],
    ) -> None:
        """:meth:`read_queue` on the reader thread: the inserts still in a batch are
        taken now, the committed rows read there, and ``answer(rows)`` runs on the loop,
        without the rows deleted since the request or whose deletion is on its way."""
        pending = self._pending_inserts(queue_id, after_seq, upto_seq)
        deleting = self._deletes_on_the_way()

        def query(db: Connection) -> list[StoredMessage]:
            return self._query_queue(db, queue_id, after_seq, upto_seq, limit, deleting)

        def finish(found: list[StoredMessage]) -> None:
            gone = self._deletes_on_the_way(self._removed_since)
            ranges = [r for r in self._ranges_since if r.queue_id == queue_id]
            fresh = pending
            if gone:
                found = [m for m in found if m.store_id not in gone]
                fresh = [r for r in fresh if r[0] not in gone]
            if ranges:  # purged or trimmed since the request
                found = [m for m in found if not any(r.covers(queue_id, m.seq) for r in ranges)]
                fresh = [row for row in fresh if not any(r.covers(queue_id, row[2]) for r in ranges)]
            answer(self._merge_queue(found, fresh, limit))

        self._ask(query, finish)

    def _pending_inserts(self, queue_id: int, after_seq: int, upto_seq: int) -> list[list]:
        """The rows of a queue with ``after_seq < seq <= upto_seq`` still in the
        in-flight or the current batch (a batch may also be committed already)."""
        return [
            row
            for batch in (self._inflight, self._batch)
            if batch is not None
            for row in batch.inserts.values()
            if row[1] == queue_id and after_seq < row[2] <= upto_seq
        ]

    @staticmethod
    def _query_queue(
        db: Connection, queue_id: int, after_seq: int, upto_seq: int, limit: int, deleting: StoreIds
    ) -> list[StoredMessage]:
        """Up to ``limit`` committed rows in seq order, none of ``deleting``. Touches
        nothing but ``db``: runs on either thread (the reader's builds the messages too)."""
        # A committed row whose deletion is still on its way (a paged-out message that
        # expired on disk) is not read back: read on past it, so that ``limit`` rows
        # come whenever there are that many (a short read means the store lost track).
        # Not ``limit + len(deleting)`` at once: while a consumer drains, ``deleting``
        # holds thousands of acknowledged rows, all before ``after_seq``.
        rows: list = []
        want = limit
        while True:
            found = db.execute(
                "SELECT id, queue_id, seq, delivery_count, exchange, routing_key, header, body, "
                "meta, expires_at, available_at, failed_count FROM messages "
                "WHERE queue_id=? AND seq>? AND seq<=? ORDER BY seq LIMIT ?",
                (queue_id, after_seq, upto_seq, want),
            ).fetchall()
            if not deleting:
                rows = found
                break
            rows += [row for row in found if row[0] not in deleting]
            if len(found) < want or len(rows) >= limit:
                break
            # a whole batch again, not only what is missing: a run of deleted rows ahead
            # would otherwise be read a few rows per query
            after_seq = found[-1][2]
        return [
            StoredMessage(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[9], r[8], r[10], r[11])
            for r in rows[:limit]
        ]

    @staticmethod
    def _merge_queue(found: list[StoredMessage], pending: list[list], limit: int) -> list[StoredMessage]:
        """Committed messages and ``pending`` inserts (a batch's rows), by seq."""
        if not pending:
            return found
        # a batch's row: id, queue_id, seq, delivery_count, exchange, routing_key, header,
        # body, transient, expires_at, published_at, size, meta, failed_count
        # only the ``limit`` lowest pending rows can be among the answer: while the writer
        # is behind there are tens of thousands, and messages are built for these alone
        merged = {m.store_id: m for m in found}
        for r in heapq.nsmallest(limit, pending, key=_SEQ):
            merged[r[0]] = StoredMessage(
                r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[9], r[12], failed_count=r[13]
            )
        return sorted(merged.values(), key=_STORED_SEQ)[:limit]

    # -- reads answered by callback ---------------------------------------------------------
    def _check_thread(self, what: str) -> None:
        """The debug guard: LoopRead if ``what`` (a blocking read) runs on the loop's
        thread while :attr:`forbid_loop_reads` is set."""
        if self.forbid_loop_reads and threading.get_ident() == self._loop_thread:
            raise LoopRead(f"store {self.name}: {what} read synchronously on the event loop")

    def _ask(self, query: Callable[[Connection], Any], finish: Callable[[Any], None]) -> None:
        """Run ``query(db)`` on the reader thread, then ``finish(result)`` on the loop
        (the answers come in the order asked)."""
        self._reads_in_flight += 1
        self._reads.put((query, finish))

    def _reading(self) -> None:
        """The reader thread: answers requests in order, on its own connection; a read
        that fails is logged and asked again after :data:`RETRY` seconds."""
        db = self._read_db
        assert db is not None
        while True:
            job = self._reads.get()
            if job is None or not self._answer(db, job):
                return

    def _answer(self, db: Connection, job: tuple) -> bool:
        """One read of the reader thread; False once the loop is gone. Its own frame, so
        the answer (a page of messages: bodies of any size) is not kept alive by the
        thread's locals while it waits for the next request."""
        query, finish = job
        try:
            result = query(db)
        except self._errors as exc:
            log.error("store %s: a read failed, retrying in %.1f s: %s", self.name, RETRY, exc)
            return self._report(self._read_again, job)
        return self._report(self._answered, finish, result)

    def _read_again(self, job: tuple) -> None:
        assert self._loop is not None
        self._loop.call_later(RETRY, self._reads.put, job)

    def _answered(self, finish: Callable[[Any], None], result: object) -> None:
        """On the loop: a read's answer."""
        self._reads_in_flight -= 1
        try:
            finish(result)
        finally:
            if not self._reads_in_flight:
                self._scheduled_since.clear()
                self._removed_since.clear()
                self._ranges_since.clear()

    @property
    def reads_in_flight(self) -> int:
        """Reads asked for and not answered yet."""
        return self._reads_in_flight

    def _pending_deletes(self) -> set[int]:
        """Store ids whose deletion is still on its way to disk."""
        return {i for batch in (self._inflight, self._batch) if batch is not None for i in batch.deletes}

    def _deletes_on_the_way(self, *more: set[int]) -> StoreIds:
        """:meth:`_pending_deletes` (and ``more``) to look ids up in, not copied: while a
        consumer drains, thousands of acknowledged rows wait in the batches, and each
        page-in would copy them twice. The current batch's set grows meanwhile (a
        superset is fine: the ids are gone either way)."""
        inflight = self._inflight
        return StoreIds(inflight.deletes if inflight is not None else set(), self._batch.deletes, *more)

    def read_expired(
        self, queue_id: int, after_seq: int, upto_seq: int, now: float, limit: int
    ) -> list[StoredMessage]:
        """By the ``messages_expiring`` index; committed rows only (a row still in a
        batch is found by a later call), none whose deletion is on its way."""
        self._check_thread("read_expired")
        assert self._reader is not None
        deleting = self._pending_deletes()
        return [
            StoredMessage(
                r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], expires_at=r[8], meta=r[9], failed_count=r[10]
            )
            for r in self._reader.execute(
                "SELECT id, queue_id, seq, delivery_count, exchange, routing_key, header, body, expires_at, "
                "meta, failed_count FROM messages WHERE queue_id=? AND expires_at > 0 AND expires_at <= ? "
                "AND seq > ? AND seq <= ? ORDER BY expires_at LIMIT ?",
                (queue_id, now, after_seq, upto_seq, limit + len(deleting)),
            )
            if r[0] not in deleting
        ][:limit]

    def next_expiry(self, queue_id: int, after_seq: int, upto_seq: int, now: float) -> float | None:
        self._check_thread("next_expiry")
        assert self._reader is not None
        row = self._reader.execute(
            # (the literal ``expires_at > 0`` lets SQLite use the partial index)
            "SELECT min(expires_at) FROM messages WHERE queue_id=? AND expires_at > 0 AND expires_at > ? "
            "AND seq > ? AND seq <= ?",
            (queue_id, now, after_seq, upto_seq),
        ).fetchone()
        return row[0] if row else None

    # -- scheduled messages -------------------------------------------------------------
    def new_scheduled_id(self) -> int:
        store_id = self._next_scheduled_id
        if store_id >= self._scheduled_end:
            store_id = self._scheduled_chunk()
        self._next_scheduled_id = store_id + 1
        return store_id

    def save_scheduled(self, row: ScheduledRow) -> None:
        batch = self._changed()
        batch.scheduled[row.store_id] = row
        cost = len(row.body) + ROW_OVERHEAD
        batch.cost += cost
        self.backlog_bytes += cost
        if self.backlog_bytes > self.flow_high and not self.flowing:
            self._flow(True)
        if self._reads_in_flight:
            self._scheduled_since[row.store_id] = row

    def remove_scheduled(self, store_id: int) -> None:
        self._changed().scheduled[store_id] = None
        if self._reads_in_flight:
            self._scheduled_since[store_id] = None

    def _pending_scheduled(self) -> dict[int, ScheduledRow | None]:
        """Scheduled-row changes not committed yet, the latest of each row."""
        pending: dict[int, ScheduledRow | None] = {}
        for batch in (self._inflight, self._batch):
            if batch is not None:
                pending.update(batch.scheduled)
        return pending

    def read_scheduled(self, after: tuple[float, int], limit: int) -> list[ScheduledRow]:
        """Committed rows (read on the reader connection, by the due-order index) merged
        with the changes still in the in-flight and the current batch. Fewer than
        ``limit`` rows only when there are no more: committed rows that a pending change
        deletes or moves do not count, so reading goes on past them (the scheduler takes
        a short batch for the end of the store). Blocks: the scheduler's window reads
        use :meth:`request_scheduled`."""
        self._check_thread("read_scheduled")
        assert self._reader is not None
        pending = self._pending_scheduled()
        rows, cursor, complete = self._query_scheduled(
            self._reader, after, limit, set(pending), self._mine_sql
        )
        return self._merge_scheduled(rows, cursor, complete, pending, after, limit)

    def request_scheduled(
        self, after: tuple[float, int], limit: int, answer: Callable[[list[ScheduledRow]], None]
    ) -> None:
        """:meth:`read_scheduled` on the reader thread, ``answer(rows)`` on the loop.
        The rows are as of the answer: a row saved, moved or removed after the request
        is merged in as it then is."""
        pending = self._pending_scheduled()
        touched = set(pending)
        mine = self._mine_sql

        def query(db: Connection) -> tuple[dict[int, ScheduledRow], tuple[float, int], bool]:
            return self._query_scheduled(db, after, limit, touched, mine)

        def finish(result: tuple[dict[int, ScheduledRow], tuple[float, int], bool]) -> None:
            pending.update(self._scheduled_since)  # changed while the read was on its way
            answer(self._merge_scheduled(*result, pending, after, limit))

        self._ask(query, finish)

    @staticmethod
    def _query_scheduled(
        db: Connection, after: tuple[float, int], limit: int, pending: set[int], mine: str = ""
    ) -> tuple[dict[int, ScheduledRow], tuple[float, int], bool]:
        """Committed rows after ``after`` (and ``mine``: see :attr:`_mine_sql`) until
        ``limit`` of them are not in ``pending``: ``(rows by store id, the last key read,
        whether every row was read)``. Touches nothing but ``db``: runs on either thread."""
        rows: dict[int, ScheduledRow] = {}
        cursor = after
        complete = False  # every committed row after ``after`` read
        while True:
            fetched = [
                ScheduledRow(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], bool(r[10]))
                for r in db.execute(
                    "SELECT id, vhost, job_id, due_at, exchange, routing_key, header, body, meta, "
                    f"schedule, transient FROM scheduled WHERE (due_at, id) > (?, ?){mine} ORDER BY due_at, "
                    "id LIMIT ?",
                    (cursor[0], cursor[1], limit),
                )
            ]
            for row in fetched:
                rows[row.store_id] = row
            if len(fetched) < limit:
                complete = True
                break
            cursor = fetched[-1].key()
            if sum(1 for store_id in rows if store_id not in pending) >= limit:
                break  # ``limit`` rows up to ``cursor`` that no pending change touches
        return rows, cursor, complete

    @staticmethod
    def _merge_scheduled(
        rows: dict[int, ScheduledRow],
        cursor: tuple[float, int],
        complete: bool,
        pending: dict[int, ScheduledRow | None],
        after: tuple[float, int],
        limit: int,
    ) -> list[ScheduledRow]:
        """Committed ``rows`` with the ``pending`` changes applied, in due order."""
        if not pending:
            return list(rows.values())
        # Unless every committed row was read, rows past ``cursor`` come after ``limit``
        # untouched ones: pending rows there are left out (there are thousands while
        # publishers add jobs, and sorting them all made each read-back ~10x dearer).
        for store_id, change in pending.items():
            if change is None or change.key() <= after:
                rows.pop(store_id, None)  # deleted, or moved before ``after``
            elif complete or change.key() <= cursor:
                rows[store_id] = change
            else:
                rows.pop(store_id, None)  # moved past what was read: read later
        return sorted(rows.values(), key=ScheduledRow.key)[:limit]

    def find_scheduled(self, job_id: str) -> ScheduledRow | None:
        self._check_thread("find_scheduled")
        for row in reversed(self._pending_scheduled().values()):
            if row is not None and row.job_id == job_id:
                return row
        assert self._reader is not None
        r = self._reader.execute(
            "SELECT id, vhost, job_id, due_at, exchange, routing_key, header, body, meta, schedule, "
            f"transient FROM scheduled WHERE job_id=?{self._mine_sql} LIMIT 1",
            (job_id,),
        ).fetchone()
        if r is None or self._pending_scheduled().get(r[0], r) is None:
            return None
        return ScheduledRow(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], bool(r[10]))

    def queue_snapshot(self, queue_id: int) -> tuple[tuple[int, int, int] | None, list[tuple[str, float]]]:
        """What :meth:`load` reads of one queue, read now (committed rows): its
        ``(message count, highest seq, body bytes)`` (None: no messages) and its
        deduplication keys, oldest first. For a cluster node that took a queue over
        (blocking; StoreError naming the store)."""
        assert self._reader is not None
        try:
            count, last_seq, size = self._reader.execute(
                "SELECT count(*), max(seq), CAST(sum(size) AS BIGINT) FROM messages WHERE queue_id=?",
                (queue_id,),
            ).fetchone()
            keys = self._reader.execute(
                f"SELECT key, expires_at FROM dedup WHERE queue_id=? ORDER BY {self._order}", (queue_id,)
            ).fetchall()
        except self._errors as exc:
            raise self._error("read", exc) from None
        return ((count, last_seq, size or 0) if count else None), [(key, expires) for key, expires in keys]

    def count_blocks(self, queue_id: int) -> dict[int, tuple[int, int, int]]:
        """Committed rows of a queue (start-up, before :meth:`start`) grouped by
        ``seq >> SEQ_BLOCK_BITS``."""
        assert self._reader is not None
        try:
            rows = self._reader.execute(
                "SELECT seq >> ?, count(*), max(seq), CAST(sum(size) AS BIGINT) FROM messages "
                "WHERE queue_id=? GROUP BY 1",
                (SEQ_BLOCK_BITS, queue_id),
            ).fetchall()
        except self._errors as exc:
            raise self._error("read", exc) from None
        return {block: (count, last_seq, size or 0) for block, count, last_seq, size in rows}

    def ranges_pending(self, queue_id: int) -> int:
        """How many range deletions of a queue are still to be done in the background
        (blocking, off the loop: a cluster node taking over a queue the dead owner purged
        waits for them, or the purged rows would come back)."""
        assert self._reader is not None
        try:
            row = self._reader.execute("SELECT count(*) FROM pending_deletes WHERE queue_id=?", (queue_id,))
            return int(row.fetchone()[0])
        except self._errors as exc:
            raise self._error("read", exc) from None

    def read_dedup(self, queue_id: int) -> list[tuple[str, float]]:
        """A queue's committed deduplication keys, oldest first, with their expiry
        (blocking, off the loop: a cluster node taking the queue over)."""
        assert self._reader is not None
        try:
            rows = self._reader.execute(
                f"SELECT key, expires_at FROM dedup WHERE queue_id=? ORDER BY {self._order}", (queue_id,)
            ).fetchall()
        except self._errors as exc:
            raise self._error("read", exc) from None
        return [(key, expires_at) for key, expires_at in rows]

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the writer and the reader thread (its own connection: PostgreSQL's
        ``leveret-reader`` session); callbacks and answers will run on ``loop``."""
        if self._db is None:
            self.load()
        self._loop = loop
        self._loop_thread = threading.get_ident()
        self._thread = threading.Thread(target=self._writer, name="leveret-store", daemon=True)
        self._thread.start()
        try:
            self._read_db = self._connect_reader()
        except self._errors as exc:
            raise self._error("read", exc) from None
        self._read_thread = threading.Thread(target=self._reading, name="leveret-store-reader", daemon=True)
        self._read_thread.start()
        self._started()
        if self._batch:  # changes made during recovery
            self._scheduled = True
            loop.call_soon(self._submit)

    def _changed(self) -> Batch:
        if not self._scheduled and not self._writing and self._loop is not None:
            self._scheduled = True
            self._loop.call_soon(self._submit)
        return self._batch

    def save_definition(self, kind: str, vhost: str, name: str, data: dict) -> None:
        """Queued in the current batch; an upsert, so a definition keeps its place in
        :meth:`load`'s order."""
        self.definition_changes += 1
        self._changed().ops.append(SaveDefinition(kind, vhost, name, _encode_table(data)))

    def delete_definition(self, kind: str, vhost: str, name: str) -> None:
        """Queued in the current batch."""
        self.definition_changes += 1
        self._changed().ops.append(DeleteDefinition(kind, vhost, name))

    def new_queue_id(self) -> int:
        """The next id of a counter kept in the ``meta`` table (saved with the batch)."""
        queue_id = self._next_queue_id
        self._next_queue_id += 1
        self._changed().ops.append(SetCounter("next_queue_id", self._next_queue_id))
        return queue_id

    def _block_id(self, block: int) -> int:
        """The next store id of seq block ``block``: ids ``block << SEQ_BLOCK_BITS``
        onwards (after the highest on disk, found by :meth:`load`)."""
        next_id = self._next_ids.get(block)
        if next_id is None or next_id >= self._block_ends.get(block, ALL_SEQS):
            next_id = self._id_chunk(block)
        self._next_ids[block] = next_id + 1
        return next_id

    def add_message(
        self,
        queue_id: int,
        seq: int,
        exchange: str,
        routing_key: str,
        header: bytes,
        body: bytes,
        transient: bool = False,
        expires_at: float = 0.0,
        published_at: float = 0.0,
        meta: str | None = None,
    ) -> int:
        """The row waits in the current batch: removed before the batch goes to the
        writer thread, it never touches the disk. Its id comes from its seq block's own
        range (``seq >> SEQ_BLOCK_BITS``): the rows of a block lie together in the
        table, so reading back and deleting one priority level of a queue touches its
        own pages, not every page written meanwhile."""
        if seq < BLOCK:  # (a cluster node checks its chunk first: PostgreSQLStore)
            store_id = self._next_id
            self._next_id += 1
        else:
            store_id = self._block_id(seq >> SEQ_BLOCK_BITS)
        batch = self._changed()
        cost = len(body) + ROW_OVERHEAD
        batch.cost += cost
        self.backlog_bytes += cost
        if self.backlog_bytes > self.flow_high and not self.flowing:
            self._flow(True)
        batch.inserts[store_id] = [
            store_id,
            queue_id,
            seq,
            0,
            exchange,
            routing_key,
            header,
            body,
            int(transient),
            expires_at,
            published_at,
            len(body),
            meta,
            0,
        ]
        return store_id

    def save_dedup(self, queue_id: int, key: str, expires_at: float) -> None:
        """Queued in the current batch."""
        self._changed().ops.append(SaveDedup(queue_id, key, expires_at))

    def delete_dedup(self, queue_id: int, key: str) -> None:
        """Queued in the current batch."""
        self._changed().ops.append(DeleteDedup(queue_id, key))

    def set_delivery_count(self, store_id: int, count: int, failed: int = 0) -> None:
        """Updates an insert still in the batch, else queues an UPDATE (both counts)."""
        batch = self._changed()
        row = batch.inserts.get(store_id)
        if row is not None:
            row[3] = count
            row[13] = failed
        else:
            batch.counts[store_id] = (count, failed)

    def set_available_at(self, store_id: int, available_at: float) -> None:
        """Queued in the current batch (an UPDATE after the batch's inserts)."""
        self._changed().delays[store_id] = available_at

    def remove_message(self, store_id: int) -> None:
        """Drops an insert still in the batch, else queues a DELETE."""
        batch = self._changed()
        if batch.inserts.pop(store_id, None) is None:
            batch.counts.pop(store_id, None)
            batch.deletes.add(store_id)
        if self._reads_in_flight:  # not in an answer still to come
            self._removed_since.add(store_id)

    def _delete_range(self, queue_id: int, low: int, high: int) -> None:
        """Forget a queue's messages with ``low < seq <= high``: at once for those not
        written yet, in the background (chunks, recorded durably) for the rest, so a
        large deletion never stalls other writes."""
        batch = self._changed()
        for store_id in [
            i for i, row in batch.inserts.items() if row[1] == queue_id and low < row[2] <= high
        ]:
            del batch.inserts[store_id]
        op = DeleteRange(queue_id, low, high)
        batch.ops.append(op)
        if self._reads_in_flight:
            self._ranges_since.append(op)

    def remove_queue(self, queue_id: int) -> None:
        """A range deletion of all its seqs (done in the background, in chunks) and of
        its deduplication keys."""
        self._delete_range(queue_id, 0, ALL_SEQS)
        self._changed().ops.append(DeleteQueueDedup(queue_id))

    def remove_range(self, queue_id: int, below_seq: int) -> None:
        """A range deletion, done in the background in chunks."""
        self._delete_range(queue_id, 0, below_seq)

    def find_offset(self, queue_id: int, when: float) -> int | None:
        """Looks at committed rows only (a stream asks only about messages older than
        its in-memory tail). Blocks: a stream's consumers use :meth:`request_offset`."""
        self._check_thread("find_offset")
        assert self._reader is not None
        return self._query_offset(self._reader, queue_id, when)

    def request_offset(self, queue_id: int, when: float, answer: Callable[[int | None], None]) -> None:
        """:meth:`find_offset` on the reader thread, ``answer(seq)`` on the loop."""
        self._ask(lambda db: self._query_offset(db, queue_id, when), answer)

    @staticmethod
    def _query_offset(db: Connection, queue_id: int, when: float) -> int | None:
        row = db.execute(
            "SELECT min(seq) FROM messages WHERE queue_id=? AND published_at>=?", (queue_id, when)
        ).fetchone()
        return row[0] if row else None

    def remove_paged(self, queue_id: int, after_seq: int, upto_seq: int) -> None:
        """A range deletion, done in the background in chunks."""
        self._delete_range(queue_id, after_seq, upto_seq)

    def when_durable(self, callback: Callback) -> None:
        """The callback rides with the current batch and runs once it is committed."""
        self._changed().callbacks.append(callback)

    def batch_token(self) -> object:
        return self._batch  # replaced by a new batch when this one is handed to the writer

    @property
    def pending(self) -> bool:
        """Whether a batch is being written or changes wait for the next one."""
        return self._writing or bool(self._batch)

    def _submit(self) -> None:
        self._scheduled = False
        if self._writing or not self._batch or time.monotonic() < self._retry_at:
            return
        batch, self._batch = self._batch, Batch()
        self._writing = True
        self._inflight = batch
        self._jobs.put(batch)

    def _stalled(self, batch: Batch, reason: str) -> None:
        """The writer could not write ``batch`` (no room): keep it, with every change
        made since, and try again in :data:`RETRY` seconds."""
        self._writing = False
        self._inflight = None
        batch.absorb(self._batch)
        self._batch = batch
        self._retry_at = time.monotonic() + RETRY
        assert self._loop is not None
        self._loop.call_later(RETRY, self._retry)
        if self.stalled is None:
            self.stalled = reason
            log.error(
                "store %s: cannot write (%s); publishers are blocked until there is room", self.name, reason
            )
            if self.on_stall is not None:
                self.on_stall(True)

    def _retry(self) -> None:
        self._retry_at = 0.0  # the loop's timer may run a hair before RETRY has passed
        self._submit()

    def _flow(self, active: bool) -> None:
        self.flowing = active
        if self.on_flow is not None:
            self.on_flow(active)

    def _written(self, batch: Batch, error: str | None) -> None:
        self._writing = False
        self._inflight = None
        self.backlog_bytes -= batch.cost
        if self.flowing and self.backlog_bytes < self.flow_low:
            self._flow(False)
        if self.stalled is not None and error is None:
            log.warning("store %s: writing again", self.name)
            self.stalled = None
            if self.on_stall is not None:
                self.on_stall(False)
        if error is not None and self.failed is None:
            self.failed = error
        for callback in batch.callbacks:
            callback(error is None)
        if self._batch:
            self._submit()

    # -- writer thread --------------------------------------------------------------
    # -- writer thread --------------------------------------------------------------
    def _writer(self) -> None:
        db = self._db
        assert db is not None and self._loop is not None
        last_vacuum = time.monotonic()
        dirty = False  # written since the space was last all given back
        backlog = False  # the last reclaim left freed pages behind
        deleting = True  # background range deletions may be pending
        while True:
            try:
                batch = self._jobs.get(timeout=0.01 if backlog or deleting else self._idle_every)
            except queue_mod.Empty:  # idle: delete and give freed space back, in slices
                try:
                    self._idle(db)
                    deleting = self._delete_chunk(db)
                except Fenced as exc:
                    self._report(self._lose_session, str(exc))
                    return
                except self._errors as exc:
                    if self._lost_session(exc):
                        self._report(self._lose_session, str(exc))
                        return
                    log.error("store %s: background deletion failed: %s", self.name, exc)
                    deleting = False
                dirty = dirty or deleting
                if dirty and not deleting:
                    last_vacuum = time.monotonic()
                    backlog = dirty = self._reclaim(db)
                continue
            if batch is None:
                return
            error = None
            try:
                self._write_batch(db, batch)
            except NoRoom as exc:
                deleting = True  # the rest of the batch may have recorded range deletions
                if not self._report(self._stalled, batch, str(exc)):
                    return
                continue
            except self._errors as exc:
                if self._lost_session(exc):
                    self._report(self._lose_session, str(exc), batch)
                    return
                try:
                    db.execute("ROLLBACK")
                except self._errors:
                    pass
                if self._out_of_room(exc):
                    if not self._report(self._stalled, batch, str(exc)):
                        return
                    continue
                error = f"store {self.name}: {exc}"
                log.error("write failed: %s", error)
            if error is None:
                deleting = deleting or any(isinstance(op, DeleteRange) for op in batch.ops)
            now = time.monotonic()
            dirty = dirty or error is None
            if error is None and now - last_vacuum > self._idle_every:
                last_vacuum = now
                backlog = self._reclaim(db, busy=True)
            if not self._report(self._written, batch, error):
                return

    def _lose_session(self, reason: str, batch: Batch | None = None) -> None:
        """On the loop: the writer stopped because the session is gone. Nothing more
        is written; callbacks waiting for durability are dropped (their clients are
        about to be disconnected), and ``on_fenced`` runs once."""
        self._writing = False
        self._inflight = None
        self._thread = None
        if self.fenced is not None:
            return
        self.fenced = reason
        self.failed = self.failed or reason
        log.error("store %s: lost the database session: %s", self.name, reason)
        if self.on_fenced is not None:
            self.on_fenced(reason)

    def _report(self, callback: Callable[..., None], *args: object) -> bool:
        """Run ``callback(*args)`` on the event loop; False once the loop is closed
        (shutdown: the writer stops)."""
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:
            return False
        return True

    @staticmethod
    def _write(db: Connection, batch: Batch) -> int:
        """Write ``batch`` in one transaction; the highest change-log epoch it wrote
        (:class:`~.ops.LogChange`, a cluster node's), 0 if none."""
        db.execute("BEGIN")
        if batch.inserts:
            db.executemany(
                "INSERT INTO messages (id, queue_id, seq, delivery_count, exchange, routing_key, header, "
                "body, transient, expires_at, published_at, size, meta, failed_count) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                batch.inserts.values(),
            )
        if batch.counts:
            db.executemany(
                "UPDATE messages SET delivery_count=?, failed_count=? WHERE id=?",
                [(c, f, i) for i, (c, f) in batch.counts.items()],
            )
        if batch.delays:  # after the inserts: a row inserted in this batch gets it too
            db.executemany(
                "UPDATE messages SET available_at=? WHERE id=?", [(t, i) for i, t in batch.delays.items()]
            )
        if batch.deletes:
            db.executemany("DELETE FROM messages WHERE id=?", [(i,) for i in batch.deletes])
        if batch.scheduled:
            # a replaced row is deleted, then inserted again
            db.executemany("DELETE FROM scheduled WHERE id=?", [(i,) for i in batch.scheduled])
            rows = [
                (
                    r.store_id,
                    r.vhost,
                    r.job_id,
                    r.due_at,
                    r.exchange,
                    r.routing_key,
                    r.header,
                    r.body,
                    r.meta,
                    r.schedule,
                    int(r.transient),
                )
                for r in batch.scheduled.values()
                if r is not None
            ]
            if rows:
                db.executemany(
                    "INSERT INTO scheduled (id, vhost, job_id, due_at, exchange, routing_key, header, body, "
                    "meta, schedule, transient) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                    rows,
                )
        epoch = 0
        for op in batch.ops:
            written = write_op(db, op)
            if written is not None and written > epoch:
                epoch = written
        db.execute("COMMIT")
        return epoch

    @classmethod
    def _delete_chunk(cls, db: Connection, limit: int | None = DELETE_CHUNK) -> bool:
        """Work on the oldest pending range deletion, ``limit`` rows at most (None: all),
        in its own transaction; whether any range deletion is still pending."""
        row = db.execute(
            f"SELECT {cls._order}, queue_id, low, high FROM pending_deletes ORDER BY {cls._order} LIMIT 1"
        ).fetchone()
        if row is None:
            return False
        order, queue_id, low, high = row
        db.execute("BEGIN")
        done = db.execute(
            "DELETE FROM messages WHERE id IN (SELECT id FROM messages WHERE queue_id=? "
            "AND seq>? AND seq<=? LIMIT ?)",
            (queue_id, low, high, limit or ALL_SEQS),
        ).rowcount
        if limit is None or done < limit:
            db.execute(f"DELETE FROM pending_deletes WHERE {cls._order}=?", (order,))
        db.execute("COMMIT")
        return True

    def close(self) -> None:
        """Hand the current batch to the writer (its callbacks may never run: the loop
        is stopping), wait up to 30 s for the writer thread, then (unless a write
        failed) :meth:`_closing`, and close the connections."""
        if self._thread is not None:
            if self._batch:
                batch, self._batch = self._batch, Batch()
                if self.stalled is not None and batch.inserts:
                    log.warning(
                        "store %s: stopping while it cannot write: %d messages that were never "
                        "confirmed may not be kept (%s)",
                        self.name,
                        len(batch.inserts),
                        self.stalled,
                    )
                self._jobs.put(batch)  # its callbacks are dropped: the loop is stopping
            self._jobs.put(None)
            # fenced (a cluster node whose lease ran out): the writer may hang on a dead
            # session, and nothing it would write may be written now: do not wait for it
            self._thread.join(30 if self.fenced is None else 0.5)
            self._thread = None
            if self._db is not None and not self.failed and self.fenced is None:
                try:
                    self._closing(self._db)
                except self._errors as exc:
                    log.warning("store %s: cannot mark a clean shutdown: %s", self.name, exc)
        if self._read_thread is not None:
            self._reads.put(None)  # unanswered reads are dropped: the loop is stopping
            self._read_thread.join(30)
            self._read_thread = None
        for db in (self._db, self._reader, self._read_db):
            if db is not None:
                try:
                    db.close()
                except self._errors:
                    pass
        self._db = self._reader = self._read_db = None
