"""Benchmark workloads.  Each is bounded by a message count AND a time limit.

A workload is an ``async def wl(broker, settings, meter) -> list[Row]``.  It
creates uniquely named queues/exchanges, calls ``meter.start()`` right before
the timed phase and ``meter.stop()`` right after it (so set-up such as
pre-filling a queue is not measured), and deletes what it created even when
it fails.  A ``Row`` reports ``messages`` handled in ``seconds`` of wall time;
``run.py`` divides the broker CPU time of the meter window by ``messages``.
"""

from __future__ import annotations

import asyncio
import gc
import math
import random
import resource
import secrets
import statistics
import struct
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from brokers import Broker
from loadgen import Channel, Connection, message_frames, wait_any_progress

from leveret.amqp.frames import encode_publish


@dataclass
class Settings:
    """Knobs shared by all workloads (counts are messages, times seconds)."""

    messages: int = 200_000      # upper bound on messages per workload
    seconds: float = 20.0        # upper bound on the timed phase per workload
    body_size: int = 100         # bytes, workloads a-d
    prefetch: int = 1000         # basic.qos prefetch_count for consumers
    ack_every: int = 100         # consumers ack with multiple=True every N deliveries
    batch: int = 500             # messages per transport.write when flooding
    latency_window: int = 1000   # pubsub: max messages published but not yet consumed
    latency_batch: int = 50      # pubsub: messages per write (they share one timestamp)
    fanout_backlog: int = 50_000  # fanout: max per-queue backlog before the publisher waits
    latency_rate: int = 5000     # latency: fixed publish rate, msg/s (when latency_rates is empty)
    latency_rates: tuple[int, ...] = ()  # latency: one row per rate, msg/s (empty: latency_rate)
    confirm_window: int = 1000   # confirms: max unconfirmed publishes
    grace: float = 30.0          # extra time allowed to drain in-flight messages at the end
    backlog_messages: int = 1_000_000  # backlog/recovery: persistent messages left in the queue
    backlog_body_size: int = 1024      # backlog/recovery: body bytes
    keep_backlog: bool = False   # backlog: leave the queue for a following recovery workload
    nack_messages: int = 50_000  # nack-heavy: messages (also capped by ``messages``)
    nack_rejects: int = 2        # nack-heavy: nacks (requeue) per message before its ack
    delayed_messages: int = 100_000  # delayed-redeliveries: messages (also capped by ``messages``)
    redelivery_delay: int = 1000  # delayed-redeliveries: ms (x-redelivery-delay / retry-queue TTL)
    l1_publishers: int = 1       # l1-16b, l1-1k: publisher processes (lavinmqperf -x)
    idle_queues: int = 100_000   # idle-queues: queues declared
    idle_connections: int = 10_000  # idle-connections: AMQP connections opened (one channel each)


@dataclass
class Row:
    """One result line: ``messages`` processed in ``seconds`` (wall clock)."""

    name: str
    messages: int
    seconds: float
    extra: dict = field(default_factory=dict)

    @property
    def rate(self) -> float:
        """Messages per second."""
        return self.messages / self.seconds if self.seconds > 0 else 0.0


class Meter:
    """Snapshots broker CPU/RSS and load-generator CPU around the timed phase."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.t0 = self.t1 = 0.0
        self.cpu0 = self.cpu1 = 0.0
        self.gen0 = self.gen1 = 0.0
        self.rss_bytes = 0

    @staticmethod
    def _own_cpu() -> float:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return ru.ru_utime + ru.ru_stime

    def start(self) -> None:
        self.cpu0 = self.broker.cpu_seconds()
        self.gen0 = self._own_cpu()
        self.t0 = time.perf_counter()

    def stop(self) -> None:
        self.t1 = time.perf_counter()
        self.cpu1 = self.broker.cpu_seconds()
        self.gen1 = self._own_cpu()
        self.rss_bytes = self.broker.rss_bytes()

    @property
    def seconds(self) -> float:
        """Wall-clock length of the timed phase."""
        return self.t1 - self.t0

    @property
    def broker_cpu(self) -> float:
        """Broker CPU seconds (user+system) spent in the timed phase."""
        return self.cpu1 - self.cpu0

    @property
    def gen_cpu(self) -> float:
        """Load-generator CPU seconds spent in the timed phase."""
        return self.gen1 - self.gen0


# ------------------------------------------------------------------ helpers
def _name(kind: str) -> str:
    return f"bench-{kind}-{secrets.token_hex(4)}"


async def _open(broker: Broker) -> tuple[Connection, Channel]:
    conn = await Connection.open(broker.host, broker.port)
    return conn, await conn.channel()


async def _close(*conns: Connection) -> None:
    for c in conns:
        try:
            await c.close()
        except Exception:  # best-effort
            c.abort()


async def _cleanup(broker: Broker, queues: list[str], exchanges: list[str] = ()) -> None:
    """Delete benchmark queues/exchanges on a fresh connection (best effort)."""
    try:
        conn, ch = await _open(broker)
    except Exception:  # broker may be dead; nothing to clean then
        return
    try:
        for q in queues:
            try:
                await asyncio.wait_for(ch.queue_delete(q), 30)
            except Exception:
                ch = await conn.channel()
        for x in exchanges:
            try:
                await asyncio.wait_for(ch.exchange_delete(x), 30)
            except Exception:
                ch = await conn.channel()
    finally:
        await _close(conn)


async def _flood(conn: Connection, msg: bytes, count: int, deadline: float, batch: int) -> int:
    """Write ``msg`` up to ``count`` times in chunks of ``batch``; returns messages written."""
    sent = 0
    chunk = msg * batch
    while sent < count and time.monotonic() < deadline:
        k = min(batch, count - sent)
        conn.write(chunk if k == batch else msg * k)
        sent += k
        await conn.drain()
    return sent


async def _wait_until(cond: Callable[[], bool], conns: list[Connection], deadline: float) -> bool:
    """Wait for ``cond()`` using the connections' progress notifications."""
    while not cond():
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        await wait_any_progress(conns, min(left, 1.0))
    return True


