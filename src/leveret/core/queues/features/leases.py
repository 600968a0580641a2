"""Leased consumption: acknowledgement that outlives connections and channels.

AMQP ties a delivery tag to one channel, so a message read by one process cannot be
acknowledged by another. Spark needs exactly that: the driver plans a micro-batch, an
executor (another process, any number of times after a crash) reads it, and the driver
acknowledges it only when the batch is committed. A lease gives a queue's messages to
a named consumer group under sequence numbers:

- ``acquire(max)`` takes up to ``max`` ready messages and numbers them ``start`` …
  ``end - 1`` (they count as unacknowledged, delivery count raised);
- any connection may read a range of held sequence numbers again (``read``);
- ``ack_upto(n, low)`` / ``ack(seqs)`` remove them for good; ``release(seqs)`` returns them;
- a lease not acknowledged within ``ttl`` seconds returns its messages to the queue with
  ``redelivered`` set, as failed deliveries (its holder never settled them: the queue's
  delivery limit and dead-lettering apply, so a poison message ends in the DLQ); so does
  ``lease.release`` unless it says ``"failed": false`` (a plain return).

Sequence numbers only grow; the next one is kept in the store for durable queues, so
they keep growing across restarts (messages held at a crash come back as redelivered
and are leased again under new numbers). Over AMQP this is reached through the
``amq.leveret.api`` exchange (:mod:`leveret.core.api`) and consume arguments
``x-lease-group``/``x-lease-from``/``x-lease-to``.

A classic queue keeps its leases by consumer group in a :class:`Leases` (no argument
turns them on).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ...clock import Timer
    from ...metrics import QueueCounters
    from ..entry import QueuedMessage
    from ..host import QueueHost

DEFAULT_TTL = 300.0  # seconds


class LeasedQueue(Protocol):
    """What a lease needs of its queue (:class:`..classic.ClassicQueue` is one)."""

    host: QueueHost
    counters: QueueCounters

    def take_for_lease(self) -> QueuedMessage | None:
        """The head message, taken as for a delivery, or None when empty."""

    def save_lease(self, lease: Lease) -> None:
        """Persist ``lease``'s next sequence number."""

    def ack(self, entry: QueuedMessage) -> None:
        """``entry`` is acknowledged: it leaves the queue and the store."""

    def requeue(self, entries: list[QueuedMessage], failed: bool = False) -> None:
        """``entries`` come back, redelivered (``failed``: counted as failures)."""


class Lease:
    """The messages of ``queue`` held by consumer ``group`` (only classic queues lease:
    :meth:`..base.Queue.lease` raises PreconditionFailed for the other types).
    ``held`` maps a sequence number to the entry and when it was leased (epoch
    seconds); ``ttl`` is in seconds."""

    def __init__(self, queue: LeasedQueue, group: str, next_seq: int = 1) -> None:
        self.queue = queue
        self.group = group
        self.next_seq = next_seq
        self.ttl = DEFAULT_TTL
        self.held: OrderedDict[int, tuple[QueuedMessage, float]] = OrderedDict()
        self._timer: Timer | None = None

    def acquire(self, maximum: int, ttl: float | None = None) -> tuple[int, int]:
        """Lease up to ``maximum`` ready messages under sequence numbers ``start`` …
        ``end - 1``; returns ``(start, end)`` (equal when none was ready). ``ttl`` (seconds)
        replaces the lease's TTL for every held message."""
        queue = self.queue
        if ttl is not None:
            self.ttl = ttl
        start = self.next_seq
        now = queue.host.clock.time()
        while len(self.held) < 10_000_000 and self.next_seq - start < maximum:
            entry = queue.take_for_lease()
            if entry is None:
                break
            self.held[self.next_seq] = (entry, now)
            self.next_seq += 1
        if self.next_seq != start:
            queue.save_lease(self)
            self._arm()
        return start, self.next_seq

    def read(self, start: int, end: int) -> list[tuple[int, QueuedMessage]]:
        """Held messages with ``start <= seq < end``, in order."""
        return [(seq, entry) for seq, (entry, _) in self.held.items() if start <= seq < end]

    def ack_upto(self, upto: int, low: int = 0) -> int:
        """Acknowledge the held leases ``low <= seq <= upto``; returns how many."""
        return self.ack([seq for seq in itertools.takewhile(lambda s: s <= upto, self.held) if seq >= low])

    def ack(self, seqs: list[int]) -> int:
        """Acknowledge the held leases among ``seqs`` (others are ignored): their
        messages leave the queue and the store; returns how many."""
        taken = [self.held.pop(s)[0] for s in seqs if s in self.held]
        for entry in taken:
            self.queue.ack(entry)
        self.queue.counters.acknowledged += len(taken)
        return len(taken)

    def release(self, seqs: list[int], failed: bool = False) -> int:
        """Return the held leases among ``seqs`` to the queue as redelivered; returns
        how many. ``failed`` (an expired lease, whose holder never settled it, or a
        ``lease.release`` that does not say otherwise: a Spark query that failed gives
        its batches back so) counts toward the delivery limit; else a plain return."""
        taken = [self.held.pop(s)[0] for s in seqs if s in self.held]
        self.queue.requeue(taken, failed)
        return len(taken)

    def release_all(self) -> None:
        """The queue is going away or the broker stops: hand everything back."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.release(list(self.held))

    def _arm(self) -> None:
        if self._timer is None and self.held:
            oldest = next(iter(self.held.values()))[1]
            delay = oldest + self.ttl - self.queue.host.clock.time()
            self._timer = self.queue.host.clock.call_later(delay, self._expire)

    def _expire(self) -> None:
        """Return messages leased longer than ``ttl`` ago (leased in order, so oldest
        first)."""
        self._timer = None
        deadline = self.queue.host.clock.time() - self.ttl
        expired = [seq for seq, (_, leased_at) in self.held.items() if leased_at <= deadline]
        self.release(expired, failed=True)
        self._arm()


class Leases:
    """The leases of one queue, by consumer group."""

    __slots__ = ("_by_group", "_next_seqs")

    def __init__(self) -> None:
        self._by_group: dict[str, Lease] = {}
        self._next_seqs: dict[str, int] = {}  # next seq of leases recovered from the store

    def get(self, queue: LeasedQueue, group: str) -> Lease:
        """The lease of ``group`` on ``queue``, created on first use."""
        lease = self._by_group.get(group)
        if lease is None:
            lease = self._by_group[group] = Lease(queue, group, self._next_seqs.get(group, 1))
        return lease

    def restore(self, group: str, next_seq: int) -> None:
        """At start-up: ``group``'s lease, once made, numbers on from ``next_seq``."""
        self._next_seqs[group] = next_seq

    def release_all(self) -> None:
        """The queue is going away or the broker stops: every lease hands its messages
        back."""
        for lease in self._by_group.values():
            lease.release_all()

    def __iter__(self) -> Iterator[Lease]:
        return iter(self._by_group.values())

    def __len__(self) -> int:
        return len(self._by_group)
