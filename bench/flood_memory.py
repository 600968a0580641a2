"""Memory under a publish flood with no consumer (issue 27, item 5).

One publisher floods ``--count`` × ``--size``-byte persistent messages (``--transient``:
transient ones) into one durable queue, with no consumer and no publisher confirms:
over AMQP a raw socket writes pre-encoded ``basic.publish`` frames as fast as the
broker reads them (announcing the ``connection.blocked`` capability and counting the
connection.blocked / unblocked it gets); over STOMP it writes ``SEND`` frames with
``persistent:true`` (none with ``--transient``). Meanwhile the broker's resident memory
(``VmRSS`` of its process tree, from ``/proc/<pid>/status``) is
sampled every ``--interval`` seconds.

Reported: peak RSS during the flood, RSS when the broker has taken in every message
(a passive ``queue.declare`` counts them), RSS ``--after`` seconds later (memory given
back after the flood), broker CPU seconds, the publisher's pauses (writes that waited
``STALL_S`` or more: the broker stopped reading it, by flow control or an alarm), the
broker's count of flow-control holds (its Prometheus ``leveret_publisher_flow_holds_total``)
and, with ``--verify``, how many messages a consumer then gets (none may be lost) and
RSS once they are consumed and ``--after`` seconds later. The broker runs
with default settings unless ``--broker-arg`` adds options; ``--src`` runs another
leveret tree (e.g. ``/work/main/src``) for a before/after comparison.

    PYTHONPATH=src python3 bench/flood_memory.py --protocol amqp --count 2000000
    PYTHONPATH=src python3 bench/flood_memory.py --protocol stomp --count 500000 --after 10
"""

from __future__ import annotations

import argparse
import json
import os
import select
import socket
import struct
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from brokers import Leveret
from pamqp import commands, frame

from leveret.amqp.frames import encode_publish

STALL_S = 0.05  # a write that waits this long counts as a pause of the publisher
CHUNK = 256  # messages per write
MB = 2**20


class Sampler(threading.Thread):
    """RSS of the broker's process tree every ``interval`` seconds."""

    def __init__(self, broker: Leveret, interval: float) -> None:
        super().__init__(daemon=True)
        self.broker, self.interval = broker, interval
        self.samples: list[tuple[float, int]] = []
        self.stop = threading.Event()
        self.t0 = time.monotonic()

    def run(self) -> None:
        while not self.stop.is_set():
            self.samples.append((time.monotonic() - self.t0, self.broker.rss_bytes()))
            self.stop.wait(self.interval)

    def peak(self) -> int:
        return max((rss for _, rss in self.samples), default=0)


# -- AMQP ------------------------------------------------------------------------------
def _read_frames(sock: socket.socket, buf: bytearray) -> list:
    data = sock.recv(1 << 20)
    if not data:
        raise ConnectionError("the broker closed the connection")
    buf += data
    out = []
    while True:
        try:
            used, _channel, value = frame.unmarshal(bytes(buf))
        except Exception:  # incomplete
            return out
        del buf[:used]
        out.append(value)


def _wait_for(sock: socket.socket, buf: bytearray, kind: type) -> object:
    while True:
        for value in _read_frames(sock, buf):
            if isinstance(value, kind):
                return value
            if isinstance(value, (commands.Connection.Close, commands.Channel.Close)):
                raise ConnectionError(f"closed by the broker: {value}")


