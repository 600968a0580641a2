"""The AMQP field types of a delivered message's headers, as they were on the wire.

pika (like pamqp) decodes a ``long`` (``l``) and a ``short-short`` (``b``) integer
alike as ``int``; a Java or .NET client does not (Spring AMQP reads ``x-death``
``count`` as a ``Long``). :func:`install` makes pika keep the raw bytes of each content
header so that :func:`typed_headers` can decode the headers table with its type tags.

The decoder here is written independently of :mod:`leveret.amqp.field_table` on purpose:
it checks the broker's bytes, so it must not share the broker's codec (or its bugs).
"""

from __future__ import annotations

import struct
from typing import Any

import pika.spec

_installed = False


def install() -> None:
    """Make pika remember the encoded properties (``props._wire``); idempotent."""
    global _installed
    if _installed:
        return
    original = pika.spec.BasicProperties.decode

    def decode(self: pika.spec.BasicProperties, encoded: bytes, offset: int = 0):
        self._wire = bytes(encoded[offset:])
        return original(self, encoded, offset)

    pika.spec.BasicProperties.decode = decode
    _installed = True


def typed_headers(properties: Any) -> dict | None:
    """``properties.headers`` as ``{key: (tag, value)}``, tables and arrays nested the
    same way (``('A', [(tag, value), ...])``, ``('F', {...})``); None without headers.
    Works on pika BasicProperties decoded after :func:`install`, or on raw bytes."""
    raw = properties if isinstance(properties, (bytes, bytearray)) else properties._wire
    flags, offset = struct.unpack_from(">H", raw, 0)[0], 2
    more = flags
    while more & 1:  # continuation flag words
        more = struct.unpack_from(">H", raw, offset)[0]
        offset += 2
    for bit in (0x8000, 0x4000):  # content-type, content-encoding: shortstr
        if flags & bit:
            offset += 1 + raw[offset]
    if not flags & 0x2000:
        return None
    table, _ = _table(raw, offset)
    return table


def _table(raw: bytes, offset: int) -> tuple[dict, int]:
    size = struct.unpack_from(">I", raw, offset)[0]
    offset += 4
    end = offset + size
    out = {}
    while offset < end:
        length = raw[offset]
        key = raw[offset + 1:offset + 1 + length].decode()
        offset += 1 + length
        out[key], offset = _value(raw, offset)
    return out, end


_FIXED = {"b": ">b", "B": ">B", "s": ">h", "u": ">H", "I": ">i", "i": ">I", "l": ">q",
          "L": ">Q", "f": ">f", "d": ">d", "T": ">Q"}


def _value(raw: bytes, offset: int) -> tuple[tuple[str, Any], int]:
    tag = chr(raw[offset])
    offset += 1
    if tag in _FIXED:
        fmt = _FIXED[tag]
        return (tag, struct.unpack_from(fmt, raw, offset)[0]), offset + struct.calcsize(fmt)
    if tag == "t":
        return (tag, bool(raw[offset])), offset + 1
    if tag in "Sx":
        size = struct.unpack_from(">I", raw, offset)[0]
        data = raw[offset + 4:offset + 4 + size]
        return (tag, data.decode() if tag == "S" else data), offset + 4 + size
    if tag == "D":
        scale, value = struct.unpack_from(">Bi", raw, offset)
        return (tag, (scale, value)), offset + 5
    if tag == "F":
        table, offset = _table(raw, offset)
        return (tag, table), offset
    if tag == "A":
        size = struct.unpack_from(">I", raw, offset)[0]
        offset += 4
        end = offset + size
        items = []
        while offset < end:
            item, offset = _value(raw, offset)
            items.append(item)
        return (tag, items), end
    if tag == "V":
        return (tag, None), offset
    raise ValueError(f"unknown field type {tag!r} at {offset - 1}")


def shape(typed: Any) -> Any:
    """Type tags only (values dropped), for comparing structure: ``{'x-death': ('A',
    [('F', {'count': 'l', ...})])}``; key order is kept (dicts preserve it)."""
    if isinstance(typed, dict):
        return {k: shape(v) for k, v in typed.items()}
    tag, value = typed
    if tag == "F":
        return ("F", shape(value))
    if tag == "A":
        return ("A", [shape(v) for v in value])
    return tag
