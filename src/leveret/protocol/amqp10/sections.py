"""The sections of an AMQP 1.0 message (part 3, §3.2) located without decoding them:
the scan that the transfer hot path runs, sans-I/O.

:func:`scan` walks a transfer's payload section by section, reading each section's
descriptor and the *size* of its value (every AMQP encoding gives its extent in its
first bytes, so a list, map, binary or string is stepped over, not read), checks the
order §3.2 gives (header, delivery-annotations, message-annotations, properties,
application-properties, one body: data sections, amqp-sequence sections or one
amqp-value, then footer) and returns where each section starts and ends. Only the
header is decoded (:func:`read_header`): the rest is decoded when someone asks.

:func:`header_bytes` encodes the header a receiver gets (part 3, §3.2.1).

Errors: :class:`~leveret.protocol.amqp10.types.DecodeError` with ``amqp:decode-error``
(RabbitMQ 4 detaches the link with that condition for a message it cannot parse):
an unknown constructor or descriptor, a size past the payload, sections out of order
or repeated, a section's value of the wrong type, no body.
"""

from __future__ import annotations

import functools
import struct
from typing import Any, NamedTuple

from leveret.compiled import twin

from .types import DECODE_ERROR, MAX_DEPTH, DecodeError, decode

HEADER, DELIVERY_ANNOTATIONS, MESSAGE_ANNOTATIONS, PROPERTIES = 0x70, 0x71, 0x72, 0x73
APPLICATION_PROPERTIES, DATA, AMQP_SEQUENCE, AMQP_VALUE, FOOTER = 0x74, 0x75, 0x76, 0x77, 0x78
#: The symbolic descriptors of the sections (§3.2), for senders that use them.
SECTION_NAMES = {
    "amqp:header:list": HEADER,
    "amqp:delivery-annotations:map": DELIVERY_ANNOTATIONS,
    "amqp:message-annotations:map": MESSAGE_ANNOTATIONS,
    "amqp:properties:list": PROPERTIES,
    "amqp:application-properties:map": APPLICATION_PROPERTIES,
    "amqp:data:binary": DATA,
    "amqp:amqp-sequence:list": AMQP_SEQUENCE,
    "amqp:amqp-value:*": AMQP_VALUE,
    "amqp:footer:map": FOOTER,
}

# How far each constructor's value extends: >= 0 a fixed width, SIZE8 / SIZE32 a
# one- or four-byte size first, DESCRIBED a descriptor then a value, None unknown.
SIZE8, SIZE32, DESCRIBED = -1, -4, -2
_WIDTH: list[int | None] = [None] * 256
for _code in (0x40, 0x41, 0x42, 0x43, 0x44, 0x45):
    _WIDTH[_code] = 0
for _code in (0x50, 0x51, 0x52, 0x53, 0x54, 0x55, 0x56):
    _WIDTH[_code] = 1
for _code in (0x60, 0x61):
    _WIDTH[_code] = 2
for _code in (0x70, 0x71, 0x72, 0x73, 0x74):
    _WIDTH[_code] = 4
for _code in (0x80, 0x81, 0x82, 0x83, 0x84):
    _WIDTH[_code] = 8
for _code in (0x94, 0x98):
    _WIDTH[_code] = 16
for _code in (0xA0, 0xA1, 0xA3, 0xC0, 0xC1, 0xE0):
    _WIDTH[_code] = SIZE8
for _code in (0xB0, 0xB1, 0xB3, 0xD0, 0xD1, 0xF0):
    _WIDTH[_code] = SIZE32
_WIDTH[0x00] = DESCRIBED

_U32 = struct.Struct(">I")
_LISTS = frozenset((0x45, 0xC0, 0xD0))
_MAPS = frozenset((0xC1, 0xD1))
_BINARIES = frozenset((0xA0, 0xB0))
_NULL = 0x40


def skip(data: bytes, pos: int, end: int, depth: int = 0) -> int:
    """The offset just past the value encoded at ``data[pos:]``, from its constructor
    and size alone (its contents are not checked). Raises DecodeError for an unknown
    constructor or a value running past ``end``."""
    if pos >= end:
        raise DecodeError("a value runs past the end of the message")
    code = data[pos]
    width = _WIDTH[code]
    if width is None:
        raise DecodeError(f"unknown constructor {code:#04x} in a message")
    if width >= 0:
        stop = pos + 1 + width
    elif width == SIZE8:
        if pos + 2 > end:
            raise DecodeError("a size runs past the end of the message")
        stop = pos + 2 + data[pos + 1]
    elif width == SIZE32:
        if pos + 5 > end:
            raise DecodeError("a size runs past the end of the message")
        stop = pos + 5 + _U32.unpack_from(data, pos + 1)[0]
    else:
        if depth >= MAX_DEPTH:
            raise DecodeError(f"values nested more than {MAX_DEPTH} deep")
        return skip(data, skip(data, pos + 1, end, depth + 1), end, depth + 1)
    if stop > end:
        raise DecodeError("a value runs past the end of the message")
    return stop