async def _sync_depth(ch: Channel, q: str, target: int, deadline: float) -> int:
    """Poll a passive ``queue.declare`` until the queue holds ``target`` messages
    (publishes are asynchronous: the broker may still be enqueueing); returns the depth."""
    depth = (await ch.queue_declare(q, passive=True)).message_count
    while depth < target and time.monotonic() < deadline:
        await asyncio.sleep(0.001)
        depth = (await ch.queue_declare(q, passive=True)).message_count
    return depth


def _phase(meter: Meter) -> dict:
    """A phase's own CPU window (``run.py`` uses it instead of the workload's)."""
    return {"phase_seconds": meter.seconds, "phase_broker_cpu_s": meter.broker_cpu,
            "phase_loadgen_cpu_s": meter.gen_cpu, "phase_rss_bytes": meter.rss_bytes}


def percentiles_ms(samples_ns: list[int]) -> dict:
    """Latency figures of ``samples_ns`` (nanoseconds): ``p50_ms``, ``p99_ms`` (nearest
    rank: the smallest sample with at least p% of the samples at or below it),
    ``max_ms``, ``mean_ms`` (milliseconds) and ``samples``; ``{}`` for no samples."""
    if not samples_ns:
        return {}
    s = sorted(samples_ns)
    n = len(s)

    def pct(p: float) -> float:
        return s[max(0, math.ceil(p * n / 100) - 1)] / 1e6

    return {"p50_ms": pct(50), "p99_ms": pct(99), "max_ms": s[-1] / 1e6,
            "mean_ms": statistics.fmean(s) / 1e6, "samples": n}


def parse_rates(spec: str) -> tuple[int, ...]:
    """``"10000,50000"`` or ``"10k,50k"`` → ``(10000, 50000)`` (msg/s). Raises ValueError
    on an empty list or a rate that is not a positive integer."""
    rates = []
    for part in (p.strip().lower() for p in spec.split(",")):
        if not part:
            continue
        value = int(part[:-1]) * 1000 if part.endswith("k") else int(part)
        if value <= 0:
            raise ValueError(f"rate must be positive, not {part!r}")
        rates.append(value)
    if not rates:
        raise ValueError(f"no rate in {spec!r}")
    return tuple(rates)


# ---------------------------------------------------------------- workloads
async def wl_publish(broker: Broker, s: Settings, meter: Meter) -> list[Row]:
    """(a) Publish transient ``body_size``-byte messages to a queue with no consumer.

    Rate = messages / time until passive ``queue.declare`` reports them all
    enqueued (polled after the last publish was written).
    """
    q = _name("publish")
    conn, ch = await _open(broker)
    try:
        await ch.queue_declare(q)
        msg = ch.message("", q, b"x" * s.body_size)
        meter.start()
        sent = await _flood(conn, msg, s.messages, time.monotonic() + s.seconds, s.batch)
        depth = await _sync_depth(ch, q, sent, time.monotonic() + s.grace)
        meter.stop()
        return [Row("publish", depth, meter.seconds, {"published": sent})]
    finally:
        await _close(conn)
        await _cleanup(broker, [q])


async def wl_consume(broker: Broker, s: Settings, meter: Meter) -> list[Row]:
    """(b) Drain a pre-filled queue: manual ack (multiple, every ``ack_every``), prefetch ``prefetch``."""
    q = _name("consume")
    conn, ch = await _open(broker)
    conns = [conn]
    try:
        await ch.queue_declare(q)
        msg = ch.message("", q, b"x" * s.body_size)
        sent = await _flood(conn, msg, s.messages, time.monotonic() + max(s.seconds, 10), s.batch)
        depth = await _sync_depth(ch, q, sent, time.monotonic() + s.grace)
        cconn, cch = await _open(broker)
        conns.append(cconn)
        await cch.qos(s.prefetch)
        await asyncio.sleep(0.5)  # let the broker settle after the fill
        meter.start()
        tag = await cch.consume(q, ack_every=s.ack_every)
        await _wait_until(lambda: cch.delivered >= depth, [cconn], time.monotonic() + s.seconds)
        meter.stop()
        cch.ack_pending()
        await cch.cancel(tag)
        return [Row("consume", cch.delivered, meter.seconds, {"prefilled": depth})]
    finally:
        await _close(*conns)
        await _cleanup(broker, [q])


async def wl_pubsub(broker: Broker, s: Settings, meter: Meter) -> list[Row]:
    """(c) One producer and one consumer at once; throughput and end-to-end latency.

    Each message body starts with a big-endian ``time.monotonic_ns()`` taken
    just before its write; the consumer subtracts it from its receive time.
    The producer keeps at most ``latency_window`` messages in flight
    (published but not yet delivered), so latency reflects the broker's
    service time under load, not an unbounded backlog.
    """
    q = _name("pubsub")
    cconn, cch = await _open(broker)
    pconn, pch = await _open(broker)
    try:
        await cch.queue_declare(q)
        await cch.qos(s.prefetch)
        tag = await cch.consume(q, ack_every=s.ack_every, measure_latency=True)
        pad = b"x" * max(0, s.body_size - 8)
        # method + content-header frames, then the body frame with the timestamp slot
        head = message_frames(pch.id, "", q, b"\0" * (8 + len(pad)), pconn.frame_max)
        prefix = head[:-(8 + len(pad) + 1)]
        suffix = pad + b"\xce"
        pack_ts = struct.Struct(">Q").pack
        n, window, batch = s.messages, s.latency_window, s.latency_batch
        sent = 0
        meter.start()
        deadline = time.monotonic() + s.seconds
        while sent < n and time.monotonic() < deadline:
            allowed = min(window - (sent - cch.delivered), n - sent, batch)
            if allowed <= 0:
                await cconn.wait_progress(1.0)
                if cconn.closed:
                    raise cconn.closed
                continue
            pconn.write((prefix + pack_ts(time.monotonic_ns()) + suffix) * allowed)
            sent += allowed
            await pconn.drain()
        await _wait_until(lambda: cch.delivered >= sent, [cconn], time.monotonic() + s.grace)
        meter.stop()
        cch.ack_pending()
        await cch.cancel(tag)
        extra = {"published": sent, **percentiles_ms(cch.latencies_ns)}
        return [Row("pubsub", cch.delivered, meter.seconds, extra)]
    finally:
        await _close(pconn, cconn)
        await _cleanup(broker, [q])


