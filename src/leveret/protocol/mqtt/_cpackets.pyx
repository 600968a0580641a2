# cython: language_level=3, boundscheck=False, wraparound=False, embedsignature=True
"""Compiled twin of :func:`leveret.protocol.mqtt.packets.py_feed` (``PacketReader.feed``):
the same packets and the same MalformedPacket on any input
(tests/unit/protocol/mqtt/test_mqtt_cpackets.py compares the two).

It takes the common case itself: a PUBLISH, after CONNECT, whose topic is ASCII without
NUL or wildcards, whose packet id is not 0 and whose MQTT 5 properties are empty. Every
other packet goes to the pure reader's own ``_packet`` (the bytes before it taken out
of the buffer first, as the pure loop does), and anything irregular in a fixed header
(a bad length, a packet over the limit) stops the loop and leaves the rest to
:func:`py_feed`, which raises its own error. So an error is always the pure code's.

Memory safety on hostile input: the buffer is read through a pointer and a size taken
at the top of each round, after the last call into Python code that could resize it,
and every index is checked against that size before it is read.
"""

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.unicode cimport PyUnicode_DecodeASCII

from leveret.protocol.mqtt import packets as _packets

cdef object Publish = _packets.Publish
cdef object py_feed = _packets.py_feed
cdef int PUBLISH = _packets.PUBLISH
cdef int MQTT_5 = _packets.MQTT_5


cdef object _publish(const unsigned char* p, Py_ssize_t n, int flags, bint v5):
    """The PUBLISH in ``p[0:n]``, or None when the pure decoder must read it."""
    cdef int qos = (flags >> 1) & 3
    cdef Py_ssize_t size, end, pos, i
    cdef unsigned char c
    cdef int packet_id
    if qos == 3 or (flags & 8 and qos == 0) or n < 2:
        return None
    size = (p[0] << 8) | p[1]
    end = 2 + size
    if size == 0 or end > n:
        return None
    for i in range(2, end):
        c = p[i]
        if c == 0 or c >= 0x80 or c == 0x2B or c == 0x23:  # NUL, not ASCII, + or #
            return None
    pos = end
    identifier = None
    if qos:
        if pos + 2 > n:
            return None
        packet_id = (p[pos] << 8) | p[pos + 1]
        if packet_id == 0:
            return None
        identifier = packet_id
        pos += 2
    if v5:
        if pos < n and p[pos] == 0:
            pos += 1
        else:
            return None
    topic = PyUnicode_DecodeASCII(<const char*>p + 2, size, NULL)
    payload = PyBytes_FromStringAndSize(<const char*>p + pos, n - pos)
    return Publish(topic, payload, qos, bool(flags & 1), bool(flags & 8), identifier, ())


def feed(reader, data):
    """:meth:`leveret.protocol.mqtt.packets.PacketReader.feed` (see the module doc)."""
    if reader.version is None:  # before CONNECT: not the hot path
        return py_feed(reader, data)
    reader._buffer += data
    cdef bytearray buffer = reader._buffer
    cdef bint v5 = reader.version == MQTT_5
    cdef Py_ssize_t limit = reader.max_packet_size
    cdef Py_ssize_t pos = 0, n, remaining, used, size, i, start
    cdef const unsigned char* b
    cdef unsigned char digit
    cdef int first
    cdef bint irregular = False
    cdef list out = []
    while True:
        n = PyByteArray_GET_SIZE(buffer)
        b = <const unsigned char*>PyByteArray_AS_STRING(buffer)
        if pos >= n:
            break
        remaining = 0
        used = 0
        for i in range(4):
            if pos + 1 + i >= n:
                break
            digit = b[pos + 1 + i]
            remaining |= <Py_ssize_t>(digit & 0x7F) << (7 * i)
            if not digit & 0x80:
                if i and not digit:
                    irregular = True  # not in the fewest bytes
                used = i + 1
                break
        else:
            irregular = True  # longer than 4 bytes
        if irregular:
            break
        if used == 0:
            break  # the length is not all here yet
        size = 1 + used + remaining
        if size > limit:
            irregular = True
            break
        if n - pos < size:
            break
        first = b[pos]
        start = pos + 1 + used
        packet = None
        if first >> 4 == PUBLISH:
            packet = _publish(b + start, remaining, first & 0x0F, v5)
        if packet is None:  # the pure decoder's, its bytes out of the buffer first
            body = PyBytes_FromStringAndSize(<const char*>b + start, remaining)
            del buffer[: pos + size]
            pos = 0
            packet = reader._packet(first >> 4, first & 0x0F, body)
        else:
            pos += size
        out.append(packet)
    if pos:
        del buffer[:pos]
    if irregular:  # the pure reader raises its own error on what is left
        out += py_feed(reader, b"")
    elif not buffer and buffer.__alloc__() > 512:  # an idle connection holds no big buffer
        reader._buffer = bytearray()
    return out
