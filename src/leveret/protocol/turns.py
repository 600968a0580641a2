"""How much of one read a connection handles in one event-loop turn.

A client's read can hold thousands of frames (256 KiB of small publishes, more when
read coalescing held the socket). Handled in one go they keep the loop for hundreds
of milliseconds, and every timer waits: a delayed message due meanwhile fires that
much late. A connection therefore stops after :data:`TURN_BUDGET` seconds, stops
reading its socket, and goes on with the rest of the read in a later turn, after due
timers.

Connections do not overtake each other meanwhile: the rest waits in a
:class:`TurnQueue` shared by the connections of a listener, and a read on another
connection while it is not empty waits behind it. So, as when every read was handled
whole, a connection sees everything other connections had sent before it was read (a
passive declare counts every message published before it).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from typing import Any

TURN_BUDGET = 0.002  # seconds of one read's frames per loop turn
CHECK_EVERY = 8  # frames between looks at the clock (a look costs ~50 ns)


class TurnBudget:
    """The budget of one turn over ``frames`` frames (reads of fewer than
    :data:`CHECK_EVERY` frames are never split)."""

    __slots__ = ("_deadline", "_left")

    def __init__(self, frames: int) -> None:
        self._deadline = time.perf_counter() + TURN_BUDGET if frames > CHECK_EVERY else math.inf
        self._left = CHECK_EVERY

    def spent(self) -> bool:
        """Called before each frame: whether the rest should wait for the next turn."""
        self._left -= 1
        if self._left:
            return False
        self._left = CHECK_EVERY
        return time.perf_counter() > self._deadline


class TurnQueue:
    """Connections with frames left over, served one per loop turn in the order their
    frames arrived. ``call_soon`` is the event loop's."""

    def __init__(self, call_soon: Callable[[Callable[[], Any]], Any]) -> None:
        self._call_soon = call_soon
        self._waiting: deque[Callable[[], None]] = deque()
        self._running: Callable[[], None] | None = None
        self._scheduled = False

    @property
    def busy(self) -> bool:
        """Whether frames wait: a new read must then wait behind them."""
        return bool(self._waiting) or self._running is not None

    def defer(self, resume: Callable[[], None]) -> None:
        """Call ``resume`` in a later turn, after those that waited before it; the one
        running now, deferring again, stays first (its frames came first)."""
        if resume == self._running:
            self._waiting.appendleft(resume)
        else:
            self._waiting.append(resume)
        self._schedule()

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            self._call_soon(self._turn)

    def _turn(self) -> None:
        self._scheduled = False
        if not self._waiting:
            return
        self._running = resume = self._waiting.popleft()
        try:
            resume()
        finally:
            self._running = None
            if self._waiting:
                self._schedule()
