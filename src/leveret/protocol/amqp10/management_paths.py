"""The request targets of RabbitMQ 4's AMQP 1.0 management node (HTTP over AMQP), as
its address v2 writes them: ``/queues/:queue``, ``/queues/:queue/messages``,
``/exchanges/:exchange``, ``/bindings``, ``/bindings/src=…;dstq=…;key=…;args=…`` and
``/bindings?src=…&dstq=…&key=…``. Names are percent-encoded (RFC 3986: every byte of
their UTF-8 but the unreserved ``A-Z a-z 0-9 - . _ ~``), so a ``/`` in a name is ``%2F``
and never splits the path. Sans-I/O, no broker state: parsing errors are
:class:`BadTarget`, which the management node answers with status ``400``.
"""

from __future__ import annotations

import base64
import re
import zlib
from dataclasses import dataclass

from leveret.core.exchange import freeze

_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_HEX = frozenset(b"0123456789abcdefABCDEF")

#: A binding's path segment: source, destination kind (``e`` exchange, ``q`` queue),
#: destination, binding key (percent-encoded) and the arguments' hash (URL-safe base64),
#: as RabbitMQ 4 accepts it.
_BINDING_SEGMENT = re.compile(
    r"src=([0-9A-Za-z\-._~%]+);dst([eq])=([0-9A-Za-z\-._~%]+);"
    r"key=([0-9A-Za-z\-._~%]*);args=([0-9A-Za-z\-_]*)"
)


class BadTarget(ValueError):
    """A request target or path segment that cannot be parsed (status ``400``); the
    message is RabbitMQ's kind of text (``bad binding path segment '…'``)."""


def quote(name: str) -> str:
    """``name`` percent-encoded for one path segment (uppercase hex, as RabbitMQ's
    ``uri_string:quote`` and the AMQP 1.0 clients' address helpers)."""
    out = []
    for byte in name.encode("utf-8"):
        out.append(chr(byte) if byte in _UNRESERVED else f"%{byte:02X}")
    return "".join(out)


def unquote(text: str, plus_is_space: bool = False) -> str:
    """The name ``text`` percent-encodes. BadTarget for a ``%`` not followed by two hex
    digits or bytes that are not UTF-8 (RabbitMQ refuses both). ``plus_is_space``: a
    ``+`` is a space (query strings, ``application/x-www-form-urlencoded``)."""
    if "%" not in text and not (plus_is_space and "+" in text):
        return text
    raw = text.encode("utf-8")
    out = bytearray()
    i, end = 0, len(raw)
    while i < end:
        byte = raw[i]
        if byte == 0x25:  # '%'
            pair = raw[i + 1 : i + 3]
            if len(pair) != 2 or pair[0] not in _HEX or pair[1] not in _HEX:
                raise BadTarget(f"bad percent-encoding in '{text}'")
            out.append(int(pair, 16))
            i += 3
            continue
        out.append(0x20 if plus_is_space and byte == 0x2B else byte)
        i += 1
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError:
        raise BadTarget(f"'{text}' does not percent-encode UTF-8") from None


def split_target(target: str) -> tuple[list[str], dict[str, str]]:
    """A request target's path segments (still percent-encoded: decode each with
    :func:`unquote` after matching) and its decoded query parameters (the last of a
    repeated name wins). BadTarget unless the path is absolute (``/…``)."""
    path, _, query = target.partition("?")
    if not path.startswith("/"):
        raise BadTarget(f"failed to parse request target '{target}': not an absolute path")
    params: dict[str, str] = {}
    if query:
        for pair in query.split("&"):
            if not pair:
                continue
            name, _, value = pair.partition("=")
            params[unquote(name, True)] = unquote(value, True)
    return path[1:].split("/"), params


@dataclass(frozen=True, slots=True)
class BindingRef:
    """A binding named by a path segment: ``kind`` is ``queue`` or ``exchange``;
    ``args_hash`` is :func:`args_hash` of its arguments (empty for none)."""

    source: str
    kind: str
    destination: str
    key: str
    args_hash: str


def parse_binding_segment(segment: str) -> BindingRef:
    """The binding a ``src=…;dstq=…;key=…;args=…`` (or ``dste=``) segment names.
    BadTarget (``bad binding path segment '…'``) if it does not have that form."""
    match = _BINDING_SEGMENT.fullmatch(segment)
    if match is None:
        raise BadTarget(f"bad binding path segment '{segment}'")
    source, kind, destination, key, hashed = match.groups()
    return BindingRef(
        unquote(source),
        "exchange" if kind == "e" else "queue",
        unquote(destination),
        unquote(key),
        hashed,
    )


def args_hash(arguments: dict | None) -> str:
    """The ``args=`` part of a binding's path: empty for no arguments, else six URL-safe
    base64 characters of a 32-bit CRC of the arguments (order-insensitive). Like
    RabbitMQ's (a 32-bit ``phash2``) it only tells bindings with the same source,
    destination and key apart; the values differ from RabbitMQ's, so a client reads it
    from a binding's ``location`` rather than computing it."""
    if not arguments:
        return ""
    digest = zlib.crc32(repr(freeze(arguments)).encode("utf-8")).to_bytes(4, "big")
    return base64.urlsafe_b64encode(digest).decode("ascii").rstrip("=")


def binding_location(source: str, kind: str, destination: str, key: str, arguments: dict | None) -> str:
    """The path that names a binding (RabbitMQ 4's ``location``), for ``DELETE``."""
    char = "e" if kind == "exchange" else "q"
    return (
        f"/bindings/src={quote(source)};dst{char}={quote(destination)};"
        f"key={quote(key)};args={args_hash(arguments)}"
    )
