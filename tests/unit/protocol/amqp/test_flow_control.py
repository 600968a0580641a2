"""Flow control on an AMQP connection (sans-io: tests/sans_io.py's Harness): a publish
while the store lags (``core.flow.active``) stops reading the connection without
connection.blocked (RabbitMQ's ``flow`` state), the message in hand is still published,
and reading resumes when the flow ends; a resource alarm on top is told with
connection.blocked and ends with connection.unblocked."""

from __future__ import annotations

from pamqp import commands
from sans_io import Harness, method_frame

from leveret.amqp.frames import HEARTBEAT, PROTOCOL_HEADER, encode_publish


def opened() -> Harness:
    """A connection whose client announced the connection.blocked capability, with
    channel 1 open and queue ``q`` declared."""
    h = Harness()
    h.feed(PROTOCOL_HEADER)
    h.feed(
        method_frame(
            0,
            commands.Connection.StartOk(
                client_properties={"capabilities": {"connection.blocked": True}},
                mechanism="PLAIN",
                response="\x00guest\x00guest",
                locale="en_US",
            ),
        )
    )
    h.feed(method_frame(0, commands.Connection.TuneOk(channel_max=16, frame_max=4096, heartbeat=0)))
    h.feed(method_frame(0, commands.Connection.Open(virtual_host="/")))
    h.feed(method_frame(1, commands.Channel.Open()))
    h.feed(method_frame(1, commands.Queue.Declare(queue="q")))
    return h


def publish(h: Harness) -> None:
    h.feed(encode_publish(1, "", "q", b"body", {}, 4096))


def told(h: Harness, kind: type) -> int:
    return sum(isinstance(value, kind) for _, value in h.frames())


def test_a_publish_during_flow_pauses_reading_silently_until_the_flow_ends():
    h = opened()
    publish(h)
    assert h.transport.reading
    h.core.flow.set(True)
    publish(h)
    assert not h.transport.reading and h.connection.facts().state == "flow"
    assert h.core.vhosts["/"].queues["q"].message_count == 2  # the one in hand is published
    assert h.core.flow.holds == 1
    h.core.flow.set(False)
    assert h.transport.reading and h.connection.facts().state == "running"
    assert told(h, commands.Connection.Blocked) == told(h, commands.Connection.Unblocked) == 0


def test_an_alarm_after_a_flow_hold_blocks_with_connection_blocked_until_it_ends():
    h = opened()
    h.core.flow.set(True)
    publish(h)
    h.core.set_alarm(True, "memory")
    assert not h.transport.reading  # the alarm's end does not release a flow hold ...
    h.core.flow.set(False)  # ... the flow's end does
    assert h.transport.reading
    publish(h)  # now the alarm blocks it, and says so
    assert not h.transport.reading and h.connection.facts().state == "blocked"
    assert told(h, commands.Connection.Blocked) == 1
    h.core.flow.set(True)
    h.core.flow.set(False)  # a flow ending does not release an alarm's block
    assert not h.transport.reading
    h.core.set_alarm(False, "memory")
    h.flush()
    assert h.transport.reading and told(h, commands.Connection.Unblocked) == 1


def test_a_connection_held_by_flow_control_is_forgotten_when_it_closes():
    h = opened()
    h.core.flow.set(True)
    publish(h)
    assert h.connection in h.core.flow.held
    h.connection.connection_lost()
    assert not h.core.flow.held  # not kept (with its buffers) until the flow ends


def test_a_connection_held_for_long_is_not_dropped_for_the_heartbeats_it_cannot_read():
    """Heartbeat 2 s; held by flow control for 20 s: the client's heartbeats wait
    unread, so its silence does not count (RabbitMQ pauses the monitor of a blocked
    connection); released, it lives on while it sends them."""
    h = Harness()
    h.feed(PROTOCOL_HEADER)
    h.feed(method_frame(0, commands.Connection.StartOk(mechanism="PLAIN", response="\x00guest\x00guest")))
    h.feed(method_frame(0, commands.Connection.TuneOk(channel_max=16, frame_max=4096, heartbeat=2)))
    h.feed(method_frame(0, commands.Connection.Open(virtual_host="/")))
    h.feed(method_frame(1, commands.Channel.Open()))
    h.feed(method_frame(1, commands.Queue.Declare(queue="q")))
    h.core.flow.set(True)
    publish(h)
    assert not h.transport.reading
    h.loop.advance(20)
    assert not h.transport.aborted and h.connection.state == "opened"
    h.core.flow.set(False)
    for _ in range(4):
        h.feed(HEARTBEAT)
        h.loop.advance(1)
    assert not h.transport.aborted
    h.loop.advance(5)  # silent now, and read: dropped
    assert h.transport.aborted
