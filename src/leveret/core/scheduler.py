"""Messages held until they are due: RabbitMQ's delayed-message exchange and ActiveMQ's
scheduler, on one durable timer.

A *job* is a message with the address to publish it to (vhost, exchange, routing key)
and a :class:`Schedule`: when it is first due and what happens after each delivery.
When a job is due its message is routed as a publish to that exchange would be, at that
moment (bindings as they are then); an exchange or vhost that is gone by then drops it.

Durability: every job is a row of the store (``scheduled``), written with the publish
that made it, so a persistent one is on disk before its confirm; a delivery removes or
reschedules the row in the same store write that enqueues the message, so a job is
never lost nor delivered twice by a crash between the two. A non-persistent job is
forgotten at restart, as a non-persistent message is. After a restart, jobs that fell
due meanwhile fire at once, the others at their time.

Memory: the jobs due soonest are in memory, :data:`WINDOW` of them in the normal case;
the later ones are read back from the store in due order as the window empties, so a
million pending jobs cost the store, not the heap. Reading back never blocks the event
loop: the scheduler asks the store (:meth:`Store.request_scheduled`), which reads on its
reader thread and answers on the loop, ahead of need (when the window is half empty);
jobs due meanwhile wait for the answer. One clock timer is armed, for the
earliest. A job in memory is its store row as a plain tuple of strings, bytes and
numbers, which CPython's cyclic garbage collector stops tracking: a full window adds
nothing to a collection's pause (with objects per job, full collections of a busy
broker took 70-190 ms, and every due message waited for them).

Schedules follow ActiveMQ's message properties (``AMQ_SCHEDULED_DELAY``, ``_PERIOD`` in
ms, ``_REPEAT``: N more deliveries, -1 forever, ``_CRON``: a 5-field cron expression in
the broker's local time, each match starting a round of delay, period and repeat);
every delivery carries ``scheduledJobId``, and the ``AMQ_SCHEDULED_*`` headers are
removed from it, as ActiveMQ does. The delayed-message exchange's schedule is one
delivery after ``x-delay`` ms, which the delivered copy carries negated, as the plugin
does.
"""

from __future__ import annotations

import datetime
import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING, Any

from croniter import croniter
from sortedcontainers import SortedList

from ..store.base import ScheduledRow
from .errors import precondition_failed
from .message import Message

if TYPE_CHECKING:
    from ..store import Store
    from .clock import Clock, Timer
    from .router import Router

log = logging.getLogger("leveret.scheduler")

WINDOW = 50_000  # jobs kept in memory in the normal case
EVICT_SLACK = 5_000  # jobs over the window before the latest go back to the store only
READ_BATCH = 200  # jobs read back at a time (each read's answer is merged on the loop)
FIRE_BUDGET = 0.004  # seconds of deliveries per event-loop turn, so clients are read meanwhile
_BUDGET_EVERY = 8  # deliveries between looks at the clock
LIST_BATCH = 5_000  # jobs a listing reads from the store at a time
LIST_BATCHES = 20  # store reads a listing makes at most (100,000 jobs looked at)
_NEVER = (math.inf, 0)
#: positions in a job's row tuple (ScheduledRow's fields, in order)
_VHOST, _JOB_ID, _DUE_AT = 1, 2, 3

SCHEDULE_HEADERS = (
    "AMQ_SCHEDULED_DELAY",
    "AMQ_SCHEDULED_PERIOD",
    "AMQ_SCHEDULED_REPEAT",
    "AMQ_SCHEDULED_CRON",
)
#: What a message's encoded form contains when it may carry ActiveMQ's schedule headers.
SCHEDULE_MARK = b"AMQ_SCHEDULED_"


