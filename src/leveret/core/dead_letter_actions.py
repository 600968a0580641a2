"""What an operator does with dead letters (the dead-letter console, issue 13): retry
each to where it was first published, move or copy them to a queue or an exchange, or
delete them; on chosen messages (their seqs, which the console's pages show) or on
every message a :class:`~.dead_letter_browser.DeadLetterFilter` matches.

An action runs as a :class:`Job` on the event loop, :data:`CHUNK` messages at a time
(other work goes on between chunks), with its progress readable and a cancel that
takes effect between chunks. It walks the queue once, in delivery order: a message
that comes back behind its position (a consumer's requeue) is not looked at again,
and one that fails (unroutable, refused) stays where it was.

Crash safety, as ``leveret dlq replay``: a retried or moved message is published with
the broker's publisher confirms (written to disk when persistent and routed to a durable
queue) before the dead letter is removed. Meanwhile the dead letter is held out of its
queue (unacknowledged, its row still in the store: :meth:`.ClassicQueue.hold`), so a
crash between the two leaves a duplicate, never a loss. A retried message keeps its
``x-death`` history and carries ``x-replay-count`` (1 on its first retry), as the
``leveret dlq replay`` tool's do.

Every action is recorded in the audit trail when it starts (who, what, how many match)
and when it ends (how many were done and failed).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .dead_letter_browser import DeadLetterFilter, text
from .errors import BrokerError, not_found
from .exchange import DEFAULT_EXCHANGE
from .message import Message
from .publish import Publisher
from .queues.base import UNACKED

if TYPE_CHECKING:
    from .broker import BrokerCore
    from .queues import Queue
    from .queues.base import QueuedMessage
    from .session import Session

log = logging.getLogger("leveret.dead_letters")

ACTIONS = ("retry", "move", "copy", "delete")
CHUNK = 200  # messages an action takes on in one event-loop turn
KEEP_FINISHED = 100  # finished jobs a broker remembers
PREVIEW_LIMIT = 1_000_000  # messages a preview counts at most


@dataclass(frozen=True)
class Selection:
    """Which messages of a queue an action is for: those whose seq is in ``seqs`` (when
    given), else those ``filter`` accepts (every message when it is empty)."""

    seqs: frozenset[int] | None = None
    filter: DeadLetterFilter = field(default_factory=DeadLetterFilter)

    def matcher(self, now: float) -> Callable[[QueuedMessage], bool]:
        """The test of one queued message, at ``now`` (epoch seconds)."""
        if self.seqs is not None:
            seqs = self.seqs
            return lambda entry: entry.seq in seqs
        where = self.filter
        return lambda entry: where.accepts(entry.message, now)

    @property
    def start(self) -> int:
        """The seq after which the first chosen message can be."""
        return min(self.seqs) - 1 if self.seqs else 0

    def passed(self, position: int) -> bool:
        """Whether every chosen message is at or before seq ``position``."""
        return self.seqs is not None and (not self.seqs or position >= max(self.seqs))

    def describe(self) -> dict[str, Any]:
        """For the audit trail."""
        if self.seqs is not None:
            return {"messages": len(self.seqs)}
        where = self.filter
        described = {
            "reason": where.reason,
            "source_queue": where.source_queue,
            "header": [f"{name}:{value}" for name, value in where.headers] or None,
            "min_age": where.min_age,
            "max_age": where.max_age,
            "body": where.body.decode(errors="replace") if where.body is not None else None,
        }
        return {"filter": {k: v for k, v in described.items() if v is not None}}


@dataclass(frozen=True)
class Target:
    """Where a move or copy goes: ``queue`` (through the default exchange), or
    ``exchange`` with ``routing_key`` (None: each message's own routing key)."""

    queue: str | None = None
    exchange: str | None = None
    routing_key: str | None = None

    def address(self, message: Message) -> tuple[str, str]:
        if self.queue is not None:
            return DEFAULT_EXCHANGE, self.queue
        assert self.exchange is not None
        return self.exchange, message.routing_key if self.routing_key is None else self.routing_key

    def describe(self) -> dict[str, str]:
        return {k: v for k, v in vars(self).items() if v is not None}


def origin(message: Message) -> tuple[str, str] | None:
    """The exchange and routing key ``message`` was first published to, from its death
    history: RabbitMQ's ``x-first-death-exchange`` and the routing keys of the
    ``x-death`` entry of its first death (else the oldest entry), or core's oldest death
    annotation; None for a message that never died."""
    entries = message.headers.get("x-death")
    if isinstance(entries, list):
        deaths = [entry for entry in entries if isinstance(entry, dict)]
        if deaths:
            first = deaths[-1]
            headers = message.headers
            queue, reason = headers.get("x-first-death-queue"), headers.get("x-first-death-reason")
            for entry in deaths:
                if queue is not None and (text(entry.get("queue")), text(entry.get("reason"))) == (
                    text(queue),
                    text(reason),
                ):
                    first = entry
            exchange = message.headers.get("x-first-death-exchange", first.get("exchange"))
            keys = first.get("routing-keys") or [""]
            return text(exchange), text(keys[0])
    if message.deaths:
        death = message.deaths[0]
        return death.exchange, death.routing_keys[0] if death.routing_keys else ""
    return None


def retried(message: Message) -> Message:
    """The copy a retry publishes: ``x-replay-count`` one more than ``message``'s."""
    count = message.headers.get("x-replay-count")
    return message.with_headers({"x-replay-count": (count if isinstance(count, int) else 0) + 1})


@dataclass
class Job:
    """One action on one queue, and how far it got. ``state``: running, done,
    cancelled or failed (``error`` says why); ``matched``: the preview's count when it
    started; ``done``/``failed``: messages acted on / left where they were; times in
    epoch seconds."""

    id: str
    vhost: str
    queue: str
    action: str
    user: str
    selection: Selection
    target: Target | None
    matched: int
    state: str = "running"
    done: int = 0
    failed: int = 0
    error: str | None = None
    started: float = field(default_factory=time.time)
    finished: float | None = None
    cancelled: bool = False

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "vhost": self.vhost,
            "queue": self.queue,
            "action": self.action,
            "user": self.user,
            "target": self.target.describe() if self.target else None,
            "state": self.state,
            "matched": self.matched,
            "done": self.done,
            "failed": self.failed,
            "error": self.error,
            "started": self.started,
            "finished": self.finished,
        }


