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

import asyncio
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
    and a future done once none is left unconfirmed."""

    def __init__(self) -> None:
        self.publisher: Publisher | None = None
        self.returned_now = False
        self.nacked: set[int] = set()
        self.settled: asyncio.Future[None] | None = None

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
        if self.settled is not None and not self.publisher.unconfirmed and not self.settled.done():
            self.settled.set_result(None)


class DeadLetterJobs:
    """The actions of one broker (``BrokerCore.dead_letter_jobs``): running ones and
    the last :data:`KEEP_FINISHED` finished ones."""

    def __init__(self, core: BrokerCore) -> None:
        self.core = core
        self.jobs: dict[str, Job] = {}
        self._finished: deque[str] = deque()
        self._ids = itertools.count(1)
        self._tasks: set[asyncio.Task[None]] = set()

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
        each exchange published to: AccessRefused otherwise), on the running event loop.
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
        task = asyncio.get_running_loop().create_task(self._run(job, session, queue, source))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return job

    def cancel(self, job_id: str) -> Job | None:
        """Stop a running job after its current chunk; the job, or None if unknown."""
        job = self.jobs.get(job_id)
        if job is not None:
            job.cancelled = True
        return job

    async def _run(self, job: Job, session: Session, queue: Queue, source: str) -> None:
        events = _Confirms()
        publisher = events.publisher = Publisher(session, events)
        publisher.select_confirms()
        matcher = job.selection.matcher(self.core.clock.time())
        position = job.selection.start
        found: list[QueuedMessage] = []
        try:
            while True:
                if job.cancelled:
                    job.state = "cancelled"
                    break
                if queue.deleted:
                    raise not_found(f"queue '{queue.name}' was deleted")
                if job.action == "copy":
                    found, position, complete = queue.scan(CHUNK, matcher, position)
                else:
                    found, position, complete = queue.hold(CHUNK, matcher, position)
                if job.action == "delete":
                    queue.settle_held(found)
                    job.done += len(found)
                elif found:
                    await self._republish(job, queue, found, publisher, events)
                if complete or job.selection.passed(position):
                    job.state = "done"
                    break
                await asyncio.sleep(0)  # the broker's other work goes on between chunks
        except BrokerError as exc:
            job.state, job.error = "failed", exc.text
        except Exception as exc:  # a job must end with a state, whatever went wrong
            log.exception("dead-letter job %s failed", job.id)
            job.state, job.error = "failed", str(exc)
        finally:
            queue.release([entry for entry in found if entry.state == UNACKED])  # held, not settled
            publisher.close()
            job.finished = time.time()
            self._remember(job)
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

    async def _republish(
        self,
        job: Job,
        queue: Queue,
        entries: list[QueuedMessage],
        publisher: Publisher,
        events: _Confirms,
    ) -> None:
        """Publish each of ``entries`` where ``job`` sends it, mandatory and confirmed;
        then (retry, move) the dead letters of those confirmed leave ``queue`` and the
        others go back."""
        sent: dict[int, QueuedMessage] = {}  # publish seq -> its dead letter
        failed: list[QueuedMessage] = []
        for entry in entries:
            message = entry.message
            if job.action == "retry":
                address = origin(message)
                if address is None:
                    job.error = "a message has no death history: it cannot be retried"
                    failed.append(entry)
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
                failed.append(entry)
                continue
            if events.returned_now:  # unroutable: its seq is confirmed, but it went nowhere
                job.error = f"unroutable: exchange '{address[0]}', routing key '{address[1]}'"
                failed.append(entry)
            else:
                sent[publisher.seq] = entry
        if publisher.unconfirmed:
            events.settled = asyncio.get_running_loop().create_future()
            await events.settled
            events.settled = None
        safe = [entry for seq, entry in sent.items() if seq not in events.nacked]
        failed += [entry for seq, entry in sent.items() if seq in events.nacked]
        events.nacked.clear()
        job.done += len(safe)
        job.failed += len(failed)
        if job.action != "copy":
            queue.settle_held(safe)
            queue.release(sorted(failed))

    def _remember(self, job: Job) -> None:
        self._finished.append(job.id)
        while len(self._finished) > KEEP_FINISHED:
            self.jobs.pop(self._finished.popleft(), None)
