"""Time to live (RabbitMQ): a message's (``x-message-ttl``, and its own ``expiration``:
the lower wins) and the queue's own (``x-expires``: deleted once unused that long).
Both in ms; argument and policy, the lower wins; 406 for invalid values.

:class:`Expiry` keeps the ready messages due to expire of one queue in a heap by time;
the queue dead-letters what :meth:`Expiry.due` hands it (reason ``expired``). Unlike
RabbitMQ a message expires when due even if it is not at the head of its queue."""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Any

from ...queue_config import Arguments
from ..entry import DELAYED, READY, UNACKED, QueuedMessage

if TYPE_CHECKING:
    from ...clock import Clock
    from ...message import Message

#: The arguments this feature reads (without ``x-``; also policy keys).
KEYS = ("message-ttl", "expires")


def configure(args: Arguments) -> dict[str, Any]:
    """The :class:`.QueueConfig` fields of this feature: ``message_ttl`` (ms, 0: deliver
    now or die) and ``expires`` (ms, at least 1); None: none."""
    return {"message_ttl": args.get("message-ttl", int, 0), "expires": args.get("expires", int, 1)}


class Expiry:
    """The expiring messages of one queue: ``message_ttl`` ms (None: only messages'
    own expirations), times from ``clock`` (epoch seconds)."""

    __slots__ = ("clock", "heap", "message_ttl")

    def __init__(self, clock: Clock, message_ttl: int | None) -> None:
        self.clock = clock
        self.message_ttl = message_ttl
        self.heap: list[tuple[float, int, QueuedMessage]] = []

    def expires_at(self, message: Message) -> float:
        """Epoch seconds when ``message`` expires in this queue (0: never)."""
        ttl = self.message_ttl
        own = message.ttl
        if own is not None:
            ttl = own if ttl is None else min(ttl, own)
        if ttl is None:
            return 0.0
        return self.clock.time() + ttl / 1000

    def watch(self, entry: QueuedMessage, live: int) -> bool:
        """Watch ``entry`` (with ``expires_at`` set); ``live`` is how many messages the
        queue holds in memory (settled ones are swept from the heap beyond twice that).
        Returns whether it is due before every other: the timer must move earlier."""
        heap = self.heap
        if len(heap) > 2 * live + 64:
            self.sweep()
        first = not heap or entry.expires_at < heap[0][0]
        heapq.heappush(heap, (entry.expires_at, entry.seq, entry))
        return first

    def sweep(self) -> None:
        """Drop settled or paged-out messages from the heap (their bodies with them)."""
        heap = self.heap
        heap[:] = [item for item in heap if item[2].state in (READY, UNACKED, DELAYED)]
        heapq.heapify(heap)

    def due(self, now: float, limit: int | None = None) -> list[QueuedMessage]:
        """The ready messages whose time has come (taken off the heap), each once: a
        message requeued after its delivery is on the heap twice (same key, adjacent).
        At most ``limit`` of them (the rest stay on the heap for the next call)."""
        heap = self.heap
        found: list[QueuedMessage] = []
        while heap and heap[0][0] <= now and (limit is None or len(found) < limit):
            entry = heapq.heappop(heap)[2]
            if entry.state == READY and entry.expires_at <= now and not (found and found[-1] is entry):
                found.append(entry)
        return found

    def next_due(self) -> float | None:
        """When the next watched message is due (epoch seconds), or None."""
        return self.heap[0][0] if self.heap else None

    def clear(self) -> None:
        """Forget every watched message (the queue was purged)."""
        self.heap.clear()