async def wl_latency(broker: Broker, s: Settings, meter: Meter) -> list[Row]:
    """(c') Like pubsub, but the producer publishes at a fixed rate for at most
    ``min(seconds, 10)`` s, so latency is measured below saturation: one row
    ``latency @RATE/s`` per rate of ``latency_rates`` (else ``latency_rate``), each with
    its own CPU window, in msg/s.

    Every ~1 ms the producer writes the messages that are due, each stamped with
    ``time.monotonic_ns()`` just before the write; the consumer (same process, same
    clock) subtracts it from the time its read arrived. ``achieved_rate`` is the rate the
    producer really kept (messages ÷ time until its last write) and ``write_gap_max_ms``
    its longest pause between writes: a late producer shows there, not in the latency.
    """
    rows = []
    for rate in s.latency_rates or (s.latency_rate,):
        phase = Meter(broker)
        rows.append(await _latency_at(broker, s, phase, rate))
    meter.start()  # the rows carry their own windows
    meter.stop()
    return rows


async def _latency_at(broker: Broker, s: Settings, meter: Meter, rate: int) -> Row:
    q = _name("latency")
    cconn, cch = await _open(broker)
    pconn, pch = await _open(broker)
    try:
        await cch.queue_declare(q)
        await cch.qos(s.prefetch)
        tag = await cch.consume(q, ack_every=s.ack_every, measure_latency=True)
        pad = b"x" * max(0, s.body_size - 8)
        head = message_frames(pch.id, "", q, b"\0" * (8 + len(pad)), pconn.frame_max)
        prefix, suffix = head[:-(8 + len(pad) + 1)], pad + b"\xce"
        pack_ts = struct.Struct(">Q").pack
        n = min(s.messages, int(rate * min(s.seconds, 10.0)))
        sent = 0
        gap_max = 0.0
        # The load generator's own full garbage collections (20+ ms here, with ~50,000
        # tracked objects) would show as the broker's latency: none while measuring.
        gc.collect()
        gc.disable()
        meter.start()
        t0 = t_write = time.monotonic()
        while sent < n:
            now = time.monotonic()
            due = min(n, int((now - t0) * rate)) - sent
            if due > 0:
                gap_max = max(gap_max, now - t_write)
                t_write = now
                pconn.write((prefix + pack_ts(time.monotonic_ns()) + suffix) * due)
                sent += due
                await pconn.drain()
            await asyncio.sleep(0.001)
            if cconn.closed:
                raise cconn.closed
        t_last = t_write - t0
        await _wait_until(lambda: cch.delivered >= sent, [cconn], time.monotonic() + s.grace)
        meter.stop()
        gc.enable()
        cch.ack_pending()
        await cch.cancel(tag)
        extra = {"published": sent, "target_rate": rate,
                 "achieved_rate": round(sent / t_last, 1) if t_last > 0 else None,
                 "write_gap_max_ms": round(gap_max * 1e3, 3),
                 **percentiles_ms(cch.latencies_ns), **_phase(meter)}
        return Row(f"latency @{rate}/s", cch.delivered, meter.seconds, extra)
    finally:
        gc.enable()
        await _close(pconn, cconn)
        await _cleanup(broker, [q])


async def wl_fanout(broker: Broker, s: Settings, meter: Meter, n_queues: int = 3) -> list[Row]:
    """(d) Publish to a fanout exchange bound to 3 queues, each with its own consumer.

    Two rows: publish rate (published / time until a round trip on the
    publishing channel, issued after the last publish, completes) and
    delivery rate (deliveries summed over the 3 consumers / time until all
    were received).  The publisher waits when any queue's backlog
    exceeds ``fanout_backlog``.
    """
    x = _name("fanout")
    queues = [f"{x}-q{i}" for i in range(n_queues)]
    pconn, pch = await _open(broker)
    consumers: list[tuple[Connection, Channel, str]] = []
    try:
        await pch.exchange_declare(x, "fanout")
        for q in queues:
            await pch.queue_declare(q)
            await pch.queue_bind(q, x)
        for q in queues:
            cconn, cch = await _open(broker)
            await cch.qos(s.prefetch)
            consumers.append((cconn, cch, await cch.consume(q, ack_every=s.ack_every)))
        cconns = [c for c, _, _ in consumers]
        chans = [ch for _, ch, _ in consumers]
        msg = pch.message(x, "", b"x" * s.body_size)
        sent = 0
        meter.start()
        deadline = time.monotonic() + s.seconds
        while sent < s.messages and time.monotonic() < deadline:
            allowed = min(s.fanout_backlog - (sent - min(c.delivered for c in chans)), s.messages - sent,
                          s.batch)
            if allowed <= 0:
                await _wait_until(
                    lambda sent=sent: min(c.delivered for c in chans) > sent - s.fanout_backlog + s.batch,
                    cconns, min(deadline, time.monotonic() + 1.0))
                continue
            pconn.write(msg * allowed)
            sent += allowed
            await pconn.drain()
            await asyncio.sleep(0)  # let the consumers' callbacks run
        await pch.exchange_declare_passive(x)  # round trip: all publishes routed
        t_pub = time.perf_counter() - meter.t0
        await _wait_until(lambda: all(c.delivered >= sent for c in chans), cconns, time.monotonic() + s.grace)
        meter.stop()
        delivered = sum(c.delivered for c in chans)
        for _cconn, cch, tag in consumers:
            cch.ack_pending()
            await cch.cancel(tag)
        return [
            Row("fanout publish", sent, t_pub, {"queues": n_queues}),
            Row("fanout deliver", delivered, meter.seconds, {"expected": sent * n_queues}),
        ]
    finally:
        await _close(pconn, *[c for c, _, _ in consumers])
        await _cleanup(broker, queues, [x])