class Scan(NamedTuple):
    """Where a message's sections are in its payload (offsets; ``(start, end)``
    pairs cover the whole section, descriptor included, None when absent)."""

    header: tuple[int, int] | None
    delivery_annotations: tuple[int, int] | None
    message_annotations: tuple[int, int] | None
    properties: tuple[int, int] | None
    application_properties: tuple[int, int] | None
    #: where the body's first section starts
    body: int
    #: the body's section code: DATA, AMQP_SEQUENCE or AMQP_VALUE
    body_code: int
    #: each data section's value bytes (start, end), for a body of data sections
    data: tuple[tuple[int, int], ...]
    #: where the footer starts (the payload's length when there is none)
    footer: int


def _section(payload: bytes, pos: int, end: int) -> tuple[int, int]:
    """A section's descriptor code and where its value starts."""
    if payload[pos] != 0:
        raise DecodeError(f"a message section that is not a described value ({payload[pos]:#04x})")
    if pos + 2 < end and payload[pos + 1] == 0x53:
        return payload[pos + 2], pos + 3
    descriptor, value_at = decode(payload, pos + 1, min(end, pos + 1 + 4096))
    if isinstance(descriptor, str):
        code = SECTION_NAMES.get(descriptor)
        if code is None:
            raise DecodeError(f"an unknown message section {descriptor!r:.60}")
        return code, value_at
    if isinstance(descriptor, int) and not isinstance(descriptor, bool):
        return descriptor, value_at
    raise DecodeError("a message section with a descriptor that is neither a code nor a name")


def scan(payload: bytes) -> Scan:
    """The sections of a message (see the module doc). Raises DecodeError. The
    compiled twin (``_ctransfer.pyx``) takes the common case of ``bytes`` when built;
    the pure :func:`py_scan` reads the rest."""
    if _compiled is not None and type(payload) is bytes:
        found = _compiled.scan(payload)
        if found is not None:
            return found
    return py_scan(payload)


def py_scan(payload: bytes) -> Scan:
    """:func:`scan` in pure Python (the compiled twin's reference)."""
    end = len(payload)
    pos = 0
    last = 0
    header = delivery = annotations = properties = application = None
    body = body_code = -1
    data: list[tuple[int, int]] = []
    footer = end
    width_of = _WIDTH
    while pos < end:
        if pos + 3 < end and payload[pos] == 0 and payload[pos + 1] == 0x53:
            code, value = payload[pos + 2], pos + 3
        else:
            code, value = _section(payload, pos, end)
            if value >= end:
                raise DecodeError("a message section without a value")
        constructor = payload[value]
        width = width_of[constructor]
        if width is not None and width >= 0:
            stop = value + 1 + width
        elif width == SIZE8 and value + 1 < end:
            stop = value + 2 + payload[value + 1]
        elif width == SIZE32 and value + 4 < end:
            stop = value + 5 + _U32.unpack_from(payload, value + 1)[0]
        else:
            stop = skip(payload, value, end)
        if stop > end:
            raise DecodeError("a message section runs past the end of the message")
        if DATA <= code <= AMQP_VALUE:
            if last == FOOTER:
                raise DecodeError("a body section after the footer")
            if body_code == -1:
                body, body_code = pos, code
            elif code != body_code or code == AMQP_VALUE:
                raise DecodeError("a body of more than one kind of section, or two amqp-value sections")
            if code == DATA:
                if constructor == 0xA0:
                    data.append((value + 2, stop))
                elif constructor == 0xB0:
                    data.append((value + 5, stop))
                else:
                    raise DecodeError("a data section that does not hold binary")
            elif code == AMQP_SEQUENCE and constructor not in _LISTS:
                raise DecodeError("an amqp-sequence section that does not hold a list")
        elif HEADER <= code <= FOOTER:
            if code <= last:
                raise DecodeError(f"message section {code:#x} repeated or out of order (§3.2)")
            if code in (HEADER, PROPERTIES):
                if constructor not in _LISTS and constructor != _NULL:
                    raise DecodeError(f"message section {code:#x} does not hold a list")
            elif constructor not in _MAPS and constructor != _NULL:
                raise DecodeError(f"message section {code:#x} does not hold a map")
            if code == HEADER:
                header = (pos, stop)
            elif code == PROPERTIES:
                properties = (pos, stop)
            elif code == FOOTER:
                footer = pos
            elif code == MESSAGE_ANNOTATIONS:
                annotations = (pos, stop)
            elif code == APPLICATION_PROPERTIES:
                application = (pos, stop)
            else:
                delivery = (pos, stop)
        else:
            raise DecodeError(f"an unknown message section {code:#x}")
        last = code
        pos = stop
    if body_code == -1:
        raise DecodeError("a message without a body (§3.2: one data, amqp-sequence or amqp-value)")
    return Scan(header, delivery, annotations, properties, application, body, body_code, tuple(data), footer)


