"""The clock the server gives core: wall-clock time, timers on the event loop."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from typing import Any

from ..core.clock import Timer


class LoopClock:
    """:class:`leveret.core.clock.Clock` on an asyncio event loop (the running one when
    none is given)."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop
        # The loop's own time() will not do: uvloop's counts whole milliseconds.
        self.monotonic: Callable[[], float] = time.perf_counter

    def time(self) -> float:
        """Wall-clock time, epoch seconds."""
        return time.time()

    def call_later(self, delay: float, callback: Callable[[], Any]) -> Timer:
        """``loop.call_later`` (at once for a negative ``delay``, in seconds), never
        early: the delay is rounded up to a whole millisecond, since uvloop's timers
        (libuv's) round it to the nearest one, and a timer that fires before what it
        waits for is due would only arm itself again, turn after turn. Must be called
        on the loop's thread."""
        loop = self._loop or asyncio.get_running_loop()
        return loop.call_later(math.ceil(max(delay, 0.0) * 1000 - 1e-6) / 1000, callback)
