"""Memory per idle queue and per idle AMQP connection, beside RabbitMQ.

``idle-queues``: ``idle_queues`` (100,000) non-durable queues are declared with
``nowait`` in pipelined batches on one channel (a round trip per batch keeps the
broker's socket buffer bounded), nothing is published; the figure is (broker RSS
after − before) ÷ queues. ``idle-connections``: ``idle_connections`` (10,000) AMQP
connections are opened from this process (asyncio: many sockets, one process, so
the client costs little), each with one channel, and left idle (heartbeats off);
the figure is (RSS after − before) ÷ connections.

Each restarts the broker (same data) before, so memory that earlier workloads freed
but the process kept does not absorb the cost, and after, so later workloads see the
broker's usual RSS (and the idle queues and connections are gone). RSS is the broker's process
tree (leveret: all of its processes; RabbitMQ: the ``beam.smp`` process and its port
helpers, whose memory does not change here), read after ``SETTLE_S`` seconds of
quiet before and after. Both need file descriptors:
``run.py`` raises its soft ``RLIMIT_NOFILE`` to the hard limit before it starts the
brokers, which inherit it (RabbitMQ's own ceiling, ``ERL_MAX_PORTS``, is 65536 in
its scripts).
"""

from __future__ import annotations

import asyncio
import time

from brokers import Broker
from loadgen import AMQPError, Channel, Connection
from pamqp import commands
from workloads import Meter, Row, Settings, _close, _name, _open

from leveret.amqp.frames import encode_method

MEMORY_SECTION = "memory"  # Row.extra["section"]: these rows have their own table
SETTLE_S = 3.0  # quiet seconds before each RSS reading (GC, Erlang's memory carriers)
DECLARE_BATCH = 1000  # nowait declares written before a round trip
CONNECT_CONCURRENCY = 100  # handshakes in flight at once


async def _restart(broker: Broker) -> None:
    """Stop the broker cleanly and start it again on the same data: a fresh process,
    so memory that earlier workloads freed (but the process kept) does not absorb
    what the idle resources cost."""
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, broker.shutdown)
    await loop.run_in_executor(None, broker.launch)


async def _settled_rss(broker: Broker) -> int:
    await asyncio.sleep(SETTLE_S)
    return broker.rss_bytes()


def _memory_row(label: str, n: int, seconds: float, rss0: int, rss1: int, what: str) -> Row:
    mb = 2**20
    return Row(label, n, seconds, {
        "section": MEMORY_SECTION, what: n,
        "rss_before_mb": round(rss0 / mb, 1), "rss_after_mb": round(rss1 / mb, 1),
        "rss_bytes_per_item": round((rss1 - rss0) / n, 1) if n else None,
    })


async def _pipelined(conn: Connection, frames: list[bytes], ch: Channel) -> None:
    """Write ``frames`` (nowait methods on ``ch``) in batches of ``DECLARE_BATCH``, with a
    round trip on ``ch`` after each (a passive declare of ``amq.direct``: its reply comes
    after the broker handled the batch), so the broker's backlog stays bounded."""
    for start in range(0, len(frames), DECLARE_BATCH):
        conn.write(b"".join(frames[start:start + DECLARE_BATCH]))
        await ch.exchange_declare_passive("amq.direct")


async def wl_idle_queues(broker: Broker, s: Settings, meter: Meter) -> list[Row]:
    """RSS per idle queue: ``idle_queues`` empty non-durable queues (row: queues ÷ time to
    declare them all; ``rss_bytes_per_item``). The restart at the end takes them away."""
    prefix = _name("idle")
    names = [f"{prefix}-{i}" for i in range(s.idle_queues)]
    await _restart(broker)
    conn, ch = await _open(broker)
    try:
        rss0 = await _settled_rss(broker)
        frames = [encode_method(ch.id, commands.Queue.Declare(queue=q, nowait=True)) for q in names]
        meter.start()
        t0 = time.perf_counter()
        last = names[-1]
        await _pipelined(conn, frames, ch)
        await ch.queue_declare(last, passive=True)  # the last one exists: all were declared
        seconds = time.perf_counter() - t0
        meter.stop()
        rss1 = await _settled_rss(broker)
        return [_memory_row("idle queues", len(names), seconds, rss0, rss1, "queues")]
    finally:
        await _close(conn)
        await _restart(broker)  # RSS of later workloads as without this one; the queues go too
        await _delete_left(broker, names)


async def _delete_left(broker: Broker, names: list[str]) -> None:
    """Delete ``names`` if they outlived the restart (neither broker keeps non-durable
    queues across one, but RabbitMQ deletes ~400 queues/s here: only if needed)."""
    conn, ch = await _open(broker)
    try:
        try:
            await ch.queue_declare(names[0], passive=True)
        except AMQPError:  # 404: gone
            return
        frames = [encode_method(ch.id, commands.Queue.Delete(queue=q, nowait=True)) for q in names]
        await _pipelined(conn, frames, ch)
    finally:
        await _close(conn)


async def _connect(broker: Broker, gate: asyncio.Semaphore) -> Connection:
    async with gate:
        conn = await Connection.open(broker.host, broker.port, timeout=60)
        await conn.channel()
        return conn


async def wl_idle_connections(broker: Broker, s: Settings, meter: Meter) -> list[Row]:
    """RSS per idle connection: ``idle_connections`` AMQP connections, one channel each
    (row: connections ÷ time to open them all; ``rss_bytes_per_item``)."""
    conns: list[Connection] = []
    gate = asyncio.Semaphore(CONNECT_CONCURRENCY)
    await _restart(broker)
    try:
        rss0 = await _settled_rss(broker)
        meter.start()
        t0 = time.perf_counter()
        tasks = [asyncio.ensure_future(_connect(broker, gate)) for _ in range(s.idle_connections)]
        try:
            for t in asyncio.as_completed(tasks):
                conns.append(await t)
        except BaseException:
            for t in tasks:
                t.cancel()
            conns.extend(t.result() for t in tasks if t.done() and not t.cancelled() and not t.exception())
            raise
        seconds = time.perf_counter() - t0
        meter.stop()
        rss1 = await _settled_rss(broker)
        return [_memory_row("idle connections", len(conns), seconds, rss0, rss1, "connections")]
    finally:
        for c in conns:
            c.abort()
        await _restart(broker)  # RabbitMQ takes 10+ s to tear them down; RSS as before
