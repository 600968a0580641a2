"""The non-message changes a batch carries (definitions, dedup keys, counters, range
deletions; a cluster node's change log and transient definitions), one small frozen
class per kind, and the SQL each becomes.

Messages themselves ride in a batch's own tables (inserts, delivery counts, deletes);
these are the rest, written in the order they were made. :func:`write_op` knows every
kind and raises TypeError for anything else: no kind falls through to another's SQL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    from .batched import Connection


@dataclass(frozen=True, slots=True)
class SaveDefinition:
    """Create or replace a definition; ``data`` is its encoded AMQP field table."""

    kind: str
    vhost: str
    name: str
    data: bytes


@dataclass(frozen=True, slots=True)
class DeleteDefinition:
    """Forget a definition."""

    kind: str
    vhost: str
    name: str


@dataclass(frozen=True, slots=True)
class DeleteRange:
    """Forget a queue's messages with ``low < seq <= high``: recorded in
    ``pending_deletes`` and done in chunks by the writer thread in the background."""

    queue_id: int
    low: int
    high: int

    def covers(self, queue_id: int, seq: int) -> bool:
        """Whether the message ``seq`` of ``queue_id`` is in the range."""
        return queue_id == self.queue_id and self.low < seq <= self.high


@dataclass(frozen=True, slots=True)
class SaveDedup:
    """Remember a deduplication key (``expires_at`` epoch seconds, 0: never)."""

    queue_id: int
    key: str
    expires_at: float


@dataclass(frozen=True, slots=True)
class DeleteDedup:
    """Forget a deduplication key."""

    queue_id: int
    key: str


@dataclass(frozen=True, slots=True)
class DeleteQueueDedup:
    """Forget every deduplication key of a deleted queue."""

    queue_id: int


@dataclass(frozen=True, slots=True)
class SetCounter:
    """Set a counter of the ``meta`` table (``next_queue_id``)."""

    key: str
    value: int


@dataclass(frozen=True, slots=True)
class LogChange:
    """A cluster node's definition change, for the other nodes (PostgreSQL only): a row
    of ``changes`` (``data`` the encoded field table, None: deleted) and a NOTIFY on
    ``channel``. The row's epoch is taken under a transaction-level advisory lock
    (``lock_key``, the cluster's), so epochs become visible in their order: a reader
    that saw epoch N has seen every change before it."""

    node: str
    kind: str
    vhost: str
    name: str
    data: bytes | None
    channel: str
    lock_key: str


@dataclass(frozen=True, slots=True)
class SaveTransient:
    """Create or replace a cluster node's non-durable definition (PostgreSQL only:
    ``transient_definitions``, deleted with the node). Under the change log's lock
    (``lock_key``) as a take-over is, which deletes such rows: taken before the row,
    in both, so the two never deadlock."""

    node: str
    kind: str
    vhost: str
    name: str
    data: bytes
    lock_key: str


@dataclass(frozen=True, slots=True)
class DeleteTransient:
    """Forget a non-durable definition (under the change log's lock, as SaveTransient)."""

    kind: str
    vhost: str
    name: str
    lock_key: str


BatchOp: TypeAlias = (
    SaveDefinition
    | DeleteDefinition
    | DeleteRange
    | SaveDedup
    | DeleteDedup
    | DeleteQueueDedup
    | SetCounter
    | LogChange
    | SaveTransient
    | DeleteTransient
)

#: The change log's lock (PostgreSQL; a transaction's; parameter: the cluster name).
LOCK_CHANGES_SQL = "SELECT pg_advisory_xact_lock(hashtext('leveret-changes'), hashtext(?))"
#: The change log's insert (PostgreSQL): the lock, then the row, in one round trip.
#: Also used by the cluster catalog's own writes (leveret.cluster.catalog).
LOG_CHANGE_SQL = (
    "INSERT INTO changes (node, kind, vhost, name, data) SELECT ?, ?, ?, ?, ? FROM "
    "(SELECT pg_advisory_xact_lock(hashtext('leveret-changes'), hashtext(?)), pg_notify(?, '')) AS l "
    "RETURNING epoch"
)


def write_op(db: Connection, op: BatchOp) -> int | None:
    """Execute ``op`` inside the writer's open transaction: the epoch of a
    :class:`LogChange`, None for the others. TypeError for an object that is none of
    the kinds above."""
    if isinstance(op, SaveDefinition):
        # an upsert keeps the row (and its order: load() returns definitions in the
        # order they were first saved); delete + insert would move it last
        db.execute(
            "INSERT INTO definitions (kind, vhost, name, data) VALUES (?,?,?,?) ON CONFLICT (kind, "
            "vhost, name) DO UPDATE SET data=excluded.data",
            (op.kind, op.vhost, op.name, op.data),
        )
    elif isinstance(op, DeleteDefinition):
        db.execute(
            "DELETE FROM definitions WHERE kind=? AND vhost=? AND name=?", (op.kind, op.vhost, op.name)
        )
    elif isinstance(op, DeleteRange):
        db.execute(
            "INSERT INTO pending_deletes (queue_id, low, high) VALUES (?,?,?)", (op.queue_id, op.low, op.high)
        )
    elif isinstance(op, DeleteQueueDedup):
        db.execute("DELETE FROM dedup WHERE queue_id=?", (op.queue_id,))
    elif isinstance(op, SaveDedup):
        # saved again: the newest (delete + insert moves it last, as load() expects)
        db.execute("DELETE FROM dedup WHERE queue_id=? AND key=?", (op.queue_id, op.key))
        db.execute(
            "INSERT INTO dedup (queue_id, key, expires_at) VALUES (?,?,?)",
            (op.queue_id, op.key, op.expires_at),
        )
    elif isinstance(op, DeleteDedup):
        db.execute("DELETE FROM dedup WHERE queue_id=? AND key=?", (op.queue_id, op.key))
    elif isinstance(op, SetCounter):
        db.execute(
            "INSERT INTO meta (key, value) VALUES (?,?) ON CONFLICT (key) DO UPDATE SET value=excluded.value",
            (op.key, op.value),
        )
    elif isinstance(op, LogChange):
        row = db.execute(
            LOG_CHANGE_SQL, (op.node, op.kind, op.vhost, op.name, op.data, op.lock_key, op.channel)
        ).fetchone()
        return int(row[0])
    elif isinstance(op, SaveTransient):
        db.execute(LOCK_CHANGES_SQL, (op.lock_key,))
        db.execute(
            "INSERT INTO transient_definitions (kind, vhost, name, node, data) VALUES (?,?,?,?,?) "
            "ON CONFLICT (kind, vhost, name) DO UPDATE SET node=excluded.node, data=excluded.data",
            (op.kind, op.vhost, op.name, op.node, op.data),
        )
    elif isinstance(op, DeleteTransient):
        db.execute(LOCK_CHANGES_SQL, (op.lock_key,))
        db.execute(
            "DELETE FROM transient_definitions WHERE kind=? AND vhost=? AND name=?",
            (op.kind, op.vhost, op.name),
        )
    else:
        raise TypeError(f"not a batch operation: {op!r}")
    return None
