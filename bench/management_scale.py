"""Management and metrics at scale (issue 27, item 1): with many idle queues (and
optionally many connections and consumers), how long the list endpoints and the
Prometheus per-object scrape take, what they cost the broker in CPU, and the longest
gap an AMQP client sees meanwhile.

Usage::

    PYTHONPATH=src python3 bench/management_scale.py [--queues 100000]
        [--connections 1000 --consumers 10000] [--only queues,metrics,runtime]

``PYTHONPATH`` chooses the leveret that runs (``/work/main/src`` for "before"): the
broker is started as ``python3 -m leveret server`` in a subprocess with that path.

- Queues are declared with ``nowait`` in pipelined batches on one raw AMQP channel
  (a round trip per batch), far faster than one pika round trip each.
- Connections (``--connections``) are raw asyncio sockets in this process, each with
  one channel; ``--consumers`` are spread over them (``basic.consume`` with ``nowait``
  on the declared queues).
- The canary is a separate process (so this one's JSON parsing does not stall it): a
  pika client publishing to its own queue and consuming the message back, every
  ``CANARY_PAUSE_S``; it records when each round trip ends (``time.monotonic``, one
  clock for every process). A request's *gap* is the longest interval without a
  finished round trip that overlaps the request.
- Each request is timed from its first byte sent to its last byte read (wall, ms),
  with the broker's CPU seconds (utime + stime from ``/proc/PID/stat``) it took.

Printed: one line per request, ``wall_ms``, ``cpu_ms`` (broker), ``gap_ms`` (canary),
``bytes``. Wall and gap are noisy on a shared machine; CPU is the steadier figure.

``--trace FILE``: the broker runs with ``bench/stall_trace`` (asyncio's loop instead
of uvloop, every loop callback over 20 ms and every garbage collection over 10 ms
logged to FILE); each request's line then also names its longest loop callback and
its longest collection (``loop_ms``, ``gc_ms``), so a gap can be put down to the
management work or to the collector.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import itertools
import multiprocessing
import os
import re
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from pamqp import commands

from leveret.amqp.delivery import decode_frame
from leveret.amqp.frames import PROTOCOL_HEADER, encode_method

CLK_TCK = os.sysconf("SC_CLK_TCK")
DECLARE_BATCH = 2000  # nowait declares written before a round trip
CANARY_PAUSE_S = 0.002  # between the canary's round trips
PAGE = "page=1&page_size=100"
AUTH = "Basic " + base64.b64encode(b"guest:guest").decode()


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` in seconds (``/proc/PID/stat`` fields 14 and 15)."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    fields = raw[raw.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


# -- the broker ---------------------------------------------------------------------------
class Broker:
    """``leveret server`` in a subprocess, with the management API and Prometheus."""

    def __init__(self, data_dir: str, trace: str | None = None) -> None:
        self.log = open(Path(data_dir).parent / "broker.log", "w")  # noqa: SIM115
        env = dict(os.environ)
        if trace:
            here = str(Path(__file__).resolve().parent / "stall_trace")
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [here, env.get("PYTHONPATH")]))
            env["LEVERET_STALL_LOG"] = trace
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "leveret", "server", "--amqp-port", "0", "--stomp-port", "0",
             "--mqtt-port", "0", "--web-mqtt-port", "0",
             "--web-stomp-port", "0", "--prometheus-port", "0", "--http-port", "0",
             "--data-dir", data_dir],
            stdout=subprocess.PIPE, stderr=self.log, text=True, env=env,
        )  # fmt: skip
        self.amqp_port = self.http = self.prometheus = None
        assert self.proc.stdout is not None
        while self.prometheus is None:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("the broker did not start: see broker.log")
            if m := re.match(r"leveret ready: amqp://[\d.]+:(\d+)", line):
                self.amqp_port = int(m.group(1))
            elif m := re.match(r"leveret management: (\S+)/api/", line):
                self.http = m.group(1)
            elif m := re.match(r"leveret prometheus: (\S+)/metrics", line):
                self.prometheus = m.group(1)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self.log.close()


# -- a raw AMQP client for declaring queues fast ------------------------------------------
class RawAMQP:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.buffer = b""
        self.sock.sendall(PROTOCOL_HEADER)
        self.expect(commands.Connection.Start)
        self.send(0, commands.Connection.StartOk(
            client_properties={"product": "management_scale"}, mechanism="PLAIN",
            response="\x00guest\x00guest", locale="en_US"))  # fmt: skip
        self.expect(commands.Connection.Tune)
        self.send(0, commands.Connection.TuneOk(channel_max=0, frame_max=131072, heartbeat=0))
        self.send(0, commands.Connection.Open(virtual_host="/"))
        self.expect(commands.Connection.OpenOk)
        self.send(1, commands.Channel.Open())
        self.expect(commands.Channel.OpenOk)

    def send(self, channel: int, method: object) -> None:
        self.sock.sendall(encode_method(channel, method))

    def expect(self, kind: type) -> object:
        while True:
            while len(self.buffer) < 7 or len(self.buffer) < 8 + struct.unpack_from(">I", self.buffer, 3)[0]:
                data = self.sock.recv(1 << 20)
                if not data:
                    raise ConnectionError("closed")
                self.buffer += data
            size = 8 + struct.unpack_from(">I", self.buffer, 3)[0]
            frame, self.buffer = self.buffer[:size], self.buffer[size:]
            _, value = decode_frame(frame)
            if isinstance(value, kind):
                return value
            if isinstance(value, (commands.Connection.Close, commands.Channel.Close)):
                raise RuntimeError(f"broker closed: {value!r}")

    def declare(self, names: list[str]) -> None:
        """Declare ``names`` (non-durable), pipelined, a round trip per batch."""
        for start in range(0, len(names), DECLARE_BATCH):
            batch = names[start : start + DECLARE_BATCH]
            data = b"".join(
                encode_method(1, commands.Queue.Declare(queue=n, nowait=True)) for n in batch[:-1]
            )
            self.sock.sendall(data + encode_method(1, commands.Queue.Declare(queue=batch[-1])))
            self.expect(commands.Queue.DeclareOk)


# -- many connections and consumers (asyncio) ---------------------------------------------
async def _connect(port: int, consumers: list[str]) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)

    async def until(kind: type) -> None:
        while True:
            head = await reader.readexactly(7)
            size = struct.unpack_from(">I", head, 3)[0]
            _, value = decode_frame(head + await reader.readexactly(size + 1))
            if isinstance(value, kind):
                return

    writer.write(PROTOCOL_HEADER)
    await until(commands.Connection.Start)
    writer.write(encode_method(0, commands.Connection.StartOk(
        client_properties={"product": "management_scale"}, mechanism="PLAIN",
        response="\x00guest\x00guest", locale="en_US")))  # fmt: skip
    await until(commands.Connection.Tune)
    writer.write(encode_method(0, commands.Connection.TuneOk(channel_max=0, frame_max=131072, heartbeat=0)))
    writer.write(encode_method(0, commands.Connection.Open(virtual_host="/")))
    await until(commands.Connection.OpenOk)
    writer.write(encode_method(1, commands.Channel.Open()))
    await until(commands.Channel.OpenOk)
    for i, queue in enumerate(consumers):
        writer.write(encode_method(1, commands.Basic.Consume(queue=queue, consumer_tag=f"c{i}", nowait=True)))
    writer.write(encode_method(1, commands.Basic.Qos(prefetch_count=10)))
    await until(commands.Basic.QosOk)
    return reader, writer


def hold_connections(port: int, count: int, consumers: int, queues: list[str], ready, done) -> None:
    """A process holding ``count`` connections with ``consumers`` over them until
    ``done`` is set."""

    async def main() -> None:
        per = consumers // count if count else 0
        opened = []
        for start in range(0, count, 50):
            batch = [
                _connect(port, [queues[(i * per + j) % len(queues)] for j in range(per)])
                for i in range(start, min(count, start + 50))
            ]
            opened += await asyncio.gather(*batch)
        ready.set()
        while not done.is_set():
            await asyncio.sleep(0.2)
        for _, writer in opened:
            writer.close()

    asyncio.run(main())


# -- the canary ---------------------------------------------------------------------------
def canary(port: int, started, stop, out) -> None:
    """Publish and consume back one message every ``CANARY_PAUSE_S``; send the end times
    of every round trip through ``out`` when ``stop`` is set."""
    import pika

    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, heartbeat=0))
    channel = connection.channel()
    queue = channel.queue_declare("", exclusive=True).method.queue
    got: list[bool] = []
    channel.basic_consume(queue, lambda ch, m, p, b: got.append(True), auto_ack=True)
    ends: list[float] = []
    started.set()
    while not stop.is_set():
        channel.basic_publish("", queue, b"x")
        while not got:
            connection.process_data_events(time_limit=0.05)
        got.clear()
        ends.append(time.monotonic())
        time.sleep(CANARY_PAUSE_S)
    connection.close()
    out.send(ends)


def largest_gap(ends: list[float], start: float, end: float) -> float:
    """The longest interval between consecutive round trips overlapping [start, end]."""
    gap = 0.0
    for before, after in itertools.pairwise(ends):
        if after >= start and before <= end:
            gap = max(gap, after - before)
    return gap


# -- requests -----------------------------------------------------------------------------
def fetch(url: str, auth: bool = True) -> int:
    request = urllib.request.Request(url, headers={"Authorization": AUTH} if auth else {})
    with urllib.request.urlopen(request, timeout=600) as answer:
        return len(answer.read())


def read_trace(path: str) -> list[tuple[float, str, float]]:
    """(monotonic end time, ``loop`` or ``gc``, ms) of each stall the broker logged."""
    found = []
    for line in Path(path).read_text().splitlines():
        when, kind, ms = line.split()[:3]
        found.append((float(when), kind, float(ms)))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queues", type=int, default=100_000)
    parser.add_argument("--connections", type=int, default=0)
    parser.add_argument("--consumers", type=int, default=0)
    parser.add_argument("--only", default="queues,metrics,runtime")
    parser.add_argument("--trace", help="log the broker's loop stalls and collections to this file")
    args = parser.parse_args()
    only = set(args.only.split(","))

    with tempfile.TemporaryDirectory() as tmp:
        if args.trace:
            Path(args.trace).write_text("")
        broker = Broker(os.path.join(tmp, "data"), args.trace)
        ctx = multiprocessing.get_context("spawn")
        holder_done = ctx.Event()
        holder = None
        try:
            t0 = time.monotonic()
            names = [f"q-{i:06d}" for i in range(args.queues)]
            RawAMQP(broker.amqp_port).declare(names)
            print(f"declared {args.queues} queues in {time.monotonic() - t0:.1f} s; "
                  f"broker RSS {rss_mb(broker.proc.pid):.0f} MB")  # fmt: skip
            if args.connections:
                ready = ctx.Event()
                holder = ctx.Process(
                    target=hold_connections,
                    args=(
                        broker.amqp_port,
                        args.connections,
                        args.consumers,
                        names or ["x"],
                        ready,
                        holder_done,
                    ),
                )
                holder.start()
                ready.wait(300)
                print(f"{args.connections} connections, {args.consumers} consumers open")
            started, stop = ctx.Event(), ctx.Event()
            receiver, sender = ctx.Pipe(duplex=False)
            bird = ctx.Process(target=canary, args=(broker.amqp_port, started, stop, sender))
            bird.start()
            started.wait(30)
            time.sleep(1.0)  # its quiet baseline

            api, prom = broker.http, broker.prometheus
            last = max(1, -(-args.queues // 100))
            requests: list[tuple[str, str, bool | int]] = []
            if "queues" in only:
                requests += [
                    ("queues page 1", f"{api}/api/queues?page=1&page_size=100", True),
                    ("queues page 1 (again)", f"{api}/api/queues?page=1&page_size=100", True),
                    ("queues last page", f"{api}/api/queues?page={last}&page_size=100", True),
                    ("queues sort=messages", f"{api}/api/queues?{PAGE}&sort=messages&sort_reverse=true", 1),
                    ("queues name filter", f"{api}/api/queues?page=1&page_size=100&name=q-00012", True),
                    ("queues vhost page", f"{api}/api/queues/%2F?page=1&page_size=100", True),
                    ("queues full list", f"{api}/api/queues", True),
                    ("one queue's bindings", f"{api}/api/queues/%2F/q-000001/bindings", True),
                    ("bindings (all)", f"{api}/api/bindings", True),
                    ("overview", f"{api}/api/overview", True),
                ]  # fmt: skip
            if "metrics" in only:
                requests += [
                    ("metrics aggregated", f"{prom}/metrics", False),
                    ("metrics per-object", f"{prom}/metrics/per-object", False),
                    ("metrics per-object (again)", f"{prom}/metrics/per-object", False),
                ]
            if "runtime" in only:
                requests += [
                    ("connections", f"{api}/api/connections", True),
                    ("connections page 1", f"{api}/api/connections?page=1&page_size=100", True),
                    ("channels", f"{api}/api/channels", True),
                    ("consumers", f"{api}/api/consumers", True),
                ]
            results = []
            for label, url, auth in requests:
                cpu0, start = cpu_seconds(broker.proc.pid), time.monotonic()
                size = fetch(url, auth)
                end, cpu1 = time.monotonic(), cpu_seconds(broker.proc.pid)
                results.append((label, start, end, cpu1 - cpu0, size))
                time.sleep(0.3)
            stop.set()
            ends = receiver.recv()
            bird.join(10)
            quiet = largest_gap(ends, ends[0], results[0][1] - 0.05) if ends else 0.0
            print(f"canary: {len(ends)} round trips, largest gap before the requests {quiet * 1000:.1f} ms")
            stalls = read_trace(args.trace) if args.trace else []
            head = f"{'request':32} {'wall_ms':>9} {'cpu_ms':>8} {'gap_ms':>8} {'bytes':>11}"
            print(head + (f" {'loop_ms':>8} {'gc_ms':>8}" if args.trace else ""))
            for label, start, end, cpu, size in results:
                gap = largest_gap(ends, start, end)
                wall = (end - start) * 1000
                line = f"{label:32} {wall:9.1f} {cpu * 1000:8.0f} {gap * 1000:8.1f} {size:11d}"
                if args.trace:
                    during = [(kind, ms) for when, kind, ms in stalls if start <= when <= end + 0.05]
                    loop = max((ms for kind, ms in during if kind == "loop"), default=0.0)
                    collected = max((ms for kind, ms in during if kind == "gc"), default=0.0)
                    line += f" {loop:8.1f} {collected:8.1f}"
                print(line)
        finally:
            holder_done.set()
            if holder is not None:
                holder.join(30)
            broker.stop()


if __name__ == "__main__":
    main()
