"""Fuzzing: garbage in gets a protocol error out, never an exception or a dead broker.

(a) the sans-I/O FrameReader, (b) a whole sans-I/O Connection after a valid handshake,
(c) a real broker hit with garbage on many sockets.
"""

from __future__ import annotations

import os
import random
import socket
import struct
import time

import pika
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from pamqp import commands, frame as pamqp_frame, header as pamqp_header
from pamqp import heartbeat as pamqp_heartbeat

from leveret.core.broker import BrokerCore
from leveret.core.clock import ManualClock
from leveret.protocol.amqp import Connection
from leveret.amqp.frames import (
    FRAME_BODY, FRAME_HEADER, FRAME_HEARTBEAT, FRAME_METHOD, PROTOCOL_HEADER, FrameError,
    FrameReader, encode_frame,
)

# LEVERET_FUZZ_EXAMPLES=5000 for a longer hunt; the default keeps the suite fast.
FUZZ = settings(max_examples=int(os.environ.get("LEVERET_FUZZ_EXAMPLES", 150)), deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:])]


# -- (a) FrameReader ------------------------------------------------------------------
def feed_all(reader: FrameReader, pieces: list[bytes]) -> tuple[list, FrameError | None]:
    """Frames read and the FrameError that ended reading, if any; any other exception
    propagates (and fails the test)."""
    frames = []
    for piece in pieces:
        try:
            frames += reader.feed(piece)
        except FrameError as exc:
            assert exc.reply_code == 501
            return frames, exc
    return frames, None


@FUZZ
@given(data=st.binary(max_size=600), cuts=st.lists(st.integers(0, 600), max_size=12),
       max_size=st.sampled_from([4096, 131072, 64]))
def test_frame_reader_gives_frames_or_frame_error(data, cuts, max_size):
    frames, error = feed_all(FrameReader(max_size), split(data, cuts))
    whole, whole_error = feed_all(FrameReader(max_size), [data])
    for frame_type, channel, payload in frames:
        assert frame_type in (FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT)
        assert 0 <= channel <= 0xFFFF
        assert len(payload) + 8 <= max_size
    # however the bytes are split, the stream means the same
    assert (error is None) == (whole_error is None)
    if error is None:
        assert frames == whole


frame_types = st.sampled_from([FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT])
valid_frames = st.lists(st.tuples(frame_types, st.integers(0, 0xFFFF), st.binary(max_size=300)),
                        max_size=8)


@FUZZ
@given(frames=valid_frames, cuts=st.lists(st.integers(0, 3000), max_size=20))
def test_valid_frames_split_anywhere_reassemble(frames, cuts):
    data = b"".join(encode_frame(*f) for f in frames)
    reader = FrameReader(4096)
    got = []
    for piece in split(data, cuts):
        got += reader.feed(piece)
    assert got == frames


@FUZZ
@given(frames=valid_frames, garbage=st.binary(min_size=1, max_size=50))
def test_valid_frames_then_garbage_keep_the_valid_frames(frames, garbage):
    reader = FrameReader(4096)
    data = b"".join(encode_frame(*f) for f in frames)
    assert reader.feed(data) == frames
    try:
        extra = reader.feed(garbage)
    except FrameError:
        return
    assert all(t in (FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT) for t, _, _ in extra)


@pytest.mark.parametrize("bad,what", [
    (encode_frame(FRAME_METHOD, 0, b"abcd")[:-1] + b"\x00", "end marker"),
    (encode_frame(7, 0, b""), "unknown frame type"),
    (struct.pack(">BHI", FRAME_BODY, 1, 1 << 30), "exceeds frame_max"),
])
def test_frame_reader_errors(bad, what):
    reader = FrameReader(4096)
    with pytest.raises(FrameError, match=what):
        for byte in bad:  # byte by byte
            reader.feed(bytes([byte]))


def test_frame_size_error_needs_only_the_frame_head():
    reader = FrameReader(4096)
    with pytest.raises(FrameError):
        reader.feed(struct.pack(">BHI", FRAME_BODY, 1, 5000))


# -- (b) a sans-I/O Connection ----------------------------------------------------------
class FakeTimer:
    def __init__(self, loop: FakeLoop, when: float, callback) -> None:
        self.when, self.callback, self.cancelled = when, callback, False

    def cancel(self) -> None:
        self.cancelled = True


