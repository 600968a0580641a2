"""AMQP 1.0 framing (leveret.protocol.amqp10.frames): protocol headers, frames and
empty frames read whole whatever the cuts, the max frame size (512 bytes before open)
enforced from the frame header before the body is held, and each framing error raised
as amqp:connection:framing-error."""

from __future__ import annotations

import itertools

import pytest

from leveret.protocol.amqp10 import frames as f, performatives as p, types as t
from leveret.protocol.amqp10.frames import FrameReader, ProtocolHeader, encode_frame
from leveret.protocol.amqp10.types import DecodeError

#: What a client sends to open a connection and send a message, SASL included.
CLIENT = [
    ProtocolHeader(f.PROTOCOL_SASL),
    f.Frame(0, p.SaslInit("PLAIN", b"\x00guest\x00guest", "localhost"), type=f.TYPE_SASL),
    ProtocolHeader(f.PROTOCOL_AMQP),
    f.Frame(0, p.Open("client-1", "localhost", 65536, 255, 30000)),
    f.Frame(3, p.Begin(None, 0, 2048, 2048)),
    f.Frame(3, p.Attach("sender", 0, p.ROLE_SENDER, source=p.Source("s"), target=p.Target("/queues/q"))),
    f.Frame(
        3, p.Transfer(0, 0, b"\x00", 0, settled=False), payload=bytes(p.to_described(p.Data(b"hi")).value)
    ),
    f.Frame(0),
    f.Frame(3, p.Detach(0, True)),
    f.Frame(0, p.Close(p.Error("amqp:internal-error", "bye"))),
]


def wire(items) -> bytes:
    out = b""
    for item in items:
        if isinstance(item, ProtocolHeader):
            out += item.to_bytes()
        else:
            out += encode_frame(item.body, item.channel, item.payload, item.type)
    return out


def test_a_client_session_reads_back_whatever_the_cuts():
    data = wire(CLIENT)
    for step in (1, 3, 7, len(data)):
        reader = FrameReader(max_frame_size=512)
        out = []
        for i in range(0, len(data), step):
            out += reader.feed(data[i : i + step])
        assert out == CLIENT


def test_every_two_cut_split_of_a_short_session():
    data = wire(CLIENT[2:5])
    for a, b in itertools.combinations(range(len(data) + 1), 2):
        reader = FrameReader()
        assert reader.feed(data[:a]) + reader.feed(data[a:b]) + reader.feed(data[b:]) == CLIENT[2:5]


def test_empty_frame_is_a_heartbeat():
    assert encode_frame(None) == f.EMPTY_FRAME
    reader = FrameReader()
    assert reader.feed(f.AMQP_HEADER + f.EMPTY_FRAME) == [ProtocolHeader(0), f.Frame(0)]


def test_the_extended_header_is_skipped():
    body = t.encode(p.to_described(p.Close()))
    frame = (8 + 4 + len(body)).to_bytes(4, "big") + bytes((3, 0, 0, 7)) + b"ext!" + body
    assert FrameReader().feed(f.AMQP_HEADER + frame) == [ProtocolHeader(0), f.Frame(7, p.Close())]


def test_the_frame_size_limit_is_checked_from_the_header():
    reader = FrameReader()  # 512 bytes before open
    reader.feed(f.AMQP_HEADER)
    exactly = encode_frame(p.Transfer(0), 1, b"x" * (512 - f.frame_overhead(p.Transfer(0), 1)))
    assert len(exactly) == 512 and reader.feed(exactly) != []
    with pytest.raises(DecodeError, match="513 bytes") as caught:
        reader.feed((513).to_bytes(4, "big") + b"\x02\x00\x00\x00")  # the header alone is enough
    assert caught.value.condition == f.FRAMING_ERROR
    big = FrameReader(max_frame_size=512)
    big.feed(f.AMQP_HEADER)
    big.max_frame_size = 1 << 20  # open agreed a larger size
    frame = encode_frame(p.Transfer(0), 1, b"y" * 100_000)
    assert big.feed(frame)[0].payload == b"y" * 100_000
    assert len(big._buffer) == 0  # the big frame's bytes are not kept
    with pytest.raises(ValueError):
        big.max_frame_size = 511
    with pytest.raises(ValueError):
        big.max_frame_size = int.from_bytes(b"AMQP", "big")


def test_protocol_headers_of_other_versions_are_returned_for_the_connection_to_answer():
    reader = FrameReader()
    (header,) = reader.feed(b"AMQP\x00\x00\x09\x01")  # AMQP 0-9-1's header
    assert header == ProtocolHeader(0, 0, 9, 1) and not header.supported
    assert (
        ProtocolHeader(f.PROTOCOL_SASL).supported
        and ProtocolHeader(f.PROTOCOL_TLS).to_bytes() == f.TLS_HEADER
    )


def test_a_partial_header_waits():
    reader = FrameReader()
    assert (
        reader.feed(b"AM") == []
        and reader.feed(b"QP\x03\x01\x00") == []
        and reader.feed(b"\x00") == [ProtocolHeader(3)]
    )


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"GET / HTTP/1.1\r\n", "protocol header"),
        (b"X", "protocol header"),
        (f.AMQP_HEADER + b"\x00\x00\x00\x07\x02\x00\x00\x00", "7 bytes"),
        (f.AMQP_HEADER + b"\x00\x00\x00\x08\x01\x00\x00\x00", "data offset 1"),
        (f.AMQP_HEADER + b"\x00\x00\x00\x08\x03\x00\x00\x00", "data offset 3"),
        (f.AMQP_HEADER + b"\x00\x00\x00\x08\x02\x02\x00\x00", "type 2"),
        (f.SASL_HEADER + b"\x00\x00\x00\x08\x02\x01\x00\x00", "empty SASL"),
    ],
)
def test_framing_errors(data, message):
    with pytest.raises(DecodeError, match=message) as caught:
        FrameReader().feed(data)
    assert caught.value.condition == f.FRAMING_ERROR


def _frame(body: bytes, kind: int = f.TYPE_AMQP) -> bytes:
    return (8 + len(body)).to_bytes(4, "big") + bytes((2, kind, 0, 0)) + body


@pytest.mark.parametrize(
    ("data", "message", "condition"),
    [
        (_frame(t.encode(p.to_described(p.Close())) + b"x"), "after a close", f.FRAMING_ERROR),
        (_frame(t.encode([1])), "not a performative", "amqp:decode-error"),
        (_frame(t.encode(p.to_described(p.SaslInit("PLAIN")))), "AMQP frame holding", "amqp:decode-error"),
        (
            _frame(t.encode(p.to_described(p.Open("c"))), f.TYPE_SASL),
            "SASL frame holding",
            "amqp:decode-error",
        ),
        (_frame(t.encode(p.to_described(p.Accepted()))), "AMQP frame holding", "amqp:decode-error"),
        (_frame(t.encode(t.Described(t.ULong(0x10), [None]))), "mandatory", "amqp:invalid-field"),
        (_frame(b"\x00\x53\x10\xc0\x05\x01"), "past the end", "amqp:decode-error"),
    ],
)
def test_bodies_that_do_not_decode(data, message, condition):
    reader = FrameReader()
    with pytest.raises(DecodeError, match=message) as caught:
        reader.feed(f.AMQP_HEADER + data)
    assert caught.value.condition == condition


def test_encode_frame_refuses_a_bad_channel():
    with pytest.raises(ValueError):
        encode_frame(p.Close(), 65536)
    assert f.frame_overhead(p.Transfer(0, 1, b"t")) == len(encode_frame(p.Transfer(0, 1, b"t")))
