"""AMQP 1.0 composites (leveret.protocol.amqp10.performatives): every performative, SASL
frame, error, terminus, delivery state and message section round-trips through
described lists and bytes; defaults are sent as null and trailing nulls left out;
missing fields take their defaults; symbolic descriptors are read; a mandatory field
left null is amqp:invalid-field and a field of the wrong type amqp:decode-error."""

from __future__ import annotations

from dataclasses import MISSING, fields
from typing import Any

import pytest
from amqp10_values import ascii_text, scalar, text, values
from hypothesis import given, settings, strategies as st

from leveret.protocol.amqp10 import performatives as p, types as t
from leveret.protocol.amqp10.types import DecodeError, Described, decode, encode

symbol = ascii_text.map(t.Symbol)
field_map = st.dictionaries(symbol, scalar, max_size=3)

KINDS: dict[str, st.SearchStrategy[Any]] = {
    "uint": st.integers(0, 2**32 - 1),
    "ushort": st.integers(0, 2**16 - 1),
    "ubyte": st.integers(0, 255),
    "ulong": st.integers(0, 2**64 - 1),
    "boolean": st.booleans(),
    "string": text,
    "symbol": symbol,
    "binary": st.binary(max_size=12),
    "timestamp": st.integers(-(2**63), 2**63 - 1),
    "symbol[]": st.lists(symbol, min_size=1, max_size=3).map(tuple),
    "fields": field_map,
    "map": st.dictionaries(scalar, scalar, max_size=3),
    "any": scalar,
}


def composite(cls: type[p.Composite]) -> st.SearchStrategy[Any]:
    """Instances of ``cls`` with every field drawn (None only where the default is)."""
    if issubclass(cls, p._Section):
        return st.builds(
            cls,
            {
                "map": field_map,
                "binary": st.binary(max_size=20),
                "list": st.lists(scalar, max_size=4),
                "any": values,
            }[cls.KIND],
        )
    args = {}
    for (kind, _mandatory), f in zip(cls.FIELDS, fields(cls)):
        strategy = _kind(kind)
        default = None if f.default is MISSING else f.default
        args[f.name] = st.one_of(st.none(), strategy) if default is None else strategy
    return st.builds(cls, **args)


def _kind(kind: str) -> st.SearchStrategy[Any]:
    if kind == "error":
        return composite(p.Error)
    if kind == "source":
        return composite(p.Source)
    if kind == "target":
        return composite(p.Target)
    if kind == "delivery-state":
        return st.one_of(*(composite(cls) for cls in p.DELIVERY_STATES))
    return KINDS[kind]


ALL = (*p.PERFORMATIVES, *p.SASL_FRAMES, *p.DELIVERY_STATES, *p.SECTIONS, p.Error, p.Source, p.Target)


@pytest.mark.parametrize("cls", ALL, ids=lambda cls: cls.__name__)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_every_composite_round_trips(cls, data):
    value = data.draw(composite(cls))
    described = p.to_described(value)
    assert described.descriptor == cls.CODE and isinstance(described.descriptor, t.ULong)
    wire = encode(described)
    back, end = decode(wire)
    assert end == len(wire)
    assert p.from_described(back) == value
    if not issubclass(cls, p._Section):
        assert not described.value or described.value[-1] is not None  # trailing nulls left out


def test_defaults_are_sent_as_null_and_trailing_nulls_left_out():
    assert encode(p.to_described(p.Open("c"))).hex() == "005310c00401a10163"
    assert p.to_described(p.Open("c", max_frame_size=2**32 - 1, channel_max=65535)).value == ["c"]
    flow = p.Flow(incoming_window=1, next_outgoing_id=2, outgoing_window=3, drain=True)
    assert p.to_described(flow).value == [None, 1, 2, 3, None, None, None, None, True]
    assert encode(p.to_described(p.Accepted())).hex() == "00532445"


def test_missing_fields_take_their_defaults_and_extra_fields_are_ignored():
    open_ = p.from_described(Described(t.ULong(0x10), ["c"]))
    assert open_ == p.Open("c") and open_.max_frame_size == 2**32 - 1 and open_.channel_max == 65535
    header = p.from_described(Described(t.ULong(0x70), [None, None, None, None, None, "extra", 5]))
    assert header == p.Header() and header.priority == 4
    assert p.from_described(Described(t.ULong(0x28), [])).expiry_policy == "session-end"


