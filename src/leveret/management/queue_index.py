"""Each vhost's queue names in order, kept between requests, for listing queues by name
without sorting (or even touching) them all each time.

Sorting 100,000 names takes ~90 ms of the event loop. The index keeps each vhost's
sorted names and their set, and trusts them while the broker's queue churn counters
(``queues_created``, ``queues_deleted``) and the vhost's queue count are unchanged
(and compares the sets in full, a C-level ~5-20 ms for 100,000 names, at most every
:data:`FULL_CHECK_S` seconds besides, in case queues came by another path such as
recovery). When they differ, the names gone are dropped and the new ones merged in:
a few at once with ``bisect``, many in slices (:mod:`.slicing`). Core is not asked to
keep any order: queues are declared and deleted on the hot path, and only the
management API needs them sorted.
"""

from __future__ import annotations

import asyncio
import bisect
import heapq
import itertools
import time
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, overload

from .slicing import RUN, Slicer

if TYPE_CHECKING:
    from ..core.queues import Queue
    from ..core.vhost import VirtualHost

#: Seconds between two full comparisons of a vhost's names with the index's.
FULL_CHECK_S = 10.0
#: Changes applied one by one with ``bisect`` (more: merged in slices).
FEW = 1000


@dataclass
class _Known:
    vhost: VirtualHost
    names: set[str]
    ordered: list[str]
    churn: tuple[int, int, int]
    checked: float
    #: held while the names are brought up to date: an update merged in slices gives
    #: the loop turns, and one made meanwhile must start from its result, not from
    #: the list it is replacing (else the first update's changes were lost for good)
    updating: asyncio.Lock = field(default_factory=asyncio.Lock)


class QueueIndex:
    """Sorted queue names by vhost (see the module doc)."""

    def __init__(self) -> None:
        self._known: dict[str, _Known] = {}

    async def names(self, vhost: VirtualHost, slicer: Slicer) -> list[str]:
        """``vhost``'s queue names, sorted (as of now: a caller that gives the loop a
        turn afterwards may find some of them gone). The list is not changed later:
        a caller may keep reading it."""
        metrics = vhost.metrics
        churn = (metrics.queues_created, metrics.queues_deleted, len(vhost.queues))
        now = time.monotonic()
        known = self._known.get(vhost.name)
        if known is not None and known.vhost is vhost:
            if known.churn == churn and now - known.checked < FULL_CHECK_S:
                return known.ordered
            async with known.updating:
                # the names as of now (another update may have run while this waited)
                churn = (metrics.queues_created, metrics.queues_deleted, len(vhost.queues))
                current = vhost.queues.keys()
                if current != known.names:
                    removed = known.names - current
                    added = current - known.names
                    known.names -= removed
                    known.names |= added
                    known.ordered = await _changed(slicer, known.ordered, removed, added)
                known.churn, known.checked = churn, time.monotonic()
                return known.ordered
        ordered = await _merge(slicer, await _runs(slicer, list(vhost.queues)))
        names: set[str] = set()
        for start in range(0, len(ordered), RUN):
            names.update(ordered[start : start + RUN])
            await slicer.pause()
        self._known[vhost.name] = _Known(vhost, names, ordered, churn, now)
        return ordered

    async def queues(self, vhosts: list[VirtualHost], slicer: Slicer) -> QueueList:
        """The queues of ``vhosts``, vhost by vhost, by name."""
        return QueueList([(vhost, await self.names(vhost, slicer)) for vhost in vhosts])


class QueueList(Sequence["Queue | None"]):
    """Queues by vhost, then name, read from their vhost when an item is read (None
    for one deleted since the names were taken); cheap to make for 100,000 queues."""

    def __init__(self, parts: list[tuple[VirtualHost, list[str]]]) -> None:
        self._parts = parts
        self._starts: list[int] = []
        count = 0
        for _, names in parts:
            self._starts.append(count)
            count += len(names)
        self._count = count

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[Queue | None]:
        return itertools.chain.from_iterable(map(vhost.queues.get, names) for vhost, names in self._parts)

    @overload
    def __getitem__(self, index: int) -> Queue | None: ...

    @overload
    def __getitem__(self, index: slice) -> list[Queue | None]: ...

    def __getitem__(self, index: int | slice) -> Queue | list[Queue | None] | None:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._count))]
        if index < 0:
            index += self._count
        if not 0 <= index < self._count:
            raise IndexError(index)
        part = bisect_right(self._starts, index) - 1
        vhost, names = self._parts[part]
        return vhost.queues.get(names[index - self._starts[part]])


async def _changed(slicer: Slicer, ordered: list[str], removed: set[str], added: set[str]) -> list[str]:
    """A new sorted list: ``ordered`` without ``removed``, with ``added``."""
    if len(removed) + len(added) <= FEW:
        ordered = ordered.copy()  # callers may still be reading the old one
        for name in removed:
            at = bisect.bisect_left(ordered, name)
            if at < len(ordered) and ordered[at] == name:
                del ordered[at]
        for name in added:
            bisect.insort(ordered, name)
        return ordered
    if removed:
        ordered = await slicer.filter(lambda name: name not in removed, ordered)
    return await _merge(slicer, [ordered, *await _runs(slicer, list(added))])


async def _runs(slicer: Slicer, names: list[str]) -> list[list[str]]:
    runs = []
    for start in range(0, len(names), RUN):
        runs.append(sorted(names[start : start + RUN]))
        await slicer.pause()
    return runs


async def _merge(slicer: Slicer, runs: list[list[str]]) -> list[str]:
    """The sorted ``runs`` merged into one list, in slices."""
    if len(runs) == 1:
        return runs[0]
    return await slicer.take(heapq.merge(*runs), sum(map(len, runs)))


__all__ = ["QueueIndex", "QueueList"]
