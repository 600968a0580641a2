"""field_table: typed AMQP field tables (exact bytes, round trips, malformed input) and the
content-header helpers that rewrite the ``headers`` property without decoding the rest.

Unlike pamqp, this codec keeps every value's wire type (``('I', 5)`` stays ``I``), keeps
keys in wire order, and writes ``d`` doubles as ``d``; where both write the same type the
bytes must be pamqp's.
"""

from __future__ import annotations

import datetime
import decimal
import struct

import pytest
from hypothesis import given, settings, strategies as st
from pamqp import commands, decode as pamqp_decode, encode as pamqp_encode, header as pamqp_header

from leveret.amqp import field_table

Properties = commands.Basic.Properties


def table_bytes(entries: bytes) -> bytes:
    return struct.pack(">I", len(entries)) + entries


# -- exact bytes of every field type -----------------------------------------------------
EXACT = [
    (("t", True), b"t\x01"),
    (("t", False), b"t\x00"),
    (("b", -128), b"b\x80"),
    (("b", 127), b"b\x7f"),
    (("B", 255), b"B\xff"),
    (("s", -32768), b"s\x80\x00"),
    (("u", 65535), b"u\xff\xff"),
    (("I", -2), b"I\xff\xff\xff\xfe"),
    (("i", 2**32 - 1), b"i\xff\xff\xff\xff"),
    (("l", -(2**63)), b"l\x80" + b"\x00" * 7),
    (("l", 1), b"l" + b"\x00" * 7 + b"\x01"),
    (("L", 2**64 - 1), b"L" + b"\xff" * 8),
    (("f", 1.5), b"f\x3f\xc0\x00\x00"),
    (("d", 1.5), b"d\x3f\xf8" + b"\x00" * 6),
    (("D", b"\x02\x00\x00\x00\x7b"), b"D\x02\x00\x00\x00\x7b"),  # 1.23: scale, then value
    (("T", 1704067200), b"T\x00\x00\x00\x00\x65\x92\x00\x80"),
    (("S", b"caf\xc3\xa9"), b"S\x00\x00\x00\x05caf\xc3\xa9"),
    (("S", "café"), b"S\x00\x00\x00\x05caf\xc3\xa9"),  # text is written as UTF-8
    (("S", b""), b"S\x00\x00\x00\x00"),
    (("x", b"\x00\xff"), b"x\x00\x00\x00\x02\x00\xff"),
    (("V", None), b"V"),
    (("F", {}), b"F\x00\x00\x00\x00"),
    (("F", {"a": ("b", 1)}), b"F\x00\x00\x00\x04\x01ab\x01"),
    (("A", []), b"A\x00\x00\x00\x00"),
    (("A", [("b", 1), ("S", b"a")]), b"A\x00\x00\x00\x08b\x01S\x00\x00\x00\x01a"),
]


@pytest.mark.parametrize("typed,wire", EXACT, ids=[f"{t[0]}-{i}" for i, (t, _) in enumerate(EXACT)])
def test_each_field_type_encodes_to_its_exact_bytes(typed, wire):
    assert field_table.encode_value(typed) == wire
    table = field_table.encode_table({"k": typed})
    assert table == table_bytes(b"\x01k" + wire)
    decoded, end = field_table.decode_table(table)
    assert end == len(table)
    assert list(decoded) == ["k"] and decoded["k"][0] == typed[0]


@pytest.mark.parametrize("typed,plain", [
    (("t", True), True),
    (("b", -1), -1),
    (("s", 200), 200),
    (("u", 40000), 40000),
    (("I", 70000), 70000),
    (("i", 2**31), 2**31),
    (("l", 2**40), 2**40),
    (("f", 1.5), 1.5),  # pamqp writes every float as f
    (("S", b"text"), "text"),
    (("x", b"\x00\x01"), bytearray(b"\x00\x01")),
    (("V", None), None),
    (("D", b"\x02\x00\x00\x00\x7b"), decimal.Decimal("1.23")),
    (("T", 1704067200), datetime.datetime(2024, 1, 1)),
    (("F", {"a": ("b", 1), "b": ("S", b"x")}), {"a": 1, "b": "x"}),
    (("A", [("b", 1), ("S", b"a"), ("t", False)]), [1, "a", False]),
])
def test_bytes_match_pamqps_encoder_where_it_picks_the_same_type(typed, plain):
    assert field_table.encode_table({"k": typed}) == pamqp_encode.field_table({"k": plain})


