"""How much of one read a connection handles in one event-loop turn.

A client's read can hold thousands of frames (256 KiB of small publishes, more when
read coalescing held the socket). Handled in one go they keep the loop for hundreds
of milliseconds, and every timer waits: a delayed message due meanwhile fires that
much late. A connection therefore stops after :data:`TURN_BUDGET` seconds, stops
reading its socket, and goes on with the rest of the read in a later turn, after due
timers.

Other connections are read meanwhile, so one may overtake the rest of a long read by
a few milliseconds (RabbitMQ, a process per connection, orders nothing across
connections either). A socket held by read coalescing is different: when another
connection is about to be read, what it holds is read and handled whole first
(server/listener.py), so a second connection sees everything the first sent before
it, however long the hold.

The budget reads the clock it is given: the broker's ``core.clock.monotonic``, which
is ``time.perf_counter`` in the server and a test's manual clock in sans-I/O tests
(there a turn never runs out unless the test moves time on).
"""

from __future__ import annotations

import math
from collections.abc import Callable

TURN_BUDGET = 0.002  # seconds of one read's frames per loop turn
CHECK_EVERY = 8  # frames between looks at the clock (a look costs ~50 ns)


class TurnBudget:
    """The budget of one turn over ``frames`` frames (reads of :data:`CHECK_EVERY`
    frames or fewer are never split), measured with ``now`` (monotonic
    seconds: :meth:`leveret.core.clock.Clock.monotonic`, kept bound so a look at the
    clock is one call)."""

    __slots__ = ("_deadline", "_left", "_now")

    def __init__(self, frames: int, now: Callable[[], float]) -> None:
        self._deadline = now() + TURN_BUDGET if frames > CHECK_EVERY else math.inf
        self._left = CHECK_EVERY
        self._now = now

    def spent(self) -> bool:
        """Called before each frame: whether the rest should wait for the next turn."""
        self._left -= 1
        if self._left:
            return False
        self._left = CHECK_EVERY
        return self._now() > self._deadline
