"""A classic queue's ready messages, in order: in memory, and paged out to the store
past ``x-max-in-memory-length`` messages or ``x-max-in-memory-bytes`` body bytes (a lazy
queue's small in-memory part; none for a default queue: it pages under memory pressure
only, :mod:`.features.paging`).

In memory they are a deque in ``seq`` order that may hold tombstones (entries taken out
of the middle, e.g. by TTL, marked GONE and swept once they outnumber the live ones).
Paged-out messages are all after every message in memory: only their count stays in
memory, and they are read back in order, :data:`PAGE_IN_BATCH` at a time, as consumers
catch up, up to the in-memory limits but never more than a bounded queue's
(:data:`.BOUNDED_IN_MEMORY`, :data:`.BOUNDED_IN_MEMORY_BYTES`): a default queue
recovered with millions of stored messages, or paged out under memory pressure, reads
back as far ahead as a bounded one, not all of it.

Reading back never blocks the event loop: the queue asks the store
(:meth:`Backlog.request`, :meth:`Store.request_queue`), the store reads on its reader
thread and the answer comes back on the loop (:meth:`Backlog.take_page`). The queue asks
ahead, as soon as half a batch fits the in-memory limits, so a consuming queue does not
wait for the disk in steady state; with nothing in memory it waits for the answer. What
left the backlog while a read was on its way (a purge, a message expired on disk or held
by an operator) is not taken from the answer.
"""

from __future__ import annotations

import heapq
import logging
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..message import Message
from ..queue_config import BOUNDED_IN_MEMORY, BOUNDED_IN_MEMORY_BYTES
from ..queue_memory import ENTRY_OVERHEAD, QueueMemory
from .base import DELAYED, GONE, READY, QueuedMessage

if TYPE_CHECKING:
    from ...store import Store
    from ...store.base import StoredMessage

#: ``answer(part, generation, rows)``: a read asked by :meth:`Backlog.request` came back.
PageAnswer = Callable[["Backlog", int, "list[StoredMessage]"], None]

log = logging.getLogger("leveret.queue")

PAGE_IN_BATCH = 1000  # messages read from the store at a time


def restored(stored: StoredMessage) -> QueuedMessage:
    """The queue entry of a message read back from the store, its deliveries counted
    (``redelivered`` once delivered before, as after a restart)."""
    message = Message.restore(stored.exchange, stored.routing_key, stored.header, stored.body, stored.meta)
    entry = QueuedMessage(message, stored.seq, stored.store_id, stored.expires_at)
    entry.delivery_count = stored.delivery_count
    entry.failed_count = stored.failed_count
    entry.redelivered = stored.delivery_count > 0
    return entry


#: Above every seq (the store's bound: seqs are below 2**62).
ALL_SEQS = 2**62


