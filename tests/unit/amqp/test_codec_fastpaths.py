"""leveret.amqp's hand-written decoders of the hot frames (basic.deliver, content
header, content body: :mod:`leveret.amqp.delivery`) give exactly what pamqp gives, and
leave what they cannot decode to pamqp (so malformed frames fail the same way); the
hand-written basic.publish encoder (:func:`leveret.amqp.frames.encode_publish`) writes
exactly pamqp's bytes."""

from __future__ import annotations

import datetime
import struct

import pytest

pytest.importorskip("hypothesis")
from hypothesis import (
    assume,
    given,
    settings,
    strategies as st,
)
from pamqp import commands, frame, header
from pamqp.body import ContentBody

from leveret.amqp.delivery import decode_frame, take_delivery
from leveret.amqp.frames import encode_publish

shortstr = st.text(max_size=40).filter(lambda s: len(s.encode()) <= 255)
optional_shortstr = st.none() | shortstr
table_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1) | st.text(max_size=30)
    | st.binary(max_size=30),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12)
tables = st.dictionaries(shortstr, table_values, max_size=6)


def _stamp(value: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(value, tz=datetime.UTC)


@st.composite
def properties(draw) -> commands.Basic.Properties:
    return commands.Basic.Properties(
        content_type=draw(optional_shortstr), content_encoding=draw(optional_shortstr),
        headers=draw(st.none() | tables), delivery_mode=draw(st.sampled_from([None, 1, 2])),
        priority=draw(st.none() | st.integers(0, 255)),
        correlation_id=draw(optional_shortstr), reply_to=draw(optional_shortstr),
        expiration=draw(optional_shortstr), message_id=draw(optional_shortstr),
        timestamp=draw(st.none() | st.integers(0, 2**32 - 1).map(_stamp)),
        message_type=draw(optional_shortstr), user_id=draw(optional_shortstr),
        app_id=draw(optional_shortstr))


def _state(value):
    """Comparable form of a decoded frame value (or of the exception's type)."""
    if isinstance(value, type):
        return value
    channel, v = value
    attrs = {}
    for cls in type(v).__mro__:
        for k in getattr(cls, "__slots__", ()):
            attrs[k] = getattr(v, k, "<unset>")
    attrs.update(getattr(v, "__dict__", {}))
    if "properties" in attrs:
        attrs["properties"] = _state((0, attrs["properties"]))
    return channel, type(v), {k: (type(x), repr(x)) for k, x in attrs.items()}


def _both(raw: bytes):
    """Ours and pamqp's decoding of one frame must agree (a value or the same exception
    type); ours also on a bytearray with another frame behind it."""
    def run(fn, data):
        try:
            return _state(fn(data))
        except Exception as exc:
            return type(exc)

    def theirs(data):
        _, channel, value = frame.unmarshal(data)
        return channel, value

    expected = run(theirs, raw)
    for data in (raw, bytearray(raw) + frame.marshal(ContentBody(b"\xff" * 300), 9)):
        got = run(decode_frame, data)
        assert got == expected, (raw, got, expected)
    return expected


def _deliver_frame(consumer_tag: str, tag: int, redelivered: bool, exchange: str,
                   key: str, channel: int) -> bytes:
    def ss(s: str) -> bytes:
        b = s.encode()
        return bytes([len(b)]) + b
    payload = (struct.pack(">HH", 60, 60) + ss(consumer_tag) + struct.pack(">q", tag)
               + bytes([int(redelivered)]) + ss(exchange) + ss(key))
    return struct.pack(">BHI", 1, channel, len(payload)) + payload + b"\xce"


@settings(max_examples=200, deadline=None)
@given(props=properties(), body_size=st.integers(0, 2**64 - 1), channel=st.integers(1, 65535))
def test_content_header_matches_pamqp(props, body_size, channel):
    try:
        raw = frame.marshal(header.ContentHeader(0, body_size, props), channel)
    except (TypeError, ValueError):  # pamqp cannot encode this table value
        assume(False)
    assert not isinstance(_both(raw), type)


@settings(max_examples=200, deadline=None)
@given(consumer_tag=shortstr, delivery_tag=st.integers(-2**63, 2**63 - 1),
       redelivered=st.booleans(), exchange=shortstr, routing_key=shortstr,
       channel=st.integers(1, 65535))
def test_deliver_matches_pamqp(consumer_tag, delivery_tag, redelivered, exchange,
                               routing_key, channel):
    raw = _deliver_frame(consumer_tag, delivery_tag, redelivered, exchange, routing_key,
                         channel)
    assert not isinstance(_both(raw), type)
    # what pamqp itself writes
    if exchange.isascii() and exchange.isalnum() and len(exchange) < 100:
        _both(frame.marshal(commands.Basic.Deliver(consumer_tag, delivery_tag, redelivered,
                                                   exchange, routing_key), channel))


@settings(max_examples=100, deadline=None)
@given(body=st.binary(min_size=1, max_size=2000), channel=st.integers(0, 65535))
def test_body_matches_pamqp(body, channel):
    assert not isinstance(_both(frame.marshal(ContentBody(body), channel)), type)


@pytest.mark.parametrize("stamp", [0, 1, 1_700_000_000, 0xFFFFFFFF, 0x100000000,
                                   1_700_000_000_123, 2**63, 2**64 - 1])
def test_raw_timestamps_match_pamqp(stamp):
    # above 2**32 pamqp reads milliseconds; far beyond, both fail the same way
    raw = bytearray(frame.marshal(header.ContentHeader(0, 5, commands.Basic.Properties(
        timestamp=_stamp(0))), 1))
    raw[21:29] = stamp.to_bytes(8, "big")
    _both(bytes(raw))


def _corruptions(raw: bytes):
    for cut in range(7, len(raw) - 1):  # truncated payloads (size field kept honest)
        payload = raw[7:cut]
        yield raw[:3] + len(payload).to_bytes(4, "big") + payload + b"\xce"
    for i in range(7, len(raw) - 1):  # one byte changed
        for b in (0x00, 0x01, 0x7f, 0xc3, 0xff):
            yield raw[:i] + bytes([b]) + raw[i + 1:]
    yield raw[:-1] + b"\x00"  # bad frame end


@pytest.mark.parametrize("raw", [
    _deliver_frame("ctag", 7, True, "ex", "rk", 3),
    frame.marshal(header.ContentHeader(0, 10, commands.Basic.Properties(
        content_type="text/plain", headers={"a": 1, "b": "x"}, delivery_mode=2,
        priority=3, correlation_id="c", timestamp=_stamp(1_700_000_000),
        message_id="m", app_id="app")), 3),
    frame.marshal(header.ContentHeader(0, 3, commands.Basic.Properties()), 3),
    frame.marshal(ContentBody(b"abc"), 3),
], ids=["deliver", "header", "empty-header", "body"])
def test_malformed_frames_fail_as_pamqp(raw):
    for bad in _corruptions(raw):
        _both(bad)


def test_other_frames_go_to_pamqp():
    for value in (commands.Basic.Ack(5, True), commands.Basic.GetOk(9, False, "e", "r", 0),
                  commands.Basic.Cancel("t"), commands.Channel.Close(404, "nope", 50, 10)):
        assert not isinstance(_both(frame.marshal(value, 1)), type)
    _both(b"\x08\x00\x00\x00\x00\x00\x00\xce")  # heartbeat
    _both(b"\x03\x00\x01\x00\x00\x00\x00\xce")  # empty body frame: pamqp refuses it
    # more than one property flag word
    _both(b"\x02\x00\x01\x00\x00\x00\x10" + b"\x00\x3c\x00\x00" + b"\x00" * 8 + b"\x00\x01"
          + b"\x00\x00" + b"\xce")


_ATTRIBUTES = ("content_type", "content_encoding", "headers", "delivery_mode", "priority",
               "correlation_id", "reply_to", "expiration", "message_id", "timestamp",
               "message_type", "user_id", "app_id")


@settings(max_examples=300, deadline=None)
@given(props=properties(), exchange=shortstr, routing_key=shortstr, mandatory=st.booleans(),
       body=st.binary(max_size=700), frame_max=st.sampled_from([4096, 131072]),
       channel=st.integers(1, 65535), empty=st.sampled_from(_ATTRIBUTES))
def test_publish_encoding_matches_pamqp(props, exchange, routing_key, mandatory, body,
                                        frame_max, channel, empty):
    if empty not in ("headers", "delivery_mode", "priority", "timestamp"):
        setattr(props, empty, "")  # left out of the frame, by pamqp and by us
    fields = {name: getattr(props, name) for name in _ATTRIBUTES}
    try:
        want = b"".join([
            frame.marshal(commands.Basic.Publish(exchange="", routing_key=routing_key,
                                                 mandatory=mandatory), channel),
            frame.marshal(header.ContentHeader(0, len(body), props), channel),
            *(frame.marshal(ContentBody(body[i:i + frame_max - 8]), channel)
              for i in range(0, len(body), frame_max - 8))])
    except (TypeError, ValueError):  # pamqp cannot encode this table value
        assume(False)
    got = encode_publish(channel, "", routing_key, body, fields, frame_max, mandatory)
    assert got == want
    # any exchange name (pamqp's Publish only takes names matching its own pattern)
    named = encode_publish(channel, exchange, routing_key, body, fields, frame_max)
    _, _, publish = frame.unmarshal(named[:int.from_bytes(named[3:7], "big") + 8])
    assert (publish.exchange, publish.routing_key) == (exchange, routing_key)


def test_publish_encoding_refuses_long_short_strings():
    with pytest.raises(ValueError, match="255 bytes"):
        encode_publish(1, "", "k" * 256, b"x", {}, 131072)
    with pytest.raises(ValueError, match="255 bytes"):
        encode_publish(1, "", "k", b"x", {"message_id": "é" * 128}, 131072)


def _pamqp_delivery(raw: bytes):
    """The delivery in ``raw`` as pamqp decodes it, in the shape take_delivery gives."""
    taken, _, deliver = frame.unmarshal(raw)
    n, _, head = frame.unmarshal(raw[taken:])
    taken += n
    body = b""
    while len(body) < head.body_size:
        n, _, part = frame.unmarshal(raw[taken:])
        taken += n
        body += part.value
    props = {name: value for name in (*_ATTRIBUTES, "cluster_id")
             if (value := getattr(head.properties, name)) is not None and
             not (name == "cluster_id" and value == "")}
    return taken, (deliver.delivery_tag, deliver.redelivered, deliver.exchange,
                   deliver.routing_key, props, body, deliver.consumer_tag)


@settings(max_examples=200, deadline=None)
@given(props=properties(), consumer_tag=shortstr, delivery_tag=st.integers(0, 2**63 - 1),
       redelivered=st.booleans(), routing_key=shortstr, body=st.binary(max_size=300),
       channel=st.integers(1, 65535))
def test_take_delivery_matches_pamqp(props, consumer_tag, delivery_tag, redelivered,
                                     routing_key, body, channel):
    try:
        content = frame.marshal(header.ContentHeader(0, len(body), props), channel)
    except (TypeError, ValueError):  # pamqp cannot encode this table value
        assume(False)
    raw = (_deliver_frame(consumer_tag, delivery_tag, redelivered, "ex", routing_key, channel)
           + content + (frame.marshal(ContentBody(body), channel) if body else b""))
    taken, expected = _pamqp_delivery(raw)
    got = take_delivery(bytearray(raw + b"\x08\x00\x00\x00\x00\x00\x00\xce"))
    assert got is not None
    size, d = got
    assert size == taken
    assert (d.delivery_tag, d.redelivered, d.exchange, d.routing_key, d.props, d.body,
            d.consumer_tag) == expected
    # incomplete: left for the frame-by-frame path
    for cut in (0, 11, taken - len(body) - 1, taken - 1):
        assert take_delivery(bytearray(raw[:cut])) is None


def test_take_delivery_leaves_other_frames_and_multi_frame_bodies():
    deliver = _deliver_frame("t", 1, False, "", "q", 1)
    body = b"x" * 10
    head = frame.marshal(header.ContentHeader(0, len(body), commands.Basic.Properties()), 1)
    split = frame.marshal(ContentBody(body[:4]), 1) + frame.marshal(ContentBody(body[4:]), 1)
    assert take_delivery(bytearray(deliver + head + split)) is None
    other = frame.marshal(header.ContentHeader(0, len(body), commands.Basic.Properties()), 2)
    assert take_delivery(bytearray(deliver + other + frame.marshal(ContentBody(body), 2))) is None
    assert take_delivery(bytearray(frame.marshal(commands.Basic.Ack(5, True), 1))) is None
    whole = deliver + head + frame.marshal(ContentBody(body), 1)
    for bad in _corruptions(whole):  # never wrong: a delivery as pamqp reads it, or None
        got = take_delivery(bytearray(bad))
        if got is not None:
            assert _pamqp_delivery(bad[:got[0]])[1][4:6] == (got[1].props, got[1].body)
