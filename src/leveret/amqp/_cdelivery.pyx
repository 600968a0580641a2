# cython: language_level=3, boundscheck=False, wraparound=False
"""Compiled twin of :func:`leveret.amqp.delivery.take_delivery` (see
:mod:`leveret.compiled`): the client side's decoding of a whole delivery straight out of
its receive buffer (the Spark connector and the bench clients read with it).

Same result as the pure twin on any buffer (tests/unit/amqp/test_twins.py): the same
:class:`~leveret.amqp.delivery.Delivery`, or None. Short strings and octets are read
here; a headers table or a timestamp sends the properties to the pure
``decode_properties``. Every read is bounded by the frame it belongs to: whatever the
pure twin reads past a frame's end makes it answer None, and so does this one.
"""

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_DecodeUTF8

from leveret.amqp import delivery as _pure

cdef unsigned int _DELIVER_INDEX = 0x003C003C
cdef unsigned char FRAME_END = 0xCE
# the properties this twin reads itself: not headers (0x2000), timestamp (0x0040), or the
# continuation bit (0x0001, refused by both)
cdef unsigned int _TABLE_OR_TIME = 0x2000 | 0x0040
cdef char* _KINDS = b"ssToosssstssss"
cdef tuple _NAMES = (
    "content_type", "content_encoding", "headers", "delivery_mode", "priority", "correlation_id",
    "reply_to", "expiration", "message_id", "timestamp", "message_type", "user_id", "app_id",
    "cluster_id",
)


cdef inline unsigned int _u32(const unsigned char* p) noexcept:
    return (<unsigned int>p[0] << 24) | (<unsigned int>p[1] << 16) | (<unsigned int>p[2] << 8) | p[3]


cdef inline unsigned long long _u64(const unsigned char* p) noexcept:
    return (<unsigned long long>_u32(p) << 32) | _u32(p + 4)


cdef object _text(const unsigned char* p, Py_ssize_t pos, Py_ssize_t n):
    """UTF-8 text, or None if it does not decode (the pure twin then answers None)."""
    try:
        return PyUnicode_DecodeUTF8(<const char*>p + pos, n, NULL)
    except UnicodeDecodeError:
        return None


cdef dict _properties(const unsigned char* p, Py_ssize_t pos, Py_ssize_t end, unsigned int flags):
    """The short-string and octet properties of ``p[pos:end]``; None if malformed."""
    cdef dict props = {}
    cdef int i
    cdef Py_ssize_t n
    for i in range(14):
        if not flags & (0x8000 >> i):
            continue
        if pos >= end:
            return None
        if _KINDS[i] == b"s":
            n = p[pos]
            if pos + 1 + n > end:
                return None
            value = _text(p, pos + 1, n)
            if value is None:
                return None
            pos += 1 + n
        else:  # "o"
            value = p[pos]
            pos += 1
        props[_NAMES[i]] = value
    return props


def take_delivery(buf):
    """A basic.deliver with its content header and a one-frame body, complete at the
    start of ``buf``: (bytes it takes, the delivery), or None (see the pure twin).
    Never raises."""
    cdef const unsigned char* p
    cdef Py_ssize_t size, end, pos, head_end, taken, body_end, at, n
    cdef unsigned long long body_size
    cdef unsigned int flags
    cdef long long delivery_tag
    if type(buf) is bytearray:
        p = <const unsigned char*>PyByteArray_AS_STRING(buf)
        size = PyByteArray_GET_SIZE(buf)
    elif type(buf) is bytes:
        p = <const unsigned char*>PyBytes_AS_STRING(buf)
        size = PyBytes_GET_SIZE(buf)
    else:  # a memoryview, say: the same bytes, so the same delivery
        buf = bytes(buf)
        p = <const unsigned char*>PyBytes_AS_STRING(buf)
        size = PyBytes_GET_SIZE(buf)
    if size < 12 or p[0] != 1 or _u32(p + 7) != _DELIVER_INDEX:
        return None
    end = 7 + <Py_ssize_t>_u32(p + 3)
    pos = end + 1  # the content header frame
    if size < pos + 21 or p[end] != FRAME_END or p[pos] != 2 or p[pos + 1] != p[1] or p[pos + 2] != p[2]:
        return None
    head_end = pos + 7 + <Py_ssize_t>_u32(p + pos + 3)
    if size <= head_end or p[head_end] != FRAME_END:
        return None
    body_size = _u64(p + pos + 11)
    flags = (<unsigned int>p[pos + 19] << 8) | p[pos + 20]
    taken = head_end + 1
    if body_size:
        if body_size > <unsigned long long>size:
            return None
        body_end = taken + 7 + <Py_ssize_t>body_size
        if (
            size <= body_end
            or p[taken] != 3
            or p[taken + 1] != p[1]
            or p[taken + 2] != p[2]
            or _u32(p + taken + 3) != body_size
            or p[body_end] != FRAME_END
        ):
            return None
        body = PyBytes_FromStringAndSize(<const char*>p + taken + 7, <Py_ssize_t>body_size)
        taken = body_end + 1
    else:
        body = b""
    if flags & 1:
        return None
    # basic.deliver's arguments, within its frame
    at = 11
    if at >= end:
        return None
    n = p[at]
    if at + 1 + n > end:
        return None
    consumer_tag = _text(p, at + 1, n)
    at += 1 + n
    if at + 10 > end:
        return None
    delivery_tag = <long long>_u64(p + at)
    redelivered = (p[at + 8] & 1) != 0
    n = p[at + 9]
    at += 10
    if at + n > end:
        return None
    exchange = _text(p, at, n)
    at += n
    if at >= end:
        return None
    n = p[at]
    at += 1
    if at + n > end:
        return None
    routing_key = _text(p, at, n)
    if consumer_tag is None or exchange is None or routing_key is None:
        return None
    channel = (p[1] << 8) | p[2]  # read before any Python code runs (it could resize buf)
    if flags & _TABLE_OR_TIME:
        try:
            props = _pure.decode_properties(buf, pos + 21, head_end, flags)
        except Exception:
            return None
    else:
        props = _properties(p, pos + 21, head_end, flags)
        if props is None:
            return None
    return taken, _pure.Delivery(
        delivery_tag, redelivered, exchange, routing_key, props, body, consumer_tag, channel
    )
