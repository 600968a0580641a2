"""The store interface core depends on."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

#: Above every seq a queue uses: seqs are below 2**62.
ALL_SEQS = 2**62
#: A queue may split its seqs into blocks of 2**54 (a priority queue gives each priority
#: level one, ``leveret.core.queues.priority_backlog``): the store counts a queue's
#: messages per block at start-up and may keep each block's rows together.
SEQ_BLOCK_BITS = 54


class StoreError(RuntimeError):
    """The store cannot be opened or written; the message names the file."""


@dataclass(slots=True)
class StoredMessage:
    """A persistent message of a durable queue as recovered from disk."""

    store_id: int
    queue_id: int
    seq: int
    delivery_count: int
    exchange: str
    routing_key: str
    header: bytes
    body: bytes
    expires_at: float = 0.0  # epoch seconds; 0: never
    meta: str | None = None  # see leveret.core.message.Message.meta
    #: epoch seconds before which it may not be delivered (a redelivery back-off); 0: now
    available_at: float = 0.0
    #: the failed deliveries among ``delivery_count`` (RabbitMQ 4.3's delivery-count)
    failed_count: int = 0


@dataclass(slots=True)
class ScheduledRow:
    """A message the broker holds until it is due (a delayed or scheduled message):
    ``store_id`` (the store's), ``job_id`` (the user's handle), ``due_at`` (epoch
    seconds), the address and message to publish then, ``schedule`` (JSON: what
    happens after, see leveret.core.scheduler), ``transient`` (forgotten at restart)."""

    store_id: int
    vhost: str
    job_id: str
    due_at: float
    exchange: str
    routing_key: str
    header: bytes
    body: bytes
    meta: str | None
    schedule: str
    transient: bool = False

    def key(self) -> tuple[float, int]:
        """The order in which rows fall due: ``(due_at, store_id)``."""
        return (self.due_at, self.store_id)


@dataclass
class Snapshot:
    """What a store holds, as read at start-up.

    ``definitions`` maps a kind (``vhost``, ``user``, ``exchange``, ``queue``,
    ``binding``) to ``(vhost, name, data)`` rows in the order they were first saved;
    ``queues`` maps a queue id to ``(message count, highest seq, body bytes)``. Messages themselves
    are read per queue, on demand, with :meth:`Store.read_queue`.
    """

    definitions: dict[str, list[tuple[str, str, dict]]] = field(default_factory=dict)
    #: Scheduled (delayed) messages kept, read with :meth:`Store.read_scheduled`.
    scheduled: int = 0
    queues: dict[int, tuple[int, int, int]] = field(default_factory=dict)
    #: Deduplication caches: queue id -> [(key, expires_at)], oldest first.
    dedup: dict[int, list[tuple[str, float]]] = field(default_factory=dict)


Callback = Callable[[bool], None]


class Store(ABC):
    """Durable definitions and messages. Methods are called on the event loop and must
    not block it; writes become durable in groups, in call order.

    Reads answered by callback, as :meth:`when_durable` is: :meth:`request_queue` (a
    queue's page-in), :meth:`request_scheduled` (a scheduler window) and
    :meth:`request_offset` (a stream start by timestamp) read on the store's reader
    thread and call ``answer`` on the loop, in the order asked. The blocking reads
    (:meth:`load`, :meth:`count_blocks`, :meth:`read_queue`, :meth:`find_offset`,
    :meth:`read_scheduled` …) serve start-up recovery, which runs before any listener
    opens, and an operator's look at a queue (browse, hold) or the scheduler's jobs; a
    queue's sweep of expired paged-out messages (:meth:`read_expired`,
    :meth:`next_expiry`, once per TTL timer, never per message) still reads on the
    loop."""

    #: Definitions saved or deleted so far: a protocol adapter compares it before and
    #: after a declare to know whether its -ok must wait for :meth:`when_durable`.
    definition_changes = 0

    @abstractmethod
    def load(self) -> Snapshot:
        """Read everything (start-up; may block). Raises StoreError naming the file."""

    @abstractmethod
    def save_definition(self, kind: str, vhost: str, name: str, data: dict) -> None:
        """Create or replace a definition; ``data`` is an AMQP field table."""

    @abstractmethod
    def delete_definition(self, kind: str, vhost: str, name: str) -> None:
        """Forget a definition (nothing happens if there is none)."""

    @abstractmethod
    def new_queue_id(self) -> int:
        """A queue id never used before in this store."""

    @abstractmethod
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
        """Queue a message's write; returns its store id (> 0). ``header`` is the
        message's encoded form and ``meta`` what else it carries (opaque text, None in
        the common case). A ``transient`` one is only paged out of memory and is deleted
        at the next start; ``expires_at`` is its TTL deadline and ``published_at``
        (streams) its append time, epoch seconds."""

    @abstractmethod
    def remove_range(self, queue_id: int, below_seq: int) -> None:
        """Forget a queue's messages with seq <= ``below_seq`` (stream retention)."""

    @abstractmethod
    def find_offset(self, queue_id: int, when: float) -> int | None:
        """The lowest seq of a queue's messages published at or after ``when`` (epoch
        seconds), None if there is none."""

    @abstractmethod
    def request_offset(self, queue_id: int, when: float, answer: Callable[[int | None], None]) -> None:
        """:meth:`find_offset`, answered by ``answer(seq)`` on the loop."""

    @abstractmethod
    def request_queue(
        self,
        queue_id: int,
        after_seq: int,
        limit: int,
        upto_seq: int,
        answer: Callable[[list[StoredMessage]], None],
    ) -> None:
        """:meth:`read_queue`, answered by ``answer(rows)`` on the loop, as of the
        answer: a row deleted since the request (:meth:`remove_message`, a range
        deletion) is left out."""

    @abstractmethod
    def read_queue(
        self, queue_id: int, after_seq: int, limit: int, upto_seq: int = ALL_SEQS
    ) -> list[StoredMessage]:
        """Up to ``limit`` messages of a queue with ``after_seq < seq <= upto_seq``, in
        seq order, including writes not yet on disk."""

    @abstractmethod
    def count_blocks(self, queue_id: int) -> dict[int, tuple[int, int, int]]:
        """At start-up: a queue's messages grouped by seq block (``seq >>``
        :data:`SEQ_BLOCK_BITS`): block -> (count, highest seq, body bytes). Raises
        StoreError naming the file."""

    @abstractmethod
    def remove_paged(self, queue_id: int, after_seq: int, upto_seq: int) -> None:
        """Forget a queue's messages with ``after_seq < seq <= upto_seq`` (purge of a
        paged-out tail)."""

    @abstractmethod
    def save_dedup(self, queue_id: int, key: str, expires_at: float) -> None:
        """Remember a deduplication key of a durable queue (expires_at 0: never)."""

    @abstractmethod
    def delete_dedup(self, queue_id: int, key: str) -> None:
        """Forget a deduplication key (evicted from the cache)."""

    @abstractmethod
    def set_delivery_count(self, store_id: int, count: int, failed: int = 0) -> None:
        """Record that the message was delivered ``count`` times, ``failed`` of which
        failed (redelivery state: the acquired count and the delivery limit's count)."""

    @abstractmethod
    def set_available_at(self, store_id: int, available_at: float) -> None:
        """A requeued message waits for its redelivery back-off until ``available_at``
        (epoch seconds): kept, so that a restart does not redeliver it early."""

    def read_expired(
        self, queue_id: int, after_seq: int, upto_seq: int, now: float, limit: int
    ) -> list[StoredMessage]:
        """Up to ``limit`` committed messages of the queue with ``after_seq < seq <=
        upto_seq`` whose expiry (epoch seconds) is at or before ``now``, the earliest
        first; and :meth:`next_expiry` the earliest expiry after ``now`` (None: none).
        The defaults find nothing."""
        return []

    def next_expiry(self, queue_id: int, after_seq: int, upto_seq: int, now: float) -> float | None:
        """See :meth:`read_expired`."""
        return None

    @abstractmethod
    def remove_message(self, store_id: int) -> None:
        """Acknowledged, dead-lettered, expired or purged: forget it."""

    @abstractmethod
    def remove_queue(self, queue_id: int) -> None:
        """Forget every message of a deleted queue."""

    @abstractmethod
    def when_durable(self, callback: Callback) -> None:
        """Call ``callback(True)`` on the loop once every write queued so far is on
        disk (fsynced), or ``callback(False)`` if writing them failed."""

    # -- scheduled messages (leveret.core.scheduler) --------------------------------------
    def new_scheduled_id(self) -> int:
        """A store id for a new scheduled row."""
        raise NotImplementedError

    def save_scheduled(self, row: ScheduledRow) -> None:
        """Insert or replace ``row`` (by its store id) with the current batch."""
        raise NotImplementedError

    def remove_scheduled(self, store_id: int) -> None:
        """Forget a scheduled row, with the current batch."""
        raise NotImplementedError

    def read_scheduled(self, after: tuple[float, int], limit: int) -> list[ScheduledRow]:
        """Up to ``limit`` rows whose :meth:`ScheduledRow.key` is above ``after``, in
        that order, counting changes not yet on disk."""
        raise NotImplementedError

    def request_scheduled(
        self, after: tuple[float, int], limit: int, answer: Callable[[list[ScheduledRow]], None]
    ) -> None:
        """:meth:`read_scheduled`, answered by ``answer(rows)`` on the loop, as of the
        answer (changes made while the read was on its way count)."""
        raise NotImplementedError

    def find_scheduled(self, job_id: str) -> ScheduledRow | None:
        """The row of ``job_id``, counting changes not yet on disk."""
        raise NotImplementedError

    @property
    def local(self) -> Store:
        """What a publish another cluster node forwarded here waits for: this store. A
        cluster node's confirms wrapper (``leveret.cluster.confirms``), which also waits
        for this node's own forwards, returns the store it wraps: an owner's confirm
        waiting on forwards the other way would deadlock two nodes forwarding to each
        other."""
        return self

    def batch_token(self) -> object:
        """What identifies the group of writes being gathered now: callbacks given to
        :meth:`when_durable` while it stays the same (``is``) may share one call. The
        default is a new token each time (never shared)."""
        return object()

    @property
    @abstractmethod
    def pending(self) -> bool:
        """Whether writes are queued or in flight."""

    @abstractmethod
    def close(self) -> None:
        """Write what is queued, then close (blocking)."""
