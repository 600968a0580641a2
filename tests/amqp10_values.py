"""Hypothesis strategies for AMQP 1.0 values (leveret.protocol.amqp10.types' Python
representations) and a type-strict equality, shared by the AMQP 1.0 codec's tests."""

from __future__ import annotations

import math
import struct
import uuid
from typing import Any

from hypothesis import strategies as st

from leveret.protocol.amqp10 import types as t

text = st.text(st.characters(codec="utf-8"), max_size=12)
ascii_text = st.text(st.characters(codec="ascii"), max_size=12)


def _float32(x: float) -> t.Float32:
    return t.Float32(struct.unpack(">f", struct.pack(">f", x))[0])


#: One strategy per array element type of scalars (the values an array of it holds).
SCALARS: dict[str, st.SearchStrategy[Any]] = {
    "null": st.none(),
    "boolean": st.booleans(),
    "ubyte": st.integers(0, 255).map(t.UByte),
    "ushort": st.integers(0, 2**16 - 1).map(t.UShort),
    "uint": st.one_of(st.integers(0, 300), st.integers(0, 2**32 - 1)).map(t.UInt),
    "ulong": st.one_of(st.integers(0, 300), st.integers(0, 2**64 - 1)).map(t.ULong),
    "byte": st.integers(-128, 127).map(t.Byte),
    "short": st.integers(-(2**15), 2**15 - 1).map(t.Short),
    "int": st.one_of(st.integers(-200, 200), st.integers(-(2**31), 2**31 - 1)).map(t.Int),
    "long": st.one_of(st.integers(-200, 200), st.integers(-(2**63), 2**63 - 1)),
    "float": st.floats(width=32, allow_nan=False).map(_float32),
    "double": st.floats(allow_nan=False),
    "decimal32": st.binary(min_size=4, max_size=4).map(t.Decimal32),
    "decimal64": st.binary(min_size=8, max_size=8).map(t.Decimal64),
    "decimal128": st.binary(min_size=16, max_size=16).map(t.Decimal128),
    "char": st.characters(codec="utf-8").map(t.Char),
    "timestamp": st.integers(-(2**63), 2**63 - 1).map(t.Timestamp),
    "uuid": st.uuids(),
    "binary": st.one_of(st.binary(max_size=12), st.binary(min_size=256, max_size=300)),
    "string": st.one_of(text, st.text(min_size=256, max_size=300)),
    "symbol": st.one_of(ascii_text, st.text(st.characters(codec="ascii"), min_size=256, max_size=300)).map(
        t.Symbol
    ),
}
scalar = st.one_of(*SCALARS.values())
descriptor = st.one_of(st.integers(0, 2**64 - 1).map(t.ULong), ascii_text.map(t.Symbol))


@st.composite
def scalar_arrays(draw: Any) -> t.Array:
    kind = draw(st.sampled_from(sorted(SCALARS)))
    items = tuple(draw(st.lists(SCALARS[kind], max_size=5)))
    described = draw(st.booleans())
    return t.Array(kind, items, draw(descriptor) if described else None)


def _compounds(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.lists(children, max_size=5),
        st.dictionaries(scalar, children, max_size=4),
        st.builds(t.Described, descriptor, children),
        st.lists(st.lists(children, max_size=3), max_size=3).map(lambda items: t.Array("list", tuple(items))),
    )


values = st.recursive(st.one_of(scalar, scalar_arrays()), _compounds, max_leaves=20)


def same(a: Any, b: Any) -> bool:
    """Equal values of the same Python types, all the way down (1 is not True, a Symbol
    is not a str, -0.0 is not 0.0)."""
    if type(a) is not type(b):
        return isinstance(a, list | tuple) and isinstance(b, list | tuple) and _same_items(a, b)
    if isinstance(a, float):
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    if isinstance(a, list | tuple):
        return _same_items(a, b)
    if isinstance(a, dict):
        return _same_items(list(a.items()), list(b.items()))
    if isinstance(a, t.Described):
        return same(a.descriptor, b.descriptor) and same(a.value, b.value)
    if isinstance(a, t.Array):
        return a.type == b.type and same(a.descriptor, b.descriptor) and _same_items(a.items, b.items)
    if isinstance(a, uuid.UUID):
        return a == b
    return bool(a == b)


def _same_items(a: Any, b: Any) -> bool:
    return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
