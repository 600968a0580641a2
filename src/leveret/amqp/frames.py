"""AMQP 0-9-1 framing (§2.3.5, §4.2.3): a sans-I/O reader and frame encoders.

:class:`FrameReader` is fed bytes and returns complete frames as
``(frame_type, channel, payload)``; it raises :class:`FrameError` (reply code 501) for a
bad end marker, an unknown frame type or a frame larger than the negotiated frame-max.
Method payloads are decoded and encoded with pamqp; content headers pass through as raw
bytes (see :mod:`.properties`). The hot functions have a compiled twin
(``_cframes.pyx``, docs/compiled.md) that replaces them at import when it is built.
"""

from __future__ import annotations

import struct

from pamqp import commands, frame as pamqp_frame
from pamqp.base import Frame as Method

from ..compiled import twin
from .errors import SYNTAX_ERROR, AMQPConnectionError, FrameError
from .methods import decode_with_pamqp
from .properties import encode_properties, shortstr

FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_END = 0xCE
FRAME_OVERHEAD = 8  # 7-byte header + end marker
PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"

_FRAME_HEAD = struct.Struct(">BHI")
_METHOD_ID = struct.Struct(">I")
HEARTBEAT = bytes((FRAME_HEARTBEAT, 0, 0, 0, 0, 0, 0, FRAME_END))
_TUNE_OK_IDS = b"\x00\x0a\x00\x1f"  # connection.tune-ok: class 10, method 31


def tune_ok_end(buffer: bytes, limit: int) -> int | None:
    """The offset just past the connection.tune-ok frame among the whole frames at the
    start of ``buffer``, or None if it is not there whole. Only frame headers are
    looked at, and only frames of at most ``limit`` bytes (a larger one is the
    reader's to refuse). Until tune-ok frames are read with the pre-login limit, and
    those after it with the frame_max it chose (a client may send tune-ok, open and
    more in one write), as RabbitMQ reads them."""
    pos, end = 0, len(buffer)
    while end - pos >= 11:
        stop = pos + 8 + int.from_bytes(buffer[pos + 3 : pos + 7], "big")
        if stop - pos > limit or stop > end:
            return None
        if buffer[pos] == FRAME_METHOD and buffer[pos + 7 : pos + 11] == _TUNE_OK_IDS:
            return stop
        pos = stop
    return None


class FrameReader:
    """Incremental frame parser. ``max_size`` is the largest frame accepted (frame-max),
    in bytes including the 8 bytes of frame overhead."""

    def __init__(self, max_size: int) -> None:
        self.max_size = max_size
        self._buffer = b""  # the start of a frame not yet complete

    def feed(self, data: bytes) -> list[tuple[int, int, bytes]]:
        """Complete frames in what has arrived so far, as ``(type, channel, payload)``.
        Raises FrameError (501) for a bad end marker, an unknown frame type or a frame
        larger than ``max_size``."""
        # Immutable bytes: a payload is one slice (one copy), and only an incomplete
        # frame at the end is kept (at most frame-max bytes).
        buffer = self._buffer + data if self._buffer else bytes(data)
        frames = []
        offset = 0
        end = len(buffer)
        max_size = self.max_size
        unpack_head = _FRAME_HEAD.unpack_from
        while end - offset >= 7:
            frame_type, channel, size = unpack_head(buffer, offset)
            if size + FRAME_OVERHEAD > max_size:
                raise FrameError(f"frame size {size} exceeds frame_max {max_size}")
            stop = offset + 7 + size
            if stop >= end:
                break
            if buffer[stop] != FRAME_END:
                raise FrameError(f"frame end marker {buffer[stop]:#x}, expected 0xce")
            if frame_type not in _FRAME_TYPES:
                raise FrameError(f"unknown frame type {frame_type}")
            frames.append((frame_type, channel, buffer[offset + 7 : stop]))
            offset = stop + 1
        self._buffer = buffer[offset:] if offset < end else b""
        return frames


_FRAME_TYPES = frozenset((FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT))


