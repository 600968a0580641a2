"""Memory back-pressure, as RabbitMQ's vm_memory_high_watermark: a publisher flooding a
queue nobody consumes (no confirms) makes queues page out, then is blocked, and the
broker's resident memory stays near its watermark instead of growing with the flood."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pika
from amqp_raw import connected
from pamqp import commands
from servers import ServerProcess

MB = 1024 * 1024
HEADROOM = 120 * MB  # the watermark: this much above the idle broker
FLOOD = 600_000  # 1 KiB messages: 600 MB, five times the headroom


def resident(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as statm:
        return int(statm.read().split()[1]) * 4096


def test_a_flood_without_confirms_is_paged_out_and_blocked_under_the_watermark(tmp_path: Path):
    probe = ServerProcess(tmp_path / "probe")
    idle = resident(probe.proc.pid)
    probe.kill()
    config = tmp_path / "leveret.toml"
    config.write_text(f"[server]\nvm_memory_high_watermark_absolute = {idle + HEADROOM}\n")
    server = ServerProcess(tmp_path / "data", "--config", str(config))
    peak, sent = [0], [0]
    try:
        client = connected(server.port)
        client.send_method(1, commands.Queue.Declare(queue="flood"))
        client.expect(commands.Queue.DeclareOk, 1)
        chunk = client.publish_frames(1, "flood", b"x" * 1024) * 1000
        client.sock.settimeout(2)
        done = threading.Event()

        def watch() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], resident(server.proc.pid))
                time.sleep(0.05)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        deadline = time.monotonic() + 60
        try:
            while sent[0] < FLOOD and time.monotonic() < deadline:
                client.sock.sendall(chunk)
                sent[0] += 1000
        except TimeoutError:
            pass  # blocked: the broker stopped reading this publisher
        time.sleep(1)
        done.set()
        watcher.join()
        log = server.log_path.read_text()
        assert "memory pressure: paging messages out" in log
        assert peak[0] < idle + HEADROOM * 1.5, (peak[0] - idle) / MB
        # whatever was read is in the queue: another connection counts it
        other = connected(server.port)
        other.send_method(1, commands.Queue.Declare(queue="flood", passive=True))
        count = other.expect(commands.Queue.DeclareOk, 1).message_count
        assert 0 < count <= sent[0]
    finally:
        server.kill()


def test_a_consumer_that_never_reads_costs_a_bounded_buffer(tmp_path: Path):
    """With prefetch unlimited, a consumer that never reads its socket gets what its
    socket buffers hold, not the whole backlog copied into the broker's memory."""
    server = ServerProcess(tmp_path / "data")
    try:
        publisher = connected(server.port)
        publisher.send_method(1, commands.Queue.Declare(queue="backlog"))
        publisher.expect(commands.Queue.DeclareOk, 1)
        chunk = publisher.publish_frames(1, "backlog", b"x" * 1024) * 1000
        for _ in range(100):
            publisher.send(chunk)
        publisher.send_method(1, commands.Queue.Declare(queue="backlog", passive=True))
        assert publisher.expect(commands.Queue.DeclareOk, 1).message_count == 100_000
        before = resident(server.proc.pid)
        lazy = connected(server.port)
        lazy.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        lazy.send_method(1, commands.Basic.Consume(queue="backlog", consumer_tag="lazy"))
        time.sleep(3)  # it never reads
        grown = resident(server.proc.pid) - before
        assert grown < 30 * MB, grown / MB  # was: the whole backlog (~130 MB here)
        publisher.send_method(1, commands.Queue.Declare(queue="backlog", passive=True))
        assert publisher.expect(commands.Queue.DeclareOk, 1).consumer_count == 1  # still served
    finally:
        server.kill()


def test_memory_of_large_acked_messages_is_given_back(tmp_path: Path):
    """Three 40 MB persistent messages, stored, read and acked: the broker's resident
    memory comes back near where it started (SQLite kept a copy of the last message in
    a cached statement's bindings before)."""
    server = ServerProcess(tmp_path / "data")
    try:
        idle = resident(server.proc.pid)
        connection = pika.BlockingConnection(pika.URLParameters(server.url))
        channel = connection.channel()
        channel.queue_declare("large", durable=True)
        channel.confirm_delivery()
        body = b"x" * (40 * MB)
        for _ in range(3):
            channel.basic_publish("", "large", body, pika.BasicProperties(delivery_mode=2))
        for _ in range(3):
            _method, _, got = channel.basic_get("large", auto_ack=True)
            assert got == body
        connection.close()
        time.sleep(1)
        assert resident(server.proc.pid) - idle < 30 * MB, (resident(server.proc.pid) - idle) / MB
    finally:
        server.kill()
