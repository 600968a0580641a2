"""Erlang's portable term hash and the jump consistent hash RabbitMQ's plugins route with.

RabbitMQ's ``x-consistent-hash`` exchange (``rabbitmq_consistent_hash_exchange``) hashes
a message's routing key, header or property with ``erlang:phash2/1`` and picks a bucket
with Lamping and Veach's jump consistent hash driven by Erlang's ``exs1024`` generator
seeded from that hash; ``x-modulus-hash`` (RabbitMQ 4.3) takes ``erlang:phash2/2`` of the
routing keys modulo the number of bindings. Both hashes are specified to be the same on
every machine and Erlang release, so computing them here the same way sends a message to
the same queue as RabbitMQ would, given the same bindings in the same order.

Erlang terms are modelled by Python values: :class:`Atom` for atoms, ``bytes`` for
binaries, ``int``, ``float``, ``tuple`` and ``list``. Written from the algorithms'
published descriptions (Bob Jenkins' 1996 hash; xorshift64*/xorshift1024*), checked
against ``erl`` in the tests.
"""

from __future__ import annotations

import struct
from functools import lru_cache

from ..compiled import twin

_M32 = 0xFFFFFFFF
_M64 = 0xFFFFFFFFFFFFFFFF
_GOLDEN = 0x9E3779B9  # the golden ratio; Jenkins' arbitrary start value


def _hconst(n: int) -> int:
    return (_GOLDEN * n) & _M32


_H2, _H3, _H4, _H9, _H10, _H11, _H12, _H13 = (_hconst(n) for n in (2, 3, 4, 9, 10, 11, 12, 13))
#: What the empty list mixes in when it is not the first term hashed.
_NIL_WORD = 2  # NIL_DEF, the nil tag number
_NIL_FIRST = 3468870702
PHASH2_RANGE = 1 << 27


class Atom(str):
    """An Erlang atom (``undefined``, ``true``, ``longstr`` …), as distinct from text."""

    __slots__ = ()


UNDEFINED = Atom("undefined")


def _mix(a: int, b: int, c: int) -> int:
    """Jenkins' 96-bit mix of three 32-bit words; returns the new ``c``."""
    return _mix3(a, b, c)[2]


def _mix_words(x: int, y: int, const: int, acc: int) -> int:
    return _mix((const + x) & _M32, (const + y) & _M32, acc)


def _block_hash(data: bytes, initval: int) -> int:
    """Jenkins' hash of a byte string, 12 bytes a round, little-endian words."""
    a = b = _GOLDEN
    c = initval
    length = len(data)
    full = length - length % 12
    for i in range(0, full, 12):
        w0, w1, w2 = struct.unpack_from("<III", data, i)
        a = (a + w0) & _M32
        b = (b + w1) & _M32
        c = (c + w2) & _M32
        a, b, c = _mix3(a, b, c)
    tail = data[full:] + bytes(12 - (length - full))
    w0, w1, w2 = struct.unpack("<III", tail)
    c = (c + length) & _M32
    a = (a + w0) & _M32
    b = (b + w1) & _M32
    c = (c + (w2 << 8)) & _M32  # the low byte of c holds the length
    return _mix(a, b, c)


def _mix3(a: int, b: int, c: int) -> tuple[int, int, int]:
    """Jenkins' 96-bit mix of three 32-bit words (his 1996 ``mix`` macro): three rounds,
    each of ``a``, ``b``, ``c`` in turn, with these shifts (right, left, right)."""
    for right_a, left_b, right_c in _MIX_SHIFTS:
        a = ((a - b - c) & _M32) ^ (c >> right_a)
        b = ((b - c - a) & _M32) ^ ((a << left_b) & _M32)
        c = ((c - a - b) & _M32) ^ (b >> right_c)
    return a, b, c


_MIX_SHIFTS = ((13, 8, 13), (12, 16, 5), (3, 10, 15))


@lru_cache(maxsize=256)
def atom_hash(name: str) -> int:
    """The atom table's hash of an atom's text (hashpjw over its Latin-1 bytes)."""
    h = 0
    for byte in name.encode("latin-1"):
        h = ((h << 4) + byte) & _M32
        g = h & 0xF0000000
        if g:
            h ^= g >> 24
            h ^= g
    return h


def _int_hash(n: int, acc: int) -> int:
    if -(1 << 27) <= n < (1 << 27):  # fits 28 bits signed
        if n < 0:
            acc = _mix_words(-n, 0, _GOLDEN, acc)
        return _mix_words(n & _M32, 0, _GOLDEN, acc)
    const = _H10 if n < 0 else _H11
    magnitude = -n if n < 0 else n
    while True:  # 64-bit digits, low first
        digit = magnitude & _M64
        acc = _mix_words(digit & _M32, digit >> 32, const, acc)
        magnitude >>= 64
        if not magnitude:
            return acc


