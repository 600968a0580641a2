"""The AMQP 1.0 type system (OASIS AMQP 1.0 part 1, §1.6): every primitive encoding,
described types, :func:`encode` and :func:`decode`, sans-I/O.

Python representations (what :func:`decode` returns; :func:`encode` takes the same):

==================  ==============================================================
AMQP type           Python
==================  ==============================================================
null                ``None``
boolean             ``bool`` (``0x41`` true, ``0x42`` false, ``0x56`` + one byte)
ubyte/ushort        :class:`UByte`, :class:`UShort` (``int`` subclasses)
uint, ulong         :class:`UInt`, :class:`ULong` (small and zero forms included)
byte/short/int      :class:`Byte`, :class:`Short`, :class:`Int`
long                plain ``int`` (as ``proton.Data`` does)
float, double       :class:`Float32` (a ``float`` subclass), plain ``float``
decimal32/64/128    :class:`Decimal32`, :class:`Decimal64`, :class:`Decimal128`: the raw
                    IEEE 754 bytes (4, 8, 16), not interpreted
char                :class:`Char` (a one-character ``str``; UTF-32BE on the wire)
timestamp           :class:`Timestamp` (``int``: milliseconds since the Unix epoch)
uuid                ``uuid.UUID``
binary              ``bytes`` (``bytearray`` and ``memoryview`` encode too)
string              plain ``str``
symbol              :class:`Symbol` (a ``str`` subclass, ASCII only)
list                ``list`` (``tuple`` encodes too)
map                 ``dict``
array               :class:`Array`: the element type's name and a tuple of elements
described           :class:`Described`: descriptor (usually a ULong or Symbol), value
==================  ==============================================================

Because the wrappers subclass ``int``, ``str`` and ``float``, they compare equal to the
plain values (``Symbol("a") == "a"``); a decoded map whose keys are equal in Python (a
Symbol and a string of the same text, a UInt and a ULong of the same number) is refused.

:func:`encode` picks the smallest encoding of each value (``uint0``, ``smalluint``,
``list0``, ``str8``, ...). :func:`decode` accepts every encoding and refuses anything
else with :class:`DecodeError` (condition ``amqp:decode-error``, §2.8.15): unknown or
reserved constructors, sizes or counts that run past the bytes present, strings that
are not UTF-8 (symbols not ASCII), booleans other than 0 or 1, maps with an odd count.

Hostile input cannot blow up memory or recursion: compounds (list, map, array, described
values) nest at most :data:`MAX_DEPTH` levels, a compound's count cannot exceed its
size in bytes, every size is checked against the bytes present before anything is read,
and the elements of arrays of a zero-width type (null, true, false, uint0, ulong0,
list0), which take no bytes each, are counted against the input's size plus
:data:`ZERO_WIDTH_ALLOWANCE`, so a decode never builds many more elements than it was
given bytes.
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass
from typing import Any

#: The error condition of every decoding failure (part 2, §2.8.15).
DECODE_ERROR = "amqp:decode-error"

#: How deep compounds (list, map, array, described value) may nest in one decode.
MAX_DEPTH = 64
#: Zero-width array elements (an array of nulls, say) one decode may build beyond one
#: per byte of its input.
ZERO_WIDTH_ALLOWANCE = 1024


class DecodeError(ValueError):
    """Bytes that are not a valid AMQP 1.0 encoding; ``condition`` is the AMQP error
    condition to close the connection with (``amqp:decode-error`` unless a caller gives
    a more specific one, e.g. ``amqp:connection:framing-error`` for a bad frame)."""

    def __init__(self, message: str, condition: str = DECODE_ERROR) -> None:
        super().__init__(message)
        self.condition = condition


# -- Python representations --------------------------------------------------------------


class UByte(int):
    """AMQP ubyte: 0 to 255."""

    __slots__ = ()


class UShort(int):
    """AMQP ushort: 0 to 65,535."""

    __slots__ = ()


class UInt(int):
    """AMQP uint: 0 to 2**32 - 1."""

    __slots__ = ()


class ULong(int):
    """AMQP ulong: 0 to 2**64 - 1."""

    __slots__ = ()


class Byte(int):
    """AMQP byte: -128 to 127."""

    __slots__ = ()


class Short(int):
    """AMQP short: -32,768 to 32,767."""

    __slots__ = ()


class Int(int):
    """AMQP int: -2**31 to 2**31 - 1. (A plain ``int`` is an AMQP long.)"""

    __slots__ = ()


class Timestamp(int):
    """AMQP timestamp: milliseconds since the Unix epoch, a signed 64-bit integer."""

    __slots__ = ()


class Float32(float):
    """AMQP float (IEEE 754 binary32). (A plain ``float`` is an AMQP double.)"""

    __slots__ = ()


class Char(str):
    """AMQP char: one Unicode code point (UTF-32BE on the wire)."""

    __slots__ = ()


class Symbol(str):
    """AMQP symbol: ASCII text naming something (capabilities, error conditions,
    annotation keys, descriptors)."""

    __slots__ = ()


class Decimal32(bytes):
    """AMQP decimal32: its 4 raw bytes (IEEE 754 decimal32), not interpreted."""

    __slots__ = ()


class Decimal64(bytes):
    """AMQP decimal64: its 8 raw bytes, not interpreted."""

    __slots__ = ()


class Decimal128(bytes):
    """AMQP decimal128: its 16 raw bytes, not interpreted."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Described:
    """A described type (§1.2): ``descriptor`` (a :class:`ULong` code or a
    :class:`Symbol` name, normally) and the ``value`` it describes."""

    descriptor: Any
    value: Any


