"""The cost of being watched: broker CPU per message with the management API and the
Prometheus endpoint scraped every second, against the same workload unwatched, in one
run of one leveret (issue 13: at most 5%).

Usage::

    PYTHONPATH=$PWD/src:$PWD/bench python bench/observability_bench.py [--rounds 3] [--queues 1000]

The broker runs with ``--http-port 0`` and has ``--queues`` extra queues declared (so
per-queue listings are not trivial). Each round runs the ``pubsub`` and ``publish``
workloads (bench/workloads.py) twice: unwatched, then watched by a thread that every
``--interval`` seconds fetches ``/metrics``, ``/metrics/per-object``, ``/api/overview``
and ``/api/queues`` (a Prometheus server and a dashboard; ``--watch metrics`` or
``console`` for one of them). Alternating the two in
rounds spreads drift (CPU frequency, other load) over both. Printed: broker µs of CPU
per message (utime+stime from /proc) for each, their ratio, and scrapes done.
"""

from __future__ import annotations

import argparse
import base64
import re
import statistics
import sys
import threading
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import pika  # noqa: E402
from brokers import Leveret  # noqa: E402
from loadgen import new_event_loop  # noqa: E402
from workloads import WORKLOADS, Meter, Settings  # noqa: E402

API = re.compile(r"leveret management: (http://\S+)/api/")
WATCHED = ("/metrics", "/metrics/per-object", "/api/overview", "/api/queues")
#: --watch's sets: a Prometheus server, the console (and RabbitMQ's UI: a page of
#: queues), or everything at once
WATCH_SETS = {
    "metrics": ("/metrics", "/metrics/per-object"),
    "console": ("/api/overview", "/api/queues?page=1&page_size=100"),
    "all": WATCHED,
}


class Watcher(threading.Thread):
    """Fetches :data:`WATCHED` every ``interval`` seconds until stopped."""

    def __init__(self, api: str, metrics: str, interval: float, paths: tuple[str, ...] = WATCHED) -> None:
        super().__init__(daemon=True)
        self.urls = [metrics + p if p.startswith("/metrics") else api + p for p in paths]
        self.interval = interval
        self.done = threading.Event()
        self.fetched = self.failed = 0

    def run(self) -> None:
        auth = "Basic " + base64.b64encode(b"guest:guest").decode()
        while not self.done.wait(self.interval):
            for url in self.urls:
                request = urllib.request.Request(url, headers={"Authorization": auth})
                try:
                    with urllib.request.urlopen(request, timeout=30) as reply:
                        reply.read()
                    self.fetched += 1
                except OSError:
                    self.failed += 1

    def stop(self) -> tuple[int, int]:
        self.done.set()
        self.join(30)
        return self.fetched, self.failed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--queues", type=int, default=1000, help="extra queues declared")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between two scrapes")
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--workloads", default="pubsub,publish")
    parser.add_argument("--watch", choices=list(WATCH_SETS), default="all", help="what is fetched")
    args = parser.parse_args()

    broker = Leveret(extra_args=["--http-port", "0"])
    broker.start()
    loop = new_event_loop()
    try:
        log = Path(broker.log_path).read_text()
        api = API.search(log)
        metrics = broker.prometheus_url()
        if api is None or metrics is None:
            raise SystemExit(f"no HTTP API or metrics in the broker's log:\n{log}")
        connection = pika.BlockingConnection(pika.ConnectionParameters(broker.host, broker.port))
        channel = connection.channel()
        for n in range(args.queues):
            channel.queue_declare(f"idle-{n}", durable=True)
        connection.close()
        settings = Settings(messages=args.messages, seconds=args.seconds)
        results: dict[tuple[str, bool], list[float]] = {}
        scrapes = [0, 0]
        for round_ in range(1, args.rounds + 1):
            for workload in args.workloads.split(","):
                for watched in (False, True):
                    watcher = (
                        Watcher(api.group(1), metrics, args.interval, WATCH_SETS[args.watch])
                        if watched
                        else None
                    )
                    if watcher is not None:
                        watcher.start()
                    meter = Meter(broker)
                    rows = loop.run_until_complete(WORKLOADS[workload](broker, settings, meter))
                    if watcher is not None:
                        fetched, failed = watcher.stop()
                        scrapes[0] += fetched
                        scrapes[1] += failed
                    row = rows[0]
                    us = meter.broker_cpu / row.messages * 1e6
                    results.setdefault((workload, watched), []).append(us)
                    print(
                        f"round {round_} {workload:8s} {'watched' if watched else 'unwatched':9s} "
                        f"{row.messages:>8d} msgs {row.rate:>9,.0f} msg/s {us:7.2f} µs CPU/msg",
                        file=sys.stderr,
                    )
                    time.sleep(1)
        print(f"\nwatched: {', '.join(WATCH_SETS[args.watch])} every {args.interval:g} s")
        print(f"scrapes: {scrapes[0]} fetched, {scrapes[1]} failed; {args.queues} extra queues")
        print(f"{'workload':10s} {'unwatched µs/msg':>17s} {'watched µs/msg':>15s} {'cost':>7s}")
        for workload in args.workloads.split(","):
            plain = statistics.median(results[(workload, False)])
            watched = statistics.median(results[(workload, True)])
            print(f"{workload:10s} {plain:17.2f} {watched:15.2f} {100 * (watched / plain - 1):6.1f}%")
    finally:
        loop.close()
        broker.stop()


if __name__ == "__main__":
    main()
