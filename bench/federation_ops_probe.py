"""What the federation operations surfaces cost, with many links: an in-process leveret
federating N exchanges from an upstream at a closed port (so every link is a real
``error``-state link with its error text; ``--running``: from itself, so every link
runs, with its two connections), then, each ``--rounds`` times:

- ``GET /api/federation-links`` (the rows, RabbitMQ's fields);
- ``leveret ctl federation_status`` over the control socket;
- ``GET /metrics`` (with ``rabbitmq_federation_links{status}``).

Printed: the answer's status and row count, and the CPU of this process per request
(ms, from /proc's utime+stime of the process: the broker runs in-process, so the
client's share is in it too; wall time is noisy on a shared machine). Run it on a
branch without these surfaces (``PYTHONPATH=/work/main/src``) for the "before" figures:
the endpoint answers 404 and ctl refuses the command.

    PYTHONPATH=src python3 bench/federation_ops_probe.py --links 200 --rounds 50
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import tempfile
import time
import urllib.error
import urllib.request
from typing import Any

import pika
from brokers import free_port as closed_port  # a port nothing listens on

from leveret import BlockingBroker
from leveret.cli.ctl import request as ctl_request

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_ms() -> float:
    """utime + stime of this process, in ms."""
    with open("/proc/self/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / TICKS


def get(url: str) -> tuple[int, bytes]:
    request = urllib.request.Request(
        url, headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def put(base: str, path: str, body: dict) -> None:
    request = urllib.request.Request(
        base + path,
        json.dumps(body).encode(),
        method="PUT",
        headers={
            "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode(),
            "Content-Type": "application/json",
        },
    )
    with urllib.request.urlopen(request, timeout=30):
        pass


def measure(rounds: int, call: Any) -> tuple[Any, float]:
    """``call()``'s last answer and the median CPU ms per call (in tens, to see
    past the clock tick of 10 ms)."""
    answer = call()
    samples = []
    for _ in range(max(1, rounds // 10)):
        before = cpu_ms()
        for _ in range(10):
            answer = call()
        samples.append((cpu_ms() - before) / 10)
    return answer, statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--links", type=int, default=200, help="federated exchanges (one link each)")
    parser.add_argument("--rounds", type=int, default=50, help="requests of each kind")
    parser.add_argument(
        "--running",
        action="store_true",
        help="federate from the broker itself: running links, two connections each",
    )
    args = parser.parse_args()
    data_dir = tempfile.mkdtemp(prefix="federation-ops-probe-")
    with BlockingBroker(amqp_port=0, http_port=0, prometheus_port=0, data_dir=data_dir) as broker:
        base = str(broker.http_url).rstrip("/")
        port = broker.amqp_port if args.running else closed_port()
        value = {"uri": f"amqp://guest:guest@127.0.0.1:{port}", "reconnect-delay": 3600}
        try:
            put(base, "/api/parameters/federation-upstream/%2F/away", {"value": value})
        except urllib.error.HTTPError as error:
            print(f"federation-upstream parameter refused: {error.code} (no federation on this branch)")
        definition = {"federation-upstream-set": "all"}
        put(base, "/api/policies/%2F/federate", {"pattern": "^fed\\.", "definition": definition})
        connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
        channel = connection.channel()
        for number in range(args.links):
            channel.exchange_declare(f"fed.{number}", "topic")
        connection.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # every link has failed once
            status, body = get(base + "/api/federation-links")
            settled = (
                sum(r["status"] in ("running", "error") for r in json.loads(body)) if status == 200 else 0
            )
            if status != 200 or settled >= args.links:
                break
            time.sleep(0.2)
        (status, body), api_cpu = measure(args.rounds, lambda: get(base + "/api/federation-links"))
        rows = len(json.loads(body)) if status == 200 else 0
        print(f"GET /api/federation-links: {status}, {rows} rows, {len(body)} bytes, {api_cpu:.2f} ms CPU")
        answer, ctl_cpu = measure(args.rounds, lambda: ctl_request(data_dir, "federation_status", {}))
        shown = len(answer.get("rows", [])) if answer.get("ok") else answer.get("error", "")[:60]
        print(f"ctl federation_status: ok={answer.get('ok')}, {shown} rows, {ctl_cpu:.2f} ms CPU")
        metrics_url = f"{broker.prometheus_url}/metrics"
        (status, body), metrics_cpu = measure(args.rounds, lambda: get(metrics_url))
        lines = [line for line in body.decode().splitlines() if line.startswith("rabbitmq_federation_links")]
        print(f"GET /metrics: {status}, {len(body)} bytes, {metrics_cpu:.2f} ms CPU; {lines}")


if __name__ == "__main__":
    main()
