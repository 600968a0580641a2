"""Stream queues (``x-queue-type: stream``), as RabbitMQ streams are for AMQP 0-9-1
clients: an append-only, durable, replayable log.

Consumers read without removing: each has its own position, chosen with the consume
argument ``x-stream-offset`` (``first``, ``last``, ``next`` — the default —, a numeric
offset, or a timestamp: the first message published at or after it), must use manual
acknowledgement with a prefetch (basic.qos; an AMQP 1.0 link's credit is its window),
and every delivery carries the header ``x-stream-offset`` (a long). A consumer with a
selector (``x-selector``, AMQP 1.0 source filters) reads past what it turns down.
Stream filtering (RabbitMQ 3.13, :mod:`..stream_filter`): a consumer with
``x-stream-filter`` gets only the messages of the filter values it names (exactly: the
broker drops what RabbitMQ's Bloom filters let through), and skips whole chunks that
hold none of them with the stream's chunk index (:mod:`.stream_index`), without
reading them from the store; the index of each sealed chunk is saved in the store
(definitions of kind ``stream_chunk``) and the chunks after the last saved one are
rebuilt from the store's messages at recovery.
Acknowledging only makes room in the prefetch window; nack and reject change nothing.
leveret adds ``x-stream-offset-end``: the consumer gets offsets up to that one
(exclusive), then a server-sent basic.cancel, so a reader (a Spark executor) can fetch
a range deterministically.

Retention, as RabbitMQ: the log is cut in segments of ``x-stream-max-segment-size-bytes``
(default 500 MB); when a segment fills, whole old segments are dropped while the stream
is over ``x-max-length-bytes`` or their newest message is older than ``x-max-age``
(``7D``, ``12h`` …). Segments are ranges of the store's rows, not separate files.
With a store, messages are written to it (every message: a stream is durable) and only
the newest are kept in memory; without one, the whole log is in memory. Older messages,
and where a timestamp falls among them, are asked of the store, which answers on the
event loop from its reader thread; the consumer waits for the answer meanwhile.
"""

from __future__ import annotations

import bisect
import datetime
import itertools
import logging
from collections import deque
from typing import TYPE_CHECKING, Any

from ..deduplication import DeduplicationCache, dedup_key
from ..errors import precondition_failed
from ..message import Message
from ..selector import message_lookup
from ..stream_filter import StreamFilter, filter_value, from_arguments
from .backlog import ALL_SEQS
from .base import UNACKED, Consumer, Queue, QueuedMessage
from .host import QueueHost
from .outcome import ACCEPTED, REJECTED, STORED, Enqueued
from .stream_index import (
    CHUNK_SIZE,
    DEFAULT_FILTER_SIZE,
    MAX_FILTER_SIZE,
    MIN_FILTER_SIZE,
    ChunkIndex,
    ChunkSummary,
)

if TYPE_CHECKING:
    from ...store.base import StoredMessage
    from .features.leases import Lease

log = logging.getLogger("leveret.queue")

IN_MEMORY_TAIL = 10_000  # newest messages kept in memory when there is a store
READ_BATCH = 1000  # messages read from the store at a time
#: Messages a consumer's selector may turn down in one dispatch; then it goes on in
#: the next event-loop turn, so one filtered reader never holds up the broker.
SCAN_BUDGET = 2000
#: The definition kind under which a stream's sealed chunk summaries are stored (name:
#: ``<queue id>:<chunk number>``, data ``{"json": ...}``).
CHUNK_KIND = "stream_chunk"
#: At recovery, at most this many chunks after the last saved summary are rebuilt from
#: the store (a crash loses at most the summaries being written); older chunks without
#: one (a stream written before the index existed) stay unknown: read in full.
MAX_REBUILT_CHUNKS = 64


class _Cursor:
    __slots__ = ("end", "filter", "next", "read_upto", "reading", "waiting")

    def __init__(self, next_offset: int, end: int | None, wanted: StreamFilter | None = None) -> None:
        self.next = next_offset
        self.end = end
        self.filter = wanted  # x-stream-filter
        self.waiting = False  # its start is being looked up in the store
        #: the offset after the batches read from the store for this consumer: its
        #: window of the stream queue's read cache is ``next`` .. ``read_upto``
        self.read_upto = next_offset
        self.reading = False  # a read of the store for it is on its way