def amqp_open(host: str, port: int) -> tuple[socket.socket, bytearray]:
    """A connection with channel 1 open (heartbeats off, connection.blocked announced)."""
    sock = socket.create_connection((host, port), timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray()
    sock.sendall(b"AMQP\x00\x00\x09\x01")
    _wait_for(sock, buf, commands.Connection.Start)
    props = {"capabilities": {"connection.blocked": True, "publisher_confirms": True}}
    sock.sendall(
        frame.marshal(
            commands.Connection.StartOk(
                client_properties=props, mechanism="PLAIN", response="\0guest\0guest"
            ),
            0,
        )
    )
    tune = _wait_for(sock, buf, commands.Connection.Tune)
    sock.sendall(
        frame.marshal(
            commands.Connection.TuneOk(channel_max=tune.channel_max, frame_max=tune.frame_max, heartbeat=0), 0
        )
    )
    sock.sendall(frame.marshal(commands.Connection.Open(virtual_host="/"), 0))
    _wait_for(sock, buf, commands.Connection.OpenOk)
    sock.sendall(frame.marshal(commands.Channel.Open(), 1))
    _wait_for(sock, buf, commands.Channel.OpenOk)
    return sock, buf


def amqp_count(host: str, port: int, queue: str) -> int:
    """Messages in ``queue`` (a passive declare on a new connection)."""
    sock, buf = amqp_open(host, port)
    try:
        sock.sendall(frame.marshal(commands.Queue.Declare(queue=queue, passive=True), 1))
        return _wait_for(sock, buf, commands.Queue.DeclareOk).message_count
    finally:
        sock.close()


def amqp_flood(host: str, port: int, queue: str, count: int, body: bytes, persistent: bool = True) -> dict:
    sock, buf = amqp_open(host, port)
    sock.sendall(frame.marshal(commands.Queue.Declare(queue=queue, durable=True), 1))
    _wait_for(sock, buf, commands.Queue.DeclareOk)
    one = encode_publish(1, "", queue, body, {"delivery_mode": 2 if persistent else 1}, 131072)
    return _pump(sock, one, count, lambda data: _amqp_events(sock, buf, data))


def _amqp_events(sock: socket.socket, buf: bytearray, stats: dict) -> None:
    for value in _read_frames(sock, buf):
        if isinstance(value, commands.Connection.Blocked):
            stats["blocked"] += 1
        elif isinstance(value, commands.Connection.Unblocked):
            stats["unblocked"] += 1
        elif isinstance(value, (commands.Connection.Close, commands.Channel.Close)):
            raise ConnectionError(f"closed by the broker: {value}")


# -- STOMP -----------------------------------------------------------------------------
def stomp_flood(host: str, port: int, queue: str, count: int, body: bytes, persistent: bool = True) -> dict:
    sock = socket.create_connection((host, port), timeout=30)
    sock.sendall(b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\nheart-beat:0,0\n\n\0")
    data = b""
    while b"\0" not in data:
        data += sock.recv(65536)
    if not data.lstrip(b"\n").startswith(b"CONNECTED"):
        raise ConnectionError(data[:300])
    flag = "persistent:true\n" if persistent else ""
    one = (f"SEND\ndestination:/queue/{queue}\n{flag}content-length:{len(body)}\n\n").encode()
    one += body + b"\0"

    def events(stats: dict) -> None:
        got = sock.recv(65536)
        if not got:
            raise ConnectionError("the broker closed the connection")
        if got.lstrip(b"\n").startswith(b"ERROR"):
            raise ConnectionError(got[:300])

    return _pump(sock, one, count, events)


def _pump(sock: socket.socket, one: bytes, count: int, events) -> dict:
    """Write ``count`` copies of ``one`` as fast as the socket takes them."""
    stats = {"blocked": 0, "unblocked": 0, "pauses": 0, "paused_s": 0.0}
    sock.setblocking(False)
    chunk = memoryview(one * CHUNK)
    sent = 0
    pending = memoryview(b"")
    t0 = time.monotonic()
    waiting_since = None
    while sent < count or pending:
        if not pending:
            n = min(CHUNK, count - sent)
            pending = chunk if n == CHUNK else memoryview(one * n)
            sent += n
        readable, writable, _ = select.select([sock], [sock], [], 1.0)
        if readable:
            events(stats)
        if writable:
            if waiting_since is not None:
                waited = time.monotonic() - waiting_since
                if waited >= STALL_S:
                    stats["pauses"] += 1
                    stats["paused_s"] += waited
                waiting_since = None
            try:
                done = sock.send(pending)
            except BlockingIOError:
                done = 0
            pending = pending[done:]
        elif waiting_since is None:
            waiting_since = time.monotonic()
    stats["publish_s"] = time.monotonic() - t0
    stats["sock"] = sock
    return stats


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--protocol", choices=("amqp", "stomp"), default="amqp")
    parser.add_argument("--count", type=int, default=2_000_000)
    parser.add_argument("--size", type=int, default=1024, help="body bytes")
    parser.add_argument("--after", type=float, default=60.0, help="seconds to wait after the flood")
    parser.add_argument("--interval", type=float, default=0.5, help="RSS sampling, seconds")
    parser.add_argument("--src", help="another leveret src/ for the broker (before/after)")
    parser.add_argument("--broker-arg", action="append", default=[], help="a leveret server option")
    parser.add_argument("--verify", action="store_true", help="consume everything at the end and count")
    parser.add_argument(
        "--transient", action="store_true", help="transient messages (delivery_mode 1; STOMP: no persistent)"
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="give up after this many seconds")
    args = parser.parse_args()

    # the broker runs in a temporary directory: this tree's src/ by absolute path (a
    # relative PYTHONPATH would fall back to whatever leveret is installed)
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    broker = Leveret(src=os.path.abspath(args.src or here), extra_args=args.broker_arg)
    broker.start()
    sampler = Sampler(broker, args.interval)
    try:
        rss0 = broker.rss_bytes()
        cpu0 = broker.cpu_seconds()
        sampler.start()
        body = os.urandom(args.size // 2).hex().encode()[: args.size]
        queue = "flood"
        if args.protocol == "amqp":
            stats = amqp_flood(broker.host, broker.port, queue, args.count, body, not args.transient)
        else:
            if args.protocol == "stomp":
                # the queue must be durable for persistent messages to go to the store
                sock, buf = amqp_open(broker.host, broker.port)
                sock.sendall(frame.marshal(commands.Queue.Declare(queue=queue, durable=True), 1))
                _wait_for(sock, buf, commands.Queue.DeclareOk)
                sock.close()
            stats = stomp_flood(broker.host, broker.stomp_port, queue, args.count, body, not args.transient)
        written = time.monotonic()
        deadline = written + args.timeout
        while (got := amqp_count(broker.host, broker.port, queue)) < args.count:
            if time.monotonic() > deadline:
                break
            time.sleep(0.5)
        taken_in = time.monotonic()
        rss_end = broker.rss_bytes()
        peak = sampler.peak()
        cpu = broker.cpu_seconds() - cpu0
        stats.pop("sock").close()
        time.sleep(args.after)
        rss_after = broker.rss_bytes()
        cpu_total = broker.cpu_seconds() - cpu0
        holds = flow_holds(broker)
        result = {
            "protocol": args.protocol,
            "delivery": "transient" if args.transient else "persistent",
            "src": broker.src,
            "broker_args": args.broker_arg,
            "messages": args.count,
            "queued": got,
            "body_bytes": args.size,
            "rss_start_mb": round(rss0 / MB, 1),
            "rss_peak_mb": round(peak / MB, 1),
            "rss_end_mb": round(rss_end / MB, 1),
            f"rss_after_{args.after:g}s_mb": round(rss_after / MB, 1),
            "flood_s": round(taken_in - sampler.t0, 1),
            "broker_cpu_s": round(cpu, 1),
            "broker_cpu_us_per_msg": round(cpu / args.count * 1e6, 1),
            # with what the store still had to write when the last message was taken in
            f"broker_cpu_s_incl_after_{args.after:g}s": round(cpu_total, 1),
            "flow_holds": holds,
            "connection_blocked": stats["blocked"],
            "connection_unblocked": stats["unblocked"],
            "publisher_pauses": stats["pauses"],
            "publisher_paused_s": round(stats["paused_s"], 1),
        }
        if args.verify:  # consume everything, then see what memory is given back
            result["consumed"] = amqp_drain(broker.host, broker.port, queue, args.count)
            result["rss_drained_mb"] = round(broker.rss_bytes() / MB, 1)
            time.sleep(args.after)
            result[f"rss_drained_after_{args.after:g}s_mb"] = round(broker.rss_bytes() / MB, 1)
        timeline = [(round(t, 1), round(rss / MB)) for t, rss in sampler.samples]
        step = max(1, len(timeline) // 40)
        print(json.dumps(result, indent=1))
        print("rss timeline (s, MB):", json.dumps(timeline[::step]))
    finally:
        sampler.stop.set()
        broker.stop()


def flow_holds(broker: Leveret) -> int | None:
    """``leveret_publisher_flow_holds_total`` from the broker's Prometheus metrics
    (None: a tree without flow control)."""
    url = broker.prometheus_url(timeout=1.0)
    if url is None:
        return None
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith("leveret_publisher_flow_holds_total "):
                return int(float(line.split()[1]))
    return None


def amqp_drain(host: str, port: int, queue: str, expected: int) -> int:
    """Consume ``queue`` with auto-ack until it is empty; the messages received."""
    sock, buf = amqp_open(host, port)
    sock.sendall(frame.marshal(commands.Basic.Qos(prefetch_count=0), 1))
    sock.sendall(frame.marshal(commands.Basic.Consume(queue=queue, no_ack=True), 1))
    got = 0
    sock.settimeout(5.0)
    head = struct.Struct(">BHI")
    data = buf  # what the handshake read past channel.open-ok
    try:
        while got < expected:
            chunk = sock.recv(1 << 20)
            if not chunk:
                break
            data += chunk
            pos = 0
            while len(data) - pos >= 7:
                kind, _ch, size = head.unpack_from(data, pos)
                if len(data) - pos < size + 8:
                    break
                if kind == 1 and data[pos + 7 : pos + 11] == b"\x00\x3c\x00\x3c":  # basic.deliver
                    got += 1
                pos += size + 8
            del data[:pos]
    except TimeoutError:
        pass
    finally:
        sock.close()
    return got


if __name__ == "__main__":
    main()
