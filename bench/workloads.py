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
import resource
import secrets
import statistics
import struct
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable

from loadgen import Channel, Connection, message_frames

from brokers import Broker


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
    latency_rate: int = 5000     # latency: fixed publish rate, msg/s
    confirm_window: int = 1000   # confirms: max unconfirmed publishes
    grace: float = 30.0          # extra time allowed to drain in-flight messages at the end


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
        except Exception:  # noqa: BLE001 - best-effort
            c.abort()


async def _cleanup(broker: Broker, queues: list[str], exchanges: list[str] = ()) -> None:
    """Delete benchmark queues/exchanges on a fresh connection (best effort)."""
    try:
        conn, ch = await _open(broker)
    except Exception:  # noqa: BLE001 - broker may be dead; nothing to clean then
        return
    try:
        for q in queues:
            try:
                await asyncio.wait_for(ch.queue_delete(q), 30)
            except Exception:  # noqa: BLE001
                ch = await conn.channel()
        for x in exchanges:
            try:
                await asyncio.wait_for(ch.exchange_delete(x), 30)
            except Exception:  # noqa: BLE001
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
        waits = [asyncio.ensure_future(c.wait_progress(min(left, 1.0))) for c in conns]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for w in waits:
            w.cancel()
        for c in conns:
            if c.closed:
                raise c.closed
    return True


async def _sync_depth(ch: Channel, q: str, target: int, deadline: float) -> int:
    """Poll a passive ``queue.declare`` until the queue holds ``target`` messages
    (publishes are asynchronous: the broker may still be enqueueing); returns the depth."""
    depth = (await ch.queue_declare(q, passive=True)).message_count
    while depth < target and time.monotonic() < deadline:
        await asyncio.sleep(0.001)
        depth = (await ch.queue_declare(q, passive=True)).message_count
    return depth


def _percentiles_ms(samples_ns: list[int]) -> dict:
    if not samples_ns:
        return {}
    s = sorted(samples_ns)

    def pct(p: float) -> float:
        return s[min(len(s) - 1, int(p / 100 * len(s)))] / 1e6

    return {"p50_ms": pct(50), "p99_ms": pct(99), "max_ms": s[-1] / 1e6,
            "mean_ms": statistics.fmean(s) / 1e6, "samples": len(s)}


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
        extra = {"published": sent, **_percentiles_ms(cch.latencies_ns)}
        return [Row("pubsub", cch.delivered, meter.seconds, extra)]
    finally:
        await _close(pconn, cconn)
        await _cleanup(broker, [q])


async def wl_latency(broker: Broker, s: Settings, meter: Meter) -> list[Row]:
    """(c') Like pubsub, but the producer publishes at a fixed rate (``latency_rate`` msg/s)
    for at most ``min(seconds, 10)`` s, so latency is measured below saturation.

    Every ~1 ms the producer writes the messages that are due, each stamped
    with ``time.monotonic_ns()``.
    """
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
        rate = s.latency_rate
        n = min(s.messages, int(rate * min(s.seconds, 10.0)))
        sent = 0
        meter.start()
        t0 = time.monotonic()
        while sent < n:
            due = min(n, int((time.monotonic() - t0) * rate)) - sent
            if due > 0:
                pconn.write((prefix + pack_ts(time.monotonic_ns()) + suffix) * due)
                sent += due
                await pconn.drain()
            await asyncio.sleep(0.001)
            if cconn.closed:
                raise cconn.closed
        await _wait_until(lambda: cch.delivered >= sent, [cconn], time.monotonic() + s.grace)
        meter.stop()
        cch.ack_pending()
        await cch.cancel(tag)
        extra = {"published": sent, "target_rate": rate, **_percentiles_ms(cch.latencies_ns)}
        return [Row(f"latency @{rate}/s", cch.delivered, meter.seconds, extra)]
    finally:
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
            allowed = min(s.fanout_backlog - (sent - min(c.delivered for c in chans)), s.messages - sent, s.batch)
            if allowed <= 0:
                await _wait_until(lambda: min(c.delivered for c in chans) > sent - s.fanout_backlog + s.batch,
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
        for cconn, cch, tag in consumers:
            cch.ack_pending()
            await cch.cancel(tag)
        return [
            Row("fanout publish", sent, t_pub, {"queues": n_queues}),
            Row("fanout deliver", delivered, meter.seconds, {"expected": sent * n_queues}),
        ]
    finally:
        await _close(pconn, *[c for c, _, _ in consumers])
        await _cleanup(broker, queues, [x])


async def _confirm(broker: Broker, s: Settings, meter: Meter, body_size: int, label: str) -> list[Row]:
    """(e) Persistent publishes with confirms to a durable queue, at most ``confirm_window`` unconfirmed."""
    q = _name("confirm")
    conn, ch = await _open(broker)
    try:
        await ch.queue_declare(q, durable=True)
        await ch.confirm_select()
        msg = ch.message("", q, b"x" * body_size, persistent=True)
        sent = 0
        meter.start()
        deadline = time.monotonic() + s.seconds
        while sent < s.messages and time.monotonic() < deadline:
            allowed = min(s.confirm_window - (sent - ch.confirmed), s.messages - sent)
            if allowed <= 0:
                await conn.wait_progress(1.0)
                if conn.closed:
                    raise conn.closed
                continue
            conn.write(msg * allowed)
            sent += allowed
            await conn.drain()
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


Workload = Callable[[Broker, Settings, Meter], Awaitable[list[Row]]]

WORKLOADS: dict[str, Workload] = {
    "publish": wl_publish,
    "consume": wl_consume,
    "pubsub": wl_pubsub,
    "latency": wl_latency,
    "fanout": wl_fanout,
    "confirm-100b": wl_confirm_100b,
    "confirm-4k": wl_confirm_4k,
}

ALIASES: dict[str, list[str]] = {
    "a": ["publish"], "b": ["consume"], "c": ["pubsub", "latency"], "d": ["fanout"],
    "e": ["confirm-100b", "confirm-4k"], "confirm": ["confirm-100b", "confirm-4k"],
    "all": list(WORKLOADS),
}
