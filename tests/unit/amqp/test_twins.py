"""The compiled twin of the AMQP hot path (leveret/amqp/_cframes.pyx) gives what the
pure-Python one gives, on any input: the same values, or the same exception (class,
text, reply code). Arbitrary bytes, bytes split at arbitrary points, valid frames with
one byte changed, out-of-range arguments of the encoders."""

from __future__ import annotations

import dataclasses
import datetime
import struct

from hypothesis import given, strategies as st
from pamqp import commands, frame, header
from pamqp.body import ContentBody
from sans_io import FUZZ, split
from twins import COMPILED, COMPILED_MODULE, PURE, needs_compiled, outcome

from leveret.amqp import properties

pytestmark = needs_compiled


def _publish(exchange: str, key: str, props: commands.Basic.Properties, body: bytes, channel: int,
             mandatory: bool = False, immediate: bool = False) -> bytes:
    method = commands.Basic.Publish(routing_key=key, mandatory=mandatory, immediate=immediate)
    raw = bytearray(frame.marshal(method, channel))
    encoded = exchange.encode()  # any name (pamqp's Publish checks its own pattern)
    raw[13:14] = bytes((len(encoded),)) + encoded
    raw[3:7] = (len(raw) - 8).to_bytes(4, "big")
    raw += frame.marshal(header.ContentHeader(0, len(body), props), channel)
    if body:
        raw += frame.marshal(ContentBody(body), channel)
    return bytes(raw)


short = st.text(max_size=20).filter(lambda t: len(t.encode()) <= 255)
props = st.builds(
    commands.Basic.Properties,
    content_type=st.none() | short, delivery_mode=st.sampled_from([None, 1, 2]),
    priority=st.none() | st.integers(0, 255), expiration=st.none() | st.sampled_from(["", "100", "x"]),
    message_id=st.none() | short, headers=st.none() | st.dictionaries(short, st.integers(0, 9), max_size=2),
)
publishes = st.builds(_publish, short, short, props, st.binary(max_size=300), st.integers(0, 3),
                      st.booleans(), st.booleans())


@st.composite
def streams(draw) -> bytes:
    """Valid publish/ack frames, then maybe one byte changed, a cut, garbage behind."""
    acks = st.builds(lambda tag: struct.pack(">BHIHHQB", 1, 1, 13, 60, 80, tag, 0) + b"\xce",
                     st.integers(0, 2**64 - 1))
    data = bytearray(b"".join(draw(st.lists(publishes | acks, max_size=4))))
    for _ in range(draw(st.integers(0, 2))):
        if data:
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    return bytes(data) + draw(st.binary(max_size=20))


def _feed(module, max_size: int, pieces: list[bytes]):
    reader = module.FrameReader(max_size)
    results = [outcome(reader.feed, piece) for piece in pieces]
    return results, reader.max_size, reader._buffer


@FUZZ
@given(data=st.binary(max_size=600) | streams(), cuts=st.lists(st.integers(0, 2000), max_size=10),
       max_size=st.sampled_from([4096, 131072, 64, 8, 0]))
def test_frame_reader_twins_agree(data, cuts, max_size):
    pieces = split(data, cuts)
    assert _feed(COMPILED.frames, max_size, pieces) == _feed(PURE.frames, max_size, pieces)


def test_frame_reader_takes_any_bytes_like():
    data = frame.marshal(commands.Basic.Ack(7), 1)
    for piece in (bytearray(data), memoryview(data)):
        assert _feed(COMPILED.frames, 4096, [piece]) == _feed(PURE.frames, 4096, [piece])


def _method(method) -> tuple:
    """A decoded method, comparable: its class and its arguments."""
    if method[0] != "ok":
        return method
    value = method[1]
    return ("ok", type(value), {name: getattr(value, name, "<unset>") for name in value.__slots__})


_IDS = [struct.pack(">HH", 60, m) for m in (40, 80, 90, 120, 10, 60)]
_IDS += [b"\x00\x0a\x00\x0b", b"\x00\x63\x00\x01"]  # connection.start-ok, an unknown class


@FUZZ
@given(head=st.sampled_from([b"", *_IDS]), rest=st.binary(max_size=80))
def test_decode_method_twins_agree(head, rest):
    payload = head + rest
    assert _method(outcome(COMPILED.frames.decode_method, payload)) == _method(
        outcome(PURE.frames.decode_method, payload))
    assert outcome(COMPILED.frames.publish_fields, payload) == outcome(PURE.frames.publish_fields, payload)


@FUZZ
@given(exchange=short, key=short, mandatory=st.booleans(), immediate=st.booleans(),
       tag=st.integers(0, 2**64 - 1), bits=st.integers(0, 255))
def test_decode_method_twins_agree_on_valid_methods(exchange, key, mandatory, immediate, tag, bits):
    raw = _publish(exchange, key, commands.Basic.Properties(), b"", 1, mandatory, immediate)
    payloads = [raw[7 : 7 + int.from_bytes(raw[3:7], "big")]]
    payloads += [struct.pack(">HHQB", 60, m, tag, bits) for m in (80, 90, 120)]
    for payload in payloads:
        got = _method(outcome(COMPILED.frames.decode_method, payload))
        assert got == _method(outcome(PURE.frames.decode_method, payload))
        assert got[0] == "ok"


ints = st.integers(-2, 70000) | st.sampled_from([2**64 - 1, 2**64, -(2**63), True])
texts = st.text(max_size=300) | st.sampled_from(["\ud800", "é" * 128])


