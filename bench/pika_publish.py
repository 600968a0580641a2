"""Workload ``publish-pika``: transient publishes from pika's SelectConnection.

The batching load generator (loadgen.py) hands the broker whole batches of frames in
one write; a real application publishes one message at a time through a client
library. pika's SelectConnection is the common asynchronous Python client: it writes
each ``basic_publish`` (method, header and body frames) as the socket allows, so the
broker reads smaller chunks and spends more per message. This is the figure the core
issue's CPU target (µs of broker CPU per transient publish) is stated in.

pika runs in a worker thread with its own ioloop; the load generator's CPU (this
process, all threads) is measured by the Meter as usual.
"""

from __future__ import annotations

import asyncio
import time

import pika
from brokers import Broker

BURST = 200  # publishes per ioloop turn: small enough that pika's buffer stays short


def _flood(url: str, queue: str, body: bytes, count: int, deadline: float) -> int:
    """Publish ``body`` to ``queue`` up to ``count`` times or until ``deadline``
    (monotonic seconds) with a SelectConnection; returns how many were published."""
    sent = 0

    def on_open(connection: pika.SelectConnection) -> None:
        connection.channel(on_open_callback=lambda channel: burst(connection, channel))

    def burst(connection: pika.SelectConnection, channel) -> None:
        nonlocal sent
        for _ in range(min(BURST, count - sent)):
            channel.basic_publish("", queue, body)
        sent += min(BURST, count - sent)
        if sent >= count or time.monotonic() > deadline:
            connection.close()
        else:  # let the ioloop write what is buffered before the next burst
            connection.ioloop.call_later(0, lambda: burst(connection, channel))

    connection = pika.SelectConnection(
        pika.URLParameters(url), on_open_callback=on_open,
        on_close_callback=lambda conn, reason: conn.ioloop.stop())
    connection.ioloop.start()
    return sent


async def wl_publish_pika(broker: Broker, s, meter) -> list:
    """(a') Like ``publish`` (transient ``body_size``-byte messages to a queue with no
    consumer), published one at a time by pika's SelectConnection. Rate = messages /
    time until a passive ``queue.declare`` reports them all."""
    from workloads import Row, _cleanup, _close, _name, _open, _sync_depth

    q = _name("publish-pika")
    conn, ch = await _open(broker)
    try:
        await ch.queue_declare(q)
        url = f"amqp://guest:guest@{broker.host}:{broker.port}/%2F"
        # Below leveret's default x-max-in-memory-length (50,000): the publish path alone,
        # not paging to the store; pika is slower than either broker anyway.
        count = min(s.messages, 45_000)
        meter.start()
        sent = await asyncio.to_thread(_flood, url, q, b"x" * s.body_size, count,
                                       time.monotonic() + s.seconds)
        depth = await _sync_depth(ch, q, sent, time.monotonic() + s.grace)
        meter.stop()
        return [Row("publish (pika SelectConnection)", depth, meter.seconds, {"published": sent})]
    finally:
        await _close(conn)
        await _cleanup(broker, [q])
