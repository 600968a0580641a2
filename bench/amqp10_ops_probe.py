"""What AMQP 1.0 operations cost: broker CPU per message with the ``protocol="amqp10"``
counters bumped on the hot path, and the time of ``GET /api/connections/{name}/sessions``
for a connection with many sessions and links.

Runs a ``leveret server`` subprocess from the sources given (``--src``, default this
tree's ``src``; give another tree's ``src`` to measure before a change), publishes
``--messages`` 100-byte messages pre-settled with proton's blocking API and consumes them
(credit 500, accepted), reading the server's CPU time from /proc (µs per message, the
median of ``--rounds``). Then opens one connection with ``--sessions`` sessions of a
sender and a receiver each and times the sessions listing (median of 20 requests, ms);
a tree without the endpoint reports ``n/a``. Bounded: a few seconds a round.

    python3 bench/amqp10_ops_probe.py [--src /work/main/src] [--messages 5000]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from brokers import proc_cpu_seconds
from proton import Endpoint, Message
from proton.reactor import AtMostOnce
from proton.utils import BlockingConnection

ROOT = Path(__file__).resolve().parent.parent


def start(src: str, data: str) -> tuple[subprocess.Popen, int, int]:
    """A leveret server from ``src``: (process, AMQP port, HTTP port)."""
    env = {**os.environ, "PYTHONPATH": src}
    process = subprocess.Popen(
        [sys.executable, "-m", "leveret", "server", "--amqp-port", "0", "--http-port", "0",
         "--stomp-port", "-1", "--mqtt-port", "-1", "--data-dir", data],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )
    assert process.stdout is not None
    amqp = http = None
    deadline = time.monotonic() + 30
    while (amqp is None or http is None) and time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        found = re.search(r"amqp://\S*?:(\d+)", line)
        if found and amqp is None:
            amqp = int(found.group(1))
        found = re.search(r"http://\S*?:(\d+)", line)
        if found and http is None:
            http = int(found.group(1))
    if amqp is None or http is None:
        process.kill()
        raise SystemExit("the server did not print its ports")
    return process, amqp, http


def get(http: int, path: str) -> tuple[int, object]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{http}{path}",
        headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, None


def cpu_per_message(pid: int, amqp: int, messages: int, round_: int) -> float:
    """Broker CPU µs per message: publish pre-settled, consume with credit 500."""
    connection = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{amqp}", timeout=30)
    queue = f"/queue/ops-probe-{round_}"  # v1: created on attach
    sender = connection.create_sender(queue, options=AtMostOnce())
    receiver = connection.create_receiver(queue, credit=500)
    body = b"x" * 100
    before = proc_cpu_seconds(pid)
    for _ in range(messages):
        sender.send(Message(body=body))
    for _ in range(messages):
        receiver.receive(timeout=30)
        receiver.accept()
    connection.wait(lambda: not receiver.link.unsettled, timeout=30)
    spent = proc_cpu_seconds(pid) - before
    connection.close()
    return spent / messages * 1e6


def sessions_listing(amqp: int, http: int, sessions: int) -> tuple[str, str]:
    """(ms for the sessions listing, ms for /api/connections), medians of 20."""
    connection = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{amqp}", timeout=30)
    links = []
    for n in range(sessions):
        session = connection.conn.session()
        session.open()
        sender = session.sender(f"s{n}")
        sender.target.address = "/queue/ops-probe-links"
        sender.open()
        receiver = session.receiver(f"r{n}")
        receiver.source.address = "/queue/ops-probe-links"
        receiver.open()
        receiver.flow(10)
        links += [sender, receiver]
    connection.wait(lambda: all(link.state & Endpoint.REMOTE_ACTIVE for link in links), timeout=30)
    rows = get(http, "/api/connections")[1]
    assert isinstance(rows, list)
    name = next(r["name"] for r in rows if r["protocol"] == "AMQP 1.0")
    path = f"/api/connections/{urllib.parse.quote(name, safe='')}/sessions"
    status, answer = get(http, path)
    times = []
    listing = "n/a"
    if status == 200:
        assert isinstance(answer, list) and len(answer) == sessions
        for _ in range(20):
            started = time.perf_counter()
            get(http, path)
            times.append(time.perf_counter() - started)
        listing = f"{statistics.median(times) * 1000:.2f}"
    times = []
    for _ in range(20):
        started = time.perf_counter()
        get(http, "/api/connections")
        times.append(time.perf_counter() - started)
    connection.close()
    return listing, f"{statistics.median(times) * 1000:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", default=str(ROOT / "src"))
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=60)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as data:
        process, amqp, http = start(args.src, data)
        try:
            cpu = [cpu_per_message(process.pid, amqp, args.messages, r) for r in range(args.rounds)]
            listing, connections = sessions_listing(amqp, http, args.sessions)
        finally:
            process.kill()
            process.wait()
    print(f"src {args.src}")
    print(f"broker CPU per message (publish settled + consume, 100 B): {statistics.median(cpu):.1f} µs "
          f"(rounds {', '.join(f'{c:.1f}' for c in cpu)})")
    print(f"GET /api/connections/{{name}}/sessions, {args.sessions} sessions x 2 links: {listing} ms")
    print(f"GET /api/connections: {connections} ms")


if __name__ == "__main__":
    main()
