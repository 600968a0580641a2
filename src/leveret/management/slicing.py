"""Long management work done in slices, so the event loop keeps serving clients.

The management API and the Prometheus endpoint run on the broker's event loop. With
100,000 queues, building every queue's row or series in one go held the loop for
seconds and every AMQP/STOMP client waited (issue 27). Work over many objects here is
cut into slices of at most :data:`SLICE_SECONDS` of CPU: after each, the handler gives
the loop back (``await asyncio.sleep(0)``: one turn, in which ready sockets are
served) and carries on. A request then takes about as much CPU as before, spread out,
and a client's longest wait is one slice plus its own work.

RabbitMQ does the same work in other Erlang processes, which its scheduler preempts;
here preemption is by hand.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

#: Seconds of work between two turns of the event loop (5 ms).
SLICE_SECONDS = 0.005
#: Items done between two looks at the clock.
STEP = 64
#: Items sorted at once before the sorted runs are merged (about 2 ms each).
RUN = 4096


class Slicer:
    """Gives the event loop a turn once :data:`SLICE_SECONDS` (or ``seconds``) of work
    went by since the last one."""

    def __init__(self, seconds: float = SLICE_SECONDS) -> None:
        self.seconds = seconds
        self._since = time.perf_counter()

    def due(self) -> bool:
        """Whether this slice is used up."""
        return time.perf_counter() - self._since >= self.seconds

    async def pause(self) -> None:
        """A turn of the loop if this slice is used up."""
        if time.perf_counter() - self._since >= self.seconds:
            await asyncio.sleep(0)
            self._since = time.perf_counter()

    async def map(self, function: Callable[[T], R], items: Iterable[T], step: int = STEP) -> list[R]:
        """``[function(item) for item in items]``, in slices."""
        found: list[R] = []
        iterator = iter(items)
        while batch := list(islice(iterator, step)):
            found += map(function, batch)
            await self.pause()
        return found

    async def filter(self, keep: Callable[[T], bool], items: Iterable[T], step: int = 1024) -> list[T]:
        """The ``items`` ``keep`` keeps, in slices."""
        found: list[T] = []
        iterator = iter(items)
        while batch := list(islice(iterator, step)):
            found += filter(keep, batch)
            await self.pause()
        return found

    async def take(self, iterator: Iterator[T], count: int, step: int = 1024) -> list[T]:
        """The next ``count`` items of ``iterator`` (fewer at its end), in slices."""
        found: list[T] = []
        while len(found) < count:
            batch = list(islice(iterator, min(step, count - len(found))))
            if not batch:
                break
            found += batch
            await self.pause()
        return found

    async def sorted(self, items: Sequence[T], key: Callable[[T], Any], reverse: bool = False) -> Iterator[T]:
        """``items`` in the order of ``sorted(items, key=key, reverse=reverse)`` (stable,
        equal keys keep their order), lazily: runs of :data:`RUN` items are sorted one
        slice each, then merged as the caller reads (taking the first ``k`` costs about
        ``k`` steps, not a sort of everything at once)."""
        keys = await self.map(key, items, step=512)
        runs: list[list[tuple[Any, int]]] = []
        for start in range(0, len(items), RUN):
            run = list(zip(keys[start : start + RUN], range(start, start + RUN)))
            # by key only: ties keep their index order, also when reversed
            run.sort(key=_first, reverse=reverse)
            runs.append(run)
            await self.pause()
        merged = heapq.merge(*runs, key=_first, reverse=reverse)
        return (items[index] for _, index in merged)


def _first(pair: tuple[Any, int]) -> Any:
    return pair[0]


__all__ = ["SLICE_SECONDS", "Slicer"]
