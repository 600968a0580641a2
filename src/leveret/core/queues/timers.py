"""Named one-shot timers on core's clock, as a queue uses them (TTL, redelivery,
``x-expires``): arming one that is already armed keeps the earlier deadline. A timer is
an entry point into its queue: once its callback returns, the host carries out what
the queue recorded (:mod:`.host`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..clock import Timer
    from .host import QueueHost


class Timers:
    """The armed timers of one owner, by name, on ``host``'s clock."""

    def __init__(self, host: QueueHost) -> None:
        self.host = host
        self.clock = host.clock
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
        self._timers[name] = self.clock.call_later(delay, lambda: self._fire(callback))
        self._due[name] = due

    def _fire(self, callback: Callable[[], Any]) -> None:
        callback()
        host = self.host
        if host.actions:
            host.carry_out()

    def fired(self, name: str) -> None:
        """Timer ``name``'s callback runs: it is no longer armed."""
        self._timers.pop(name, None)

    def cancel_all(self) -> None:
        """Cancel every armed timer (the owner is deleted or stopping)."""
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
