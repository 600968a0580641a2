"""Pre-login work a hostile client can make leveret do (issue 27, items 2 and 4).

Four probes against a private ``leveret server`` (bench/brokers.py), each printing
what the broker spent, measured from ``/proc`` (CPU: utime + stime; RSS: VmRSS):

* ``stomp-rss``: ``--sockets`` (10) STOMP sockets each send a CONNECT with
  ``content-length: 104857600`` and then stream that body (1 MiB writes) until the
  broker closes them. Printed: RSS before, peak, 2 s after they closed; how many
  got an ERROR frame and how many bytes the broker took before refusing.
* ``stomp-heartbeat``: ``--clients`` (200) STOMP clients log in with
  ``heart-beat:0,1`` (they want a server heart-beat every 1 ms) and read for
  ``--seconds`` (3). Printed: the CONNECTED ``heart-beat`` header, the heart-beats
  received per client per second, and the broker's CPU (100% = one core).
* ``amqp-deep``: ``--connections`` (200) AMQP connections each send a
  connection.start-ok whose client-properties nest tables as deep as the frame
  allows (``--deep-bytes``: 131064, the default frame_max's payload, and 4088, the
  pre-tune limit's), one after the other. Printed: the broker's CPU per refused
  connection (ms), next to a valid login's (start-ok, tune-ok, open, close).
* ``amqp-oversize``: a start-ok of 5,000 bytes (over RabbitMQ's 4,096 pre-tune
  frame_max): what the broker answers.

Usage (``--src`` runs another tree's broker, e.g. ``/work/main/src``, for a "before")::

    PYTHONPATH=src python bench/prelogin_probe.py [--src DIR] [--probes stomp-rss,stomp-heartbeat,amqp-deep]
"""

from __future__ import annotations

import argparse
import os
import selectors
import socket
import struct
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from brokers import Leveret, RabbitMQ  # noqa: E402

MB = 1024 * 1024
PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"


# ---------------------------------------------------------------------------- AMQP bytes
def _shortstr(text: str) -> bytes:
    data = text.encode()
    return bytes((len(data),)) + data


