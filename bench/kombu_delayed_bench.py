"""kombu's native delayed delivery (what celery >= 5.5 uses with quorum queues) at 10,000
ETA tasks spread over 60 s, on leveret and on RabbitMQ 3.10 in the same run (issue 30).

Usage::

    PYTHONPATH=$PWD/src:$PWD/bench python bench/kombu_delayed_bench.py
    PYTHONPATH=$PWD/src:$PWD/bench python bench/kombu_delayed_bench.py --messages 2000 --spread 10
    ... --leveret-src /work/main/src      # the broker from another tree (before/after)

For each broker (a private one, started and stopped here, with a data directory: the
quorum queues are written to disk):

* the topology is declared by kombu's own helpers, as a celery worker does at start-up
  (``declare_native_delayed_delivery_exchanges_and_queues(connection, "quorum")``: 28
  topic exchanges ``celery_delayed_N``, each with a quorum queue of ``x-message-ttl``
  2^N s, ``x-overflow: reject-publish``, dead-lettered to level N-1;
  ``bind_queue_to_native_delayed_delivery_exchange``: the task queue, a quorum queue
  on the topic exchange ``bench``, bound with ``bench.run`` and ``#.bench.run``);
* ``--messages`` tasks (default 10,000) are published as celery's
  ``apply_async(countdown=d)`` publishes them: to ``celery_delayed_27`` with the routing
  key ``calculate_routing_key(d, "bench.run")`` (the 28 bits of d, then the key: 30
  words), persistent, no publisher confirms (celery's default), d whole seconds drawn
  uniformly from 1 to ``--spread`` (the same seeded draw for both brokers); the body is
  the publisher's ``time.monotonic_ns()`` just before the publish, d and the index;
* a consumer in its own process (kombu, prefetch 1000, acks every message) records each
  task's lateness: arrival (``time.monotonic_ns()``) minus (publish time + d). One host,
  so CLOCK_MONOTONIC is shared by the processes;
* a probe in its own process (another client, not using the delayed topology) publishes
  to a classic queue and consumes it, one message every 20 ms, and records the round
  trips: if deep topic keys or the TTL timers stalled the broker, they would show here.

Reported per broker: publish seconds, tasks delivered / not delivered by the deadline
(the last due time + ``--grace``; ``waiting``: of those, how many are still in the
delayed queues then) / duplicated, lateness
p50/p99/max (ms), broker CPU seconds from the first publish to the last delivery (the
process tree's utime + stime from /proc: leveret's Python process, RabbitMQ's beam.smp),
and the probe's round-trip p50/p99 (ms); then leveret ÷ RabbitMQ for CPU and lateness
p99. Everything is bounded (``--grace`` seconds after the last due time) and the brokers
are stopped on any exit.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import random
import struct
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import kombu  # noqa: E402
from brokers import Broker, Leveret, RabbitMQ, rabbitmq_installed  # noqa: E402
from kombu.transport.native_delayed_delivery import (  # noqa: E402
    bind_queue_to_native_delayed_delivery_exchange,
    calculate_routing_key,
    declare_native_delayed_delivery_exchanges_and_queues,
    level_name,
)

BODY = struct.Struct(">QII")  # publish monotonic_ns, countdown s, index
EXCHANGE = "bench"
ROUTING_KEY = "bench.run"
QUEUE = "bench.tasks"
PROBE_QUEUE = "bench.probe"
PROBE_EVERY = 0.02  # seconds between probe round trips


@dataclass
class Result:
    broker: str
    messages: int
    publish_s: float = 0.0
    delivered: int = 0
    undelivered: int = 0  # not delivered by the deadline (due time + grace)
    waiting: int = 0  # of those, still in the celery_delayed_N queues at the deadline
    duplicates: int = 0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    max_ms: float = 0.0
    cpu_s: float = 0.0
    probe_p50_ms: float = 0.0
    probe_p99_ms: float = 0.0
    probe_max_ms: float = 0.0
    errors: list[str] = field(default_factory=list)


def url(broker: Broker) -> str:
    return f"amqp://guest:guest@{broker.host}:{broker.port}//"


def task_queue() -> kombu.Queue:
    return kombu.Queue(
        QUEUE,
        kombu.Exchange(EXCHANGE, type="topic", durable=True),
        routing_key=ROUTING_KEY,
        queue_arguments={"x-queue-type": "quorum"},
        durable=True,
    )


def declare(broker_url: str) -> None:
    """The worker's start-up: the delayed topology, then the task queue bound to it."""
    with kombu.Connection(broker_url) as connection:
        declare_native_delayed_delivery_exchanges_and_queues(connection, "quorum")
        queue = task_queue()
        queue(connection.default_channel).declare()
        bind_queue_to_native_delayed_delivery_exchange(connection, queue)


