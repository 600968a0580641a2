"""The AMQP 1.0 type codec (leveret.protocol.amqp10.types): every encoding of part 1
§1.6 with its known bytes, the smallest encoding chosen, every value round-tripping, and
each malformed input refused with DecodeError (amqp:decode-error) within the limits."""

from __future__ import annotations

import uuid

import pytest
from amqp10_values import same, values
from hypothesis import given, settings

from leveret.protocol.amqp10 import types as t
from leveret.protocol.amqp10.types import DecodeError, decode, decode_all, encode

U = uuid.UUID("12345678-1234-5678-1234-567812345678")

#: (value, its smallest encoding) for every constructor encode chooses (§1.6).
KNOWN = [
    (None, "40"),
    (True, "41"),
    (False, "42"),
    (t.UByte(255), "50ff"),
    (t.UShort(258), "600102"),
    (t.UInt(0), "43"),
    (t.UInt(7), "5207"),
    (t.UInt(256), "7000000100"),
    (t.ULong(0), "44"),
    (t.ULong(255), "53ff"),
    (t.ULong(2**64 - 1), "80ffffffffffffffff"),
    (t.Byte(-1), "51ff"),
    (t.Short(-2), "61fffe"),
    (t.Int(-128), "5480"),
    (t.Int(128), "7100000080"),
    (-1, "55ff"),
    (2**40, "810000010000000000"),
    (t.Float32(1.5), "723fc00000"),
    (1.5, "823ff8000000000000"),
    (t.Decimal32(b"\x01\x02\x03\x04"), "7401020304"),
    (t.Decimal64(bytes(range(8))), "840001020304050607"),
    (t.Decimal128(bytes(range(16))), "94" + bytes(range(16)).hex()),
    (t.Char("€"), "73000020ac"),
    (t.Timestamp(1_000), "8300000000000003e8"),
    (U, "98" + U.bytes.hex()),
    (b"ab", "a0026162"),
    (b"x" * 256, "b000000100" + "78" * 256),
    ("é", "a102c3a9"),
    ("y" * 256, "b100000100" + "79" * 256),
    (t.Symbol("ab"), "a3026162"),
    (t.Symbol("z" * 256), "b300000100" + "7a" * 256),
    ([], "45"),
    ([None, True], "c003024041"),
    ([None] * 255, "d0000001030000 00ff".replace(" ", "") + "40" * 255),
    ({t.Symbol("k"): 1}, "c10602a3016b5501"),
    (t.Array("symbol", (t.Symbol("a"), t.Symbol("bc"))), "e00702a30161026263"),
    (t.Array("uint", (t.UInt(1), t.UInt(300))), "e00a0270000000010000012c"),
    (t.Array("uint", (t.UInt(0), t.UInt(3))), "e00402520003"),
    (t.Array("null", (None, None)), "e0020240"),
    (t.Array("boolean", (True,)), "e003015601"),
    (t.Array("list", ([], [1])), "e00802c0010003015501"),
    (t.Described(t.ULong(0x10), []), "00531045"),
    (t.Described(t.Symbol("a:b"), "v"), "00a303613a62a10176"),
    (t.Array("string", ("a",), t.ULong(1)), "e00701005301a10161"),
]


@pytest.mark.parametrize(("value", "wire"), KNOWN, ids=[w[:12] for _, w in KNOWN])
def test_known_encodings(value, wire):
    assert encode(value).hex() == wire
    decoded, end = decode(bytes.fromhex(wire))
    assert end == len(wire) // 2
    assert same(decoded, value)


#: Encodings encode never chooses (the wider or other forms) that decode must still read.
OTHER_FORMS = [
    ("5600", False),
    ("5601", True),
    ("700000000a", t.UInt(10)),
    ("800000000000000001", t.ULong(1)),
    ("7100000001", t.Int(1)),
    ("810000000000000001", 1),
    ("a00100", b"\x00"),
    ("b00000000161", b"a"),
    ("b10000000161", "a"),
    ("b30000000161", t.Symbol("a")),
    ("c00100", []),
    ("d0000000040000000 0".replace(" ", ""), []),
    ("d1000000040000000 0".replace(" ", ""), {}),
    ("c10100", {}),
    ("f000000006000000015201", t.Array("uint", (t.UInt(1),))),
    ("e0020143", t.Array("uint", (t.UInt(0),))),
    ("00a3017840", t.Described(t.Symbol("x"), None)),
]


@pytest.mark.parametrize(("wire", "value"), OTHER_FORMS)
def test_other_forms_decode(wire, value):
    decoded, end = decode(bytes.fromhex(wire))
    assert same(decoded, value) and end == len(wire) // 2


@settings(max_examples=300, deadline=None)
@given(values)
def test_every_value_round_trips(value):
    data = encode(value)
    decoded, end = decode(data)
    assert end == len(data)
    assert same(decoded, value), (value, decoded)
    assert encode(decoded) == data  # the smallest encoding is stable


