# cython: language_level=3, boundscheck=False, wraparound=False, embedsignature=True
"""Compiled twins of the AMQP 1.0 publish path's two byte walks: the transfer fast path
of :mod:`leveret.protocol.amqp10.frames` (:func:`fast_transfer`, twin of
``py_fast_transfer``) and the section scan of :mod:`leveret.protocol.amqp10.sections`
(:func:`scan`, twin of ``py_scan``). Both take the common case and return None for
anything else, so that the pure code reads it and raises its own errors: an error is
always the pure code's (tests/unit/protocol/amqp10/test_amqp10_ctransfer.py compares
them on valid, arbitrary and mangled input).

Memory safety on hostile input: every index is checked against the length of the
(immutable) bytes before it is read.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE

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


def scan(bytes payload):
    """The sections of a message as ``sections.py_scan`` finds them (a ``Scan``), or
    None for anything but the common case (small-ulong descriptors, values of a known
    extent, in order, a body), which the pure scan then reads (and refuses)."""
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(payload)
    cdef Py_ssize_t end = PyBytes_GET_SIZE(payload)
    cdef Py_ssize_t pos = 0, value, stop, body = -1, footer = end
    cdef int last = 0, body_code = -1, code, width
    cdef unsigned char constructor
    header = delivery = annotations = properties = application = None
    data = []
    while pos < end:
        if pos + 3 >= end or p[pos] != 0 or p[pos + 1] != 0x53:
            return None
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
            return None
        if stop > end:
            return None
        if 0x75 <= code <= 0x77:
            if last == 0x78:
                return None
            if body_code == -1:
                body = pos
                body_code = code
            elif code != body_code or code == 0x77:
                return None
            if code == 0x75:
                if constructor == 0xA0:
                    data.append((value + 2, stop))
                elif constructor == 0xB0:
                    data.append((value + 5, stop))
                else:
                    return None
            elif code == 0x76 and constructor not in (0x45, 0xC0, 0xD0):
                return None
        elif 0x70 <= code <= 0x78:
            if code <= last:
                return None
            if code == 0x70 or code == 0x73:
                if constructor not in (0x45, 0xC0, 0xD0, 0x40):
                    return None
            elif constructor not in (0xC1, 0xD1, 0x40):
                return None
            if code == 0x70:
                header = (pos, stop)
            elif code == 0x73:
                properties = (pos, stop)
            elif code == 0x78:
                footer = pos
            elif code == 0x72:
                annotations = (pos, stop)
            elif code == 0x74:
                application = (pos, stop)
            else:
                delivery = (pos, stop)
        else:
            return None
        last = code
        pos = stop
    if body_code == -1:
        return None
    return Scan(header, delivery, annotations, properties, application, body, body_code, tuple(data), footer)
