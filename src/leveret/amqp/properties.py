"""The basic content properties (AMQP 0-9-1 §4.2.6.1) in a content header payload.

A content header payload is class id (2 bytes), weight (2), body size (8), property
flags (2, highest bit first) and the present properties in flag order. The broker keeps
the payload as it arrived; these functions read what it needs without decoding the rest,
and :func:`decode` / :func:`encode` go through pamqp for everything else.
"""

from __future__ import annotations

import struct
from typing import Any

from pamqp import commands, decode as pamqp_decode, encode as pamqp_encode
from pamqp.exceptions import UnmarshalingException
from pamqp.header import ContentHeader

from .errors import SYNTAX_ERROR, AMQPConnectionError
from .field_table import MAX_NESTING, NestedTooDeep, check_table, encode_plain_table

Properties = commands.Basic.Properties

#: (flag bit, pamqp attribute name, wire type) of the 14 properties in wire order;
#: wire types: s short string, T field table, o octet, t timestamp.
PROPERTY_LAYOUT = tuple(
    zip(
        [0x8000 >> i for i in range(14)],
        (
            "content_type",
            "content_encoding",
            "headers",
            "delivery_mode",
            "priority",
            "correlation_id",
            "reply_to",
            "expiration",
            "message_id",
            "timestamp",
            "message_type",
            "user_id",
            "app_id",
            "cluster_id",
        ),
        "ssToosssstssss",
        strict=True,
    )
)
PROPERTY_NAMES = tuple(name for _, name, _ in PROPERTY_LAYOUT)

HEADERS_FLAG = 0x2000
DELIVERY_MODE_FLAG = 0x1000
PRIORITY_FLAG = 0x0800
REPLY_TO_FLAG = 0x0200
EXPIRATION_FLAG = 0x0100

_BODY_SIZE = struct.Struct(">Q")
# RecursionError: tables nested deeper than pamqp's recursive decoder can go.
_DECODE_ERRORS = (
    UnmarshalingException,
    struct.error,
    ValueError,
    TypeError,
    UnicodeDecodeError,
    IndexError,
    RecursionError,
)


def scan(header: bytes) -> tuple[int | None, int | None, str | None]:
    """Check a content header payload and return ``(delivery_mode, priority,
    expiration)`` (None when absent).

    Raises AMQPConnectionError 502 SYNTAX_ERROR unless the property list is well-formed, so
    no consumer is handed properties its client cannot decode. Only sizes are walked
    (cheap); a ``headers`` table is decoded in full (pamqp)."""
    flags = header[12] << 8 | header[13]
    if not flags:
        return None, None, None
    delivery_mode = priority = expiration = None
    offset, end = 14, len(header)
    try:
        if flags & 0x0003:  # continuation or reserved bit: let pamqp judge
            properties = decode(header)
            return properties.delivery_mode, properties.priority, properties.expiration
        for bit, _, kind in PROPERTY_LAYOUT:
            if flags & bit:
                if kind == "s":  # pamqp (and clients) decode short strings as UTF-8
                    text = header[offset + 1 : offset + 1 + header[offset]].decode()
                    if bit == EXPIRATION_FLAG:
                        expiration = text
                    offset += 1 + header[offset]
                elif kind == "o":
                    if bit == DELIVERY_MODE_FLAG:
                        delivery_mode = header[offset]
                    else:
                        priority = header[offset]
                    offset += 1
                elif kind == "t":
                    offset += 8
                else:
                    size = 4 + int.from_bytes(header[offset : offset + 4], "big")
                    try:  # depth and lengths first, nothing decoded (field_table.py)
                        check_table(header, offset)
                    except NestedTooDeep:
                        raise ValueError(f"headers nested more than {MAX_NESTING} deep") from None
                    table = header[offset : offset + size]
                    consumed, _ = pamqp_decode.field_table(table)
                    if offset + size > end or consumed != size:
                        raise ValueError("headers table length mismatch")
                    offset += size
                if offset > end:
                    raise ValueError("properties truncated")
    except _DECODE_ERRORS as exc:
        raise AMQPConnectionError(SYNTAX_ERROR, f"cannot decode content properties: {exc}") from None
    return delivery_mode, priority, expiration


