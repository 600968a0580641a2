"""Fuzzing the AMQP 1.0 message format: any payload gives a message or DecodeError
(``amqp:decode-error``, ``amqp:invalid-field``), never another exception, and a message
it gives survives everything the broker does with one (encode for a receiver, neutral
properties, headers, the store, the modified outcome). Valid messages of random
sections pass their bare message through untouched, mangled ones are refused cleanly.
LEVERET_FUZZ_EXAMPLES=5000 for a longer hunt."""

from __future__ import annotations

import datetime

from amqp10_values import ascii_text, scalar, text, values
from hypothesis import given, strategies as st
from sans_io import FUZZ

from leveret.core.message import FORMATS, Death, Message, Properties
from leveret.protocol.amqp.message import content_header
from leveret.protocol.amqp10 import sections as s, types as t
from leveret.protocol.amqp10.message import (
    annotated,
    decode_transfer,
    delivery_time,
    encode_transfer,
    message_subject,
    message_to,
    payload,
)
from leveret.protocol.amqp10.types import DecodeError

CONDITIONS = {"amqp:decode-error", "amqp:invalid-field"}

_SECTION_START = st.sampled_from([bytes((0x00, 0x53, code)) for code in range(0x70, 0x79)])
_CONSTRUCTORS = st.sampled_from([bytes((c,)) for c in (0x40, 0x45, 0xA0, 0xA1, 0xB0, 0xC0, 0xC1, 0xD0, 0x00)])
message_ish = st.lists(st.one_of(_SECTION_START, _CONSTRUCTORS, st.binary(max_size=8)), max_size=40).map(
    b"".join
)


def section(code: int, value) -> bytes:
    return t.encode(t.Described(t.ULong(code), value))


def _opt(strategy):
    return st.one_of(st.none(), strategy)


ids = st.one_of(st.integers(0, 2**64 - 1).map(t.ULong), st.uuids(), st.binary(max_size=20), text)
header = st.lists(st.none(), max_size=0) | st.tuples(
    _opt(st.booleans()),
    _opt(st.integers(0, 255).map(t.UByte)),
    _opt(st.integers(0, 2**32 - 1).map(t.UInt)),
    _opt(st.booleans()),
    _opt(st.integers(0, 2**32 - 1).map(t.UInt)),
).map(list)
properties = st.tuples(
    _opt(ids),
    _opt(st.binary(max_size=10)),
    _opt(text),
    _opt(text),
    _opt(text),
    _opt(ids),
    _opt(ascii_text.map(t.Symbol)),
    _opt(ascii_text.map(t.Symbol)),
    _opt(st.integers(-(2**40), 2**42).map(t.Timestamp)),
    _opt(st.integers(-(2**40), 2**42).map(t.Timestamp)),
    _opt(text),
    _opt(st.integers(0, 2**32 - 1).map(t.UInt)),
    _opt(text),
).map(list)
annotations = st.dictionaries(
    st.one_of(ascii_text.map(lambda k: t.Symbol("x-" + k)), st.integers(0, 2**64 - 1).map(t.ULong)),
    values,
    max_size=5,
)
application = st.dictionaries(text, scalar, max_size=5)


def _sections(code: int):
    return lambda items: [section(code, item) for item in items]


bodies = st.one_of(
    st.lists(st.binary(max_size=300), min_size=1, max_size=3).map(_sections(0x75)),
    st.lists(st.lists(values, max_size=3), min_size=1, max_size=2).map(_sections(0x76)),
    values.map(lambda v: [section(0x77, v)]),
)


@st.composite
def messages(draw) -> bytes:
    out = []
    if draw(st.booleans()):
        out.append(section(0x70, draw(header)))
    if draw(st.booleans()):
        out.append(section(0x71, draw(annotations)))
    if draw(st.booleans()):
        out.append(section(0x72, draw(annotations)))
    if draw(st.booleans()):
        out.append(section(0x73, draw(properties)))
    if draw(st.booleans()):
        out.append(section(0x74, draw(application)))
    out += draw(bodies)
    if draw(st.booleans()):
        out.append(section(0x78, draw(annotations)))
    return b"".join(out)