async def _publish_confirmed(conn, ch, msg: bytes, total: int, window: int,
                             deadline: float | None = None, progress=None) -> int:
    """Write ``msg`` up to ``total`` times (until ``deadline``, a monotonic time), keeping at
    most ``window`` publishes unconfirmed; ``progress(sent)`` after each write. Returns how
    many were sent (their confirms may still be on the way)."""
    sent = 0
    while sent < total and (deadline is None or time.monotonic() < deadline):
        allowed = min(window - (sent - ch.confirmed), total - sent)
        if allowed <= 0:
            await conn.wait_progress(1.0)
            if conn.closed:
                raise conn.closed
            continue
        conn.write(msg * allowed)
        sent += allowed
        await conn.drain()
        if progress is not None:
            progress(sent)
    return sent


async def _confirm(broker: Broker, s: Settings, meter: Meter, body_size: int, label: str) -> list[Row]:
    """(e) Persistent publishes with confirms to a durable queue, at most ``confirm_window`` unconfirmed."""
    q = _name("confirm")
    conn, ch = await _open(broker)
    try:
        await ch.queue_declare(q, durable=True)
        await ch.confirm_select()
        msg = ch.message("", q, b"x" * body_size, persistent=True)
        meter.start()
        sent = await _publish_confirmed(conn, ch, msg, s.messages, s.confirm_window,
                                        time.monotonic() + s.seconds)
        await _wait_until(lambda: ch.confirmed >= sent, [conn], time.monotonic() + s.grace)
        meter.stop()
        return [Row(label, ch.confirmed, meter.seconds, {"published": sent, "nacked": ch.nacked})]
    finally:
        await _close(conn)
        await _cleanup(broker, [q])


async def wl_confirm_100b(broker: Broker, s: Settings, meter: Meter) -> list[Row]:
    """(e) Persistent 100-byte messages with publisher confirms (window 1000), durable queue."""
    return await _confirm(broker, s, meter, 100, "confirm 100B")


async def wl_confirm_4k(broker: Broker, s: Settings, meter: Meter) -> list[Row]:
    """(e) Persistent 4 KiB messages with publisher confirms (window 1000), durable queue."""
    return await _confirm(broker, s, meter, 4096, "confirm 4KB")


# ----------------------------------------------------- requeue and redelivery
REDELIVERY_SECTION = "redelivery"  # Row.extra["section"]: delayed-redeliveries has its own table

_ID = struct.Struct(">Q")


async def _fill_with_ids(conn: Connection, ch: Channel, q: str, n: int, body_size: int, batch: int) -> int:
    """Publish ``n`` transient messages to ``q`` whose bodies start with their id
    (0 .. n-1, big-endian u64), padded to ``body_size``; wait until all are enqueued."""
    pad = b"x" * max(0, body_size - 8)
    head = message_frames(ch.id, "", q, b"\0" * (8 + len(pad)), conn.frame_max)
    prefix, suffix = head[:-(8 + len(pad) + 1)], pad + b"\xce"
    pack = _ID.pack
    for start in range(0, n, batch):
        conn.write(b"".join(prefix + pack(i) + suffix for i in range(start, min(n, start + batch))))
        await conn.drain()
    return await _sync_depth(ch, q, n, time.monotonic() + 120)


async def _round_trip(ch: Channel, q: str) -> int:
    """A passive queue.declare on ``ch``: its reply comes after the broker has handled
    every frame written before it on that connection. Returns the queue's message count."""
    return (await ch.queue_declare(q, passive=True)).message_count


async def wl_nack_heavy(broker: Broker, s: Settings, meter: Meter) -> list[Row]:
    """Requeue loop: ``nack_messages`` 100 B messages, each id-stamped; one consumer
    (prefetch ``prefetch``) answers the first ``nack_rejects`` (2) deliveries of every
    message with ``basic.nack(multiple=False, requeue=True)`` and acks the next one
    (``multiple=True`` every ``ack_every``). Rows: acked messages/s and deliveries/s
    (same window: CPU/msg is per acked message and per delivery)."""
    q = _name("nack")
    n = min(s.nack_messages, s.messages)
    conn, ch = await _open(broker)
    try:
        await ch.queue_declare(q)
        depth = await _fill_with_ids(conn, ch, q, n, s.body_size, s.batch)
        if depth < n:
            raise RuntimeError(f"only {depth} of {n} messages enqueued")
        cch = await conn.channel()
        await cch.qos(s.prefetch)
        await asyncio.sleep(0.5)  # let the broker settle after the fill
        meter.start()
        tag = await cch.consume_settling(q, n, s.nack_rejects, requeue=True, method="nack",
                                         ack_every=s.ack_every)
        done = await _wait_until(lambda: cch.acked >= n, [conn], time.monotonic() + s.seconds)
        cch.ack_pending()
        left = await _round_trip(ch, q)
        meter.stop()
        acked, deliveries = cch.acked, cch.delivered
        await cch.cancel(tag)
        extra = {"nacks": cch.rejected, "deliveries": deliveries, "completed": done,
                 "left_in_queue": left, "prefilled": depth}
        return [Row("nack-heavy acked", acked, meter.seconds, extra),
                Row("nack-heavy deliveries", deliveries, meter.seconds, {"acked": acked, **extra})]
    finally:
        await _close(conn)
        await _cleanup(broker, [q])