def test_keys_stay_in_wire_order_where_pamqp_sorts_them():
    table = {"zeta": ("b", 1), "alpha": ("b", 2)}
    data = field_table.encode_table(table)
    assert data.index(b"zeta") < data.index(b"alpha")
    assert list(field_table.decode_table(data)[0]) == ["zeta", "alpha"]
    assert pamqp_encode.field_table({"zeta": 1, "alpha": 2}) != data  # pamqp: sorted


def test_integer_types_are_kept_not_narrowed():
    table = {"count": ("l", 1), "small": ("I", 5)}
    data = field_table.encode_table(table)
    assert field_table.decode_table(data)[0] == table
    assert b"count" + b"l" in data and b"small" + b"I" in data
    assert pamqp_decode.field_table(data)[1] == {"count": 1, "small": 5}


def test_a_duplicate_key_on_the_wire_keeps_the_last_value():
    data = table_bytes(b"\x01kb\x01" + b"\x01kb\x02")
    assert field_table.decode_table(data)[0] == {"k": ("b", 2)}


def test_decode_at_an_offset_returns_the_end_offset():
    table = field_table.encode_table({"a": ("S", b"x")})
    data = b"prefix" + table + b"suffix"
    assert field_table.decode_table(data, 6) == ({"a": ("S", b"x")}, 6 + len(table))


def test_text_reads_only_longstr_values():
    assert field_table.text(("S", b"caf\xc3\xa9")) == "café"
    assert field_table.text(("S", b"\xff")) == "\ufffd"  # invalid UTF-8 is replaced
    assert field_table.text(("x", b"abc")) is None
    assert field_table.text(("I", 1)) is None
    assert field_table.text(None) is None


# -- round trips --------------------------------------------------------------------------
keys = st.text(max_size=20).filter(lambda k: len(k.encode()) <= 255)
scalars = st.one_of(
    st.tuples(st.just("t"), st.booleans()),
    st.tuples(st.just("b"), st.integers(-128, 127)),
    st.tuples(st.just("B"), st.integers(0, 255)),
    st.tuples(st.just("s"), st.integers(-(2**15), 2**15 - 1)),
    st.tuples(st.just("u"), st.integers(0, 2**16 - 1)),
    st.tuples(st.just("I"), st.integers(-(2**31), 2**31 - 1)),
    st.tuples(st.just("i"), st.integers(0, 2**32 - 1)),
    st.tuples(st.just("l"), st.integers(-(2**63), 2**63 - 1)),
    st.tuples(st.just("L"), st.integers(0, 2**64 - 1)),
    st.tuples(st.just("f"), st.floats(width=32, allow_nan=False)),
    st.tuples(st.just("d"), st.floats(allow_nan=False)),
    st.tuples(st.just("T"), st.integers(0, 2**64 - 1)),
    st.tuples(st.just("D"), st.binary(min_size=5, max_size=5)),
    st.tuples(st.sampled_from("Sx"), st.binary(max_size=40)),
    st.just(("V", None)),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.tuples(st.just("F"), st.dictionaries(keys, inner, max_size=4)),
        st.tuples(st.just("A"), st.lists(inner, max_size=4)),
    ),
    max_leaves=20,
)
tables = st.dictionaries(keys, values, max_size=6)


@given(table=tables)
def test_decode_of_encode_is_the_same_table(table):
    data = field_table.encode_table(table)
    assert field_table.decode_table(data) == (table, len(data))


@given(table=tables)
def test_encode_of_decode_is_the_same_bytes(table):
    data = field_table.encode_table(table)
    assert field_table.encode_table(field_table.decode_table(data)[0]) == data


