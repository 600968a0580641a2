"""Consumer timeouts (RabbitMQ's ``consumer_timeout``): how long a delivery may stay
unacknowledged, and the timers that notice when one has waited too long.

Settings, in milliseconds, as RabbitMQ 3.12 and 4.3 resolve them:

- the broker's ``consumer_timeout`` (:class:`.broker.Limits`; RabbitMQ's default, 30
  minutes; 0 turns it off, which RabbitMQ spells ``undefined`` in advanced.config);
- a queue's ``x-consumer-timeout`` argument and a policy's ``consumer-timeout`` key:
  when both are set the lower wins (RabbitMQ's ``args_policy_lookup`` with ``min``), and
  either wins over the broker's;
- basic.consume's ``x-consumer-timeout`` argument (RabbitMQ 4.3) wins over all of them.

What happens on a timeout is the queue's ``x-consumer-timeout-mode`` (policy key
``consumer-timeout-mode``; a leveret name, RabbitMQ 4.3 has none: it picks by queue
type and client capability): ``close`` (the default, RabbitMQ 3.12's: the channel is
closed with 406 PRECONDITION_FAILED and all its unacknowledged messages return) or
``graceful`` (RabbitMQ 4.3's for quorum queues: only the timed-out deliveries return and
their consumer gets basic.cancel; see :mod:`leveret.protocol.amqp.channel`).

:class:`Deadlines` watches one channel's deliveries. RabbitMQ looks at the oldest
unacknowledged delivery of each channel once a minute (``channel_tick_interval``);
here each group of deliveries sharing a timeout has one timer on core's injected clock,
armed for its earliest deadline, so a delivery is noticed at most ``timeout / 64``
(never more than :data:`MAX_LATENESS`) after it is due, and never before. The cost per
delivery is a clock read and a comparison; an idle channel has no timer at all.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable
from typing import Any

from .clock import Clock, Timer
from .errors import precondition_failed

#: RabbitMQ's default ``consumer_timeout``: 30 minutes, in ms.
DEFAULT_CONSUMER_TIMEOUT = 1_800_000
#: The most a timed-out delivery is noticed late, in seconds (a shorter timeout is
#: noticed within 1/64 of itself).
MAX_LATENESS = 5.0
#: The least granularity, in seconds: deliveries closer together than this share one
#: mark (so a timeout of 0 does not cost a mark per delivery).
MIN_LATENESS = 0.001
#: ``x-consumer-timeout-mode`` values: RabbitMQ 3.12's (close the channel) and 4.3's.
MODES = ("close", "graceful")
#: Timed-out deliveries a channel remembers, so that their late ack is not an error.
REMEMBERED = 65_536


def consume_timeout(arguments: dict, where: str) -> int | None:
    """basic.consume's ``x-consumer-timeout`` (ms, RabbitMQ 4.3) or None when absent;
    PreconditionFailed (406) unless a non-negative integer."""
    value = arguments.get("x-consumer-timeout")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise precondition_failed(f"invalid arg 'x-consumer-timeout'{where}: {value!r}")
    return value


def granularity(timeout: float) -> float:
    """Seconds by which a delivery of a ``timeout`` seconds group may be noticed late."""
    return max(MIN_LATENESS, min(timeout / 64, MAX_LATENESS))


class _Group:
    """The deliveries of one channel sharing one ``key`` (timeout and mode): marks
    ``(first tag, monotonic seconds)``, one per :func:`granularity`, so every delivery
    with a tag from one mark up to the next went out less than ``lateness`` after the
    mark's time."""

    __slots__ = ("cursor", "key", "lateness", "mark_until", "marks", "monotonic", "owner", "timeout", "timer")

    def __init__(self, owner: Deadlines, key: Hashable, timeout: float) -> None:
        self.owner = owner
        self.monotonic = owner.monotonic
        self.key = key
        self.timeout = timeout
        self.lateness = granularity(timeout)
        self.marks: deque[tuple[int, float]] = deque()
        self.mark_until = float("-inf")
        self.cursor = 0  # tags below it are known to be settled (or another group's)
        self.timer: Timer | None = None

    def delivered(self, tag: int) -> None:
        """Delivery ``tag`` (tags only grow) went out now."""
        now = self.monotonic()
        if now >= self.mark_until:
            self.mark(tag, now)

    def mark(self, tag: int, now: float) -> None:
        """Delivery ``tag`` went out at ``now`` (monotonic seconds), at or past
        :attr:`mark_until`: it starts a new mark (callers on a hot path test that
        themselves and call this, instead of :meth:`delivered`)."""
        self.marks.append((tag, now))
        self.mark_until = now + self.lateness
        if self.timer is None:
            self._arm(now)

    def _arm(self, now: float) -> None:
        due = self.marks[0][1] + self.lateness + self.timeout
        self.timer = self.owner.clock.call_later(max(due - now, 0.0), self._fire)

    def rewind(self, tag: int) -> None:
        """Delivery ``tag`` is unacknowledged again (tx.rollback): it keeps a deadline no
        earlier than its first one."""
        marks = self.marks
        if tag >= self.cursor and marks and tag >= marks[0][0]:
            return
        self.cursor = min(self.cursor, tag)
        if marks:
            if tag < marks[0][0]:
                marks.appendleft((tag, marks[0][1]))
            return
        now = self.owner.monotonic()
        marks.append((tag, now))
        self.mark_until = now + self.lateness
        if self.timer is None:
            self._arm(now)

    def _fire(self) -> None:
        self.timer = None
        owner = self.owner
        now = owner.monotonic()
        limit = now - self.timeout - self.lateness  # marks at or before it are due
        marks = self.marks
        key_of = owner.key_of
        key = self.key
        due: list[int] = []
        while marks and marks[0][1] <= limit:
            start = max(marks[0][0], self.cursor)
            marks.popleft()
            end = marks[0][0] if marks else owner.last_tag() + 1
            for tag in range(start, end):
                if key_of(tag) == key:
                    due.append(tag)
            self.cursor = end
        self._trim()
        if marks:
            self._arm(now)
        else:
            self.mark_until = float("-inf")
        if due:
            owner.expired(key, due)

    def _trim(self) -> None:
        """Forget the head marks whose deliveries are all settled (a channel acking
        quickly keeps a mark or two, not one per ``lateness`` for a whole timeout)."""
        marks = self.marks
        key_of = self.owner.key_of
        key = self.key
        while len(marks) > 1:
            start = max(marks[0][0], self.cursor)
            end = marks[1][0]
            for tag in range(start, end):
                if key_of(tag) == key:
                    self.cursor = tag
                    return
            self.cursor = end
            marks.popleft()

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class Deadlines:
    """The acknowledgement deadlines of one channel's deliveries (see the module doc).

    ``key_of(tag)`` says which group an unacknowledged delivery belongs to (the key it
    was :meth:`group`-ed under) or None once it is settled; ``expired(key, tags)``
    receives the deliveries of group ``key`` that have waited its timeout (in tag
    order; the adapter closes the channel or returns them); ``last_tag()`` the highest
    tag given so far. Timers and time come from ``clock`` (tests step a
    :class:`~.clock.ManualClock`)."""

    __slots__ = ("clock", "expired", "groups", "key_of", "last_tag", "monotonic")

    def __init__(
        self,
        clock: Clock,
        key_of: Callable[[int], Any],
        expired: Callable[[Any, list[int]], None],
        last_tag: Callable[[], int],
    ) -> None:
        self.clock = clock
        self.monotonic = clock.monotonic
        self.key_of = key_of
        self.expired = expired
        self.last_tag = last_tag
        self.groups: dict[Hashable, _Group] = {}

    def group(self, key: Hashable, timeout_ms: int) -> _Group:
        """The group of deliveries under ``key`` that time out after ``timeout_ms``;
        call its ``delivered(tag)`` for each delivery."""
        found = self.groups.get(key)
        if found is None:
            found = self.groups[key] = _Group(self, key, timeout_ms / 1000)
        return found

    def delivered(self, key: Hashable, timeout_ms: int, tag: int) -> None:
        """Delivery ``tag`` of group ``key`` went out now."""
        self.group(key, timeout_ms).delivered(tag)

    def rewind(self, key: Hashable, timeout_ms: int, tag: int) -> None:
        """Delivery ``tag`` is unacknowledged again (tx.rollback restored it)."""
        self.group(key, timeout_ms).rewind(tag)

    def close(self) -> None:
        """The channel is gone: cancel every timer."""
        for group in self.groups.values():
            group.cancel()
        self.groups.clear()

    def pending_timers(self) -> int:
        """How many timers are armed (one per group with deliveries outstanding)."""
        return sum(1 for group in self.groups.values() if group.timer is not None)