class _Confirms:
    """PublisherEvents of a job's publisher: which publishes were returned or nacked,
    and ``on_settled`` called once none is left unconfirmed."""

    def __init__(self) -> None:
        self.publisher: Publisher | None = None
        self.returned_now = False
        self.nacked: set[int] = set()
        self.on_settled: Callable[[], None] | None = None

    def confirms_ready(self) -> None:
        assert self.publisher is not None
        self.publisher.take_confirms()
        self._check()

    def rejected(self, seq: int, before: tuple[int, bool] | None) -> None:
        self.nacked.add(seq)
        self._check()

    def returned(self, exchange: str, message: Message) -> None:
        self.returned_now = True

    def _check(self) -> None:
        assert self.publisher is not None
        if self.on_settled is not None and not self.publisher.unconfirmed:
            callback, self.on_settled = self.on_settled, None
            callback()


class DeadLetterJobs:
    """The actions of one broker (``BrokerCore.dead_letter_jobs``): running ones and
    the last :data:`KEEP_FINISHED` finished ones."""

    def __init__(self, core: BrokerCore) -> None:
        self.core = core
        self.jobs: dict[str, Job] = {}
        self._finished: deque[str] = deque()
        self._ids = itertools.count(1)

    @staticmethod
    def preview(queue: Queue, selection: Selection, now: float) -> tuple[int, bool]:
        """How many waiting messages of ``queue`` ``selection`` chooses, and whether all
        were counted (at most :data:`PREVIEW_LIMIT`, and what one scan reads from the
        store). PreconditionFailed for a queue type that cannot be browsed."""
        found, _, complete = queue.scan(PREVIEW_LIMIT, selection.matcher(now), selection.start)
        return len(found), complete

    def start(
        self,
        session: Session,
        queue: Queue,
        action: str,
        selection: Selection,
        target: Target | None,
        source: str,
    ) -> Job:
        """Start ``action`` (one of :data:`ACTIONS`) on ``queue``'s messages chosen by
        ``selection``, as ``session``'s user (read permission on the queue, write on
        each exchange published to: AccessRefused otherwise), a chunk at a time on the
        broker's clock.
        ``target`` is needed by move and copy; NotFound for a target queue or exchange
        that does not exist, PreconditionFailed for a queue type that cannot be browsed."""
        access = session.access
        access.read("queue", queue.name)
        if action in ("move", "copy"):
            if target is None:
                raise ValueError(f"{action} needs a target queue or exchange")
            vhost = session.vhost
            if target.queue is not None and target.queue not in vhost.queues:
                raise not_found(f"no queue '{target.queue}' in vhost '{vhost.name}'")
            if target.exchange is not None:
                vhost.get_exchange(target.exchange)  # NotFound
        matched, _ = self.preview(queue, selection, self.core.clock.time())
        job = Job(
            str(next(self._ids)),
            session.vhost.name,
            queue.name,
            action,
            access.user.name,
            selection,
            target if action in ("move", "copy") else None,
            matched,
        )
        self.jobs[job.id] = job
        self.core.audit.record(
            f"dead-letters.{action}",
            job.user,
            source,
            vhost=job.vhost,
            queue=job.queue,
            job=job.id,
            matching=matched,
            **selection.describe(),
            **({"target": job.target.describe()} if job.target else {}),
        )
        _Run(self, job, session, queue, source).step()
        return job

    def cancel(self, job_id: str) -> Job | None:
        """Stop a running job after its current chunk; the job, or None if unknown."""
        job = self.jobs.get(job_id)
        if job is not None:
            job.cancelled = True
        return job

    def finished(self, job: Job, source: str) -> None:
        """``job`` ended: recorded in the audit trail; the oldest finished ones are
        forgotten past :data:`KEEP_FINISHED`."""
        job.finished = time.time()
        self.core.audit.record(
            f"dead-letters.{job.action}.{job.state}",
            job.user,
            source,
            vhost=job.vhost,
            queue=job.queue,
            job=job.id,
            done=job.done,
            failed=job.failed,
            **({"error": job.error} if job.error else {}),
        )
        self._finished.append(job.id)
        while len(self._finished) > KEEP_FINISHED:
            self.jobs.pop(self._finished.popleft(), None)