def _longstr(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def method_frame(channel: int, class_id: int, method_id: int, arguments: bytes) -> bytes:
    payload = struct.pack(">HH", class_id, method_id) + arguments
    return struct.pack(">BHI", 1, channel, len(payload)) + payload + b"\xce"


def deep_table(payload_bytes: int) -> bytes:
    """A field table nesting tables (``{"a": {"a": ...}}``) as deep as fits in a
    start-ok payload of ``payload_bytes``."""
    # start-ok = ids (4) + table + "PLAIN" (6) + response (4 + 12) + "en_US" (6)
    room = payload_bytes - 4 - 6 - 16 - 6
    depth = (room - 4) // 7  # each level: key length, "a", "F", table size
    table = struct.pack(">I", 0)
    for _ in range(depth):
        entry = b"\x01aF" + table
        table = struct.pack(">I", len(entry)) + entry
    return table


def start_ok(table: bytes) -> bytes:
    return method_frame(
        0, 10, 11, table + _shortstr("PLAIN") + _longstr(b"\x00guest\x00guest") + _shortstr("en_US")
    )


def read_until_closed(sock: socket.socket, timeout: float = 10.0) -> bytes:
    """Everything the broker sends until it closes the socket (or ``timeout``)."""
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except OSError:
        pass
    return data


def read_frame(sock: socket.socket) -> tuple[int, bytes]:
    """One frame: (type, payload)."""
    head = b""
    while len(head) < 7:
        chunk = sock.recv(7 - len(head))
        if not chunk:
            raise ConnectionError("closed")
        head += chunk
    kind, _, size = struct.unpack(">BHI", head)
    rest = b""
    while len(rest) < size + 1:
        chunk = sock.recv(size + 1 - len(rest))
        if not chunk:
            raise ConnectionError("closed")
        rest += chunk
    return kind, rest[:size]


def amqp_login(host: str, port: int) -> None:
    """A valid login and a clean close (the reference cost)."""
    with socket.create_connection((host, port)) as sock:
        sock.sendall(PROTOCOL_HEADER)
        read_frame(sock)  # start
        sock.sendall(start_ok(struct.pack(">I", 0)))
        _, tune = read_frame(sock)
        channel_max, frame_max, _ = struct.unpack(">HIH", tune[4:12])
        sock.sendall(method_frame(0, 10, 31, struct.pack(">HIH", channel_max, frame_max, 0)))
        sock.sendall(method_frame(0, 10, 40, _shortstr("/") + _shortstr("") + b"\x00"))
        read_frame(sock)  # open-ok
        sock.sendall(method_frame(0, 10, 50, struct.pack(">H", 200) + _shortstr("bye") + b"\0\0\0\0"))
        read_frame(sock)  # close-ok


def amqp_refused(host: str, port: int, frame: bytes) -> bytes:
    """Send ``frame`` after the protocol header; what the broker says before it closes."""
    with socket.create_connection((host, port)) as sock:
        sock.sendall(PROTOCOL_HEADER)
        read_frame(sock)  # start
        try:
            sock.sendall(frame)
        except OSError:
            pass
        data = b""
        try:  # a client answers connection.close with close-ok; the broker then closes
            kind, payload = read_frame(sock)
            data = struct.pack(">BHI", kind, 0, len(payload)) + payload + b"\xce"
            if payload[:4] == b"\x00\x0a\x00\x32":
                sock.sendall(method_frame(0, 10, 51, b""))
        except OSError:
            pass
        return data + read_until_closed(sock)


def close_reason(data: bytes) -> str:
    """The connection.close reply code and text in ``data``, if any."""
    at = data.find(b"\x00\x0a\x00\x32")
    if at == -1:
        return "closed without connection.close" if not data else f"{len(data)} B, no close"
    code = struct.unpack(">H", data[at + 4 : at + 6])[0]
    text = data[at + 7 : at + 7 + data[at + 6]].decode(errors="replace")
    return f"{code} {text}"


# ---------------------------------------------------------------------------- probes
def probe_stomp_rss(broker: Leveret, sockets: int, body: int) -> None:
    head = (
        b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n"
        b"content-length:%d\n\n" % body
    )
    chunk = b"x" * MB
    results: list[tuple[int, bool, float]] = []
    lock = threading.Lock()

    def one() -> None:
        sent, error, t0 = 0, False, time.monotonic()
        with socket.create_connection((broker.host, broker.stomp_port)) as sock:
            try:
                sock.sendall(head)
                while sent < body:
                    sock.sendall(chunk[: min(MB, body - sent)])
                    sent += min(MB, body - sent)
            except OSError:
                pass
            answer = read_until_closed(sock, timeout=1.0 if sent >= body else 10.0)
            error = answer.startswith(b"ERROR")
        with lock:
            results.append((sent, error, time.monotonic() - t0))

    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], broker.rss_bytes())
            time.sleep(0.01)

    before = broker.rss_bytes()
    sampler = threading.Thread(target=sample)
    sampler.start()
    threads = [threading.Thread(target=one) for _ in range(sockets)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    time.sleep(2.0)
    done.set()
    sampler.join()
    after = broker.rss_bytes()
    refused = sum(1 for _, error, _ in results if error)
    taken = max(sent for sent, _, _ in results)
    slowest = max(seconds for _, _, seconds in results)
    print(
        f"stomp-rss: {sockets} sockets x CONNECT content-length {body}: RSS before {before / MB:.0f} MB, "
        f"peak {peak[0] / MB:.0f} MB (+{(peak[0] - before) / MB:.0f}), 2 s after close "
        f"{after / MB:.0f} MB (+{(after - before) / MB:.0f}); ERROR frames {refused}/{sockets}; "
        f"most body bytes written before refusal {taken / MB:.1f} MB; slowest socket {slowest:.2f} s"
    )


def probe_stomp_heartbeat(broker: Leveret, clients: int, seconds: float) -> None:
    selector = selectors.DefaultSelector()
    socks = []
    connected_header = ""
    for _ in range(clients):
        sock = socket.create_connection((broker.host, broker.stomp_port))
        sock.sendall(b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\nheart-beat:0,1\n\n\0")
        data = b""
        while b"\0" not in data:
            data += sock.recv(4096)
        for line in data.split(b"\0")[0].decode().split("\n"):
            if line.startswith("heart-beat:"):
                connected_header = line
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ)
        socks.append(sock)
    received = 0
    cpu0, t0 = broker.cpu_seconds(), time.monotonic()
    while time.monotonic() - t0 < seconds:
        for key, _ in selector.select(0.05):
            try:
                received += len(key.fileobj.recv(65536))  # type: ignore[union-attr]
            except BlockingIOError:
                pass
    cpu, wall = broker.cpu_seconds() - cpu0, time.monotonic() - t0
    for sock in socks:
        selector.unregister(sock)
        sock.close()
    print(
        f"stomp-heartbeat: {clients} clients heart-beat:0,1 -> CONNECTED {connected_header}; "
        f"{received / clients / wall:.0f} heart-beats/s per client; "
        f"broker CPU {100 * cpu / wall:.0f}% of a core"
    )


def probe_amqp_deep(broker: Leveret, connections: int, sizes: list[int]) -> None:
    cpu0 = broker.cpu_seconds()
    for _ in range(connections):
        amqp_login(broker.host, broker.port)
    login_ms = 1000 * (broker.cpu_seconds() - cpu0) / connections
    print(f"amqp-deep: a valid login costs {login_ms:.2f} ms of broker CPU ({connections} logins)")
    for size in sizes:
        frame = start_ok(deep_table(size))
        answers = set()
        cpu0 = broker.cpu_seconds()
        for _ in range(connections):
            answers.add(close_reason(amqp_refused(broker.host, broker.port, frame)))
        ms = 1000 * (broker.cpu_seconds() - cpu0) / connections
        print(
            f"amqp-deep: start-ok of {len(frame)} B nesting tables: {ms:.2f} ms of broker CPU per "
            f"refused connection ({connections}); answers: {'; '.join(sorted(answers))[:200]}"
        )


def probe_amqp_oversize(broker: Leveret) -> None:
    table = struct.pack(">I", 4990) + b"\x01aS" + _longstr(b"x" * 4983)
    frame = start_ok(table)
    answer = close_reason(amqp_refused(broker.host, broker.port, frame))
    print(f"amqp-oversize: start-ok frame of {len(frame)} B before tune: {answer}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", help="another tree's src/ for the broker (a 'before')")
    parser.add_argument("--probes", default="stomp-rss,stomp-heartbeat,amqp-deep,amqp-oversize")
    parser.add_argument("--sockets", type=int, default=10)
    parser.add_argument("--body", type=int, default=100 * MB)
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--connections", type=int, default=200)
    parser.add_argument("--deep-bytes", default="131064,4088")
    parser.add_argument("--rabbitmq", action="store_true", help="ask a private RabbitMQ node instead")
    args = parser.parse_args()
    probes = args.probes.split(",")
    if args.rabbitmq:  # what RabbitMQ answers (its STOMP plugin is not enabled here)
        with RabbitMQ() as rabbit:
            print(f"RabbitMQ (pid {rabbit.pid})")
            if "amqp-oversize" in probes:
                probe_amqp_oversize(rabbit)  # type: ignore[arg-type]
            if "amqp-deep" in probes:
                probe_amqp_deep(rabbit, args.connections, [4088])  # type: ignore[arg-type]
        return
    with Leveret(src=args.src) as broker:
        print(f"leveret from {args.src or 'this tree'} (pid {broker.pid}); pure Python: "
              f"{os.environ.get('LEVERET_PURE_PYTHON', '0')}")
        if "amqp-deep" in probes:
            probe_amqp_deep(broker, args.connections, [int(s) for s in args.deep_bytes.split(",")])
        if "amqp-oversize" in probes:
            probe_amqp_oversize(broker)
        if "stomp-heartbeat" in probes:
            probe_stomp_heartbeat(broker, args.clients, args.seconds)
        if "stomp-rss" in probes:
            probe_stomp_rss(broker, args.sockets, args.body)


if __name__ == "__main__":
    main()