async def _delayed(broker: Broker, s: Settings, meter: Meter, native: bool, label: str) -> list[Row]:
    """Reject-once-then-ack with a ``redelivery_delay`` ms wait between the two deliveries.

    ``native`` (leveret only): the queue has ``x-redelivery-delay``; the consumer rejects
    with requeue=true and leveret holds the message as a delayed redelivery. Otherwise,
    RabbitMQ's retry pattern: the work queue dead-letters (default exchange) to a retry
    queue with ``x-message-ttl`` = delay, which dead-letters back to the work queue; the
    consumer rejects with requeue=false.
    """
    n = min(s.delayed_messages, s.messages)
    q = _name("delayed")
    retry = f"{q}-retry"
    conn, ch = await _open(broker)
    info: dict = {}
    sampler = None
    try:
        if native:
            await ch.queue_declare(q, arguments={"x-redelivery-delay": s.redelivery_delay})
        else:
            await ch.queue_declare(retry, arguments={"x-message-ttl": s.redelivery_delay,
                                                     "x-dead-letter-exchange": "",
                                                     "x-dead-letter-routing-key": q})
            await ch.queue_declare(q, arguments={"x-dead-letter-exchange": "",
                                                 "x-dead-letter-routing-key": retry})
        depth = await _fill_with_ids(conn, ch, q, n, s.body_size, s.batch)
        if depth < n:
            raise RuntimeError(f"only {depth} of {n} messages enqueued")
        cconn, cch = await _open(broker)
        try:
            await cch.qos(s.prefetch)
            await asyncio.sleep(1.0)  # let the broker settle after the fill
            rss_full = broker.rss_bytes()
            sampler = asyncio.ensure_future(_rss_sampler(broker, info, 0.1))
            meter.start()
            t0 = time.perf_counter()
            cpu0 = broker.cpu_seconds()
            gen0 = Meter._own_cpu()
            tag = await cch.consume_settling(q, n, 1, requeue=native, method="reject", ack_every=s.ack_every)
            deadline = time.monotonic() + s.seconds + s.grace + s.redelivery_delay / 1000
            if not await _wait_until(lambda: cch.rejected >= n, [cconn], deadline):
                raise TimeoutError(f"only {cch.rejected} of {n} rejected")
            t_reject = time.perf_counter() - t0
            cpu_reject = broker.cpu_seconds() - cpu0
            gen_reject = Meter._own_cpu() - gen0
            rss_held = broker.rss_bytes()
            held_at_end = cch.rejected - cch.returned
            if not await _wait_until(lambda: cch.acked >= n, [cconn], deadline):
                raise TimeoutError(f"only {cch.acked} of {n} acked")
            cch.ack_pending()
            left = await _round_trip(cch, q)
            meter.stop()
            t_all = time.perf_counter() - t0
            sampler.cancel()
            await cch.cancel(tag)
        finally:
            await _close(cconn)
        mb = 2**20
        extra = {
            "section": REDELIVERY_SECTION, "mode": "x-redelivery-delay" if native else "dlx+ttl retry queue",
            "delay_ms": s.redelivery_delay, "rejected": cch.rejected, "deliveries": cch.delivered,
            "left_in_queue": left,
            "reject_s": round(t_reject, 3), "reject_msg_per_s": round(n / t_reject, 1),
            "reject_cpu_us_per_msg": round(cpu_reject / n * 1e6, 2),
            "reject_broker_cpu_pct": round(100 * cpu_reject / t_reject, 1),
            "reject_loadgen_cpu_pct": round(100 * gen_reject / t_reject, 1),
            "total_s": round(t_all, 3), "after_reject_s": round(t_all - t_reject, 3),
            "held_at_reject_end": held_at_end, "held_peak": cch.held_peak,
            "rss_full_mb": round(rss_full / mb, 1), "rss_held_mb": round(rss_held / mb, 1),
            "peak_rss_mb": round(info.get("peak_rss", 0) / mb, 1),
            "rss_held_growth_bytes_per_msg": round((rss_held - rss_full) / max(1, held_at_end), 1),
        }
        return [Row(label, cch.acked, t_all, extra)]
    finally:
        if sampler is not None:
            sampler.cancel()
        await _close(conn)
        await _cleanup(broker, [q, retry] if not native else [q])


async def wl_delayed_redeliveries(broker: Broker, s: Settings, meter: Meter) -> list[Row]:
    """``delayed_messages`` are rejected once each and acked on redelivery ``redelivery_delay``
    ms later: leveret's ``x-redelivery-delay``, RabbitMQ's dead-letter + TTL retry queue."""
    return await _delayed(broker, s, meter, broker.name == "leveret", "delayed-redeliveries")


async def wl_delayed_redeliveries_dlx(broker: Broker, s: Settings, meter: Meter) -> list[Row]:
    """Like ``delayed-redeliveries``, but the dead-letter + TTL retry queue on both brokers."""
    return await _delayed(broker, s, meter, False, "delayed-redeliveries dlx")


# ------------------------------------------------------- backlog and recovery
BACKLOG_SECTION = "backlog"  # Row.extra["section"]: shown in their own table, not the main one


