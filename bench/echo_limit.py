"""The physical limit of one Python process here: how many AMQP-framed messages a
uvloop ``Protocol`` can receive (and send back) per second.

A sender process (this script with ``--send``) writes the frames of one
``basic.publish`` with a ``--body-size`` (16) byte body (method + content header +
body frame, 3 frames) over loopback TCP, repeated as fast as a blocking ``sendall``
of a 256 KiB buffer goes (C speed: not the bottleneck); the sink, this process on
uvloop, does one of:

* ``bytes``: only counts the bytes in ``data_received`` (messages = bytes ÷ message
  size): the ceiling of the event loop and the socket, with no Python per message;
* ``frames``: walks every frame header with ``struct.unpack_from`` (type, channel,
  size), keeping a partial frame for the next read, and counts content headers: the
  least per-frame work any pure-Python AMQP parser does;
* ``echo``: ``frames`` plus ``transport.write`` of every read back to the sender
  (which reads and drops it): a ceiling for receive + send;
* ``loadgen``: the sender writes ``basic.deliver`` + header + body instead, and the
  sink is the load generator's parser (``loadgen.Connection``) with a no-ack channel,
  as in ``l1-16b``: the most deliveries a load-generator consumer can count.

Each mode runs ``--seconds`` (3); the table gives messages/s, the sink's CPU (100% =
one core) and its µs CPU per message. Usage::

    python bench/echo_limit.py [--seconds 3] [--body-size 16] [--modes bytes,frames,echo,loadgen]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import loadgen  # noqa: E402
from loadgen import message_frames, new_event_loop  # noqa: E402

from leveret.amqp.frames import encode_content, encode_deliver  # noqa: E402

MODES = ("bytes", "frames", "echo", "loadgen")
_HDR = struct.Struct(">BHI")  # frame type, channel, payload size
_CONTENT = struct.Struct(">HHQH")  # content header: class, weight, body size, property flags
FRAME_HEADER = 2


def publish_bytes(body_size: int) -> bytes:
    """One basic.publish (exchange "", routing key ``perf-test``) with a ``body_size`` body."""
    return message_frames(1, "", "perf-test", b"x" * body_size)


def deliver_bytes(body_size: int, tag: int = 1) -> bytes:
    """One basic.deliver on channel 1 (delivery tag ``tag``) with its content header and
    body frames, as a broker sends it to a no-ack consumer of ``perf-test``."""
    header = _CONTENT.pack(60, 0, body_size, 0)
    body = b"x" * body_size
    return encode_deliver(1, b"amq.ctag-bench", tag, False, "", "perf-test") + b"".join(
        encode_content(1, header, body, 131072))


def message_bytes(mode: str, body_size: int) -> bytes:
    """What the sender repeats in ``mode``: deliveries for ``loadgen``, else publishes."""
    return deliver_bytes(body_size) if mode == "loadgen" else publish_bytes(body_size)


# ---------------------------------------------------------------------- sender
def send(port: int, body_size: int, mode: str) -> int:
    """Write ``message_bytes(mode)`` to 127.0.0.1:``port`` until the peer closes; in
    ``echo`` mode a thread reads and drops what comes back."""
    echo = mode == "echo"
    msg = message_bytes(mode, body_size)
    chunk = msg * max(1, (256 << 10) // len(msg))
    sock = socket.create_connection(("127.0.0.1", port))
    if echo:
        def drop() -> None:
            try:
                while sock.recv(1 << 20):
                    pass
            except OSError:
                pass
        threading.Thread(target=drop, daemon=True).start()
    try:
        while True:
            sock.sendall(chunk)
    except OSError:
        return 0


# ------------------------------------------------------------------------ sink
class Sink(asyncio.Protocol):
    """Counts received messages (``mode``: see the module docstring)."""

    def __init__(self, mode: str, msg_size: int) -> None:
        self.mode = mode
        self.msg_size = msg_size
        self.bytes = 0
        self.messages = 0
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        if mode == "loadgen":  # the load generator's parser, as for L1's no-ack consumer
            self.consumer = loadgen.Connection("amqp://guest:guest@127.0.0.1:1/", 1.0,
                                               asyncio.get_running_loop())
            self.channel = loadgen.Channel(self.consumer, 1)
            self.consumer._channels[1] = self.channel
            self.consumer._flush = lambda: None  # a no-ack consumer writes nothing

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    # echo: stop reading while the sender does not read what is sent back
    def pause_writing(self) -> None:
        self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        self.bytes += len(data)
        if self.mode == "bytes":
            return
        if self.mode == "loadgen":
            self.consumer.data_received(data)
            return
        buf = self.buf
        buf += data
        n = len(buf)
        pos = 0
        count = 0
        unpack = _HDR.unpack_from
        while n - pos >= 7:
            ftype, _channel, size = unpack(buf, pos)
            end = pos + 8 + size
            if end > n:
                break
            if ftype == FRAME_HEADER:
                count += 1
            pos = end
        del buf[:pos]
        self.messages += count
        if self.mode == "echo":
            self.transport.write(data)

    def count(self) -> int:
        if self.mode == "loadgen":
            return self.channel.delivered
        return self.bytes // self.msg_size if self.mode == "bytes" else self.messages


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


async def measure(mode: str, body_size: int, seconds: float) -> dict:
    """One mode: start a sender process, count for ``seconds``; returns the figures."""
    loop = asyncio.get_running_loop()
    sink = Sink(mode, len(message_bytes(mode, body_size)))
    connected = loop.create_future()

    def factory() -> Sink:
        if not connected.done():
            connected.set_result(None)
        return sink

    server = await loop.create_server(factory, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    sender = subprocess.Popen([sys.executable, __file__, "--send", str(port), "--body-size", str(body_size),
                               "--modes", mode])
    try:
        await asyncio.wait_for(connected, 30)
        await asyncio.sleep(0.5)  # warm up
        c0, cpu0, t0 = sink.count(), _cpu(), time.perf_counter()
        await asyncio.sleep(seconds)
        c1, cpu1, t1 = sink.count(), _cpu(), time.perf_counter()
    finally:
        if sink.transport is not None:
            sink.transport.abort()
        server.close()
        sender.terminate()
        sender.wait(10)
    n, wall, cpu = c1 - c0, t1 - t0, cpu1 - cpu0
    return {"mode": mode, "body_size": body_size, "messages": n, "seconds": round(wall, 3),
            "msg_per_s": round(n / wall, 1), "sink_cpu_pct": round(100 * cpu / wall, 1),
            "sink_cpu_us_per_msg": round(cpu / n * 1e6, 3) if n else None}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=3.0, help="seconds per mode (default 3)")
    p.add_argument("--body-size", type=int, default=16, help="body bytes (default 16, as LavinMQ's L1)")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated of {', '.join(MODES)}")
    p.add_argument("--output", default=None, help="also write the figures as JSON here")
    p.add_argument("--send", type=int, default=0, metavar="PORT", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if args.send:
        return send(args.send, args.body_size, modes[0])
    unknown = set(modes) - set(MODES)
    if unknown:
        p.error(f"unknown mode(s) {', '.join(sorted(unknown))}; choose from {', '.join(MODES)}")
    loop = new_event_loop()
    try:
        results = [loop.run_until_complete(measure(m, args.body_size, args.seconds)) for m in modes]
    finally:
        loop.close()
    size = len(publish_bytes(args.body_size))
    print(f"one uvloop Protocol, {args.body_size} B bodies ({size} B per publish, 3 frames; "
          f"loadgen: {len(deliver_bytes(args.body_size))} B per delivery):")
    print(f"{'mode':8s} {'msg/s':>12s} {'sink CPU %':>11s} {'µs CPU/msg':>11s}")
    for r in results:
        print(f"{r['mode']:8s} {r['msg_per_s']:>12,.0f} {r['sink_cpu_pct']:>11.0f} "
              f"{r['sink_cpu_us_per_msg'] or 0:>11.3f}")
    if args.output:
        Path(args.output).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
