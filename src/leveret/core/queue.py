"""Queues: ready messages in FIFO order, consumers served round-robin.

A queue hands a message to the next consumer whose ``can_accept()`` is true (prefetch
window open, socket writable) and forgets it: the consumer's channel tracks it until
ack, reject or close (AMQP 0-9-1 §3.1.4). A requeued message returns to its original
position with ``redelivered`` set, as in RabbitMQ, after the delay of the queue's
redelivery policy (:mod:`.redelivery`).

Also here, with RabbitMQ's semantics unless noted: message TTL (``x-message-ttl`` and
the ``expiration`` property, the lower wins; unlike RabbitMQ a message expires when due
even if it is not at the head - one paged out to the store, when it is read back), ``x-expires``, length limits (``x-max-length``,
``x-max-length-bytes`` with ``x-overflow``), and paging of long backlogs to the store.
Every way a message dies goes through :func:`.dead_letter.dead_letter`.
"""

from __future__ import annotations

import heapq
import logging
from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

from . import queue_config
from .dead_letter import dead_letter
from .deduplication import DeduplicationCache, dedup_key
from .message import Message

if TYPE_CHECKING:
    from ..store import Store
    from .clock import Timer
    from .lease import Lease

log = logging.getLogger("leveret.queue")

PAGE_IN_BATCH = 1000  # messages read from the store at a time

# Result flags of Queue.enqueue.
ACCEPTED, STORED, REJECTED = 0, 1, 2

# QueuedMessage.state
READY, UNACKED, GONE, DELAYED = 0, 1, 2, 3


