"""Time and timers for core: one injected :class:`Clock`, so tests can step time.

The server gives core the event loop's clock (:class:`leveret.server.clock.LoopClock`);
tests give a :class:`ManualClock`, which runs callbacks only when a test calls
:meth:`ManualClock.advance`. Times are seconds: ``time()`` is wall-clock (epoch, for
``x-death`` and message expiry), ``monotonic()`` measures the budgets of a few
milliseconds that bound one loop turn's work (protocol/turns.py, the scheduler's firing)
and read coalescing's gaps (server/read_coalescing.py), timers take delays.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any, Protocol


class Timer(Protocol):
    """A pending callback of :meth:`Clock.call_later` (asyncio's TimerHandle fits)."""

    def cancel(self) -> None:
        """Do not run the callback (nothing happens if it ran already)."""


class Clock(Protocol):
    """What core asks for time: wall-clock seconds and one-shot timers."""

    def time(self) -> float:
        """Wall-clock time, epoch seconds."""

    def monotonic(self) -> float:
        """Monotonic seconds, precise to a microsecond (a budget is 2 ms). Read per
        turn, not per message: the server's is ``time.perf_counter`` itself, so a
        caller may keep the bound function and call it with no indirection."""

    def call_later(self, delay: float, callback: Callable[[], Any]) -> Timer:
        """Run ``callback`` once after ``delay`` seconds (at once if negative)."""


class _ManualTimer:
    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    """A clock that moves only when told: ``advance(seconds)`` runs due timers."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start
        self._timers: list[tuple[float, int, _ManualTimer, Callable[[], Any]]] = []
        self._order = itertools.count()

    def time(self) -> float:
        """The clock's epoch seconds (``start`` plus every :meth:`advance`)."""
        return self.now

    def monotonic(self) -> float:
        """The same :attr:`now`: a budget never runs out unless a test advances time."""
        return self.now

    def call_later(self, delay: float, callback: Callable[[], Any]) -> Timer:
        """Run ``callback`` when :meth:`advance` passes ``now + delay`` seconds."""
        timer = _ManualTimer()
        heapq.heappush(self._timers, (self.now + max(delay, 0.0), next(self._order), timer, callback))
        return timer

    def advance(self, seconds: float) -> None:
        """Move time on by ``seconds``, running due timers in order of their due time
        (ties in order of arming), each with ``now`` set to its due time."""
        end = self.now + seconds
        while self._timers and self._timers[0][0] <= end:
            when, _, timer, callback = heapq.heappop(self._timers)
            self.now = max(self.now, when)
            if not timer.cancelled:
                callback()
        self.now = end
