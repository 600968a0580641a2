""":func:`leveret.amqp.field_table.check_table`, the walk that refuses deep field tables
before anything is decoded (issue 27 item 4), fuzzed: on well-formed tables it agrees
with the encoder (where the table ends) and with :func:`nests_deeper` (which depth is
refused); on any bytes it raises ValueError or returns, never anything else, and what it
accepts pamqp decodes without recursing deeper than the limit. The method path
(:func:`leveret.amqp.methods.check_tables`) likewise for every method with a table."""

from __future__ import annotations

import struct
import time

import pytest
from hypothesis import given, strategies as st
from pamqp import commands, decode as pamqp_decode

from leveret.amqp.errors import AMQPConnectionError
from leveret.amqp.field_table import MAX_NESTING, check_table, decode_table, encode_table, nests_deeper
from leveret.amqp.methods import decode_with_pamqp

leaves = st.one_of(
    st.tuples(st.just("b"), st.integers(-128, 127)),
    st.tuples(st.just("s"), st.integers(-(2**15), 2**15 - 1)),
    st.tuples(st.just("I"), st.integers(-(2**31), 2**31 - 1)),
    st.tuples(st.just("l"), st.integers(-(2**63), 2**63 - 1)),
    st.tuples(st.just("T"), st.integers(0, 2**64 - 1)),
    st.tuples(st.just("d"), st.floats(allow_nan=False)),
    st.tuples(st.just("t"), st.integers(0, 1)),
    st.tuples(st.just("S"), st.binary(max_size=20)),
    st.tuples(st.just("x"), st.binary(max_size=20)),
    st.tuples(st.just("D"), st.binary(min_size=5, max_size=5)),
    st.just(("V", None)),
)
keys = st.text(st.characters(codec="utf-8"), max_size=8).filter(lambda k: len(k.encode()) < 256)
typed = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.tuples(st.just("F"), st.dictionaries(keys, inner, max_size=4)),
        st.tuples(st.just("A"), st.lists(inner, max_size=4)),
    ),
    max_leaves=30,
)


def plain(value):
    """A typed value as nests_deeper sees decoded ones: dicts and lists."""
    tag, inner = value
    if tag == "F":
        return {k: plain(v) for k, v in inner.items()}
    if tag == "A":
        return [plain(v) for v in inner]
    return inner


def chain(kinds: list[bool]) -> dict:
    """Containers one in another (True: a table, False: an array), a leaf inside."""
    value = ("b", 1)
    for is_table in reversed(kinds):
        value = ("F", {"k": value}) if is_table else ("A", [value])
    return {"top": value}


@given(st.dictionaries(keys, typed, max_size=5))
def test_a_well_formed_table_ends_where_the_encoder_ended_it(table):
    data = encode_table(table)
    assert check_table(data + b"tail") == len(data)
    assert decode_table(data)[0] == table


@given(st.lists(st.booleans(), min_size=MAX_NESTING - 3, max_size=MAX_NESTING + 3))
def test_depth_is_refused_exactly_where_nests_deeper_says(kinds):
    table = chain(kinds)
    data = encode_table(table)
    too_deep = nests_deeper({k: plain(v) for k, v in table.items()})
    if too_deep:
        with pytest.raises(ValueError, match=f"nested more than {MAX_NESTING} deep"):
            check_table(data)
        with pytest.raises(ValueError, match="nested too deeply"):
            decode_table(data)
    else:
        assert check_table(data) == len(data)
        assert decode_table(data)[0] == table


@given(st.dictionaries(keys, typed, max_size=4), st.data())
def test_any_bytes_raise_value_error_or_pass_and_what_passes_is_shallow(table, data):
    raw = bytearray(encode_table(table))
    for _ in range(data.draw(st.integers(0, 4))):  # a few flipped bytes
        if raw:
            raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    raw += data.draw(st.binary(max_size=8))
    try:
        end = check_table(bytes(raw))
    except ValueError:
        return
    assert 4 <= end <= len(raw)
    try:
        _, decoded = pamqp_decode.field_table(bytes(raw[:end]))
    except (ValueError, UnicodeDecodeError):
        return
    assert not nests_deeper(decoded)


@given(st.binary(max_size=64))
def test_random_bytes_raise_value_error_or_pass(raw):
    try:
        assert check_table(raw) <= len(raw)
    except ValueError:
        pass


def test_a_frame_of_nested_tables_is_refused_in_microseconds():
    """128 KB of tables in tables: refused at level 65, the rest never walked."""
    table = struct.pack(">I", 0)
    for _ in range(18_000):
        entry = b"\x01aF" + table
        table = struct.pack(">I", len(entry)) + entry
    started = time.process_time()
    for _ in range(100):
        with pytest.raises(ValueError):
            check_table(table)
    assert (time.process_time() - started) / 100 < 0.0005


METHODS_WITH_TABLES = [
    cls
    for cls in commands.INDEX_MAPPING.values()
    if any(cls.amqp_type(name) == "table" for name in cls.__slots__)
]


@pytest.mark.parametrize("cls", METHODS_WITH_TABLES, ids=lambda cls: cls.__name__)
@given(data=st.data())
def test_methods_with_tables_give_502_or_decode(cls, data):
    """Arguments of random bytes, or a valid method with a deep table in place of its
    own: decode_with_pamqp answers a method or AMQPConnectionError, nothing else."""
    index = next(i for i, c in commands.INDEX_MAPPING.items() if c is cls)
    if data.draw(st.booleans()):
        arguments = data.draw(st.binary(max_size=200))
    else:  # each table argument a chain of containers, some too deep
        depth = data.draw(st.integers(MAX_NESTING - 2, MAX_NESTING + 2))
        method = cls()
        for name in cls.__slots__:
            if cls.amqp_type(name) == "table":
                setattr(method, name, {})
        arguments = method.marshal()[4:]
        deep = encode_table(chain([True] * depth))
        arguments = arguments.replace(b"\x00\x00\x00\x00", deep, 1)
    try:
        decode_with_pamqp(index, struct.pack(">I", index) + arguments)
    except AMQPConnectionError as exc:
        assert exc.reply_code in (502, 540)
