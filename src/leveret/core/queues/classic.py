"""Classic queues: ready messages in FIFO order (or by priority with
``x-max-priority``, :mod:`.priority_backlog`), consumers served round-robin.

A queue hands a message to the next consumer whose ``can_accept()`` is true (prefetch
window open, socket writable) and forgets it until the adapter settles it (AMQP 0-9-1
§3.1.4). A requeued message returns to its original position with ``redelivered`` set,
as in RabbitMQ, after the delay of the queue's redelivery policy (:mod:`..redelivery`).

The parts: ordered storage with paging (:class:`.backlog.Backlog`; paged-out messages
come back by callback, :meth:`ClassicQueue._page_in`), dispatch to consumers
(:meth:`.base.Queue.drain` → :meth:`ClassicQueue._dispatch`), and the features it is made of, each a
collaborator in :mod:`.features` that also checks its ``x-`` arguments: expiry
(:class:`.features.ttl.Expiry`; unlike RabbitMQ a message expires when due even if it is
not at the head - one paged out to the store, by :meth:`ClassicQueue._expire_paged`),
redelivery delays (:class:`.features.redelivery.Delays`), length limits
(:mod:`.features.limits`), message groups (:class:`.features.groups.MessageGroups`),
leases (:class:`.features.leases.Leases`) and the console's hold/scan
(:class:`.features.hold.HoldAndScan`). A message that dies is handed back to the host
as a :class:`.host.DeadLetter` (:mod:`.host`), which dead-letters it once the queue's
entry point has returned.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..deduplication import dedup_key
from ..errors import precondition_failed
from ..message import NEUTRAL, Message
from ..message_groups import GROUP_ID_BYTES, message_group
from ..queue_config import DELIVERY_GUARANTEES
from ..selector import message_lookup
from .backlog import PAGE_IN_BATCH, Backlog, restored
from .base import GONE, READY, UNACKED, Consumer, Queue, QueuedMessage, delivery_counts
from .features import limits
from .features.groups import MessageGroups
from .features.hold import HoldAndScan
from .features.leases import Lease, Leases
from .features.redelivery import Delays
from .features.ttl import Expiry
from .host import DeadLetter, QueueHost, hands_back
from .outcome import ACCEPTED, REJECTED, STORED, Enqueued
from .priority_backlog import PriorityBacklog

if TYPE_CHECKING:
    from ...store.base import StoredMessage

#: Messages a dispatch with selectors looks at in one event-loop turn, at most.
SCAN_BUDGET = 10_000
#: Paged-out messages dead-lettered for expiry in one event-loop turn, at most.
PAGED_EXPIRY_BATCH = 1000
#: Ready messages dead-lettered for expiry in one event-loop turn, at most. Messages
#: published together with one TTL fall due together (kombu's native delayed delivery:
#: every task of the same second, in each ``celery_delayed_N`` queue in turn); their
#: dead-lettering (routing, the copy's store write) is spread over turns so that other
#: clients' reads and timers go between, as a connection's turn budget does for a read.
EXPIRY_BATCH = 64
#: Ready messages moved from memory to the store in one event-loop turn under memory
#: pressure, at most (:meth:`ClassicQueue.memory_short`).
PAGE_OUT_CHUNK = 10_000


class ClassicQueue(HoldAndScan, Queue):
    """A classic queue (``x-queue-type: classic``, the default). With a store,
    persistent messages of a durable queue are written there until they are
    acknowledged or die, and new messages are paged out past the in-memory limits
    (``config.max_in_memory``: a lazy or bounded queue; a default durable queue's
    persistent messages past ``config.stored_in_memory``) or while memory is short
    (``host.memory_pressure``: every queue, as RabbitMQ 3.10 pages under the memory
    watermark's paging ratio); see :mod:`.features.paging`.
    With ``x-max-priority`` N > 0 its messages wait in a :class:`.PriorityBacklog`:
    highest priority (0..N) first, FIFO within one, as RabbitMQ 3.10's priority queues."""

    type_name = "classic"
    rabbitmq_type = "rabbit_classic_queue"
    #: Whether every message goes to the store, persistent or not (quorum queues).
    persists_every_message = False
    #: Whether RabbitMQ's quorum-queue dead-letter strategies are accepted.
    takes_delivery_guarantees = False

    @classmethod
    def check_declaration(
        cls, name: str, durable: bool, exclusive: bool, auto_delete: bool, arguments: dict, where: str
    ) -> None:
        """As :meth:`Queue.check_declaration`; ``x-dead-letter-strategy`` with RabbitMQ's
        quorum-queue values (``at-most-once``, ``at-least-once``) is refused, as
        RabbitMQ refuses it on a classic queue (ActiveMQ's values are leveret's)."""
        super().check_declaration(name, durable, exclusive, auto_delete, arguments, where)
        strategy = arguments.get("x-dead-letter-strategy")
        if not cls.takes_delivery_guarantees and strategy in DELIVERY_GUARANTEES:
            raise precondition_failed(
                f"invalid arg 'x-dead-letter-strategy'{where} of queue type {cls.rabbitmq_type}"
            )

    def __init__(
        self,
        host: QueueHost,
        name: str,
        durable: bool = False,
        exclusive_owner: Any = None,
        auto_delete: bool = False,
        arguments: dict | None = None,
    ) -> None:
        super().__init__(host, name, durable, exclusive_owner, auto_delete, arguments)
        config = self.config
        #: the backlog when the queue has priorities (x-max-priority > 0), else None
        self.levels: PriorityBacklog | None = None
        self.backlog: Backlog | PriorityBacklog
        if config.max_priority:
            self.backlog = self.levels = PriorityBacklog(
                name, config.max_in_memory, config.max_in_memory_bytes, config.max_priority, host.queue_memory
            )
        else:  # x-max-priority 0 is one level: FIFO, as in RabbitMQ
            self.backlog = Backlog(
                name, config.max_in_memory, config.max_in_memory_bytes, memory=host.queue_memory
            )
        #: requeued messages waiting out their redelivery delay (:mod:`.features.redelivery`)
        self.delays = Delays()
        #: ready messages due to expire (:mod:`.features.ttl`)
        self.expiry = Expiry(host.clock, config.message_ttl)
        self._next_seq = 0
        #: its leases by consumer group (:mod:`.features.leases`)
        self.leases = Leases()
        #: message groups' consumers (:mod:`.features.groups`), once a message with
        #: JMSXGroupID came (else None)
        self.groups: MessageGroups | None = None
        #: run when the read of paged-out messages on its way comes back (basic.get waits)
        self._page_waiters: list[Callable[[bool], None]] = []

    # -- counts ---------------------------------------------------------------------
    @property
    def message_count(self) -> int:
        """Messages waiting for delivery (ready, paged out or delayed redeliveries),
        not counting unacknowledged ones."""
        return len(self.backlog) + self.delays.count

    # -- publishing -----------------------------------------------------------------
    def enqueue(self, message: Message) -> Enqueued:
        """Append ``message``. Returns STORED when it went to the store, durably or
        paged out (a confirm must wait for :meth:`Store.when_durable`), REJECTED when the length
        limit refused it (``x-overflow: reject-publish``), else ACCEPTED."""
        if self.admit is not None and not self.admit.matches(message_lookup(message)):
            return ACCEPTED  # a topic subscription that does not want it
        config = self.config
        size = len(message.body)
        if config.overflow != "drop-head" and limits.over(
            config, len(self.backlog) + 1, self.backlog.bytes + size
        ):
            if config.overflow == "reject-publish-dlx":
                self.actions.append(DeadLetter(self, message, "maxlen"))
            return REJECTED
        if self.dedup is not None:
            key = dedup_key(message, config.dedup_header)
            if key is not None and not self.dedup.check_and_add(key):
                # A duplicate: dropped, yet confirmed - once the original is on disk.
                durable = self.store is not None and self.durable and self._persists(message)
                return STORED if durable else ACCEPTED
        if (
            self.groups is None
            and (message.format is NEUTRAL or GROUP_ID_BYTES in message.encoded)  # no call when it cannot
            and message_group(message) is not None
        ):
            self.groups = MessageGroups()  # from now on, dispatch keeps groups together
        self._next_seq += 1
        seq = self._next_seq
        levels = self.levels
        if levels is not None:
            blocks, priority = levels.blocks, message.priority
            seq |= blocks[priority] if priority in blocks else levels.block(priority)
            if self.selective or self.groups is not None:
                self._rewind(seq)  # it may come before what the consumers looked at
        expires_at = self.expiry.expires_at(message)
        store = self.store
        durable = (
            store is not None and self.durable and self.exclusive_owner is None and self._persists(message)
        )
        backlog = self.backlog
        stored = durable  # whether a confirm must wait for the store
        if store is not None and (
            backlog.must_page(seq)
            or self.host.memory_pressure
            or (  # written anyway: past the window for stored messages, not kept in memory too
                durable
                and (
                    backlog.memory_bytes >= config.stored_in_memory_bytes
                    or backlog.in_memory >= config.stored_in_memory
                )
            )
        ):
            # Paged out, the message exists only in the store: its confirm waits for
            # the write, as a persistent message's does, transient or not.
            self._write(seq, message, expires_at, transient=not durable)
            backlog.appended_paged(seq, size)
            stored = True
            if expires_at:  # it expires on disk when due, not when read back
                self.timers.arm("paged-expiry", expires_at - self.host.clock.time(), self._expire_paged, True)
        else:
            entry = QueuedMessage(
                message, seq, self._write(seq, message, expires_at) if durable else 0, expires_at
            )
            backlog.append(entry)
            if expires_at:
                self._watch_expiry(entry)
        if self.consumers:
            self._dispatch()  # a waiting consumer takes it before any length limit applies
        if config.max_length is not None or config.max_length_bytes is not None:  # limits.limited, inline
            self._drop_over_limits()
        if expires_at and config.message_ttl == 0:
            self._expire_due()  # TTL 0: delivered at once or dead, as RabbitMQ
        return STORED if stored else ACCEPTED

    def _persists(self, message: Message) -> bool:
        return message.persistent or self.persists_every_message

    def _drop_over_limits(self) -> None:
        """Drop heads (reason ``maxlen``) while the queue is over its length limits
        (:mod:`.features.limits`), except those still on their way from the store
        (dropped once paged back in, :meth:`_paged_back`)."""
        backlog = self.backlog
        config = self.config
        while (count := len(backlog)) and limits.over(config, count, backlog.bytes):
            if not self._has_ready():
                return
            self._die(backlog.pop(), "maxlen")

    def _write(self, seq: int, message: Message, expires_at: float, transient: bool = False) -> int:
        store = self.store
        assert store is not None
        if not self.queue_id:
            self.queue_id = store.new_queue_id()
        return store.add_message(
            self.queue_id,
            seq,
            message.exchange,
            message.routing_key,
            message.encoded,
            message.body,
            transient,
            expires_at,
            meta=message.meta(),
        )

    # -- paging ---------------------------------------------------------------------
    def restore_paged(self, count: int, last_seq: int, size: int) -> None:
        """At start-up: ``count`` messages (``size`` body bytes, seqs up to ``last_seq``)
        wait in the store; they are read back as consumers reach them (a priority
        queue's counted per level in the store)."""
        backlog = self.backlog
        if isinstance(backlog, PriorityBacklog):
            assert self.store is not None
            last_seq = backlog.restore(self.store.count_blocks(self.queue_id))
        else:
            backlog.restore(count, size)
        self._next_seq = max(self._next_seq, last_seq)
        if count:  # some may have expired while the broker was down, or expire later
            self.timers.arm("paged-expiry", 0, self._expire_paged, True)
            self._page_in()  # the first batch, answered once the store runs

    def memory_short(self) -> None:
        """As :meth:`Queue.memory_short`: as RabbitMQ 3.10's classic queues, the ready
        messages in memory move to the store (a persistent one of a durable queue is
        there already and is only dropped from memory; the others are written as
        transient rows), :data:`PAGE_OUT_CHUNK` a turn while the pressure lasts,
        keeping a batch in memory for the consumers. A priority queue keeps what it
        holds (it pages new messages only)."""
        if self.store is not None and self.levels is None and self.backlog.live > PAGE_IN_BATCH:
            self.timers.arm("page-out", 0, self._page_out, True)

    def _page_out(self) -> None:
        self.timers.fired("page-out")
        backlog = self.backlog
        if self.deleted or not self.host.memory_pressure or not isinstance(backlog, Backlog):
            return
        if backlog.reading:  # its answer goes behind what would move: once it is in
            self.timers.arm("page-out", 0.01, self._page_out, True)
            return
        moved = backlog.page_out(PAGE_IN_BATCH, PAGE_OUT_CHUNK)
        expiring = False
        store = self.store
        assert store is not None
        for entry in moved:
            if not entry.store_id:
                message = entry.message
                entry.store_id = self._write(entry.seq, message, entry.expires_at, transient=True)
                if entry.delivery_count:  # read back as redelivered
                    store.set_delivery_count(entry.store_id, entry.delivery_count, entry.failed_count)
            expiring = expiring or bool(entry.expires_at)
        if expiring:  # the heap lets go of them; they expire on disk when due
            self.expiry.sweep()
            self.timers.arm("paged-expiry", 0, self._expire_paged, True)
        if len(moved) == PAGE_OUT_CHUNK:
            self.timers.arm("page-out", 0, self._page_out, True)

    def _has_ready(self) -> bool:
        """Whether a message is ready in memory; asks the store for paged-out ones ahead
        of need, and when none is in memory (then False until the answer)."""
        backlog = self.backlog
        if backlog.paged:
            self._page_in()
        return backlog.live > 0

    def _page_in(self, more: bool = False) -> bool:
        """Ask the store for the next paged-out messages if wanted now (reading ahead;
        while memory is short, only once less than a batch is left in memory, so a
        consumer still does not wait for the disk, and memory holds two batches at
        most); the answer comes to :meth:`_paged_back`. Whether a read is on its way."""
        store = self.store
        if store is None:
            return False
        backlog = self.backlog
        ahead = not self.host.memory_pressure or backlog.live < PAGE_IN_BATCH
        return backlog.ask(store, self.queue_id, self._paged_back, ahead, more)

    def _paged_back(self, part: Backlog, generation: int, rows: list[StoredMessage]) -> None:
        """On the loop: the store's answer to :meth:`_page_in`. What the backlog takes
        of it is dispatched (a length limit drops heads that were on their way), then
        those waiting in :meth:`when_paged_in` go on."""
        if not self.deleted:
            self._paged_in(self.backlog.answered(part, generation, rows, self.host.clock.time()))
            if limits.limited(self.config):
                self._drop_over_limits()
            self.drain()  # dispatches, then carries out what the queue handed back
        waiting, self._page_waiters = self._page_waiters, []
        for callback in waiting:
            callback(True)

    def paging_in(self) -> bool:
        """As :meth:`Queue.paging_in`."""
        backlog = self.backlog
        return not backlog.live and bool(backlog.paged) and self._page_in()

    def when_paged_in(self, callback: Callable[[bool], None]) -> None:
        """As :meth:`Queue.when_paged_in`."""
        if self.paging_in():
            self._page_waiters.append(callback)
        else:
            callback(True)

    def _paged_in(self, read: list[QueuedMessage]) -> None:
        """``read`` came back from the store: those expired there die, the others'
        TTL is watched."""
        if read and (self.selective or self.groups is not None):
            self._rewind(read[0].seq)  # a priority queue's may come before others in memory
        for entry in read:
            if entry.state == GONE:  # expired while paged out: it dies now
                self._die(entry, "expired")
            elif entry.expires_at:
                self._watch_expiry(entry)
        waiting = self.backlog.waiting
        if waiting:  # read back during a redelivery back-off that outlived a restart
            for due, entry in waiting:
                self.delays.wait(entry, due)
            waiting.clear()
            self._arm_redelivery(self.host.clock.time())

    def _rewind(self, seq: int) -> None:
        """Messages from ``seq`` on came back or arrived ahead of others: consumers that
        turned down messages past it (selectors, message groups) look again."""
        for consumer in self.consumers:
            if consumer.examined >= seq:
                consumer.examined = seq - 1

    # -- taking messages out --------------------------------------------------------
    def _take(self) -> QueuedMessage:
        """Pop the head message for a delivery, counting it (also in the store)."""
        return self._taken(self.backlog.pop())

    def _taken(self, entry: QueuedMessage) -> QueuedMessage:
        """``entry``, out of the backlog, is delivered: count it (also in the store)."""
        entry.state = UNACKED
        self.unacked_count += 1
        entry.delivery_count += 1
        if entry.store_id and self.store is not None:  # as in ack: None once deleted
            self.store.set_delivery_count(entry.store_id, entry.delivery_count, entry.failed_count)
        return entry

    @hands_back
    def take_for_lease(self) -> QueuedMessage | None:
        """The head message for a lease (like a delivery), or None when empty."""
        return self._take() if self._has_ready() else None

    def lease(self, group: str) -> Lease:
        """The lease of consumer ``group`` (see :mod:`.features.leases`), created on first use."""
        return self.leases.get(self, group)

    def save_lease(self, lease: Lease) -> None:
        """Persist ``lease``'s next sequence number (durable queues with a store only)."""
        if self.store is not None and self.durable and self.queue_id:
            self.store.save_definition(
                "lease",
                self.host.name,
                f"{self.name}\x00{lease.group}",
                {"queue_id": self.queue_id, "next_seq": lease.next_seq},
            )

    def restore_lease(self, group: str, next_seq: int) -> None:
        """At start-up: group ``group``'s lease, once made, numbers on from ``next_seq``."""
        self.leases.restore(group, next_seq)

    def get(self) -> QueuedMessage | None:
        """basic.get: the head message, or None when empty (an entry point, written out
        as :meth:`drain` is: it runs per message)."""
        self.touch()
        entry = self._take() if self._has_ready() else None
        if self.actions:  # none today (a page-in is answered later); kept an entry point
            self.host.carry_out()
        return entry

    def delivery_headers(self, entry: QueuedMessage) -> tuple[tuple[str, int], ...]:
        """As RabbitMQ 4.3: ``x-delivery-count``, the failed deliveries so far, once one
        failed (from the first delivery on when the queue has a redelivery policy, as
        ActiveMQ's JMSXDeliveryCount - 1 would be); ``x-acquired-count``, every
        delivery before this one (returns too), once there was one."""
        return delivery_counts(entry, self.config.redelivery.active)

    # -- settling -------------------------------------------------------------------
    def discard(self, entry: QueuedMessage, reason: str) -> None:
        """A delivered message dies (``rejected``): dead-lettered as configured, by the
        host once this entry point returns (written out, as :meth:`drain`: per message)."""
        self._die(entry, reason)
        if self.actions:
            self.host.carry_out()

    def _die(self, entry: QueuedMessage, reason: str) -> None:
        if not self.deleted:  # the host dead-letters it once this entry point returns
            self.actions.append(DeadLetter(self, entry.message, reason))
        self.ack(entry)

    def requeue(self, entries: list[QueuedMessage], failed: bool = False) -> None:
        """Unacknowledged messages come back: back to their original position, marked
        redelivered, after the redelivery policy's delay. ``failed`` (a failed
        delivery, see :meth:`.base.Queue.requeue`) counts toward the delivery limit,
        also in the store; a poison message (more failures than the limit) or an
        expired one dies instead (an entry point, written out as :meth:`drain` is: it
        runs per nack)."""
        if self.deleted or not entries:
            return  # nothing recorded
        policy = self.config.redelivery
        now = self.host.clock.time()
        store = self.store
        back = []
        for entry in sorted(entries):
            if entry.state == UNACKED:
                self.unacked_count -= 1
                entry.state = READY
            entry.redelivered = True
            if failed:
                entry.failed_count += 1
                if entry.store_id and store is not None:  # a restart keeps the count
                    store.set_delivery_count(entry.store_id, entry.delivery_count, entry.failed_count)
            if policy.exhausted(entry.failed_count):
                self._die(entry, "delivery_limit")
            elif entry.expires_at and entry.expires_at <= now:
                self._die(entry, "expired")
            else:
                delay = policy.return_delay(failed, entry.failed_count)
                if delay > 0:
                    due = now + delay / 1000
                    self.delays.wait(entry, due)
                    if entry.store_id and store is not None:
                        store.set_available_at(entry.store_id, due)  # a restart keeps the wait
                else:
                    back.append(entry)
        if self.delays.heap:  # replace: a new entry may be due before the armed timer
            self._arm_redelivery(now)
        if back:
            self._put_back(back)
        else:  # the consumers' prefetch windows have room now
            self._dispatch()
        if self.actions:
            self.host.carry_out()

    def _put_back(self, entries: list[QueuedMessage]) -> None:
        if not entries:
            return
        if self.selective or self.groups is not None:
            self._rewind(entries[0].seq)  # selectors look at the returned messages again
        self.backlog.put_back(entries)
        for entry in entries:
            if entry.expires_at:
                self._watch_expiry(entry)
        self._dispatch()

    def _redeliver_due(self) -> None:
        self.timers.fired("redelivery")
        now = self.host.clock.time()
        due = []
        for entry in self.delays.due(now):
            if entry.expires_at and entry.expires_at <= now and not self.deleted:
                self._die(entry, "expired")  # expired while waiting: never delivered
            else:
                due.append(entry)
        next_due = self.delays.next_due()
        if next_due is not None:
            self.timers.arm("redelivery", next_due - now, self._redeliver_due)
        if not self.deleted:
            self._put_back(sorted(due))  # in queue order, not due order

    def purge(self) -> int:
        """Drop every waiting message (unacknowledged ones stay); returns how many."""
        count = self.message_count
        for entry in self.backlog.clear(self.store, self.queue_id, self._next_seq):
            self.ack(entry)
        for entry in self.delays.clear():
            self.ack(entry)
        self.expiry.clear()
        return count

    # -- TTL ------------------------------------------------------------------------
    def _arm_redelivery(self, now: float) -> None:
        next_due = self.delays.next_due()
        if next_due is not None:
            self.timers.arm("redelivery", next_due - now, self._redeliver_due, True)

    def _watch_expiry(self, entry: QueuedMessage) -> None:
        if self.expiry.watch(entry, self.backlog.in_memory + self.unacked_count):
            self.timers.arm("ttl", entry.expires_at - self.host.clock.time(), self._expire_due, True)

    def _expire_paged(self) -> None:
        """Dead-letter paged-out messages whose time has come, read from the store by
        their expiry (:data:`PAGED_EXPIRY_BATCH` a turn), then wait for the next one."""
        self.timers.fired("paged-expiry")
        store = self.store
        if store is None or self.deleted or not self.queue_id:
            return
        backlog = self.backlog
        now = self.host.clock.time()
        budget = PAGED_EXPIRY_BATCH
        for low, high in backlog.paged_ranges():
            for stored in store.read_expired(self.queue_id, low, high, now, budget):
                if stored.seq in backlog.held:  # an operator's action has it
                    continue
                entry = restored(stored)
                backlog.forget_paged(stored.seq, len(stored.body))
                self._die(entry, "expired")  # dead-lettered, and gone from the store
                budget -= 1
        if budget <= 0:  # more may be due: go on next turn
            self.timers.arm("paged-expiry", 0, self._expire_paged, True)
            return
        due = [
            t
            for low, high in backlog.paged_ranges()
            if (t := store.next_expiry(self.queue_id, low, high, now))
        ]
        if due:
            self.timers.arm("paged-expiry", min(due) - now, self._expire_paged, True)
        elif backlog.paged and store.pending:  # rows still on their way: look once they are in
            store.when_durable(lambda ok: self.timers.arm("paged-expiry", 0, self._expire_paged, True))

    def _expire_due(self) -> None:
        """Dead-letter the ready messages whose time has come, wherever they are in the
        queue (RabbitMQ expires only at the head), :data:`EXPIRY_BATCH` a turn."""
        self.timers.fired("ttl")
        now = self.host.clock.time()
        due = self.expiry.due(now, EXPIRY_BATCH)
        for entry in due:
            self.backlog.remove(entry)
            self._die(entry, "expired")
        if len(due) >= EXPIRY_BATCH and not self.deleted:  # more may be due: next turn
            self.timers.arm("ttl", 0, self._expire_due, True)
            return
        next_due = self.expiry.next_due()
        if next_due is not None and not self.deleted:
            self.timers.arm("ttl", next_due - now, self._expire_due, True)

    # -- lifecycle ------------------------------------------------------------------
    def stop(self) -> None:
        """Deleted, or the broker stops: timers off, leases handed back, memory freed."""
        super().stop()
        self.leases.release_all()
        self.backlog.clear(None, self.queue_id, self._next_seq)  # the store forgets the queue itself

    # -- dispatch -------------------------------------------------------------------
    def _dispatch(self) -> None:
        """Deliver ready messages round-robin to consumers that can take them, the
        highest priority first (a lower one only while the higher ones are blocked)."""
        if self.selective or self.groups is not None:
            self._drain_selective()
            return
        consumers = self.consumers
        backlog = self.backlog
        if backlog.paged:  # read ahead: the next batch is asked for before memory runs out
            self._page_in()
        if self.prioritized or self.config.single_active_consumer:
            while consumers and (backlog.live or self._has_ready()):
                taker = next((c for c in self.dispatching if c.can_accept()), None)
                if taker is None:
                    return
                self.served(taker)
                taker.deliver(self, self._take())
            return
        while consumers and (backlog.live or self._has_ready()):
            for _ in range(len(consumers)):
                consumer = consumers[0]
                consumers.rotate(-1)
                if consumer.can_accept():
                    consumer.deliver(self, self._take())
                    break
            else:
                return

    def _drain_selective(self) -> None:
        """Dispatch when consumers have selectors or messages have groups: each message
        goes to the consumer served least recently of those that can take it, whose
        selector matches it and, for a message of a group, the group's consumer. A
        consumer remembers the last message it turned down (``examined``), so a backlog
        it does not want is looked at once, not at every dispatch, and does not hide
        the messages behind it: unlike ActiveMQ, which looks at the first 200 paged-in
        messages only, the scan goes on past them, reading paged-out ones back (up to
        twice the queue's in-memory limits; beyond that, matching messages wait for the
        head of the queue to move), at most :data:`SCAN_BUDGET` messages per turn (then
        it resumes on the next turn)."""
        backlog = self.backlog
        budget = SCAN_BUDGET
        while budget > 0:
            accepting = [c for c in self.dispatching if c.can_accept()]
            if not accepting or not self._has_ready():
                return
            lowest = min(c.examined for c in accepting)
            candidates = list(
                itertools.islice((e for e in backlog.ready if e.state == READY and e.seq > lowest), budget)
            )
            budget -= len(candidates)
            if self._offer(candidates):
                return  # nobody can take more
            if budget <= 0:
                break
            # every message in memory was offered: ask the store for more, if any (the
            # answer dispatches again)
            self._page_in(more=True)
            return
        self.timers.arm("selector-scan", 0, self._resume_scan, True)  # the budget ran out: go on later

    def _resume_scan(self) -> None:
        self.timers.fired("selector-scan")
        self._dispatch()

    def _offer(self, candidates: list[QueuedMessage]) -> bool:
        """Offer ``candidates`` (in seq order) to the consumers; True once none can take
        more."""
        groups = self.groups
        for entry in candidates:
            if entry.state != READY:
                continue
            lookup = None
            taker = None
            can_take = False
            group = message_group(entry.message) if groups is not None else None
            owner = groups.owner(group) if groups is not None else None
            for consumer in self.dispatching:
                if not consumer.can_accept():
                    continue
                can_take = True
                if entry.seq <= consumer.examined:
                    continue
                if owner is not None and consumer is not owner:
                    consumer.examined = entry.seq  # another consumer's group
                    continue
                selector = consumer.selector
                if selector is not None:
                    if lookup is None:
                        lookup = message_lookup(entry.message)
                    if not selector.matches(lookup):
                        consumer.examined = entry.seq
                        continue
                taker = consumer
                break
            if not can_take:
                return True
            if taker is None and self.admit is not None:
                if not self.admit.matches(lookup or message_lookup(entry.message)):
                    self.backlog.remove(entry)  # kept from before the subscriber came back
                    self.ack(entry)
                continue
            if taker is not None:
                self.served(taker)  # the least recently served go first
                if group is not None and groups is not None and groups.assign(group, taker):
                    self._look_again()
                self.backlog.remove(entry)  # a tombstone until swept
                self._taken(entry)
                taker.deliver(self, entry)
        return False

    # -- message groups (ActiveMQ's JMSXGroupID: :mod:`.features.groups`) -------------
    def _look_again(self) -> None:
        """A group changed hands: what consumers skipped as another's, they look at
        again."""
        for other in self.consumers:
            other.examined = 0

    def remove_consumer(self, consumer: Consumer) -> None:
        """As :meth:`Queue.remove_consumer`; its message groups find another consumer,
        and selectors look again at the messages they had skipped for them."""
        if self.groups is not None and self.groups.forget(consumer):
            self._look_again()
        super().remove_consumer(consumer)