async def _rss_sampler(broker: Broker, out: dict, period: float = 0.5) -> None:
    """Track the broker's peak RSS in ``out["peak_rss"]`` until cancelled."""
    while True:
        out["peak_rss"] = max(out.get("peak_rss", 0), broker.rss_bytes())
        await asyncio.sleep(period)


async def _fill_backlog(broker: Broker, s: Settings, q: str, arguments: dict | None,
                        meter: Meter | None = None) -> dict:
    """Declare durable ``q`` and publish ``backlog_messages`` persistent messages with
    confirms (window ``confirm_window``); no consumer. Returns the figures of the fill."""
    n = s.backlog_messages
    conn, ch = await _open(broker)
    info: dict = {}
    sampler = asyncio.ensure_future(_rss_sampler(broker, info))
    try:
        await ch.queue_declare(q, durable=True, arguments=arguments)
        await ch.confirm_select()
        await asyncio.sleep(1.0)  # idle baseline (after the declare)
        rss0 = broker.rss_bytes()
        disk0 = broker.disk_usage()[0]
        msg = ch.message("", q, b"x" * s.backlog_body_size, persistent=True)
        if meter is not None:
            meter.start()
        t0 = time.perf_counter()
        cpu0 = broker.cpu_seconds()
        step = next_log = max(1, n // 10)

        def progress(sent: int) -> None:
            nonlocal next_log
            if sent >= next_log:
                next_log += step
                print(f"    [{broker.name}] backlog: {sent:,} published, {ch.confirmed:,} confirmed, "
                      f"{time.perf_counter() - t0:.0f} s, RSS {broker.rss_bytes() / 2**20:.0f} MB",
                      file=sys.stderr, flush=True)

        sent = await _publish_confirmed(conn, ch, msg, n, s.confirm_window, progress=progress)
        if not await _wait_until(lambda: ch.confirmed >= sent, [conn], time.monotonic() + 300):
            raise TimeoutError(f"only {ch.confirmed} of {sent} publishes confirmed")
        seconds = time.perf_counter() - t0
        cpu = broker.cpu_seconds() - cpu0
        if meter is not None:
            meter.stop()
        depth = (await ch.queue_declare(q, passive=True)).message_count
        rss_end = broker.rss_bytes()
        disk_end, _ = broker.disk_usage()
        await asyncio.sleep(5.0)  # let the broker settle (GC, checkpoints, compaction)
        rss = broker.rss_bytes()
        disk, apparent = broker.disk_usage()
        info["peak_rss"] = max(info.get("peak_rss", 0), rss)
        info.update(
            published=sent, confirmed=ch.confirmed, nacked=ch.nacked, depth=depth,
            publish_seconds=seconds, publish_cpu_s=cpu,
            rss_before=rss0, rss_end=rss_end, rss=rss, disk_before=disk0, disk_end=disk_end,
            disk=disk, disk_apparent=apparent,
        )
        return info
    finally:
        sampler.cancel()
        await _close(conn)


def _backlog_row(label: str, n: int, body: int, mode: str, info: dict) -> Row:
    mb = 2**20
    extra = {
        "section": BACKLOG_SECTION, "queue_mode": mode, "body_size": body,
        "published": info["published"], "nacked": info["nacked"], "queue_depth": info["depth"],
        "idle_rss_mb": round(info["rss_before"] / mb, 1),
        "rss_end_mb": round(info["rss_end"] / mb, 1),          # right after the last confirm
        "rss_settled_mb": round(info["rss"] / mb, 1),          # 5 s later
        "peak_rss_mb": round(info["peak_rss"] / mb, 1),
        "rss_bytes_per_msg": round(info["rss"] / n, 1),
        "rss_growth_bytes_per_msg": round((info["rss"] - info["rss_before"]) / n, 1),
        "disk_mb": round(info["disk"] / mb, 1),
        "disk_apparent_mb": round(info["disk_apparent"] / mb, 1),
        "disk_end_mb": round(info["disk_end"] / mb, 1),
        "disk_bytes_per_msg": round(info["disk"] / n, 1),
        "disk_growth_bytes_per_msg": round((info["disk"] - info["disk_before"]) / n, 1),
    }
    return Row(label, info["confirmed"], info["publish_seconds"], extra)


async def _drain_backlog(broker: Broker, s: Settings, q: str, depth: int) -> dict:
    """One consumer (prefetch ``prefetch``, acks every ``ack_every``) drains the ``depth``
    messages of ``q``: the drain's msg/s, broker µs CPU/msg and peak RSS."""
    conn, ch = await _open(broker)
    info: dict = {}
    sampler = asyncio.ensure_future(_rss_sampler(broker, info))
    try:
        await ch.qos(s.prefetch)
        t0, cpu0 = time.perf_counter(), broker.cpu_seconds()
        tag = await ch.consume(q, ack_every=s.ack_every)
        await _wait_until(lambda: ch.delivered >= depth, [conn], time.monotonic() + 1800)
        seconds, cpu = time.perf_counter() - t0, broker.cpu_seconds() - cpu0
        ch.ack_pending()
        await ch.cancel(tag)
        delivered = ch.delivered
    finally:
        sampler.cancel()
        await _close(conn)
    return {
        "drained": delivered,
        "drain_msg_per_s": round(delivered / seconds) if seconds > 0 else 0,
        "drain_cpu_us_per_msg": round(cpu / max(delivered, 1) * 1e6, 1),
        "drain_peak_rss_mb": round(info.get("peak_rss", 0) / 2**20, 1),
    }


async def _backlog(broker: Broker, s: Settings, meter: Meter, lazy: bool) -> list[Row]:
    """Publish ``backlog_messages`` persistent ``backlog_body_size``-byte messages with confirms
    into a durable queue with no consumer; report publish rate, RSS and disk use; then
    (unless ``recovery`` follows and needs the backlog) drain it with one consumer."""
    q = _name("backlog")
    mode = "lazy" if lazy else "default"
    info = await _fill_backlog(broker, s, q, {"x-queue-mode": "lazy"} if lazy else None, meter)
    row = _backlog_row(f"backlog {mode}", s.backlog_messages, s.backlog_body_size, mode, info)
    if lazy and s.keep_backlog:
        broker.extra["backlog_queue"] = (q, info["depth"])
    else:
        row.extra.update(await _drain_backlog(broker, s, q, info["depth"]))
        await _cleanup(broker, [q])
    return [row]


async def wl_backlog(broker: Broker, s: Settings, meter: Meter) -> list[Row]:
    """Backlog of ``backlog_messages`` persistent 1 KB messages in a lazy durable queue."""
    return await _backlog(broker, s, meter, lazy=True)


async def wl_backlog_default(broker: Broker, s: Settings, meter: Meter) -> list[Row]:
    """Like ``backlog``, but the queue has no arguments (a default classic queue)."""
    return await _backlog(broker, s, meter, lazy=False)


async def _measure_restart(broker: Broker, q: str, n: int, kill: bool) -> dict:
    """Stop the broker (SIGTERM, or SIGKILL if ``kill``), start it again on the same
    data, and time (from process start) until the AMQP port is up, until a passive
    ``queue.declare`` reports ``n`` messages, and until the first message is delivered."""
    loop = asyncio.get_running_loop()
    stop_s = await loop.run_in_executor(None, lambda: broker.shutdown(kill=kill))
    t0 = await loop.run_in_executor(None, broker.launch)
    t_ready = time.monotonic() - t0
    cpu_ready = broker.cpu_seconds()
    conn = None
    deadline = time.monotonic() + 1800
    while conn is None:  # the port answers the protocol header; the handshake may still wait
        try:
            conn = await Connection.open(broker.host, broker.port, timeout=600)
        except (TimeoutError, OSError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)
    try:
        t_conn = time.monotonic() - t0
        ch = await conn.channel()
        count = -1
        polls = 0
        while True:
            count = (await asyncio.wait_for(ch.queue_declare(q, passive=True), 1800)).message_count
            polls += 1
            if count >= n or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.02)
        t_count = time.monotonic() - t0
        cpu_count = broker.cpu_seconds()
        rss_count = broker.rss_bytes()
        cch = await conn.channel()
        await cch.qos(1)
        # manual acks that are never sent: closing the connection requeues the message
        tag = await cch.consume(q, ack_every=10**9)
        await _wait_until(lambda: cch.delivered >= 1, [conn], deadline)
        t_first = time.monotonic() - t0
        await cch.cancel(tag)
    finally:
        await _close(conn)
    await asyncio.sleep(1.0)
    return {
        "signal": "SIGKILL" if kill else "SIGTERM", "stop_s": round(stop_s, 3),
        "ready_s": round(t_ready, 3), "connect_s": round(t_conn, 3),
        "count_s": round(t_count, 3), "first_message_s": round(t_first, 3),
        "message_count": count, "expected": n, "count_polls": polls,
        "cpu_at_ready_s": round(cpu_ready, 2), "cpu_at_count_s": round(cpu_count, 2),
        "rss_at_count_mb": round(rss_count / 2**20, 1),
        "rss_after_first_mb": round(broker.rss_bytes() / 2**20, 1),
    }


