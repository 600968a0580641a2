# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""Compiled twin of the AMQP 0-9-1 hot path (see :mod:`leveret.compiled`).

The same functions, with the same results and the same errors (class, reply code and
text), as their pure-Python twins: :class:`FrameReader`, :func:`publish_fields`,
:func:`decode_method`, :func:`encode_deliver`, :func:`encode_content` and
:func:`encode_delivery` of :mod:`leveret.amqp.frames`; :func:`whole_publish` and
:func:`parse_publishes` of :mod:`leveret.amqp.handoff`, with the common case of
:func:`leveret.amqp.properties.scan` (no headers table) inside. Property tests
(tests/unit/amqp/test_twins.py) compare both twins on any input.

Every byte is read through a C pointer only after the bounds are checked against the
length of its bytes object: hostile input gets the pure twin's exception, never a read
past the end. Out-of-range arguments of the encoders raise by running the pure twin's
own Python operation, so the message is the same.
"""

cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.string cimport memcpy

import struct

from pamqp import commands

from leveret.amqp import properties as _pure_properties
from leveret.amqp.errors import SYNTAX_ERROR, AMQPConnectionError, FrameError
from leveret.amqp.methods import decode_with_pamqp

cdef enum:
    FRAME_METHOD = 1
    FRAME_HEADER = 2
    FRAME_BODY = 3
    FRAME_HEARTBEAT = 8
    FRAME_END = 0xCE
    FRAME_OVERHEAD = 8

cdef unsigned int _PUBLISH = 0x003C0028
cdef unsigned int _ACK = 0x003C0050
cdef unsigned int _REJECT = 0x003C005A
cdef unsigned int _NACK = 0x003C0078

_FRAME_HEAD = struct.Struct(">BHI")
_DELIVER_HEAD = struct.Struct(">BHIHH")

_Publish = commands.Basic.Publish
_Ack = commands.Basic.Ack
_Nack = commands.Basic.Nack
_Reject = commands.Basic.Reject


cdef inline unsigned int _u32(const unsigned char* p) noexcept:
    return (<unsigned int>p[0] << 24) | (<unsigned int>p[1] << 16) | (<unsigned int>p[2] << 8) | p[3]


cdef inline unsigned long long _u64(const unsigned char* p) noexcept:
    return (<unsigned long long>_u32(p) << 32) | _u32(p + 4)


cdef inline void _put_head(unsigned char* p, int frame_type, unsigned int channel, unsigned int size) noexcept:
    p[0] = frame_type
    p[1] = (channel >> 8) & 0xFF
    p[2] = channel & 0xFF
    p[3] = (size >> 24) & 0xFF
    p[4] = (size >> 16) & 0xFF
    p[5] = (size >> 8) & 0xFF
    p[6] = size & 0xFF


cdef class FrameReader:
    """Incremental frame parser (twin of :class:`leveret.amqp.frames.FrameReader`).
    ``max_size`` is the largest frame accepted (frame-max), in bytes including the 8
    bytes of frame overhead."""

    cdef public long long max_size
    cdef public bytes _buffer

    def __init__(self, long long max_size):
        self.max_size = max_size
        self._buffer = b""

    def feed(self, data):
        """Complete frames in what has arrived so far, as ``(type, channel, payload)``.
        Raises FrameError (501) for a bad end marker, an unknown frame type or a frame
        larger than ``max_size``."""
        cdef bytes buffer = self._buffer + data if self._buffer else bytes(data)
        cdef list frames = []
        cdef Py_ssize_t offset = 0, stop
        cdef Py_ssize_t end = PyBytes_GET_SIZE(buffer)
        cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(buffer)
        cdef unsigned int frame_type, channel, size
        while end - offset >= 7:
            frame_type = p[offset]
            channel = (<unsigned int>p[offset + 1] << 8) | p[offset + 2]
            size = _u32(p + offset + 3)
            if <long long>size + FRAME_OVERHEAD > self.max_size:
                raise FrameError(f"frame size {size} exceeds frame_max {self.max_size}")
            stop = offset + 7 + size
            if stop >= end:
                break
            if p[stop] != FRAME_END:
                raise FrameError(f"frame end marker {p[stop]:#x}, expected 0xce")
            if frame_type != FRAME_METHOD and frame_type != FRAME_HEADER and frame_type != FRAME_BODY \
                    and frame_type != FRAME_HEARTBEAT:
                raise FrameError(f"unknown frame type {frame_type}")
            frames.append((frame_type, channel, PyBytes_FromStringAndSize(<const char*>p + offset + 7, size)))
            offset = stop + 1
        self._buffer = buffer[offset:] if offset < end else b""
        return frames


cdef inline str _utf8(const unsigned char* p, Py_ssize_t start, Py_ssize_t stop, Py_ssize_t end):
    """``bytes[start:stop].decode()`` of a buffer of ``end`` bytes (a slice: clipped)."""
    if stop > end:
        stop = end
    if start > stop:
        start = stop
    return PyUnicode_DecodeUTF8(<const char*>p + start, stop - start, NULL)


cdef tuple _publish_fields(bytes payload):
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(payload)
    cdef Py_ssize_t end = PyBytes_GET_SIZE(payload)
    cdef Py_ssize_t at = 6, size
    if at >= end:
        raise IndexError("index out of range")
    size = p[at]
    exchange = _utf8(p, at + 1, at + 1 + size, end)
    at += 1 + size
    if at >= end:
        raise IndexError("index out of range")
    size = p[at]
    routing_key = _utf8(p, at + 1, at + 1 + size, end)
    if at + 1 + size >= end:
        raise IndexError("index out of range")
    bits = p[at + 1 + size]
    if end != at + 2 + size:
        raise ValueError("basic.publish has trailing bytes")
    return exchange, routing_key, bool(bits & 1), bool(bits & 2)


def publish_fields(bytes payload not None):
    """``(exchange, routing_key, mandatory, immediate)`` of a basic.publish method
    payload. Raises ValueError, IndexError (UnicodeDecodeError) if malformed."""
    return _publish_fields(payload)


def decode_method(bytes payload not None):
    """A method frame payload as a pamqp command (twin of
    :func:`leveret.amqp.frames.decode_method`): AMQPConnectionError 540 for an unknown
    class/method id, 502 for arguments that do not decode."""
    cdef Py_ssize_t end = PyBytes_GET_SIZE(payload)
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(payload)
    cdef unsigned int index
    cdef unsigned long long tag
    cdef unsigned char bits
    if end < 4:
        raise AMQPConnectionError(SYNTAX_ERROR, "method frame too short")
    index = _u32(p)
    if index == _PUBLISH:
        try:
            exchange, routing_key, mandatory, immediate = _publish_fields(payload)
        except (ValueError, IndexError) as exc:
            raise AMQPConnectionError(SYNTAX_ERROR, f"cannot decode method {index:#x}: {exc}") from None
        method = _Publish.__new__(_Publish)
        method.ticket, method.exchange, method.routing_key = 0, exchange, routing_key
        method.mandatory, method.immediate = mandatory, immediate
        return method
    if index == _ACK or index == _NACK or index == _REJECT:
        if end != 13:  # as struct.Struct(">QB").unpack(payload[4:]) says it
            raise AMQPConnectionError(
                SYNTAX_ERROR, f"cannot decode method {index:#x}: unpack requires a buffer of 9 bytes"
            )
        tag = _u64(p + 4)
        bits = p[12]
        if index == _ACK:
            method = _Ack.__new__(_Ack)
            method.delivery_tag, method.multiple = tag, bool(bits & 1)
        elif index == _NACK:
            method = _Nack.__new__(_Nack)
            method.delivery_tag, method.multiple, method.requeue = tag, bool(bits & 1), bool(bits & 2)
        else:
            method = _Reject.__new__(_Reject)
            method.delivery_tag, method.requeue = tag, bool(bits & 1)
        return method
    return decode_with_pamqp(index, payload)


def encode_deliver(channel, bytes consumer_tag not None, delivery_tag, redelivered, str exchange not None,
                   str routing_key not None):
    """A basic.deliver method frame; ``consumer_tag`` already encoded (UTF-8)."""
    cdef bytes exchange_bytes = exchange.encode()
    cdef bytes key_bytes = routing_key.encode()
    cdef Py_ssize_t tag_size = PyBytes_GET_SIZE(consumer_tag)
    cdef Py_ssize_t exchange_size = PyBytes_GET_SIZE(exchange_bytes)
    cdef Py_ssize_t key_size = PyBytes_GET_SIZE(key_bytes)
    # out of range: the pure twin's operation raises its error
    if tag_size > 255:
        bytes((tag_size,))
    if type(delivery_tag) is not int or not 0 <= delivery_tag <= 0xFFFFFFFFFFFFFFFF:
        delivery_tag.to_bytes(8, "big")
    if exchange_size > 255:
        bytes((exchange_size,))
    if key_size > 255:
        bytes((key_size,))
    cdef Py_ssize_t args = 1 + tag_size + 8 + 1 + 1 + exchange_size + 1 + key_size
    if type(channel) is not int or not 0 <= channel <= 0xFFFF:
        _DELIVER_HEAD.pack(FRAME_METHOD, channel, 4 + args, 60, 60)
    cdef unsigned long long tag = delivery_tag
    cdef bytes out = PyBytes_FromStringAndSize(NULL, 11 + args + 1)
    cdef unsigned char* o = <unsigned char*>PyBytes_AS_STRING(out)
    _put_deliver(o, channel, consumer_tag, tag, 1 if redelivered else 0, exchange_bytes, key_bytes)
    return out


cdef Py_ssize_t _put_deliver(unsigned char* o, unsigned int channel, bytes consumer_tag,
                             unsigned long long tag, unsigned char redelivered, bytes exchange,
                             bytes key) noexcept:
    """Write a basic.deliver frame at ``o`` (sizes checked by the caller); its length."""
    cdef Py_ssize_t tag_size = PyBytes_GET_SIZE(consumer_tag)
    cdef Py_ssize_t exchange_size = PyBytes_GET_SIZE(exchange)
    cdef Py_ssize_t key_size = PyBytes_GET_SIZE(key)
    cdef Py_ssize_t args = 1 + tag_size + 8 + 1 + 1 + exchange_size + 1 + key_size
    cdef Py_ssize_t at = 11
    cdef int i
    _put_head(o, FRAME_METHOD, channel, <unsigned int>(4 + args))
    o[7] = 0
    o[8] = 60
    o[9] = 0
    o[10] = 60
    o[at] = tag_size
    memcpy(o + at + 1, PyBytes_AS_STRING(consumer_tag), tag_size)
    at += 1 + tag_size
    for i in range(8):
        o[at + i] = (tag >> (56 - 8 * i)) & 0xFF
    at += 8
    o[at] = redelivered
    o[at + 1] = exchange_size
    memcpy(o + at + 2, PyBytes_AS_STRING(exchange), exchange_size)
    at += 2 + exchange_size
    o[at] = key_size
    memcpy(o + at + 1, PyBytes_AS_STRING(key), key_size)
    at += 1 + key_size
    o[at] = FRAME_END
    return at + 1


cdef Py_ssize_t _content_size(Py_ssize_t header_size, Py_ssize_t body_size, long long chunk) except -1:
    """Bytes of the content frames; raises as the pure twin for what it cannot encode."""
    if header_size > 0xFFFFFFFF:
        _FRAME_HEAD.pack(FRAME_HEADER, 0, header_size)
    if body_size == 0 or chunk < 0:  # a negative step: range() yields no body frame
        return header_size + FRAME_OVERHEAD
    if chunk == 0:
        raise ValueError("range() arg 3 must not be zero")
    if chunk > 0xFFFFFFFF and body_size > 0xFFFFFFFF:
        _FRAME_HEAD.pack(FRAME_BODY, 0, body_size)
    # (body_size - 1) // chunk + 1 frames: no overflow for a chunk near 2**63
    return header_size + FRAME_OVERHEAD + body_size + ((body_size - 1) // chunk + 1) * FRAME_OVERHEAD


cdef Py_ssize_t _put_content(unsigned char* o, unsigned int channel, bytes header, bytes body,
                             long long chunk) noexcept:
    """Write the content header frame and the body frames at ``o``; their length."""
    cdef Py_ssize_t header_size = PyBytes_GET_SIZE(header)
    cdef Py_ssize_t body_size = PyBytes_GET_SIZE(body)
    cdef const char* b = PyBytes_AS_STRING(body)
    cdef Py_ssize_t at, start = 0, piece
    _put_head(o, FRAME_HEADER, channel, <unsigned int>header_size)
    memcpy(o + 7, PyBytes_AS_STRING(header), header_size)
    o[7 + header_size] = FRAME_END
    at = header_size + FRAME_OVERHEAD
    if chunk <= 0:
        return at
    while start < body_size:
        piece = body_size - start
        if piece > chunk:
            piece = chunk
        _put_head(o + at, FRAME_BODY, channel, <unsigned int>piece)
        memcpy(o + at + 7, b + start, piece)
        o[at + 7 + piece] = FRAME_END
        at += piece + FRAME_OVERHEAD
        start += piece
    return at


cdef inline void _check_channel(channel, int frame_type, Py_ssize_t size) except *:
    if type(channel) is not int or not 0 <= channel <= 0xFFFF:
        _FRAME_HEAD.pack(frame_type, channel, size)


def encode_content(channel, header, body, long long frame_max):
    """Content header frame plus body frames split at ``frame_max`` (§4.2.6.2), as one
    bytes object in a list (the pure twin gives the pieces)."""
    if type(header) is not bytes:
        header = bytes(header)
    if type(body) is not bytes:
        body = bytes(body)
    _check_channel(channel, FRAME_HEADER, PyBytes_GET_SIZE(header))  # the pure twin's first error
    cdef Py_ssize_t size = _content_size(PyBytes_GET_SIZE(header), PyBytes_GET_SIZE(body),
                                         frame_max - FRAME_OVERHEAD)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, size)
    _put_content(<unsigned char*>PyBytes_AS_STRING(out), channel, header, body, frame_max - FRAME_OVERHEAD)
    return [out]


def encode_delivery(channel, bytes consumer_tag not None, delivery_tag, redelivered, str exchange not None,
                    str routing_key not None, header, body, long long frame_max):
    """The frames of one delivery (basic.deliver, content header, body frames split at
    ``frame_max``) as one bytes object in a list."""
    if type(header) is not bytes:
        header = bytes(header)
    if type(body) is not bytes:
        body = bytes(body)
    _check_channel(channel, FRAME_HEADER, PyBytes_GET_SIZE(header))  # the pure twin's first error
    cdef Py_ssize_t content = _content_size(PyBytes_GET_SIZE(header), PyBytes_GET_SIZE(body),
                                            frame_max - FRAME_OVERHEAD)
    cdef bytes deliver = encode_deliver(channel, consumer_tag, delivery_tag, redelivered, exchange, routing_key)
    cdef Py_ssize_t method = PyBytes_GET_SIZE(deliver)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, method + content)
    cdef unsigned char* o = <unsigned char*>PyBytes_AS_STRING(out)
    memcpy(o, PyBytes_AS_STRING(deliver), method)
    _put_content(o + method, channel, header, body, frame_max - FRAME_OVERHEAD)
    return [out]


# -- the publish hot path of leveret.amqp.handoff ----------------------------------------
# (flag bit, wire type) of the 14 basic properties in wire order (properties.PROPERTY_LAYOUT)
cdef char* _KINDS = b"ssToosssstssss"
cdef unsigned int _DELIVERY_MODE_FLAG = 0x1000
cdef unsigned int _EXPIRATION_FLAG = 0x0100
cdef unsigned int _HEADERS_FLAG = 0x2000


cdef tuple _scan(bytes header):
    """:func:`leveret.amqp.properties.scan`: the properties without a headers table
    here, the rest (tables, flag continuation) by the pure twin itself."""
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(header)
    cdef Py_ssize_t end = PyBytes_GET_SIZE(header), offset = 14
    cdef unsigned int flags, bit
    cdef int i
    cdef char kind
    if end < 14:
        return _pure_properties.scan(header)
    flags = (<unsigned int>p[12] << 8) | p[13]
    if not flags:
        return None, None, None
    if flags & 0x0003 or flags & _HEADERS_FLAG:
        return _pure_properties.scan(header)
    delivery_mode = priority = expiration = None
    try:
        for i in range(14):
            bit = 0x8000 >> i
            if not flags & bit:
                continue
            kind = _KINDS[i]
            if offset >= end and kind != b"t":
                raise IndexError("index out of range")
            if kind == b"s":  # pamqp (and clients) decode short strings as UTF-8
                text = _utf8(p, offset + 1, offset + 1 + p[offset], end)
                if bit == _EXPIRATION_FLAG:
                    expiration = text
                offset += 1 + p[offset]
            elif kind == b"o":
                if bit == _DELIVERY_MODE_FLAG:
                    delivery_mode = p[offset]
                else:
                    priority = p[offset]
                offset += 1
            else:  # "t"
                offset += 8
            if offset > end:
                raise ValueError("properties truncated")
    except (ValueError, IndexError) as exc:
        raise AMQPConnectionError(SYNTAX_ERROR, f"cannot decode content properties: {exc}") from None
    return delivery_mode, priority, expiration


def scan(bytes header not None):
    """Twin of :func:`leveret.amqp.properties.scan`: ``(delivery_mode, priority,
    expiration)`` of a content header payload; AMQPConnectionError 502 if malformed."""
    return _scan(header)


cdef object _three(object frame):
    """``frame`` if it unpacks into three values, else the ValueError (and its text) the
    pure twin's unpacking raises. Frames come from the caller: never trusted to be
    3-tuples."""
    if type(frame) is tuple and PyTuple_GET_SIZE(frame) == 3:
        return frame
    n = len(frame)
    if n < 3:
        raise ValueError(f"not enough values to unpack (expected 3, got {n})")
    if n > 3:
        raise ValueError("too many values to unpack (expected 3)")
    return frame


@cython.boundscheck(True)  # frames come from the caller: a short tuple raises, as in pure
@cython.wraparound(True)
cdef object _whole_publish(list frames, Py_ssize_t i):
    cdef Py_ssize_t count = PyList_GET_SIZE(frames)
    cdef unsigned long long size
    cdef bytes head
    cdef const unsigned char* h
    if i < 0 or i + 1 >= count:
        return None
    _, number, payload = _three(frames[i])
    header_type, header_number, header = _three(frames[i + 1])
    if header_type != FRAME_HEADER or header_number != number:
        return None
    head = header if type(header) is bytes else bytes(header)
    h = <const unsigned char*>PyBytes_AS_STRING(head)
    if PyBytes_GET_SIZE(head) < 14 or h[0] != 0 or h[1] != 60:  # class 60 (basic)
        return None
    size = _u64(h + 4)
    if size:
        if i + 2 >= count:
            return None
        body_type, body_number, body = _three(frames[i + 2])
        if body_type != FRAME_BODY or body_number != number or <unsigned long long>len(body) != size:
            return None
    else:
        body = b""
    try:
        if type(payload) is bytes:
            exchange, routing_key, mandatory, immediate = _publish_fields(<bytes>payload)
        else:
            exchange, routing_key, mandatory, immediate = publish_fields(payload)
        facts = _scan(head)
    except (ValueError, IndexError, AMQPConnectionError):  # the core's frame path reports it
        return None
    if immediate:
        return None
    return (exchange, routing_key, mandatory, header, body, facts, payload), 3 if size else 2


def whole_publish(list frames not None, Py_ssize_t i):
    """Twin of :func:`leveret.amqp.handoff.whole_publish`: ``(fields, frames taken)`` of
    the whole basic.publish at ``frames[i]``, or None."""
    return _whole_publish(frames, i)


@cython.boundscheck(True)
@cython.wraparound(True)
def parse_publishes(list frames not None):
    """Twin of :func:`leveret.amqp.handoff.parse_publishes`: ``frames`` with every whole,
    well-formed, non-immediate basic.publish as one ``(0, channel, fields)`` item."""
    cdef list items = []
    cdef Py_ssize_t i = 0, count = PyList_GET_SIZE(frames)
    while i < count:
        frame = frames[i]
        if frame[0] == FRAME_METHOD and i + 1 < count and frame[2][:4] == b"\x00\x3c\x00\x28":
            taken = _whole_publish(frames, i)
            if taken is not None:
                items.append((0, frame[1], taken[0]))
                i += taken[1]
                continue
        items.append(frame)
        i += 1
    return items