@dataclass
class Schedule:
    """When a job is due (ActiveMQ's job: ``delay`` and ``period`` in ms, ``repeat``
    more deliveries per round, -1 forever; ``cron`` rounds) and where it stands:
    ``left`` deliveries after the next in this round, ``round_at`` (epoch seconds) when
    the round began. ``headers`` are set on each delivered copy (None removes one)."""

    delay: int = 0
    period: int = 0
    repeat: int = 0
    cron: str | None = None
    left: int = 0
    round_at: float = 0.0
    headers: dict[str, Any] | None = None

    def first_due(self, now: float) -> float:
        """When the first delivery is due, from ``now`` (epoch seconds); starts a round."""
        self.round_at = _next_cron(self.cron, now) if self.cron else now
        self.left = self.repeat
        return self.round_at + self.delay / 1000

    def next_due(self, due: float) -> float | None:
        """After the delivery due at ``due``: when the next is due, or None when the
        job is done."""
        if self.left != 0:
            if self.left > 0:
                self.left -= 1
            return due + self.period / 1000
        if self.cron:
            self.round_at = _next_cron(self.cron, max(due, self.round_at))
            self.left = self.repeat
            return self.round_at + self.delay / 1000
        return None

    def to_json(self) -> str:
        # the fields as they are (``asdict`` deep-copies them first: 4x slower, and this
        # runs for every job written to the store)
        return json.dumps(vars(self))

    @classmethod
    def from_json(cls, text: str) -> Schedule:
        return cls(**json.loads(text))


def _next_cron(expression: str | None, after: float) -> float:
    """The first time after ``after`` (epoch seconds) that ``expression`` matches, in the
    broker's local time zone (as ActiveMQ's CronParser uses the JVM's)."""
    start = datetime.datetime.fromtimestamp(after).astimezone()
    return float(croniter(expression, start).get_next(float))


def schedule_from_headers(headers: dict[str, Any]) -> Schedule | None:
    """ActiveMQ's schedule from a message's headers (AMQP header values of any integer
    type or their text, as STOMP carries them), or None when it has none that
    schedule (a delay or period of 0 and no cron). PreconditionFailed (AMQP 406, a
    STOMP ERROR) for a value that is not an integer or a cron expression that does not
    parse."""

    def number(name: str) -> int:
        value = headers.get(name)
        if value is None:
            return 0
        if isinstance(value, (bytes, bytearray)):
            value = bytes(value).decode(errors="replace")
        try:
            return int(value)
        except (TypeError, ValueError):
            raise precondition_failed(f"invalid {name} '{value}': not an integer") from None

    delay, period, repeat = (number(n) for n in SCHEDULE_HEADERS[:3])
    cron = headers.get("AMQ_SCHEDULED_CRON")
    if isinstance(cron, (bytes, bytearray)):
        cron = bytes(cron).decode(errors="replace")
    if cron is not None:
        cron = str(cron).strip()
        if not croniter.is_valid(cron) or len(cron.split()) != 5:
            raise precondition_failed(f"invalid AMQ_SCHEDULED_CRON '{cron}': not a 5-field cron expression")
    if delay <= 0 and period <= 0 and not cron:
        return None
    if repeat < 0 and period <= 0:  # for ever, all at the same instant: refused
        raise precondition_failed(
            "invalid AMQ_SCHEDULED_REPEAT -1: repeating for ever needs AMQ_SCHEDULED_PERIOD"
        )
    return Schedule(
        max(delay, 0), max(period, 0), repeat, cron or None, headers={name: None for name in SCHEDULE_HEADERS}
    )


@dataclass
class Job:
    """A scheduled message (see the module doc); ``due_at`` in epoch seconds."""

    store_id: int
    job_id: str
    vhost: str
    exchange: str
    message: Message
    schedule: Schedule
    due_at: float
    transient: bool


@dataclass(frozen=True)
class JobInfo:
    """A job as ``leveret scheduler list`` shows it (times in epoch seconds, delays in ms)."""

    job_id: str
    vhost: str
    exchange: str
    routing_key: str
    next_due: float
    delay: int
    period: int
    repeat: int
    cron: str | None
    body_size: int
    persistent: bool


