"""Messages as the broker holds them.

A message keeps its content header as the raw bytes it arrived in (the payload of the
content header frame, AMQP 0-9-1 §4.2.6.1), so publisher to consumer needs no decoding of
properties. :attr:`Message.properties` decodes them lazily, with pamqp, only when routing
(headers exchange) or a feature needs them; :meth:`Message.with_properties` re-encodes
a changed copy.
"""

from __future__ import annotations

import copy
import struct

from pamqp import commands, decode
from pamqp.exceptions import UnmarshalingException
from pamqp.header import ContentHeader

from .errors import SYNTAX_ERROR, ConnectionError
from .field_table import add_long_header

Properties = commands.Basic.Properties

_BODY_SIZE = struct.Struct(">Q")
_HEADERS_FLAG = 0x2000  # property flag bit of `headers`, AMQP 0-9-1 §4.2.6.1


class Message:
    """One published message, shared by every queue it was routed to.

    ``header`` is the content header payload (class id, weight, body size, property flags
    and properties); ``body`` the concatenated body bytes.
    """

    __slots__ = ("exchange", "routing_key", "header", "body", "_properties", "_persistent")

    def __init__(self, exchange: str, routing_key: str, header: bytes, body: bytes) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.header = header
        self.body = body
        self._properties: Properties | None = None
        self._persistent: bool | None = None

    @classmethod
    def build(
        cls, exchange: str, routing_key: str, body: bytes, properties: Properties | None = None
    ) -> Message:
        """A message made by the broker itself (dead letters, events, tests)."""
        header = ContentHeader(body_size=len(body), properties=properties or Properties())
        return cls(exchange, routing_key, header.marshal(), body)

    @property
    def properties(self) -> Properties:
        """The 14 basic properties, decoded on first use (pamqp)."""
        if self._properties is None:
            decoded = ContentHeader()
            try:
                decoded.unmarshal(self.header)
            except (UnmarshalingException, struct.error, ValueError, TypeError,
                    UnicodeDecodeError, IndexError) as exc:  # the publisher sent garbage
                raise ConnectionError(SYNTAX_ERROR, f"cannot decode content properties: {exc}") from None
            self._properties = decoded.properties
        return self._properties

    def with_long_header(self, name: str, value: int) -> Message:
        """A copy with header ``name`` set to the integer ``value`` (wire type ``l``),
        spliced into the raw header: for per-delivery headers on the hot path."""
        return _with_long_header(self, name, value)

    @property
    def persistent(self) -> bool:
        """delivery_mode == 2, read from the raw header without decoding the rest."""
        if self._persistent is None:
            self._persistent = delivery_mode(self.header) == 2
        return self._persistent

    @property
    def has_expiration(self) -> bool:
        """Whether the `expiration` property is present, read from the flags alone."""
        return bool(self.header[12] & 0x01)

    @property
    def has_headers(self) -> bool:
        """Whether the `headers` property is present, read from the flags alone."""
        return bool(self.header[12] << 8 & _HEADERS_FLAG)

    def with_properties(self, properties: Properties, routing_key: str | None = None,
                        exchange: str | None = None) -> Message:
        """A copy with other properties (re-encoded) and optionally a new address."""
        header = ContentHeader(body_size=len(self.body), properties=properties).marshal()
        copy = Message(self.exchange if exchange is None else exchange,
                       self.routing_key if routing_key is None else routing_key,
                       header, self.body)
        copy._properties = properties
        return copy


#: Basic property flag bits, highest first (§4.2.6.1), with each field's wire form:
#: s short string, T field table, o octet, t timestamp.
_PROPERTY_FIELDS = tuple(zip([0x8000 >> i for i in range(14)], "ssToosssstssss"))


def check_properties(header: bytes) -> None:
    """Raise ConnectionError 502 unless a content header payload's property list is
    well-formed, so no consumer is handed properties its client cannot decode. Only
    sizes are walked (cheap); a ``headers`` table is decoded in full (pamqp)."""
    flags = header[12] << 8 | header[13]
    if not flags:
        return
    offset, end = 14, len(header)
    try:
        if flags & 0x0003:  # continuation or reserved bit: let pamqp judge
            ContentHeader().unmarshal(header)
            return
        for bit, kind in _PROPERTY_FIELDS:
            if flags & bit:
                if kind == "s":  # pamqp (and clients) decode short strings as UTF-8
                    header[offset + 1:offset + 1 + header[offset]].decode()
                    offset += 1 + header[offset]
                elif kind == "o":
                    offset += 1
                elif kind == "t":
                    offset += 8
                else:
                    size = 4 + int.from_bytes(header[offset:offset + 4], "big")
                    if offset + size > end or decode.field_table(header[offset:offset + size])[0] != size:
                        raise ValueError("headers table length mismatch")
                    offset += size
                if offset > end:
                    raise ValueError("properties truncated")
    except (UnmarshalingException, struct.error, ValueError, TypeError,
            UnicodeDecodeError, IndexError) as exc:
        raise ConnectionError(SYNTAX_ERROR, f"cannot decode content properties: {exc}") from None


def _with_long_header(message: Message, name: str, value: int) -> Message:
    try:
        header = add_long_header(message.header, name, value)
    except ValueError:  # flag continuation: take the long way
        properties = copy.copy(message.properties)
        properties.headers = {**(properties.headers or {}), name: value}
        return message.with_properties(properties)
    return Message(message.exchange, message.routing_key, header, message.body)


def delivery_mode(header: bytes) -> int | None:
    """The delivery_mode property of a (checked) content header payload, skipping
    content_type, content_encoding and headers by their lengths; None if absent."""
    flags = header[12] << 8 | header[13]
    if not flags & 0x1000:
        return None
    offset = 14
    if flags & 0x8000:
        offset += 1 + header[offset]
    if flags & 0x4000:
        offset += 1 + header[offset]
    if flags & 0x2000:
        offset += 4 + int.from_bytes(header[offset:offset + 4], "big")
    return header[offset]


def declared_body_size(header: bytes) -> int:
    """Body size from a raw content header payload (bytes 4-11), in bytes.

    Raises ``struct.error`` if the payload is shorter than 12 bytes.
    """
    return _BODY_SIZE.unpack_from(header, 4)[0]