@FUZZ
@given(channel=ints, consumer_tag=st.binary(max_size=300), delivery_tag=ints, redelivered=st.booleans(),
       exchange=texts, key=texts, head=st.binary(max_size=100), body=st.binary(max_size=600),
       frame_max=st.sampled_from([4096, 131072, 9, 8, 7, 100]))
def test_encoders_twins_agree(channel, consumer_tag, delivery_tag, redelivered, exchange, key, head, body,
                              frame_max):
    def joined(fn, *args):
        got = outcome(fn, *args)
        return ("ok", b"".join(got[1])) if got[0] == "ok" else got

    for name in ("encode_deliver",):
        args = (channel, consumer_tag, delivery_tag, redelivered, exchange, key)
        assert outcome(getattr(COMPILED.frames, name), *args) == outcome(getattr(PURE.frames, name), *args)
    args = (channel, head, body, frame_max)
    assert joined(COMPILED.frames.encode_content, *args) == joined(PURE.frames.encode_content, *args)
    args = (channel, consumer_tag, delivery_tag, redelivered, exchange, key, head, body, frame_max)
    assert joined(COMPILED.frames.encode_delivery, *args) == joined(PURE.frames.encode_delivery, *args)


def test_encoders_match_pamqp():
    body = b"x" * 300
    head = header.ContentHeader(0, len(body), commands.Basic.Properties(delivery_mode=2)).marshal()
    want = (frame.marshal(commands.Basic.Deliver("ctag", 5, True, "ex", "rk"), 2)
            + frame.marshal(header.ContentHeader(0, len(body), commands.Basic.Properties(delivery_mode=2)), 2)
            + b"".join(frame.marshal(ContentBody(body[i : i + 92]), 2) for i in range(0, 300, 92)))
    for twin in (PURE, COMPILED):
        assert b"".join(twin.frames.encode_delivery(2, b"ctag", 5, True, "ex", "rk", head, body, 100)) == want


@FUZZ
@given(data=streams(), start=st.integers(0, 5))
def test_whole_publish_twins_agree(data, start):
    frames = []
    try:
        frames = PURE.frames.FrameReader(131072).feed(data)
    except Exception:
        pass
    frames.append((0, 1, ("parsed", "publish")))  # a worker's item after the frames
    for i in (start, *range(len(frames))):
        got = outcome(COMPILED.handoff.whole_publish, frames, i)
        assert got == outcome(PURE.handoff.whole_publish, frames, i)
    parsed = outcome(COMPILED.handoff.parse_publishes, frames)
    assert parsed == outcome(PURE.handoff.parse_publishes, frames)


@FUZZ
@given(flags=st.integers(0, 0xFFFF) | st.sampled_from([0x1000, 0x0900, 0x8100, 0x0840]),
       rest=st.binary(max_size=60), cut=st.none() | st.integers(0, 13))
def test_scan_twins_agree(flags, rest, cut):
    head = (b"\x00\x3c\x00\x00" + b"\x00" * 8 + flags.to_bytes(2, "big") + rest)[:cut]
    assert outcome(COMPILED_MODULE.scan, head) == outcome(properties.scan, head)


def _delivery(result) -> tuple:
    """take_delivery's result, comparable across the two modules' Delivery classes."""
    if result[0] != "ok" or result[1] is None:
        return result
    taken, d = result[1]
    return ("ok", taken, dataclasses.astuple(d))


def _deliver_frame(consumer_tag: str, tag: int, redelivered: bool, exchange: str, key: str,
                   channel: int) -> bytes:
    def ss(s: str) -> bytes:
        return bytes([len(s.encode())]) + s.encode()
    payload = (struct.pack(">HH", 60, 60) + ss(consumer_tag) + struct.pack(">q", tag)
               + bytes([int(redelivered)]) + ss(exchange) + ss(key))
    return struct.pack(">BHI", 1, channel, len(payload)) + payload + b"\xce"


full_props = st.builds(
    commands.Basic.Properties,
    content_type=st.none() | short, content_encoding=st.none() | short,
    headers=st.none() | st.dictionaries(short, st.integers(0, 9) | short, max_size=2),
    delivery_mode=st.sampled_from([None, 1, 2]), priority=st.none() | st.integers(0, 255),
    correlation_id=st.none() | short, reply_to=st.none() | short, expiration=st.none() | short,
    timestamp=st.none() | st.integers(0, 2**32 - 1).map(
        lambda t: datetime.datetime.fromtimestamp(t, datetime.UTC)),
    message_type=st.none() | short, app_id=st.none() | short,
)


@st.composite
def deliveries(draw) -> bytes:
    """A delivery (deliver, header, body), maybe with bytes changed, cut, or more behind."""
    channel = draw(st.integers(0, 3))
    body = draw(st.binary(max_size=200))
    data = bytearray(_deliver_frame(draw(short), draw(st.integers(-(2**63), 2**63 - 1)), draw(st.booleans()),
                                    draw(short), draw(short), channel))
    head = header.ContentHeader(0, len(body), draw(full_props))
    data += frame.marshal(head, draw(st.sampled_from([channel, 1])))
    if body:
        data += frame.marshal(ContentBody(body), channel)
    for _ in range(draw(st.integers(0, 2))):
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    cut = draw(st.none() | st.integers(0, len(data)))
    return bytes(data[:cut]) + draw(st.binary(max_size=10))


@FUZZ
@given(data=deliveries() | st.binary(max_size=300))
def test_take_delivery_twins_agree(data):
    for buf in (bytearray(data), data, memoryview(data)):
        got = _delivery(outcome(COMPILED.delivery.take_delivery, buf))
        assert got == _delivery(outcome(PURE.delivery.take_delivery, bytearray(data)))
        assert got[0] == "ok"  # never raises
