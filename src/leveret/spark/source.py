"""The ``leveret`` Spark data source (Python Data Source API).

Register it with ``spark.dataSource.register(LeveretDataSource)`` (or
:func:`leveret.spark.register`), then::

    df.write.format("leveret").option("url", url).option("exchange", "orders").save()
    spark.read.format("leveret").option("url", url).option("stream", "events").load()
    spark.readStream.format("leveret").option("queue", "jobs").load()

Spark calls the connector in several processes: the planning callbacks (schema, reader,
writer, latestOffset, partitions, commit) in the driver's Python runner, read() and
write() in reused Python workers. Each process opens its own AMQP connection
(:class:`leveret.amqp.client.BlockingClient`); nothing holding a socket is pickled.
"""

from __future__ import annotations

import math
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.types import StructType

from ..amqp.client import BlockingClient, ChannelError, ClientError, safe_url
from ..amqp.errors import AMQPConnectionError as ConnectionClosed
from .options import COMMON_OPTIONS, DEFAULT_URL, OptionError, Options, connect
from .rows import READ_SCHEMA, as_int, delivery_row, record_batches
from .sink import LeveretBatchWriter, LeveretStreamWriter, WriteConfig

__all__ = ["DEFAULT_URL", "READ_SCHEMA", "LeveretDataSource", "OptionError"]

READ_OPTIONS = COMMON_OPTIONS | {
    "queue",
    "stream",
    "group",
    "startingoffset",
    "endingoffset",
    "partitionsize",
    "maxoffsetspertrigger",
    "maxmessagespertrigger",
    "leasettlms",
    "leasefrom",
    "leaseto",
    "prefetch",
    "idletimeout",
    "limit",
}


# -- data source ---------------------------------------------------------------------