class StreamQueue(Queue):
    """A stream queue; offsets start at 0. PreconditionFailed (AMQP 406, as RabbitMQ)
    unless declared durable, not exclusive and not auto-delete, or when declared with an
    argument of another queue type (:attr:`refused_arguments`)."""

    type_name = "stream"
    rabbitmq_type = "rabbit_stream_queue"
    #: What RabbitMQ 3.10 refuses on a stream (406 "invalid arg 'x-…' for queue … of
    #: queue type rabbit_stream_queue"): per-message life (TTL, expiry, dead-lettering,
    #: delivery limits), classic and quorum settings; retention is ``x-max-length-bytes``
    #: and ``x-max-age``. Arguments no queue type knows are still accepted and ignored.
    refused_arguments = frozenset(
        (
            "x-expires",
            "x-message-ttl",
            "x-max-priority",
            "x-queue-mode",
            "x-queue-version",
            "x-queue-master-locator",
            "x-single-active-consumer",
            "x-dead-letter-exchange",
            "x-dead-letter-routing-key",
            "x-dead-letter-strategy",
            "x-delivery-limit",
            "x-max-length",
            "x-overflow",
            "x-quorum-initial-group-size",
            "x-max-in-memory-length",
            "x-max-in-memory-bytes",
        )
    )
    channel_prefetch = False

    def __init__(
        self,
        host: QueueHost,
        name: str,
        durable: bool = True,
        exclusive_owner: Any = None,
        auto_delete: bool = False,
        arguments: dict | None = None,
    ) -> None:
        if not durable or exclusive_owner is not None or auto_delete:
            raise precondition_failed(
                f"invalid property 'durable/exclusive/auto_delete' for queue '{name}' in vhost "
                f"'{host.name}': a stream must be durable, not exclusive, not auto-delete"
            )
        super().__init__(host, name, durable, exclusive_owner, auto_delete, arguments)
        filter_size = self.config.filter_size
        if filter_size is not None and not MIN_FILTER_SIZE <= filter_size <= MAX_FILTER_SIZE:
            raise precondition_failed("Invalid value for x-stream-filter-size-bytes")
        #: which filter values each chunk holds (x-stream-filter consumers skip by it)
        self.index = ChunkIndex(filter_size or DEFAULT_FILTER_SIZE)
        self.first_offset = 0
        self.next_offset = 0
        self._tail: deque[tuple[float, Message]] = deque()  # newest messages
        self._tail_start = 0  # offset of _tail[0]
        self._segments: deque[list] = deque([[0, 0, 0.0]])  # [first offset, bytes, newest time]
        self._total_bytes = 0
        self._cursors: dict[Consumer, _Cursor] = {}
        #: messages read from the store, by offset: each consumer's window (the batch it
        #: reads and the one after it), shared where windows overlap
        self._chunk: dict[int, Message] = {}

    # -- counts ---------------------------------------------------------------------
    @property
    def message_count(self) -> int:
        """Messages in the log (``first_offset`` … ``next_offset - 1``); reading does
        not remove them."""
        return self.next_offset - self.first_offset

    # -- appending ------------------------------------------------------------------
    def enqueue(self, message: Message) -> Enqueued:
        """Append ``message`` at ``next_offset``: STORED with a store (every message is
        written), else ACCEPTED; ACCEPTED too for a duplicate, which is dropped; REJECTED
        when it would pass ``x-max-length-bytes`` and ``x-overflow`` is not ``drop-head``."""
        config = self.config
        if self.dedup is not None and not self._is_new(self.dedup, message):
            return ACCEPTED
        if (
            config.overflow != "drop-head"
            and config.max_length_bytes is not None
            and self._total_bytes + len(message.body) > config.max_length_bytes
        ):
            return REJECTED
        offset = self.next_offset
        now = self.host.clock.time()
        self.next_offset += 1
        stored = False
        if self.store is not None:
            if not self.queue_id:
                self.queue_id = self.store.new_queue_id()
            self.store.add_message(
                self.queue_id,
                offset + 1,
                message.exchange,
                message.routing_key,
                message.encoded,
                message.body,
                published_at=now,
                meta=message.meta(),
            )
            stored = True
        index = self.index
        index.add(offset, filter_value(message))
        if stored and index.seals(offset):
            self._save_chunk(index.chunk_of(offset))
        self._tail.append((now, message))
        if self.store is not None and len(self._tail) > IN_MEMORY_TAIL:
            self._tail.popleft()
            self._tail_start += 1
        self._account(len(message.body), now)
        if self.consumers:
            self._dispatch()
        return STORED if stored else ACCEPTED

    def _is_new(self, dedup: DeduplicationCache, message: Message) -> bool:
        key = dedup_key(message, self.config.dedup_header)
        return key is None or dedup.check_and_add(key)

    def _account(self, size: int, now: float) -> None:
        segment = self._segments[-1]
        segment[1] += size
        segment[2] = now
        self._total_bytes += size
        if segment[1] >= self.config.max_segment_size:
            self._segments.append([self.next_offset, 0, now])
            self._apply_retention(now)

    def _apply_retention(self, now: float) -> None:
        config = self.config
        dropped = False
        while len(self._segments) > 1:
            oldest = self._segments[0]
            too_big = config.max_length_bytes is not None and self._total_bytes > config.max_length_bytes
            too_old = config.max_age is not None and oldest[2] < now - config.max_age
            if not (too_big or too_old):
                break
            self._segments.popleft()
            self._total_bytes -= oldest[1]
            self.first_offset = self._segments[0][0]
            dropped = True
        if not dropped:
            return
        while self._tail and self._tail_start < self.first_offset:
            self._tail.popleft()
            self._tail_start += 1
        self._chunk.clear()
        gone = self.index.drop_below(self.first_offset)
        if self.store is not None and self.queue_id:
            self.store.remove_range(self.queue_id, self.first_offset)
            for chunk in gone:
                self.store.delete_definition(CHUNK_KIND, self.host.name, f"{self.queue_id}:{chunk}")
        for cursor in self._cursors.values():
            cursor.next = max(cursor.next, self.first_offset)

    def restore_paged(self, count: int, last_seq: int, size: int) -> None:
        """At start-up: the stream's ``count`` messages end at offset ``last_seq - 1``."""
        self.next_offset = self._tail_start = last_seq
        self.first_offset = last_seq - count
        self._total_bytes = size
        self._segments = deque([[self.first_offset, size, self.host.clock.time()]])

    # -- the chunk index in the store --------------------------------------------------
    def _save_chunk(self, chunk: int) -> None:
        """Save the summary of ``chunk``, sealed: written after its last message, so
        on disk only once all its messages are."""
        assert self.store is not None
        summary = self.index.chunks[chunk]
        self.store.save_definition(
            CHUNK_KIND, self.host.name, f"{self.queue_id}:{chunk}", {"json": summary.to_json()}
        )

    def restore_chunk(self, chunk: int, data: dict) -> None:
        """At start-up: the saved summary of ``chunk`` (a row of kind
        :data:`CHUNK_KIND`); one that does not parse, or that retention has dropped
        meanwhile, is forgotten (its chunk is then read in full)."""
        try:
            summary = ChunkSummary.from_json(str(data["json"]))
        except (KeyError, TypeError, ValueError):
            log.warning("stream '%s': chunk %d's index does not parse; it is read in full", self.name, chunk)
            return
        self.index.chunks[chunk] = summary

    def rebuild_index(self) -> int:
        """At start-up, after :meth:`restore_paged` and :meth:`restore_chunk`: index
        the chunks after the last saved summary (the open chunk, and those whose
        summary a crash lost; at most :data:`MAX_REBUILT_CHUNKS`) from the store's
        messages (a blocking read, as recovery's are); drops saved summaries of chunks
        retention removed. Returns the messages read."""
        index = self.index
        for chunk in index.drop_below(self.first_offset):
            if self.store is not None:
                self.store.delete_definition(CHUNK_KIND, self.host.name, f"{self.queue_id}:{chunk}")
        if self.store is None or self.next_offset <= self.first_offset:
            return 0
        last = index.chunk_of(self.next_offset - 1)
        if last in index.chunks:
            return 0  # every chunk's summary was saved
        lowest = max(index.chunk_of(self.first_offset), last - MAX_REBUILT_CHUNKS + 1)
        start = last
        while start > lowest and start - 1 not in index.chunks:
            start -= 1  # back to the first chunk after the saved ones
        offset = max(self.first_offset, start * CHUNK_SIZE)
        read = 0
        while offset < self.next_offset:
            rows = self.store.read_queue(self.queue_id, offset, READ_BATCH)
            if not rows:
                break
            for row in rows:
                message = Message.restore(row.exchange, row.routing_key, row.header, row.body, row.meta)
                index.add(row.seq - 1, filter_value(message))
                if index.seals(row.seq - 1):
                    self._save_chunk(index.chunk_of(row.seq - 1))
            read += len(rows)
            offset = rows[-1].seq
        return read

    def stop(self) -> None:
        """Deleted: also forget the saved chunk summaries (recovery drops any left)."""
        if self.deleted and self.store is not None and self.queue_id:
            for chunk in self.index.chunks:
                self.store.delete_definition(CHUNK_KIND, self.host.name, f"{self.queue_id}:{chunk}")
        super().stop()

    # -- reading --------------------------------------------------------------------
    def _read(self, cursor: _Cursor) -> Message | None:
        """The message at ``cursor.next``: from the in-memory tail, the read cache, or
        None while :data:`READ_BATCH` from there are asked of the store (the answer, on
        the loop, dispatches again: :meth:`_chunk_read`). Half-way through the last batch
        read for it, the next one is asked for, so a reader seldom waits for the disk;
        consumers far apart (Spark's partitions) each keep their own window."""
        offset = cursor.next
        if offset >= self._tail_start:
            return self._tail[offset - self._tail_start][1]
        message = self._chunk.get(offset)
        if not cursor.reading:
            if message is None:
                self._ask(cursor, offset)
            elif offset + READ_BATCH // 2 >= cursor.read_upto and cursor.read_upto < self._tail_start:
                # read ahead (from the message after this one, when it reads in another's window)
                self._ask(cursor, cursor.read_upto if cursor.read_upto > offset else offset + 1)
        return message

    def _ask(self, cursor: _Cursor, offset: int) -> None:
        """Ask the store for :data:`READ_BATCH` messages from ``offset`` on, for
        ``cursor``; with a stream filter, from the first to the last message in that
        batch the chunk index does not rule out (:meth:`.stream_index.ChunkIndex.span`),
        and nothing when it rules them all out (a read ahead)."""
        assert self.store is not None
        upto = ALL_SEQS
        if cursor.filter is not None:
            limit = min(offset + READ_BATCH, self._tail_start)
            offset = self.index.next_candidate(offset, limit, cursor.filter)
            if offset >= limit:
                return
            # seqs are offsets + 1: the span's end offset is the last seq to read
            upto = self.index.span(offset, limit, cursor.filter)
        cursor.reading = True
        self.store.request_queue(
            self.queue_id, offset, READ_BATCH, upto, lambda rows: self._chunk_read(cursor, offset, rows)
        )

    def _chunk_read(self, cursor: _Cursor, offset: int, rows: list[StoredMessage]) -> None:
        """The store's answer to :meth:`_read`: the batch from ``offset`` on (less what
        retention dropped meanwhile) joins the read cache, which then keeps only the
        consumers' windows; consumers read on. Consumers waiting for an offset the store
        no longer has go on from the next one it has."""
        cursor.reading = False
        if self.deleted:
            return
        chunk = self._chunk
        first = self.first_offset
        got = [row for row in rows if row.seq - 1 >= first]
        for row in got:
            chunk[row.seq - 1] = Message.restore(
                row.exchange, row.routing_key, row.header, row.body, row.meta
            )
        cursor.read_upto = got[-1].seq if got else offset
        if offset >= first and (not got or got[0].seq - 1 != offset):
            after = got[0].seq - 1 if got else self._tail_start
            log.error("stream '%s': offsets %d to %d missing from the store", self.name, offset, after - 1)
            for other in self._cursors.values():
                if offset <= other.next < after:
                    other.next = after
        self._keep_windows()
        self.drain()

    def _keep_windows(self) -> None:
        """Drop from the read cache what no consumer's window (``next`` .. ``read_upto``)
        holds: what they have read, and what another consumer's batch left behind."""
        windows = sorted((c.next, c.read_upto) for c in self._cursors.values() if c.read_upto > c.next)
        starts = [low for low, _ in windows]
        reach = list(itertools.accumulate((high for _, high in windows), max))  # highest end so far
        chunk = self._chunk
        for key in [k for k in chunk if not (i := bisect.bisect_right(starts, k)) or reach[i - 1] <= k]:
            del chunk[key]

    def resolve_offset(self, spec: Any) -> int | None:
        """The offset where a consumer with ``x-stream-offset: spec`` starts: ``first``,
        ``last``, ``next`` (also None), an offset (clamped to the log) or a timestamp;
        None for a timestamp older than the in-memory tail, which the store must look up
        (:meth:`prepare_consumer` asks it). PreconditionFailed for anything else."""
        if spec is None or spec in ("next", b"next"):
            return self.next_offset
        if spec in ("first", b"first"):
            return self.first_offset
        if spec in ("last", b"last"):
            return max(self.first_offset, self.next_offset - 1)
        if isinstance(spec, datetime.datetime):
            return self._offset_at(spec.timestamp())
        if isinstance(spec, int) and not isinstance(spec, bool):
            return min(max(spec, self.first_offset), self.next_offset)
        raise precondition_failed(
            f"invalid arg 'x-stream-offset' for queue '{self.name}' in vhost '{self.host.name}': {spec!r}"
        )

    def _offset_at(self, when: float) -> int | None:
        times = [t for t, _ in self._tail]
        if not times or times[0] <= when or self.store is None:
            return self._tail_start + bisect.bisect_left(times, when)
        return None  # older than the tail: the store knows

    def _look_up(self, consumer: Consumer, cursor: _Cursor, when: float) -> None:
        """Ask the store where a consumer starting at ``when`` (epoch seconds) starts;
        its cursor waits (nothing is delivered to it) until the answer, on the loop."""
        assert self.store is not None
        cursor.waiting = True
        otherwise = self.next_offset  # none found: from the next message, as asked now

        def found(seq: int | None) -> None:
            if self._cursors.get(consumer) is not cursor:
                return  # cancelled meanwhile
            cursor.waiting = False
            cursor.next = otherwise if seq is None else max(seq - 1, self.first_offset)
            self.drain()

        self.store.request_offset(self.queue_id, when, found)

    # -- consumers ------------------------------------------------------------------
    def prepare_consumer(self, consumer: Consumer) -> None:
        """Place the consumer at its ``x-stream-offset``. PreconditionFailed, as
        RabbitMQ, for no-ack or no prefetch, and for a bad offset or
        ``x-stream-offset-end`` (not an integer). A consumer with a selector (an AMQP
        1.0 source filter, RabbitMQ 4.1's filter expressions on streams) reads on past
        the messages it turns down; one with ``x-stream-filter`` (and
        ``x-stream-match-unfiltered``, read as RabbitMQ does: no error, see
        :func:`..stream_filter.from_arguments`) skips by the chunk index. A consumer
        whose window is its link credit (AMQP 1.0, ``credit_window``) needs no
        prefetch."""
        if getattr(consumer, "no_ack", False):
            raise precondition_failed(
                f"stream queue '{self.name}' in vhost '{self.host.name}' requires manual acknowledgement"
            )
        if (
            not getattr(consumer, "prefetch", 1)
            and not getattr(consumer, "global_prefetch", 0)
            and not getattr(consumer, "credit_window", False)
        ):
            raise precondition_failed(
                f"consumer prefetch count is not set for stream queue '{self.name}' in vhost "
                f"'{self.host.name}'"
            )
        arguments = getattr(consumer, "arguments", {}) or {}
        spec = arguments.get("x-stream-offset")
        start = self.resolve_offset(spec)
        end = arguments.get("x-stream-offset-end")
        if end is not None and (not isinstance(end, int) or isinstance(end, bool)):
            raise precondition_failed(f"invalid arg 'x-stream-offset-end': {end!r}")
        cursor = self._cursors[consumer] = _Cursor(
            self.first_offset if start is None else start, end, from_arguments(arguments)
        )
        if start is None:  # only a timestamp older than the tail
            assert isinstance(spec, datetime.datetime)
            self._look_up(consumer, cursor, spec.timestamp())

    def remove_consumer(self, consumer: Consumer) -> None:
        """Forget ``consumer``, its position and (the last reader gone) the read cache."""
        self._cursors.pop(consumer, None)
        if not self._cursors:
            self._chunk.clear()
        super().remove_consumer(consumer)

    def _dispatch(self) -> None:
        """Each consumer reads on from its own position, within its prefetch window,
        skipping what its stream filter and selector turn down (:data:`SCAN_BUDGET`
        messages or index jumps at a time); a stream filter first jumps over what the
        chunk index rules out, then tests the messages left exactly."""
        index = self.index
        for consumer in list(self.consumers):
            cursor = self._cursors.get(consumer)
            if cursor is None or cursor.waiting:
                continue
            limit = self.next_offset if cursor.end is None else min(cursor.end, self.next_offset)
            selector = consumer.selector
            wanted = cursor.filter
            budget = SCAN_BUDGET
            while cursor.next < limit and consumer.can_accept():
                if wanted is not None:
                    candidate = index.next_candidate(cursor.next, limit, wanted)
                    if candidate != cursor.next:
                        cursor.next = candidate
                        budget -= 1
                        if budget <= 0:
                            self.timers.arm("filter-scan", 0, self._resume_scan)
                            break
                        continue
                offset = cursor.next
                message = self._read(cursor)
                if message is None:  # on its way from the store
                    break
                cursor.next += 1
                if (wanted is not None and not wanted.matches_message(message)) or (
                    selector is not None and not selector.matches(message_lookup(message))
                ):
                    budget -= 1
                    if budget <= 0:
                        self.timers.arm("filter-scan", 0, self._resume_scan)
                        break
                    continue
                entry = QueuedMessage(message, offset + 1)
                entry.state = UNACKED
                entry.delivery_count = 1
                self.unacked_count += 1
                consumer.deliver(self, entry)
            if cursor.end is not None and cursor.next >= cursor.end:
                self.remove_consumer(consumer)
                consumer.cancel_by_broker()

    def _resume_scan(self) -> None:
        self.timers.fired("filter-scan")
        if not self.deleted:
            self._dispatch()

    def delivery_headers(self, entry: QueuedMessage) -> tuple[tuple[str, int], ...]:
        """Every delivery carries its offset as ``x-stream-offset`` (RabbitMQ)."""
        return (("x-stream-offset", entry.seq - 1),)

    # -- what streams do not do -----------------------------------------------------
    def requeue(self, entries: list[QueuedMessage], failed: bool = False) -> None:
        """nack/reject/close: nothing returns to a stream (it never left)."""
        for entry in entries:
            self.ack(entry)
        self._dispatch()

    def discard(self, entry: QueuedMessage, reason: str) -> None:
        """reject/nack without requeue: only frees the prefetch slot (nothing dies)."""
        self.ack(entry)

    def get(self) -> QueuedMessage | None:
        """Always PreconditionFailed: streams are read by consuming."""
        raise precondition_failed(
            f"queue '{self.name}' in vhost '{self.host.name}' is a stream: "
            "basic.get is not supported, consume with x-stream-offset"
        )

    def purge(self) -> int:
        """Always PreconditionFailed: a stream shrinks by retention only."""
        raise precondition_failed(
            f"queue '{self.name}' in vhost '{self.host.name}' is a stream: "
            "purge is not supported, use retention (x-max-length-bytes, x-max-age)"
        )

    def lease(self, group: str) -> Lease:
        """Always PreconditionFailed: streams are read by offset, not leased."""
        raise precondition_failed(f"queue '{self.name}' is a stream: read it with x-stream-offset")