async def wl_recovery(broker: Broker, s: Settings, meter: Meter) -> list[Row]:
    """Restart the broker with a backlog of ``backlog_messages`` persistent messages in a
    lazy durable queue (the one ``backlog`` left, or a new one filled here, untimed):
    once after a clean stop (SIGTERM) and once after SIGKILL. Rows: seconds from process
    start until the queue reports all messages (``count_s``) and until the first one is
    delivered (``first_message_s``)."""
    q, depth = broker.extra.pop("backlog_queue", (None, 0))
    if q is None:
        q = _name("backlog")
        info = await _fill_backlog(broker, s, q, {"x-queue-mode": "lazy"})
        depth = info["depth"]
    rows = []
    try:
        for kill in (False, True):
            r = await _measure_restart(broker, q, depth, kill)
            print(f"    [{broker.name}] restart after {r['signal']}: stop {r['stop_s']:.1f} s, "
                  f"ready {r['ready_s']:.1f} s, count {r['message_count']:,} at {r['count_s']:.1f} s, "
                  f"first message at {r['first_message_s']:.1f} s, RSS {r['rss_after_first_mb']:.0f} MB",
                  file=sys.stderr, flush=True)
            rows.append(Row(f"recovery {r['signal']}", r["message_count"], r["count_s"],
                            {"section": BACKLOG_SECTION, **r}))
        # meter: CPU of the restarted process from its start until the count was right
        meter.t0, meter.t1 = 0.0, rows[-1].seconds
        meter.cpu0, meter.cpu1 = 0.0, rows[-1].extra["cpu_at_count_s"]
        meter.rss_bytes = broker.rss_bytes()
        return rows
    finally:
        await _cleanup(broker, [q])


Workload = Callable[[Broker, Settings, Meter], Awaitable[list[Row]]]

# Workloads that can run for minutes: run.py gives them this time limit instead.
def _backlog_limit(s: Settings) -> float:
    return s.backlog_messages / 500 + 600


from idle_memory import (  # noqa: E402
    MEMORY_SECTION as MEMORY_SECTION,
    wl_idle_connections,
    wl_idle_queues,
)
from l1 import (  # noqa: E402
    L1_SECTION as L1_SECTION,
    wl_l1_1k,
    wl_l1_16b,
)
from pika_publish import wl_publish_pika  # noqa: E402

