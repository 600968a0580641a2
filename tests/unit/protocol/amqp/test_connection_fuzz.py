"""Fuzzing a whole sans-I/O Connection after a valid handshake: random and malformed
frames get a protocol error out (channel.close with a soft code, or connection.close
with a 5xx), never an exception, and timers fire safely on a fake loop."""

from __future__ import annotations

import struct

from hypothesis import given, strategies as st
from pamqp import commands, frame as pamqp_frame, header as pamqp_header, heartbeat as pamqp_heartbeat
from sans_io import FUZZ, Harness, method_frame, split

from leveret.amqp.frames import (
    FRAME_BODY,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    PROTOCOL_HEADER,
    encode_frame,
)

names = st.sampled_from(["", "q", "q2", "ex", "amq.direct", "amq.topic", "amq.headers",
                         "amq.gen-x", "amq.rabbitmq.reply-to", "x" * 10])
flags = st.booleans()
tags = st.integers(0, 5)
channels = st.sampled_from([0, 1, 1, 1, 2, 3, 17])
field_tables = st.sampled_from([None, {}, {"x-message-ttl": 10}, {"x-match": "any", "a": 1},
                                {"alternate-exchange": "amq.fanout"}, {"x-expires": "bad"}])

methods = st.one_of(
    st.builds(commands.Channel.Open),
    st.builds(commands.Channel.Close, reply_code=st.just(200), reply_text=st.just("bye"),
              class_id=st.just(0), method_id=st.just(0)),
    st.builds(commands.Channel.CloseOk),
    st.builds(commands.Channel.Flow, active=flags),
    st.builds(commands.Exchange.Declare, exchange=names, exchange_type=st.sampled_from(
        ["direct", "fanout", "topic", "headers", "nope"]), passive=flags, durable=flags,
        auto_delete=flags, internal=flags, arguments=field_tables),
    st.builds(commands.Exchange.Delete, exchange=names, if_unused=flags),
    st.builds(commands.Exchange.Bind, destination=names, source=names, routing_key=names,
              arguments=field_tables),
    st.builds(commands.Queue.Declare, queue=names, passive=flags, durable=flags,
              exclusive=flags, auto_delete=flags, arguments=field_tables),
    st.builds(commands.Queue.Bind, queue=names, exchange=names, routing_key=names,
              arguments=field_tables),
    st.builds(commands.Queue.Unbind, queue=names, exchange=names, routing_key=names),
    st.builds(commands.Queue.Purge, queue=names),
    st.builds(commands.Queue.Delete, queue=names, if_unused=flags, if_empty=flags),
    st.builds(commands.Basic.Qos, prefetch_count=tags, prefetch_size=st.sampled_from([0, 0, 1]),
              global_=flags),
    st.builds(commands.Basic.Consume, queue=names, consumer_tag=st.sampled_from(["", "t", "u"]),
              no_ack=flags, exclusive=flags),
    st.builds(commands.Basic.Cancel, consumer_tag=st.sampled_from(["", "t", "u"])),
    st.builds(commands.Basic.Publish, exchange=names, routing_key=names, mandatory=flags,
              immediate=st.sampled_from([False, False, False, True])),
    st.builds(commands.Basic.Get, queue=names, no_ack=flags),
    st.builds(commands.Basic.Ack, delivery_tag=tags, multiple=flags),
    st.builds(commands.Basic.Nack, delivery_tag=tags, multiple=flags, requeue=flags),
    st.builds(commands.Basic.Reject, delivery_tag=tags, requeue=flags),
    st.builds(commands.Basic.Recover, requeue=flags),
    st.builds(commands.Confirm.Select),
    st.builds(commands.Tx.Select), st.builds(commands.Tx.Commit), st.builds(commands.Tx.Rollback),
    st.builds(commands.Connection.Blocked), st.builds(commands.Connection.CloseOk),
    st.builds(commands.Connection.TuneOk, channel_max=st.just(0), frame_max=st.just(4096),
              heartbeat=st.just(0)),
)

properties = st.builds(
    commands.Basic.Properties,
    headers=st.one_of(st.none(), st.dictionaries(st.sampled_from(["a", "b"]), st.integers(0, 3),
                                                 max_size=2)),
    reply_to=st.sampled_from([None, "amq.rabbitmq.reply-to", "q"]),
    delivery_mode=st.sampled_from([None, 1, 2]),
    expiration=st.sampled_from([None, "0", "100", "junk"]),
    priority=st.sampled_from([None, 0, 5, 255]),
)


