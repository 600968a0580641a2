# cython: language_level=3, boundscheck=False, wraparound=False, embedsignature=True
"""Compiled twins of the AMQP 1.0 hot paths' byte walks. Publish path: the frame
splitter of :mod:`leveret.protocol.amqp10.frames` (:func:`split_frames`, twin of
``py_split_frames``), its transfer fast path (:func:`fast_transfer`, twin of
``py_fast_transfer``), the section scan of :mod:`leveret.protocol.amqp10.sections`
(:func:`scan`, twin of ``py_scan``) and a message's decoding (:func:`decode_message`,
twin of ``message.py_decode``). Consume path: a delivery's payload and whole transfer
frame (:func:`encode_transfer` and :func:`transfer_frame`, twins of
``message.py_encode_transfer`` and ``transfer_frames.py_transfer_frame``). Each takes
the common case and returns None (or hands over to the pure code) for anything else, so
that the pure code reads it and raises its own errors: an error is always the pure
code's (tests/unit/protocol/amqp10/test_amqp10_ctransfer.py compares them on valid,
arbitrary and mangled input). This module reads names of ``sections`` as it loads:
``sections`` imports it last.

Memory safety on hostile input: every index is checked against the length of the
(immutable) bytes before it is read.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.string cimport memcpy

from leveret.protocol.amqp10 import performatives as _perf
from leveret.protocol.amqp10 import sections as _sections

cdef object Transfer = _perf.Transfer
cdef object Scan = _sections.Scan
#: a frame size read as the bytes "AMQP": a protocol header
cdef Py_ssize_t HEADER_AS_SIZE = 0x414D5150

# how far each constructor's value extends, as sections._WIDTH: >= 0 a fixed width,
# -1 a one-byte size, -4 a four-byte size, -100 anything else (the pure scan decides)
cdef int WIDTH[256]
cdef int _i
for _i in range(256):
    _w = _sections._WIDTH[_i]
    WIDTH[_i] = -100 if _w is None or _w == _sections.DESCRIBED else _w


cdef inline unsigned int _u32(const unsigned char* p):
    return (<unsigned int>p[0] << 24) | (<unsigned int>p[1] << 16) | (<unsigned int>p[2] << 8) | p[3]


cdef list _transfer_values(bytes frame, const unsigned char* p, Py_ssize_t start, Py_ssize_t size):
    """The six fields of the transfer at ``p[start:size]`` and, as a seventh item, where
    it ends; None for anything but the common encodings (``frames.py_fast_transfer``)."""
    cdef Py_ssize_t pos, end, count, index, length
    cdef unsigned char code
    if start < 0 or start + 4 > size:
        return None
    if p[start] != 0 or p[start + 1] != 0x53 or p[start + 2] != 0x14:
        return None
    code = p[start + 3]
    if code == 0xC0 and start + 6 <= size:
        count = p[start + 5]
        pos = start + 6
        end = start + 5 + p[start + 4]
    elif code == 0xD0 and start + 12 <= size:
        count = _u32(p + start + 8)
        pos = start + 12
        end = start + 8 + <Py_ssize_t>_u32(p + start + 4)
    else:
        return None
    if count > 6 or end > size or count == 0:
        return None
    values = [None, None, None, None, None, False, end]
    for index in range(count):
        if pos >= end:
            return None
        code = p[pos]
        if code == 0x40:
            pos += 1
            continue
        if index == 2:  # delivery-tag: binary
            if code != 0xA0 or pos + 2 > end:
                return None
            length = p[pos + 1]
            if pos + 2 + length > end:
                return None
            values[2] = frame[pos + 2 : pos + 2 + length]
            pos += 2 + length
        elif index >= 4:  # settled, more: boolean
            if code == 0x41:
                values[index] = True
                pos += 1
            elif code == 0x42:
                values[index] = False
                pos += 1
            elif code == 0x56:
                if pos + 2 > end or p[pos + 1] > 1:
                    return None
                values[index] = p[pos + 1] == 1
                pos += 2
            else:
                return None
        else:  # handle, delivery-id, message-format: uint
            if code == 0x70:
                if pos + 5 > end:
                    return None
                values[index] = _u32(p + pos + 1)
                pos += 5
            elif code == 0x52:
                if pos + 2 > end:
                    return None
                values[index] = p[pos + 1]
                pos += 2
            elif code == 0x43:
                values[index] = 0
                pos += 1
            else:
                return None
    if pos != end or values[0] is None:
        return None
    return values


def fast_transfer(object data, Py_ssize_t start, Py_ssize_t size):
    """``(Transfer, end)`` for a transfer whose fields are all simple encodings, else
    None (see ``frames.py_fast_transfer``; anything but ``bytes`` is left to the
    generic decoder too)."""
    if type(data) is not bytes:
        return None
    cdef bytes frame = <bytes>data
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(frame)
    if size > PyBytes_GET_SIZE(frame):
        return None
    values = _transfer_values(frame, p, start, size)
    if values is None:
        return None
    return Transfer(values[0], values[1], values[2], values[3], values[4], values[5]), values[6]


def split_frames(bytes data not None, Py_ssize_t pos, Py_ssize_t max_size, object decode):
    """Twin of ``frames.py_split_frames``: the whole frames of ``data`` from ``pos`` on,
    up to the first that is not whole, a protocol header (its size field reads
    ``AMQP``) or a size outside 8 to ``max_size``; ``(items, pos)`` where it stopped.
    A transfer in the common encodings is the tuple ``(channel, handle, delivery-id,
    delivery-tag, message-format, settled, more, payload)``, any other frame
    ``decode(frame bytes)`` (``frames.decode_frame``, whose errors propagate)."""
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(data)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(data)
    cdef Py_ssize_t size, end
    cdef unsigned int channel
    cdef list items = []
    cdef list values
    if pos < 0:
        pos = 0
    while n - pos >= 4:
        size = <Py_ssize_t>_u32(p + pos)
        if size == HEADER_AS_SIZE or size < 8 or size > max_size or n - pos < size:
            break
        channel = (<unsigned int>p[pos + 6] << 8) | p[pos + 7]
        values = None
        if p[pos + 4] == 2 and p[pos + 5] == 0 and size > 8:
            values = _transfer_values(data, p, pos + 8, pos + size)
            if values is not None:
                end = values[6]
                items.append((channel, values[0], values[1], values[2], values[3], values[4], values[5],
                              data[end : pos + size]))
            else:
                items.append(decode(data[pos : pos + size]))
        else:
            items.append(decode(data[pos : pos + size]))
        pos += size
    return items, pos


cdef struct Sections:
    # (start, stop) of each section, -1 when absent
    Py_ssize_t h0, h1, d0, d1, a0, a1, p0, p1, ap0, ap1
    Py_ssize_t body, footer
    int body_code


cdef bint _scan(bytes payload, Sections* out, list data):
    """``sections.py_scan``'s common case into ``out`` (each data section's value
    bytes appended to ``data``); False for anything else."""
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(payload)
    cdef Py_ssize_t end = PyBytes_GET_SIZE(payload)
    cdef Py_ssize_t pos = 0, value, stop
    cdef int last = 0, code, width
    cdef unsigned char constructor
    out.h0 = out.h1 = out.d0 = out.d1 = out.a0 = out.a1 = -1
    out.p0 = out.p1 = out.ap0 = out.ap1 = -1
    out.body = -1
    out.footer = end
    out.body_code = -1
    while pos < end:
        if pos + 3 >= end or p[pos] != 0 or p[pos + 1] != 0x53:
            return False
        code = p[pos + 2]
        value = pos + 3
        constructor = p[value]
        width = WIDTH[constructor]
        if width >= 0:
            stop = value + 1 + width
        elif width == -1 and value + 1 < end:
            stop = value + 2 + p[value + 1]
        elif width == -4 and value + 4 < end:
            stop = value + 5 + <Py_ssize_t>_u32(p + value + 1)
        else:
            return False
        if stop > end:
            return False
        if 0x75 <= code <= 0x77:
            if last == 0x78:
                return False
            if out.body_code == -1:
                out.body = pos
                out.body_code = code
            elif code != out.body_code or code == 0x77:
                return False
            if code == 0x75:
                if constructor == 0xA0:
                    data.append((value + 2, stop))
                elif constructor == 0xB0:
                    data.append((value + 5, stop))
                else:
                    return False
            elif code == 0x76 and constructor != 0x45 and constructor != 0xC0 and constructor != 0xD0:
                return False
        elif 0x70 <= code <= 0x78:
            if code <= last:
                return False
            if code == 0x70 or code == 0x73:
                if constructor != 0x45 and constructor != 0xC0 and constructor != 0xD0 and constructor != 0x40:
                    return False
            elif constructor != 0xC1 and constructor != 0xD1 and constructor != 0x40:
                return False
            if code == 0x70:
                out.h0 = pos
                out.h1 = stop
            elif code == 0x73:
                out.p0 = pos
                out.p1 = stop
            elif code == 0x78:
                out.footer = pos
            elif code == 0x72:
                out.a0 = pos
                out.a1 = stop
            elif code == 0x74:
                out.ap0 = pos
                out.ap1 = stop
            else:
                out.d0 = pos
                out.d1 = stop
        else:
            return False
        last = code
        pos = stop
    return out.body_code != -1


cdef inline object _span(Py_ssize_t start, Py_ssize_t stop):
    return None if start < 0 else (start, stop)


def scan(bytes payload):
    """The sections of a message as ``sections.py_scan`` finds them (a ``Scan``), or
    None for anything but the common case (small-ulong descriptors, values of a known
    extent, in order, a body), which the pure scan then reads (and refuses)."""
    cdef Sections f
    cdef list data = []
    if not _scan(payload, &f, data):
        return None
    return Scan(_span(f.h0, f.h1), _span(f.d0, f.d1), _span(f.a0, f.a1), _span(f.p0, f.p1),
                _span(f.ap0, f.ap1), f.body, f.body_code, tuple(data), f.footer)


# -- the publish path's message (message._decode's common case) -----------------------

cdef object _Message = None
cdef object _FORMAT = None
cdef object _check_properties = _sections.check_properties
cdef object _check_application_properties = _sections.check_application_properties
cdef object _NOT_FAST = object()


def init_message(message_class, message_format):
    """Called by :mod:`leveret.protocol.amqp10.message` once its format exists: the
    class and format :func:`decode_message` makes messages of."""
    global _Message, _FORMAT
    _Message = message_class
    _FORMAT = message_format


cdef inline Py_ssize_t _uint_at(const unsigned char* p, Py_ssize_t pos, Py_ssize_t end, long long* value):
    """A uint in its usual forms (null: -1) at ``p[pos]``: where it ends, or -1."""
    cdef unsigned char code = p[pos]
    if code == 0x40:
        value[0] = -1
        return pos + 1
    if code == 0x43:
        value[0] = 0
        return pos + 1
    if code == 0x52 and pos + 1 < end:
        value[0] = p[pos + 1]
        return pos + 2
    if code == 0x70 and pos + 4 < end:
        value[0] = _u32(p + pos + 1)
        return pos + 5
    return -1


cdef object _header(const unsigned char* p, Py_ssize_t start, Py_ssize_t end):
    """``sections.read_header``'s fast cases: ``(durable, priority, ttl)``, or
    _NOT_FAST for any other form (the pure code reads it)."""
    cdef Py_ssize_t pos = start + 3, count
    cdef long long ttl = -1, delivery_count
    cdef int durable = -1, priority = -1
    cdef unsigned char code = p[pos]
    if code == 0x45 or code == 0x40:
        return (None, None, None)
    if code != 0xC0 or end - pos < 3 or p[pos + 1] != end - pos - 2:
        return _NOT_FAST
    count = p[pos + 2]
    pos += 3
    if count > 5:
        return _NOT_FAST
    if count >= 1:
        if pos >= end:
            return _NOT_FAST
        code = p[pos]
        if code == 0x41:
            durable = 1
        elif code == 0x42:
            durable = 0
        elif code != 0x40:
            return _NOT_FAST
        pos += 1
    if count >= 2 and pos < end:
        code = p[pos]
        if code == 0x50 and pos + 1 < end:
            priority = p[pos + 1]
            pos += 2
        elif code == 0x40:
            pos += 1
        else:
            return _NOT_FAST
    if count >= 3 and pos < end:
        pos = _uint_at(p, pos, end, &ttl)
        if pos < 0:
            return _NOT_FAST
    if count >= 4 and pos < end:
        if p[pos] != 0x40 and p[pos] != 0x41 and p[pos] != 0x42:
            return _NOT_FAST
        pos += 1
    if count >= 5 and pos < end:
        pos = _uint_at(p, pos, end, &delivery_count)
        if pos < 0:
            return _NOT_FAST
    if pos != end:
        return _NOT_FAST
    return (
        None if durable < 0 else durable == 1,
        None if priority < 0 else priority,
        None if ttl < 0 else ttl,
    )


cdef enum:
    PREFIX_SIZE = 21  # message._PREFIX: kind, then five uint32 offsets
    ONE_DATA = 1
    ENCODED_BODY = 2
    MANY_DATA = 3


cdef inline void _put32(unsigned char* q, Py_ssize_t value) noexcept:
    q[0] = (value >> 24) & 0xFF
    q[1] = (value >> 16) & 0xFF
    q[2] = (value >> 8) & 0xFF
    q[3] = value & 0xFF


cdef bytes _encoded(int kind, Py_ssize_t h, Py_ssize_t bare, Py_ssize_t ap, Py_ssize_t b, Py_ssize_t ins,
                    const unsigned char* p, Py_ssize_t cut, Py_ssize_t resume, Py_ssize_t end):
    """``message._PREFIX`` packed with the offsets (each plus the prefix's size),
    then ``p[:cut]`` and ``p[resume:end]``."""
    cdef Py_ssize_t tail = end - resume if resume < end else 0
    cdef bytes out = PyBytes_FromStringAndSize(NULL, PREFIX_SIZE + cut + tail)
    cdef unsigned char* q = <unsigned char*>PyBytes_AS_STRING(out)
    q[0] = kind
    _put32(q + 1, PREFIX_SIZE + h)
    _put32(q + 5, PREFIX_SIZE + bare)
    _put32(q + 9, PREFIX_SIZE + ap)
    _put32(q + 13, PREFIX_SIZE + b)
    _put32(q + 17, PREFIX_SIZE + ins)
    memcpy(q + PREFIX_SIZE, p, cut)
    if tail:
        memcpy(q + PREFIX_SIZE + cut, p + resume, tail)
    return out


def decode_message(object payload, str exchange, str routing_key):
    """Twin of ``message.py_decode_message``: the Message of a payload in the common
    case (no delivery- or message-annotations, a header in the usual forms), or None
    (the pure code decodes it). Raises DecodeError as the pure code does for bad
    properties or application-properties (the same checks, called the same way)."""
    if type(payload) is not bytes or _Message is None:
        return None
    cdef bytes data = <bytes>payload
    cdef Sections f
    cdef list sections = []
    if not _scan(data, &f, sections):
        return None
    if f.d0 >= 0 or f.a0 >= 0:
        return None
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(data)
    cdef Py_ssize_t end = PyBytes_GET_SIZE(data)
    cdef Py_ssize_t b = f.body, ap, bare, h, start, stop
    if f.h0 >= 0:
        facts = _header(p, f.h0, f.h1)
        if facts is _NOT_FAST:
            return None
        h = f.h1
    else:
        facts = (None, None, None)
        h = 0
    # a section holding null or list0 has nothing to check (sections.check_*: no items)
    ap = b
    if f.ap0 >= 0:
        if p[f.ap0 + 3] != 0x40:
            _check_application_properties(data, f.ap0, f.ap1)
        ap = f.ap0
    bare = ap
    if f.p0 >= 0:
        if p[f.p0 + 3] != 0x40 and p[f.p0 + 3] != 0x45:
            _check_properties(data, f.p0, f.p1)
        bare = f.p0
    if len(sections) == 1:
        start, stop = sections[0]
        body = data[start:stop]
        encoded = _encoded(ONE_DATA, h, bare, ap, b, start, p, start, stop, end)
    elif sections:
        body = b"".join([data[start:stop] for start, stop in sections])
        encoded = _encoded(MANY_DATA, h, bare, ap, b, end, p, end, end, end)
    else:
        body = data[b:]
        encoded = _encoded(ENCODED_BODY, h, bare, ap, b, b, p, b, end, end)
    return _Message(exchange, routing_key, body, _FORMAT, encoded, facts[0] is True, facts[2], facts[1])


# -- a delivery's payload (message.encode_transfer's common case) --------------------

cdef object _Rendered = None
cdef object _routing_annotations = None
cdef object _fallback = None


def init_delivery(rendered_class, routing_annotations, fallback):
    """Called by :mod:`leveret.protocol.amqp10.message`: the class cached on
    ``Message.rendered``, the function that encodes the routing annotations and the
    pure encoder (``py_encode_transfer``) for what the twin does not take."""
    global _Rendered, _routing_annotations, _fallback
    _Rendered = rendered_class
    _routing_annotations = routing_annotations
    _fallback = fallback


cdef inline Py_ssize_t _put_uint(unsigned char* q, unsigned long long value) noexcept:
    """``sections._uint``: the smallest uint encoding; its length."""
    if value == 0:
        q[0] = 0x43
        return 1
    if value < 256:
        q[0] = 0x52
        q[1] = <unsigned char>value
        return 2
    q[0] = 0x70
    _put32(q + 1, <Py_ssize_t>value)
    return 5


cdef enum:
    TRANSFER_HEAD = 39  # session._TRANSFER_HEAD: frame header, then the transfer


def encode_transfer(object message, object delivery_count, object first_acquirer, object ttl_left_ms):
    """Twin of ``message.py_encode_transfer`` for an AMQP 1.0 message whose rendering
    is cached or has no message-annotations and no deaths (rendered and cached here as
    the pure code does); anything else is encoded by the pure code (the fallback
    given to :func:`init_delivery`)."""
    out = _payload(message, delivery_count, first_acquirer, ttl_left_ms, 0)
    return out if out is not None else _fallback(message, delivery_count, first_acquirer, ttl_left_ms)


def transfer_frame(unsigned int channel, unsigned int handle, unsigned int delivery_id, bint settled,
                   Py_ssize_t max_frame_size, object message, object delivery_count, object first_acquirer,
                   object ttl_left_ms):
    """Twin of ``session.py_transfer_frame``: the whole frame of a delivery in one
    transfer (``session.send_transfer``'s head, then :func:`encode_transfer`'s
    payload), or None when it does not fit ``max_frame_size`` or is not the twin's
    common case (the caller then encodes it the usual way)."""
    if channel > 0xFFFF:
        return None
    cdef bytes out = _payload(message, delivery_count, first_acquirer, ttl_left_ms, TRANSFER_HEAD)
    if out is None or PyBytes_GET_SIZE(out) > max_frame_size:
        return None
    cdef unsigned char* q = <unsigned char*>PyBytes_AS_STRING(out)
    _put32(q, PyBytes_GET_SIZE(out))
    q[4] = 2
    q[5] = 0
    q[6] = (channel >> 8) & 0xFF
    q[7] = channel & 0xFF
    q[8] = 0x00
    q[9] = 0x53
    q[10] = 0x14
    q[11] = 0xD0
    _put32(q + 12, 23)
    _put32(q + 16, 6)
    q[20] = 0x70
    _put32(q + 21, handle)
    q[25] = 0x70
    _put32(q + 26, delivery_id)
    q[30] = 0xA0
    q[31] = 4
    _put32(q + 32, delivery_id)
    q[36] = 0x43
    q[37] = 0x41 if settled else 0x42
    q[38] = 0x42
    return out


cdef object _payload(object message, object delivery_count, object first_acquirer, object ttl_left_ms,
                     Py_ssize_t room):
    """:func:`encode_transfer`'s bytes after ``room`` bytes left for the caller, or
    None for what the pure code encodes."""
    if _Rendered is None or message.format is not _FORMAT:
        return None
    if type(delivery_count) is not int or not 0 <= delivery_count < 4294967296:
        return None  # the pure code raises
    deaths = message.deaths
    rendered = message.rendered
    cdef bytes head, tail, body
    cdef bint with_body
    cdef const unsigned char* e
    cdef Py_ssize_t n, kind, h, bare, ins
    if type(rendered) is _Rendered:
        head = rendered.head
        with_body = rendered.with_body
        tail = rendered.tail
    else:
        if deaths:
            return None
        encoded = message.encoded
        if type(encoded) is not bytes or PyBytes_GET_SIZE(encoded) < PREFIX_SIZE:
            return None
        e = <const unsigned char*>PyBytes_AS_STRING(encoded)
        n = PyBytes_GET_SIZE(encoded)
        kind = e[0]
        h = _u32(e + 1)
        bare = _u32(e + 5)
        ins = _u32(e + 17)
        if h < bare or bare > n or ins > n or bare > ins:
            return None  # message-annotations of its own (or an odd layout): the pure code
        annotations = _routing_annotations(message.exchange, message.routing_key)
        if kind == MANY_DATA:
            head = annotations + encoded[bare:]
            with_body = False
            tail = b""
        else:
            head = annotations + encoded[bare:ins]
            with_body = True
            tail = encoded[ins:]
        made = _Rendered(head, with_body, tail)
        if rendered is None:
            message.rendered = made
    ttl = ttl_left_ms if ttl_left_ms is not None else message.ttl
    first = bool(first_acquirer) and not deaths
    priority = message.priority
    if priority is not None and not 0 <= priority < 256:
        priority = 255 if priority > 0 else 0
    if ttl is not None and not 0 <= ttl < 4294967296:
        ttl = 4294967295 if ttl > 0 else 0
    body = message.body if with_body else b""
    if type(body) is not bytes:
        return None
    cdef unsigned char header[32]
    cdef Py_ssize_t at = 6
    header[at] = 0x41 if message.persistent else 0x42
    at += 1
    if priority is None:
        header[at] = 0x40
        at += 1
    else:
        header[at] = 0x50
        header[at + 1] = <unsigned char>priority
        at += 2
    if ttl is None:
        header[at] = 0x40
        at += 1
    else:
        at += _put_uint(header + at, <unsigned long long>ttl)
    header[at] = 0x41 if first else 0x42
    at += 1
    at += _put_uint(header + at, <unsigned long long>delivery_count)
    header[0] = 0x00
    header[1] = 0x53
    header[2] = 0x70
    header[3] = 0xC0
    header[4] = <unsigned char>(at - 5)
    header[5] = 5
    cdef Py_ssize_t hl = PyBytes_GET_SIZE(head), bl = PyBytes_GET_SIZE(body), tl = PyBytes_GET_SIZE(tail)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, room + at + hl + bl + tl)
    cdef unsigned char* q = <unsigned char*>PyBytes_AS_STRING(out) + room
    memcpy(q, header, at)
    memcpy(q + at, PyBytes_AS_STRING(head), hl)
    memcpy(q + at + hl, PyBytes_AS_STRING(body), bl)
    memcpy(q + at + hl + bl, PyBytes_AS_STRING(tail), tl)
    return out