TIME_LIMITS: dict[str, Callable[[Settings], float]] = {
    "backlog": _backlog_limit,
    "backlog-default": _backlog_limit,
    "recovery": lambda s: _backlog_limit(s) + 3 * 1800,
    # RabbitMQ 3.10 declares (and deletes) ~400 queues/s here, opens ~400 connections/s
    "idle-queues": lambda s: s.idle_queues / 50 + 300,
    "idle-connections": lambda s: s.idle_connections / 20 + 300,
    "latency": lambda s: len(s.latency_rates or (1,)) * (2 * s.seconds + 2 * s.grace + 60),
}

WORKLOADS: dict[str, Workload] = {
    "publish": wl_publish,
    "publish-pika": wl_publish_pika,
    "consume": wl_consume,
    "pubsub": wl_pubsub,
    "latency": wl_latency,
    "fanout": wl_fanout,
    "confirm-100b": wl_confirm_100b,
    "confirm-4k": wl_confirm_4k,
    "nack-heavy": wl_nack_heavy,
    "delayed-redeliveries": wl_delayed_redeliveries,
    "l1-16b": wl_l1_16b,
    "l1-1k": wl_l1_1k,
}

# ------------------------------------------------------- priority queues
PRIORITY_LEVELS = 10  # messages get priorities 0-9; the priority queue has x-max-priority 10


def _priority_chunks(ch: Channel, q: str, body: bytes, batch: int, seed: int = 1) -> list[bytes]:
    """16 writes of ``batch`` publishes each to ``q``, each message with a priority
    drawn at random from 0-9 (the same draws for every queue: same seed)."""
    rng = random.Random(seed)
    frames = [encode_publish(ch.id, "", q, body, {"priority": p}, ch.conn.frame_max)
              for p in range(PRIORITY_LEVELS)]
    return [b"".join(frames[rng.randrange(PRIORITY_LEVELS)] for _ in range(batch)) for _ in range(16)]


async def _priority_case(broker: Broker, s: Settings, kind: str, arguments: dict) -> list[Row]:
    """``publish KIND`` and ``consume KIND`` on one queue declared with ``arguments``."""
    q = _name(f"prio-{kind}")
    conn, ch = await _open(broker)
    conns = [conn]
    try:
        await ch.queue_declare(q, arguments=arguments)
        chunks = _priority_chunks(ch, q, b"x" * s.body_size, s.batch)
        size = len(chunks[0]) // s.batch  # every publish has the same length
        phase = Meter(broker)
        phase.start()
        sent, deadline = 0, time.monotonic() + s.seconds
        while sent < s.messages and time.monotonic() < deadline:
            k = min(s.batch, s.messages - sent)
            conn.write(chunks[(sent // s.batch) % len(chunks)][:size * k])
            sent += k
            await conn.drain()
        depth = await _sync_depth(ch, q, sent, time.monotonic() + s.grace)
        phase.stop()
        rows = [Row(f"publish {kind}", depth, phase.seconds, {"published": sent, **_phase(phase)})]
        cconn, cch = await _open(broker)
        conns.append(cconn)
        await cch.qos(s.prefetch)
        await asyncio.sleep(0.5)  # let the broker settle after the fill
        phase = Meter(broker)
        phase.start()
        tag = await cch.consume(q, ack_every=s.ack_every)
        await _wait_until(lambda: cch.delivered >= depth, [cconn], time.monotonic() + s.seconds + s.grace)
        phase.stop()
        cch.ack_pending()
        await cch.cancel(tag)
        extra = {"prefilled": depth, **_phase(phase)}
        return [*rows, Row(f"consume {kind}", cch.delivered, phase.seconds, extra)]
    finally:
        await _close(*conns)
        await _cleanup(broker, [q])


async def wl_priority(broker: Broker, s: Settings, meter: Meter) -> list[Row]:
    """Priority queue against classic queue: the same messages (``body_size`` bytes, each
    with a random priority 0-9) are published to a classic queue with no consumer, then
    drained by one consumer (prefetch ``prefetch``, acks every ``ack_every``); then the
    same on a queue declared with ``x-max-priority: 10``. Four rows, each with the CPU of
    its own phase: ``publish classic``, ``consume classic``, ``publish priority``,
    ``consume priority``."""
    rows = await _priority_case(broker, s, "classic", {})
    rows += await _priority_case(broker, s, "priority", {"x-max-priority": PRIORITY_LEVELS})
    meter.start()  # the rows carry their own windows
    meter.stop()
    return rows


# Opt-in (not in "all"): long-running, memory and disk heavy.
EXTRA_WORKLOADS: dict[str, Workload] = {
    "backlog": wl_backlog,
    "backlog-default": wl_backlog_default,
    "recovery": wl_recovery,
    "delayed-redeliveries-dlx": wl_delayed_redeliveries_dlx,
    "priority": wl_priority,
    "idle-queues": wl_idle_queues,
    "idle-connections": wl_idle_connections,
}

ALIASES: dict[str, list[str]] = {
    "a": ["publish", "publish-pika"], "b": ["consume"], "c": ["pubsub", "latency"], "d": ["fanout"],
    "e": ["confirm-100b", "confirm-4k"], "confirm": ["confirm-100b", "confirm-4k"],
    "f": ["nack-heavy", "delayed-redeliveries"], "redelivery": ["nack-heavy", "delayed-redeliveries"],
    "g": ["l1-16b", "l1-1k"], "l1": ["l1-16b", "l1-1k"],
    "memory": ["idle-queues", "idle-connections"],
    "all": list(WORKLOADS),
}
WORKLOADS.update(EXTRA_WORKLOADS)  # selectable by name; "all" stays the list above