@st.composite
def content(draw, channel: int | None = None) -> bytes:
    """Content frames that may be well-formed, truncated, corrupted or oversized."""
    channel = draw(channels) if channel is None else channel
    body = draw(st.binary(max_size=5000))
    size = draw(st.sampled_from([len(body), len(body), 0, len(body) + 3, 1 << 40]))
    header = pamqp_header.ContentHeader(body_size=size, properties=draw(properties)).marshal()
    corrupt = draw(st.sampled_from(["no", "no", "properties", "all"]))
    if corrupt == "properties":  # a sound prefix, then any flags and property bytes
        header = struct.pack(">HHQ", 60, 0, size) + draw(st.binary(min_size=2, max_size=40))
    elif corrupt == "all":
        header = draw(st.binary(max_size=40))
    frames = [encode_frame(FRAME_HEADER, channel, header)]
    for start in range(0, len(body), 4088):
        frames.append(encode_frame(FRAME_BODY, channel, body[start:start + 4088]))
    return b"".join(frames)


@st.composite
def publish(draw) -> bytes:
    """basic.publish and its content on one channel, mostly to a queue that exists."""
    channel = draw(st.sampled_from([1, 1, 1, 2]))
    method = commands.Basic.Publish(
        exchange=draw(st.sampled_from(["", "", "amq.headers", "amq.topic", "ex"])),
        routing_key=draw(st.sampled_from(["q", "q", "q2", "amq.rabbitmq.reply-to.x"])),
        mandatory=draw(flags))
    return method_frame(channel, method) + draw(content(channel))


setup = st.sampled_from([  # declarations that give publishes somewhere to go
    method_frame(1, commands.Queue.Declare(queue="q")),
    method_frame(1, commands.Queue.Bind(queue="q", exchange="amq.headers",
                                        arguments={"x-match": "any", "a": 1})),
    method_frame(1, commands.Queue.Bind(queue="q", exchange="amq.topic", routing_key="#")),
    method_frame(1, commands.Basic.Consume(queue="q", consumer_tag="c")),
    method_frame(1, commands.Confirm.Select()),
    method_frame(2, commands.Channel.Open()),
])

garbage_payload_frame = st.builds(
    encode_frame, st.sampled_from([FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT]),
    channels, st.binary(max_size=60))

chunks = st.one_of(
    setup,
    publish(),
    st.builds(method_frame, channels, methods),
    publish(),
    content(),
    garbage_payload_frame,
    st.binary(max_size=40),  # raw garbage
    st.just(pamqp_frame.marshal(pamqp_heartbeat.Heartbeat(), 0)),
)


@FUZZ
@given(script=st.lists(chunks, max_size=12), cuts=st.lists(st.integers(0, 20000), max_size=6))
def test_connection_survives_random_frames(script, cuts):
    harness = Harness()
    harness.handshake()
    data = b"".join(script)
    for piece in split(data, cuts):
        harness.feed(piece)  # must never raise
        if harness.connection.state == "closed":
            break
    # and it keeps not raising once closing/closed
    harness.feed(b"\x01\x00\x01\x00\x00\x00\x00\xce" + bytes(range(256)))
    connection = harness.connection
    frames = harness.frames()
    closes = [f for ch, f in frames if isinstance(f, commands.Connection.Close)]
    if connection.state == "opened":
        assert not closes
        assert not (harness.transport.closed or harness.transport.aborted)
    else:
        assert connection.state in ("closing", "closed")
        client_closed = any(isinstance(f, commands.Connection.CloseOk) for _, f in frames)
        assert closes or client_closed, "connection ended without connection.close"
        for close in closes:
            assert 500 <= close.reply_code < 600, close
        assert len(closes) <= 1
        if connection.state == "closed":
            assert harness.transport.closed or harness.transport.aborted
    for _channel, value in frames:  # channel errors carry a known soft code
        if isinstance(value, commands.Channel.Close):
            assert value.reply_code in (403, 404, 405, 406), value
    harness.core.clock.advance(1.0)  # TTLs (expiration "100") fall due without a loop
    connection.connection_lost()


@FUZZ
@given(garbage=st.binary(max_size=200), cuts=st.lists(st.integers(0, 300), max_size=5))
def test_connection_survives_garbage_at_any_handshake_stage(garbage, cuts):
    for stage in range(5):
        harness = Harness()
        steps = [PROTOCOL_HEADER,
                 method_frame(0, commands.Connection.StartOk(
                     mechanism="PLAIN", response="\x00guest\x00guest", locale="en_US")),
                 method_frame(0, commands.Connection.TuneOk(frame_max=4096)),
                 method_frame(0, commands.Connection.Open(virtual_host="/")),
                 method_frame(1, commands.Channel.Open())][:stage]
        for step in steps:
            harness.feed(step)
        for piece in split(garbage, cuts):
            harness.feed(piece)
        state = harness.connection.state
        assert state in ("header", "start", "tune", "open", "opened", "closing", "closed")
        for _, value in harness.frames() if stage else []:
            if isinstance(value, commands.Connection.Close):
                assert 500 <= value.reply_code < 600 or value.reply_code == 403, value
        harness.connection.connection_lost()


def test_connection_timers_fire_safely():
    """Handshake timeout and heartbeat timers run against a fake clock."""
    harness = Harness()
    harness.feed(PROTOCOL_HEADER)
    harness.loop.advance(11)
    assert harness.transport.aborted
