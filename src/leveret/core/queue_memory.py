"""The broker-wide budget of memory that queues hold messages in.

Every classic queue's ready messages in memory (:class:`.queues.backlog.Backlog`) are
counted in one :class:`QueueMemory` shared by the broker: each message costs its body
bytes plus :data:`ENTRY_OVERHEAD` (the Python objects that hold it: the message, its
encoded properties, the queue entry), so a flood of tiny messages counts as well as one
of large ones. The counter is an integer attribute the backlogs add to and take from
where their ``memory_bytes`` changes: one addition per message, nothing else.

The memory monitor (:mod:`leveret.server.memory_monitor`) reads it every check: past
``budget`` bytes the broker enters memory pressure, the very state the resident-memory
paging threshold sets (:meth:`.BrokerCore.set_memory_pressure`): queues move what they
hold to the store and page every new message there, transient or persistent, so the
store's flow control (:mod:`.flow`) holds publishers whenever the writer lags. It leaves
it once the count is under ``low_ratio`` × ``budget`` (hysteresis: pressure does not
flap around the mark).

RabbitMQ bounds memory with the watermark alone, but since 3.12 its classic queues
(CQv2) keep only a small window of messages in memory per queue and write the rest,
transient ones included, to disk; ActiveMQ's ``memoryUsage`` limit (64 MB by default)
makes non-persistent messages spill to its temporary store the same way. Leveret keeps
a queue's backlog in memory while the broker-wide total is under the budget (a moderate
backlog is never written) and pages only past it.
"""

from __future__ import annotations

#: Bytes a message in memory costs beyond its body (measured: CPython 3.11, a 1 KB
#: transient AMQP message waiting in a default queue holds ~1.4 KB of resident memory).
ENTRY_OVERHEAD = 512
#: The budget when none is configured: this, or a quarter of the memory high
#: watermark, whichever is smaller (bytes).
DEFAULT_BUDGET = 128 * 1024 * 1024
#: Of the watermark, at most (see :func:`default_budget`).
WATERMARK_SHARE = 0.25


def default_budget(watermark: int) -> int:
    """The default budget for a memory high watermark of ``watermark`` bytes (0:
    unknown): :data:`DEFAULT_BUDGET`, at most :data:`WATERMARK_SHARE` of it."""
    if watermark <= 0:
        return DEFAULT_BUDGET
    return min(DEFAULT_BUDGET, int(watermark * WATERMARK_SHARE))


class QueueMemory:
    """Bytes the broker's queues hold messages in (``held``: bodies plus
    :data:`ENTRY_OVERHEAD` each), against ``budget`` bytes (0 or less: no budget)."""

    __slots__ = ("budget", "held", "low_ratio", "over")

    def __init__(self, budget: int = DEFAULT_BUDGET, low_ratio: float = 0.5) -> None:
        #: bytes held now; the backlogs add and subtract directly
        self.held = 0
        self.budget = budget
        #: pressure ends under ``low_ratio`` × ``budget``
        self.low_ratio = low_ratio
        #: whether the budget is exceeded (set by :meth:`check`)
        self.over = False

    def check(self) -> bool:
        """Whether the budget is exceeded now, with hysteresis: True once ``held``
        passes ``budget``, and until it is back under ``low_ratio`` × ``budget``."""
        budget = self.budget
        if budget <= 0:
            self.over = False
        elif self.over:
            self.over = self.held >= budget * self.low_ratio
        else:
            self.over = self.held > budget
        return self.over
