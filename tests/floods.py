"""Shared by the flood tests (tests/integration/test_flood_memory.py and
test_transient_flood.py): a broker started with a config file's ``[server]`` lines and
its Prometheus URL, the broker's resident size and its peak, a durable queue declared,
publisher confirms read, and a queue drained frame by frame."""

from __future__ import annotations

import socket
import struct
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from amqp_raw import RawClient, connected
from pamqp import commands
from servers import ServerProcess

MB = 1024 * 1024
CHUNK = 1000  # messages per write
#: small flow-control marks (1 MiB / 512 KiB), so a flood engages them however fast the disk is
SMALL_FLOW_MARKS = "store_flow_high = 1048576\nstore_flow_low = 524288\n"


def resident(pid: int) -> int:
    """Bytes of the process's resident memory."""
    with open(f"/proc/{pid}/statm") as statm:
        return int(statm.read().split()[1]) * 4096


def start(tmp_path: Path, server_settings: str) -> tuple[ServerProcess, str]:
    """A broker whose config file's ``[server]`` table has ``server_settings`` (lines);
    and its Prometheus URL."""
    config = tmp_path / "leveret.toml"
    config.write_text("[server]\n" + server_settings)
    server = ServerProcess(tmp_path / "data", "--config", str(config))
    for _ in range(10):
        line = server.proc.stdout.readline()
        if line.startswith("leveret prometheus:"):
            return server, line.split()[-1]
    server.kill()
    raise AssertionError("no Prometheus line")


def metric(url: str, name: str) -> float:
    """The value of the unlabelled series ``name`` at ``url``."""
    with urllib.request.urlopen(url, timeout=10) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"{name} not in {url}")


class PeakWatcher(threading.Thread):
    """The process's peak resident memory, sampled every 50 ms until :meth:`stop`."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak, self.done = pid, 0, threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            self.peak = max(self.peak, resident(self.pid))
            time.sleep(0.05)

    def stop(self) -> int:
        self.done.set()
        self.join()
        return self.peak


def declare(port: int, queue: str, passive: bool = False) -> int:
    """Declare the durable ``queue``; its message count."""
    client = connected(port)
    client.send_method(1, commands.Queue.Declare(queue=queue, durable=True, passive=passive))
    count = client.expect(commands.Queue.DeclareOk, 1).message_count
    client.close()
    return count


def read_confirms(client: RawClient, expected: int) -> tuple[threading.Thread, list[int]]:
    """A started thread reading ``client``'s basic.acks until ``expected`` are confirmed
    (AssertionError on a nack), and the one-item list of the highest confirmed tag."""
    confirmed = [0]

    def run() -> None:
        while confirmed[0] < expected:
            _, value = client.read_frame()
            if isinstance(value, commands.Basic.Ack):
                confirmed[0] = value.delivery_tag  # in order: multiple or not
            elif isinstance(value, commands.Basic.Nack):
                raise AssertionError(f"nack {value.delivery_tag}")

    client.sock.settimeout(30)
    reader = threading.Thread(target=run, daemon=True)
    reader.start()
    return reader, confirmed


def drain(port: int, queue: str, done: Callable[[int, bytes], bool]) -> None:
    """Consume ``queue`` (no-ack), calling ``done(kind, frame)`` with each frame's type
    and bytes (header included), until it returns True or 5 s pass in silence."""
    client = connected(port)
    client.send_method(1, commands.Basic.Consume(queue=queue, no_ack=True))
    client.expect(commands.Basic.ConsumeOk, 1)
    sock, data = client.sock, bytearray(client.buffer)
    sock.settimeout(5)
    try:
        while True:
            pos = 0
            while len(data) - pos >= 7:
                kind, _, size = struct.unpack_from(">BHI", data, pos)
                if len(data) - pos < size + 8:
                    break
                if done(kind, bytes(data[pos : pos + size + 8])):
                    return
                pos += size + 8
            del data[:pos]
            chunk = sock.recv(1 << 20)
            if not chunk:
                return
            data += chunk
    except TimeoutError:
        pass
    finally:
        client.close()


def stomp_connected(port: int) -> socket.socket:
    """A raw STOMP 1.2 socket logged in as guest (30 s timeout on reads)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\0")
    assert sock.recv(4096).startswith(b"CONNECTED")
    return sock


def flood_started(server: ServerProcess, queue: str = "flood") -> tuple[int, PeakWatcher]:
    """Declare the durable ``queue``; the broker's resident size now, and a started
    watcher of its peak from now on."""
    declare(server.port, queue)
    idle = resident(server.proc.pid)
    watcher = PeakWatcher(server.proc.pid)
    watcher.start()
    return idle, watcher