class QueuedMessage:
    """A message's place in one queue: ``seq`` orders it, ``delivery_count`` counts the
    deliveries so far (0 before the first), ``expires_at`` is epoch seconds (0: never)."""

    __slots__ = ("message", "seq", "redelivered", "delivery_count", "store_id", "state",
                 "expires_at")

    def __init__(self, message: Message, seq: int, store_id: int = 0,
                 expires_at: float = 0.0) -> None:
        self.message = message
        self.seq = seq
        self.redelivered = False
        self.delivery_count = 0
        self.store_id = store_id  # > 0 while the message is in the store
        self.state = READY
        self.expires_at = expires_at

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
    core); ``arguments`` the ``x-`` arguments of queue.declare, which with the matching
    policy make ``config`` (:mod:`.queue_config`; raises 406 if invalid). With a
    ``store``, persistent messages of a durable queue are written there until they are
    acknowledged or die, and a backlog beyond ``config.max_in_memory`` is paged out.
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
        self.config = queue_config.build(self.arguments, vhost.policy_for(name, "queues"),
                                         f" for queue '{name}' in vhost '{vhost.name}'")
        self.ready: deque[QueuedMessage] = deque()  # may hold GONE entries (tombstones)
        self.consumers: deque[Consumer] = deque()
        self.bindings: list = []  # Bindings whose destination is this queue
        self.deleted = False
        self.store: Store | None = None
        self.queue_id = 0
        self.unacked_count = 0  # delivered, not yet acknowledged
        self._live = 0  # READY entries in ``ready``
        self._bytes = 0  # body bytes of ready messages (in memory and paged)
        self._paged = 0  # messages on disk only, after every message in ``ready``
        self._paged_after = 0  # seq of the last message not paged out
        self._delayed: list[tuple[float, int, QueuedMessage]] = []  # redeliveries waiting
        self._delayed_count = 0
        self._expiring: list[tuple[float, int, QueuedMessage]] = []
        self._timers: dict[str, Timer] = {}
        self._due: dict[str, float] = {}  # when each armed timer fires (epoch seconds)
        self._had_consumer = False
        self._next_seq = 0
        self._last_used = vhost.clock.time()
        self.leases: dict[str, Lease] = {}
        self._lease_seqs: dict[str, int] = {}  # next seq of leases recovered from the store
        self.dedup: DeduplicationCache | None = None
        if self.config.deduplication:
            ttl = self.config.cache_ttl / 1000 if self.config.cache_ttl else None
            self.dedup = DeduplicationCache(self.config.cache_size, ttl, vhost.clock,
                                            self._dedup_added, self._dedup_evicted)
        if self.config.expires is not None:
            self._arm("expires", self.config.expires / 1000, self._check_unused)

    # -- counts ---------------------------------------------------------------------
    @property
    def message_count(self) -> int:
        """Messages waiting for delivery (ready, paged out or delayed redeliveries),
        not counting unacknowledged ones."""
        return self._live + self._paged + self._delayed_count

    def touch(self) -> None:
        """The queue was used (declare, get, consume): restarts ``x-expires``."""
        self._last_used = self.vhost.clock.time()

    # -- publishing -----------------------------------------------------------------
    def enqueue(self, message: Message) -> int:
        """Append ``message``. Returns STORED when it was written to the store durably
        (a confirm must wait for :meth:`Store.when_durable`), REJECTED when the length
        limit refused it (``x-overflow: reject-publish``), else ACCEPTED."""
        config = self.config
        size = len(message.body)
        if config.overflow != "drop-head" and self._full(1, size):
            if config.overflow == "reject-publish-dlx":
                dead_letter(self, message, "maxlen")
            return REJECTED
        if self.dedup is not None:
            key = dedup_key(message, config.dedup_header)
            if key is not None and not self.dedup.check_and_add(key):
                # A duplicate: dropped, yet confirmed - once the original is on disk.
                durable = self.store is not None and self.durable and message.persistent
                return STORED if durable else ACCEPTED
        self._next_seq += 1
        seq = self._next_seq
        expires_at = self._expiry(message)
        store = self.store
        durable = (store is not None and self.durable and self.exclusive_owner is None
                   and message.persistent)
        self._bytes += size
        if store is not None and (self._paged or self._live >= config.max_in_memory):
            if not self._paged:
                self._paged_after = seq - 1
            self._write(seq, message, expires_at, transient=not durable)
            self._paged += 1
        else:
            entry = QueuedMessage(message, seq, self._write(seq, message, expires_at) if durable else 0,
                                  expires_at)
            self.ready.append(entry)
            self._live += 1
            if expires_at:
                self._watch_expiry(entry)
        if self.consumers:
            self.drain()  # a waiting consumer takes it before any length limit applies
        if config.max_length is not None or config.max_length_bytes is not None:
            while self._full() and self._live + self._paged:
                self._drop_head()
        if expires_at and config.message_ttl == 0:
            self._expire_due()  # TTL 0: delivered at once or dead, as RabbitMQ
        return STORED if durable else ACCEPTED

    def _full(self, adding: int = 0, size: int = 0) -> bool:
        """Whether ``adding`` more messages of ``size`` bytes in all would put the queue
        over its length limits (RabbitMQ's will_overflow; ``adding=0``: is it over)."""
        config = self.config
        if config.max_length is not None and self._live + self._paged + adding > config.max_length:
            return True
        return config.max_length_bytes is not None and self._bytes + size > config.max_length_bytes

    def _drop_head(self) -> None:
        if not self._live and not self._page_in():
            return
        entry = self._pop_ready()
        self._die(entry, "maxlen")

    def _write(self, seq: int, message: Message, expires_at: float, transient: bool = False) -> int:
        store = self.store
        assert store is not None
        if not self.queue_id:
            self.queue_id = store.new_queue_id()
        return store.add_message(self.queue_id, seq, message.exchange, message.routing_key,
                                 message.encoded, message.body, transient, expires_at,
                                 meta=message.meta())

    def _dedup_added(self, key: str, expires_at: float) -> None:
        if self.store is not None and self.durable and self.queue_id:
            self.store.save_dedup(self.queue_id, key, expires_at)

    def _dedup_evicted(self, key: str) -> None:
        if self.store is not None and self.durable and self.queue_id:
            self.store.delete_dedup(self.queue_id, key)

    # -- paging ---------------------------------------------------------------------
    def restore_paged(self, count: int, last_seq: int, size: int) -> None:
        """At start-up: ``count`` messages (``size`` body bytes) wait in the store."""
        self._paged, self._paged_after, self._bytes = count, 0, size
        self._next_seq = max(self._next_seq, last_seq)

    def _page_in(self) -> bool:
        """Read paged-out messages into memory until some are ready (those that expired
        on disk die on the way); False if there are none left."""
        while self._paged and not self._live and self.store is not None:
            self._page_in_batch()
        return self._live > 0

    def _page_in_batch(self) -> None:
        batch = min(self.config.max_in_memory, PAGE_IN_BATCH) or 1
        now = self.vhost.clock.time()
        expired = []
        for stored in self.store.read_queue(self.queue_id, self._paged_after, batch):
            message = Message.restore(stored.exchange, stored.routing_key, stored.header,
                                      stored.body, stored.meta)
            entry = QueuedMessage(message, stored.seq, stored.store_id, stored.expires_at)
            entry.delivery_count = stored.delivery_count
            entry.redelivered = stored.delivery_count > 0
            self.ready.append(entry)
            self._live += 1
            self._paged_after = stored.seq
            self._paged -= 1
            if entry.expires_at:
                if entry.expires_at <= now:
                    expired.append(entry)
                else:
                    self._watch_expiry(entry)
        if not self._live:  # the store lost track: do not spin
            log.error("queue '%s': %d paged-out messages missing from the store",
                      self.name, self._paged)
            self._paged = 0
            self._bytes = sum(len(e.message.body) for e in self.ready if e.state == READY)
        for entry in expired:  # expired while paged out: they die now
            self._remove_ready(entry)
            self._die(entry, "expired")

    # -- taking messages out --------------------------------------------------------
    def _pop_ready(self) -> QueuedMessage:
        """Pop the first READY entry (there must be one), skipping tombstones."""
        ready = self.ready
        entry = ready.popleft()
        while entry.state != READY:
            entry = ready.popleft()
        self._live -= 1
        self._bytes -= len(entry.message.body)
        if not self._live:
            ready.clear()  # only tombstones are left
        return entry

    def _remove_ready(self, entry: QueuedMessage) -> None:
        """Take a READY entry out of the middle of ``ready`` (it stays as a tombstone,
        until there are as many tombstones as live entries: then they are swept)."""
        entry.state = GONE
        self._live -= 1
        self._bytes -= len(entry.message.body)
        if not self._live:
            self.ready.clear()
        elif len(self.ready) > 2 * self._live + 64:
            self.ready = deque(e for e in self.ready if e.state == READY)

    def _take(self) -> QueuedMessage:
        """Pop the head message for a delivery, counting it (also in the store)."""
        entry = self._pop_ready()
        entry.state = UNACKED
        self.unacked_count += 1
        entry.delivery_count += 1
        if entry.store_id:
            self.store.set_delivery_count(entry.store_id, entry.delivery_count)  # type: ignore[union-attr]
        return entry

    def take_for_lease(self) -> QueuedMessage | None:
        """The head message for a lease (like a delivery), or None when empty."""
        if not self._live and not self._page_in():
            return None
        return self._take()

    def lease(self, group: str) -> Lease:
        """The lease of consumer ``group`` (see :mod:`.lease`), created on first use."""
        from .lease import Lease

        lease = self.leases.get(group)
        if lease is None:
            lease = self.leases[group] = Lease(self, group, self._lease_seqs.get(group, 1))
        return lease

    def save_lease(self, lease: Lease) -> None:
        if self.store is not None and self.durable and self.queue_id:
            self.store.save_definition("lease", self.vhost.name, f"{self.name}\x00{lease.group}",
                                       {"queue_id": self.queue_id, "next_seq": lease.next_seq})

    def restore_lease(self, group: str, next_seq: int) -> None:
        self._lease_seqs[group] = next_seq

    def get(self) -> QueuedMessage | None:
        """basic.get: the head message, or None when empty."""
        self.touch()
        if not self._live and not self._page_in():
            return None
        return self._take()

    def delivery_headers(self, entry: QueuedMessage) -> tuple[tuple[str, int], ...]:
        """Integer headers this delivery carries besides the message's own:
        ``x-delivery-count`` (previous deliveries) when the queue has a redelivery policy
        or the message was delivered before."""
        if entry.delivery_count > 1 or self.config.redelivery.active:
            return (("x-delivery-count", entry.delivery_count - 1),)
        return ()

    # -- settling -------------------------------------------------------------------
    def ack(self, entry: QueuedMessage) -> None:
        """The message was acknowledged: it leaves the store."""
        if entry.state == UNACKED:
            self.unacked_count -= 1
        entry.state = GONE
        if entry.store_id:
            if self.store is not None:  # None once the queue is deleted
                self.store.remove_message(entry.store_id)
            entry.store_id = 0

    def discard(self, entry: QueuedMessage, reason: str) -> None:
        """A delivered message dies (``rejected``): dead-lettered as configured."""
        self._die(entry, reason)

    def _die(self, entry: QueuedMessage, reason: str) -> None:
        try:
            if not self.deleted:
                dead_letter(self, entry.message, reason)
        except Exception:  # a message that cannot be dead-lettered must not stop the queue
            log.exception("queue '%s': dead-lettering a message (%s) failed; it is dropped",
                          self.name, reason)
        self.ack(entry)

    def requeue(self, entries: list[QueuedMessage]) -> None:
        """Unacknowledged messages come back: back to their original position, marked
        redelivered, after the redelivery policy's delay; a poison message (policy
        exhausted) or an expired one dies instead."""
        if self.deleted or not entries:
            return
        policy = self.config.redelivery
        now = self.vhost.clock.time()
        back = []
        for entry in sorted(entries):
            if entry.state == UNACKED:
                self.unacked_count -= 1
                entry.state = READY
            entry.redelivered = True
            if policy.exhausted(entry.delivery_count):
                self._die(entry, "delivery_limit")
            elif entry.expires_at and entry.expires_at <= now:
                self._die(entry, "expired")
            else:
                delay = policy.delay(entry.delivery_count)
                if delay > 0:
                    entry.state = DELAYED
                    self._delayed_count += 1
                    heapq.heappush(self._delayed, (now + delay / 1000, entry.seq, entry))
                else:
                    back.append(entry)
        if self._delayed:  # replace: a new entry may be due before the armed timer
            self._arm("redelivery", self._delayed[0][0] - now, self._redeliver_due, True)
        if back:
            self._put_back(back)
        else:  # the consumers' prefetch windows have room now
            self.drain()

    def _put_back(self, entries: list[QueuedMessage]) -> None:
        if not entries:
            return
        for entry in entries:
            entry.state = READY
            self._bytes += len(entry.message.body)
            if entry.expires_at:
                self._watch_expiry(entry)
        self._live += len(entries)
        ready = self.ready
        if not ready or entries[-1].seq < ready[0].seq:
            ready.extendleft(reversed(entries))
        else:
            self.ready = deque(heapq.merge(ready, entries))
        self.drain()

    def _redeliver_due(self) -> None:
        self._timers.pop("redelivery", None)
        now = self.vhost.clock.time()
        due = []
        while self._delayed and self._delayed[0][0] <= now:
            entry = heapq.heappop(self._delayed)[2]
            if entry.state == DELAYED:
                self._delayed_count -= 1
                if entry.expires_at and entry.expires_at <= now and not self.deleted:
                    self._die(entry, "expired")  # expired while waiting: never delivered
                else:
                    due.append(entry)
        if self._delayed:
            self._arm("redelivery", self._delayed[0][0] - now, self._redeliver_due)
        if not self.deleted:
            self._put_back(sorted(due))  # in queue order, not due order

    def purge(self) -> int:
        """Drop every waiting message (unacknowledged ones stay); returns how many."""
        count = self.message_count
        for entry in self.ready:
            if entry.state == READY:
                self.ack(entry)
        for _, _, entry in self._delayed:
            if entry.state == DELAYED:
                self.ack(entry)
        if self._paged and self.store is not None:
            self.store.remove_paged(self.queue_id, self._paged_after, self._next_seq)
        self.ready.clear()
        self._delayed.clear()
        self._expiring.clear()
        self._live = self._paged = self._delayed_count = self._bytes = 0
        return count

    # -- TTL ------------------------------------------------------------------------
    def _expiry(self, message: Message) -> float:
        """Epoch seconds when ``message`` expires here (0: never)."""
        ttl = self.config.message_ttl
        own = message.ttl
        if own is not None:
            ttl = own if ttl is None else min(ttl, own)
        if ttl is None:
            return 0.0
        return self.vhost.clock.time() + ttl / 1000

    def _watch_expiry(self, entry: QueuedMessage) -> None:
        heap = self._expiring
        if len(heap) > 2 * (self._live + self.unacked_count) + 64:  # drop settled ones
            heap[:] = [item for item in heap if item[2].state in (READY, UNACKED, DELAYED)]
            heapq.heapify(heap)
        if not heap or entry.expires_at < heap[0][0]:
            self._arm("ttl", entry.expires_at - self.vhost.clock.time(), self._expire_due, True)
        heapq.heappush(heap, (entry.expires_at, entry.seq, entry))

    def _expire_due(self) -> None:
        """Dead-letter every ready message whose time has come, wherever it is."""
        self._timers.pop("ttl", None)
        heap = self._expiring
        now = self.vhost.clock.time()
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)[2]
            if entry.state == READY and entry.expires_at <= now:
                self._remove_ready(entry)
                self._die(entry, "expired")
        if heap and not self.deleted:
            self._arm("ttl", heap[0][0] - now, self._expire_due, True)

    # -- timers ---------------------------------------------------------------------
    def _arm(self, name: str, delay: float, callback: Any, replace: bool = False) -> None:
        """Set timer ``name``; with ``replace``, an armed one is moved earlier (only)."""
        due = self.vhost.clock.time() + delay
        timer = self._timers.get(name)
        if timer is not None:
            if not replace or self._due[name] <= due:
                return
            timer.cancel()
        self._timers[name] = self.vhost.clock.call_later(delay, callback)
        self._due[name] = due

    def _check_unused(self) -> None:
        """x-expires: delete the queue once unused (no consumers, no get, no
        redeclare) for that long."""
        self._timers.pop("expires", None)
        if self.deleted:
            return
        idle = self.vhost.clock.time() - self._last_used
        expires = self.config.expires / 1000  # type: ignore[operator]
        if not self.consumers and idle >= expires:
            self.vhost.delete_queue(self.name)
        else:
            self._arm("expires", expires - idle if not self.consumers else expires,
                      self._check_unused)

    def stop_timers(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for lease in self.leases.values():
            lease.release_all()

    # -- consumers ------------------------------------------------------------------
    def prepare_consumer(self, consumer: Consumer) -> None:
        """Check a new consumer before it is confirmed (consume-ok); raises a
        ChannelError if this queue cannot serve it."""

    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers.append(consumer)
        self._had_consumer = True
        self.touch()
        self.drain()

    def remove_consumer(self, consumer: Consumer) -> None:
        try:
            self.consumers.remove(consumer)
        except ValueError:
            return
        self.touch()
        if self.auto_delete and not self.consumers and self._had_consumer and not self.deleted:
            self.vhost.delete_queue(self.name)

    @property
    def has_exclusive_consumer(self) -> bool:
        return any(c.exclusive for c in self.consumers)

    def drain(self) -> None:
        """Deliver ready messages round-robin to consumers that can take them."""
        consumers = self.consumers
        while consumers and (self._live or self._page_in()):
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

