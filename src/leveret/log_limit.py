"""A logging filter that lets at most ``burst`` records of one kind through per
``period`` seconds, so a flood of bad connections costs a few log lines, not one each.

A kind is the logger and the message template (``record.msg`` before formatting), so
"connection %s: closing with %s" from a thousand peers is one kind. The first record
let through after some were dropped says how many: ``(and 1234 more like it)``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable


class RateLimit(logging.Filter):
    """At most ``burst`` records a kind per ``period`` seconds (``now``: a clock)."""

    def __init__(
        self, burst: int = 20, period: float = 10.0, now: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self.burst, self.period, self._now = burst, period, now
        self._kinds: dict[tuple[str, str], list[float | int]] = {}  # kind -> [window start, passed, dropped]

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether ``record`` is logged (counting the ones dropped)."""
        kind = (record.name, str(record.msg))
        now = self._now()
        state = self._kinds.get(kind)
        if state is None or now - state[0] >= self.period:
            dropped = int(state[2]) if state is not None else 0
            self._kinds[kind] = [now, 1, 0]
            if len(self._kinds) > 10_000:  # forget the oldest kinds
                del self._kinds[next(iter(self._kinds))]
            if dropped:
                record.msg = f"{record.msg} (and {dropped} more like it)"
            return True
        if state[1] < self.burst:
            state[1] += 1
            return True
        state[2] += 1
        return False


def limit(*names: str, burst: int = 20, period: float = 10.0) -> None:
    """Put one :class:`RateLimit` on each logger named (once, however often called)."""
    for name in names:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RateLimit) for f in logger.filters):
            logger.addFilter(RateLimit(burst, period))