def delayed_backlog(broker_url: str) -> int:
    """Messages in the 28 delayed queues now (passive declares)."""
    with kombu.Connection(broker_url) as connection:
        channel = connection.channel()
        return sum(
            channel.queue_declare(level_name(level), passive=True).message_count for level in range(28)
        )


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# ------------------------------------------------------------------ the consumer
def consume(broker_url: str, n: int, deadline_mono: float, ready, out) -> None:
    """Consume the task queue until ``n`` tasks arrived or ``deadline_mono``; sends
    (lateness ns list, duplicates, last arrival ns) through ``out``."""
    seen = bytearray(n)
    lateness: list[int] = []
    duplicates = 0
    last = 0

    def on_message(message) -> None:
        nonlocal duplicates, last
        now = time.monotonic_ns()
        sent, countdown, index = BODY.unpack(message.body)
        if seen[index]:
            duplicates += 1
        else:
            seen[index] = 1
            lateness.append(now - sent - countdown * 1_000_000_000)
        last = now
        message.ack()

    with (
        kombu.Connection(broker_url) as connection,
        kombu.Consumer(connection, [task_queue()], on_message=on_message, prefetch_count=1000),
    ):
        ready.set()
        while len(lateness) < n and time.monotonic() < deadline_mono:
            try:
                connection.drain_events(timeout=0.5)
            except TimeoutError:
                pass
    out.send((lateness, duplicates, last))


def probe(broker_url: str, stop, out) -> None:
    """Round trips of one message at a time through a classic queue, every 20 ms."""
    rtts: list[float] = []
    got: list[int] = []
    with kombu.Connection(broker_url) as connection:
        queue = kombu.Queue(PROBE_QUEUE, exclusive=True)
        with kombu.Consumer(connection, [queue], on_message=lambda m: (got.append(1), m.ack())):
            producer = connection.Producer()
            while not stop.is_set():
                t0 = time.monotonic()
                producer.publish(b"p", routing_key=PROBE_QUEUE)
                while not got:
                    try:
                        connection.drain_events(timeout=5)
                    except TimeoutError:
                        break
                rtts.append((time.monotonic() - t0) * 1000.0)
                got.clear()
                time.sleep(PROBE_EVERY)
    out.send(rtts)