class Scheduler:
    """The broker's jobs (see the module doc). ``vhosts`` is the broker's map of
    virtual hosts, where due messages are routed; ``store`` is attached at start-up
    (:meth:`attach`), before which jobs live in memory only."""

    def __init__(self, clock: Clock, vhosts: Mapping[str, Router]) -> None:
        self.clock = clock
        self.vhosts = vhosts
        self.store: Store | None = None
        #: the keys ``(due_at, store id)`` of the jobs in memory, soonest first (sorted,
        #: so the latest go back to the store in O(log n) each when the window overflows)
        self._due: SortedList = SortedList()
        #: store id -> the job's row as a plain tuple (see the module doc), for jobs in memory
        self._memory: dict[int, tuple] = {}
        #: every job only in the store has a key at or above this
        self._horizon: tuple[float, int] = _NEVER
        self._on_disk = 0  # jobs only in the store (an estimate, for statistics)
        self._timer: Timer | None = None
        self._timer_due = math.inf
        self._next_id = 1  # store ids while there is no store
        self._job_numbers = 0
        self._reading = False  # a read of the store's next jobs is on its way

    # -- start-up --------------------------------------------------------------------
    def attach(self, store: Store, pending: int) -> None:
        """Keep jobs in ``store`` from now on; ``pending`` jobs are there already
        (read back in due order, the earliest asked for at once and taken when the
        store answers)."""
        self.store = store
        if pending:
            self._on_disk = pending
            self._horizon = (-math.inf, 0)
            self._refill()
            self._arm()

    def adopt(self) -> None:
        """Jobs may have joined the store meanwhile (a cluster node took over a dead
        node's scheduled rows): read the store again from the start, in due order (jobs
        already in memory are not taken twice)."""
        if self.store is None:
            return
        self._horizon = (-math.inf, 0)
        self._refill()
        self._arm()

    # -- adding and removing ---------------------------------------------------------
    def schedule(
        self,
        vhost: str,
        exchange: str,
        message: Message,
        schedule: Schedule,
        job_id: str | None = None,
        tag_deliveries: bool = False,
    ) -> bool:
        """Hold ``message`` for ``exchange`` of ``vhost`` until ``schedule`` says it is
        due; returns whether the job went to the store durably (a confirm must then
        wait for :meth:`Store.when_durable`). ``job_id`` defaults to a new unique id;
        with ``tag_deliveries`` each delivery carries it as ``scheduledJobId``."""
        now = self.clock.time()
        store = self.store
        if store is not None:
            store_id = store.new_scheduled_id()
        else:
            store_id, self._next_id = self._next_id, self._next_id + 1
        if job_id is None:
            self._job_numbers += 1
            job_id = f"ID:leveret-job-{int(now * 1000)}-{self._job_numbers}"
        transient = not message.persistent
        if tag_deliveries:
            schedule.headers = {**(schedule.headers or {}), "scheduledJobId": job_id}
        job = Job(store_id, job_id, vhost, exchange, message, schedule, schedule.first_due(now), transient)
        row = self._row(job)
        if store is not None:
            store.save_scheduled(row)
        if row.key() < self._horizon:
            self._remember(row)
            self._evict()
        else:
            self._on_disk += 1
        self._arm()
        return store is not None and not transient

    def cancel(self, job_id: str, vhost: str | None = None) -> bool:
        """Remove the job ``job_id`` (of ``vhost``, when given); False if there is none."""
        for store_id, row in self._memory.items():
            if row[_JOB_ID] == job_id and vhost in (None, row[_VHOST]):
                self._forget(store_id)
                if self.store is not None:
                    self.store.remove_scheduled(store_id)
                return True
        if self.store is not None:
            found = self.store.find_scheduled(job_id)
            if found is not None and vhost in (None, found.vhost):
                self.store.remove_scheduled(found.store_id)
                self._on_disk = max(0, self._on_disk - 1)
                return True
        return False

    # -- looking ---------------------------------------------------------------------
    @property
    def pending(self) -> int:
        """Jobs waiting (in memory and only in the store)."""
        return len(self._memory) + self._on_disk

    def jobs(self, vhost: str | None = None, limit: int = 100) -> list[JobInfo]:
        """Up to ``limit`` jobs (of ``vhost``, when given), the soonest due first."""
        # jobs in memory are due before any only in the store: the soonest of them first
        soonest = (self._memory[key[1]] for key in self._due)
        in_memory = (ScheduledRow(*row) for row in soonest if vhost in (None, row[_VHOST]))
        found = {row.store_id: row for row in islice(in_memory, limit)}
        if self.store is not None and self._horizon != _NEVER:
            after: tuple[float, int] = (-math.inf, 0)
            for _ in range(LIST_BATCHES):  # a bounded look (it blocks the event loop)
                if len(found) >= limit:
                    break
                rows = self.store.read_scheduled(after, LIST_BATCH)
                for row in rows:
                    if row.store_id not in self._memory and vhost in (None, row.vhost):
                        found[row.store_id] = row
                if len(rows) < LIST_BATCH:
                    break
                after = rows[-1].key()
        return [_info(row) for row in sorted(found.values(), key=ScheduledRow.key)[:limit]]

    def job(self, job_id: str) -> JobInfo | None:
        """The job ``job_id``, or None."""
        for row in self._memory.values():
            if row[_JOB_ID] == job_id:
                return _info(ScheduledRow(*row))
        found = self.store.find_scheduled(job_id) if self.store is not None else None
        return _info(found) if found is not None else None

    # -- the timer ----------------------------------------------------------------------
    def _arm(self) -> None:
        """One clock timer, for the earliest job in memory (or the store's next ones)."""
        due = self._due[0][0] if self._due else math.inf
        if self._horizon != _NEVER and not self._reading:
            due = min(due, self._horizon[0])  # the store may hold earlier ones (a read's answer arms)
        if due == math.inf:
            return
        if self._timer is not None:
            if self._timer_due <= due:
                return
            self._timer.cancel()
        self._timer_due = due
        self._timer = self.clock.call_later(max(0.0, due - self.clock.time()), self._fire)

    def _fire(self) -> None:
        self._timer, self._timer_due = None, math.inf
        now = self.clock.time()
        monotonic = self.clock.monotonic  # the clock it is given: a test's stands still
        deadline = monotonic() + FIRE_BUDGET
        fired = 0
        out_of_time = False
        due = self._due
        while not out_of_time:
            if self._horizon != _NEVER and (not due or due[0] >= self._horizon):
                self._refill()  # the store may hold earlier ones: its answer arms again
                break
            if not due or due[0][0] > now:
                break
            store_id = due.pop(0)[1]
            self._deliver(self._job(ScheduledRow(*self._memory.pop(store_id))))
            fired += 1
            out_of_time = fired % _BUDGET_EVERY == 0 and monotonic() > deadline
        if out_of_time:  # the rest in the next turn
            self._timer_due = now
            self._timer = self.clock.call_later(0, self._fire)
        else:
            self._arm()
        if self._horizon != _NEVER and len(self._memory) < WINDOW // 2:
            self._refill()  # read ahead of need, while nothing is due

    def _deliver(self, job: Job) -> None:
        headers = job.schedule.headers
        message = job.message.with_headers(headers) if headers else job.message
        vhost = self.vhosts.get(job.vhost)
        exchange = vhost.exchanges.get(job.exchange) if vhost is not None else None
        if vhost is None or exchange is None:
            log.info(
                "scheduled job %s dropped: exchange '%s' in vhost '%s' is gone",
                job.job_id,
                job.exchange,
                job.vhost,
            )
        else:
            for queue in vhost.route(exchange, message):
                queue.enqueue(message)
            if vhost.actions:  # what the queues handed back
                vhost.carry_out()
        after = job.schedule.next_due(job.due_at)
        if after is None:
            if self.store is not None:
                self.store.remove_scheduled(job.store_id)
            return
        job.due_at = after
        row = self._row(job)
        if self.store is not None:
            self.store.save_scheduled(row)
        if row.key() < self._horizon:
            self._remember(row)
            self._evict()
        else:
            self._on_disk += 1

    # -- memory window ------------------------------------------------------------------
    def _remember(self, row: ScheduledRow) -> None:
        # a plain tuple (not the slotted row): the garbage collector stops tracking it
        self._memory[row.store_id] = (
            row.store_id,
            row.vhost,
            row.job_id,
            row.due_at,
            row.exchange,
            row.routing_key,
            row.header,
            row.body,
            row.meta,
            row.schedule,
            row.transient,
        )
        self._due.add(row.key())

    def _forget(self, store_id: int) -> None:
        row = self._memory.pop(store_id)
        self._due.remove((row[_DUE_AT], store_id))

    def _evict(self) -> None:
        """Over :data:`EVICT_SLACK` jobs more than the window in memory: keep the
        :data:`WINDOW` soonest; the others wait in the store (where they are already)
        and come back in due order. Without a store all jobs stay in memory."""
        due = self._due
        if len(due) <= WINDOW + EVICT_SLACK or self.store is None:
            return
        while len(due) > WINDOW:
            key = due.pop()
            del self._memory[key[1]]
            self._on_disk += 1
        self._horizon = min(self._horizon, key)

    def _refill(self) -> None:
        """Ask the store for the next jobs, in due order, unless a read is on its way
        (:meth:`_refilled` takes the answer)."""
        assert self.store is not None
        if self._reading:
            return
        self._reading = True
        low = self._horizon
        self.store.request_scheduled((low[0], low[1] - 1), READ_BATCH, lambda rows: self._refilled(low, rows))

    def _refilled(self, low: tuple[float, int], rows: list[ScheduledRow]) -> None:
        """On the loop: the store's next jobs after ``low`` (the horizon when asked), as
        the store has them now. If jobs went back to the store meanwhile (the horizon
        moved below ``low``), the answer is dropped and the next read starts there."""
        self._reading = False
        if self._horizon == low:
            added = 0
            for row in rows:
                if row.store_id not in self._memory:
                    self._remember(row)
                    added += 1
            self._on_disk = max(0, self._on_disk - added)
            if len(rows) < READ_BATCH:
                self._horizon, self._on_disk = _NEVER, 0  # all of them are in memory now
            else:
                last = rows[-1].key()
                self._horizon = (last[0], last[1] + 1)
        self._arm()

    # -- conversions --------------------------------------------------------------------
    def _row(self, job: Job) -> ScheduledRow:
        message = job.message
        return ScheduledRow(
            job.store_id,
            job.vhost,
            job.job_id,
            job.due_at,
            job.exchange,
            message.routing_key,
            message.encoded,
            message.body,
            message.meta(),
            job.schedule.to_json(),
            job.transient,
        )

    def _job(self, row: ScheduledRow) -> Job:
        message = Message.restore(row.exchange, row.routing_key, row.header, row.body, row.meta)
        schedule = Schedule.from_json(row.schedule)
        return Job(
            row.store_id,
            row.job_id,
            row.vhost,
            row.exchange,
            message,
            schedule,
            row.due_at,
            row.transient,
        )


def _info(row: ScheduledRow) -> JobInfo:
    """What ``leveret scheduler`` shows of the job in ``row``."""
    schedule = Schedule.from_json(row.schedule)
    return JobInfo(
        row.job_id,
        row.vhost,
        row.exchange,
        row.routing_key,
        row.due_at,
        schedule.delay,
        schedule.period,
        schedule.repeat,
        schedule.cron,
        len(row.body),
        not row.transient,
    )
