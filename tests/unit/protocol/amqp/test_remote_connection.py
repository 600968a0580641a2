"""RemoteConnection (a connection whose socket a worker holds), sans I/O: fed what a
worker sends (amqp/handoff.py), it writes to the client exactly what a Connection fed
the same bytes writes, once the worker has encoded its deliveries."""

from __future__ import annotations

from pamqp import commands
from sans_io import FakeTransport, Harness, method_frame

from leveret.amqp.frames import PROTOCOL_HEADER, FrameReader, encode_content, encode_deliver, encode_publish
from leveret.amqp.handoff import parse_publishes
from leveret.protocol.amqp.remote import STASH_LIMIT, RemoteConnection
from leveret.protocol.turns import TURN_BUDGET


class WorkerTransport(FakeTransport):
    """What the worker would write: bytes as they are, deliveries encoded as
    server/workers/ encodes them."""

    def __init__(self) -> None:
        super().__init__()
        self.frame_max = 131072

    def write_items(self, items: list) -> None:
        for item in items:
            if type(item) is bytes:
                self.write(item)
            else:
                number, tag, delivery_tag, redelivered, exchange, key, header, body = item
                self.write(encode_deliver(number, tag, delivery_tag, redelivered, exchange, key))
                self.write(b"".join(encode_content(number, header, body, self.frame_max)))

    def set_frame_max(self, frame_max: int) -> None:
        self.frame_max = frame_max


class Remote(Harness):
    """The Harness, with a RemoteConnection fed as a worker feeds it."""

    def __init__(self) -> None:
        super().__init__()
        self.transport = WorkerTransport()
        self.connection = RemoteConnection(
            self.core, self.transport, self.loop, self.pending.add, "w:1", True
        )
        self._reader = FrameReader(1 << 20)

    def feed(self, data: bytes) -> None:
        if data.startswith(PROTOCOL_HEADER):
            self.connection.header_received(data[:8])
            data = data[8:]
        if data:
            self.connection.frames_received(parse_publishes(self._reader.feed(data)), len(data))
        self.run_turns()


def session(harness: Harness) -> bytes:
    harness.handshake()
    harness.feed(method_frame(1, commands.Queue.Declare(queue="q")))
    harness.feed(method_frame(1, commands.Basic.Consume(queue="q", consumer_tag="c")))
    publishes = b"".join(
        encode_publish(1, "", "q", b"body-%d" % i * (i + 1), {"headers": {"i": i}}, 4096) for i in range(50)
    )
    harness.feed(publishes)
    harness.feed(method_frame(1, commands.Basic.Ack(delivery_tag=50, multiple=True)))
    harness.feed(encode_publish(1, "no-such-exchange", "q", b"x", {}, 4096))  # 404: channel closed
    return bytes(harness.transport.output)


def test_the_client_gets_the_same_bytes_as_from_a_socket_connection() -> None:
    remote, local = Remote(), Harness()
    out = session(remote)
    assert out == session(local)
    assert out.count(b"\x00\x3c\x00\x3c") >= 50  # the 50 basic.deliver frames are there
    assert remote.transport.frame_max == 4096  # tune-ok's frame_max reached the worker
    assert local.core.vhosts["/"].queues["q"].message_count == 0


def test_the_same_bytes_when_reads_are_handled_over_several_turns() -> None:
    """Both connections run out of their turn's budget (protocol/turns.py) every few
    frames: they pause reading, go on in later turns, and the client still gets the
    same bytes (the suite once failed here when a busy machine made a turn run out)."""
    remote, local = Remote(), Harness()
    remote.loop.work_per_look = local.loop.work_per_look = TURN_BUDGET / 2
    out = session(remote)
    assert out == session(local)
    assert out.count(b"\x00\x3c\x00\x3c") >= 50
    assert local.transport.pauses > 0 and local.transport.reading
    assert local.core.vhosts["/"].queues["q"].message_count == 0


def test_a_frame_error_from_the_worker_closes_with_501() -> None:
    remote = Remote()
    remote.handshake()
    remote.connection.frame_error("frame end marker 0x0, expected 0xce")
    remote.run_turns()
    assert remote.transport.closed
    method = remote.frames()[-1][1]
    assert isinstance(method, commands.Connection.Close) and method.reply_code == 501


def test_a_long_backlog_stops_the_worker_reading_until_it_is_handled() -> None:
    remote = Remote()
    remote.handshake()
    remote.feed(method_frame(1, commands.Queue.Declare(queue="q")))
    remote.loop.work_per_look = TURN_BUDGET / 4  # a turn's budget lasts ~4 looks (32 frames)
    message = encode_publish(1, "", "q", b"x" * 10, {}, 4096)
    items = parse_publishes(FrameReader(1 << 20).feed(message * (4 * STASH_LIMIT)))
    remote.connection.frames_received(items, len(message) * 4 * STASH_LIMIT)  # more than a turn's work
    assert remote.transport.pauses == 1 and not remote.transport.reading
    remote.run_turns()
    assert remote.transport.reading
    assert remote.core.vhosts["/"].queues["q"].message_count == 4 * STASH_LIMIT