def make_hash2(term: object) -> int:
    """Erlang's ``make_hash2``: the 32-bit portable hash of ``term``."""
    if isinstance(term, Atom):
        return atom_hash(term)
    if isinstance(term, int) and not isinstance(term, bool):
        return _int_hash(term, 0)
    if isinstance(term, bool):
        return atom_hash("true" if term else "false")
    acc = 0
    stack: list[object] = []
    while True:
        if isinstance(term, (bytes, bytearray, memoryview)):
            const = (_H13 + acc) & _M32
            data = bytes(term)
            acc = _block_hash(data, const) if data else const
        elif isinstance(term, bool):
            term = Atom("true" if term else "false")
            continue
        elif isinstance(term, Atom):
            value = atom_hash(term)
            acc = value if acc == 0 else _mix_words(value, 0, _H3, acc)
        elif isinstance(term, int):
            acc = _int_hash(term, acc)
        elif isinstance(term, str):  # text given where a binary is meant
            term = term.encode()
            continue
        elif isinstance(term, float):
            high, low = struct.unpack(">II", struct.pack(">d", term + 0.0))  # -0.0 as 0.0
            acc = _mix_words(high, low, _H12, acc)
        elif isinstance(term, tuple):
            acc = _mix_words(len(term), 0, _H9, acc)
            if term:
                stack.extend(reversed(term[1:]))
                term = term[0]
                continue
        elif isinstance(term, list):
            if not term:
                acc = _NIL_FIRST if acc == 0 else _mix_words(_NIL_WORD, 0, _H2, acc)
            else:
                # byte elements are packed four to a word (Erlang's string shortcut)
                i, count, word = 0, 0, 0
                while i < len(term) and _is_byte(term[i]):
                    word = ((word << 8) + term[i]) & _M32
                    count += 1
                    if count == 4:
                        acc = _mix_words(word, 0, _H4, acc)
                        count = word = 0
                    i += 1
                if count:
                    acc = _mix_words(word, 0, _H4, acc)
                if i < len(term):
                    stack.append(term[i + 1 :])
                    term = term[i]
                    continue
                term = []  # the proper list's tail, hashed as nil
                continue
        elif term is None:
            term = UNDEFINED
            continue
        else:
            raise TypeError(f"no Erlang term for {type(term).__name__}")
        if not stack:
            return acc
        term = stack.pop()


def _is_byte(item: object) -> bool:
    return type(item) is int and 0 <= item <= 255


def phash2(term: object, limit: int = PHASH2_RANGE) -> int:
    """``erlang:phash2/1`` (``limit`` 2**27) or ``erlang:phash2/2``: 0 <= hash < ``limit``."""
    return py_make_hash2(term) % limit  # the pure one: this is the pure twin


def _exs1024_seed(key: int) -> list[int]:
    """Erlang's ``rand:seed_s(exs1024, {K, K, K})``: sixteen 64-bit words from
    xorshift64*, in the order the generator consumes them (the last made first)."""
    m21 = (1 << 21) - 1
    k = (key & m21) + 1
    state = (((k * 2097131) & m21) << 43) | (((k * 2097133) & m21) << 22) | (((k * 2097143) & m21) << 1) | 1
    mask = _M64
    words = [0] * 16
    for i in range(15, -1, -1):
        state ^= state >> 12
        state ^= (state << 25) & mask
        state ^= state >> 27
        words[i] = (state * 2685821657736338717) & mask
    return words


def jump_consistent_hash(key: int, buckets: int) -> int:
    """The bucket (0 <= bucket < ``buckets``) RabbitMQ's consistent-hash exchange picks
    for the phash2 value ``key``: jump consistent hashing whose uniform draws come from
    xorshift1024* seeded with ``{key, key, key}``, each a 64-bit draw divided by 2**64."""
    if buckets == 1:
        return 0
    ring = _exs1024_seed(key)
    mask = _M64
    p = 0
    b, j = -1, 0
    while j < buckets:
        b = j
        s0 = ring[p]
        p = (p + 1) & 15
        s1 = ring[p]
        s1 ^= (s1 << 31) & mask
        s1 ^= s1 >> 11
        s0 ^= s0 >> 30
        s0 ^= s1
        ring[p] = s0
        r = ((s0 * 1181783497276652981) & mask) / 18446744073709551616.0
        j = int((b + 1) / r) if r else buckets  # r == 0.0 would be a badarith in Erlang
    return b


#: The pure twins, which the compiled module falls back on (and the tests compare with).
py_make_hash2, py_phash2, py_jump_consistent_hash = make_hash2, phash2, jump_consistent_hash

_c = twin("leveret.core._cerlang_hash")  # the compiled twin (leveret/core/_cerlang_hash.pyx)
if _c is not None:
    make_hash2, phash2, jump_consistent_hash = _c.make_hash2, _c.phash2, _c.jump_consistent_hash
