"""Messages as the broker holds them.

A message keeps its content header as the raw bytes it arrived in (the payload of the
content header frame, AMQP 0-9-1 §4.2.6.1), so publisher to consumer needs no decoding of
properties. :attr:`Message.properties` decodes them lazily, with pamqp, only when routing
(headers exchange) or a feature needs them; :meth:`Message.with_properties` re-encodes
a changed copy.
"""

from __future__ import annotations

import struct

from pamqp import commands
from pamqp.header import ContentHeader

Properties = commands.Basic.Properties

_BODY_SIZE = struct.Struct(">Q")
_HEADERS_FLAG = 0x2000  # property flag bit of `headers`, AMQP 0-9-1 §4.2.6.1


class Message:
    """One published message, shared by every queue it was routed to.

    ``header`` is the content header payload (class id, weight, body size, property flags
    and properties); ``body`` the concatenated body bytes.
    """

    __slots__ = ("exchange", "routing_key", "header", "body", "_properties")

    def __init__(self, exchange: str, routing_key: str, header: bytes, body: bytes) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.header = header
        self.body = body
        self._properties: Properties | None = None

    @classmethod
    def build(
        cls, exchange: str, routing_key: str, body: bytes, properties: Properties | None = None
    ) -> Message:
        """A message made by the broker itself (dead letters, events, tests)."""
        header = ContentHeader(body_size=len(body), properties=properties or Properties())
        return cls(exchange, routing_key, header.marshal(), body)

    @property
    def body_size(self) -> int:
        return len(self.body)

    @property
    def properties(self) -> Properties:
        """The 14 basic properties, decoded on first use (pamqp)."""
        if self._properties is None:
            decoded = ContentHeader()
            decoded.unmarshal(self.header)
            self._properties = decoded.properties
        return self._properties

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


def declared_body_size(header: bytes) -> int:
    """Body size from a raw content header payload (bytes 4-11), in bytes.

    Raises ``struct.error`` if the payload is shorter than 12 bytes.
    """
    return _BODY_SIZE.unpack_from(header, 4)[0]
