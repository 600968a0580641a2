"""Slowloris against an HTTP port of ``leveret server`` at a low file-descriptor limit
(issue 27, item 6): do AMQP, STOMP and the HTTP API keep working?

Starts ``python -m leveret server`` (from ``PYTHONPATH``: give another tree's ``src``
to measure it, e.g. ``PYTHONPATH=/work/main/src``) with ``RLIMIT_NOFILE`` set to
``--nofile`` (default 1024), the management API, Prometheus, STOMP and Web STOMP on;
opens ``--sockets`` (default 1100) connections to one HTTP port (``--port-kind``:
management, prometheus or web-stomp), each sending a request head one byte at a time
and never finishing it; then, while they trickle, checks once:

- ``amqp``: a new pika connection declares a queue, publishes and gets the message;
- ``stomp``: a new STOMP connection gets CONNECTED;
- ``http``: ``GET /api/overview`` on the management port answers 200 (when the slow
  sockets are on another port) — or is refused at once with 503 (same port);
- ``metrics``: ``GET /metrics`` answers 200 on the Prometheus port.

then waits ``--wait`` seconds (default 25: past leveret's 20 s header timeout) and
reports how many slow sockets the broker still holds, then checks the HTTP API again.
Prints one JSON line; the broker's CPU seconds (from /proc) for the whole run too.

    PYTHONPATH=/work/main/src python bench/slowloris_probe.py    # before
    PYTHONPATH=src python bench/slowloris_probe.py               # after

Bounded: about ``--wait`` + 15 seconds.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pika

CHECK_TIMEOUT = 5.0  # seconds each health check may take
HEAD = b"GET /api/overview HTTP/1.1\r\nHost: 127.0.0.1\r\nX-a: " + b"b" * 4000  # never ends


def start_broker(data_dir: Path, nofile: int, config: Path | None) -> tuple[subprocess.Popen, dict[str, int]]:
    """``leveret server`` with RLIMIT_NOFILE ``nofile``; its ports from the ready lines."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    args = [sys.executable, "-m", "leveret", "server", "--amqp-port", "0", "--stomp-port", "0"]
    args += ["--web-stomp-port", "0", "--prometheus-port", "0", "--http-port", "0"]
    args += ["--mqtt-port", "0", "--web-mqtt-port", "0"]
    args += ["--data-dir", str(data_dir)]
    if config is not None:
        args += ["--config", str(config)]
    log = open(data_dir.parent / "broker.log", "w")  # noqa: SIM115 (the child keeps it)
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, text=True, preexec_fn=limit)
    ports: dict[str, int] = {}
    patterns = {
        "amqp": r"amqp://[\d.]+:(\d+)",
        "stomp": r"stomp://[\d.]+:(\d+)",
        "management": r"management: http://[\d.]+:(\d+)",
        "web-stomp": r"web-stomp: ws://[\d.]+:(\d+)",
        "prometheus": r"prometheus: http://[\d.]+:(\d+)",
    }
    assert proc.stdout is not None
    while "prometheus" not in ports:
        line = proc.stdout.readline()
        if not line:
            log_text = (data_dir.parent / "broker.log").read_text()
            raise RuntimeError(f"the broker did not start: {log_text[-2000:]}")
        for name, pattern in patterns.items():
            match = re.search(pattern, line)
            if match and name not in ports:
                ports[name] = int(match.group(1))
    return proc, ports


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def open_slow(port: int, count: int) -> list[socket.socket]:
    """``count`` sockets to ``port``, each with the first byte of a request head sent."""
    sockets = []
    for _ in range(count):
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=2)
        except OSError:
            continue
        sock.setblocking(False)
        try:
            sock.send(HEAD[:1])
        except OSError:
            pass
        sockets.append(sock)
    return sockets


