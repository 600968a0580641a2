"""A priority queue's ready messages (``x-max-priority``): one :class:`.Backlog` per
priority level, as RabbitMQ 3.10's priority queues keep one backing queue per level.

RabbitMQ's rules: a queue declared with ``x-max-priority: N`` has the levels 0..N; a
message without a priority counts as 0 and one above N as N. Higher levels are
delivered first, FIFO within a level; a requeued message goes back to its place in its
level, and the head that ``x-overflow: drop-head`` drops is the head of the highest
non-empty level (the message that would be delivered next).

Each level owns a block of seqs: a message of level ``p`` gets the seq
``(N - p) << SEQ_BITS | n``, where ``n`` is the queue's running counter. So the seq order
is the delivery order across the whole queue: requeues, the store's ``ORDER BY seq``
and the queue's selector bookmarks need nothing else, and a level's paged-out messages
are one seq range in the store, read back by that range. The in-memory limits are the
queue's, over all levels; a message goes to the store when they are reached or when its
level already has paged-out messages (FIFO within the level). Reading back follows the
priority: the highest level with messages is read from the store first, so a paged-out
high-priority message still comes before the lower ones in memory.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

from ..queue_memory import ENTRY_OVERHEAD, QueueMemory
from .backlog import Backlog, PageAnswer
from .base import READY, QueuedMessage

if TYPE_CHECKING:
    from ...store import Store
    from ...store.base import StoredMessage

log = logging.getLogger("leveret.queue")

#: Bits of a seq that number messages; the ones above are the level's block
#: (256 levels at most: seqs stay below 2**62, the store's bound). The store's
#: ``SEQ_BLOCK_BITS`` (not imported: core does not load the store), which it counts
#: (``count_blocks``) and keeps together on disk by.
SEQ_BITS = 54
COUNTER_MASK = (1 << SEQ_BITS) - 1


class PriorityBacklog:
    """The ready messages of priority queue ``name`` (levels 0..``max_priority``, at most
    255), with :class:`.Backlog`'s interface; ``max_in_memory`` entries and
    ``max_in_memory_bytes`` body bytes at most in memory over all levels. A level is
    its "band" here: band 0 is the highest priority."""

    def __init__(
        self,
        name: str,
        max_in_memory: int,
        max_in_memory_bytes: int,
        max_priority: int,
        memory: QueueMemory | None = None,
    ) -> None:
        self.name = name
        #: the broker's count of bytes queues hold in memory (see :class:`.Backlog`)
        self.memory = memory = memory if memory is not None else QueueMemory()
        self.max_priority = max_priority
        self.max_in_memory = max_in_memory
        self.max_in_memory_bytes = max_in_memory_bytes
        self.waiting: list[tuple[float, QueuedMessage]] = []  # every band's (see Backlog.waiting)
        self.held: set[int] = set()  # every band's (see Backlog.held)
        self.bands = [
            Backlog(
                name,
                max_in_memory,
                max_in_memory_bytes,
                band << SEQ_BITS,
                ((band + 1) << SEQ_BITS) - 1,
                self.waiting,
                self.held,
                memory,
            )
            for band in range(max_priority + 1)
        ]
        self.count = 0  # ready messages, in memory and paged out
        self.in_memory = 0  # READY entries in memory, over all bands
        self.paged = 0
        self.bytes = 0  # body bytes of ready messages (in memory and paged)
        self.memory_bytes = 0
        self._filled = 0  # bit b set: band b holds a ready message (in memory or paged)
        #: READY entries in memory ahead of any paged-out message (those of the highest
        #: band with messages): :meth:`pop` needs no read from the store while it is > 0.
        #: An attribute, not a property: the queue's dispatch loop reads it per message.
        self.live = 0
        #: priority (None, 0..255) -> the first seq of its band, for :meth:`seq`'s fast path
        self.blocks: dict[int | None, int] = {p: self.block(p) for p in (None, *range(256))}

    def block(self, priority: int | None) -> int:
        """The bits of the band of ``priority`` (None: 0; above the maximum: the
        maximum) in a seq."""
        top = self.max_priority
        if priority is None or priority <= 0:
            band = top
        elif priority >= top:
            band = 0
        else:
            band = top - priority
        return band << SEQ_BITS

    def seq(self, priority: int | None, counter: int) -> int:
        """The seq of message number ``counter`` (1 .. 2**54-1) with ``priority``."""
        blocks = self.blocks
        return (blocks[priority] if priority in blocks else self.block(priority)) | counter

    def __len__(self) -> int:
        """Ready messages, in memory and paged out."""
        return self.count

    @property
    def parts(self) -> list[Backlog]:
        """The bands that hold messages, highest priority first."""
        return [self.bands[band] for band in self._filled_bands()]

    @property
    def ready(self) -> Iterator[QueuedMessage]:
        """The entries in memory in delivery order (GONE tombstones included)."""
        return itertools.chain.from_iterable(self.bands[band].ready for band in self._filled_bands())

    def _filled_bands(self) -> Iterator[int]:
        filled = self._filled
        while filled:
            lowest = filled & -filled
            yield lowest.bit_length() - 1
            filled ^= lowest

    def _update(self, band: Backlog, index: int, live: int, paged: int, size: int, memory: int) -> None:
        """Apply what an operation on ``band`` changed (its counters were ``live``,
        ``paged``, ``size``, ``memory`` before) to the totals."""
        self.in_memory += band.live - live
        self.paged += band.paged - paged
        self.count = self.in_memory + self.paged
        self.bytes += band.bytes - size
        self.memory_bytes += band.memory_bytes - memory
        if band.live or band.paged:
            self._filled |= 1 << index
        else:
            self._filled &= ~(1 << index)
        self._head()

    def _head(self) -> None:
        """Set :attr:`live` from the highest band with messages."""
        filled = self._filled
        self.live = self.bands[(filled & -filled).bit_length() - 1].live if filled else 0

    # -- adding -------------------------------------------------------------------------
    def must_page(self, seq: int) -> bool:
        """Whether message ``seq`` goes to the store rather than to memory: the queue's
        in-memory limits are reached, or its band has paged-out messages already."""
        return (
            self.bands[seq >> SEQ_BITS].paged > 0
            or self.in_memory >= self.max_in_memory
            or self.memory_bytes >= self.max_in_memory_bytes
        )

    def append(self, entry: QueuedMessage) -> None:
        """A new message at the tail of its band, in memory."""
        index = entry.seq >> SEQ_BITS
        band = self.bands[index]
        size = len(entry.message.body)
        # Backlog.append, inlined: once per message
        band.ready.append(entry)
        band.live += 1
        band.bytes += size
        band.memory_bytes += size
        self.memory.held += size + ENTRY_OVERHEAD
        self.in_memory += 1
        self.count += 1
        self.bytes += size
        self.memory_bytes += size
        bit = 1 << index
        filled = self._filled = self._filled | bit
        if filled & -filled == bit:  # the highest band
            self.live = band.live

    def appended_paged(self, seq: int, size: int) -> None:
        """A new message at the tail of its band was written to the store only."""
        index = seq >> SEQ_BITS
        self.bands[index].appended_paged(seq, size)
        self.paged += 1
        self.count += 1
        self.bytes += size
        self._filled |= 1 << index
        self._head()

    def paged_ranges(self) -> list[tuple[int, int]]:
        """See :meth:`.Backlog.paged_ranges`: each band's."""
        return [r for index in self._filled_bands() for r in self.bands[index].paged_ranges()]

    def forget_paged(self, seq: int, size: int) -> None:
        """See :meth:`.Backlog.forget_paged`."""
        index = seq >> SEQ_BITS
        band = self.bands[index]
        before = band.live, band.paged, band.bytes, band.memory_bytes
        band.forget_paged(seq, size)
        self._update(band, index, *before)

    def unforget_paged(self, seq: int, size: int) -> bool:
        """See :meth:`.Backlog.unforget_paged`."""
        index = seq >> SEQ_BITS
        band = self.bands[index]
        before = band.live, band.paged, band.bytes, band.memory_bytes
        kept = band.unforget_paged(seq, size)
        self._update(band, index, *before)
        return kept

    def restore(self, blocks: dict[int, tuple[int, int, int]]) -> int:
        """At start-up: the store holds, per band, ``(count, highest seq, body bytes)``
        (:meth:`Store.count_blocks`). Returns the highest message
        number found (the queue's counter goes on from there)."""
        highest = 0
        for index, (count, last_seq, size) in blocks.items():
            if index >= len(self.bands):  # cannot happen: x-max-priority never changes
                log.error("queue '%s': %d stored messages of an unknown priority level", self.name, count)
                continue
            band = self.bands[index]
            band.restore(count, size)
            self._update(band, index, 0, 0, 0, 0)
            highest = max(highest, last_seq & COUNTER_MASK)
        return highest

    # -- reading back -------------------------------------------------------------------
    def ask(
        self, store: Store, queue_id: int, answer: PageAnswer, ahead: bool = True, more: bool = False
    ) -> bool:
        """Ask ``store`` for the paged-out messages of the highest band that has some,
        if wanted now (see :meth:`.Backlog.wanted`, with the queue's totals in memory);
        whether a read is on its way. A band read back comes before the lower ones in
        memory, so :attr:`live` (the head band's) stays 0 until its answer."""
        for index in self._filled_bands():
            band = self.bands[index]
            if band.paged:
                scale = 2 if more else 1
                limit = band.wanted(self.in_memory, self.memory_bytes, ahead or more, scale)
                if limit:
                    band.request(store, queue_id, limit, answer)
                return band.reading
        return False

    def answered(
        self, part: Backlog, generation: int, rows: list[StoredMessage], now: float
    ) -> list[QueuedMessage]:
        """The answer to a read of band ``part`` (see :meth:`.Backlog.take_page`)."""
        index = part.first_seq >> SEQ_BITS
        before = part.live, part.paged, part.bytes, part.memory_bytes
        read = part.take_page(generation, rows, now)
        self._update(part, index, *before)
        return read

    # -- taking out ---------------------------------------------------------------------
    def pop(self) -> QueuedMessage:
        """Pop the head: the first READY entry of the highest band (:attr:`live` must be
        > 0)."""
        filled = self._filled
        index = (filled & -filled).bit_length() - 1
        band = self.bands[index]
        # Backlog.pop, inlined: once per delivery
        ready = band.ready
        entry = ready.popleft()
        while entry.state != READY:  # tombstones
            band.holes -= 1
            entry = ready.popleft()
        size = len(entry.message.body)
        band.bytes -= size
        band.memory_bytes -= size
        self.memory.held -= size + ENTRY_OVERHEAD
        live = band.live = band.live - 1
        self.in_memory -= 1
        self.count -= 1
        self.bytes -= size
        self.memory_bytes -= size
        if live:
            self.live = live
        else:
            ready.clear()  # only tombstones are left
            band.holes = 0
            if not band.paged:
                self._filled = filled ^ (1 << index)
            self._head()
        return entry

    def remove(self, entry: QueuedMessage) -> None:
        """Take a READY entry out of the middle (see :meth:`.Backlog.remove`)."""
        index = entry.seq >> SEQ_BITS
        band = self.bands[index]
        before = band.live, band.paged, band.bytes, band.memory_bytes
        band.remove(entry)
        self._update(band, index, *before)

    def put_back(self, entries: list[QueuedMessage]) -> None:
        """Returned messages (in seq order) go back to their places in their bands."""
        for index, group in itertools.groupby(entries, key=lambda entry: entry.seq >> SEQ_BITS):
            band = self.bands[index]
            before = band.live, band.paged, band.bytes, band.memory_bytes
            band.put_back(list(group))
            self._update(band, index, *before)

    def clear(self, store: Store | None, queue_id: int, upto: int) -> list[QueuedMessage]:
        """Purge: drop everything (paged-out messages numbered up to ``upto`` leave
        ``store`` in the background); returns the in-memory entries that were READY."""
        dropped: list[QueuedMessage] = []
        for band in self.bands:
            if band.reading:  # its answer is for nothing now
                band.generation += 1
                band.reading = False
        for index in self._filled_bands():
            band = self.bands[index]
            dropped += band.clear(store, queue_id, band.first_seq + upto)
        self.count = self.in_memory = self.paged = self.bytes = self.memory_bytes = self._filled = 0
        self.live = 0
        return dropped
