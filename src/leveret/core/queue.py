"""Queues: ready messages in FIFO order, consumers served round-robin.

A queue hands a message to the next consumer whose ``can_accept()`` is true (prefetch
window open, channel flowing, socket writable) and forgets it: the consumer's channel
tracks it until ack, reject or close (AMQP 0-9-1 §3.1.4, basic.consume / basic.ack).
A requeued message returns to its original position with ``redelivered`` set, as in
RabbitMQ.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

from .message import Message

if TYPE_CHECKING:
    from ..store import Store


PAGE_IN_BATCH = 1000  # messages read from the store at a time
DEFAULT_IN_MEMORY = 50_000  # ready messages kept in memory before paging out
LAZY_IN_MEMORY = 1_000  # the same for x-queue-mode=lazy


def in_memory_limit(arguments: dict) -> int:
    """Ready messages a queue keeps in memory: ``x-max-in-memory-length`` if given,
    else a small window for ``x-queue-mode: lazy`` (RabbitMQ's lazy queues), else
    DEFAULT_IN_MEMORY. Only applies to a broker with a store (``data_dir``)."""
    limit = arguments.get("x-max-in-memory-length")
    if isinstance(limit, int) and not isinstance(limit, bool) and limit >= 0:
        return limit
    if arguments.get("x-queue-mode") in ("lazy", b"lazy"):
        return LAZY_IN_MEMORY
    return DEFAULT_IN_MEMORY


class QueuedMessage:
    """A message's place in one queue: ``seq`` orders it, ``delivery_count`` counts the
    deliveries so far (0 before the first)."""

    __slots__ = ("message", "seq", "redelivered", "delivery_count", "store_id")

    def __init__(self, message: Message, seq: int, store_id: int = 0) -> None:
        self.message = message
        self.seq = seq
        self.redelivered = False
        self.delivery_count = 0
        self.store_id = store_id  # > 0 while the message is in the store

    def __lt__(self, other: QueuedMessage) -> bool:
        return self.seq < other.seq


class Consumer(Protocol):
    """What a queue needs of a consumer; the protocol layer implements it."""

    tag: str
    exclusive: bool

    def can_accept(self) -> bool: ...

    def deliver(self, queue: Queue, entry: QueuedMessage) -> None: ...

    def cancel_by_broker(self) -> None:
        """The queue is gone: RabbitMQ's consumer cancel notification."""


class Queue:
    """One queue of a virtual host.

    ``exclusive_owner`` is the connection that declared an exclusive queue (opaque to
    core); ``arguments`` are the ``x-`` arguments of queue.declare. A durable queue has
    a ``store`` and ``queue_id``: its persistent messages are written there until they
    are acknowledged, discarded or purged.
    """

    def __init__(self, vhost: Any, name: str, durable: bool = False,
                 exclusive_owner: Any = None, auto_delete: bool = False,
                 arguments: dict | None = None) -> None:
        self.vhost = vhost
        self.name = name
        self.durable = durable
        self.exclusive_owner = exclusive_owner
        self.auto_delete = auto_delete
        self.arguments = dict(arguments or {})
        self.ready: deque[QueuedMessage] = deque()
        self.consumers: deque[Consumer] = deque()
        self.bindings: list = []  # Bindings whose destination is this queue
        self.deleted = False
        self._had_consumer = False
        self._next_seq = 0
        #: With a store, persistent messages of a durable queue are written to it, and
        #: a backlog beyond ``max_in_memory`` is paged out (bodies on disk only).
        self.store: Store | None = None
        self.queue_id = 0
        self.max_in_memory = in_memory_limit(self.arguments)
        self._paged = 0  # messages on disk only, after every message in ``ready``
        self._paged_after = 0  # seq of the last message not paged out

    # -- messages -------------------------------------------------------------------
    @property
    def message_count(self) -> int:
        """Messages ready for delivery (not counting unacknowledged ones)."""
        return len(self.ready) + self._paged

    def enqueue(self, message: Message) -> bool:
        """Append ``message``; True if it was written to the store durably (persistent
        message, durable queue), so a confirm must wait for :meth:`Store.when_durable`."""
        self._next_seq += 1
        seq = self._next_seq
        store = self.store
        durable = (store is not None and self.durable and self.exclusive_owner is None
                   and message.persistent)
        if store is not None and (self._paged or len(self.ready) >= self.max_in_memory):
            if not self._paged:
                self._paged_after = seq - 1
            self._write(seq, message, transient=not durable)
            self._paged += 1
        else:
            self.ready.append(QueuedMessage(message, seq, self._write(seq, message) if durable else 0))
        if self.consumers:
            self.drain()
        return durable

    def _write(self, seq: int, message: Message, transient: bool = False) -> int:
        store = self.store
        assert store is not None
        if not self.queue_id:
            self.queue_id = store.new_queue_id()
        return store.add_message(self.queue_id, seq, message.exchange, message.routing_key,
                                 message.header, message.body, transient)

    def restore_paged(self, count: int, last_seq: int) -> None:
        """At start-up: ``count`` messages wait in the store, up to seq ``last_seq``."""
        self._paged, self._paged_after = count, 0
        self._next_seq = max(self._next_seq, last_seq)

    def _page_in(self) -> bool:
        """Read the next messages of a paged-out tail into memory; False if none."""
        if not self._paged or self.store is None:
            return False
        batch = min(self.max_in_memory, PAGE_IN_BATCH) or 1
        for stored in self.store.read_queue(self.queue_id, self._paged_after, batch):
            entry = QueuedMessage(Message(stored.exchange, stored.routing_key, stored.header,
                                          stored.body), stored.seq, stored.store_id)
            entry.delivery_count = stored.delivery_count
            entry.redelivered = stored.delivery_count > 0
            self.ready.append(entry)
            self._paged_after = stored.seq
            self._paged -= 1
        if not self.ready:  # the store lost track: do not spin
            self._paged = 0
        return bool(self.ready)

    def ack(self, entry: QueuedMessage) -> None:
        """The message was acknowledged: it leaves the store."""
        if entry.store_id:
            if self.store is not None:  # None once the queue is deleted
                self.store.remove_message(entry.store_id)
            entry.store_id = 0

    def _take(self) -> QueuedMessage:
        """Pop the head message for a delivery, counting it (also in the store)."""
        entry = self.ready.popleft()
        entry.delivery_count += 1
        if entry.store_id:
            self.store.set_delivery_count(entry.store_id, entry.delivery_count)  # type: ignore[union-attr]
        return entry

    def get(self) -> QueuedMessage | None:
        """basic.get: the head message, or None when empty."""
        if not self.ready and not self._page_in():
            return None
        return self._take()

    def requeue(self, entries: list[QueuedMessage]) -> None:
        """Put unacknowledged messages back where they were, marked redelivered."""
        if self.deleted or not entries:
            return
        entries.sort()
        for entry in entries:
            entry.redelivered = True
        ready = self.ready
        if not ready or entries[-1].seq < ready[0].seq:
            ready.extendleft(reversed(entries))
        else:
            self.ready = deque(heapq.merge(ready, entries))
        self.drain()

    def discard(self, entry: QueuedMessage, reason: str) -> None:
        """A message leaves the queue unacknowledged-for-good: ``reason`` is
        ``rejected``, ``expired``, ``maxlen`` or ``delivery_limit``. Without a
        dead-letter configuration it is dropped, as in RabbitMQ."""
        self.ack(entry)

    def purge(self) -> int:
        """Drop every ready message (unacknowledged ones stay); returns how many."""
        count = self.message_count
        if self.store is not None:
            for entry in self.ready:
                self.ack(entry)
            if self._paged:
                self.store.remove_paged(self.queue_id, self._paged_after)
                self._paged = 0
        self.ready.clear()
        return count

    # -- consumers ------------------------------------------------------------------
    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers.append(consumer)
        self._had_consumer = True
        self.drain()

    def remove_consumer(self, consumer: Consumer) -> None:
        try:
            self.consumers.remove(consumer)
        except ValueError:
            return
        if self.auto_delete and not self.consumers and self._had_consumer and not self.deleted:
            self.vhost.delete_queue(self.name)

    @property
    def has_exclusive_consumer(self) -> bool:
        return any(c.exclusive for c in self.consumers)

    def drain(self) -> None:
        """Deliver ready messages round-robin to consumers that can take them."""
        consumers = self.consumers
        while consumers and (self.ready or self._page_in()):
            for _ in range(len(consumers)):
                consumer = consumers[0]
                consumers.rotate(-1)
                if consumer.can_accept():
                    consumer.deliver(self, self._take())
                    break
            else:
                return

    def __repr__(self) -> str:
        return f"<Queue {self.name!r}>"
