"""Redelivery with back-off (ActiveMQ's ``RedeliveryPolicy``) and delivery limits:
``x-max-redeliveries`` / ``x-delivery-limit`` (RabbitMQ's quorum-queue name; the lower
wins) make a message whose delivery has failed that many times more die with reason
``delivery_limit`` (failures only: returns never count, as in RabbitMQ 4.3);
``x-redelivery-delay`` (ms), ``x-redelivery-exponential``,
``x-redelivery-backoff-multiplier`` and ``x-redelivery-max-delay`` (ms) delay a failed
message before it is ready again (:class:`...redelivery.RedeliveryPolicy`).

RabbitMQ 4.3's delayed retry is another spelling of that back-off:
``x-delayed-retry-type`` (``all``, ``failed``, ``returned`` or ``disabled``: which
come-backs wait), ``x-delayed-retry-min`` (ms, required with a type other than
``disabled``) and ``x-delayed-retry-max`` (ms, at least the min; default the min): a
message that failed k times waits ``min(min × k, max)``. Policy keys without ``x-``
too; for the type the policy wins (RabbitMQ's ``policy_has_precedence``), for min and
max the lower. Given, it replaces the ``x-redelivery-*`` back-off. Invalid values are
a 406 PRECONDITION_FAILED naming the argument (RabbitMQ 4.3 checks them in policies
and ignores a bad queue argument; it accepts them on quorum queues only, leveret on
classic queues too).

:class:`Delays` keeps one queue's requeued messages waiting out their delay, in a heap
by due time; the queue's redelivery timer asks it what is due."""

from __future__ import annotations

import heapq
from typing import Any

from ...errors import precondition_failed
from ...queue_config import Arguments, flag, or_default
from ...redelivery import DELAYED_RETRY_TYPES, RedeliveryPolicy
from ..entry import DELAYED, QueuedMessage

#: The arguments this feature reads (without ``x-``; also policy keys).
KEYS = (
    "max-redeliveries",
    "delivery-limit",
    "redelivery-delay",
    "redelivery-exponential",
    "redelivery-backoff-multiplier",
    "redelivery-max-delay",
    "delayed-retry-type",
    "delayed-retry-min",
    "delayed-retry-max",
)


def configure(args: Arguments) -> dict[str, Any]:
    """The :class:`.QueueConfig` field of this feature: ``redelivery``."""
    limits = [
        v for v in (args.get("max-redeliveries", int, 0), args.get("delivery-limit", int, 0)) if v is not None
    ]
    max_redeliveries = min(limits) if limits else -1
    retry = delayed_retry(args)
    if retry is not None:
        kind, low, high = retry
        return {
            "redelivery": RedeliveryPolicy(
                max_redeliveries=max_redeliveries,
                initial_delay=low,
                max_delay=high,
                linear=True,
                delayed=kind,
            )
        }
    return {
        "redelivery": RedeliveryPolicy(
            max_redeliveries=max_redeliveries,
            initial_delay=args.get("redelivery-delay", int, 0) or 0,
            exponential=flag(args.get("redelivery-exponential", bool), False),
            multiplier=float(args.get("redelivery-backoff-multiplier", float, 1) or 5.0),
            max_delay=or_default(args.get("redelivery-max-delay", int, 0), -1),
        )
    }


def delayed_retry(args: Arguments) -> tuple[str, int, int] | None:
    """RabbitMQ 4.3's delayed retry as ``(type, min ms, max ms)``, or None when not set
    or ``disabled``. PreconditionFailed (406) for a type not among ``all``, ``failed``,
    ``returned``, ``disabled``, a min or max that is not a positive integer, a type
    without a min, or a max below the min."""
    where = args.where
    args.get("delayed-retry-type", str)  # type-checked, both sources
    kind = args.policy.get("delayed-retry-type") or args.arguments.get("x-delayed-retry-type")
    if isinstance(kind, bytes):
        kind = kind.decode()
    source = "delayed-retry-type" if "delayed-retry-type" in args.policy else "x-delayed-retry-type"
    if kind is not None and kind != "disabled" and kind not in DELAYED_RETRY_TYPES:
        raise precondition_failed(
            f"invalid arg '{source}'{where}: '{kind}' is not a valid delayed retry type. "
            "Must be one of: all, failed, returned, disabled"
        )
    low = args.get("delayed-retry-min", int, 1)
    high = args.get("delayed-retry-max", int, 1)
    if kind is None or kind == "disabled":
        return None
    if low is None:
        raise precondition_failed(
            f"invalid arg '{source}'{where}: delayed-retry-min is required when delayed-retry-type is {kind}"
        )
    if high is not None and high < low:
        raise precondition_failed(
            f"invalid arg 'x-delayed-retry-max'{where}: "
            f"delayed-retry-max ({high}) must not be smaller than delayed-retry-min ({low})"
        )
    return kind, low, low if high is None else high


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
