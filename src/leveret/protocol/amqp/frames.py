"""AMQP 0-9-1 framing (§2.3.5, §4.2.3): a sans-I/O reader and frame encoders.

:class:`FrameReader` is fed bytes and returns complete frames as
``(frame_type, channel, payload)``; it raises :class:`FrameError` (reply code 501) for a
bad end marker, an unknown frame type or a frame larger than the negotiated frame-max.
Method payloads are decoded and encoded with pamqp; content headers pass through as raw
bytes (see :mod:`leveret.core.message`).
"""

from __future__ import annotations

import struct

from pamqp import commands, frame as pamqp_frame
from pamqp.base import Frame as Method
from pamqp.exceptions import UnmarshalingException

from ...core.errors import FRAME_ERROR, NOT_IMPLEMENTED, SYNTAX_ERROR, ConnectionError

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


class FrameError(ConnectionError):
    def __init__(self, text: str) -> None:
        super().__init__(FRAME_ERROR, text)


class FrameReader:
    """Incremental frame parser. ``max_size`` is the largest frame accepted (frame-max),
    in bytes including the 8 bytes of frame overhead."""

    def __init__(self, max_size: int) -> None:
        self.max_size = max_size
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, int, bytes]]:
        buffer = self._buffer
        buffer += data
        frames = []
        offset = 0
        end = len(buffer)
        unpack_head = _FRAME_HEAD.unpack_from
        while end - offset >= 7:
            frame_type, channel, size = unpack_head(buffer, offset)
            if size + FRAME_OVERHEAD > self.max_size:
                raise FrameError(f"frame size {size} exceeds frame_max {self.max_size}")
            stop = offset + 7 + size
            if stop >= end:
                break
            if buffer[stop] != FRAME_END:
                raise FrameError(f"frame end marker {buffer[stop]:#x}, expected 0xce")
            if frame_type not in (FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT):
                raise FrameError(f"unknown frame type {frame_type}")
            frames.append((frame_type, channel, bytes(buffer[offset + 7:stop])))
            offset = stop + 1
        if offset:
            del buffer[:offset]
        return frames


def decode_method(payload: bytes) -> Method:
    """A method frame payload as a pamqp command.

    Raises ConnectionError 540 for an unknown class/method id and 502 for arguments that
    do not decode.
    """
    if len(payload) < 4:
        raise ConnectionError(SYNTAX_ERROR, "method frame too short")
    (index,) = _METHOD_ID.unpack_from(payload)
    cls = commands.INDEX_MAPPING.get(index)
    if cls is None:
        raise ConnectionError(
            NOT_IMPLEMENTED, f"unknown method class {index >> 16} method {index & 0xFFFF}")
    method = cls()
    try:
        method.unmarshal(payload[4:])
    except (UnmarshalingException, struct.error, ValueError, TypeError,
            UnicodeDecodeError, IndexError) as exc:
        raise ConnectionError(SYNTAX_ERROR, f"cannot decode {method.name}: {exc}") from None
    return method


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
            piece = body[start:start + chunk]
            parts += (pack(FRAME_BODY, channel, len(piece)), piece, b"\xce")
    return parts
