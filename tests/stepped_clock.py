"""A clock for a real, running broker that a test can move forward: core's timers and
time run on the event loop as usual, and :meth:`SteppedClock.advance` (called on the
broker's thread, ``BlockingBroker.call``) adds an offset and runs the timers that the
offset made due, at once. Tests of long timeouts (30 minutes of consumer timeout) over
real TCP then take milliseconds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from leveret.core.clock import Clock, Timer


class _Entry:
    __slots__ = ("callback", "done", "due", "entries", "real")

    def __init__(self, callback: Callable[[], Any], due: float, entries: set) -> None:
        self.callback = callback
        self.due = due
        self.entries = entries
        self.done = False
        self.real: Timer | None = None

    def run(self) -> None:
        if not self.done:
            self.done = True
            self.entries.discard(self)
            self.callback()

    def cancel(self) -> None:
        self.done = True
        self.entries.discard(self)
        if self.real is not None:
            self.real.cancel()


class SteppedClock:
    """``base`` (the broker's LoopClock) plus :attr:`offset` seconds."""

    def __init__(self, base: Clock) -> None:
        self.base = base
        self.offset = 0.0
        self._entries: set[_Entry] = set()

    def time(self) -> float:
        return self.base.time() + self.offset

    def monotonic(self) -> float:
        return self.base.monotonic() + self.offset

    def call_later(self, delay: float, callback: Callable[[], Any]) -> _Entry:
        entry = _Entry(callback, self.monotonic() + max(delay, 0.0), self._entries)
        self._entries.add(entry)
        entry.real = self.base.call_later(delay, entry.run)
        return entry

    def advance(self, seconds: float) -> None:
        """Move time on by ``seconds`` and run what fell due, in order of due time (on
        the broker's thread)."""
        self.offset += seconds
        while True:
            now = self.monotonic()
            due = sorted((e for e in self._entries if e.due <= now), key=lambda e: e.due)
            if not due:
                return
            for entry in due:
                if entry.real is not None:
                    entry.real.cancel()
                entry.run()


def install(broker: Any) -> SteppedClock:
    """Give a started BlockingBroker's core a SteppedClock (before clients connect:
    channels take the clock when they open)."""

    def swap() -> SteppedClock:
        clock = SteppedClock(broker.core.clock)
        broker.core.clock = clock
        return clock

    return broker.call(swap)
