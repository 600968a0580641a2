"""Message rates for the management API (RabbitMQ's ``message_stats``, ``*_details``,
``churn_rates``), from the counters the broker keeps anyway (:mod:`leveret.core.metrics`):
no statistics database, only readings of those counters.

A :class:`RateSampler` reads them every ``collect_statistics_interval`` (RabbitMQ's
setting and default: 5,000 ms): the broker's, each vhost's and each queue's counts
(and queue lengths). A rate is the change between the last two readings divided by the
seconds between them, per second as RabbitMQ's. The counts themselves are answered as
they are at the time of the request (RabbitMQ's lag one interval behind).

History for charts (RabbitMQ's ``lengths_age``/``lengths_incr``/``msg_rates_age``/
``msg_rates_incr`` query parameters, seconds): the broker and each vhost keep
:data:`HISTORY` readings (10 minutes at the default interval); a queue keeps two until
someone asks for its samples, then :data:`HISTORY` from that moment on (so 10,000 queues
cost a few MB, not a statistics database). With them, a ``*_details`` object also has
``samples`` (``[{"sample", "timestamp"}]``, newest first, ``timestamp`` in epoch ms),
``avg`` and ``avg_rate``, as RabbitMQ's.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from .slicing import Slicer

if TYPE_CHECKING:
    from ..core.broker import BrokerCore
    from ..core.queues import Queue
    from ..core.vhost import VirtualHost

DEFAULT_INTERVAL = 5.0  # seconds (RabbitMQ's collect_statistics_interval: 5000 ms)
HISTORY = 121  # readings kept for charts: 10 minutes at 5 s

#: A queue's message_stats: RabbitMQ's field → :class:`~leveret.core.metrics.QueueCounters`
#: attribute.
QUEUE_STATS = (
    ("publish", "published"),
    ("deliver", "delivered_consume_manual_ack"),
    ("deliver_no_ack", "delivered_consume_auto_ack"),
    ("get", "delivered_get_manual_ack"),
    ("get_no_ack", "delivered_get_auto_ack"),
    ("get_empty", "get_empty"),
    ("deliver_get", "delivered"),
    ("redeliver", "redelivered"),
    ("ack", "acknowledged"),
)
LENGTHS = ("messages", "messages_ready", "messages_unacknowledged")
#: The broker's own message_stats (publishing side) → BrokerCounters attribute.
BROKER_STATS = (
    ("publish", "received"),
    ("confirm", "confirmed"),
    ("return_unroutable", "unroutable_returned"),
    ("drop_unroutable", "unroutable_dropped"),
)
#: RabbitMQ's churn_rates → BrokerCounters attribute.
CHURN = (
    ("connection_created", "connections_opened"),
    ("connection_closed", "connections_closed"),
    ("channel_created", "channels_opened"),
    ("channel_closed", "channels_closed"),
    ("queue_declared", "queues_declared"),
    ("queue_created", "queues_created"),
    ("queue_deleted", "queues_deleted"),
)

Reading = dict[str, int]
Series = deque[tuple[float, Reading]]


def queue_reading(queue: Queue) -> Reading:
    """``queue``'s message_stats counts and lengths now."""
    counters = queue.counters
    reading = {name: getattr(counters, attribute) for name, attribute in QUEUE_STATS}
    ready, unacked = queue.message_count, queue.unacked_count
    reading.update(messages=ready + unacked, messages_ready=ready, messages_unacknowledged=unacked)
    return reading


def total(readings: list[Reading]) -> Reading:
    """The sum of ``readings``, name by name (every name of a queue's reading, 0 when
    there is none)."""
    found: Reading = dict.fromkeys((*(name for name, _ in QUEUE_STATS), *LENGTHS), 0)
    for reading in readings:
        for name, value in reading.items():
            found[name] = found.get(name, 0) + value
    return found


#: Queues read between two turns of the event loop (a few µs each).
STEP = 32


async def total_sliced(queues: Iterable[Queue], slicer: Slicer) -> Reading:
    """:func:`total` of the ``queues``' readings, in slices (:mod:`.slicing`)."""
    found = total([])
    queues = list(queues)
    for start in range(0, len(queues), STEP):
        part = total([queue_reading(q) for q in queues[start : start + STEP]])
        for name, value in part.items():
            found[name] = found.get(name, 0) + value
        await slicer.pause()
    return found


async def broker_reading_sliced(core: BrokerCore, slicer: Slicer) -> Reading:
    """The broker-wide counts now: every queue's (deleted ones' included), the
    publishing side's and the churn counters; the queues read in slices."""
    queues = list(itertools.chain.from_iterable(v.queues.values() for v in core.vhosts.values()))
    return _broker_part(core, await total_sliced(queues, slicer))


def _broker_part(core: BrokerCore, reading: Reading) -> Reading:
    """``reading`` (the live queues' total) with the deleted queues' deliveries and the
    broker's own counters."""
    metrics = core.metrics
    for counters in metrics.retired.values():  # deleted queues' deliveries still count
        for name, attribute in QUEUE_STATS:
            reading[name] = reading.get(name, 0) + getattr(counters, attribute)
    for name, attribute in (*BROKER_STATS, *CHURN):
        reading[name] = getattr(metrics, attribute)
    return reading