class LeveretDataSource(DataSource):
    """``format("leveret")``: read queues and streams of a leveret broker, publish rows."""

    @classmethod
    def name(cls) -> str:
        return "leveret"

    def schema(self) -> StructType:
        return READ_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return LeveretBatchReader(_ReadConfig.from_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return LeveretStreamReader(_ReadConfig.from_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        config = WriteConfig.from_options(self.options, schema)
        config.check_broker()
        return LeveretBatchWriter(config)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        config = WriteConfig.from_options(self.options, schema)
        config.check_broker()
        return LeveretStreamWriter(config)


# -- reading -------------------------------------------------------------------------


@dataclass
class _ReadConfig:
    url: str
    queue: str | None
    stream: str | None
    group: str
    starting: str
    ending: str
    partition_size: int
    max_per_trigger: int | None
    lease_ttl_ms: int
    lease_from: int | None
    lease_to: int | None
    prefetch: int
    idle_timeout: float
    limit: int | None
    timeout: float

    @property
    def source_name(self) -> str:
        """The stream or queue read (exactly one of them is set)."""
        name = self.stream or self.queue
        assert name is not None, "from_options requires a queue or a stream"
        return name

    @classmethod
    def from_options(cls, options: Any, streaming: bool) -> _ReadConfig:
        opts = Options(options, READ_OPTIONS, "streaming source" if streaming else "source")
        queue, stream = opts.text("queue"), opts.text("stream")
        if bool(queue) == bool(stream):
            raise OptionError(
                "leveret source: give exactly one of the options queue "
                "(a classic queue) or stream (a stream queue)"
            )
        url = opts.text("url", DEFAULT_URL)
        lease_from, lease_to = opts.integer("leaseFrom"), opts.integer("leaseTo")
        if (lease_from is None) != (lease_to is None):
            raise OptionError("leveret source: options leaseFrom and leaseTo go together")
        if lease_from is not None and (stream or streaming):
            raise OptionError("leveret source: leaseFrom/leaseTo are for batch reads of a queue")
        for name in ("startingOffset", "endingOffset", "maxOffsetsPerTrigger"):
            if queue and opts.text(name) is not None:
                raise OptionError(f"leveret option {name} is for streams (option stream), not queues")
        if stream and opts.text("maxMessagesPerTrigger") is not None:
            raise OptionError(
                "leveret option maxMessagesPerTrigger is for queues; use maxOffsetsPerTrigger with a stream"
            )
        starting = (opts.text("startingOffset") or ("next" if streaming else "first")).lower()
        ending = (opts.text("endingOffset") or "next").lower()
        for name, value, words in (
            ("startingOffset", starting, ("first", "next", "last")),
            ("endingOffset", ending, ("next",)),
        ):
            if value not in words and not value.lstrip("-").isdigit():
                raise OptionError(
                    f"leveret option {name}: expected {', '.join(words)} or an offset, got {value!r}"
                )
        if ending != "next" and streaming:
            raise OptionError("leveret option endingOffset is for batch reads")
        config = cls(
            url=url,
            queue=queue,
            stream=stream,
            group=opts.text("group", "spark"),
            starting=starting,
            ending=ending,
            partition_size=opts.integer("partitionSize", 50_000, minimum=1),
            max_per_trigger=opts.integer(
                "maxOffsetsPerTrigger" if stream else "maxMessagesPerTrigger",
                None if stream else 10_000,
                minimum=1,
            ),
            lease_ttl_ms=opts.integer("leaseTtlMs", 300_000, minimum=1),
            lease_from=lease_from,
            lease_to=lease_to,
            prefetch=opts.integer("prefetch", 1000, minimum=1),
            idle_timeout=opts.number("idleTimeout", 1.0),
            limit=opts.integer("limit", None, minimum=0),
            timeout=opts.number("timeout", 30.0),
        )
        config.check_broker()
        return config

    @property
    def source(self) -> str:
        return f"stream {self.stream!r}" if self.stream else f"queue {self.queue!r}"

    def check_broker(self) -> None:
        """Unreachable broker, refused login, or a missing queue/stream: fail now, on the
        driver, with the option's name."""
        with connect(self.url, min(self.timeout, 10.0)) as client:
            name = self.source_name
            if client.queue_exists(name) is None:
                option = "stream" if self.stream else "queue"
                raise OptionError(f"leveret option {option}: no queue {name!r} on {safe_url(self.url)}")


class _RPC:
    """A lazily opened connection for amq.leveret.api calls, never pickled."""

    def __init__(self, config: _ReadConfig) -> None:
        self.config = config
        self._client: BlockingClient | None = None

    def __getstate__(self) -> dict:
        return {"config": self.config, "_client": None}

    def call(self, operation: str, retry: bool = True, **payload: Any) -> dict:
        """The reply of ``operation``. A lost connection is retried once on a new one,
        unless ``retry`` is false (for a call that must not run twice: lease.acquire)."""
        for attempt in (1, 2) if retry else (2,):
            if self._client is None:
                self._client = BlockingClient(self.config.url, timeout=self.config.timeout)
            try:
                return self._client.rpc(operation, payload)
            except ChannelError as exc:
                if exc.reply_code == 404 and "amq.leveret.api" in str(exc):
                    raise ClientError(
                        f"{safe_url(self.config.url)} has no amq.leveret.api "
                        "exchange: is it a leveret broker?"
                    ) from None
                raise
            except ConnectionClosed:
                self._client = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def client(self) -> BlockingClient:
        if self._client is None:
            self._client = BlockingClient(self.config.url, timeout=self.config.timeout)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def stream_info(client: BlockingClient | _RPC, stream: str) -> dict:
    if isinstance(client, _RPC):
        return client.call("stream.info", stream=stream)
    return client.rpc("stream.info", {"stream": stream})


@dataclass
class StreamRange(InputPartition):
    stream: str
    start: int
    end: int  # exclusive


@dataclass
class LeaseRange(InputPartition):
    queue: str
    group: str
    start: int
    end: int  # exclusive


@dataclass
class Browse(InputPartition):
    queue: str
    count: int


def _split(start: int, end: int, size: int) -> list[tuple[int, int]]:
    if end <= start:
        return []
    n = math.ceil((end - start) / size)
    return [(start + i * size, min(end, start + (i + 1) * size)) for i in range(n)]


def read_partition(config: _ReadConfig, partition: InputPartition) -> Iterator[tuple]:
    """The rows of one partition (runs in a Python worker)."""
    if isinstance(partition, StreamRange):
        yield from _read_stream(config, partition)
    elif isinstance(partition, LeaseRange):
        yield from _read_lease(config, partition)
    elif isinstance(partition, Browse):
        yield from _browse(config, partition)
    else:
        raise TypeError(f"unexpected partition {partition!r}")


def _read_stream(config: _ReadConfig, part: StreamRange) -> Iterator[tuple]:
    if part.end <= part.start:
        return
    with BlockingClient(config.url, timeout=config.timeout) as client:
        client.qos(config.prefetch)
        args = {"x-stream-offset": part.start, "x-stream-offset-end": part.end}
        unacked = 0
        for d in client.consume(part.stream, args, no_ack=False):
            offset = as_int(d.headers.get("x-stream-offset"))
            if offset is not None and offset >= part.end:
                break
            if offset is None or offset >= part.start:
                yield delivery_row(d)
            unacked += 1
            if unacked >= max(1, config.prefetch // 2):
                client.ack(d.delivery_tag, multiple=True)
                unacked = 0
            if offset is not None and offset >= part.end - 1:
                break


def _read_lease(config: _ReadConfig, part: LeaseRange) -> Iterator[tuple]:
    if part.end <= part.start:
        return
    with BlockingClient(config.url, timeout=config.timeout) as client:
        args = {"x-lease-group": part.group, "x-lease-from": part.start, "x-lease-to": part.end}
        for d in client.consume(part.queue, args, no_ack=True):
            yield delivery_row(d)


def _browse(config: _ReadConfig, part: Browse) -> Iterator[tuple]:
    """Up to ``count`` messages, left in the queue: consumed without acknowledging, then
    the channel closes and the broker requeues them in their places (marked redelivered)."""
    rows = []
    if part.count > 0:
        with BlockingClient(config.url, timeout=config.timeout) as client:
            client.qos(min(config.prefetch, part.count) or 1)
            for d in client.consume(part.queue, no_ack=False, idle_timeout=config.idle_timeout):
                rows.append(delivery_row(d))
                if len(rows) >= part.count:
                    break
    yield from rows


class LeveretBatchReader(DataSourceReader):
    def __init__(self, config: _ReadConfig) -> None:
        self.config = config

    def partitions(self) -> Sequence[InputPartition]:
        c = self.config
        if c.stream:
            with BlockingClient(c.url, timeout=c.timeout) as client:
                info = stream_info(client, c.stream)
            start = _resolve_start(c.starting, info)
            end = int(info["next"]) if c.ending == "next" else int(c.ending)
            if c.limit is not None:
                end = min(end, start + c.limit)
            return [StreamRange(c.stream, s, e) for s, e in _split(start, end, c.partition_size)]
        if c.lease_from is not None:
            assert c.lease_to is not None, "from_options requires leaseTo with leaseFrom"
            return [
                LeaseRange(c.source_name, c.group, s, e)
                for s, e in _split(c.lease_from, c.lease_to, c.partition_size)
            ]
        with BlockingClient(c.url, timeout=c.timeout) as client:
            ok = client.queue_exists(c.source_name)
        count = (ok.message_count or 0) if ok else 0
        if c.limit is not None:
            count = min(count, c.limit)
        return [Browse(c.source_name, count)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return record_batches(read_partition(self.config, partition))


def _resolve_start(starting: str, info: dict) -> int:
    first, nxt = int(info["first"]), int(info["next"])
    if starting == "first":
        return first
    if starting == "next":
        return nxt
    if starting == "last":
        return max(first, nxt - 1)
    return max(first, int(starting))


try:  # pyspark >= 4.2
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow as _AvailableNow,
    )
except ImportError:  # pragma: no cover
    ReadLimit = ReadAllAvailable = ReadMaxRows = None  # type: ignore[assignment,misc]

    class _AvailableNow:  # type: ignore[no-redef]
        pass


_RUNNER = "pyspark.sql.streaming.python_streaming_source_runner"


def _stop_on_sigterm() -> None:
    """In Spark's source runner process only (its main thread): make SIGTERM, which is
    how Spark ends that process, raise SystemExit, so that the runner's
    ``finally: reader.stop()`` runs."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is None or spec.name != _RUNNER:
        return
    if threading.current_thread() is not threading.main_thread():
        return

    def _exit(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _exit)


class LeveretStreamReader(DataSourceStreamReader, _AvailableNow):
    """Streams: offsets are ``{"offset": n}`` (x-stream-offset); nothing is consumed.
    Queues: offsets are ``{"seq": n}``, lease sequence numbers of ``group``: each
    micro-batch leases up to maxMessagesPerTrigger ready messages, reads them and acks
    them when Spark commits the batch; unacked leases return to the queue after
    leaseTtlMs (redelivered), so delivery is at least once."""

    def __init__(self, config: _ReadConfig) -> None:
        self.config = config
        self._rpc = _RPC(config)
        self._target: int | None = None
        self._initial: dict | None = None
        self._acked = 0  # leases below this are acknowledged (queues)
        self._leased_to: int | None = None  # end of this process's last acquire
        self._first: int | None = None  # the query's first lease (queues), once known
        _stop_on_sigterm()

    def __getstate__(self) -> dict:
        return {
            "config": self.config,
            "_rpc": _RPC(self.config),
            "_target": self._target,
            "_initial": self._initial,
            "_acked": self._acked,
            "_leased_to": None,
            "_first": self._first,
        }

    def _key(self) -> str:
        return "offset" if self.config.stream else "seq"

    def initialOffset(self) -> dict:
        # Spark may ask more than once (when planning the first batch again): answer the
        # same, or a queue's first batch would start after its own leases.
        if self._initial is None:
            c = self.config
            if c.stream:
                self._initial = {"offset": _resolve_start(c.starting, stream_info(self._rpc, c.stream))}
            else:
                info = self._rpc.call("lease.info", queue=c.queue, group=c.group)
                self._initial = {"seq": int(info["next"]), "first": int(info["next"])}
        return dict(self._initial)

    def getDefaultReadLimit(self) -> Any:
        if ReadMaxRows is not None and self.config.max_per_trigger:
            return ReadMaxRows(self.config.max_per_trigger)
        return ReadAllAvailable() if ReadAllAvailable is not None else None

    def prepareForTriggerAvailableNow(self) -> None:
        c = self.config
        if c.stream:
            self._target = int(stream_info(self._rpc, c.stream)["next"])
        else:  # lease at most the messages ready now
            ok = self._rpc.client().queue_exists(c.source_name)
            self._target = ok.message_count if ok else 0

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        c = self.config
        key = self._key()
        begin = int((start or self.initialOffset())[key])
        cap = None
        if ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
            cap = int(limit.max_rows)
        elif limit is None:
            cap = c.max_per_trigger
        if c.stream:
            end = int(stream_info(self._rpc, c.stream)["next"])
            if self._target is not None:
                end = min(end, self._target)
            if cap is not None:
                end = min(end, begin + cap)
            return {"offset": max(begin, end)}
        first = int((start or self.initialOffset()).get("first", 0))
        self._first = first
        want = cap if cap is not None else (c.max_per_trigger or 10_000)
        if self._target is not None:  # available-now: what was ready at the start
            want = min(want, self._target)
        if want > 0:
            got = self._rpc.call(
                "lease.acquire", queue=c.queue, group=c.group, max=want, ttl_ms=c.lease_ttl_ms, retry=False
            )
            leased, end = int(got["start"]), int(got["end"])
            # A batch is the range of sequence numbers from the previous end on, so a
            # gap means someone else leased in between: this query would read their
            # messages. Fail before acknowledging anything. (After a restart a gap is
            # this group's leases of a batch never planned: they are read in this one.)
            if self._leased_to is not None and leased != self._leased_to:
                raise ClientError(
                    f"leveret option group: another reader leases queue {c.queue!r} as "
                    f"group {c.group!r} too (it took sequence numbers {self._leased_to} to "
                    f"{leased - 1}); give each query reading a queue its own group"
                )
            self._leased_to = end
            if self._target is not None:
                self._target -= end - leased
        else:
            end = begin
        # Spark plans a batch only after the previous one is in the commit log, so this
        # query's leases below ``begin`` are done: ack them now rather than wait for
        # commit(), which Spark calls only when it plans another batch with data (never
        # for the last batch of an availableNow run, nor for a restarted query's last).
        self._ack_below(begin, first)
        return {"seq": max(begin, end), "first": first}

    def _ack_below(self, end: int, first: int) -> None:
        """Acknowledge this query's leases below ``end``: from ``first``, the query's
        first offset (kept in every offset, so a restarted query knows it), never the
        leases of the group held before the query began."""
        low = max(first, self._acked)
        if end > low:
            payload: dict[str, Any] = {
                "queue": self.config.source_name,
                "group": self.config.group,
                "upto": end - 1,
                "from": low,
            }  # 'from' is a Python keyword
            self._rpc.call("lease.ack", **payload)
            self._acked = end

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        c = self.config
        s, e = int(start[self._key()]), int(end[self._key()])
        if c.stream:
            return [StreamRange(c.stream, a, b) for a, b in _split(s, e, c.partition_size)]
        return [LeaseRange(c.source_name, c.group, a, b) for a, b in _split(s, e, c.partition_size)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return record_batches(read_partition(self.config, partition))

    def commit(self, end: dict) -> None:
        if self.config.queue:
            self._ack_below(int(end["seq"]), int(end.get("first", 0)))

    def stop(self) -> None:
        """Spark stops the source (in the process that planned the batches). For a queue,
        hand back at once (``lease.release``) this query's leases not acknowledged, from
        ``max(_acked, the query's first offset)`` up to the end of its last lease.acquire
        (or, when this process acquired nothing, the group's next sequence number): the
        batches Spark planned and has not reported committed. Their messages are ready
        again now (redelivered) instead of after ``leaseTtlMs``; a restarted query that
        replays such a batch reads fewer rows, and the messages come in a later one. A
        reader that saw no offset releases nothing.

        Spark ends the source runner process with SIGTERM, even while it waits for
        Spark's next call (a batch running); :func:`_stop_on_sigterm` makes that raise
        SystemExit so the runner's ``finally: reader.stop()`` gets here, and SIGTERM is
        ignored while this runs (main thread only; the previous handler is restored).
        Each connection it uses waits at most ``timeout`` seconds. Never raises: leases
        it cannot release expire after ``leaseTtlMs`` as before."""
        try:
            previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
        except ValueError:  # not the main thread: leave signals alone
            previous = False
        try:
            self._rpc.close()
            c = self.config
            if c.queue and self._first is not None:
                low = max(self._acked, self._first)
                with BlockingClient(c.url, timeout=min(c.timeout, 10.0)) as client:
                    high = self._leased_to
                    if high is None:
                        info = client.rpc("lease.info", {"queue": c.queue, "group": c.group})
                        high = int(info["next"])
                    if high > low:
                        client.rpc(
                            "lease.release",
                            {"queue": c.queue, "group": c.group, "seqs": list(range(low, high))},
                        )
        except Exception:
            pass
        finally:
            if previous is not False:
                signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
