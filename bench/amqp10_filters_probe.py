"""Probe: AMQP 1.0 source filters, what they deliver and the broker CPU they cost.

A leveret subprocess (``--src`` another tree's src/ for a before/after comparison); for
each case, ``--messages`` messages are published over AMQP 0-9-1 (headers ``n`` and
``colour``, half ``red``; on the stream case ``x-stream-filter-value`` too), then a
python-qpid-proton receiver (credit 500) attaches with the case's filter and takes
what comes until the last message (which every filter matches) arrives. Printed per
case: whether the filter was echoed, the messages delivered (half + 1 when the filter
is applied, all of them when it is ignored) and the broker's CPU (``/proc``, user +
system) per message examined, in µs. Bounded: a few seconds per case.

    python bench/amqp10_filters_probe.py [--messages 4000] [--src /work/main/src]
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import pika
from proton import Described, symbol
from proton.reactor import Filter, Selector
from proton.utils import BlockingConnection

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from brokers import Leveret


def _described(name: str, value: Any) -> Described:
    return Described(symbol(name), value)


CASES: list[tuple[str, bool, Any]] = [
    ("no filter", False, None),
    ("JMS selector", False, Selector("colour = 'red' OR last = TRUE")),
    (
        "application-properties filter",
        False,
        Filter({symbol("a"): _described("amqp:application-properties-filter", {"colour": "red"})}),
    ),
    (
        "SQL filter",
        False,
        Filter({symbol("sql-filter"): _described("amqp:sql-filter", "colour = 'red' OR last = TRUE")}),
    ),
    (
        "stream: first",
        True,
        Filter({symbol("rabbitmq:stream-offset-spec"): _described("rabbitmq:stream-offset-spec", "first")}),
    ),
    (
        "stream: first + filter values",
        True,
        Filter(
            {
                symbol("rabbitmq:stream-offset-spec"): _described("rabbitmq:stream-offset-spec", "first"),
                symbol("rabbitmq:stream-filter"): _described("rabbitmq:stream-filter", ["red"]),
            }
        ),
    ),
]


def run_case(broker: Leveret, index: int, label: str, stream: bool, options: Any, count: int) -> str:
    name = f"probe-{index}"
    connection = pika.BlockingConnection(pika.ConnectionParameters(broker.host, broker.port))
    channel = connection.channel()
    channel.queue_declare(name, durable=True, arguments={"x-queue-type": "stream"} if stream else None)
    for i in range(count):
        colour = "red" if i % 2 else "blue"
        last = i == count - 1
        headers = {"n": i, "colour": "red" if last else colour, "last": last}
        if stream:
            headers["x-stream-filter-value"] = headers["colour"]
        channel.basic_publish("", name, b"x" * 100, pika.BasicProperties(headers=headers))
    channel.queue_declare(name, passive=True)  # all are in
    amqp10 = BlockingConnection(f"amqp://guest:guest@{broker.host}:{broker.port}")
    before = broker.cpu_seconds()
    try:
        receiver = amqp10.create_receiver(f"/queues/{name}", credit=500, options=options)
    except Exception as exc:  # refused (a stream on a tree without stream support)
        amqp10.close()
        connection.close()
        return f"{label:32} refused: {str(exc)[:60]}"
    data = receiver.link.remote_source.filter
    data.rewind()
    echoed = bool(data.next() and data.get_object())
    delivered = 0
    while True:
        message = receiver.receive(timeout=20)
        receiver.accept()
        delivered += 1
        if message.properties and message.properties.get("last"):
            break
    cpu = broker.cpu_seconds() - before
    receiver.close()
    amqp10.close()
    connection.close()
    return (
        f"{label:32} echoed={echoed!s:5} delivered={delivered:6} broker CPU {cpu * 1e6 / count:7.1f} µs/msg"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=4000)
    parser.add_argument("--src", help="the src/ of the leveret tree to run (default: this one)")
    args = parser.parse_args()
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
    with Leveret(src=os.path.abspath(args.src or here)) as broker:
        print(f"leveret from {args.src or here}, {args.messages} messages per case")
        for index, (label, stream, options) in enumerate(CASES):
            print(run_case(broker, index, label, stream, options, args.messages), flush=True)


if __name__ == "__main__":
    main()
