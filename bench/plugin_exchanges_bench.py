"""Probe of the plugin exchange types (x-consistent-hash, x-random, x-modulus-hash):
what routing one message costs, beside a direct exchange.

    PYTHONPATH=src python bench/plugin_exchanges_bench.py [--src OTHER/src] [--messages N]

1. Core: microseconds of CPU per ``route()`` for each type, four queues bound (and a
   consistent-hash ring of 30,000 buckets), fresh routing keys so no cache answers.
2. End to end: a ``leveret server`` subprocess (``--src``: another tree's src/, e.g.
   /work/main/src for "before"), pika publishing N persistent-free messages with
   confirms to each exchange type; broker CPU (from /proc) per message. A type the tree
   does not have is reported as unsupported (503 unknown exchange type).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pika
from pika.exceptions import ConnectionClosedByBroker

sys.path.insert(0, str(Path(__file__).resolve().parent))
from brokers import Leveret


def core_route_us(messages: int) -> dict[str, float]:
    from leveret.core import BrokerCore, Message
    from leveret.core.clock import ManualClock
    from leveret.core.message import Properties

    vhost = BrokerCore(clock=ManualClock()).vhosts["/"]
    for i in range(4):
        vhost.declare_queue(f"q{i}", None)

    def build(routing_key: str, headers: dict | None = None) -> Message:
        return Message.build("x", routing_key, b"", Properties(headers=headers))

    # label (its first word the exchange type): (arguments, binding keys of q0-q3, message i)
    cases = {
        "direct": ({}, ["k0", "k1", "k2", "k3"], lambda i: build(f"k{i % 4}")),
        "x-consistent-hash (routing key)": ({}, ["1", "2", "3", "4"], lambda i: build(f"order-{i}")),
        "x-consistent-hash (30,000 buckets)": (
            {},
            ["5000", "10000", "7500", "7500"],
            lambda i: build(f"order-{i}"),
        ),
        "x-consistent-hash (hash-header)": (
            {"hash-header": "user"},
            ["1", "2", "3", "4"],
            lambda i: build("", {"user": f"u{i}"}),
        ),
        "x-random": ({}, [""] * 4, lambda i: build(f"k{i}")),
        "x-modulus-hash": ({}, [""] * 4, lambda i: build(f"order-{i}")),
    }
    results = {}
    for label, (arguments, keys, make) in cases.items():
        name = label
        vhost.declare_exchange(name, label.split()[0], arguments=arguments)
        for i, key in enumerate(keys):
            vhost.bind(name, vhost.queues[f"q{i}"], key)
        exchange = vhost.exchanges[name]
        batch = [make(i) for i in range(messages)]
        started = time.process_time()
        for message in batch:
            exchange.route(message)
        results[label] = (time.process_time() - started) / messages * 1e6
    return results


def end_to_end(src: str | None, messages: int) -> dict[str, float | None]:
    """Broker CPU microseconds per confirmed publish, per exchange type (None: the tree
    has no such type)."""
    results: dict[str, float | None] = {}
    with Leveret(src=src) as broker:
        for kind, keys in (
            ("direct", ["k"] * 4),
            ("x-consistent-hash", ["1", "2", "3", "4"]),
            ("x-random", [""] * 4),
            ("x-modulus-hash", [""] * 4),
        ):
            connection = pika.BlockingConnection(pika.ConnectionParameters(broker.host, broker.port))
            channel = connection.channel()
            try:
                channel.exchange_declare(f"bench-{kind}", kind)
            except ConnectionClosedByBroker as closed:
                results[kind] = None
                print(f"  {kind}: unsupported ({closed.reply_code} {closed.reply_text})")
                continue
            for i, key in enumerate(keys):
                channel.queue_declare(f"bench-{kind}-{i}")
                channel.queue_bind(f"bench-{kind}-{i}", f"bench-{kind}", key)
            channel.confirm_delivery()
            before = broker.cpu_seconds()
            for i in range(messages):
                channel.basic_publish(f"bench-{kind}", "k" if kind == "direct" else f"order-{i}", b"x" * 100)
            results[kind] = (broker.cpu_seconds() - before) / messages * 1e6
            for i in range(len(keys)):
                channel.queue_delete(f"bench-{kind}-{i}")
            connection.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", default=None, help="another leveret tree's src/ for the broker")
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--no-core", action="store_true", help="skip the in-process route() timing")
    args = parser.parse_args()
    if not args.no_core:
        print("route() CPU per message, us (4 queues bound):")
        for label, us in core_route_us(20000).items():
            print(f"  {label:40s} {us:7.2f}")
    print(f"broker CPU per confirmed publish, us ({args.messages} messages, tree {args.src or 'this one'}):")
    for kind, us in end_to_end(args.src, args.messages).items():
        if us is not None:
            print(f"  {kind:40s} {us:7.1f}")


if __name__ == "__main__":
    main()