# Hand-written codecs for the methods on the publish -> deliver -> ack/nack path. A
# profile of a publish/consume run showed pamqp's generic (un)marshalling taking ~40% of
# the broker's time there; these give the same bytes and objects (tests compare them).
_PUBLISH, _ACK, _REJECT, _NACK = 0x003C0028, 0x003C0050, 0x003C005A, 0x003C0078
_DELIVER_HEAD = struct.Struct(">BHIHH")
_ACK_ARGS = struct.Struct(">QB")


#: The first four bytes of a basic.publish method frame's payload (class 60, method 40).
PUBLISH_ID = _PUBLISH.to_bytes(4, "big")


def publish_fields(payload: bytes) -> tuple[str, str, bool, bool]:
    """``(exchange, routing_key, mandatory, immediate)`` of a basic.publish method
    payload: reserved short, exchange, routing key (short strings), bits. Raises
    ValueError, IndexError (UnicodeDecodeError) if malformed."""
    at = 6
    size = payload[at]
    exchange = payload[at + 1 : at + 1 + size].decode()
    at += 1 + size
    size = payload[at]
    routing_key = payload[at + 1 : at + 1 + size].decode()
    bits = payload[at + 1 + size]
    if len(payload) != at + 2 + size:
        raise ValueError("basic.publish has trailing bytes")
    return exchange, routing_key, bool(bits & 1), bool(bits & 2)


def _publish(payload: bytes) -> Method:
    exchange, routing_key, mandatory, immediate = publish_fields(payload)
    method = commands.Basic.Publish.__new__(commands.Basic.Publish)
    method.ticket, method.exchange, method.routing_key = 0, exchange, routing_key
    method.mandatory, method.immediate = mandatory, immediate
    return method


def _ack(payload: bytes) -> Method:
    delivery_tag, bits = _ACK_ARGS.unpack(payload[4:])
    method = commands.Basic.Ack.__new__(commands.Basic.Ack)
    method.delivery_tag, method.multiple = delivery_tag, bool(bits & 1)
    return method


def _nack(payload: bytes) -> Method:
    delivery_tag, bits = _ACK_ARGS.unpack(payload[4:])
    method = commands.Basic.Nack.__new__(commands.Basic.Nack)
    method.delivery_tag, method.multiple, method.requeue = delivery_tag, bool(bits & 1), bool(bits & 2)
    return method


def _reject(payload: bytes) -> Method:
    delivery_tag, bits = _ACK_ARGS.unpack(payload[4:])
    method = commands.Basic.Reject.__new__(commands.Basic.Reject)
    method.delivery_tag, method.requeue = delivery_tag, bool(bits & 1)
    return method


_FAST_DECODERS = {_PUBLISH: _publish, _ACK: _ack, _NACK: _nack, _REJECT: _reject}


def encode_deliver(
    channel: int, consumer_tag: bytes, delivery_tag: int, redelivered: bool, exchange: str, routing_key: str
) -> bytes:
    """A basic.deliver method frame; ``consumer_tag`` already encoded (UTF-8)."""
    exchange_bytes, key_bytes = exchange.encode(), routing_key.encode()
    args = b"".join(
        (
            bytes((len(consumer_tag),)),
            consumer_tag,
            delivery_tag.to_bytes(8, "big"),
            b"\x01" if redelivered else b"\x00",
            bytes((len(exchange_bytes),)),
            exchange_bytes,
            bytes((len(key_bytes),)),
            key_bytes,
        )
    )
    return _DELIVER_HEAD.pack(FRAME_METHOD, channel, 4 + len(args), 60, 60) + args + b"\xce"


def decode_method(payload: bytes) -> Method:
    """A method frame payload as a pamqp command.

    Raises AMQPConnectionError 540 for an unknown class/method id and 502 for arguments that
    do not decode, field tables included that nest more than
    :data:`~.field_table.MAX_NESTING` deep.
    """
    if len(payload) < 4:
        raise AMQPConnectionError(SYNTAX_ERROR, "method frame too short")
    (index,) = _METHOD_ID.unpack_from(payload)
    fast = _FAST_DECODERS.get(index)
    if fast is not None:
        try:
            return fast(payload)
        except (struct.error, ValueError, IndexError) as exc:  # UnicodeDecodeError too
            raise AMQPConnectionError(SYNTAX_ERROR, f"cannot decode method {index:#x}: {exc}") from None
    return decode_with_pamqp(index, payload)


