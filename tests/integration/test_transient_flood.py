"""Memory under a flood of transient messages (issue 27): past the queue memory budget
(``queue_memory_budget``, here 8 MiB) the broker pages queues to the store, transient
messages too, so the store's flow control holds the publisher whenever the writer lags
and resident memory stays flat; every message is then consumed, in order. Without the
budget transient messages stayed in memory up to the watermark's paging ratio (GBs).
The full-size probe is ``bench/flood_memory.py --transient``."""

from __future__ import annotations

from pathlib import Path

from amqp_raw import connected
from floods import (
    CHUNK,
    MB,
    SMALL_FLOW_MARKS,
    declare,
    drain,
    flood_started,
    metric,
    read_confirms,
    start as start_broker,
    stomp_connected,
)
from pamqp import commands
from servers import ServerProcess
from stomp_clients import read_raw_frame

#: What the broker may grow by. Without the budget 100,000 transient 1 KB messages
#: grew it by ~140 MB (~1.4 KB a message), all of it kept.
GROWTH = 80 * MB
BUDGET = 8 * MB


def body(i: int) -> bytes:
    return b"%08d" % i + b"t" * 1016


def start(tmp_path: Path) -> tuple[ServerProcess, str]:
    """A broker with an 8 MiB queue memory budget and small flow-control marks; and
    its Prometheus URL."""
    return start_broker(tmp_path, f"queue_memory_budget = {BUDGET}\n" + SMALL_FLOW_MARKS)


def drain_bodies(port: int, queue: str, expected: int) -> list[bytes]:
    """Consume ``queue`` (no-ack) until ``expected`` bodies or 5 s of silence; the
    bodies in delivery order (each fits one body frame)."""
    bodies: list[bytes] = []

    def body_frame(kind: int, frame: bytes) -> bool:
        if kind == 3:
            bodies.append(frame[7:-1])
        return len(bodies) >= expected

    drain(port, queue, body_frame)
    return bodies


def check_consumed_in_order(server: ServerProcess, metrics: str, flood: int) -> None:
    assert declare(server.port, "flood", passive=True) == flood
    bodies = drain_bodies(server.port, "flood", flood)
    assert len(bodies) == flood
    assert all(got == body(i) for i, got in enumerate(bodies)), "out of order or altered"
    assert metric(metrics, "leveret_queue_memory_bytes") == 0


def test_an_amqp_transient_flood_pages_past_the_budget_is_held_and_loses_nothing(tmp_path: Path):
    """100,000 × 1 KB transient messages with publisher confirms, no consumer: past the
    budget they are paged to the store, the publisher is held by flow control and
    resumed until all are confirmed, the broker grows by less than GROWTH, and a
    consumer gets every one in order."""
    flood = 100_000
    server, metrics = start(tmp_path)
    try:
        assert metric(metrics, "leveret_queue_memory_budget_bytes") == BUDGET
        idle, watcher = flood_started(server)
        client = connected(server.port)
        client.send_method(1, commands.Confirm.Select())
        client.expect(commands.Confirm.SelectOk, 1)
        transient = commands.Basic.Properties(delivery_mode=1)
        reader, confirmed = read_confirms(client, flood)
        for start_at in range(0, flood, CHUNK):
            frames = [
                client.publish_frames(1, "flood", body(i), properties=transient)
                for i in range(start_at, start_at + CHUNK)
            ]
            client.sock.sendall(b"".join(frames))
        reader.join(60)
        peak = watcher.stop()
        assert confirmed[0] == flood
        # transient messages went to the store (paged), so the store's lag held the publisher
        assert metric(metrics, "leveret_publisher_flow_holds_total") > 0
        assert peak - idle < GROWTH, f"grew by {(peak - idle) / MB:.0f} MB"
        client.close()
        check_consumed_in_order(server, metrics, flood)
    finally:
        server.kill()


def test_a_stomp_transient_flood_pages_past_the_budget_is_held_and_loses_nothing(tmp_path: Path):
    """60,000 SENDs without ``persistent:true``, the last with a receipt: paged past
    the budget, the connection stops being read while the store lags, the receipt
    comes, the broker grows by less than GROWTH, and all are consumed in order."""
    flood = 60_000
    server, metrics = start(tmp_path)
    try:
        idle, watcher = flood_started(server)
        assert server.stomp_port is not None
        sock = stomp_connected(server.stomp_port)

        def send(i: int, extra: bytes = b"") -> bytes:
            return b"SEND\ndestination:/queue/flood\ncontent-length:1024\n" + extra + b"\n" + body(i) + b"\0"

        for start_at in range(0, flood - CHUNK, CHUNK):
            sock.sendall(b"".join(send(i) for i in range(start_at, start_at + CHUNK)))
        last = flood - 1
        sock.sendall(b"".join(send(i) for i in range(flood - CHUNK, last)) + send(last, b"receipt:last\n"))
        reply = read_raw_frame(sock, 60)
        assert reply.startswith(b"RECEIPT") and b"receipt-id:last" in reply
        peak = watcher.stop()
        assert metric(metrics, "leveret_publisher_flow_holds_total") > 0
        assert peak - idle < GROWTH, f"grew by {(peak - idle) / MB:.0f} MB"
        sock.close()
        check_consumed_in_order(server, metrics, flood)
    finally:
        server.kill()