class Backlog:
    """The ready messages of queue ``name``; ``max_in_memory`` entries at most in memory
    when the queue has a store (the queue passes its store to the calls that use it).
    Its seqs are in ``first_seq < seq <= last_seq`` (a priority queue gives each level
    such a range, :mod:`.priority_backlog`; a FIFO queue has them all)."""

    def __init__(
        self,
        name: str,
        max_in_memory: int,
        max_in_memory_bytes: int = BOUNDED_IN_MEMORY_BYTES,
        first_seq: int = 0,
        last_seq: int = ALL_SEQS,
        waiting: list[tuple[float, QueuedMessage]] | None = None,
        held: set[int] | None = None,
        memory: QueueMemory | None = None,
    ) -> None:
        self.name = name
        #: the broker's count of bytes queues hold in memory (:mod:`..queue_memory`):
        #: changed with :attr:`memory_bytes`, by the body plus ENTRY_OVERHEAD a message
        self.memory = memory if memory is not None else QueueMemory()
        #: ``(available_at, entry)`` of messages read back while their redelivery
        #: back-off still runs (after a restart): not ready; the queue takes them
        #: (a priority queue's levels share one list)
        self.waiting: list[tuple[float, QueuedMessage]] = waiting if waiting is not None else []
        #: seqs of paged-out messages an operator's action holds (their rows stay in the
        #: store until the action settles them): reading back passes over them (a
        #: priority queue's levels share one set)
        self.held: set[int] = held if held is not None else set()
        self.max_in_memory = max_in_memory
        self.max_in_memory_bytes = max_in_memory_bytes
        #: how far reading back fills memory: the in-memory limits, at most a bounded
        #: queue's (a default queue's are unlimited)
        self.read_limit = min(max_in_memory, BOUNDED_IN_MEMORY)
        self.read_limit_bytes = min(max_in_memory_bytes, BOUNDED_IN_MEMORY_BYTES)
        self.first_seq = first_seq
        self.last_seq = last_seq
        self.memory_bytes = 0  # body bytes of the ready messages in memory
        self.ready: deque[QueuedMessage] = deque()  # may hold GONE entries (tombstones)
        self.live = 0  # READY entries in ``ready``
        self.holes = 0  # entries in ``ready`` taken out of the middle (tombstones)
        self.bytes = 0  # body bytes of ready messages (in memory and paged)
        self.paged = 0  # messages on disk only, after every message in ``ready``
        self.paged_after = 0  # seq of the last message not paged out
        self.reading = False  # a read of paged-out messages is on its way
        #: bumped by :meth:`clear`: an answer asked before is dropped
        self.generation = 0
        #: seqs of paged-out messages taken away while a read was on its way
        self.forgotten: set[int] = set()
        #: the highest seq ever taken out of ``ready`` (delivered, died, held): every
        #: message outside it (unacknowledged, waiting out a delay) has one up to here,
        #: so :meth:`page_out` moves only what is above, where no store row of theirs is
        self.taken_upto = first_seq

    def __len__(self) -> int:
        """Ready messages, in memory and paged out."""
        return self.live + self.paged

    @property
    def in_memory(self) -> int:
        """READY entries in memory (all of them are ahead of the paged-out ones)."""
        return self.live

    @property
    def parts(self) -> tuple[Backlog, ...]:
        """The backlogs that make this one, in delivery order: itself."""
        return (self,)

    # -- adding -------------------------------------------------------------------------
    def must_page(self, seq: int = 0) -> bool:
        """Whether the next message (``seq``) goes to the store rather than to memory
        (the queue asks only when it has a store)."""
        return (
            self.paged > 0 or self.live >= self.max_in_memory or self.memory_bytes >= self.max_in_memory_bytes
        )

    def append(self, entry: QueuedMessage) -> None:
        """A new message at the tail, in memory."""
        self.ready.append(entry)
        self.live += 1
        size = len(entry.message.body)
        self.bytes += size
        self.memory_bytes += size
        self.memory.held += size + ENTRY_OVERHEAD

    def appended_paged(self, seq: int, size: int) -> None:
        """A new message at the tail was written to the store only."""
        if not self.paged:
            self.paged_after = seq - 1
        self.paged += 1
        self.bytes += size

    def paged_ranges(self) -> list[tuple[int, int]]:
        """``(after_seq, upto_seq)`` of the paged-out messages (none: empty)."""
        return [(self.paged_after, self.last_seq)] if self.paged else []

    def forget_paged(self, seq: int, size: int) -> None:
        """A paged-out message (``size`` body bytes) left the store without being read
        back (it expired there, or an operator holds it)."""
        self.paged -= 1
        self.bytes -= size
        if self.reading:
            self.forgotten.add(seq)

    def unforget_paged(self, seq: int, size: int) -> bool:
        """A paged-out message taken out with :meth:`forget_paged` whose row stayed in
        the store comes back: counted as paged out again and True, if it is still ahead
        of reading back; else False (the caller puts it back in memory)."""
        if not self.paged or seq <= self.paged_after:
            return False
        self.forgotten.discard(seq)
        self.paged += 1
        self.bytes += size
        return True

    def restore(self, count: int, size: int) -> None:
        """At start-up: ``count`` messages (``size`` body bytes) wait in the store."""
        self.paged, self.paged_after, self.bytes = count, self.first_seq, size

    # -- reading back -------------------------------------------------------------------
    def wanted(self, in_memory: int, memory_bytes: int, ahead: bool = True, scale: int = 1) -> int:
        """How many paged-out messages to ask the store for now, with ``in_memory``
        messages and ``memory_bytes`` body bytes in memory (the queue's): 0 while a read is
        on its way or none are paged out; with nothing in memory at least one; else, if
        ``ahead``, a batch that fits ``scale`` times the read-back limits
        (:attr:`read_limit`, :attr:`read_limit_bytes`) once half a batch fits (reading
        ahead), else 0. A batch is :data:`PAGE_IN_BATCH` messages at most, fewer when the
        byte budget holds fewer at the backlog's average size."""
        # Asked at every dispatch of a queue with paged-out messages: the cheap answers
        # (a read on its way, no read-ahead wanted, no room at all) come first.
        paged = self.paged
        if self.reading or not paged:
            return 0
        live = self.live
        limit = self.read_limit
        room = scale * limit - in_memory
        if live and (not ahead or room < 1):  # the byte budget only lowers room
            return 0
        average = self.bytes // (live + paged)  # over len(self), > 0 as paged > 0
        # min() and max() written out below: each builtin call costs ~0.1 µs here
        batch = limit if limit < PAGE_IN_BATCH else PAGE_IN_BATCH
        if average:
            by_bytes = self.read_limit_bytes // average
            if by_bytes < batch:
                batch = by_bytes
            room_bytes = (scale * self.read_limit_bytes - memory_bytes) // average
            if room_bytes < room:
                room = room_bytes
        if not live:
            return max(1, min(room, batch))
        if room < (batch // 2 or 1):  # max(1, batch // 2)
            return 0
        return room if room < batch else batch

    def ask(
        self, store: Store, queue_id: int, answer: PageAnswer, ahead: bool = True, more: bool = False
    ) -> bool:
        """Ask ``store`` for paged-out messages if :meth:`wanted` now (``more``: up to
        twice the in-memory limits, for selectors looking past what is in memory);
        whether a read is on its way. The answer goes to ``answer``, then
        :meth:`answered`."""
        limit = self.wanted(self.live, self.memory_bytes, ahead or more, 2 if more else 1)
        if limit:
            self.request(store, queue_id, limit, answer)
        return self.reading

    def answered(
        self, part: Backlog, generation: int, rows: list[StoredMessage], now: float
    ) -> list[QueuedMessage]:
        """:meth:`take_page` (``part`` is this backlog)."""
        return self.take_page(generation, rows, now)

    def request(self, store: Store, queue_id: int, limit: int, answer: PageAnswer) -> None:
        """Ask ``store`` for the next ``limit`` paged-out messages; ``answer(self,
        generation, rows)`` comes on the loop, for :meth:`take_page`."""
        self.reading = True
        generation = self.generation
        store.request_queue(
            queue_id, self.paged_after, limit, self.last_seq, lambda rows: answer(self, generation, rows)
        )

    def take_page(self, generation: int, rows: list[StoredMessage], now: float) -> list[QueuedMessage]:
        """The store's answer to :meth:`request`: its messages go to the tail of memory,
        in order, but for those taken away meanwhile (purged: ``generation`` is old;
        expired on disk or held: :meth:`forget_paged`). Returns every entry taken; those
        that expired while on disk (``now``: epoch seconds) are already taken out again
        (state GONE), for the caller to dead-letter."""
        if generation != self.generation:  # cleared since: the answer is stale
            return []
        self.reading = False
        forgotten, self.forgotten = self.forgotten, set()
        read, expired = [], []
        got = 0
        memory_bytes = self.memory_bytes
        for stored in rows:
            if stored.seq <= self.paged_after:  # everything up to there left meanwhile
                continue
            got += 1
            if stored.seq in forgotten or stored.seq in self.held:  # not counted in ``paged`` any more
                self.paged_after = stored.seq
                if stored.seq > self.taken_upto:  # page_out must not move messages back before it
                    self.taken_upto = stored.seq
                continue
            entry = restored(stored)
            if stored.available_at > now:  # its redelivery back-off outlived a restart
                if stored.seq > self.taken_upto:  # outside ``ready``: page_out stays above it
                    self.taken_upto = stored.seq
                entry.state = DELAYED
                self.waiting.append((stored.available_at, entry))
                self.paged_after = stored.seq
                self.paged -= 1
                self.bytes -= len(stored.body)
                continue
            self.ready.append(entry)
            self.live += 1
            self.memory_bytes += len(stored.body)
            self.paged_after = stored.seq
            self.paged -= 1
            read.append(entry)
            if entry.expires_at and entry.expires_at <= now:
                expired.append(entry)
        if not got and not forgotten and self.paged and not self.live:  # the store lost track: do not spin
            log.error("queue '%s': %d paged-out messages missing from the store", self.name, self.paged)
            self.paged = 0
            self.bytes = self.memory_bytes = sum(len(e.message.body) for e in self.ready if e.state == READY)
        self.memory.held += self.memory_bytes - memory_bytes + len(read) * ENTRY_OVERHEAD
        for entry in expired:
            self.remove(entry)
        return read

    # -- taking out ---------------------------------------------------------------------
    def pop(self) -> QueuedMessage:
        """Pop the first READY entry (there must be one), skipping tombstones."""
        ready = self.ready
        entry = ready.popleft()
        while entry.state != READY:
            self.holes -= 1
            entry = ready.popleft()
        self.live -= 1
        size = len(entry.message.body)
        self.bytes -= size
        self.memory_bytes -= size
        self.memory.held -= size + ENTRY_OVERHEAD
        if entry.seq > self.taken_upto:
            self.taken_upto = entry.seq
        if not self.live:
            ready.clear()  # only tombstones are left
            self.holes = 0
        return entry

    def remove(self, entry: QueuedMessage) -> None:
        """Take a READY entry out of the middle (it stays as a tombstone until there are
        as many tombstones as live entries: then they are swept). Its state is GONE;
        the caller may give it another (delivered) but not READY while it is a
        tombstone: :meth:`put_back` sweeps them first."""
        entry.state = GONE
        if entry.seq > self.taken_upto:
            self.taken_upto = entry.seq
        self.live -= 1
        self.holes += 1
        size = len(entry.message.body)
        self.bytes -= size
        self.memory_bytes -= size
        self.memory.held -= size + ENTRY_OVERHEAD
        ready = self.ready
        if not self.live:
            ready.clear()
            self.holes = 0
        elif ready[0] is entry:  # taken from the head (an operator's action): no tombstone left
            while ready[0].state != READY:
                ready.popleft()
                self.holes -= 1
        elif len(ready) > 2 * self.live + 64:
            self._sweep()

    def _sweep(self) -> None:
        self.ready = deque(e for e in self.ready if e.state == READY)
        self.holes = 0

    def page_out(self, keep: int, most: int) -> list[QueuedMessage]:
        """Memory pressure: READY messages at the tail of memory, ``most`` at most and
        leaving ``keep`` in memory, join the paged-out ones (ahead of them, in order);
        returns them in seq order with state GONE, for the queue to write those not in
        the store yet. It stops at a message below :attr:`taken_upto` (one put back
        among delivered ones) and moves nothing while a read is on its way (its answer
        belongs behind them)."""
        if self.reading:
            return []
        ready = self.ready
        floor = self.taken_upto
        moved: list[QueuedMessage] = []
        memory_bytes = self.memory_bytes
        while ready and self.live > keep and len(moved) < most:
            entry = ready[-1]
            if entry.state != READY:  # a tombstone: gone already
                ready.pop()
                self.holes -= 1
                continue
            if entry.seq <= floor:
                break
            ready.pop()
            entry.state = GONE
            self.live -= 1
            self.memory_bytes -= len(entry.message.body)
            moved.append(entry)
        if moved:
            moved.reverse()
            self.paged += len(moved)
            self.paged_after = moved[0].seq - 1
            self.memory.held -= memory_bytes - self.memory_bytes + len(moved) * ENTRY_OVERHEAD
        return moved

    def put_back(self, entries: list[QueuedMessage]) -> None:
        """Returned messages (in seq order) go back to their original positions."""
        if self.holes:  # a returned entry may still be there as a tombstone
            self._sweep()
        memory_bytes = self.memory_bytes
        for entry in entries:
            entry.state = READY
            size = len(entry.message.body)
            self.bytes += size
            self.memory_bytes += size
        self.live += len(entries)
        self.memory.held += self.memory_bytes - memory_bytes + len(entries) * ENTRY_OVERHEAD
        ready = self.ready
        if not ready or entries[-1].seq < ready[0].seq:
            ready.extendleft(reversed(entries))
        else:
            self.ready = deque(heapq.merge(ready, entries))

    def clear(self, store: Store | None, queue_id: int, upto_seq: int) -> list[QueuedMessage]:
        """Purge: drop everything (paged-out messages up to ``upto_seq`` leave ``store``
        in the background); returns the in-memory entries that were READY."""
        dropped = [e for e in self.ready if e.state == READY]
        self.generation += 1  # a read on its way is answered for nothing
        self.reading = False
        self.forgotten.clear()
        if self.paged and store is not None:
            store.remove_paged(queue_id, self.paged_after, min(upto_seq, self.last_seq))
        self.ready.clear()
        self.memory.held -= self.memory_bytes + self.live * ENTRY_OVERHEAD
        self.live = self.paged = self.bytes = self.memory_bytes = self.holes = 0
        return dropped