_STRINGS = frozenset((0xA1, 0xB1))
_SYMBOLS = frozenset((0xA3, 0xB3))
_ID = frozenset((0x44, 0x53, 0x80, 0x98, 0xA0, 0xB0, 0xA1, 0xB1))  # ulong, uuid, binary, string
_TIMESTAMPS = frozenset((0x83,))
_UINTS = frozenset((0x43, 0x52, 0x70))
#: The constructors each field of properties (§3.2.4) may have besides null.
PROPERTY_FIELDS: tuple[tuple[str, frozenset[int]], ...] = (
    ("message-id", _ID),
    ("user-id", _BINARIES),
    ("to", _STRINGS),
    ("subject", _STRINGS),
    ("reply-to", _STRINGS),
    ("correlation-id", _ID),
    ("content-type", _SYMBOLS),
    ("content-encoding", _SYMBOLS),
    ("absolute-expiry-time", _TIMESTAMPS),
    ("creation-time", _TIMESTAMPS),
    ("group-id", _STRINGS),
    ("group-sequence", _UINTS),
    ("reply-to-group-id", _STRINGS),
)
#: Constructors an application property's value may not have (§3.2.5: simple types).
_NOT_SIMPLE = frozenset((0x00, 0x45, 0xC0, 0xD0, 0xC1, 0xD1, 0xE0, 0xF0))
#: Constructors whose bytes the codec checks beyond their size.
_CHECKED = frozenset((0x56, 0x73))


def _compound_items(data: bytes, start: int, end: int) -> tuple[int, int]:
    """The count and first item of the list or map a section at ``data[start:end]``
    holds (0 items for list0 or null)."""
    pos = start + 3 if data[start + 1] == 0x53 else decode(data, start + 1, end)[1]
    code = data[pos]
    if code == 0x45 or code == _NULL:
        return 0, end
    wide = code in (0xD0, 0xD1)
    first = pos + (9 if wide else 3)
    if first > end:
        raise DecodeError("a section's list or map runs past its end")
    size = _U32.unpack_from(data, pos + 1)[0] if wide else data[pos + 1]
    count = _U32.unpack_from(data, pos + 5)[0] if wide else data[pos + 2]
    if pos + (5 if wide else 2) + size != end:
        raise DecodeError("a section whose list or map does not fill it")
    return count, first


def _check_text(data: bytes, pos: int, stop: int, code: int) -> bytes:
    """The bytes of the string or symbol at ``data[pos:stop]``, checked (UTF-8,
    ASCII) as the codec checks them."""
    raw = data[pos + (2 if code < 0xB0 else 5) : stop]
    try:
        raw.decode("utf-8" if code in _STRINGS else "ascii")
    except UnicodeDecodeError:
        raise DecodeError(f"a {'string' if code in _STRINGS else 'symbol'} that is not valid text") from None
    return raw


def check_properties(data: bytes, start: int, end: int) -> None:
    """Check the properties section at ``data[start:end]`` field by field from the
    constructors (each field's type, §3.2.4; strings UTF-8, symbols ASCII) without
    building its values. Raises DecodeError (``amqp:decode-error``)."""
    count, pos = _compound_items(data, start, end)
    known = len(PROPERTY_FIELDS)
    for index in range(count):
        if pos >= end:
            raise DecodeError("properties with fewer fields than their count")
        code = data[pos]
        if code == _NULL:
            pos += 1
            continue
        width = _WIDTH[code]
        if width is not None and width >= 0:
            stop = pos + 1 + width
        elif width == SIZE8 and pos + 1 < end:
            stop = pos + 2 + data[pos + 1]
        else:
            stop = skip(data, pos, end)
        if stop > end:
            raise DecodeError("a property runs past the end of its section")
        if index < known:
            name, allowed = PROPERTY_FIELDS[index]
            if code not in allowed:
                raise DecodeError(f"properties: {name} of constructor {code:#04x}")
            if code in _STRINGS or code in _SYMBOLS:
                _check_text(data, pos, stop, code)
        else:
            decode(data, pos, stop)  # a field a later version adds: any valid value
        pos = stop
    if pos != end:
        raise DecodeError("properties whose fields do not fill the section")