def encode_method(channel: int, method: Method) -> bytes:
    return pamqp_frame.marshal(method, channel)


def encode_frame(frame_type: int, channel: int, payload: bytes) -> bytes:
    return _FRAME_HEAD.pack(frame_type, channel, len(payload)) + payload + b"\xce"


def encode_content(channel: int, header: bytes, body: bytes, frame_max: int) -> list[bytes]:
    """Content header frame plus body frames split at ``frame_max`` (§4.2.6.2)."""
    parts = [_FRAME_HEAD.pack(FRAME_HEADER, channel, len(header)), header, b"\xce"]
    if body:
        chunk = frame_max - FRAME_OVERHEAD
        pack = _FRAME_HEAD.pack
        for start in range(0, len(body), chunk):
            piece = body[start : start + chunk]
            parts += (pack(FRAME_BODY, channel, len(piece)), piece, b"\xce")
    return parts


def encode_delivery(
    channel: int,
    consumer_tag: bytes,
    delivery_tag: int,
    redelivered: bool,
    exchange: str,
    routing_key: str,
    header: bytes,
    body: bytes,
    frame_max: int,
) -> list[bytes]:
    """The frames of one delivery, to be written in this order: basic.deliver
    (:func:`encode_deliver`), its content header (``header``, a content header payload)
    and body frames split at ``frame_max`` bytes (:func:`encode_content`). The compiled
    twin gives them as one bytes object in a list; their concatenation is the same."""
    parts = encode_content(channel, header, body, frame_max)
    parts.insert(0, encode_deliver(channel, consumer_tag, delivery_tag, redelivered, exchange, routing_key))
    return parts


_PUBLISH_ID = struct.Struct(">HHH").pack(60, 40, 0)  # basic.publish, reserved-1
_CONTENT_PREFIX = struct.Struct(">HHQH").pack


def encode_publish(
    channel: int,
    exchange: str,
    routing_key: str,
    body: bytes,
    properties: dict,
    frame_max: int,
    mandatory: bool = False,
) -> bytes:
    """The frames of one basic.publish: method, content header, body (split to fit
    ``frame_max``, in bytes), as pamqp's ``frame.marshal`` would write them (by hand:
    pamqp's generic marshalling costs ~25 µs a message). ``properties`` by pamqp
    attribute name. Raises ValueError (a short string above 255 bytes, an unknown
    property) or TypeError (a header value that cannot be encoded)."""
    method = b"".join(
        (_PUBLISH_ID, shortstr(exchange), shortstr(routing_key), b"\x01" if mandatory else b"\x00")
    )
    flags, props = encode_properties(properties)
    size = len(body)
    head = _CONTENT_PREFIX(60, 0, size, flags) + props
    pack = _FRAME_HEAD.pack
    parts = [
        pack(FRAME_METHOD, channel, len(method)),
        method,
        b"\xce",
        pack(FRAME_HEADER, channel, len(head)),
        head,
        b"\xce",
    ]
    step = frame_max - FRAME_OVERHEAD
    for i in range(0, size, step):
        chunk = body[i : i + step]
        parts += (pack(FRAME_BODY, channel, len(chunk)), chunk, b"\xce")
    return b"".join(parts)


_c = twin("leveret.amqp._cframes")  # the compiled twin (leveret/amqp/_cframes.pyx)
if _c is not None:
    FrameReader = _c.FrameReader  # type: ignore[misc]
    publish_fields = _c.publish_fields
    decode_method = _c.decode_method
    encode_deliver = _c.encode_deliver
    encode_content = _c.encode_content
    encode_delivery = _c.encode_delivery