class FakeLoop:
    """Time stands still unless a test advances it; timers are recorded, not run."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.timers: list[FakeTimer] = []

    def time(self) -> float:
        return self.now

    def call_later(self, delay: float, callback, *args) -> FakeTimer:
        timer = FakeTimer(self, self.now + delay, lambda: callback(*args))
        self.timers.append(timer)
        return timer


class FakeTransport:
    def __init__(self) -> None:
        self.output = bytearray()
        self.closed = self.aborted = False

    def write(self, data: bytes) -> None:
        assert not (self.closed or self.aborted), "write after close"
        self.output += data

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def get_extra_info(self, name: str, default=None):
        return default

    def set_write_buffer_limits(self, **kwargs) -> None:
        pass


class Harness:
    """A Connection fed bytes directly; output flushed after every read, as the
    listener does once per loop turn."""

    def __init__(self) -> None:
        self.core = BrokerCore(ManualClock())
        self.transport = FakeTransport()
        self.loop = FakeLoop()
        self.pending = set()
        self.connection = Connection(self.core, self.transport, self.loop, self.pending.add,
                                     "fuzz:1", True)

    def feed(self, data: bytes) -> None:
        self.connection.data_received(data)
        for conn in list(self.pending):
            conn.flush()
        self.pending.clear()

    def frames(self) -> list[tuple[int, object]]:
        """Everything written: methods decoded, other frames as (type, payload) (content
        headers pass through the broker as the publisher sent them)."""
        data = bytes(self.transport.output)
        if data.startswith(b"AMQP"):
            data = data[8:]
        out = []
        for frame_type, channel, payload in FrameReader(1 << 40).feed(data):
            if frame_type == FRAME_METHOD:
                out.append((channel, pamqp_frame.unmarshal(encode_frame(frame_type, channel, payload))[2]))
            else:
                out.append((channel, (frame_type, payload)))
        return out

    def handshake(self) -> None:
        self.feed(PROTOCOL_HEADER)
        self.feed(pamqp_frame.marshal(commands.Connection.StartOk(
            mechanism="PLAIN", response="\x00guest\x00guest", locale="en_US"), 0))
        self.feed(pamqp_frame.marshal(commands.Connection.TuneOk(
            channel_max=16, frame_max=4096, heartbeat=0), 0))
        self.feed(pamqp_frame.marshal(commands.Connection.Open(virtual_host="/"), 0))
        self.feed(pamqp_frame.marshal(commands.Channel.Open(), 1))
        assert self.connection.state == "opened"
        assert isinstance(self.frames()[-1][1], commands.Channel.OpenOk)


def method_frame(channel: int, method) -> bytes:
    return pamqp_frame.marshal(method, channel)


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
    st.builds(commands.Connection.TuneOk, channel_max=st.just(0), frame_max=st.just(4096), heartbeat=st.just(0)),
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
    for channel, value in frames:  # channel errors carry a known soft code
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
    harness.loop.now += 11
    for timer in list(harness.loop.timers):
        if not timer.cancelled and timer.when <= harness.loop.now:
            timer.callback()
    assert harness.transport.aborted


# -- (c) a real broker under garbage -----------------------------------------------------
def garbage_payloads(count: int, seed: int = 20240501) -> list[bytes]:
    rng = random.Random(seed)
    valid_start = (PROTOCOL_HEADER + method_frame(0, commands.Connection.StartOk(
        mechanism="PLAIN", response="\x00guest\x00guest", locale="en_US")))
    payloads = []
    for i in range(count):
        noise = rng.randbytes(rng.randint(0, 300))
        kind = i % 4
        if kind == 0:
            payloads.append(noise)
        elif kind == 1:
            payloads.append(PROTOCOL_HEADER + noise)
        elif kind == 2:
            payloads.append(valid_start + noise)
        else:
            payloads.append(valid_start + method_frame(0, commands.Connection.TuneOk(channel_max=0, frame_max=0, heartbeat=0))
                            + method_frame(0, commands.Connection.Open(virtual_host="/"))
                            + encode_frame(rng.randint(0, 9), rng.randint(0, 3), noise))
    return payloads


def test_broker_survives_garbage_connections(leveret_broker):
    url = leveret_broker.amqp_url
    bystander = pika.BlockingConnection(pika.URLParameters(url))
    channel = bystander.channel()
    channel.queue_declare("steady")
    channel.confirm_delivery()
    for i, payload in enumerate(garbage_payloads(200)):
        with socket.create_connection(("127.0.0.1", leveret_broker.amqp_port), timeout=2) as sock:
            sock.sendall(payload)
            if i % 10 == 0:  # now and then, wait for the broker's answer
                try:
                    while sock.recv(65536):
                        pass
                except (socket.timeout, ConnectionResetError):
                    pass
        if i % 50 == 0:
            channel.basic_publish("", "steady", b"%d" % i)
    # the bystander kept working all along, and a new client works too
    assert channel.queue_declare("steady", passive=True).method.message_count == 4
    client = pika.BlockingConnection(pika.URLParameters(url))
    fresh = client.channel()
    fresh.basic_publish("", "steady", b"fresh")
    deadline = time.monotonic() + 5
    bodies = []
    while len(bodies) < 5 and time.monotonic() < deadline:
        method, _, body = fresh.basic_get("steady", auto_ack=True)
        if method is not None:
            bodies.append(body)
    assert bodies == [b"0", b"50", b"100", b"150", b"fresh"]
    client.close()
    bystander.close()
