"""Probe of RabbitMQ 4's management node over AMQP 1.0 on leveret: broker CPU per
management request and requests per second, with rabbitmq-amqp-python-client (its
``Management``: one request, then its response, at a time), beside the same topology
operations as AMQP 0-9-1 channel methods with pika on the same broker.

One round is six operations: declare a queue, declare an exchange, bind, queue info
(AMQP 0-9-1: a passive declare), unbind, delete the queue (and the exchange: seven
for 0-9-1's, which has no combined round; counted per operation). ``--rounds`` rounds
(default 300) per protocol, after 20 rounds of warm-up; the broker runs as a subprocess
(``bench/brokers.py``'s Leveret), its CPU read from ``/proc`` (user + system).

    PYTHONPATH=src python bench/amqp10_management_probe.py [--rounds 300] [--src DIR] [--transient]

``--src`` runs another tree's broker (``/work/main/src``: the "before" figure, where an
older tree refuses the management link). Wall-clock rates move with the machine's load;
CPU per request much less.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from brokers import Leveret

WARM_UP = 20


DURABLE = True


def amqp10_round(management, index: int) -> int:
    from rabbitmq_amqp_python_client import (
        ClassicQueueSpecification,
        ExchangeSpecification,
        ExchangeToQueueBindingSpecification,
    )

    queue, exchange = f"probe-q-{index}", f"probe-x-{index}"
    management.declare_queue(ClassicQueueSpecification(name=queue, is_durable=DURABLE))
    management.declare_exchange(ExchangeSpecification(name=exchange, is_durable=DURABLE))
    path = management.bind(
        ExchangeToQueueBindingSpecification(
            source_exchange=exchange, destination_queue=queue, binding_key="k"
        )
    )
    management.queue_info(queue)
    management.unbind(path)
    management.delete_queue(queue)
    management.delete_exchange(exchange)
    return 7


def amqp091_round(channel, index: int) -> int:
    queue, exchange = f"probe-q-{index}", f"probe-x-{index}"
    channel.queue_declare(queue, durable=DURABLE)
    channel.exchange_declare(exchange, "direct", durable=DURABLE)
    channel.queue_bind(queue, exchange, "k")
    channel.queue_declare(queue, passive=True)
    channel.queue_unbind(queue, exchange, "k")
    channel.queue_delete(queue)
    channel.exchange_delete(exchange)
    return 7


def measure(broker: Leveret, rounds: int, do_round: Callable[[int], int]) -> tuple[float, float]:
    """(broker CPU µs per operation, operations per second)."""
    for index in range(WARM_UP):
        do_round(index)
    cpu0, t0 = broker.cpu_seconds(), time.perf_counter()
    operations = sum(do_round(WARM_UP + index) for index in range(rounds))
    cpu, wall = broker.cpu_seconds() - cpu0, time.perf_counter() - t0
    return cpu / operations * 1e6, operations / wall


def run_amqp10(broker: Leveret, rounds: int) -> str:
    from rabbitmq_amqp_python_client import Environment

    environment = Environment(f"amqp://guest:guest@{broker.host}:{broker.port}/")
    try:
        connection = environment.connection()
        connection.dial()
        management = connection.management()
    except BaseException as exc:  # the client's own exceptions are BaseExceptions
        environment.close()
        return f"refused: {type(exc).__name__}: {str(exc)[:160]}"
    try:
        cpu, rate = measure(broker, rounds, lambda index: amqp10_round(management, index))
    except BaseException as exc:
        return f"failed: {type(exc).__name__}: {str(exc)[:160]}"
    finally:
        environment.close()
    return f"{cpu:8.1f} µs CPU/request {rate:8.0f} requests/s"


def run_amqp091(broker: Leveret, rounds: int) -> str:
    import pika

    connection = pika.BlockingConnection(pika.ConnectionParameters(broker.host, broker.port))
    try:
        channel = connection.channel()
        cpu, rate = measure(broker, rounds, lambda index: amqp091_round(channel, index))
    finally:
        connection.close()
    return f"{cpu:8.1f} µs CPU/method  {rate:8.0f} methods/s"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--src", help="another leveret tree's src/ for the broker (a 'before' figure)")
    parser.add_argument("--transient", action="store_true", help="non-durable queues and exchanges")
    args = parser.parse_args()
    global DURABLE
    DURABLE = not args.transient
    with Leveret(src=args.src) as broker:
        kind = "transient" if args.transient else "durable"
        print(f"leveret ({args.src or 'this tree'}), {args.rounds} rounds of 7 operations, {kind}")
        print(f"  AMQP 1.0 management node (rabbitmq-amqp-python-client): {run_amqp10(broker, args.rounds)}")
        print(
            f"  AMQP 0-9-1 channel methods (pika):                        {run_amqp091(broker, args.rounds)}"
        )


if __name__ == "__main__":
    main()
