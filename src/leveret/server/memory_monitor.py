"""The memory resource alarm, as RabbitMQ's ``vm_memory_high_watermark``.

Every ``interval`` seconds it reads the broker's resident memory (``/proc/self/statm``)
and compares it with the high watermark (a fraction of the machine's RAM, 0.4 by
default, or an absolute number of bytes):

- above ``paging_ratio`` × watermark (0.5, RabbitMQ's default), queues page every new
  message out to the store and move the messages they hold in memory there (core's
  memory pressure), so memory stops growing with the backlog;
- the same memory pressure while the bytes queues hold messages in are over the
  broker's queue memory budget (:mod:`leveret.core.queue_memory`, with hysteresis), so
  a flood of transient messages pages to the store long before resident memory
  reaches the paging ratio (and the store's flow control then holds publishers);
- above the watermark, the alarm is raised: publishers get connection.blocked and are
  no longer read from, until memory is back under it.

Every :data:`TRIM_EVERY` seconds it also gives memory freed since back to the system
(:mod:`.malloc_trim`), so the resident size falls after a flood is consumed.

Without ``/proc`` (not Linux) only the queue memory budget applies.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from ..core.broker import BrokerCore
from .malloc_trim import MallocTrim
from .periodic import PeriodicCheck

log = logging.getLogger("leveret.alarm")

TRIM_EVERY = 5.0  # seconds between looks at the C heap's free bytes


def total_memory() -> int:
    """The machine's RAM in bytes (0 if it cannot be read)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def resident_memory() -> int | None:
    """This process's resident set in bytes, or None where /proc is not there."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class MemoryMonitor(PeriodicCheck):
    """Checks resident memory every ``interval`` seconds against ``limit()`` bytes and
    sets ``core``'s memory alarm and memory pressure."""

    def __init__(
        self,
        core: BrokerCore,
        limit: Callable[[], int],
        paging_ratio: float = 0.5,
        interval: float = 0.25,
        resident: Callable[[], int | None] = resident_memory,
        trim: MallocTrim | None = None,
        budget: Callable[[], int] | None = None,
    ) -> None:
        self.core = core
        #: the queue memory budget in bytes, read at every check (None: core's stays)
        self.budget = budget
        #: gives freed memory back to the system (:mod:`.malloc_trim`)
        self.trim = trim if trim is not None else MallocTrim()
        self._trim_countdown = 0.0  # seconds until the next look at the C heap
        self.limit = limit  # read at every check, so it can be changed at run time
        self.paging_ratio = paging_ratio
        self.interval = interval
        self._resident = resident

    def check(self) -> None:
        """Compare once; change the alarm and the pressure when their state changes;
        every :data:`TRIM_EVERY` seconds, trim the C heap if much of it is free."""
        self._trim_countdown -= self.interval
        if self._trim_countdown <= 0:
            self._trim_countdown = TRIM_EVERY
            self.trim.maybe_trim()
        used = self._resident()
        limit = self.limit()
        budget = self.core.queue_memory
        if self.budget is not None:
            budget.budget = self.budget()
        over_budget = budget.check()
        if used is None or limit <= 0:
            self._set_pressure(over_budget, used, 0)
            return
        self._set_pressure(over_budget or used > limit * self.paging_ratio, used, limit)
        high = used > limit
        if high != ("memory" in self.core.alarm_sources):
            log.warning(
                "memory %s: %d bytes resident, high watermark %d bytes",
                "alarm set" if high else "alarm cleared",
                used,
                limit,
            )
            self.core.set_alarm(high, "memory")

    def _set_pressure(self, pressure: bool, used: int | None, limit: int) -> None:
        """Set core's memory pressure to ``pressure`` if it changes, saying why."""
        if pressure == self.core.memory_pressure:
            return
        budget = self.core.queue_memory
        log.warning(
            "memory %s: %s bytes resident (paging above %d), queues hold %d bytes (budget %d)",
            "pressure: paging messages out" if pressure else "pressure over",
            used,
            int(limit * self.paging_ratio),
            budget.held,
            budget.budget,
        )
        self.core.set_memory_pressure(pressure)