class _Run:
    """One job at work: a chunk per event-loop turn (:meth:`step`), each chunk's
    publishes confirmed before the next (see the module doc)."""

    def __init__(self, jobs: DeadLetterJobs, job: Job, session: Session, queue: Queue, source: str) -> None:
        self.jobs, self.job, self.queue, self.source = jobs, job, queue, source
        self.clock = jobs.core.clock
        self.events = _Confirms()
        self.publisher = self.events.publisher = Publisher(session, self.events)
        self.publisher.select_confirms()
        self.matcher = job.selection.matcher(self.clock.time())
        self.position = job.selection.start
        self.complete = False
        self.held: list[QueuedMessage] = []  # taken out of the queue, not settled yet
        self.sent: dict[int, QueuedMessage] = {}  # publish seq -> its dead letter
        self.failed: list[QueuedMessage] = []

    def step(self) -> None:
        """Take on the next chunk, or end the job."""
        job, queue = self.job, self.queue
        try:
            if job.cancelled:
                return self.end("cancelled")
            if queue.deleted:
                raise not_found(f"queue '{queue.name}' was deleted")
            if job.action == "copy":
                found, self.position, self.complete = queue.scan(CHUNK, self.matcher, self.position)
            else:
                found, self.position, self.complete = queue.hold(CHUNK, self.matcher, self.position)
                self.held = found
            if job.action == "delete":
                queue.settle_held(found)
                self.held = []
                job.done += len(found)
                return self.next()
            self.publish(found)
        except BrokerError as exc:
            self.end("failed", exc.text)
        except Exception as exc:  # a job must end with a state, whatever went wrong
            log.exception("dead-letter job %s failed", job.id)
            self.end("failed", str(exc))

    def publish(self, entries: list[QueuedMessage]) -> None:
        """Publish each of ``entries`` where the job sends it, mandatory and confirmed;
        :meth:`settle` once all are confirmed."""
        job, publisher, events = self.job, self.publisher, self.events
        self.sent, self.failed = {}, []
        for entry in entries:
            message = entry.message
            if job.action == "retry":
                address = origin(message)
                if address is None:
                    job.error = "a message has no death history: it cannot be retried"
                    self.failed.append(entry)
                    continue
                message = retried(message)
            else:
                assert job.target is not None
                address = job.target.address(message)
            try:
                exchange = publisher.exchange(*address)
                events.returned_now = False
                publisher.publish(exchange, message.readdressed(*address), mandatory=True)
            except BrokerError as exc:
                job.error = exc.text
                self.failed.append(entry)
                continue
            if events.returned_now:  # unroutable: its seq is confirmed, but it went nowhere
                job.error = f"unroutable: exchange '{address[0]}', routing key '{address[1]}'"
                self.failed.append(entry)
            else:
                self.sent[publisher.seq] = entry
        if publisher.unconfirmed:
            events.on_settled = self.settle
        else:
            self.settle()

    def settle(self) -> None:
        """The chunk's publishes are confirmed (or nacked): (retry, move) the dead
        letters of the confirmed ones leave the queue, the others go back."""
        nacked = self.events.nacked
        safe = [entry for seq, entry in self.sent.items() if seq not in nacked]
        self.failed += [entry for seq, entry in self.sent.items() if seq in nacked]
        nacked.clear()
        self.job.done += len(safe)
        self.job.failed += len(self.failed)
        if self.job.action != "copy":
            self.queue.settle_held(safe)
            self.queue.release(sorted(self.failed))
        self.held = []
        self.next()

    def next(self) -> None:
        """After a chunk: end, or the next chunk on a later event-loop turn (the
        broker's other work goes on between chunks)."""
        if self.complete or self.job.selection.passed(self.position):
            self.end("done")
        else:
            self.clock.call_later(0, self.step)

    def end(self, state: str, error: str | None = None) -> None:
        job = self.job
        job.state = state
        if error is not None:
            job.error = error
        self.queue.release([entry for entry in self.held if entry.state == UNACKED])  # not settled
        self.held = []
        self.publisher.close()
        self.jobs.finished(job, self.source)