def test_decode_at_an_offset_and_decode_all():
    data = b"junk" + encode(t.UInt(5)) + encode("s") + encode([1])
    value, end = decode(data, 4)
    assert same(value, t.UInt(5)) and end == 6
    assert decode_all(data, 4) == [5, "s", [1]]
    assert decode(data, 4, 6) == (5, 6)
    with pytest.raises(DecodeError, match="past the end"):
        decode(data, 6, 7)  # "s" is cut by the end given
    with pytest.raises(DecodeError, match="past the end"):
        decode(data[:8], 6, 100)  # an end past the data is the data's end
    with pytest.raises(DecodeError, match="offset"):
        decode(data, 100)
    assert decode(bytearray(b"\xa0\x01x")) == (b"x", 3) and decode(memoryview(b"\xa1\x01x")) == ("x", 3)


@pytest.mark.parametrize(
    "value",
    [
        t.UByte(256),
        t.UInt(-1),
        t.ULong(2**64),
        t.Byte(128),
        t.Int(2**31),
        2**63,
        t.Symbol("é"),
        "\ud800",
        object(),
        t.Decimal32(b"abc"),
        t.Float32(1e300),
        t.Array("double", (2**1024,)),
        t.Char("ab"),
        t.Timestamp(2**63),
        t.Array("nope", ()),
        t.Array("uint", (t.UInt(1), "x")),
        t.Array("list", (1,)),
    ],
    ids=repr,
)
def test_encode_refuses_what_amqp_cannot_carry(value):
    with pytest.raises(ValueError):
        encode(value)


#: (bytes, what the error says) for each malformed input.
MALFORMED = [
    ("", "past the end"),
    ("01", "unknown constructor"),
    ("5602", "boolean of 2"),
    ("70000000", "past the end"),
    ("a005616263", "past the end"),
    ("a102c328", "UTF-8"),
    ("a10460a080 80".replace(" ", ""), "UTF-8"),  # an overlong form
    ("a30180", "ASCII"),
    ("7300110000", "not a Unicode scalar"),
    ("730000d800", "not a Unicode scalar"),
    ("c00500", "too small|past the end|elements"),
    ("c00005", "too small"),
    ("c0020340", "elements in"),
    ("c002017000000001", "past the end"),  # an element past its list's size
    ("c0040240404040", "do not fill"),
    ("c1050340404040", "odd number"),
    ("c103024540", "unhashable"),
    ("c10b04a10161a10162a101614040", "same key twice"),
    ("d0ffffffff00000000", "past the end"),
    ("e00201ff", "unknown array element"),
    ("e003015602", "boolean of 2"),
    ("e00402007040", "past the end|described"),
    ("e00501005301" + "00", "itself described"),
    ("00", "past the end"),
    ("f0000000050fffffff70", "elements in"),
]


@pytest.mark.parametrize(("wire", "message"), MALFORMED)
def test_malformed_input_is_refused(wire, message):
    with pytest.raises(DecodeError, match=message) as caught:
        decode(bytes.fromhex(wire))
    assert caught.value.condition == "amqp:decode-error"


def test_nesting_is_bounded():
    value: object = None
    for _ in range(t.MAX_DEPTH):
        value = [value]
    assert same(decode(encode(value))[0], value)  # 64 levels: fine
    described = b"\x00\x53\x01" * (t.MAX_DEPTH + 1) + b"\x40"  # 65 described values
    with pytest.raises(DecodeError, match="nested more than"):
        decode(described)


def test_deep_lists_are_refused_without_recursion_error():
    nested = b"\x40"
    for _ in range(10_000):
        nested = b"\xd0" + (len(nested) + 4).to_bytes(4, "big") + b"\x00\x00\x00\x01" + nested
    with pytest.raises(DecodeError, match="nested more than"):
        decode(nested)


def test_arrays_of_zero_width_elements_are_bounded():
    """An array32 of 2**32 - 1 nulls is 10 bytes: refused, not built."""
    bomb = bytes.fromhex("f0000000050fffffff40")
    with pytest.raises(DecodeError, match="zero-width"):
        decode(bomb)
    # nested: many small arrays of nulls, each within the allowance, cannot add up either
    inner = b"\x02\xff\x40"  # the body of an array8 of 255 nulls
    outer = b"\xf0" + (4 + 1 + len(inner) * 200).to_bytes(4, "big") + (200).to_bytes(4, "big") + b"\xe0"
    outer += inner * 200  # 200 of them: 51,000 nulls from 611 bytes
    with pytest.raises(DecodeError, match="zero-width"):
        decode(outer)
    small = decode(b"\xe0\x02\x0a\x40")[0]
    assert small == t.Array("null", (None,) * 10)


def test_map_keys_equal_in_python_are_refused():
    data = encode({t.Symbol("a"): 1, "b": 2}).replace(b"\xa1\x01b", b"\xa1\x01a")
    with pytest.raises(DecodeError, match="same key twice"):
        decode(data)
