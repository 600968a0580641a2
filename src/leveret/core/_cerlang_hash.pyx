# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled twin of :mod:`leveret.core.erlang_hash`'s hot part (see
:mod:`leveret.compiled`): ``phash2`` of a binary and the consistent-hash exchange's jump
hash, in 32- and 64-bit C arithmetic (binaries, lists of them, ``{Type, Binary}``
headers). Same result as the pure twin on any input
(tests/unit/core/test_exchange_types.py compares them); other terms go to the pure
``make_hash2``.
"""

from libc.stdint cimport int64_t, uint32_t, uint64_t

from leveret.core import erlang_hash as _pure

cdef uint32_t GOLDEN = 0x9E3779B9
cdef uint32_t H2 = <uint32_t>(0x9E3779B9 * 2)
cdef uint32_t H3 = <uint32_t>(0x9E3779B9 * 3)
cdef uint32_t H9 = <uint32_t>(0x9E3779B9 * 9)
cdef uint32_t H13 = <uint32_t>(0x9E3779B9 * 13)
cdef uint32_t NIL_FIRST = 3468870702u


cdef inline void _mix(uint32_t* pa, uint32_t* pb, uint32_t* pc):
    """Jenkins' 96-bit mix of three 32-bit words, in place (the pure ``_mix3``)."""
    cdef uint32_t a = pa[0], b = pb[0], c = pc[0]
    a -= b; a -= c; a ^= c >> 13
    b -= c; b -= a; b ^= a << 8
    c -= a; c -= b; c ^= b >> 13
    a -= b; a -= c; a ^= c >> 12
    b -= c; b -= a; b ^= a << 16
    c -= a; c -= b; c ^= b >> 5
    a -= b; a -= c; a ^= c >> 3
    b -= c; b -= a; b ^= a << 10
    c -= a; c -= b; c ^= b >> 15
    pa[0] = a
    pb[0] = b
    pc[0] = c


cdef inline uint32_t _mix_words(uint32_t x, uint32_t y, uint32_t const, uint32_t c):
    cdef uint32_t a = const + x, b = const + y
    _mix(&a, &b, &c)
    return c


cdef inline uint32_t _binary(bytes term, uint32_t acc):
    cdef const unsigned char* data = term
    cdef uint32_t const = H13 + acc
    if len(term) == 0:
        return const
    return _block_hash(data, len(term), const)


cdef inline uint32_t _block_hash(const unsigned char* k, Py_ssize_t length, uint32_t c):
    cdef uint32_t a = GOLDEN, b = GOLDEN
    cdef Py_ssize_t left = length
    while left >= 12:
        a += k[0] | (<uint32_t>k[1] << 8) | (<uint32_t>k[2] << 16) | (<uint32_t>k[3] << 24)
        b += k[4] | (<uint32_t>k[5] << 8) | (<uint32_t>k[6] << 16) | (<uint32_t>k[7] << 24)
        c += k[8] | (<uint32_t>k[9] << 8) | (<uint32_t>k[10] << 16) | (<uint32_t>k[11] << 24)
        _mix(&a, &b, &c)
        k += 12
        left -= 12
    c += <uint32_t>length
    if left >= 11: c += <uint32_t>k[10] << 24
    if left >= 10: c += <uint32_t>k[9] << 16
    if left >= 9: c += <uint32_t>k[8] << 8
    if left >= 8: b += <uint32_t>k[7] << 24
    if left >= 7: b += <uint32_t>k[6] << 16
    if left >= 6: b += <uint32_t>k[5] << 8
    if left >= 5: b += k[4]
    if left >= 4: a += <uint32_t>k[3] << 24
    if left >= 3: a += <uint32_t>k[2] << 16
    if left >= 2: a += <uint32_t>k[1] << 8
    if left >= 1: a += k[0]
    _mix(&a, &b, &c)
    return c


def make_hash2(term):
    """As the pure ``make_hash2``; hashed here: a binary, a list of binaries (routing
    keys), a ``{Type, Binary}`` header; anything else by the pure twin."""
    cdef uint32_t acc
    cdef object item
    if type(term) is bytes:
        return _binary(term, 0)
    if type(term) is list:  # routing keys: a list of binaries
        acc = 0
        for item in term:
            if type(item) is not bytes:
                return _pure.py_make_hash2(term)
            acc = _binary(item, acc)
        return NIL_FIRST if acc == 0 else _mix_words(2, 0, H2, acc)
    if type(term) is tuple and len(term) == 2 and type(term[0]) is _pure.Atom and type(term[1]) is bytes:
        acc = _mix_words(2, 0, H9, 0)  # a header: {Type, Binary}
        acc = _mix_words(_pure.atom_hash(term[0]), 0, H3, acc)
        return _binary(term[1], acc)
    return _pure.py_make_hash2(term)


def phash2(term, limit=_pure.PHASH2_RANGE):
    """As the pure ``phash2``."""
    return make_hash2(term) % limit


def jump_consistent_hash(key, buckets):
    """As the pure ``jump_consistent_hash``."""
    cdef uint64_t ring[16]
    cdef uint64_t m21 = (1 << 21) - 1
    cdef uint64_t k, state, s0, s1
    cdef int64_t b, j, n
    cdef int i, p
    cdef double r, jd
    if not (0 <= key < 2 ** 64) or not (-2 ** 63 <= buckets < 2 ** 63):
        return _pure.py_jump_consistent_hash(key, buckets)
    n = buckets
    if n == 1:
        return 0
    k = (<uint64_t>key & m21) + 1
    state = (((k * 2097131) & m21) << 43) | (((k * 2097133) & m21) << 22) | (((k * 2097143) & m21) << 1) | 1
    for i in range(15, -1, -1):
        state ^= state >> 12
        state ^= state << 25
        state ^= state >> 27
        ring[i] = state * <uint64_t>2685821657736338717
    p = 0
    b = -1
    j = 0
    while j < n:
        b = j
        s0 = ring[p]
        p = (p + 1) & 15
        s1 = ring[p]
        s1 ^= s1 << 31
        s1 ^= s1 >> 11
        s0 ^= s0 >> 30
        s0 ^= s1
        ring[p] = s0
        r = <double>(s0 * <uint64_t>1181783497276652981) / 18446744073709551616.0
        if r == 0.0:
            break
        jd = (<double>(b + 1)) / r
        if jd >= <double>n:
            break
        j = <int64_t>jd
    return b