@dataclass(frozen=True, slots=True)
class Array:
    """An AMQP array (§1.6.24): ``type`` is the element type's name (a key of
    :data:`ARRAY_TYPES`: ``"symbol"``, ``"uint"``, ``"list"``, ...) and ``items`` the
    elements (plain values are taken for the wrapped ones: ``Array("symbol", ("a",))``).
    With a ``descriptor`` every element is a value of that described type."""

    type: str
    items: tuple[Any, ...] = ()
    descriptor: Any = None


# -- constructors (§1.6) -----------------------------------------------------------------

DESCRIBED = 0x00
NULL, TRUE, FALSE, BOOLEAN = 0x40, 0x41, 0x42, 0x56
UBYTE, USHORT, UINT, SMALLUINT, UINT0 = 0x50, 0x60, 0x70, 0x52, 0x43
ULONG, SMALLULONG, ULONG0 = 0x80, 0x53, 0x44
BYTE, SHORT, INT, SMALLINT, LONG, SMALLLONG = 0x51, 0x61, 0x71, 0x54, 0x81, 0x55
FLOAT, DOUBLE, DECIMAL32, DECIMAL64, DECIMAL128 = 0x72, 0x82, 0x74, 0x84, 0x94
CHAR, TIMESTAMP, UUID = 0x73, 0x83, 0x98
VBIN8, VBIN32, STR8, STR32, SYM8, SYM32 = 0xA0, 0xB0, 0xA1, 0xB1, 0xA3, 0xB3
LIST0, LIST8, LIST32, MAP8, MAP32, ARRAY8, ARRAY32 = 0x45, 0xC0, 0xD0, 0xC1, 0xD1, 0xE0, 0xF0

#: Each array element type's constructors: (narrow, wide); the narrow one is used when
#: every element fits it (§1.6.24: one constructor for all elements).
ARRAY_TYPES: dict[str, tuple[int, int]] = {
    "null": (NULL, NULL),
    "boolean": (BOOLEAN, BOOLEAN),
    "ubyte": (UBYTE, UBYTE),
    "ushort": (USHORT, USHORT),
    "uint": (SMALLUINT, UINT),
    "ulong": (SMALLULONG, ULONG),
    "byte": (BYTE, BYTE),
    "short": (SHORT, SHORT),
    "int": (SMALLINT, INT),
    "long": (SMALLLONG, LONG),
    "float": (FLOAT, FLOAT),
    "double": (DOUBLE, DOUBLE),
    "decimal32": (DECIMAL32, DECIMAL32),
    "decimal64": (DECIMAL64, DECIMAL64),
    "decimal128": (DECIMAL128, DECIMAL128),
    "char": (CHAR, CHAR),
    "timestamp": (TIMESTAMP, TIMESTAMP),
    "uuid": (UUID, UUID),
    "binary": (VBIN8, VBIN32),
    "string": (STR8, STR32),
    "symbol": (SYM8, SYM32),
    "list": (LIST8, LIST32),
    "map": (MAP8, MAP32),
    "array": (ARRAY8, ARRAY32),
}
#: The type name of each constructor.
TYPE_NAMES: dict[int, str] = {code: name for name, codes in ARRAY_TYPES.items() for code in codes}
TYPE_NAMES.update({TRUE: "boolean", FALSE: "boolean", UINT0: "uint", ULONG0: "ulong", LIST0: "list"})

