"""Redelivery with back-off (ActiveMQ's ``RedeliveryPolicy``) and delivery limits:
``x-max-redeliveries`` / ``x-delivery-limit`` (RabbitMQ's quorum-queue name; the lower
wins) make a message that has been delivered that many times more die with reason
``delivery_limit``; ``x-redelivery-delay`` (ms), ``x-redelivery-exponential``,
``x-redelivery-backoff-multiplier`` and ``x-redelivery-max-delay`` (ms) delay a
requeued message before it is ready again (:class:`...redelivery.RedeliveryPolicy`).

:class:`Delays` keeps one queue's requeued messages waiting out their delay, in a heap
by due time; the queue's redelivery timer asks it what is due."""

from __future__ import annotations

import heapq
from typing import Any

from ...queue_config import Arguments, flag, or_default
from ...redelivery import RedeliveryPolicy
from ..entry import DELAYED, QueuedMessage

#: The arguments this feature reads (without ``x-``; also policy keys).
KEYS = (
    "max-redeliveries",
    "delivery-limit",
    "redelivery-delay",
    "redelivery-exponential",
    "redelivery-backoff-multiplier",
    "redelivery-max-delay",
)


def configure(args: Arguments) -> dict[str, Any]:
    """The :class:`.QueueConfig` field of this feature: ``redelivery``."""
    limits = [
        v for v in (args.get("max-redeliveries", int, 0), args.get("delivery-limit", int, 0)) if v is not None
    ]
    return {
        "redelivery": RedeliveryPolicy(
            max_redeliveries=min(limits) if limits else -1,
            initial_delay=args.get("redelivery-delay", int, 0) or 0,
            exponential=flag(args.get("redelivery-exponential", bool), False),
            multiplier=float(args.get("redelivery-backoff-multiplier", float, 1) or 5.0),
            max_delay=or_default(args.get("redelivery-max-delay", int, 0), -1),
        )
    }


class Delays:
    """Requeued messages of one queue waiting out their redelivery delay; ``count``
    of them (they count as waiting messages of the queue)."""

    __slots__ = ("count", "heap")

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, QueuedMessage]] = []
        self.count = 0

    def wait(self, entry: QueuedMessage, due: float) -> None:
        """``entry`` is ready again at ``due`` (epoch seconds)."""
        entry.state = DELAYED
        self.count += 1
        heapq.heappush(self.heap, (due, entry.seq, entry))

    def due(self, now: float) -> list[QueuedMessage]:
        """The waiting messages whose time has come, in due order (taken out; their
        state is still DELAYED)."""
        heap = self.heap
        found = []
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)[2]
            if entry.state == DELAYED:
                self.count -= 1
                found.append(entry)
        return found

    def next_due(self) -> float | None:
        """When the next one is due (epoch seconds), or None."""
        return self.heap[0][0] if self.heap else None

    def clear(self) -> list[QueuedMessage]:
        """Forget every waiting message (the queue is purged); returns them."""
        waiting = [entry for _, _, entry in self.heap if entry.state == DELAYED]
        self.heap.clear()
        self.count = 0
        return waiting
