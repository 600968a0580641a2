"""Read coalescing: wake up once per millisecond, not once per frame, for a client that
streams small writes and waits for nothing in return.

A client library that writes each frame with its own ``send`` (pika's SelectConnection
does) makes the broker wake up, read ~130 bytes and go back to sleep once per message:
measured here, that wake-up cost as much broker CPU as publishing the message itself.
NICs solve the same problem with interrupt moderation, Kafka's consumers with
``fetch.min.bytes``/``fetch.max.wait.ms``. Here, when several reads in a row were
small, came less than :data:`STREAMING_GAP` apart and left the connection with nothing
to send back, the socket is not read for ``hold`` seconds; what arrived meanwhile is
then read in one go. A connection that gets replies, confirms or deliveries from its
reads, or sends at a human pace, is never held, so request/response latency is
unchanged; a fire-and-forget stream's messages are delayed by at most ``hold``.

Nothing a held client sent is hidden from the others: before the broker reads another
connection, it ends every hold and reads what the held sockets have (the listener's
``read_held``). Code that publishes without confirms and at once looks from a second
connection (a passive declare, a basic.get) sees the messages, as it would had they been
read one by one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ..core.clock import Timer

SMALL_READ = 1024  # bytes: a read this small carries a handful of frames at most
LARGE_READ = 64 * 1024  # bytes: a read this large amortises its wake-up by itself
STREAMING_GAP = 100e-6  # seconds between reads: the client writes faster than we wake
STREAK = 4  # reads in a row that look like a stream before the socket is held


class Readable(Protocol):
    """The transport as read coalescing uses it (asyncio's or uvloop's)."""

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def is_closing(self) -> bool: ...


class TimerLoop(Protocol):
    """The event loop as read coalescing uses it."""

    def call_later(self, delay: float, callback: Callable[[], object]) -> Timer: ...


class ReadCoalescer:
    """Decides, after each read of one socket, whether to hold the socket for ``hold``
    seconds (0 disables). ``may_resume`` tells whether reading may resume when a hold
    ends (False while the connection is blocked for publishing by a resource alarm:
    that pause is the alarm's to end). ``on_hold`` and ``on_release`` are called when a
    hold starts and ends (the listener keeps the set of held sockets). ``now`` is a
    precise monotonic clock in seconds, the broker's ``core.clock.monotonic``
    (uvloop's ``loop.time()`` counts whole milliseconds; a test gives its manual
    clock)."""

    def __init__(
        self,
        transport: Readable,
        loop: TimerLoop,
        hold: float,
        may_resume: Callable[[], bool],
        on_hold: Callable[[], None] = lambda: None,
        on_release: Callable[[], None] = lambda: None,
        *,
        now: Callable[[], float],
    ) -> None:
        self._transport = transport
        self._loop = loop
        self.hold = hold
        self._may_resume = may_resume
        self._on_hold = on_hold
        self._on_release = on_release
        self._now = now
        self._last = -1.0  # when the previous read arrived
        self._streak = 0
        self._resumed = False  # the next read is what arrived during a hold
        self._timer: Timer | None = None

    @property
    def holding(self) -> bool:
        """Whether the socket is held now."""
        return self._timer is not None

    def after_read(self, size: int, quiet: bool) -> None:
        """A read of ``size`` bytes was handled; ``quiet``: it left nothing to send back
        and the connection may be paused. Holds the socket once the reads look like a
        stream (:data:`STREAK` quiet, small reads less than :data:`STREAMING_GAP`
        apart; after a hold, the read of what accumulated counts unless it is
        :data:`LARGE_READ` or more)."""
        now = self._now()
        streaming = (
            quiet
            and now - self._last < STREAMING_GAP
            and (size < SMALL_READ or (self._resumed and size < LARGE_READ))
        )
        self._last = now
        self._resumed = False
        self._streak = self._streak + 1 if streaming else 0
        if self._streak >= STREAK and self.hold > 0 and self._timer is None:
            self._streak = 0
            self._transport.pause_reading()
            self._timer = self._loop.call_later(self.hold, self._expired)
            self._on_hold()

    def release(self) -> bool:
        """End the hold now; returns whether the socket may be read (False when there was
        no hold, the transport is closing or ``may_resume`` says no). Reading it is then
        the caller's job: what arrived during the hold continues the stream."""
        if self._timer is None:
            return False
        self._timer.cancel()
        return self._end_hold()

    def _expired(self) -> None:
        if self._timer is not None and self._end_hold():
            self._transport.resume_reading()

    def _end_hold(self) -> bool:
        self._timer = None
        self._on_release()
        if self._transport.is_closing() or not self._may_resume():
            return False
        self._last = self._now()
        self._streak = STREAK - 1
        self._resumed = True
        return True
