"""The compiled twin of ``field_table.add_long_header`` (leveret/amqp/_cfield_table.pyx)
gives what the pure-Python one gives on any input: the same bytes, or the same
exception (class and text). Real content headers (pamqp's) and arbitrary bytes."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st
from pamqp import commands, header
from sans_io import FUZZ
from twins import outcome, pure_copies

from leveret import compiled
from leveret.amqp import field_table

PURE = pure_copies(("leveret.amqp.field_table",))["leveret.amqp.field_table"]
BUILT = compiled.twin("leveret.amqp._cfield_table") is not None
pytestmark = pytest.mark.skipif(
    not BUILT, reason="leveret.amqp._cfield_table is not built, or LEVERET_PURE_PYTHON=1 is set"
)

names = st.sampled_from(["x-stream-offset", "x-delivery-count", "x-lease-seq"]) | st.text(max_size=300)
values = st.integers(-(1 << 64), 1 << 64) | st.booleans()
short = st.text(max_size=20).filter(lambda t: len(t.encode()) <= 255)
properties = st.builds(
    commands.Basic.Properties,
    content_type=st.none() | short,
    content_encoding=st.none() | short,
    headers=st.none() | st.dictionaries(short, st.integers(0, 9) | short, max_size=3),
    delivery_mode=st.sampled_from([None, 1, 2]),
    message_id=st.none() | short,
)


def test_the_compiled_twin_is_in_use() -> None:
    twin = compiled.twin("leveret.amqp._cfield_table")
    assert field_table.add_long_header is twin.add_long_header
    assert PURE.add_long_header.__code__.co_filename.endswith("field_table.py")  # plain Python


@FUZZ
@given(props=properties, size=st.integers(0, 1 << 20), name=names, value=values)
def test_same_header_from_both_twins_on_real_content_headers(props, size, name, value) -> None:
    payload = header.ContentHeader(0, size, props).marshal()
    assert outcome(field_table.add_long_header, payload, name, value) == outcome(
        PURE.add_long_header, payload, name, value
    )


@FUZZ
@given(payload=st.binary(max_size=80), name=names, value=values)
def test_same_outcome_from_both_twins_on_any_bytes(payload, name, value) -> None:
    assert outcome(field_table.add_long_header, payload, name, value) == outcome(
        PURE.add_long_header, payload, name, value
    )


@FUZZ
@given(
    prefix=st.binary(min_size=12, max_size=12),
    flags=st.integers(0, 0xFFFF),
    rest=st.binary(max_size=60),
    table_size=st.integers(0, 0xFFFFFFFF),
    value=values,
)
def test_same_outcome_on_headers_that_lie_about_their_table(prefix, flags, rest, table_size, value) -> None:
    payload = prefix + flags.to_bytes(2, "big") + table_size.to_bytes(4, "big") + rest
    for name in ("x-stream-offset", "x-delivery-count"):
        assert outcome(field_table.add_long_header, payload, name, value) == outcome(
            PURE.add_long_header, payload, name, value
        )


def test_the_appended_header_decodes_as_a_long() -> None:
    payload = header.ContentHeader(0, 5, commands.Basic.Properties(headers={"a": 1})).marshal()
    added = field_table.add_long_header(payload, "x-stream-offset", -(1 << 63))
    decoded = header.ContentHeader()
    decoded.unmarshal(added)
    assert decoded.properties.headers == {"a": 1, "x-stream-offset": -(1 << 63)}