def decode(header: bytes) -> Properties:
    """All 14 properties of a content header payload (pamqp); AMQPConnectionError 502 if
    they do not decode."""
    decoded = ContentHeader()
    try:
        decoded.unmarshal(header)
    except _DECODE_ERRORS as exc:
        raise AMQPConnectionError(SYNTAX_ERROR, f"cannot decode content properties: {exc}") from None
    return decoded.properties


def encode(properties: Properties, body_size: int) -> bytes:
    """A content header payload (class 60) for ``properties`` and a body of
    ``body_size`` bytes (pamqp)."""
    return ContentHeader(body_size=body_size, properties=properties).marshal()


def delivery_mode(header: bytes) -> int | None:
    """The delivery_mode property of a (checked) content header payload, skipping
    content_type, content_encoding and headers by their lengths; None if absent."""
    flags = header[12] << 8 | header[13]
    if not flags & DELIVERY_MODE_FLAG:
        return None
    offset = 14
    if flags & 0x8000:
        offset += 1 + header[offset]
    if flags & 0x4000:
        offset += 1 + header[offset]
    if flags & HEADERS_FLAG:
        offset += 4 + int.from_bytes(header[offset : offset + 4], "big")
    return header[offset]


def has(header: bytes, flag: int) -> bool:
    """Whether the property with flag bit ``flag`` is present (flags alone)."""
    return bool((header[12] << 8 | header[13]) & flag)


def declared_body_size(header: bytes) -> int:
    """Body size from a raw content header payload (bytes 4-11), in bytes.

    Raises ``struct.error`` if the payload is shorter than 12 bytes.
    """
    return int(_BODY_SIZE.unpack_from(header, 4)[0])


def as_dict(properties: Properties) -> dict[str, Any]:
    """The present properties by pamqp attribute name."""
    return {
        name: value
        for _, name, _ in PROPERTY_LAYOUT
        if (value := getattr(properties, name, None)) not in (None, "")
    }


# Hand-written encoding of a publish's properties (the sink's and load generator's hot
# path): pamqp's generic marshalling costs more than the broker spends on a message.
# The bytes are pamqp's (tests/unit/amqp/test_codec_fastpaths.py): properties that are
# None or "" are left out, naive timestamps are UTC, tables are pamqp's but for Long
# values and floats (see :func:`.field_table.encode_plain_table`).
_PROPERTY_ORDER = {
    name: (position, flag, kind)  # sorted by position: the wire order
    for position, (flag, name, kind) in enumerate(PROPERTY_LAYOUT)
}


def shortstr(value: str) -> bytes:
    """An AMQP short string (length octet + UTF-8); ValueError above 255 bytes."""
    data = value.encode()
    if len(data) > 255:
        raise ValueError(f"AMQP short string longer than 255 bytes: {value[:40]!r}...")
    return bytes((len(data),)) + data


def encode_properties(properties: dict[str, Any]) -> tuple[int, bytes]:
    """(property flags, encoded property list) of basic properties given by pamqp
    attribute name (``message_type`` for ``type``).

    Raises ValueError for an unknown name or a short string above 255 bytes, TypeError
    for a header value that cannot be encoded."""
    unknown = properties.keys() - _PROPERTY_ORDER.keys()
    if unknown:
        raise ValueError(f"unknown message properties {sorted(unknown)}; known: {', '.join(PROPERTY_NAMES)}")
    flags = 0
    parts = []
    for name in sorted(properties, key=_PROPERTY_ORDER.__getitem__):
        value = properties[name]
        if value is None or value == "":
            continue
        _, flag, kind = _PROPERTY_ORDER[name]
        flags |= flag
        if kind == "s":
            parts.append(shortstr(value))
        elif kind == "o":
            parts.append(bytes((value,)))
        elif kind == "T":
            parts.append(encode_plain_table(value))
        else:
            parts.append(pamqp_encode.timestamp(value))
    return flags, b"".join(parts)


def properties_dict(properties: Properties | dict[str, Any] | None) -> dict[str, Any]:
    """Properties by pamqp attribute name, from a ``Basic.Properties``, a dict or None."""
    if properties is None:
        return {}
    if isinstance(properties, Properties):
        return {name: getattr(properties, name) for name in PROPERTY_NAMES}
    return properties