_FIXED = {
    UBYTE: struct.Struct(">B"),
    USHORT: struct.Struct(">H"),
    UINT: struct.Struct(">I"),
    SMALLUINT: struct.Struct(">B"),
    ULONG: struct.Struct(">Q"),
    SMALLULONG: struct.Struct(">B"),
    BYTE: struct.Struct(">b"),
    SHORT: struct.Struct(">h"),
    INT: struct.Struct(">i"),
    SMALLINT: struct.Struct(">b"),
    LONG: struct.Struct(">q"),
    SMALLLONG: struct.Struct(">b"),
    FLOAT: struct.Struct(">f"),
    DOUBLE: struct.Struct(">d"),
    TIMESTAMP: struct.Struct(">q"),
}
_U32 = struct.Struct(">I")
_WRAP: dict[int, Any] = {
    UBYTE: UByte,
    USHORT: UShort,
    UINT: UInt,
    SMALLUINT: UInt,
    ULONG: ULong,
    SMALLULONG: ULong,
    BYTE: Byte,
    SHORT: Short,
    INT: Int,
    SMALLINT: Int,
    LONG: int,
    SMALLLONG: int,
    FLOAT: Float32,
    DOUBLE: float,
    TIMESTAMP: Timestamp,
}
_ZERO_WIDTH = {NULL: None, TRUE: True, FALSE: False, UINT0: UInt(0), ULONG0: ULong(0)}
_DECIMALS = {DECIMAL32: (4, Decimal32), DECIMAL64: (8, Decimal64), DECIMAL128: (16, Decimal128)}

# -- encoding ----------------------------------------------------------------------------


def _scalar_code(value: Any) -> int:
    """The smallest constructor for a value that is not a list, map, array or described
    value; ValueError for a value AMQP cannot carry."""
    if value is None:
        return NULL
    if isinstance(value, bool):
        return TRUE if value else FALSE
    if isinstance(value, int):
        if isinstance(value, UInt):
            return UINT0 if value == 0 else SMALLUINT if 0 < value < 256 else UINT
        if isinstance(value, ULong):
            return ULONG0 if value == 0 else SMALLULONG if 0 < value < 256 else ULONG
        if isinstance(value, UByte):
            return UBYTE
        if isinstance(value, UShort):
            return USHORT
        if isinstance(value, Byte):
            return BYTE
        if isinstance(value, Short):
            return SHORT
        if isinstance(value, Int):
            return SMALLINT if -128 <= value < 128 else INT
        if isinstance(value, Timestamp):
            return TIMESTAMP
        return SMALLLONG if -128 <= value < 128 else LONG
    if isinstance(value, float):
        return FLOAT if isinstance(value, Float32) else DOUBLE
    if isinstance(value, str):
        if isinstance(value, Symbol):
            return SYM8 if len(value) < 256 else SYM32
        if isinstance(value, Char):
            return CHAR
        return STR8 if len(value) < 64 or len(value.encode("utf-8")) < 256 else STR32
    if isinstance(value, bytes | bytearray | memoryview):
        if isinstance(value, Decimal32):
            return DECIMAL32
        if isinstance(value, Decimal64):
            return DECIMAL64
        if isinstance(value, Decimal128):
            return DECIMAL128
        return VBIN8 if len(value) < 256 else VBIN32
    if isinstance(value, uuid.UUID):
        return UUID
    raise ValueError(f"no AMQP 1.0 type for a {type(value).__name__}")


_U8_LIMIT = 254  # the most element bytes a one-byte size can cover (it counts the count)


def _compound(narrow: int, count: int, data: bytes, force_wide: bool = False) -> bytes:
    """A list, map or array: constructor, size and count (one byte each for the 8-bit
    form, chosen when it fits, four for the 32-bit one), then the elements."""
    if not force_wide and len(data) <= _U8_LIMIT and count <= 255:
        return bytes((narrow, len(data) + 1, count)) + data
    if len(data) + 4 > 0xFFFFFFFF or count > 0xFFFFFFFF:
        raise ValueError("a compound larger than 4 GiB")
    return bytes((narrow + 0x10,)) + _U32.pack(len(data) + 4) + _U32.pack(count) + data