def check_application_properties(data: bytes, start: int, end: int) -> None:
    """Check the application-properties section at ``data[start:end]``: string keys
    (UTF-8, none twice) and values of simple types (§3.2.5), from the constructors.
    Raises DecodeError (``amqp:decode-error``)."""
    count, pos = _compound_items(data, start, end)
    if count % 2:
        raise DecodeError(f"application-properties with an odd number of elements ({count})")
    keys = set()
    for _ in range(count // 2):
        code = data[pos] if pos < end else -1
        stop = skip(data, pos, end)
        if code not in _STRINGS:
            raise DecodeError(f"an application-property key of constructor {code:#04x}, not a string")
        key = _check_text(data, pos, stop, code)
        if key in keys:
            raise DecodeError("an application-property key given twice")
        keys.add(key)
        pos = stop
        code = data[pos] if pos < end else -1
        stop = skip(data, pos, end)
        if code in _NOT_SIMPLE:
            raise DecodeError(f"an application-property value of constructor {code:#04x}, not a simple type")
        if code in _STRINGS or code in _SYMBOLS:
            _check_text(data, pos, stop, code)
        elif code in _CHECKED:
            decode(data, pos, stop)
        pos = stop
    if pos != end:
        raise DecodeError("application-properties whose entries do not fill the section")


def section_value(data: bytes, start: int, end: int) -> Any:
    """The decoded value of the section at ``data[start:end]`` (None for null).
    Raises DecodeError."""
    value_at = start + 3 if data[start + 1] == 0x53 else decode(data, start + 1, end)[1]
    value, stop = decode(data, value_at, end)
    if stop != end:
        raise DecodeError("a message section with bytes after its value")
    return value


_BOOLEANS = {0x40: None, 0x41: True, 0x42: False}


def read_header(data: bytes, start: int, end: int) -> tuple[bool | None, int | None, int | None]:
    """``(durable, priority, ttl)`` of the header section at ``data[start:end]``: None
    for a field left null (durable false, priority 4 and no ttl by the spec's
    defaults). Raises DecodeError for a field of the wrong type."""
    # the forms senders use (list0, or a list8 of nulls, booleans, a ubyte and a uint
    # in its short forms) read directly; anything else through the codec
    pos = start + 3
    if data[start + 1] == 0x53 and end > pos:
        code = data[pos]
        if code == 0x45 or code == _NULL:
            return None, None, None
        if code == 0xC0 and end - pos >= 3 and data[pos + 1] == end - pos - 2:
            fast = _fast_header(data, pos + 3, end, data[pos + 2])
            if fast is not None:
                return fast
    return _read_header(data, start, end)


_UNKNOWN = object()
_HeaderFacts = tuple[bool | None, int | None, int | None]


def _fast_uint(data: bytes, pos: int, end: int) -> tuple[Any, int]:
    code = data[pos]
    if code == _NULL:
        return None, pos + 1
    if code == 0x43:
        return 0, pos + 1
    if code == 0x52 and pos + 1 < end:
        return data[pos + 1], pos + 2
    if code == 0x70 and pos + 4 < end:
        return _U32.unpack_from(data, pos + 1)[0], pos + 5
    return _UNKNOWN, pos


def _fast_header(data: bytes, pos: int, end: int, count: int) -> _HeaderFacts | None:
    """The header's facts when every field has one of the usual encodings (None
    otherwise: the codec reads it and says what is wrong)."""
    durable = priority = ttl = None
    if count > 5:
        return None
    if count >= 1:
        durable = _BOOLEANS.get(data[pos], _UNKNOWN)
        if durable is _UNKNOWN:
            return None
        pos += 1
    if count >= 2 and pos < end:
        code = data[pos]
        if code == 0x50 and pos + 1 < end:
            priority, pos = data[pos + 1], pos + 2
        elif code == _NULL:
            pos += 1
        else:
            return None
    if count >= 3 and pos < end:
        ttl, pos = _fast_uint(data, pos, end)
        if ttl is _UNKNOWN:
            return None
    if count >= 4 and pos < end:
        if data[pos] not in _BOOLEANS:
            return None
        pos += 1
    if count >= 5 and pos < end:
        delivery_count, pos = _fast_uint(data, pos, end)
        if delivery_count is _UNKNOWN:
            return None
    if pos != end:
        return None
    return durable, priority, ttl  # type: ignore[return-value]


def _read_header(data: bytes, start: int, end: int) -> tuple[bool | None, int | None, int | None]:
    fields = section_value(data, start, end)
    if not fields:
        return None, None, None
    durable = fields[0]
    priority = fields[1] if len(fields) > 1 else None
    ttl = fields[2] if len(fields) > 2 else None
    if durable is not None and not isinstance(durable, bool):
        raise DecodeError("header: durable is not a boolean")
    if priority is not None and not _uint_below(priority, 256):
        raise DecodeError("header: priority is not a ubyte")
    if ttl is not None and not _uint_below(ttl, 2**32):
        raise DecodeError("header: ttl is not a uint")
    for flag in fields[3:4]:
        if flag is not None and not isinstance(flag, bool):
            raise DecodeError("header: first-acquirer is not a boolean")
    for count in fields[4:5]:
        if count is not None and not _uint_below(count, 2**32):
            raise DecodeError("header: delivery-count is not a uint")
    return durable, None if priority is None else int(priority), None if ttl is None else int(ttl)


def _uint_below(value: Any, limit: int) -> bool:
    return type(value) is not bool and isinstance(value, int) and 0 <= value < limit


def _uint(value: int) -> bytes:
    if value == 0:
        return b"\x43"
    if value < 256:
        return bytes((0x52, value))
    return b"\x70" + _U32.pack(value)


@functools.lru_cache(maxsize=4096)
def header_bytes(
    durable: bool, priority: int | None, ttl: int | None, first_acquirer: bool, delivery_count: int
) -> bytes:
    """The header section (§3.2.1) a receiver gets: ``durable``, ``priority`` (None:
    left null, the default 4), ``ttl`` in ms (None: none), ``first-acquirer`` and
    ``delivery-count`` always written, as RabbitMQ 4 writes them. ValueError for a
    priority or count out of range."""
    if priority is not None and not 0 <= priority < 256:
        raise ValueError(f"priority {priority} is not a ubyte")
    if ttl is not None and not 0 <= ttl < 2**32:
        ttl = 2**32 - 1 if ttl > 0 else 0
    if not 0 <= delivery_count < 2**32:
        raise ValueError(f"delivery-count {delivery_count} is not a uint")
    fields = b"".join(
        (
            b"\x41" if durable else b"\x42",
            b"\x40" if priority is None else bytes((0x50, priority)),
            b"\x40" if ttl is None else _uint(ttl),
            b"\x41" if first_acquirer else b"\x42",
            _uint(delivery_count),
        )
    )
    return bytes((0x00, 0x53, HEADER, 0xC0, len(fields) + 1, 5)) + fields


def list_field(data: bytes, start: int, end: int, index: int) -> Any:
    """Field ``index`` of the list section at ``data[start:end]`` (properties),
    decoded alone: the fields before it are stepped over. None when the list is
    shorter. Raises DecodeError."""
    pos = start + 3 if data[start + 1] == 0x53 else decode(data, start + 1, end)[1]
    code = data[pos]
    if code == 0x45 or code == _NULL:
        return None
    if code == 0xC0:
        count, pos = data[pos + 2], pos + 3
    elif code == 0xD0:
        if pos + 9 > end:
            raise DecodeError("a list runs past the end of its section")
        count, pos = _U32.unpack_from(data, pos + 5)[0], pos + 9
    else:
        raise DecodeError(f"a list section holding constructor {code:#04x}")
    if index >= count:
        return None
    for _ in range(index):
        pos = skip(data, pos, end)
    return decode(data, pos, end)[0]


def data_constructor(size: int) -> bytes:
    """The start of a data section (§3.2.6) holding ``size`` bytes: descriptor and
    binary constructor with its size, the bytes to follow."""
    if size < 256:
        return bytes((0x00, 0x53, DATA, 0xA0, size))
    return bytes((0x00, 0x53, DATA, 0xB0)) + _U32.pack(size)


__all__ = [
    "DECODE_ERROR",
    "Scan",
    "data_constructor",
    "header_bytes",
    "list_field",
    "read_header",
    "scan",
    "section_value",
    "skip",
]


# last: the compiled twin reads this module's names (Scan, _WIDTH, check_properties,
# check_application_properties) when it loads, so they must all exist by then; imported
# mid-module, ``import leveret.protocol.amqp10.sections`` (or ``.message``) as the first
# import failed with a circular-import AttributeError
_compiled = twin("leveret.protocol.amqp10._ctransfer")