class RateSampler:
    """Readings of ``core``'s counters every ``interval`` seconds (see the module doc),
    once :meth:`start` ran on the event loop."""

    def __init__(self, core: BrokerCore, interval: float = DEFAULT_INTERVAL) -> None:
        self.core = core
        self.interval = interval
        self.broker: Series = deque(maxlen=HISTORY)
        self.vhosts: dict[str, Series] = {}
        #: (vhost, queue name) -> (the queue object, its readings)
        self.queues: dict[tuple[str, str], tuple[Queue, Series]] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self.sample()
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            slicer = Slicer()
            for _ in self._sampling():  # in slices: 100,000 queues take ~0.5 s of CPU
                await slicer.pause()

    def sample(self) -> None:
        """Take one reading of everything at once (a few µs a queue)."""
        for _ in self._sampling():
            pass

    def _sampling(self) -> Iterator[None]:
        """One reading of everything, yielding every :data:`STEP` queues (the caller
        may give the event loop a turn then). Each queue's reading is stamped with
        the time it was taken; the vhosts' and the broker's with the time the last
        queue was read."""
        before = self.broker[-1][0] if self.broker else None
        now = time.time()
        seen = 0  # queues read (more kept than read: some were deleted)
        sums: list[Reading] = []
        for name, vhost in list(self.core.vhosts.items()):
            readings: list[Reading] = []
            for index, queue in enumerate(list(vhost.queues.values())):
                if index % STEP == STEP - 1:
                    readings = [total(readings)]  # a running sum: no long sum at the end
                    yield
                    now = time.time()
                key = (name, queue.name)
                seen += 1
                reading = queue_reading(queue)
                readings.append(reading)
                known = self.queues.get(key)
                if known is None or known[0] is not queue:  # new, or re-declared: counts anew
                    # it had nothing at the last reading (its traffic since then is a rate)
                    empty = [(before, dict.fromkeys(reading, 0))] if before is not None else []
                    known = self.queues[key] = (queue, deque(empty, maxlen=2))
                known[1].append((now, reading))
            sums.append(total(readings))
            self.vhosts.setdefault(name, deque(maxlen=HISTORY)).append((now, sums[-1]))
        self.broker.append((now, _broker_part(self.core, total(sums))))
        if len(self.queues) > seen:  # some were deleted: forget them
            vhosts = self.core.vhosts
            kept = list(self.queues.items())
            for start in range(0, len(kept), 1024):
                for (vhost_name, queue_name), (kept_queue, _) in kept[start : start + 1024]:
                    owner = vhosts.get(vhost_name)
                    if owner is None or owner.queues.get(queue_name) is not kept_queue:
                        del self.queues[(vhost_name, queue_name)]
                yield
        for name in [n for n in self.vhosts if n not in self.core.vhosts]:
            del self.vhosts[name]

    def queue_series(self, queue: Queue, watch: bool = False) -> Series:
        """``queue``'s readings; ``watch``: keep :data:`HISTORY` of them from now on."""
        key = (queue.host.name, queue.name)
        known = self.queues.get(key)
        series: Series = known[1] if known is not None and known[0] is queue else deque(maxlen=2)
        if watch and series.maxlen != HISTORY:
            series = deque(series, maxlen=HISTORY)
            self.queues[key] = (queue, series)
        return series

    def vhost_series(self, vhosts: list[VirtualHost]) -> Series:
        """The readings of ``vhosts`` summed, reading by reading."""
        if len(vhosts) == 1:
            return self.vhosts.get(vhosts[0].name, deque())
        parts = [self.vhosts.get(v.name, deque()) for v in vhosts]
        length = min((len(p) for p in parts), default=0)
        summed: Series = deque()
        for index in range(-length, 0):
            summed.append((parts[0][index][0], total([p[index][1] for p in parts])))
        return summed


def window(query: Mapping[str, str], prefix: str) -> tuple[float, float] | None:
    """RabbitMQ's ``{prefix}_age`` and ``{prefix}_incr`` (seconds), when both are given
    as positive numbers."""
    try:
        age, incr = float(query[f"{prefix}_age"]), float(query[f"{prefix}_incr"])
    except (KeyError, ValueError):
        return None
    return (age, incr) if age > 0 and incr > 0 else None


def details(series: Series, name: str, value: int, span: tuple[float, float] | None) -> dict[str, Any]:
    """``{name}_details`` of a count now ``value``: its rate over the last two readings,
    and with ``span`` (age, incr seconds) the samples of the last ``age`` seconds, one
    each ``incr`` at most, newest first, with their average and average rate."""
    rate = 0.0
    if len(series) >= 2:
        (before, old), (after, new) = series[-2], series[-1]
        if after > before:
            rate = max(0.0, (new.get(name, 0) - old.get(name, 0)) / (after - before))
    found: dict[str, Any] = {"rate": round(rate, 1)}
    if span is not None:
        age, incr = span
        newest = series[-1][0] if series else time.time()
        samples: list[tuple[float, int]] = []
        for when, reading in reversed(series):
            if when < newest - age:
                break
            if not samples or samples[-1][0] - when >= incr - 1e-3:
                samples.append((when, reading.get(name, 0)))
        found["samples"] = [{"sample": v, "timestamp": int(t * 1000)} for t, v in samples]
        if samples:
            found["avg"] = sum(v for _, v in samples) / len(samples)
            seconds = samples[0][0] - samples[-1][0]
            found["avg_rate"] = (samples[0][1] - samples[-1][1]) / seconds if seconds > 0 else 0.0
    return found


def with_details(
    values: Mapping[str, int], series: Series, span: tuple[float, float] | None
) -> dict[str, Any]:
    """``values`` with a ``{name}_details`` beside each (RabbitMQ's form)."""
    found: dict[str, Any] = {}
    for name, value in values.items():
        found[name] = value
        found[f"{name}_details"] = details(series, name, value, span)
    return found