def _compound_parts(value: Any) -> tuple[int, int, bytes]:
    """A list's, map's or array's narrow constructor, element count and element bytes."""
    if isinstance(value, list | tuple):
        return LIST8, len(value), b"".join(encode(item) for item in value)
    if isinstance(value, dict):
        return MAP8, 2 * len(value), b"".join(encode(key) + encode(item) for key, item in value.items())
    return ARRAY8, len(value.items), _array_data(value)


def _array_data(array: Array) -> bytes:
    """An array's element constructor (with its descriptor) and elements (§1.6.24): the
    narrow constructor of the element type when every element fits it."""
    if array.type not in ARRAY_TYPES:
        raise ValueError(f"unknown array element type {array.type!r}")
    narrow, wide = ARRAY_TYPES[array.type]
    prefix = b"" if array.descriptor is None else b"\x00" + encode(array.descriptor)
    if narrow in (LIST8, MAP8, ARRAY8):
        kind = {LIST8: list | tuple, MAP8: dict, ARRAY8: Array}[narrow]
        parts = []
        for item in array.items:
            if not isinstance(item, kind):
                raise ValueError(f"{item!r} in an array of {array.type}")
            parts.append(_compound_parts(item))
        fits = all(len(data) <= _U8_LIMIT and count <= 255 for _, count, data in parts)
        code = narrow if fits else wide
        out = [prefix, bytes((code,))]
        out += [_compound(narrow, count, data, not fits)[1:] for _, count, data in parts]
        return b"".join(out)
    bodies = [_body(narrow, item, check=True) for item in array.items]
    if narrow != wide and None in bodies:
        narrow = wide
        bodies = [_body(wide, item) for item in array.items]
    return prefix + bytes((narrow,)) + b"".join(bodies)  # type: ignore[arg-type]


def _body(code: int, value: Any, check: bool = False) -> bytes | None:
    """A scalar ``value`` encoded for constructor ``code``, without the constructor.
    With ``check``, None when the value does not fit this (narrow) constructor."""
    fixed = _FIXED.get(code)
    if fixed is not None:
        if code in (FLOAT, DOUBLE):
            if not isinstance(value, float | int) or isinstance(value, bool):
                raise ValueError(f"{value!r} is not a number for a {TYPE_NAMES[code]}")
            try:
                return fixed.pack(value)
            except (OverflowError, struct.error):  # 1e300 as a float, 10**400 as either
                raise ValueError(f"{value!r} is out of range for a {TYPE_NAMES[code]}") from None
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"{value!r} is not an integer for a {TYPE_NAMES[code]}")
        try:
            return fixed.pack(value)
        except struct.error:
            if check:
                return None
            raise ValueError(f"{value} is out of range for a {TYPE_NAMES[code]}") from None
    if code == NULL:
        if value is not None:
            raise ValueError(f"{value!r} in an array of null")
        return b""
    if code == BOOLEAN:
        if not isinstance(value, bool):
            raise ValueError(f"{value!r} is not a boolean")
        return b"\x01" if value else b"\x00"
    if code in _DECIMALS:
        size = _DECIMALS[code][0]
        if not isinstance(value, bytes) or len(value) != size:
            raise ValueError(f"a {TYPE_NAMES[code]} is {size} raw bytes")
        return bytes(value)
    if code == CHAR:
        if not isinstance(value, str) or len(value) != 1:
            raise ValueError(f"{value!r} is not one character")
        return value.encode("utf-32-be")  # refuses lone surrogates
    if code == UUID:
        if not isinstance(value, uuid.UUID):
            raise ValueError(f"{value!r} is not a uuid.UUID")
        return value.bytes
    if code in (VBIN8, VBIN32):
        if not isinstance(value, bytes | bytearray | memoryview):
            raise ValueError(f"{value!r} is not binary")
        data = bytes(value)
    elif not isinstance(value, str):
        raise ValueError(f"{value!r} is not a string")
    elif code in (SYM8, SYM32):
        try:
            data = value.encode("ascii")
        except UnicodeEncodeError:
            raise ValueError(f"a symbol is ASCII (§1.6.21): {value!r}") from None
    else:
        data = value.encode("utf-8")  # refuses lone surrogates
    if code in (VBIN8, STR8, SYM8):
        if len(data) > 255:
            if check:
                return None
            raise ValueError("more than 255 bytes for a one-byte size")
        return bytes((len(data),)) + data
    if len(data) > 0xFFFFFFFF:
        raise ValueError("more than 4 GiB")
    return _U32.pack(len(data)) + data


