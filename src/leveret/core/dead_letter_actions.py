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
from typing import TYPE_CHECKING, Any, Protocol

from .dead_letter_browser import DeadLetterFilter, text
from .errors import BrokerError, not_found
from .exchange import DEFAULT_EXCHANGE
from .message import Message
from .publish import Publisher
from .queues.base import UNACKED

if TYPE_CHECKING:
    from .audit import AuditTrail
    from .clock import Clock
    from .queues import Queue
    from .queues.base import QueuedMessage
    from .session import Session

log = logging.getLogger("leveret.dead_letters")

ACTIONS = ("retry", "move", "copy", "delete")
CHUNK = 64  # messages an action takes on in one event-loop turn (~2 ms of work)
IN_FLIGHT = 8  # chunks published and waiting for their confirms, at most
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
    """PublisherEvents of a job's publisher: tells ``run`` how far publishes are
    confirmed (publisher confirms come in publish order) and which were nacked or
    returned."""

    def __init__(self) -> None:
        self.publisher: Publisher | None = None
        self.run: _Run | None = None
        self.returned_now = False

    def confirms_ready(self) -> None:
        assert self.publisher is not None and self.run is not None
        taken = self.publisher.take_confirms()
        if taken is not None:
            self.run.confirmed(taken[0])

    def rejected(self, seq: int, before: tuple[int, bool] | None) -> None:
        assert self.run is not None
        if before is not None:
            self.run.confirmed(before[0])
        self.run.nacked.add(seq)
        self.run.confirmed(seq)

    def returned(self, exchange: str, message: Message) -> None:
        self.returned_now = True


class JobsHost(Protocol):
    """What the actions need of their broker (:class:`.broker.BrokerCore` is one): its
    clock and its audit trail."""

    clock: Clock
    audit: AuditTrail


class DeadLetterJobs:
    """The actions of one broker (``BrokerCore.dead_letter_jobs``): running ones and
    the last :data:`KEEP_FINISHED` finished ones."""

    def __init__(self, core: JobsHost) -> None:
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


@dataclass
class _Chunk:
    """Messages a job took on in one turn: those published (publish seq -> dead
    letter), up to publish seq ``last``, and those that could not go."""

    last: int
    sent: dict[int, QueuedMessage]
    failed: list[QueuedMessage]


class _Run:
    """One job at work: a chunk per event-loop turn (:meth:`step`), up to
    :data:`IN_FLIGHT` chunks published and not yet confirmed (the store commits them
    together); a chunk's dead letters leave the queue once its publishes are confirmed
    (see the module doc)."""

    def __init__(self, jobs: DeadLetterJobs, job: Job, session: Session, queue: Queue, source: str) -> None:
        self.jobs, self.job, self.queue, self.source = jobs, job, queue, source
        self.clock = jobs.core.clock
        self.events = _Confirms()
        self.events.run = self
        self.publisher = self.events.publisher = Publisher(session, self.events)
        self.publisher.select_confirms()
        self.matcher = job.selection.matcher(self.clock.time())
        self.position = job.selection.start
        self.complete = False
        self.chunks: deque[_Chunk] = deque()  # published, waiting for their confirms
        self.upto = 0  # publishes confirmed (or nacked) so far
        self.nacked: set[int] = set()
        self.waiting = False  # a step waits for a chunk to be confirmed
        self.taking: list[QueuedMessage] = []  # held by the step under way
        self.final = "done"  # the state once every chunk is confirmed
        self.ended = False

    def step(self) -> None:
        """Take on the next chunk (or end the job)."""
        job, queue = self.job, self.queue
        self.waiting = False
        try:
            if job.cancelled:  # the chunks in flight are settled first
                self.complete, self.final = True, "cancelled"
                return self.next()
            if queue.deleted:
                raise not_found(f"queue '{queue.name}' was deleted")
            if job.action == "copy":
                found, self.position, self.complete = queue.scan(CHUNK, self.matcher, self.position)
            else:
                found, self.position, self.complete = queue.hold(CHUNK, self.matcher, self.position)
                self.taking = found
            if job.action == "delete":
                queue.settle_held(found)
                job.done += len(found)
            else:
                self.chunks.append(self.publish(found))
                self.confirmed(self.upto)  # those confirmed at once (transient messages)
            self.taking = []
            self.next()
        except BrokerError as exc:
            self.end("failed", exc.text)
        except Exception as exc:  # a job must end with a state, whatever went wrong
            log.exception("dead-letter job %s failed", job.id)
            self.end("failed", str(exc))

    def publish(self, entries: list[QueuedMessage]) -> _Chunk:
        """Publish each of ``entries`` where the job sends it, mandatory and confirmed."""
        job, publisher, events = self.job, self.publisher, self.events
        chunk = _Chunk(0, {}, [])
        for entry in entries:
            message = entry.message
            if job.action == "retry":
                address = origin(message)
                if address is None:
                    job.error = "a message has no death history: it cannot be retried"
                    chunk.failed.append(entry)
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
                chunk.failed.append(entry)
                continue
            if events.returned_now:  # unroutable: its seq is confirmed, but it went nowhere
                job.error = f"unroutable: exchange '{address[0]}', routing key '{address[1]}'"
                chunk.failed.append(entry)
            else:
                chunk.sent[publisher.seq] = entry
        chunk.last = publisher.seq
        return chunk

    def confirmed(self, upto: int) -> None:
        """Publishes up to seq ``upto`` are settled: (retry, move) the dead letters of
        chunks wholly confirmed leave the queue, those nacked or unroutable go back."""
        self.upto = max(self.upto, upto)
        while self.chunks and self.chunks[0].last <= self.upto:
            chunk = self.chunks.popleft()
            safe = [entry for seq, entry in chunk.sent.items() if seq not in self.nacked]
            failed = chunk.failed + [entry for seq, entry in chunk.sent.items() if seq in self.nacked]
            self.nacked.difference_update(chunk.sent)
            self.job.done += len(safe)
            self.job.failed += len(failed)
            if self.job.action != "copy":
                self.queue.settle_held(safe)
                self.queue.release(sorted(failed))
            if self.waiting:
                self.next()

    def next(self) -> None:
        """After a chunk: end once everything is confirmed, or the next chunk on a later
        event-loop turn (the broker's other work goes on between chunks) while fewer than
        :data:`IN_FLIGHT` wait for confirms."""
        if self.ended:
            return
        if self.complete or self.job.selection.passed(self.position):
            if self.chunks:
                self.waiting = True
            else:
                self.end(self.final)
        elif len(self.chunks) >= IN_FLIGHT:
            self.waiting = True
        else:
            self.waiting = False
            self.clock.call_later(0, self.step)

    def end(self, state: str, error: str | None = None) -> None:
        """The job ends (``state``); after a failure, what it still holds goes back."""
        job = self.job
        self.ended = True
        job.state = state
        if error is not None:
            job.error = error
        held = [*self.taking, *(e for c in self.chunks for e in (*c.sent.values(), *c.failed))]
        if job.action != "copy":  # (a copy that is confirmed later is a duplicate, never a loss)
            self.queue.release(sorted(e for e in held if e.state == UNACKED))
        self.chunks.clear()
        self.publisher.close()
        self.jobs.finished(job, self.source)
