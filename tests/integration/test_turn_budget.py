"""A big read is handled over several event-loop turns (protocol/turns.py), so timers and
other clients are served in between; nothing is lost or reordered by the split.

A ticker on the broker's loop (a callback that re-schedules itself every turn) samples
the queue's depth while one client's burst is read: handled in one go, a 256 KiB read
of ~70-byte messages would move the depth by thousands between two samples.
"""

from __future__ import annotations

import socket

from amqp_raw import connected
from eventually import eventually_equal
from pamqp import commands

from leveret import BlockingBroker

MESSAGES = 20_000
MAX_STEP = 1_000  # messages handled between two samples, at most (a read holds ~3,700)


class Ticker:
    """Samples ``queue``'s depth once per loop turn until stopped (runs on the loop)."""

    def __init__(self, broker: BlockingBroker, queue: str) -> None:
        self.queue = broker.core.vhosts["/"].queues[queue]
        self.samples: list[int] = []
        self.running = True
        self.loop = broker._loop
        assert self.loop is not None
        self.loop.call_soon_threadsafe(self.tick)

    def tick(self) -> None:
        if self.running:
            self.samples.append(self.queue.message_count)
            self.loop.call_soon(self.tick)

    def largest_step(self) -> int:
        return max(b - a for a, b in zip(self.samples, self.samples[1:], strict=False))


def wait_for_depth(broker: BlockingBroker, queue: str, count: int, timeout: float = 30) -> int:
    q = broker.core.vhosts["/"].queues[queue]
    return eventually_equal(lambda: broker.call(lambda: q.message_count), count, timeout)


def test_an_amqp_burst_is_handled_over_many_turns_in_order():
    with BlockingBroker(amqp_port=0, read_coalesce_ms=0) as broker, connected(broker.amqp_port) as client:
        client.send_method(1, commands.Queue.Declare(queue="q"))
        client.expect(commands.Queue.DeclareOk, 1)
        burst = b"".join(client.publish_frames(1, "q", b"%09d" % i) for i in range(MESSAGES))
        ticker = Ticker(broker, "q")
        client.send(burst)
        assert wait_for_depth(broker, "q", MESSAGES) == MESSAGES
        broker.call(lambda: setattr(ticker, "running", False))
        assert 0 < ticker.largest_step() <= MAX_STEP
        for expected in (0, 1, 2):  # the order is kept across the turns
            client.send_method(1, commands.Basic.Get(queue="q", no_ack=True))
            client.expect(commands.Basic.GetOk, 1)
            client.read_frame()  # the content header
            assert client.read_frame()[1].value == b"%09d" % expected


def test_a_stomp_burst_is_handled_over_many_turns_in_order():
    with BlockingBroker(amqp_port=0, stomp_port=0, read_coalesce_ms=0) as broker:
        stomp = broker.broker.stomp_listener
        assert stomp is not None
        with socket.create_connection(("127.0.0.1", stomp.port)) as sock:
            sock.sendall(b"CONNECT\naccept-version:1.2\nlogin:guest\npasscode:guest\n\n\x00")
            assert sock.recv(4096).startswith(b"CONNECTED")
            sock.sendall(b"SEND\ndestination:/queue/q\nreceipt:r0\n\nfirst\x00")
            assert b"RECEIPT" in sock.recv(4096)  # the queue exists now
            ticker = Ticker(broker, "q")
            sock.sendall(b"".join(b"SEND\ndestination:/queue/q\n\n%09d\x00" % i for i in range(MESSAGES)))
            assert wait_for_depth(broker, "q", MESSAGES + 1) == MESSAGES + 1
            broker.call(lambda: setattr(ticker, "running", False))
            assert 0 < ticker.largest_step() <= MAX_STEP
