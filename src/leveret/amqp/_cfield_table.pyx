# cython: language_level=3, boundscheck=True, wraparound=False
"""Compiled twin of :func:`leveret.amqp.field_table.add_long_header` (docs/compiled.md).

The per-delivery header (``x-stream-offset``, ``x-delivery-count``, ``x-lease-seq``) is
written into a copy of the content header payload in one allocation. Anything unusual
(a short or malformed header, property flag continuation, a value outside a signed 64
bit integer) goes to the pure-Python twin, so results and errors are the same on any
input (tests/unit/amqp/test_field_table_twins.py).
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.string cimport memcpy

cdef object _pure = None  # the pure twin: set by leveret.amqp.field_table at import
cdef dict _keys = {}  # header name -> its encoded key and type tag (b"\x0ex-stream-offsetl")


def use_pure(function):
    """Give the pure twin that unusual input goes to."""
    global _pure
    _pure = function


cdef bytes _key(str name):
    key = _keys.get(name)
    if key is None:
        data = name.encode()
        key = bytes((len(data),)) + data + b"l"
        _keys[name] = key
    return key


cdef inline void _put_u32(char* at, unsigned long long value):
    at[0] = <char>((value >> 24) & 0xFF)
    at[1] = <char>((value >> 16) & 0xFF)
    at[2] = <char>((value >> 8) & 0xFF)
    at[3] = <char>(value & 0xFF)


cdef inline void _put_i64(char* at, long long value):
    cdef unsigned long long bits = <unsigned long long>value
    cdef int i
    for i in range(8):
        at[i] = <char>((bits >> (56 - 8 * i)) & 0xFF)


def add_long_header(header, name, value):
    """See :func:`leveret.amqp.field_table.add_long_header`."""
    if type(header) is not bytes or type(name) is not str or type(value) is not int:
        return _pure(header, name, value)
    if not -(1 << 63) <= value < (1 << 63):
        return _pure(header, name, value)
    cdef bytes head = header
    cdef Py_ssize_t n = len(head)
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(head)
    if n < 14:
        return _pure(header, name, value)
    cdef unsigned int flags = (p[12] << 8) | p[13]
    cdef Py_ssize_t offset = 14
    if flags & 0x8000:
        if offset >= n:
            return _pure(header, name, value)
        offset += 1 + p[offset]
    if flags & 0x4000:
        if offset >= n:
            return _pure(header, name, value)
        offset += 1 + p[offset]
    if flags & 0x0001 or offset > n:
        return _pure(header, name, value)
    cdef bytes key = _key(name)
    cdef Py_ssize_t key_size = len(key)
    cdef Py_ssize_t entry_size = key_size + 8
    cdef unsigned long long size
    cdef Py_ssize_t end
    cdef bytes out
    cdef char* o
    if flags & 0x2000:  # append to the table there
        if offset + 4 > n:
            return _pure(header, name, value)
        size = (<unsigned long long>p[offset] << 24) | (p[offset + 1] << 16) | (p[offset + 2] << 8) | p[offset + 3]
        end = offset + 4 + <Py_ssize_t>size
        if end > n or size + entry_size > 0xFFFFFFFF:
            return _pure(header, name, value)
        out = PyBytes_FromStringAndSize(NULL, n + entry_size)
        o = PyBytes_AS_STRING(out)
        memcpy(o, p, offset)
        _put_u32(o + offset, size + entry_size)
        memcpy(o + offset + 4, p + offset + 4, end - offset - 4)
        memcpy(o + end, PyBytes_AS_STRING(key), key_size)
        _put_i64(o + end + key_size, value)
        memcpy(o + end + entry_size, p + end, n - end)
        return out
    # no table: set its flag and put a table of one entry in its place
    out = PyBytes_FromStringAndSize(NULL, n + 4 + entry_size)
    o = PyBytes_AS_STRING(out)
    memcpy(o, p, 12)
    o[12] = <char>(((flags | 0x2000) >> 8) & 0xFF)
    o[13] = <char>(flags & 0xFF)
    memcpy(o + 14, p + 14, offset - 14)
    _put_u32(o + offset, entry_size)
    memcpy(o + offset + 4, PyBytes_AS_STRING(key), key_size)
    _put_i64(o + offset + 4 + key_size, value)
    memcpy(o + offset + 4 + entry_size, p + offset, n - offset)
    return out
