"""Delivery counts before/after RabbitMQ 4.3's split (issue 30, item 4), against a
``leveret server`` subprocess with a data directory (LEVERET_PURE_PYTHON=1).

1. Returns vs the delivery limit: a queue with ``x-delivery-limit`` 3; the message is
   taken and given back with ``basic.nack`` (a return) up to 10 times: how many
   returns before it is dead-lettered.
2. Both counts through ``kill -9``: 2 nacks, 1 reject, kill -9, restart: the headers
   of the next delivery.
3. Cost: N persistent messages, each taken, rejected with requeue (a failed delivery:
   both counts written to the store), taken again and acked: broker CPU (``/proc``)
   per message.

    python bench/delivery_counts_probe.py                 # this tree
    python bench/delivery_counts_probe.py --src /other/src  # another tree (before)
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import pika

sys.path.insert(0, os.path.dirname(__file__))
from brokers import Leveret

LIMITED = {"x-delivery-limit": 3, "x-dead-letter-strategy": "individual"}


def channel(broker: Leveret) -> tuple[pika.BlockingConnection, object]:
    conn = pika.BlockingConnection(pika.ConnectionParameters(broker.host, broker.port))
    ch = conn.channel()
    ch.confirm_delivery()
    return conn, ch


def take(ch, queue: str):
    for _ in range(500):
        method, props, body = ch.basic_get(queue)
        if method is not None:
            return method, props, body
        time.sleep(0.01)
    return None, None, None


def returns_survived(broker: Leveret) -> int:
    conn, ch = channel(broker)
    ch.queue_declare("returns", durable=True, arguments=LIMITED)
    ch.basic_publish("", "returns", b"m", pika.BasicProperties(delivery_mode=2))
    survived = 0
    for _ in range(10):
        method, _, _ = ch.basic_get("returns")
        if method is None:
            break
        ch.basic_nack(method.delivery_tag, requeue=True)
        survived += 1
    conn.close()
    return survived if survived < 10 else 10


def counts_through_kill(broker: Leveret) -> dict:
    conn, ch = channel(broker)
    ch.queue_declare("kept", durable=True, arguments=LIMITED)
    ch.basic_publish("", "kept", b"m", pika.BasicProperties(delivery_mode=2))
    for _ in range(2):
        ch.basic_nack(take(ch, "kept")[0].delivery_tag, requeue=True)
    ch.basic_reject(take(ch, "kept")[0].delivery_tag, requeue=True)
    ch.queue_declare("marker", durable=True)
    ch.basic_publish("", "marker", b"", pika.BasicProperties(delivery_mode=2))
    time.sleep(0.3)
    broker.shutdown(kill=True)
    broker.launch()
    conn, ch = channel(broker)
    _, props, _ = take(ch, "kept")
    headers = dict(props.headers or {}) if props else {}
    conn.close()
    return {k: headers.get(k) for k in ("x-delivery-count", "x-acquired-count")}


def cost_per_message(broker: Leveret, count: int) -> float:
    conn, ch = channel(broker)
    ch.queue_declare("cost", durable=True)
    for _ in range(count):
        ch.basic_publish("", "cost", b"x" * 100, pika.BasicProperties(delivery_mode=2))
    before = broker.cpu_seconds()
    for _ in range(count):
        method, _, _ = take(ch, "cost")
        ch.basic_reject(method.delivery_tag, requeue=True)
        method, _, _ = take(ch, "cost")
        ch.basic_ack(method.delivery_tag)
    ch.basic_publish("", "cost", b"", pika.BasicProperties(delivery_mode=2))  # everything on disk
    used = broker.cpu_seconds() - before
    conn.close()
    return used / count * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--src", default=None, help="another leveret src/ (before)")
    parser.add_argument("--count", type=int, default=2000)
    options = parser.parse_args()
    os.environ["LEVERET_PURE_PYTHON"] = "1"
    broker = Leveret(src=options.src).start()
    try:
        print(f"returns survived (x-delivery-limit 3, 10 nacks): {returns_survived(broker)}")
        print(f"after 2 nacks, 1 reject, kill -9: {counts_through_kill(broker)}")
        cost = cost_per_message(broker, options.count)
        print(f"broker CPU per message (get, reject, get, ack): {cost:.0f} us")
    finally:
        broker.stop()


if __name__ == "__main__":
    main()
