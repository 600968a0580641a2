"""AMQP field tables that keep their wire types, for headers the broker rewrites.

pamqp decodes ``b``/``s``/``I``/``l`` integers alike to ``int`` and re-encodes each in
the smallest type, in sorted key order. RabbitMQ keeps a header's type (a publisher's
``I`` stays ``I``) and writes ``x-death`` ``count`` as a ``l`` (Java clients read it as
a ``Long``). Here a value is a ``(tag, value)`` pair: tables are dicts of such pairs (in
wire order), arrays lists of them; anything else (``S`` text, ``x`` bytes, numbers) is
the plain value.

Plain tables (what clients publish) are dicts of Python values encoded as pamqp does,
except :class:`Long` values (``l``) and floats (``d``): :func:`encode_plain_table`.
"""

from __future__ import annotations

import functools
import struct
from typing import Any

from pamqp import encode as pamqp_encode

from ..compiled import twin

Typed = tuple[str, Any]

_FIXED = {
    "b": ">b",
    "B": ">B",
    "s": ">h",
    "u": ">H",
    "I": ">i",
    "i": ">I",
    "l": ">q",
    "L": ">Q",
    "f": ">f",
    "d": ">d",
    "T": ">Q",
}
_U32 = struct.Struct(">I")
_H = struct.Struct(">H").pack
_Q = struct.Struct(">q").pack
_D = struct.Struct(">d").pack


#: Tables and arrays inside one another that a peer may send. Real clients nest three
#: deep (x-death: an array of tables); a bound keeps decoding cheap and every later
#: walk of the value safe (2,000 levels made pamqp's decoder recurse out of stack).
MAX_NESTING = 64


