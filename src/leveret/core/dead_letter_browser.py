"""Dead letters as an operator looks at them (the dead-letter console, issue 13): which
queues receive them, how many died of what where, and paging through one queue without
side effects (no requeue, no ``redelivered`` flag, no reordering; RabbitMQ's management
"get" has all three).

A message's *latest death* is the one a filter and the counts use: core's own death
annotation when the broker dead-lettered it, else the first ``x-death`` entry of its
headers (a dead letter a client republished carries only those).
"""

from __future__ import annotations

import datetime
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .message import Message

if TYPE_CHECKING:
    from .queues import Queue
    from .queues.base import QueuedMessage
    from .vhost import VirtualHost

COUNT_LIMIT = 10_000  # messages of one queue looked at to count them by reason and source


@dataclass(frozen=True)
class Death:
    """A message's latest death: the queue it died in, why, and when (epoch seconds;
    None when its ``x-death`` entry has no time)."""

    queue: str
    reason: str
    time: float | None


def latest_death(message: Message) -> Death | None:
    """The latest death of ``message`` (see the module doc), or None if it never died."""
    if message.deaths:
        death = message.deaths[-1]
        return Death(death.queue, death.reason, float(death.time))
    entries = message.headers.get("x-death")
    if not isinstance(entries, list) or not entries or not isinstance(entries[0], dict):
        return None
    first = entries[0]
    when = first.get("time")
    if isinstance(when, datetime.datetime):
        seconds: float | None = (
            when.replace(tzinfo=datetime.UTC) if when.tzinfo is None else when
        ).timestamp()
    else:
        seconds = float(when) if isinstance(when, (int, float)) else None
    return Death(text(first.get("queue")), text(first.get("reason")), seconds)


def text(value: Any) -> str:
    """A header value as text (bytes decoded, None as empty)."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode(errors="replace")
    return "" if value is None else str(value)


@dataclass(frozen=True)
class DeadLetterFilter:
    """What a page of dead letters is limited to; every field given must match.
    ``reason`` and ``source_queue`` are the latest death's; ``headers`` are
    ``(name, value)`` pairs compared as text; ``min_age``/``max_age`` are seconds since
    the latest death; ``body`` must occur in the body."""

    reason: str | None = None
    source_queue: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    min_age: float | None = None
    max_age: float | None = None
    body: bytes | None = None

    def accepts(self, message: Message, now: float) -> bool:
        """Whether ``message`` passes, at ``now`` (epoch seconds)."""
        if self.body is not None and self.body not in message.body:
            return False
        for name, value in self.headers:
            if text(message.header(name)) != value:
                return False
        if (
            self.reason is None
            and self.source_queue is None
            and self.min_age is None
            and self.max_age is None
        ):
            return True
        death = latest_death(message)
        if death is None:
            return False
        if self.reason is not None and death.reason != self.reason:
            return False
        if self.source_queue is not None and death.queue != self.source_queue:
            return False
        if self.min_age is not None or self.max_age is not None:
            if death.time is None:
                return False
            age = now - death.time
            if self.min_age is not None and age < self.min_age:
                return False
            if self.max_age is not None and age > self.max_age:
                return False
        return True


@dataclass
class DeadLetterSummary:
    """A dead-letter queue at a glance: ``messages`` waiting, of which ``counted`` were
    looked at (at most :data:`COUNT_LIMIT`) to count them by latest death's reason and
    source queue; ``oldest``/``newest``: times of the earliest and latest deaths seen."""

    queue: Queue
    messages: int
    counted: int
    by_reason: Counter[str] = field(default_factory=Counter)
    by_source: Counter[str] = field(default_factory=Counter)
    oldest: float | None = None
    newest: float | None = None


def dead_letter_queues(vhost: VirtualHost) -> list[Queue]:
    """The queues of ``vhost`` that dead letters go to, by name: those bound to a queue's
    dead-letter exchange (RabbitMQ's ``x-dead-letter-exchange``, from arguments or a
    policy; every binding counts, whatever its key), and ActiveMQ's shared DLQ or
    individual ``prefix + queue`` where a queue's strategy names one that exists."""
    found: dict[str, Queue] = {}
    for queue in list(vhost.queues.values()):
        config = queue.config.dead_letter
        if config.exchange is not None:
            exchange = vhost.exchanges.get(config.exchange)
            for binding in exchange.bindings.values() if exchange is not None else ():
                target = vhost.queues.get(binding.destination.name)
                if target is not None and target is binding.destination:  # a queue, not an exchange
                    found[target.name] = target
        elif config.strategy in ("shared", "individual"):
            name = config.queue if config.strategy == "shared" else config.prefix + queue.name
            target = vhost.queues.get(name)
            if target is not None and target is not queue:
                found[name] = target
    return [found[name] for name in sorted(found)]


def summarize(queue: Queue, limit: int = COUNT_LIMIT) -> DeadLetterSummary:
    """Counts of ``queue``'s waiting messages by latest death (see
    :class:`DeadLetterSummary`); reads them as a browser does (no side effects)."""
    entries = queue.browse(limit)
    summary = DeadLetterSummary(queue, queue.message_count, len(entries))
    for entry in entries:
        death = latest_death(entry.message)
        if death is None:
            summary.by_reason["(none)"] += 1
            continue
        summary.by_reason[death.reason] += 1
        summary.by_source[death.queue] += 1
        if death.time is not None:
            summary.oldest = death.time if summary.oldest is None else min(summary.oldest, death.time)
            summary.newest = death.time if summary.newest is None else max(summary.newest, death.time)
    return summary


def page(
    queue: Queue, where: DeadLetterFilter, now: float, number: int, size: int
) -> tuple[list[QueuedMessage], bool]:
    """Page ``number`` (from 1) of ``size`` of ``queue``'s waiting messages that
    ``where`` accepts, in queue order, and whether more follow; nothing is taken from
    the queue or marked. PreconditionFailed for a queue type that cannot be browsed."""
    wanted = queue.browse(number * size + 1, where=lambda entry: where.accepts(entry.message, now))
    start = (number - 1) * size
    return wanted[start : start + size], len(wanted) > start + size