def encode(value: Any) -> bytes:
    """``value`` (a Python representation, see the module's table) in its smallest AMQP
    1.0 encoding: constructor, then data. Raises ValueError for a value AMQP cannot
    carry (an int outside its type's range, a symbol that is not ASCII, an object with
    no AMQP type) and RecursionError for a value nested past Python's recursion limit."""
    if isinstance(value, list | tuple | dict | Array):
        if isinstance(value, list | tuple) and not value:
            return b"\x45"  # list0
        return _compound(*_compound_parts(value))
    if isinstance(value, Described):
        return b"\x00" + encode(value.descriptor) + encode(value.value)
    code = _scalar_code(value)
    if code in (NULL, TRUE, FALSE, UINT0, ULONG0):
        return bytes((code,))
    body = _body(code, value)
    assert body is not None
    return bytes((code,)) + body


# -- decoding ----------------------------------------------------------------------------


class _Decoder:
    """Reads values from ``data``, refusing any that runs past ``end``."""

    __slots__ = ("data", "depth", "end", "free", "pos")

    def __init__(self, data: bytes, pos: int, end: int) -> None:
        self.data = data
        self.pos = pos
        self.end = end
        self.depth = 0
        self.free = end - pos + ZERO_WIDTH_ALLOWANCE  # zero-width array elements still allowed

    def take(self, n: int, what: str) -> bytes:
        pos = self.pos
        if n > self.end - pos:
            raise DecodeError(f"{what} runs past the end of the data ({n} bytes, {self.end - pos} left)")
        self.pos = pos + n
        return self.data[pos : pos + n]

    def byte(self, what: str) -> int:
        if self.pos >= self.end:
            raise DecodeError(f"{what} runs past the end of the data")
        self.pos += 1
        return self.data[self.pos - 1]

    def u32(self, what: str) -> int:
        value: int = _U32.unpack(self.take(4, what))[0]
        return value

    def constructor(self) -> tuple[int, Any]:
        """A constructor (§1.2): its format code and, for a described type, its
        descriptor (else :data:`_NO_DESCRIPTOR`)."""
        code = self.byte("a constructor")
        if code != DESCRIBED:
            return code, _NO_DESCRIPTOR
        self.enter()
        descriptor = self.value()
        code = self.byte("a described type's constructor")
        if code == DESCRIBED:
            raise DecodeError("a descriptor's value is itself described with no value between")
        self.depth -= 1
        return code, descriptor

    def enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise DecodeError(f"values nested more than {MAX_DEPTH} deep")

    def value(self) -> Any:
        code = self.byte("a constructor")
        if code == DESCRIBED:
            self.enter()
            descriptor = self.value()
            value = self.value()
            self.depth -= 1
            return Described(descriptor, value)
        return self.body(code)

    def body(self, code: int) -> Any:
        """The data of a value whose constructor ``code`` has been read."""
        fixed = _FIXED.get(code)
        if fixed is not None:
            return _WRAP[code](fixed.unpack(self.take(fixed.size, TYPE_NAMES[code]))[0])
        if code in (VBIN8, STR8, SYM8, VBIN32, STR32, SYM32):
            size = self.byte("a size") if code < 0xB0 else self.u32("a size")
            data = self.take(size, TYPE_NAMES[code])
            if code in (VBIN8, VBIN32):
                return data
            try:
                if code in (SYM8, SYM32):
                    return Symbol(data.decode("ascii"))
                return data.decode("utf-8")  # strict: no surrogates, no overlong forms
            except UnicodeDecodeError:
                raise DecodeError(
                    f"a {TYPE_NAMES[code]} that is not valid {'ASCII' if code & 2 else 'UTF-8'}"
                ) from None
        if code in _ZERO_WIDTH:
            return _ZERO_WIDTH[code]
        if code in (LIST0, LIST8, LIST32, MAP8, MAP32):
            return self.compound(code)
        if code in (ARRAY8, ARRAY32):
            return self.array(code)
        if code == BOOLEAN:
            flag = self.byte("a boolean")
            if flag > 1:
                raise DecodeError(f"a boolean of {flag} (0 or 1 only, §1.6.2)")
            return flag == 1
        if code in _DECIMALS:
            size, wrapper = _DECIMALS[code]
            return wrapper(self.take(size, TYPE_NAMES[code]))
        if code == CHAR:
            point = self.u32("a char")
            if point > 0x10FFFF or 0xD800 <= point <= 0xDFFF:
                raise DecodeError(f"a char of U+{point:X}, not a Unicode scalar value")
            return Char(chr(point))
        if code == UUID:
            return uuid.UUID(bytes=self.take(16, "a uuid"))
        raise DecodeError(f"unknown constructor {code:#04x}")

    def sized(self, code: int) -> tuple[int, int]:
        """The size and count of a compound, checked against the bytes present; returns
        the count and where the compound ends. (An array's count is checked once its
        element constructor is known: zero-width elements take no bytes.)"""
        wide = bool(code & 0x10)  # 0xd0, 0xd1, 0xf0: the 32-bit forms
        size = self.u32("a size") if wide else self.byte("a size")
        width = 4 if wide else 1
        if size < width:
            raise DecodeError(f"a {TYPE_NAMES[code]} of {size} bytes, too small for its count")
        if size > self.end - self.pos:
            raise DecodeError(f"a {TYPE_NAMES[code]} of {size} bytes runs past the end of the data")
        end = self.pos + size
        count = self.u32("a count") if wide else self.byte("a count")
        if count > size - width and code not in (ARRAY8, ARRAY32):
            raise DecodeError(f"a {TYPE_NAMES[code]} of {count} elements in {size - width} bytes")
        return count, end

    def compound(self, code: int) -> Any:
        if code == LIST0:
            return []
        count, end = self.sized(code)
        if code in (MAP8, MAP32) and count % 2:
            raise DecodeError(f"a map with an odd number of elements ({count})")
        self.enter()
        outer, self.end = self.end, end  # elements may not run past the list's size
        items = [self.value() for _ in range(count)]
        self.end = outer
        self.depth -= 1
        self.finish(end, TYPE_NAMES[code])
        if code in (LIST8, LIST32):
            return items
        try:
            out = dict(zip(items[::2], items[1::2]))
        except TypeError:
            raise DecodeError("a map key that is a list, map or other unhashable value") from None
        if 2 * len(out) != count:
            raise DecodeError("a map with the same key twice (§1.6.23)")
        return out

    def array(self, code: int) -> Array:
        count, end = self.sized(code)
        self.enter()
        outer, self.end = self.end, end
        element, descriptor = self.constructor()
        if element not in TYPE_NAMES:
            raise DecodeError(f"unknown array element constructor {element:#04x}")
        if element in _ZERO_WIDTH or element == LIST0:
            self.free -= count
            if self.free < 0:
                raise DecodeError(f"an array of {count} zero-width elements, more than the bytes given")
        elif count > end - self.pos:
            raise DecodeError(f"an array of {count} elements in {end - self.pos} bytes")
        items = tuple(self.body(element) for _ in range(count))
        self.end = outer
        self.depth -= 1
        self.finish(end, "array")
        return Array(TYPE_NAMES[element], items, None if descriptor is _NO_DESCRIPTOR else descriptor)

    def finish(self, end: int, what: str) -> None:
        if self.pos != end:
            raise DecodeError(f"a {what} whose elements do not fill its size ({end - self.pos} bytes left)")


_NO_DESCRIPTOR = object()


def decode(data: bytes, offset: int = 0, end: int | None = None) -> tuple[Any, int]:
    """The value encoded at ``data[offset:]`` (up to ``end``, default the end of
    ``data``) and the offset just past it. Raises :class:`DecodeError` for bytes that
    are not one whole, valid value. ``data`` may be any bytes-like object (it is copied
    to ``bytes`` unless it is one, so binary values are always ``bytes``)."""
    if type(data) is not bytes:
        data = bytes(data)
    stop = len(data) if end is None else min(end, len(data))
    if not 0 <= offset <= stop:
        raise DecodeError(f"offset {offset} outside the data (0 to {stop})")
    decoder = _Decoder(data, offset, stop)
    value = decoder.value()
    return value, decoder.pos


def decode_all(data: bytes, offset: int = 0) -> list[Any]:
    """Every value encoded one after another in ``data[offset:]`` (a message's
    sections, §3.2). Raises :class:`DecodeError`."""
    if type(data) is not bytes:
        data = bytes(data)
    out = []
    decoder = _Decoder(data, offset, len(data))
    while decoder.pos < len(data):
        out.append(decoder.value())
    return out
