"""Flow control on a STOMP connection (sans-io, on tests/sans_io.py's fake loop): a SEND
while the store lags stops reading the connection, and the time it is not read does
not count against its heart-beats (RabbitMQ pauses the monitor of a blocked
connection); released, it is dropped only for a silence of its own."""

from __future__ import annotations

from sans_io import FakeLoop, FakeTransport

from leveret.core.broker import BrokerCore
from leveret.protocol.stomp import StompConnection


def test_a_connection_held_for_long_is_not_dropped_for_the_heart_beats_it_cannot_read():
    loop = FakeLoop()
    core = BrokerCore(loop)
    transport = FakeTransport()
    connection = StompConnection(core, transport, loop, lambda c: None, "127.0.0.1:5000")

    def feed(data: bytes) -> None:
        connection.data_received(data)
        connection.flush()

    feed(b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\nheart-beat:1000,0\n\n\0")
    assert transport.output.startswith(b"CONNECTED\n") and connection.state == "connected"
    core.flow.set(True)
    feed(b"SEND\ndestination:/queue/q\n\nbody\0")
    assert not transport.reading and connection.flow_held
    loop.advance(20)  # far past 1 s times the grace: its heart-beats wait unread
    assert not transport.aborted and connection.state == "connected"
    core.flow.set(False)
    assert transport.reading
    for _ in range(8):
        feed(b"\n")
        loop.advance(0.5)
    assert not transport.aborted
    loop.advance(20)  # silent now, and read: dropped
    assert transport.aborted
