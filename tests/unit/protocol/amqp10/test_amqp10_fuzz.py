"""Fuzzing the AMQP 1.0 codec: any bytes, cut anywhere, give values, frames or
DecodeError (never another exception), in bounded time and memory; mangled valid frames
too. LEVERET_FUZZ_EXAMPLES=5000 for a longer hunt."""

from __future__ import annotations

import time
import tracemalloc

import pytest
from amqp10_values import values
from hypothesis import given, strategies as st
from sans_io import FUZZ, split

from leveret.protocol.amqp10 import frames as f, performatives as p, types as t
from leveret.protocol.amqp10.frames import FrameReader, encode_frame
from leveret.protocol.amqp10.types import DecodeError, decode

CONDITIONS = {"amqp:decode-error", "amqp:invalid-field", f.FRAMING_ERROR}

#: Constructors weighted in: random bytes rarely hit the compound ones otherwise.
_CONSTRUCTORS = st.sampled_from(
    [0x00, 0x40, 0x45, 0x53, 0x56, 0xA1, 0xA3, 0xC0, 0xC1, 0xD0, 0xD1, 0xE0, 0xF0]
)
amqp_ish = st.lists(
    st.one_of(_CONSTRUCTORS.map(lambda c: bytes((c,))), st.binary(max_size=6)), max_size=60
).map(b"".join)


def _decode_or_refuse(data: bytes) -> None:
    try:
        value, end = decode(data)
    except DecodeError as exc:
        assert str(exc) and exc.condition == "amqp:decode-error"
    else:
        assert 0 < end <= len(data)
        t.encode(value)  # whatever decodes encodes again


@FUZZ
@given(st.one_of(st.binary(max_size=400), amqp_ish))
def test_the_decoder_takes_any_bytes(data):
    _decode_or_refuse(data)


@FUZZ
@given(values, st.integers(0, 10_000), st.integers(0, 255))
def test_the_decoder_takes_mangled_values(value, where, byte):
    data = bytearray(t.encode(value))
    data[where % len(data)] = byte
    _decode_or_refuse(bytes(data))
    _decode_or_refuse(bytes(data[: where % len(data)]))  # and cut short


def _feed(data: bytes, cuts: list[int]) -> None:
    reader = FrameReader(max_frame_size=1024)
    try:
        for chunk in split(data, cuts):
            for item in reader.feed(chunk):
                assert isinstance(item, f.ProtocolHeader | f.Frame)
    except DecodeError as exc:
        assert str(exc) and exc.condition in CONDITIONS


@FUZZ
@given(
    st.sampled_from([b"", f.AMQP_HEADER, f.SASL_HEADER]),
    st.one_of(st.binary(max_size=400), amqp_ish),
    st.lists(st.integers(0, 500), max_size=6),
)
def test_the_frame_reader_takes_any_bytes(header, data, cuts):
    _feed(header + data, cuts)


@FUZZ
@given(
    st.sampled_from([0, 1]),
    st.integers(0, 3),
    st.one_of(st.binary(max_size=80), amqp_ish),
    st.lists(st.integers(0, 120), max_size=4),
)
def test_any_body_behind_a_valid_frame_header(kind, extra_words, body, cuts):
    """Random bodies behind a well-formed header reach the performative decoders."""
    body = bytes(4 * extra_words) + b"\x00\x53" + bytes((0x10 + len(body) % 9,)) + body
    frame = (8 + len(body)).to_bytes(4, "big") + bytes((2 + extra_words, kind, 0, 1)) + body
    _feed(f.SASL_HEADER + frame, cuts)


FRAMES = [
    p.Open("c", "h", 4096, 7, 1000, offered_capabilities=("A",), properties={"k": "v"}),
    p.Begin(1, 0, 100, 100),
    p.Attach("l", 0, True, source=p.Source("/queues/q", filter={"f": t.Described(t.Symbol("x"), "y")})),
    p.Flow(1, 2, 3, 4, 0, 5, 6, None, True),
    p.Transfer(0, 1, b"tag", 0, False, True, state=p.Modified(True, False, {"x-opt-a": 1})),
    p.Disposition(True, 1, 4, True, p.Rejected(p.Error("amqp:not-found", "no", {"a": 1}))),
    p.Detach(0, True, p.Error("amqp:internal-error")),
    p.End(),
    p.Close(),
]


@FUZZ
@given(
    st.lists(st.sampled_from(FRAMES), max_size=5),
    st.integers(0, 10_000),
    st.integers(0, 255),
    st.lists(st.integers(0, 800), max_size=4),
)
def test_mangled_valid_frames(bodies, where, byte, cuts):
    data = bytearray(
        f.AMQP_HEADER
        + b"".join(
            encode_frame(body, 1, b"payload" if isinstance(body, p.Transfer) else b"") for body in bodies
        )
    )
    data[where % len(data)] = byte
    _feed(bytes(data), cuts)


#: Small inputs built to cost much: nesting, counts and sizes at their limits.
BOMBS = {
    "2**32-1 nulls in an array32": bytes.fromhex("f0000000050fffffff40"),
    "200 arrays of 255 nulls": b"\xf0"
    + (5 + 600).to_bytes(4, "big")
    + (200).to_bytes(4, "big")
    + b"\xe0"
    + b"\x02\xff\x40" * 200,
    "a list32 claiming 2**32-1 elements": bytes.fromhex("d0ffffffffffffffff") + b"\x40" * 1000,
    "a str32 of 4 GiB": bytes.fromhex("b1ffffffff") + b"a" * 1000,
    "100,000 nested lists": b"\xc0\xff\x01" * 100_000,
    "100,000 nested described values": b"\x00\x40" * 100_000,
    "a map of 50,000 list0 keys": b"\xd1"
    + (4 + 100_000).to_bytes(4, "big")
    + (100_000).to_bytes(4, "big")
    + b"\x45\x40" * 50_000,
}


@pytest.mark.parametrize("data", BOMBS.values(), ids=BOMBS.keys())
def test_hostile_inputs_cost_little(data):
    tracemalloc.start()
    started = time.process_time()
    try:
        with pytest.raises(DecodeError):
            decode(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.process_time() - started < 2.0
    assert peak < 64 * len(data) + 2_000_000, f"{peak} bytes for {len(data)} bytes of input"


@FUZZ
@given(st.lists(st.one_of(_CONSTRUCTORS.map(lambda c: bytes((c,))), st.binary(max_size=6)), max_size=400))
def test_any_input_costs_memory_in_proportion(parts):
    """Whatever the bytes, the values built take at most ~100 bytes of memory per byte
    of input (a list0 is 1 byte and a 56-byte list; a 3-byte described value is one
    object), beyond the allowance of zero-width array elements."""
    data = b"".join(parts)
    tracemalloc.start()
    try:
        try:
            decode(data)
        except DecodeError:
            pass
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 200 * len(data) + 8 * t.ZERO_WIDTH_ALLOWANCE + 50_000


def test_a_big_valid_value_costs_in_proportion():
    """The largest allowed zero-width array (allowance plus one per byte) decodes."""
    data = b"\xf0" + (5).to_bytes(4, "big") + (t.ZERO_WIDTH_ALLOWANCE + 9).to_bytes(4, "big") + b"\x40"
    value, _ = decode(data)
    assert len(value.items) == t.ZERO_WIDTH_ALLOWANCE + 9
    with pytest.raises(DecodeError, match="zero-width"):
        decode(data[:5] + (t.ZERO_WIDTH_ALLOWANCE + 11).to_bytes(4, "big") + b"\x40")