def exercise(message: Message) -> None:
    """What the broker does with a message: none of it may fail (or only with
    DecodeError where the adapter reads a field at publish)."""
    for read in (message_to, message_subject, lambda m: delivery_time(m, 0)):
        try:
            read(message)
        except DecodeError as exc:
            assert exc.condition in CONDITIONS
    out = encode_transfer(message, 1, False, 500)
    again = decode_transfer(out, message.exchange, message.routing_key)
    assert again.body == message.body
    assert (again.persistent, again.priority) == (message.persistent, message.priority)
    message.properties  # noqa: B018 - decodes
    content_header(message)
    message.with_headers({"x-delay": -5, "job": "j"})
    annotated(message, {"x-opt-n": 1})
    dead = message.dead(Death("q", "rejected", 1, "", ("q",)), "dlx", "k")
    encode_transfer(dead, 0, False, None)
    dead.death_history()
    restored = Message.restore("e", "k", message.encoded, message.body, message.meta())
    assert encode_transfer(restored, 0, True, None) == encode_transfer(
        Message(
            "e",
            "k",
            message.body,
            message.format,
            message.encoded,
            message.persistent,
            message.ttl,
            message.priority,
            cc=message.cc,
        ),
        0,
        True,
        None,
    )


def decode_or_refuse(data: bytes) -> Message | None:
    try:
        message = decode_transfer(data, "", "q")
    except DecodeError as exc:
        assert str(exc) and exc.condition in CONDITIONS
        return None
    exercise(message)
    return message


@FUZZ
@given(st.one_of(st.binary(max_size=300), message_ish))
def test_any_payload_is_a_message_or_decode_error(data):
    decode_or_refuse(data)


@FUZZ
@given(messages())
def test_valid_messages_pass_their_bare_message_through(data):
    message = decode_transfer(data, "", "q")
    exercise(message)
    out = encode_transfer(message, 0, True, None)
    assert _bare(out) == _bare(data)
    sent = s.scan(data)
    assert payload(message) == (data if sent.delivery_annotations is None else _without_delivery(data, sent))


def _bare(data: bytes) -> bytes:
    sc = s.scan(data)
    spans = [span for span in (sc.properties, sc.application_properties) if span is not None]
    return data[spans[0][0] if spans else sc.body :]


def _without_delivery(data: bytes, sc: s.Scan) -> bytes:
    start, stop = sc.delivery_annotations
    return data[:start] + data[stop:]


@FUZZ
@given(messages(), st.integers(0, 10_000), st.integers(0, 255))
def test_mangled_messages_are_refused_cleanly(data, where, byte):
    mangled = bytearray(data)
    mangled[where % len(mangled)] = byte
    decode_or_refuse(bytes(mangled))


@FUZZ
@given(messages(), st.integers(0, 10_000))
def test_cut_messages_are_refused_cleanly(data, where):
    decode_or_refuse(data[: where % len(data)])


plain = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(),
        st.text(max_size=10),
        st.binary(max_size=10),
        st.datetimes(timezones=st.just(datetime.UTC)),
        st.decimals(allow_nan=False, places=2),
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=8,
)
neutral = st.builds(
    Properties,
    content_type=_opt(st.text(max_size=10)),
    content_encoding=_opt(st.text(max_size=10)),
    headers=_opt(st.dictionaries(st.text(max_size=12), plain, max_size=5)),
    delivery_mode=_opt(st.sampled_from([1, 2])),
    priority=_opt(st.integers(0, 9)),
    correlation_id=_opt(st.one_of(st.text(max_size=50), st.uuids().map(lambda u: f"urn:uuid:{u}"))),
    reply_to=_opt(st.text(max_size=20)),
    expiration=_opt(st.integers(0, 10**6).map(str)),
    message_id=_opt(st.text(max_size=50)),
    timestamp=_opt(st.datetimes(timezones=st.just(datetime.UTC))),
    type=_opt(st.text(max_size=10)),
    user_id=_opt(st.text(max_size=10)),
    app_id=_opt(st.text(max_size=10)),
)


@FUZZ
@given(neutral, st.binary(max_size=300), st.sampled_from(["neutral", "amqp-0-9-1", "stomp", "mqtt"]))
def test_any_neutral_properties_reach_an_amqp_1_0_receiver(properties, body, kind):
    message = Message.build("ex", "rk", body, properties)
    message.format = FORMATS[kind] if kind != "neutral" else message.format  # rendered from properties
    out = encode_transfer(message, 0, True, None)
    again = decode_transfer(out, "ex", "rk")
    assert again.body == body or again.properties.type == "amqp-1.0"
    assert again.properties.content_type == (
        properties.content_type
        if properties.content_type is not None and properties.content_type.isascii()
        else None
    )
    exercise(again)