# -- malformed tables ----------------------------------------------------------------------
@pytest.mark.parametrize("data,message", [
    (b"", "malformed"),
    (b"\x00\x00", "malformed"),
    (table_bytes(b"\x01kZ"), "unknown field type 'Z'"),
    (table_bytes(b"\x01kb"), "malformed"),  # value missing
    (table_bytes(b"\x01kI\x00\x00"), "malformed"),  # value cut short
    (table_bytes(b"\x01k"), "malformed"),  # no type
    (table_bytes(b"\x05k"), "malformed"),  # key cut short
    (table_bytes(b"\x01\xffb\x01"), "malformed"),  # key not UTF-8
    (table_bytes(b"\x01kS\x00\x00\x00\x09abc"), "malformed"),  # string past the end
    (table_bytes(b"\x01kx\xff\xff\xff\xffabc"), "malformed"),
    (b"\x00\x00\x00\x08\x01kD\x02", "malformed"),  # decimal cut short by the data's end
    (table_bytes(b"\x01kD\x02\x00") + b"\x00" * 3, "length mismatch"),  # past the table's end
    (b"\x00\x00\x00\x03\x01kb\x01", "length mismatch"),  # the value runs past the table
    (b"\x00\x00\x00\x09\x01kb\x01", "malformed"),  # the table runs past the data
    (table_bytes(b"\x01kA\x00\x00\x00\x01b\x01"), "field array length mismatch"),
    (table_bytes(b"\x01kF\x00\x00\x00\x01\x01ab\x01"), "length mismatch"),
])
def test_malformed_table_raises_value_error(data, message):
    with pytest.raises(ValueError, match=message):
        field_table.decode_table(data)


@given(table=tables.filter(bool), data=st.data())
def test_every_truncation_of_a_table_raises_value_error(table, data):
    encoded = field_table.encode_table(table)
    cut = data.draw(st.integers(0, len(encoded) - 1), label="cut")
    truncated = encoded[:cut]
    with pytest.raises(ValueError):
        field_table.decode_table(truncated)
    # the same bytes with the declared size kept (a frame cut short) fail too
    if cut >= 4:
        with pytest.raises(ValueError):
            field_table.decode_table(encoded[:4] + truncated[4:])


@settings(max_examples=300)
@given(data=st.binary(max_size=200))
def test_garbage_raises_only_value_error(data):
    try:
        table, end = field_table.decode_table(data)
    except ValueError:
        return
    assert end <= len(data)
    assert field_table.encode_table(table) == data[:end]


def test_deeply_nested_tables_raise_value_error_not_recursion_error():
    data = b""
    for _ in range(5000):  # ~35 kB: fits in a content header frame
        data = table_bytes(b"\x01kF" + data) if data else table_bytes(b"")
    with pytest.raises(ValueError):
        field_table.decode_table(data[:-4] + b"\x00\x00\x00\x01")  # and malformed at the core
    # a well-formed one too deep for the interpreter is refused the same way
    with pytest.raises(ValueError, match="nested too deeply"):
        field_table.decode_table(data)


def test_unknown_type_cannot_be_encoded():
    with pytest.raises(ValueError, match="unknown field type 'Z'"):
        field_table.encode_value(("Z", 1))


# -- content headers ------------------------------------------------------------------------
def content_header(properties: Properties, body_size: int = 11) -> bytes:
    return pamqp_header.ContentHeader(0, body_size, properties).marshal()


def parse(header: bytes) -> pamqp_header.ContentHeader:
    parsed = pamqp_header.ContentHeader()
    parsed.unmarshal(header)
    return parsed


ALL_BUT_HEADERS = dict(
    content_type="text/plain", content_encoding="gzip", delivery_mode=2, priority=3,
    correlation_id="corr", reply_to="replies", expiration="60000", message_id="m-1",
    timestamp=datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC), message_type="t",
    user_id="guest", app_id="app")


