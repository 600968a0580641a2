"""A bounded probe of one exchange federation link between two leveret brokers (each its
own process): N messages of SIZE bytes published to the upstream exchange, timed until
all are in the downstream queue; CPU seconds of each broker from /proc.

    python3 bench/federation_exchange_probe.py [--src SRC] [--messages 20000] [--size 100]
        [--ack-mode on-confirm]

``--src``: the leveret source tree the brokers run (``/work/main/src`` for "before");
a tree without exchange federation is reported as such. The publisher is pika on its
own connection (no confirms); the downstream queue is polled with passive declares.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pika
from brokers import Leveret, free_port

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from targets import Target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", default=None)
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--ack-mode", default="on-confirm")
    parser.add_argument("--prefetch", type=int, default=0, help="prefetch-count (0: the default, 1000)")
    args = parser.parse_args()
    up_http, down_http = free_port(), free_port()
    up = Leveret(src=args.src, extra_args=["--http-port", str(up_http)])
    down = Leveret(src=args.src, extra_args=["--http-port", str(down_http)])
    with up, down:
        time.sleep(1.0)  # HTTP comes up after the AMQP ready line
        upstream = Target("leveret", "127.0.0.1", up.port, up_http)
        downstream = Target("leveret", "127.0.0.1", down.port, down_http)
        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", down.port))
        channel = connection.channel()
        channel.exchange_declare("fx", "direct", durable=True)
        channel.queue_declare("q", durable=True)
        channel.queue_bind("q", "fx", "k")
        value = {"uri": f"amqp://guest:guest@127.0.0.1:{up.port}", "ack-mode": args.ack_mode}
        if args.prefetch:
            value["prefetch-count"] = args.prefetch
        status, _ = downstream.http("PUT", "/api/parameters/federation-upstream/%2F/up", {"value": value})
        definition = {"federation-upstream-set": "all"}
        policy = {"pattern": "^fx$", "apply-to": "exchanges", "definition": definition}
        downstream.http("PUT", "/api/policies/%2F/fed", policy)
        deadline = time.monotonic() + 15
        while status in (200, 201, 204) and time.monotonic() < deadline:
            rows = upstream.http("GET", "/api/exchanges/%2F/fx/bindings/source")[1]  # 404: no fx yet
            if isinstance(rows, list) and any(b["destination_type"] == "exchange" for b in rows):
                break
            time.sleep(0.1)
        else:
            print(f"src {args.src or '(importable)'}: no exchange federation (parameter answered {status})")
            return
        publisher = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", up.port))
        pchannel = publisher.channel()
        body = b"x" * args.size
        cpu_up, cpu_down = up.cpu_seconds(), down.cpu_seconds()
        started = time.monotonic()
        for _ in range(args.messages):
            pchannel.basic_publish("fx", "k", body)
        published = time.monotonic() - started
        while channel.queue_declare("q", durable=True, passive=True).method.message_count < args.messages:
            if time.monotonic() - started > 120:
                raise SystemExit("not all messages arrived in 120 s")
            time.sleep(0.02)
        elapsed = time.monotonic() - started
        used_up, used_down = up.cpu_seconds() - cpu_up, down.cpu_seconds() - cpu_down
        n = args.messages
        print(
            f"src {args.src or '(importable)'}: {n} x {args.size} B, ack-mode {args.ack_mode}: "
            f"{n / elapsed:,.0f} msg/s end to end (published in {published:.2f} s, all downstream in "
            f"{elapsed:.2f} s); CPU per message: upstream {used_up / n * 1e6:.0f} µs, "
            f"downstream {used_down / n * 1e6:.0f} µs"
        )
        publisher.close()
        connection.close()


if __name__ == "__main__":
    main()
