"""AMQP 1.0 framing (OASIS AMQP 1.0 part 2, §2.2-2.3; SASL part 5, §5.3): protocol
headers, frames and an incremental reader, sans-I/O.

A connection starts with an 8-byte protocol header (:data:`AMQP_HEADER`, or
:data:`SASL_HEADER` for the SASL layer, :data:`TLS_HEADER` for TLS negotiated in-band);
after SASL succeeds both peers send the AMQP header again. Then come frames: an 8-byte
header (size in bytes, the frame included; ``doff``, the data offset in 4-byte words,
at least 2; the frame type, 0 AMQP or 1 SASL; the channel) then an extended header
(ignored) and the body: one performative and, for a transfer, the message bytes. A frame
with no body is an empty frame, sent as a heartbeat (§2.4.5).

:class:`FrameReader` is fed bytes and returns :class:`ProtocolHeader` and :class:`Frame`
objects. A frame's size is checked from its header, before its body is held: at most
``max_frame_size`` bytes, which starts at :data:`MIN_MAX_FRAME_SIZE` (512, the most a
peer may send before the open frames are exchanged, §2.7.1) and is raised by the
connection once open is agreed. Errors raise
:class:`~leveret.protocol.amqp10.types.DecodeError`: ``amqp:connection:framing-error``
for bad framing (a size below 8 or past the limit, doff below 2 or past the size, an
unknown frame type, a body where none may be), ``amqp:decode-error`` or
``amqp:invalid-field`` for a body that does not decode (from
:mod:`~leveret.protocol.amqp10.performatives`).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from leveret.compiled import twin
from leveret.protocol.amqp10 import performatives as perf
from leveret.protocol.amqp10.types import DecodeError, Described, decode, encode

AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
TLS_HEADER = b"AMQP\x02\x01\x00\x00"
SASL_HEADER = b"AMQP\x03\x01\x00\x00"
#: Protocol ids of the header's fifth byte (§2.2).
PROTOCOL_AMQP, PROTOCOL_TLS, PROTOCOL_SASL = 0, 2, 3

#: Frame types (§2.3.1, §5.3.1).
TYPE_AMQP, TYPE_SASL = 0, 1
#: The smallest max-frame-size a peer may set, and the largest frame either side may send
#: before open (§2.7.1).
MIN_MAX_FRAME_SIZE = 512
#: Bytes of the frame header.
HEADER_SIZE = 8
#: The empty AMQP frame on channel 0: a heartbeat (§2.4.5).
EMPTY_FRAME = b"\x00\x00\x00\x08\x02\x00\x00\x00"

FRAMING_ERROR = "amqp:connection:framing-error"
#: A frame size read as the bytes "AMQP": a protocol header where a frame may begin.
_HEADER_AS_SIZE = int.from_bytes(b"AMQP", "big")
_FRAME_HEADER = struct.Struct(">IBBH")


@dataclass(frozen=True, slots=True)
class ProtocolHeader:
    """A protocol header (§2.2): ``protocol_id`` 0 AMQP, 2 TLS, 3 SASL, then the
    version (1.0.0 is the only one). Read whatever its version is: the connection
    answers an unsupported one with its own header and closes (§2.2)."""

    protocol_id: int
    major: int = 1
    minor: int = 0
    revision: int = 0

    def to_bytes(self) -> bytes:
        return b"AMQP" + bytes((self.protocol_id, self.major, self.minor, self.revision))

    @property
    def supported(self) -> bool:
        """Whether this is AMQP 1.0.0 over AMQP, TLS or SASL."""
        return self.protocol_id in (PROTOCOL_AMQP, PROTOCOL_TLS, PROTOCOL_SASL) and (
            self.major,
            self.minor,
            self.revision,
        ) == (1, 0, 0)


@dataclass(frozen=True, slots=True)
class Frame:
    """A frame (§2.3): ``type`` :data:`TYPE_AMQP` or :data:`TYPE_SASL`; ``body`` the
    performative (AMQP frames) or SASL frame, None for an empty frame; ``payload`` the
    bytes after it (a transfer's message bytes; empty for the others)."""

    channel: int
    body: Any = None
    payload: bytes = b""
    type: int = TYPE_AMQP


def encode_frame(body: Any, channel: int = 0, payload: bytes = b"", type: int = TYPE_AMQP) -> bytes:
    """One frame: header (doff 2, no extended header), ``body`` (a performative or SASL
    dataclass, a ``Described``, or None for an empty frame) and ``payload``. Raises
    ValueError for a channel outside 0-65,535 or a frame over 4 GiB."""
    if body is None:
        data = b""
    elif isinstance(body, Described):
        data = encode(body)
    else:
        data = encode(perf.to_described(body))
    size = HEADER_SIZE + len(data) + len(payload)
    if not 0 <= channel <= 0xFFFF or size > 0xFFFFFFFF:
        raise ValueError(f"channel {channel} or size {size} out of range for a frame header")
    return _FRAME_HEADER.pack(size, 2, type, channel) + data + payload


def frame_overhead(transfer: perf.Transfer, channel: int = 0) -> int:
    """Bytes a frame takes for ``transfer`` without its payload (to split a message
    into frames of at most max-frame-size)."""
    return len(encode_frame(transfer, channel))


class FrameReader:
    """Fed bytes as they arrive, returns protocol headers and whole frames (§2.2-2.3).

    ``max_frame_size`` in bytes (frame header included), :data:`MIN_MAX_FRAME_SIZE` until
    the connection raises it after open; a frame over it is refused from its header,
    before its body is held. The first 8 bytes must be a protocol header; later, where a
    frame may begin, the bytes ``AMQP`` also start a protocol header (the AMQP header a
    client sends after SASL, pipelined or not): they cannot be a frame's size, since a
    frame size over 1,095,586,127 bytes is refused (``max_frame_size`` stays below)."""

    def __init__(self, max_frame_size: int = MIN_MAX_FRAME_SIZE) -> None:
        #: bytes of a frame (or header) not complete yet, and how many the buffer needs
        self._buffer: bytes | bytearray = b""
        self._need = 0
        self._started = False
        self.max_frame_size = max_frame_size

    @property
    def max_frame_size(self) -> int:
        return self._max

    @max_frame_size.setter
    def max_frame_size(self, value: int) -> None:
        if not MIN_MAX_FRAME_SIZE <= value < _HEADER_AS_SIZE:
            raise ValueError(f"max_frame_size {value} outside 512 to {_HEADER_AS_SIZE - 1}")
        self._max = value

    def feed(self, data: bytes) -> list[ProtocolHeader | Frame]:
        """The headers and frames completed by ``data`` (possibly none). Raises
        DecodeError; the reader is then unusable, as the connection must close."""
        return [as_frame(item) if isinstance(item, tuple) else item for item in self.read(data)]

    def read(self, data: bytes) -> list[ProtocolHeader | Frame | FastTransfer]:
        """:meth:`feed` for the connection: a transfer in the common encodings comes
        as a :data:`FastTransfer` tuple rather than a :class:`Frame` (the hot path:
        no objects per frame; :func:`as_frame` makes the frame). Raises DecodeError."""
        if self._buffer:  # the start of a frame (or header) came before
            self._buffer += data
            if len(self._buffer) < self._need:  # a big frame in many reads: no copies
                return []
            buffer = bytes(self._buffer)
        else:
            buffer = bytes(data)
        out: list[ProtocolHeader | Frame | FastTransfer] = []
        pos, end = 0, len(buffer)
        self._need = 0
        while True:
            if self._started:
                items, pos = _split_frames(buffer, pos, self._max, decode_frame)
                out += items
            if end - pos < 4:
                if not self._started and pos < end and not b"AMQP".startswith(buffer[pos:]):
                    raise DecodeError("the connection does not start with a protocol header", FRAMING_ERROR)
                break
            size = int.from_bytes(buffer[pos : pos + 4], "big")
            if size == _HEADER_AS_SIZE:
                if end - pos < 8:
                    break
                out.append(ProtocolHeader(*buffer[pos + 4 : pos + 8]))
                pos += 8
                self._started = True
                continue
            if not self._started:
                raise DecodeError("the connection does not start with a protocol header", FRAMING_ERROR)
            if size < HEADER_SIZE or size > self._max:
                raise DecodeError(
                    f"a frame of {size} bytes, outside {HEADER_SIZE} to max-frame-size {self._max}",
                    FRAMING_ERROR,
                )
            self._need = size - (end - pos)
            break  # the rest of a frame is still to come
        self._buffer = bytearray(buffer[pos:]) if pos < end else b""
        self._need += end - pos
        return out


#: A transfer frame read by the hot path: ``(channel, handle, delivery-id,
#: delivery-tag, message-format, settled, more, payload)``; the other fields of the
#: transfer are their defaults.
FastTransfer = tuple[int, int, "int | None", "bytes | None", "int | None", "bool | None", bool, bytes]


def as_frame(item: FastTransfer) -> Frame:
    """The :class:`Frame` of a :data:`FastTransfer`."""
    return Frame(item[0], perf.Transfer(*item[1:7]), item[7])


def py_split_frames(
    data: bytes, pos: int, max_size: int, decode: Callable[[bytes], Frame]
) -> tuple[list[Frame | FastTransfer], int]:
    """The whole frames of ``data`` from ``pos`` on, up to the first that is not whole,
    a protocol header (its size field reads ``AMQP``) or one of a size outside 8 to
    ``max_size`` (the reader sees to those); returns them and where it stopped. A
    transfer in the common encodings is a :data:`FastTransfer`, any other frame
    ``decode(frame)`` (:func:`decode_frame`, whose DecodeError propagates)."""
    items: list[Frame | FastTransfer] = []
    pos = max(pos, 0)
    n = len(data)
    while n - pos >= 4:
        size = int.from_bytes(data[pos : pos + 4], "big")
        if size == _HEADER_AS_SIZE or size < HEADER_SIZE or size > max_size or n - pos < size:
            break
        channel = (data[pos + 6] << 8) | data[pos + 7]
        values = None
        if data[pos + 4] == 2 and data[pos + 5] == TYPE_AMQP and size > HEADER_SIZE:
            values = _transfer_values(data, pos + 8, pos + size)
        if values is not None:
            items.append((channel, *values[:6], data[values[6] : pos + size]))
        else:
            items.append(decode(data[pos : pos + size]))
        pos += size
    return items, pos


#: Field encodings the transfer fast path reads: null, uint0, smalluint, uint, ubyte,
#: true, false, boolean, vbin8 (anything else goes the generic way).
_TRANSFER_KINDS = (int, int, bytes, int, bool, bool)


def py_fast_transfer(frame: bytes, start: int, size: int) -> tuple[perf.Transfer, int] | None:
    """A transfer whose fields are all simple encodings (what clients send: handle,
    delivery-id, tag, format, settled, more), decoded without the generic decoder
    (the hot path); None for anything else, which the generic decoder reads."""
    values = _transfer_values(frame, start, size)
    if values is None:
        return None
    return perf.Transfer(*values[:6]), values[6]


def _transfer_values(frame: bytes, start: int, size: int) -> list[Any] | None:
    """The six fields of the transfer at ``frame[start:size]`` then where it ends, or
    None (see :func:`py_fast_transfer`)."""
    if frame[start : start + 3] != b"\x00\x53\x14":
        return None
    code = frame[start + 3] if start + 3 < size else 0
    if code == 0xC0 and start + 6 <= size:
        count, pos = frame[start + 5], start + 6
        end = start + 5 + frame[start + 4]
    elif code == 0xD0 and start + 12 <= size:
        count, pos = int.from_bytes(frame[start + 8 : start + 12], "big"), start + 12
        end = start + 8 + int.from_bytes(frame[start + 4 : start + 8], "big")
    else:
        return None
    if count > 6 or end > size or count == 0:
        return None
    values: list[Any] = [None, None, None, None, None, False, end]
    for index in range(count):
        if pos >= end:
            return None
        code = frame[pos]
        if code == 0x40:  # null: the field's default
            pos += 1
            continue
        kind = _TRANSFER_KINDS[index]
        if code == 0x70 and kind is int:
            if pos + 5 > end:
                return None
            value: Any = int.from_bytes(frame[pos + 1 : pos + 5], "big")
            pos += 5
        elif code == 0x52 and kind is int:
            if pos + 2 > end:
                return None
            value = frame[pos + 1]
            pos += 2
        elif code == 0x43 and kind is int:
            value = 0
            pos += 1
        elif code == 0xA0 and kind is bytes:
            if pos + 2 > end or pos + 2 + frame[pos + 1] > end:
                return None
            value = frame[pos + 2 : pos + 2 + frame[pos + 1]]
            pos += 2 + frame[pos + 1]
        elif code == 0x41 and kind is bool:
            value = True
            pos += 1
        elif code == 0x42 and kind is bool:
            value = False
            pos += 1
        elif code == 0x56 and kind is bool:
            if pos + 2 > end or frame[pos + 1] > 1:
                return None  # a boolean other than 0 or 1: the generic decoder says so
            value = frame[pos + 1] == 1
            pos += 2
        else:  # another encoding, or a field of the wrong type: the generic decoder
            return None
        values[index] = value
    if pos != end or values[0] is None:
        return None  # the handle is mandatory: the generic decoder refuses its absence
    return values


_compiled = twin("leveret.protocol.amqp10._ctransfer")
#: The transfer fast path: the compiled twin when built (``_ctransfer.pyx``), else
#: :func:`py_fast_transfer`.
_fast_transfer: Callable[[bytes, int, int], tuple[perf.Transfer, int] | None] = (
    _compiled.fast_transfer if _compiled is not None else py_fast_transfer
)
#: The frame splitter of :meth:`FrameReader.read`: the compiled twin when built, else
#: :func:`py_split_frames`.
_split_frames: Callable[
    [bytes, int, int, Callable[[bytes], Frame]], tuple[list[Frame | FastTransfer], int]
] = _compiled.split_frames if _compiled is not None else py_split_frames


def decode_frame(frame: bytes) -> Frame:
    """One whole frame (its size field equal to ``len(frame)``). Raises DecodeError."""
    size, doff, kind, channel = _FRAME_HEADER.unpack_from(frame)
    if kind == TYPE_AMQP and doff == 2 and size > 8:
        fast = _fast_transfer(frame, 8, size)
        if fast is not None:
            return Frame(channel, fast[0], frame[fast[1] :], kind)
    if doff < 2 or doff * 4 > size:
        raise DecodeError(f"a frame with data offset {doff} in {size} bytes (§2.3.1)", FRAMING_ERROR)
    if kind not in (TYPE_AMQP, TYPE_SASL):
        raise DecodeError(f"a frame of type {kind} (0 AMQP and 1 SASL only)", FRAMING_ERROR)
    start = doff * 4
    if start == size:
        if kind == TYPE_SASL:
            raise DecodeError("an empty SASL frame (§5.3.1)", FRAMING_ERROR)
        return Frame(channel)
    described, end = decode(frame, start, size)
    if not isinstance(described, Described):
        raise DecodeError(f"a frame body that is a {type(described).__name__}, not a performative")
    body = perf.from_described(described)
    wanted = perf.PERFORMATIVES if kind == TYPE_AMQP else perf.SASL_FRAMES
    if not isinstance(body, wanted):
        raise DecodeError(
            f"a {'AMQP' if kind == TYPE_AMQP else 'SASL'} frame holding {described.descriptor!r:.40}"
        )
    payload = frame[end:]
    if payload and not isinstance(body, perf.Transfer):
        raise DecodeError(
            f"{len(payload)} bytes after a {type(body).__name__.lower()} (§2.3.2)", FRAMING_ERROR
        )
    return Frame(channel, body, payload, kind)