def trickle(sockets: list[socket.socket], sent: int) -> list[socket.socket]:
    """Send byte ``sent`` of the head on each socket; the ones the broker closed (or
    answered: 408/503) are dropped from the list."""
    alive = []
    for sock in sockets:
        try:
            sock.recv(1, socket.MSG_PEEK)  # b"" (closed) or an answer: dropped
            sock.close()
            continue
        except BlockingIOError:  # nothing yet: still held
            pass
        except OSError:
            sock.close()
            continue
        try:
            sock.send(HEAD[sent : sent + 1])
            alive.append(sock)
        except OSError:
            sock.close()
    return alive


def check_amqp(port: int) -> str:
    try:
        params = pika.ConnectionParameters(
            "127.0.0.1", port, socket_timeout=CHECK_TIMEOUT, blocked_connection_timeout=CHECK_TIMEOUT
        )
        connection = pika.BlockingConnection(params)
        try:
            channel = connection.channel()
            queue = channel.queue_declare("", exclusive=True).method.queue
            channel.basic_publish("", queue, b"probe")
            _, _, body = channel.basic_get(queue, auto_ack=True)
            return "ok" if body == b"probe" else f"got {body!r}"
        finally:
            connection.close()
    except Exception as exc:  # any failure is the answer
        return f"{type(exc).__name__}: {exc}"[:120]


def check_stomp(port: int) -> str:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=CHECK_TIMEOUT) as sock:
            sock.sendall(b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\0")
            reply = sock.recv(4096)
            return "ok" if reply.startswith(b"CONNECTED") else f"got {reply[:40]!r}"
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"[:120]


def check_http(url: str) -> str:
    login = "Basic " + base64.b64encode(b"guest:guest").decode()
    request = urllib.request.Request(url, headers={"Authorization": login})
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=CHECK_TIMEOUT) as response:
            response.read()
            return f"{response.status} in {time.monotonic() - started:.2f} s"
    except urllib.error.HTTPError as exc:
        return f"{exc.code} in {time.monotonic() - started:.2f} s"
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"[:120]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sockets", type=int, default=1100)
    parser.add_argument("--nofile", type=int, default=1024, help="the broker's RLIMIT_NOFILE")
    kinds = ("management", "prometheus", "web-stomp")
    parser.add_argument("--port-kind", choices=kinds, default="management")
    parser.add_argument("--wait", type=float, default=25.0, help="seconds of trickling after the checks")
    parser.add_argument("--config", type=Path, default=None, help="a config file (e.g. [http] settings)")
    args = parser.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # this process holds all the slow sockets
    tmp = Path(tempfile.mkdtemp(prefix="slowloris-"))
    proc, ports = start_broker(tmp / "data", args.nofile, args.config)
    result: dict[str, object] = {"sockets": args.sockets, "nofile": args.nofile, "port": args.port_kind}
    try:
        cpu_before = cpu_seconds(proc.pid)
        management = f"http://127.0.0.1:{ports['management']}/api/overview"
        metrics = f"http://127.0.0.1:{ports['prometheus']}/metrics"
        sockets = open_slow(ports[args.port_kind], args.sockets)
        sent = 1
        time.sleep(1.0)
        sockets = trickle(sockets, sent)
        sent += 1
        result["held_after_1s"] = len(sockets)
        result["amqp"] = check_amqp(ports["amqp"])
        result["stomp"] = check_stomp(ports["stomp"])
        result["http"] = check_http(management)
        result["metrics"] = check_http(metrics)
        deadline = time.monotonic() + args.wait
        while time.monotonic() < deadline and sockets:
            time.sleep(1.0)
            sockets = trickle(sockets, sent)
            sent += 1
        result[f"held_after_{args.wait:g}s_more"] = len(sockets)
        result["http_after"] = check_http(management)
        result["amqp_after"] = check_amqp(ports["amqp"])
        result["broker_cpu_s"] = round(cpu_seconds(proc.pid) - cpu_before, 2)
        for sock in sockets:
            sock.close()
        result["broker_alive"] = proc.poll() is None
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