def test_symbolic_descriptors_are_read():
    value = p.from_described(Described(t.Symbol("amqp:begin:list"), [None, t.UInt(1), t.UInt(2), t.UInt(3)]))
    assert value == p.Begin(None, 1, 2, 3)
    assert p.from_described(Described(t.Symbol("amqp:data:binary"), b"x")) == p.Data(b"x")


def test_unknown_descriptors_stay_described():
    declared = Described(t.ULong(0x33), [b"txn"])
    assert p.from_described(declared) is declared
    transfer = p.from_described(
        Described(t.ULong(0x14), [t.UInt(0), None, None, None, None, None, None, declared])
    )
    assert transfer.state == declared


def test_multiple_fields_take_one_value_or_an_array():
    one = Described(t.ULong(0x40), [t.Symbol("PLAIN")])
    many = Described(t.ULong(0x40), [t.Array("symbol", (t.Symbol("PLAIN"), t.Symbol("ANONYMOUS")))])
    assert p.from_described(one).sasl_server_mechanisms == ("PLAIN",)
    assert p.from_described(many).sasl_server_mechanisms == ("PLAIN", "ANONYMOUS")
    assert p.to_described(p.SaslMechanisms(("PLAIN",))).value == [t.Symbol("PLAIN")]


@pytest.mark.parametrize(
    "described",
    [
        Described(t.ULong(0x10), []),  # open without container-id
        Described(t.ULong(0x10), [None]),
        Described(t.ULong(0x12), ["link", t.UInt(0)]),  # attach without role
        Described(t.ULong(0x15), [True]),  # disposition without first
        Described(t.ULong(0x1D), []),  # error without condition
        Described(t.ULong(0x41), []),  # sasl-init without mechanism
        Described(t.ULong(0x44), []),  # sasl-outcome without code
    ],
    ids=repr,
)
def test_a_missing_mandatory_field_is_invalid_field(described):
    with pytest.raises(DecodeError, match="mandatory") as caught:
        p.from_described(described)
    assert caught.value.condition == "amqp:invalid-field"


@pytest.mark.parametrize(
    "described",
    [
        Described(t.ULong(0x10), [t.Symbol("c"), "host", "big"]),  # max-frame-size a string
        Described(t.ULong(0x10), ["c", None, -1]),  # out of the uint range
        Described(t.ULong(0x10), ["c", None, True]),  # a boolean is not a uint
        Described(t.ULong(0x12), ["l", t.UInt(0), t.UByte(1)]),  # role not a boolean
        Described(t.ULong(0x12), ["l", t.UInt(0), True, None, None, [1]]),  # source not described
        Described(t.ULong(0x12), ["l", t.UInt(0), True, None, None, Described(t.ULong(0x29), [])]),
        Described(
            t.ULong(0x14), [t.UInt(0), None, None, None, None, None, None, Described(t.ULong(0x1D), ["x"])]
        ),
        Described(t.ULong(0x16), [t.UInt(0), None, Described(t.ULong(0x24), [])]),  # error not an error
        Described(t.ULong(0x40), [[t.Symbol("PLAIN")]]),  # a list for a multiple field
        Described(t.ULong(0x40), [t.Array("uint", (t.UInt(1),))]),
        Described(t.ULong(0x10), "not a list"),
        Described(t.ULong(0x75), "text"),  # data holds binary
        Described(t.ULong(0x72), [1]),  # message-annotations hold a map
    ],
    ids=repr,
)
def test_a_field_of_the_wrong_type_is_decode_error(described):
    with pytest.raises(DecodeError) as caught:
        p.from_described(described)
    assert caught.value.condition == "amqp:decode-error"


def test_encode_refuses_out_of_range_and_missing_mandatory_fields():
    with pytest.raises(ValueError, match="out of range"):
        p.to_described(p.Begin(None, 2**32, 0, 0))
    with pytest.raises(ValueError, match="mandatory"):
        p.to_described(p.Attach("l", None))  # type: ignore[arg-type]


def test_annotation_keys_are_written_as_symbols():
    described = p.to_described(p.MessageAnnotations({"x-opt-delivery-delay": 5}))
    (key,) = described.value
    assert type(key) is t.Symbol
    app = p.to_described(p.ApplicationProperties({"k": 1}))
    assert type(next(iter(app.value))) is str
