"""Memory under a publish flood (issue 27): a publisher floods a durable queue nobody
consumes with persistent messages. The queue keeps a bounded window of them in memory
(the rest only in the store), the store's backlog of unwritten messages is bounded by
flow control (publishers are not read while it is above ``store_flow_high``, and are
again under ``store_flow_low``), so the broker's resident memory stays flat, and every
message confirmed is there to consume. The full-size probe is bench/flood_memory.py."""

from __future__ import annotations

from pathlib import Path

from amqp_raw import connected
from floods import (
    CHUNK,
    MB,
    SMALL_FLOW_MARKS,
    declare,
    drain as drain_frames,
    flood_started,
    metric,
    read_confirms,
    start as start_broker,
    stomp_connected,
)
from pamqp import commands
from servers import ServerProcess
from stomp_clients import read_raw_frame

BODY = b"x" * 1024
#: What the broker may grow by. Without the in-memory window and flow control a
#: 150,000-message flood grew it by ~250 MB (~1.7 KB a message).
GROWTH = 150 * MB


def start(tmp_path: Path) -> tuple[ServerProcess, str]:
    """A broker with small flow-control marks, so a flood on this machine engages them
    however fast the disk is; and its Prometheus URL."""
    return start_broker(tmp_path, SMALL_FLOW_MARKS)


def drain(port: int, queue: str, expected: int) -> int:
    """Consume ``queue`` (no-ack) until ``expected`` deliveries or 5 s of silence."""
    got = [0]

    def delivered(kind: int, frame: bytes) -> bool:
        got[0] += kind == 1 and frame[7:11] == b"\x00\x3c\x00\x3c"  # basic.deliver
        return got[0] >= expected

    drain_frames(port, queue, delivered)
    return got[0]


def test_an_amqp_flood_is_held_by_flow_control_in_flat_memory_and_loses_nothing(tmp_path: Path):
    """150,000 × 1 KB persistent messages with publisher confirms, no consumer: the
    publisher is held (flow control) and resumed until all are confirmed, the broker
    grows by less than GROWTH, and a consumer then gets every one."""
    flood = 150_000
    server, metrics = start(tmp_path)
    try:
        idle, watcher = flood_started(server)
        client = connected(server.port)
        client.send_method(1, commands.Confirm.Select())
        client.expect(commands.Confirm.SelectOk, 1)
        persistent = commands.Basic.Properties(delivery_mode=2)
        chunk = client.publish_frames(1, "flood", BODY, properties=persistent) * CHUNK
        reader, confirmed = read_confirms(client, flood)
        for _ in range(flood // CHUNK):
            client.sock.sendall(chunk)
        reader.join(60)
        peak = watcher.stop()
        assert confirmed[0] == flood
        assert metric(metrics, "leveret_publisher_flow_holds_total") > 0  # held, then resumed
        assert metric(metrics, "leveret_store_backlog_bytes") == 0
        assert peak - idle < GROWTH, f"grew by {(peak - idle) / MB:.0f} MB"
        client.close()
        assert declare(server.port, "flood", passive=True) == flood
        assert drain(server.port, "flood", flood) == flood
    finally:
        server.kill()


def test_a_stomp_flood_is_held_by_flow_control_in_flat_memory_and_loses_nothing(tmp_path: Path):
    """60,000 persistent SENDs, the last with a receipt: the connection stops being
    read while the store lags (STOMP has no connection.blocked), the receipt comes once
    all are stored, the broker grows by less than GROWTH, and all are consumed."""
    flood = 60_000
    server, metrics = start(tmp_path)
    try:
        idle, watcher = flood_started(server)
        assert server.stomp_port is not None
        sock = stomp_connected(server.stomp_port)
        send = b"SEND\ndestination:/queue/flood\npersistent:true\ncontent-length:1024\n\n" + BODY + b"\0"
        for _ in range(flood // CHUNK - 1):
            sock.sendall(send * CHUNK)
        sock.sendall(send * (CHUNK - 1) + send.replace(b"\n\n", b"\nreceipt:last\n\n", 1))
        reply = read_raw_frame(sock, 60)
        assert reply.startswith(b"RECEIPT") and b"receipt-id:last" in reply
        peak = watcher.stop()
        assert metric(metrics, "leveret_publisher_flow_holds_total") > 0
        assert peak - idle < GROWTH, f"grew by {(peak - idle) / MB:.0f} MB"
        sock.close()
        assert declare(server.port, "flood", passive=True) == flood
        assert drain(server.port, "flood", flood) == flood
    finally:
        server.kill()
