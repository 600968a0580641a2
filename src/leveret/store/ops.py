"""The non-message changes a batch carries (definitions, dedup keys, counters, range
deletions), one small frozen class per kind, and the SQL each becomes.

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


BatchOp: TypeAlias = (
    SaveDefinition | DeleteDefinition | DeleteRange | SaveDedup | DeleteDedup | DeleteQueueDedup | SetCounter
)


def write_op(db: Connection, op: BatchOp) -> None:
    """Execute ``op`` inside the writer's open transaction. TypeError for an object
    that is none of the kinds above."""
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
    else:
        raise TypeError(f"not a batch operation: {op!r}")
