"""Named one-shot timers on core's clock, as a queue uses them (TTL, redelivery,
``x-expires``): arming one that is already armed keeps the earlier deadline."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..clock import Clock, Timer


class Timers:
    """The armed timers of one owner, by name."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._timers: dict[str, Timer] = {}
        self._due: dict[str, float] = {}  # when each armed timer fires (epoch seconds)

    def arm(self, name: str, delay: float, callback: Callable[[], Any], replace: bool = False) -> None:
        """Run ``callback`` in ``delay`` seconds unless timer ``name`` is armed; with
        ``replace``, an armed one is moved earlier (never later)."""
        due = self.clock.time() + delay
        timer = self._timers.get(name)
        if timer is not None:
            if not replace or self._due[name] <= due:
                return
            timer.cancel()
        self._timers[name] = self.clock.call_later(delay, callback)
        self._due[name] = due

    def fired(self, name: str) -> None:
        """Timer ``name``'s callback runs: it is no longer armed."""
        self._timers.pop(name, None)

    def cancel_all(self) -> None:
        """Cancel every armed timer (the owner is deleted or stopping)."""
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
