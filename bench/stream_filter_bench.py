"""Bench: stream filtering on a big stream — the time and broker CPU to deliver the few
matching messages to an ``x-stream-filter`` consumer reading from ``first``.

1. Build: an in-process leveret (this tree, or ``--build-src``) writes a stream of
   ``--messages`` messages (default 10 million) into a data directory through its core
   (``StreamQueue.enqueue``, the path a publish takes after routing, so the store rows
   and the chunk index are what a publisher would leave), in batches that each wait
   for the store; publishing 10 million over AMQP would take far longer than the bench
   should. ``--rare`` of them (default 10), spread evenly, carry the filter value
   ``rare``; of the others half carry one of 8 common values, half none. Every message
   with a value also has the header ``sfv`` (the same value), for the selector case.
2. Measure: a leveret subprocess (``--src``: another tree's src/ for a before/after
   comparison, e.g. /work/main/src) starts on that data directory; each case is a pika
   consumer (prefetch 100) from ``first``; printed: wall seconds until it had what the
   case waits for, and the broker's CPU seconds (``/proc``, user + system) meanwhile.

Cases: ``x-stream-filter: rare`` (waits for the ``--rare`` matches); ``x-selector:
sfv = 'rare'`` (the broker-side filter leveret had before: it decodes every message;
bounded by ``--selector-timeout`` s, then extrapolated from the offsets it passed);
no filter with ``x-stream-offset-end`` (``--scan`` messages, extrapolated to the whole
stream: what a client filtering on its side would pay). RabbitMQ 3.10 (installed here)
has no stream filtering (3.13+), so it is not run.

    python bench/stream_filter_bench.py [--messages 10000000] [--src /work/main/src]
                                        [--data DIR (reuse a built stream)]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import threading
import time

import pika
from pamqp import commands, header

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from brokers import Leveret

STREAM = "big"
BATCH = 20_000  # messages per call on the broker loop (its call() waits 10 s at most)


def _header(value: str | None, size: int) -> bytes:
    headers = None if value is None else {"x-stream-filter-value": value, "sfv": value}
    return header.ContentHeader(
        0, size, commands.Basic.Properties(headers=headers, delivery_mode=2)
    ).marshal()


def build(data: str, messages: int, rare: int) -> float:
    """Write the stream into ``data``; returns the seconds it took."""
    from leveret import BlockingBroker
    from leveret.protocol.amqp.message import from_publish

    body = b"x" * 100
    headers = [_header(None, len(body))] + [_header(f"v{i}", len(body)) for i in range(8)]
    rare_header = _header("rare", len(body))
    step = messages // rare
    rare_at = {step // 2 + i * step for i in range(rare)}
    started = time.monotonic()
    with BlockingBroker(amqp_port=0, data_dir=data) as broker:
        conn = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
        conn.channel().queue_declare(STREAM, durable=True, arguments={"x-queue-type": "stream"})
        conn.close()

        def fill(first: int, count: int, done: threading.Event) -> None:
            queue = broker.core.vhosts["/"].queues[STREAM]
            for offset in range(first, first + count):
                if offset in rare_at:
                    head = rare_header
                else:
                    head = headers[0] if offset % 2 else headers[1 + (offset // 2) % 8]
                queue.enqueue(from_publish("", STREAM, head, body))
            queue.store.when_durable(lambda ok: done.set())

        for first in range(0, messages, BATCH):
            done = threading.Event()
            broker.call(fill, first, min(BATCH, messages - first), done)
            done.wait(300)
            if (first + BATCH) % 1_000_000 == 0:
                print(f"  built {first + BATCH:,} in {time.monotonic() - started:.0f} s", flush=True)
    return time.monotonic() - started


def index_walk(messages: int, rare: int) -> None:
    """The chunk index alone, in this process, at full size: the CPU per appended
    message of reading its filter value and indexing it (what every publish to a
    stream now pays), and of a filtered consumer's walk over the whole index to the
    ``rare`` matches (what the broker spends skipping, without the store reads)."""
    from leveret.core.queues.stream_index import ChunkIndex
    from leveret.core.stream_filter import StreamFilter, filter_value
    from leveret.protocol.amqp.message import from_publish

    body = b"x" * 100
    plain = from_publish("", STREAM, _header(None, len(body)), body)
    tagged = from_publish("", STREAM, _header("v1", len(body)), body)
    reads = []
    for message in (plain, tagged):
        t0 = time.process_time()
        for _ in range(100_000):
            filter_value(message)
        reads.append((time.process_time() - t0) / 100_000)
    step = messages // rare
    rare_at = {step // 2 + i * step for i in range(rare)}
    values = [None, *(f"v{i}" for i in range(8))]
    index = ChunkIndex()
    add = index.add
    t0 = time.process_time()
    for offset in range(messages):
        add(offset, "rare" if offset in rare_at else values[0 if offset % 2 else 1 + (offset // 2) % 8])
    per_add = (time.process_time() - t0) / messages
    wanted = StreamFilter.of(["rare"])
    t0 = time.process_time()
    found, offset = [], 0
    while offset < messages:
        offset = index.next_candidate(offset, messages, wanted)
        if offset < messages:
            found.append(offset)
            offset += 1
    walk = time.process_time() - t0
    assert found == sorted(rare_at), found
    print(
        f"index of {messages:,} offsets ({len(index.chunks):,} chunks): filter value read "
        f"{reads[0] * 1e6:.2f} us (no header) / {reads[1] * 1e6:.2f} us (header) per message, "
        f"index add {per_add * 1e6:.2f} us/message; "
        f"walk to the {rare} matches: {walk * 1000:.1f} ms CPU"
    )


def consume(
    broker: Leveret, arguments: dict, want: int, timeout: float
) -> tuple[int, float, float, int, int]:
    """(deliveries, wall s, broker CPU s, last offset, deliveries not ``rare``) of one
    consumer from ``first`` until ``want`` deliveries, the broker's cancel or
    ``timeout`` s."""
    conn = pika.BlockingConnection(pika.ConnectionParameters(broker.host, broker.port, heartbeat=0))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=100)
    cpu0, t0 = broker.cpu_seconds(), time.monotonic()
    got, last, other = 0, -1, 0
    for method, props, _ in ch.consume(
        STREAM, arguments={"x-stream-offset": "first", **arguments}, inactivity_timeout=0.5
    ):
        if method is not None:
            got += 1
            last = props.headers["x-stream-offset"]
            other += props.headers.get("sfv") != b"rare" and props.headers.get("sfv") != "rare"
            ch.basic_ack(method.delivery_tag)
        if got >= want or time.monotonic() - t0 > timeout or (method is None and ch.consumer_tags == []):
            break
    wall, cpu = time.monotonic() - t0, broker.cpu_seconds() - cpu0
    conn.close()
    return got, wall, cpu, last, other


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=10_000_000)
    parser.add_argument("--rare", type=int, default=10)
    parser.add_argument("--scan", type=int, default=200_000, help="messages the no-filter case reads")
    parser.add_argument("--selector-timeout", type=float, default=60.0)
    parser.add_argument("--src", help="the broker's tree (src/), default this one")
    parser.add_argument("--index-only", type=int, metavar="N", help="only the chunk index at N offsets")
    parser.add_argument(
        "--data", help="a data directory, built there if empty, kept; default: a temporary one"
    )
    args = parser.parse_args()
    if args.index_only:
        index_walk(args.index_only, args.rare)
        return
    broker = Leveret(src=args.src, start_timeout=600)
    broker.prepare()
    if args.data:
        os.makedirs(args.data, exist_ok=True)
        os.rmdir(broker.data_dir())
        os.symlink(os.path.abspath(args.data), broker.data_dir())
    if not os.listdir(broker.data_dir()):
        print(f"building a {args.messages:,}-message stream ({args.rare} rare) ...", flush=True)
        print(f"built in {build(broker.data_dir(), args.messages, args.rare):.0f} s", flush=True)
    try:
        t0 = broker.launch(600)
        print(
            f"broker ({args.src or 'this tree'}) ready in {time.monotonic() - t0:.1f} s, "
            f"CPU so far {broker.cpu_seconds():.1f} s, RSS {broker.rss_bytes() / 2**20:.0f} MiB",
            flush=True,
        )
        got, wall, cpu, _, other = consume(broker, {"x-stream-filter": "rare"}, args.rare, 300)
        print(
            f"x-stream-filter rare:   {got} delivered ({other} not rare) in {wall:.3f} s, "
            f"broker CPU {cpu:.3f} s"
        )
        got, wall, cpu, last, other = consume(
            broker, {"x-selector": "sfv = 'rare'"}, args.rare, args.selector_timeout
        )
        note = ""
        if got < args.rare and last > 0:
            note = f" (timed out; at that pace the whole stream: ~{wall * args.messages / last:.0f} s)"
        print(
            f"x-selector sfv='rare':  {got} delivered, last offset {last:,}, in {wall:.1f} s{note}, "
            f"broker CPU {cpu:.1f} s"
        )
        got, wall, cpu, last, _ = consume(broker, {"x-stream-offset-end": args.scan}, args.scan, 600)
        scale = args.messages / max(got, 1)
        print(
            f"no filter, first {got:,}: {wall:.1f} s, broker CPU {cpu:.1f} s; the whole stream "
            f"at that rate: ~{wall * scale:.0f} s wall, ~{cpu * scale:.0f} s broker CPU"
        )
    finally:
        broker.shutdown()
        if args.data:
            os.unlink(broker.data_dir())
        shutil.rmtree(broker.workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