@pytest.mark.parametrize("properties", [
    Properties(),
    Properties(delivery_mode=2),
    Properties(content_type="application/json"),
    Properties(content_encoding="utf-8"),
    Properties(content_type="a" * 255, content_encoding="b" * 200, message_id="id"),
    Properties(**ALL_BUT_HEADERS),
])
def test_headers_offset_is_none_without_headers_and_with_headers_the_table_start(properties):
    header = content_header(properties)
    assert field_table.headers_offset(header) is None
    with_table = content_header(Properties(**{**_props(properties), "headers": {"a": 1}}))
    offset = field_table.headers_offset(with_table)
    assert offset is not None
    assert field_table.decode_table(with_table, offset)[0] == {"a": ("b", 1)}


def _props(properties: Properties) -> dict:
    return {name: getattr(properties, name) for name in properties.attributes()
            if getattr(properties, name) is not None}


def test_headers_offset_is_none_with_property_flag_continuation():
    header = bytearray(content_header(Properties(headers={"a": 1})))
    header[13] |= 0x01
    assert field_table.headers_offset(bytes(header)) is None


@pytest.mark.parametrize("properties", [Properties(), Properties(**ALL_BUT_HEADERS)])
def test_with_headers_puts_a_table_where_none_was_and_keeps_every_other_property(properties):
    header = content_header(properties, body_size=1234)
    table = {"x-death": ("A", [("F", {"count": ("l", 1), "reason": ("S", b"expired")})]),
             "b-first": ("I", 7)}
    rewritten = field_table.with_headers(header, table)
    parsed = parse(rewritten)
    assert parsed.body_size == 1234
    assert parsed.properties.headers == {"x-death": [{"count": 1, "reason": "expired"}], "b-first": 7}
    assert _props(parsed.properties) == {**_props(properties), "headers": parsed.properties.headers}
    offset = field_table.headers_offset(rewritten)
    end = offset + len(field_table.encode_table(table))
    assert field_table.decode_table(rewritten, offset) == (table, end)
    assert list(field_table.decode_table(rewritten, offset)[0]) == ["x-death", "b-first"]  # our order


@pytest.mark.parametrize("properties", [
    Properties(), Properties(**ALL_BUT_HEADERS), Properties(headers={}),
    Properties(headers={"a": "text", "n": 300}), Properties(**ALL_BUT_HEADERS, headers={"z": [1, 2]}),
])
def test_add_long_header_appends_a_long_and_keeps_everything_else(properties):
    header = content_header(properties, body_size=99)
    rewritten = field_table.add_long_header(header, "x-delivery-count", 3)
    parsed = parse(rewritten)
    assert parsed.body_size == 99
    before = _props(properties).get("headers") or {}
    assert parsed.properties.headers == {**before, "x-delivery-count": 3}
    assert {k: v for k, v in _props(parsed.properties).items() if k != "headers"} == {
        k: v for k, v in _props(properties).items() if k != "headers"}
    table = field_table.decode_table(rewritten, field_table.headers_offset(rewritten))[0]
    assert table["x-delivery-count"] == ("l", 3)  # a long, as RabbitMQ writes counts
    assert list(table)[-1] == "x-delivery-count"


def test_add_long_header_twice_shadows_the_first_value():
    header = content_header(Properties(headers={"x-delivery-count": 1}))
    header = field_table.add_long_header(header, "x-delivery-count", 2)
    header = field_table.add_long_header(header, "x-delivery-count", 5)
    assert parse(header).properties.headers == {"x-delivery-count": 5}
    assert field_table.decode_table(header, field_table.headers_offset(header))[0] == {
        "x-delivery-count": ("l", 5)}


@given(value=st.integers(-(2**63), 2**63 - 1), name=st.sampled_from(
    ["x-delivery-count", "x-stream-offset", "x-lease-seq", "é" * 50]))
def test_add_long_header_writes_any_signed_64_bit_value(value, name):
    rewritten = field_table.add_long_header(content_header(Properties(app_id="a")), name, value)
    assert parse(rewritten).properties.headers == {name: value}
    assert parse(rewritten).properties.app_id == "a"


def test_add_long_header_refuses_property_flag_continuation():
    header = bytearray(content_header(Properties()))
    header[13] |= 0x01
    with pytest.raises(ValueError, match="continuation"):
        field_table.add_long_header(bytes(header), "x-delivery-count", 1)