def nests_deeper(value: Any, limit: int = MAX_NESTING) -> bool:
    """Whether decoded ``value`` has tables or arrays nested more than ``limit`` deep
    (walked without recursion)."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = list(item.values())
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth >= limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


#: Bytes each fixed-size field value takes after its type tag (pamqp's types).
_FIXED_SIZE = {ord(tag): struct.calcsize(fmt) for tag, fmt in _FIXED.items()} | {ord("t"): 1, ord("D"): 5}
_VOID = (ord("V"), 0)
_STRINGS = (ord("S"), ord("x"))
_TABLE, _ARRAY = ord("F"), ord("A")


class NestedTooDeep(ValueError):
    """A field table with tables or arrays nested more than :data:`MAX_NESTING` deep."""


def check_table(data: bytes, offset: int = 0, limit: int = MAX_NESTING) -> int:
    """Walk the field table at ``offset`` of ``data`` without decoding it (no value,
    key or container is built) and return the offset after it. ValueError as soon as
    a table or array opens more than ``limit`` levels deep (:class:`NestedTooDeep`,
    "field tables nested more than 64 deep"), or if the table is malformed (a length past its container's end,
    an unknown type).

    The work is bounded by the bytes walked, and a table refused for its depth stops
    at the level past ``limit``: decoders run this before pamqp's (which copies the
    rest of the buffer at every value, so a frame of nested tables cost it O(n²)).
    Depth counts as :func:`nests_deeper` does: the outer table is level 0."""
    unpack = _U32.unpack_from
    try:
        end = offset + 4 + unpack(data, offset)[0]
        if end > len(data):
            raise ValueError("malformed field table: length past the end")
        ends, tables = [end], [True]  # the open containers: where each ends, and its kind
        pos = offset + 4
        while ends:
            if pos >= ends[-1]:
                if pos != ends[-1]:
                    raise ValueError("malformed field table: length mismatch")
                ends.pop()
                tables.pop()
                continue
            if tables[-1]:  # a table's entry starts with its key
                pos += 1 + data[pos]
            tag = data[pos]
            pos += 1
            size = _FIXED_SIZE.get(tag)
            if size is not None:
                pos += size
            elif tag in _STRINGS:
                pos += 4 + unpack(data, pos)[0]
            elif tag in (_TABLE, _ARRAY):
                if len(ends) >= limit:
                    raise NestedTooDeep(f"field tables nested more than {limit} deep")
                inner_end = pos + 4 + unpack(data, pos)[0]
                if inner_end > ends[-1]:
                    raise ValueError("malformed field table: length mismatch")
                ends.append(inner_end)
                tables.append(tag == _TABLE)
                pos += 4
            elif tag not in _VOID:
                raise ValueError(f"unknown field type {chr(tag)!r}")
    except (struct.error, IndexError):
        raise ValueError("malformed field table: past the end") from None
    return end


def _headers_position(header: bytes) -> tuple[int, int]:
    """(property flags, where the ``headers`` table is or would be) in a content header
    payload (§4.2.6.1): after content-type and content-encoding, two short strings."""
    flags = header[12] << 8 | header[13]
    offset = 14
    if flags & 0x8000:
        offset += 1 + header[offset]
    if flags & 0x4000:
        offset += 1 + header[offset]
    return flags, offset


def headers_offset(header: bytes) -> int | None:
    """Where the ``headers`` table starts in a content header payload, or None if it has
    none (or uses property flag continuation, which no client sends)."""
    flags, offset = _headers_position(header)
    if not flags & 0x2000 or flags & 0x0001:
        return None
    return offset


def decode_table(data: bytes, offset: int = 0) -> tuple[dict[str, Typed], int]:
    """The table at ``offset`` and the offset after it; ValueError if malformed or
    nested more than :data:`MAX_NESTING` deep (refused on reaching that level)."""
    return _decode_table(data, offset, 0)


def _decode_table(data: bytes, offset: int, depth: int) -> tuple[dict[str, Typed], int]:
    if depth >= MAX_NESTING:
        raise ValueError(f"malformed field table: nested too deeply (over {MAX_NESTING} levels)")
    try:
        size = _U32.unpack_from(data, offset)[0]
        offset += 4
        end = offset + size
        table: dict[str, Typed] = {}
        while offset < end:
            length = data[offset]
            key = data[offset + 1 : offset + 1 + length].decode()
            table[key], offset = _decode_value(data, offset + 1 + length, depth)
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise ValueError(f"malformed field table: {exc}") from None
    if offset != end:
        raise ValueError("field table length mismatch")
    return table, end


def _decode_value(data: bytes, offset: int, depth: int) -> tuple[Typed, int]:
    """The value at ``offset`` inside a container ``depth`` levels deep (0: the outer
    table)."""
    tag = chr(data[offset])
    offset += 1
    fmt = _FIXED.get(tag)
    if fmt is not None:
        return (tag, struct.unpack_from(fmt, data, offset)[0]), offset + struct.calcsize(fmt)
    if tag == "t":
        return (tag, data[offset]), offset + 1
    if tag in "Sx":
        size = _U32.unpack_from(data, offset)[0]
        end = offset + 4 + size
        if end > len(data):
            raise IndexError("string past the end")
        return (tag, bytes(data[offset + 4 : end])), end
    if tag == "D":
        if offset + 5 > len(data):
            raise IndexError("decimal past the end")
        return (tag, bytes(data[offset : offset + 5])), offset + 5
    if tag == "F":
        table, end = _decode_table(data, offset, depth + 1)
        return (tag, table), end
    if tag == "A":
        if depth + 1 >= MAX_NESTING:
            raise ValueError(f"malformed field table: nested too deeply (over {MAX_NESTING} levels)")
        size = _U32.unpack_from(data, offset)[0]
        offset += 4
        end = offset + size
        items = []
        while offset < end:
            item, offset = _decode_value(data, offset, depth + 1)
            items.append(item)
        if offset != end:
            raise ValueError("field array length mismatch")
        return (tag, items), end
    if tag == "V":
        return (tag, None), offset
    raise ValueError(f"unknown field type {tag!r}")


def encode_table(table: dict[str, Typed]) -> bytes:
    parts = []
    for key, value in table.items():
        name = key.encode()
        parts.append(bytes([len(name)]) + name + encode_value(value))
    data = b"".join(parts)
    return _U32.pack(len(data)) + data


def encode_value(typed: Typed) -> bytes:
    tag, value = typed
    out = tag.encode()
    fmt = _FIXED.get(tag)
    if fmt is not None:
        return out + struct.pack(fmt, value)
    if tag == "t":
        return out + bytes([1 if value else 0])
    if tag in "Sx":
        data = value.encode() if isinstance(value, str) else bytes(value)
        return out + _U32.pack(len(data)) + data
    if tag == "D":
        return out + value
    if tag == "F":
        return out + encode_table(value)
    if tag == "A":
        data = b"".join(encode_value(item) for item in value)
        return out + _U32.pack(len(data)) + data
    if tag == "V":
        return out
    raise ValueError(f"unknown field type {tag!r}")


def text(typed: Typed | None) -> str | None:
    """The value of a ``S`` field as text (None for anything else)."""
    if typed is None or typed[0] != "S":
        return None
    return typed[1].decode(errors="replace")


def with_headers(header: bytes, table: dict[str, Typed]) -> bytes:
    """A content header payload without a ``headers`` table (flag clear) with
    ``table`` put in its place."""
    flags, offset = _headers_position(header)
    assert not flags & 0x2000
    flags |= 0x2000
    return header[:12] + struct.pack(">H", flags) + header[14:offset] + encode_table(table) + header[offset:]


@functools.cache
def _long_key(name: str) -> bytes:
    data = name.encode()
    return bytes((len(data),)) + data + b"l"


def add_long_header(header: bytes, name: str, value: int) -> bytes:
    """A content header payload with ``name`` = ``value`` (type ``l``) appended to its
    ``headers`` table, without decoding the rest: the per-delivery headers
    (``x-delivery-count``, ``x-stream-offset``, ``x-lease-seq``) stay cheap. A key
    already present is shadowed (decoders keep the last). ValueError for a header with
    property flag continuation (no client sends one; the caller takes the long way)."""
    entry = _long_key(name) + _Q(value)
    flags, offset = _headers_position(header)
    if flags & 0x0001:
        raise ValueError("property flag continuation")
    if flags & 0x2000:
        size = _U32.unpack_from(header, offset)[0]
        end = offset + 4 + size
        return b"".join(
            (header[:offset], _U32.pack(size + len(entry)), header[offset + 4 : end], entry, header[end:])
        )
    return b"".join(
        (header[:12], _H(flags | 0x2000), header[14:offset], _U32.pack(len(entry)), entry, header[offset:])
    )


class Long(int):
    """An integer a plain field table carries as ``l`` (signed 64 bits) whatever its
    size, as RabbitMQ writes ``x-death`` ``count``; a plain int gets pamqp's smallest
    type."""


def encode_plain_table(table: dict[str, Any]) -> bytes:
    """A table of plain Python values as pamqp's ``encode.field_table`` writes it (keys
    sorted, a key cut to 128 bytes), except that :class:`Long` values, at any depth, are
    written as ``l`` and floats as doubles (``d``). TypeError for a value pamqp cannot
    encode."""
    parts: list[bytes] = []
    for key, item in sorted(table.items()):
        name = key.encode()
        if len(name) > 128:
            name = name[:128].decode("utf-8", "ignore").encode()
        parts += (bytes((len(name),)), name, _plain_value(item))
    data = b"".join(parts)
    return _U32.pack(len(data)) + data


def _plain_value(item: Any) -> bytes:
    if type(item) is Long:
        return b"l" + _Q(item)
    if type(item) is float:  # a double, as pika writes it (pamqp's 'f' loses precision)
        return b"d" + _D(item)
    if isinstance(item, dict):
        return b"F" + encode_plain_table(item)
    if isinstance(item, list):
        data = b"".join(map(_plain_value, item))
        return b"A" + _U32.pack(len(data)) + data
    return pamqp_encode.encode_table_value(item)


_c = twin("leveret.amqp._cfield_table")  # the compiled twin (leveret/amqp/_cfield_table.pyx)
if _c is not None:
    _c.use_pure(add_long_header)  # what it leaves to this twin: unusual input
    add_long_header = _c.add_long_header