# ------------------------------------------------------------------ one broker
def run_broker(broker: Broker, countdowns: list[int], grace: float) -> Result:
    n = len(countdowns)
    result = Result(broker.name, n)
    broker_url = url(broker)
    declare(broker_url)
    ctx = mp.get_context("spawn")
    ready, stop = ctx.Event(), ctx.Event()
    consumer_end, consumer_out = ctx.Pipe(duplex=False)
    probe_end, probe_out = ctx.Pipe(duplex=False)
    deadline = time.monotonic() + max(countdowns) + grace + 30.0
    consumer = ctx.Process(target=consume, args=(broker_url, n, deadline, ready, consumer_out))
    prober = ctx.Process(target=probe, args=(broker_url, stop, probe_out))
    consumer.start()
    prober.start()
    try:
        if not ready.wait(30):
            raise RuntimeError("the consumer did not start")
        cpu0 = broker.cpu_seconds()
        t0 = time.monotonic()
        with kombu.Connection(broker_url) as connection:
            producer = connection.Producer()
            first_level = kombu.Exchange(level_name(27), type="topic")
            pack, now = BODY.pack, time.monotonic_ns
            for index, countdown in enumerate(countdowns):
                producer.publish(
                    pack(now(), countdown, index),
                    exchange=first_level,
                    routing_key=calculate_routing_key(countdown, ROUTING_KEY),
                    delivery_mode=2,
                    content_type="application/octet-stream",
                    content_encoding="binary",
                )
        result.publish_s = time.monotonic() - t0
        lateness, result.duplicates, _last = consumer_end.recv()
        result.cpu_s = broker.cpu_seconds() - cpu0
        result.waiting = delayed_backlog(broker_url)
        consumer.join(10)
    finally:
        stop.set()
        if probe_end.poll(15):
            rtts = probe_end.recv()
            result.probe_p50_ms = percentile(rtts, 0.50)
            result.probe_p99_ms = percentile(rtts, 0.99)
            result.probe_max_ms = max(rtts, default=float("nan"))
        for process in (consumer, prober):
            process.join(5)
            if process.is_alive():
                process.kill()
    ms = [x / 1e6 for x in lateness]
    result.delivered = len(ms)
    result.undelivered = n - len(ms)
    result.p50_ms, result.p99_ms = percentile(ms, 0.50), percentile(ms, 0.99)
    result.max_ms = max(ms, default=float("nan"))
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--spread", type=int, default=60, help="countdowns are 1..SPREAD whole seconds")
    parser.add_argument("--grace", type=float, default=60.0, help="seconds after the last due time")
    parser.add_argument("--brokers", default="leveret,rabbitmq")
    parser.add_argument("--leveret-src", default=None, help="the broker from another tree's src/")
    parser.add_argument("--seed", type=int, default=30)
    args = parser.parse_args()
    rnd = random.Random(args.seed)
    countdowns = [rnd.randint(1, args.spread) for _ in range(args.messages)]
    results: list[Result] = []
    for name in args.brokers.split(","):
        if name == "rabbitmq" and not rabbitmq_installed():
            print("rabbitmq: not installed, skipped", file=sys.stderr)
            continue
        broker: Broker = Leveret(src=args.leveret_src) if name == "leveret" else RabbitMQ()
        print(f"{name}: starting", file=sys.stderr, flush=True)
        with broker:
            try:
                results.append(run_broker(broker, countdowns, args.grace))
            except Exception as error:  # report it beside the other broker's figures
                traceback.print_exc()
                results.append(Result(name, args.messages, errors=[repr(error)]))
        print(f"{name}: {asdict(results[-1])}", file=sys.stderr, flush=True)
    print(
        f"\nkombu native delayed delivery: {args.messages} tasks, countdowns 1..{args.spread} s, "
        "quorum queues"
    )
    print(
        f"{'broker':10s} {'publish s':>9s} {'delivered':>9s} {'undeliv':>7s} {'waiting':>7s} {'dup':>4s} "
        f"{'p50 ms':>8s} {'p99 ms':>8s} {'max ms':>8s} {'CPU s':>7s} {'probe p50':>9s} {'probe p99':>9s}"
    )
    for r in results:
        print(
            f"{r.broker:10s} {r.publish_s:9.2f} {r.delivered:9d} {r.undelivered:7d} {r.waiting:7d} "
            f"{r.duplicates:4d} {r.p50_ms:8.1f} {r.p99_ms:8.1f} {r.max_ms:8.1f} {r.cpu_s:7.2f} "
            f"{r.probe_p50_ms:9.2f} "
            f"{r.probe_p99_ms:9.2f}" + (f"  errors: {r.errors}" if r.errors else "")
        )
    by_name = {r.broker: r for r in results if not r.errors}
    if "leveret" in by_name and "rabbitmq" in by_name:
        lv, rq = by_name["leveret"], by_name["rabbitmq"]
        print(
            f"leveret / RabbitMQ: CPU {lv.cpu_s / rq.cpu_s:.3g}x, lateness p99 {lv.p99_ms / rq.p99_ms:.3g}x"
        )
    return 1 if any(r.errors or r.undelivered for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
