"""Browsing a queue and the dead-letter console's actions on waiting messages: a JMS
queue browser (:meth:`HoldAndScan.browse`), a scan in steps (:meth:`HoldAndScan.scan`),
and taking messages out for an operator's action and settling or releasing them
(:meth:`HoldAndScan.hold`, :meth:`HoldAndScan.settle_held`, :meth:`HoldAndScan.release`).
No argument turns them on.

:class:`HoldAndScan` is mixed into :class:`..classic.ClassicQueue`: it reads the queue's
own storage (its backlog, in memory and paged out to the store), as LavinMQ's queue
features are modules included into its queue.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from ...selector import message_lookup
from ..backlog import PAGE_IN_BATCH, restored
from ..entry import GONE, READY, UNACKED, QueuedMessage
from ..host import hands_back

if TYPE_CHECKING:
    from ....store import Store
    from ...selector import Selector
    from ..backlog import Backlog
    from ..priority_backlog import PriorityBacklog

#: Batches of paged-out messages a queue browser reads, at most (100,000 messages, in
#: rows: :meth:`HoldAndScan.scan` reads smaller batches when it wants few).
BROWSE_BATCHES = 100


def _seq(entry: QueuedMessage) -> int:
    return entry.seq


class HoldAndScan:
    """Browse, scan, hold, settle and release a classic queue's waiting messages."""

    if TYPE_CHECKING:  # the queue's, which this is mixed into
        backlog: Backlog | PriorityBacklog
        store: Store | None
        queue_id: int
        unacked_count: int
        deleted: bool

        def ack(self, entry: QueuedMessage) -> None: ...

        def _put_back(self, entries: list[QueuedMessage]) -> None: ...

    def browse(
        self,
        limit: int,
        selector: Selector | None = None,
        where: Callable[[QueuedMessage], bool] | None = None,
    ) -> list[QueuedMessage]:
        """Up to ``limit`` ready messages ``selector`` and ``where`` accept, in order, in
        memory then paged out (read from the store, not kept), left in the queue."""

        def wanted(entry: QueuedMessage) -> bool:
            if where is not None and not where(entry):
                return False
            return selector is None or selector.matches(message_lookup(entry.message))

        return self.scan(limit, wanted)[0]

    def scan(
        self, limit: int, where: Callable[[QueuedMessage], bool], after_seq: int = 0
    ) -> tuple[list[QueuedMessage], int, bool]:
        """Like :meth:`browse` from the message after ``after_seq`` on (seqs follow the
        delivery order, priority levels too). Returns ``(found, position, complete)``:
        ``position`` is the seq of the last message looked at, the ``after_seq`` of the
        next call; ``complete`` is true once every waiting message has been looked at.
        One call reads at most :data:`BROWSE_BATCHES` batches from the store."""
        found, position, complete = self._scan(limit, where, after_seq)
        return [entry for entry, _ in found], position, complete

    def _scan(
        self, limit: int, where: Callable[[QueuedMessage], bool], after_seq: int
    ) -> tuple[list[tuple[QueuedMessage, bool]], int, bool]:
        """:meth:`scan`, with each entry's ``paged`` flag (read from the store)."""
        found: list[tuple[QueuedMessage, bool]] = []
        position = after_seq
        budget = [BROWSE_BATCHES * PAGE_IN_BATCH]
        # store reads sized to what is wanted (a job takes a few dozen at a time)
        batch = min(PAGE_IN_BATCH, max(2 * limit, 128))
        for entry, paged in self._waiting(after_seq, budget, batch):
            position = entry.seq
            if where(entry):
                found.append((entry, paged))
                if len(found) >= limit:
                    return found, position, False
        return found, position, budget[0] >= 0

    def _waiting(self, after_seq: int, budget: list[int], batch: int) -> Iterator[tuple[QueuedMessage, bool]]:
        """The waiting messages after ``after_seq`` in delivery order, as ``(entry,
        paged)``: those in memory, then each level's paged-out ones as entries read
        from the store ``batch`` at a time (not kept), passing over held ones.
        ``budget[0]`` rows read from the store at most: it is -1 when they ran out
        before the last message."""
        store = self.store
        held = self.backlog.held
        for part in self.backlog.parts:  # a priority queue's levels, highest first
            if part.last_seq <= after_seq:
                continue
            ready = part.ready
            start = bisect.bisect_right(ready, after_seq, key=_seq) if after_seq else 0
            for entry in itertools.islice(ready, start, None):  # (skips in C)
                if entry.state == READY:
                    yield entry, False
            after = max(part.paged_after, after_seq)
            while part.paged and store is not None:
                if budget[0] <= 0:
                    budget[0] = -1
                    return
                rows = store.read_queue(self.queue_id, after, min(batch, budget[0]), part.last_seq)
                budget[0] -= len(rows)
                if not rows:
                    break
                for stored in rows:
                    after = stored.seq
                    if stored.seq in held:
                        continue
                    yield restored(stored), True

    # -- an operator's actions on waiting messages (the dead-letter console) -----------
    def hold(
        self, limit: int, where: Callable[[QueuedMessage], bool], after_seq: int = 0
    ) -> tuple[list[QueuedMessage], int, bool]:
        """Take up to ``limit`` waiting messages ``where`` accepts out of the queue, as
        :meth:`scan` finds them, without delivering them: no delivery is counted, no
        ``redelivered`` flag set. They count as unacknowledged until :meth:`settle_held`
        (gone: acknowledged) or :meth:`release` (back in their places, unchanged); a
        persistent one keeps its row in the store meanwhile, so a crash leaves it in the
        queue. Returns what :meth:`scan` returns."""
        found, position, complete = self._scan(limit, where, after_seq)
        backlog = self.backlog
        for entry, paged in found:
            if paged:  # read from the store: its row is passed over from now on
                backlog.forget_paged(entry.seq, len(entry.message.body))
                backlog.held.add(entry.seq)
            else:
                backlog.remove(entry)
            entry.state = UNACKED
            self.unacked_count += 1
        return [entry for entry, _ in found], position, complete

    def settle_held(self, entries: list[QueuedMessage]) -> None:
        """Held messages (:meth:`hold`) are done with: they leave the queue and the
        store, as acknowledged."""
        for entry in entries:
            self.ack(entry)
            self.backlog.held.discard(entry.seq)

    @hands_back
    def release(self, entries: list[QueuedMessage]) -> None:
        """Held messages (:meth:`hold`, in seq order) go back to their places in the
        queue as they were (not marked redelivered)."""
        if self.deleted:
            return
        backlog = self.backlog
        back = []
        for entry in entries:
            if entry.state != UNACKED:
                continue
            self.unacked_count -= 1
            if entry.seq in backlog.held:
                backlog.held.discard(entry.seq)
                if backlog.unforget_paged(entry.seq, len(entry.message.body)):
                    entry.state = GONE  # counted as paged out again; its row is read back later
                    continue
            back.append(entry)
        self._put_back(back)
