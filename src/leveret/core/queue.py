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
        self.store: Store | None = None
        self.queue_id = 0

    # -- messages -------------------------------------------------------------------
    @property
    def message_count(self) -> int:
        """Messages ready for delivery (not counting unacknowledged ones)."""
        return len(self.ready)

    def enqueue(self, message: Message) -> bool:
        """Append ``message``; True if it was written to the store (persistent message,
        durable queue), so a confirm must wait for :meth:`Store.when_durable`."""
        self._next_seq += 1
        seq = self._next_seq
        store_id = 0
        if self.store is not None and message.persistent:
            store_id = self.store.add_message(self.queue_id, seq, message.exchange,
                                              message.routing_key, message.header, message.body)
        self.ready.append(QueuedMessage(message, seq, store_id))
        if self.consumers:
            self.drain()
        return store_id > 0

    def restore(self, entry: QueuedMessage) -> None:
        """Append a message recovered from the store (start-up, in publish order)."""
        self._next_seq = max(self._next_seq, entry.seq)
        self.ready.append(entry)

    def ack(self, entry: QueuedMessage) -> None:
        """The message was acknowledged: it leaves the store."""
        if entry.store_id:
            if self.store is not None:  # None once the queue is deleted
                self.store.remove_message(entry.store_id)
            entry.store_id = 0

    def get(self) -> QueuedMessage | None:
        """basic.get: the head message, or None when empty."""
        if not self.ready:
            return None
        entry = self.ready.popleft()
        entry.delivery_count += 1
        if entry.store_id:
            self.store.set_delivery_count(entry.store_id, entry.delivery_count)  # type: ignore[union-attr]
        return entry

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
        """Drop every ready message; returns how many."""
        count = len(self.ready)
        if self.store is not None:
            for entry in self.ready:
                self.ack(entry)
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
        ready, consumers = self.ready, self.consumers
        while ready and consumers:
            for _ in range(len(consumers)):
                consumer = consumers[0]
                consumers.rotate(-1)
                if consumer.can_accept():
                    entry = ready.popleft()
                    entry.delivery_count += 1
                    if entry.store_id:
                        self.store.set_delivery_count(entry.store_id, entry.delivery_count)  # type: ignore[union-attr]
                    consumer.deliver(self, entry)
                    break
            else:
                return

    def __repr__(self) -> str:
        return f"<Queue {self.name!r}>"
