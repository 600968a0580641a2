"""MQTT control packets (OASIS MQTT 3.1.1 §2-3, MQTT 5.0 §2-3): objects, encoding and an
incremental reader, sans-I/O.

Protocol level 4 is MQTT 3.1.1 and 5 is MQTT 5.0; a packet's form depends on it (3.1.1
has no properties and no reason codes on PUBACK, PUBREC, PUBREL, PUBCOMP, UNSUBACK and
DISCONNECT, and no AUTH packet). :func:`encode` writes a packet for one version (fields
3.1.1 has no room for are left out); :class:`PacketReader` is fed bytes and returns whole
packets, learning the version from the CONNECT packet it reads unless it was given one.

Properties (MQTT 5.0 §2.2.2) are kept as a tuple of ``(identifier, value)`` pairs in wire
order, so repeated user properties (a ``(name, value)`` pair of strings) keep their order.
Lengths and sizes are in bytes; intervals are as the spec gives them (seconds).

Any input that breaks the spec raises :class:`MalformedPacket` with the MQTT 5.0 reason
code the server would send (0x81 malformed packet, 0x82 protocol error, 0x95 packet too
large) and the spec section in its message. Sections (§) are MQTT 5.0's unless marked
3.1.1; the checks made are those that need no state beyond the protocol level (a topic
alias's range, receive maximum and session rules belong to the adapter).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeAlias

from leveret.compiled import twin
from leveret.protocol import prelogin

MQTT_3_1_1 = 4
MQTT_5 = 5
VERSIONS = (MQTT_3_1_1, MQTT_5)

#: MQTT 5.0 reason codes used by the codec's errors (§2.4).
MALFORMED = 0x81
PROTOCOL_ERROR = 0x82
UNSUPPORTED_PROTOCOL_VERSION = 0x84
PACKET_TOO_LARGE = 0x95

#: The largest remaining length a variable byte integer can carry (§1.5.5): 268,435,455.
MAX_VARINT = 268_435_455


class MalformedPacket(ValueError):
    """Input that breaks MQTT 3.1.1 / 5.0; ``reason_code`` is the MQTT 5.0 reason code
    (§2.4) to answer with: :data:`MALFORMED`, :data:`PROTOCOL_ERROR`,
    :data:`PACKET_TOO_LARGE` or :data:`UNSUPPORTED_PROTOCOL_VERSION`."""

    def __init__(self, message: str, reason_code: int = MALFORMED) -> None:
        super().__init__(message)
        self.reason_code = reason_code


#: Control packet types (§2.1.2); :data:`WILL` stands for a CONNECT's will properties.
CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 1, 2, 3, 4, 5, 6, 7
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT, AUTH = range(8, 16)
WILL = 0

# -- properties (MQTT 5.0 §2.2.2.2) ------------------------------------------------------

PropertyValue: TypeAlias = int | str | bytes | tuple[str, str]
Properties: TypeAlias = tuple[tuple[int, PropertyValue], ...]

BYTE, TWO_BYTE, FOUR_BYTE, VARINT, UTF8, PAIR, BINARY = range(7)

PAYLOAD_FORMAT_INDICATOR = 0x01
MESSAGE_EXPIRY_INTERVAL = 0x02
CONTENT_TYPE = 0x03
RESPONSE_TOPIC = 0x08
CORRELATION_DATA = 0x09
SUBSCRIPTION_IDENTIFIER = 0x0B
SESSION_EXPIRY_INTERVAL = 0x11
ASSIGNED_CLIENT_IDENTIFIER = 0x12
SERVER_KEEP_ALIVE = 0x13
AUTHENTICATION_METHOD = 0x15
AUTHENTICATION_DATA = 0x16
REQUEST_PROBLEM_INFORMATION = 0x17
WILL_DELAY_INTERVAL = 0x18
REQUEST_RESPONSE_INFORMATION = 0x19
RESPONSE_INFORMATION = 0x1A
SERVER_REFERENCE = 0x1C
REASON_STRING = 0x1F
RECEIVE_MAXIMUM = 0x21
TOPIC_ALIAS_MAXIMUM = 0x22
TOPIC_ALIAS = 0x23
MAXIMUM_QOS = 0x24
RETAIN_AVAILABLE = 0x25
USER_PROPERTY = 0x26
MAXIMUM_PACKET_SIZE = 0x27
WILDCARD_SUBSCRIPTION_AVAILABLE = 0x28
SUBSCRIPTION_IDENTIFIER_AVAILABLE = 0x29
SHARED_SUBSCRIPTION_AVAILABLE = 0x2A

#: Each property identifier's data type (§2.2.2.2, table 2-4).
PROPERTY_TYPES: dict[int, int] = {
    PAYLOAD_FORMAT_INDICATOR: BYTE,
    MESSAGE_EXPIRY_INTERVAL: FOUR_BYTE,
    CONTENT_TYPE: UTF8,
    RESPONSE_TOPIC: UTF8,
    CORRELATION_DATA: BINARY,
    SUBSCRIPTION_IDENTIFIER: VARINT,
    SESSION_EXPIRY_INTERVAL: FOUR_BYTE,
    ASSIGNED_CLIENT_IDENTIFIER: UTF8,
    SERVER_KEEP_ALIVE: TWO_BYTE,
    AUTHENTICATION_METHOD: UTF8,
    AUTHENTICATION_DATA: BINARY,
    REQUEST_PROBLEM_INFORMATION: BYTE,
    WILL_DELAY_INTERVAL: FOUR_BYTE,
    REQUEST_RESPONSE_INFORMATION: BYTE,
    RESPONSE_INFORMATION: UTF8,
    SERVER_REFERENCE: UTF8,
    REASON_STRING: UTF8,
    RECEIVE_MAXIMUM: TWO_BYTE,
    TOPIC_ALIAS_MAXIMUM: TWO_BYTE,
    TOPIC_ALIAS: TWO_BYTE,
    MAXIMUM_QOS: BYTE,
    RETAIN_AVAILABLE: BYTE,
    USER_PROPERTY: PAIR,
    MAXIMUM_PACKET_SIZE: FOUR_BYTE,
    WILDCARD_SUBSCRIPTION_AVAILABLE: BYTE,
    SUBSCRIPTION_IDENTIFIER_AVAILABLE: BYTE,
    SHARED_SUBSCRIPTION_AVAILABLE: BYTE,
}

_ACKS_AND_MORE = {PUBACK, PUBREC, PUBREL, PUBCOMP, SUBACK, UNSUBACK, DISCONNECT, AUTH}
_MESSAGE = {PUBLISH, WILL}
#: The packets each property may appear in (§2.2.2.2, table 2-4).
PROPERTY_PACKETS: dict[int, frozenset[int]] = {
    identifier: frozenset(kinds)
    for identifier, kinds in {
        PAYLOAD_FORMAT_INDICATOR: _MESSAGE,
        MESSAGE_EXPIRY_INTERVAL: _MESSAGE,
        CONTENT_TYPE: _MESSAGE,
        RESPONSE_TOPIC: _MESSAGE,
        CORRELATION_DATA: _MESSAGE,
        SUBSCRIPTION_IDENTIFIER: {PUBLISH, SUBSCRIBE},
        SESSION_EXPIRY_INTERVAL: {CONNECT, CONNACK, DISCONNECT},
        ASSIGNED_CLIENT_IDENTIFIER: {CONNACK},
        SERVER_KEEP_ALIVE: {CONNACK},
        AUTHENTICATION_METHOD: {CONNECT, CONNACK, AUTH},
        AUTHENTICATION_DATA: {CONNECT, CONNACK, AUTH},
        REQUEST_PROBLEM_INFORMATION: {CONNECT},
        WILL_DELAY_INTERVAL: {WILL},
        REQUEST_RESPONSE_INFORMATION: {CONNECT},
        RESPONSE_INFORMATION: {CONNACK},
        SERVER_REFERENCE: {CONNACK, DISCONNECT},
        REASON_STRING: {CONNACK} | _ACKS_AND_MORE,
        RECEIVE_MAXIMUM: {CONNECT, CONNACK},
        TOPIC_ALIAS_MAXIMUM: {CONNECT, CONNACK},
        TOPIC_ALIAS: {PUBLISH},
        MAXIMUM_QOS: {CONNACK},
        RETAIN_AVAILABLE: {CONNACK},
        USER_PROPERTY: {CONNECT, CONNACK, PUBLISH, WILL, SUBSCRIBE, UNSUBSCRIBE} | _ACKS_AND_MORE,
        MAXIMUM_PACKET_SIZE: {CONNECT, CONNACK},
        WILDCARD_SUBSCRIPTION_AVAILABLE: {CONNACK},
        SUBSCRIPTION_IDENTIFIER_AVAILABLE: {CONNACK},
        SHARED_SUBSCRIPTION_AVAILABLE: {CONNACK},
    }.items()
}
#: Properties whose value 0 is a protocol error (§3.1.2.11.3-4, §3.2.2.3.3, §3.3.2.3.4,
#: §3.3.2.3.8); those that are a 0/1 flag (§3.1.2.11.6-7, §3.2.2.3.4-5, §3.3.2.3.2).
_NOT_ZERO = frozenset({RECEIVE_MAXIMUM, MAXIMUM_PACKET_SIZE, TOPIC_ALIAS, SUBSCRIPTION_IDENTIFIER})
_FLAG = frozenset(
    {
        PAYLOAD_FORMAT_INDICATOR,
        REQUEST_PROBLEM_INFORMATION,
        REQUEST_RESPONSE_INFORMATION,
        MAXIMUM_QOS,
        RETAIN_AVAILABLE,
        WILDCARD_SUBSCRIPTION_AVAILABLE,
        SUBSCRIPTION_IDENTIFIER_AVAILABLE,
        SHARED_SUBSCRIPTION_AVAILABLE,
    }
)


def get_property(properties: Properties, identifier: int) -> PropertyValue | None:
    """The first value of property ``identifier`` in ``properties``, or None."""
    for key, value in properties:
        if key == identifier:
            return value
    return None


# -- packets (§3) ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Will:
    """The will message of a CONNECT (§3.1.2.5, §3.1.3.2-3): ``qos`` 0-2."""

    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: Properties = ()


@dataclass(frozen=True, slots=True)
class Connect:
    """CONNECT (§3.1). ``keep_alive`` in seconds (0: none); ``clean_start`` is 3.1.1's
    clean session. Its protocol level is the version it is encoded for."""

    client_id: str = ""
    clean_start: bool = True
    keep_alive: int = 0
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    properties: Properties = ()


@dataclass(frozen=True, slots=True)
class ConnAck:
    """CONNACK (§3.2). ``reason_code`` is the 3.1.1 connect return code (0-5) or the
    5.0 reason code."""

    session_present: bool = False
    reason_code: int = 0
    properties: Properties = ()


@dataclass(frozen=True, slots=True)
class Publish:
    """PUBLISH (§3.3). ``packet_id`` is set exactly when ``qos`` is 1 or 2."""

    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None
    properties: Properties = ()


@dataclass(frozen=True, slots=True)
class PubAck:
    """PUBACK (§3.4); reason code and properties in 5.0 only."""

    packet_id: int
    reason_code: int = 0
    properties: Properties = ()


@dataclass(frozen=True, slots=True)
class PubRec:
    """PUBREC (§3.5); reason code and properties in 5.0 only."""

    packet_id: int
    reason_code: int = 0
    properties: Properties = ()


@dataclass(frozen=True, slots=True)
class PubRel:
    """PUBREL (§3.6); reason code and properties in 5.0 only."""

    packet_id: int
    reason_code: int = 0
    properties: Properties = ()


@dataclass(frozen=True, slots=True)
class PubComp:
    """PUBCOMP (§3.7); reason code and properties in 5.0 only."""

    packet_id: int
    reason_code: int = 0
    properties: Properties = ()


@dataclass(frozen=True, slots=True)
class Subscription:
    """One topic filter of a SUBSCRIBE with its subscription options (§3.8.3.1): the
    maximum QoS; in 5.0 also no local, retain as published and retain handling (0-2)."""

    topic_filter: str
    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0


@dataclass(frozen=True, slots=True)
class Subscribe:
    """SUBSCRIBE (§3.8): at least one subscription."""

    packet_id: int
    subscriptions: tuple[Subscription, ...]
    properties: Properties = ()


@dataclass(frozen=True, slots=True)
class SubAck:
    """SUBACK (§3.9): one reason code (3.1.1: return code) per subscription."""

    packet_id: int
    reason_codes: tuple[int, ...]
    properties: Properties = ()


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    """UNSUBSCRIBE (§3.10): at least one topic filter."""

    packet_id: int
    topic_filters: tuple[str, ...]
    properties: Properties = ()


@dataclass(frozen=True, slots=True)
class UnsubAck:
    """UNSUBACK (§3.11): one reason code per topic filter in 5.0, none in 3.1.1."""

    packet_id: int
    reason_codes: tuple[int, ...] = ()
    properties: Properties = ()


@dataclass(frozen=True, slots=True)
class PingReq:
    """PINGREQ (§3.12)."""


@dataclass(frozen=True, slots=True)
class PingResp:
    """PINGRESP (§3.13)."""


@dataclass(frozen=True, slots=True)
class Disconnect:
    """DISCONNECT (§3.14); reason code and properties in 5.0 only."""

    reason_code: int = 0
    properties: Properties = ()


@dataclass(frozen=True, slots=True)
class Auth:
    """AUTH (MQTT 5.0 §3.15; no such packet in 3.1.1)."""

    reason_code: int = 0
    properties: Properties = ()


Packet: TypeAlias = (
    Connect
    | ConnAck
    | Publish
    | PubAck
    | PubRec
    | PubRel
    | PubComp
    | Subscribe
    | SubAck
    | Unsubscribe
    | UnsubAck
    | PingReq
    | PingResp
    | Disconnect
    | Auth
)
_ACKS: dict[int, type[PubAck | PubRec | PubRel | PubComp]] = {
    PUBACK: PubAck,
    PUBREC: PubRec,
    PUBREL: PubRel,
    PUBCOMP: PubComp,
}
_TYPES: dict[type, int] = {
    Connect: CONNECT,
    ConnAck: CONNACK,
    Publish: PUBLISH,
    PubAck: PUBACK,
    PubRec: PUBREC,
    PubRel: PUBREL,
    PubComp: PUBCOMP,
    Subscribe: SUBSCRIBE,
    SubAck: SUBACK,
    Unsubscribe: UNSUBSCRIBE,
    UnsubAck: UNSUBACK,
    PingReq: PINGREQ,
    PingResp: PINGRESP,
    Disconnect: DISCONNECT,
    Auth: AUTH,
}
#: Fixed header flags required by type (§2.1.3); PUBLISH's are dup, QoS and retain.
_FLAGS = {PUBREL: 0b0010, SUBSCRIBE: 0b0010, UNSUBSCRIBE: 0b0010}


# -- encoding ----------------------------------------------------------------------------


def _varint(value: int) -> bytes:
    if not 0 <= value <= MAX_VARINT:
        raise ValueError(f"{value} does not fit a variable byte integer (§1.5.5)")
    out = bytearray()
    while True:
        value, digit = divmod(value, 128)
        out.append(digit | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _string(text: str) -> bytes:
    if "\x00" in text:
        raise ValueError("a UTF-8 string may not hold U+0000 (§1.5.4)")
    data = text.encode("utf-8")  # refuses surrogates
    return _binary(data)


def _binary(data: bytes) -> bytes:
    if len(data) > 0xFFFF:
        raise ValueError("a string or binary data holds at most 65,535 bytes (§1.5.4, §1.5.6)")
    return struct.pack("!H", len(data)) + data


def _properties(properties: Properties) -> bytes:
    out = bytearray()
    for identifier, value in properties:
        kind = PROPERTY_TYPES[identifier]
        out += _varint(identifier)
        if kind == PAIR:
            assert isinstance(value, tuple)
            out += _string(value[0]) + _string(value[1])
        elif kind == UTF8:
            assert isinstance(value, str)
            out += _string(value)
        elif kind == BINARY:
            assert isinstance(value, bytes)
            out += _binary(value)
        else:
            assert isinstance(value, int)
            if kind == VARINT:
                out += _varint(value)
            else:
                out += struct.pack({BYTE: "!B", TWO_BYTE: "!H", FOUR_BYTE: "!I"}[kind], value)
    return _varint(len(out)) + bytes(out)


def encode_properties(properties: Properties) -> bytes:
    """A property block as the wire carries it: its length (a variable byte integer),
    then each property (§2.2.2). Raises ValueError for a value the wire cannot carry."""
    return _properties(properties)


def decode_properties(data: bytes, kind: int = PUBLISH) -> Properties:
    """The properties of a block :func:`encode_properties` made, checked as those of a
    packet of type ``kind`` (table 2-4). Raises MalformedPacket."""
    cursor = _Cursor(data)
    properties = cursor.properties(kind)
    cursor.end("the property block")
    return properties


def topic_field(topic: str) -> bytes:
    """A topic name as a PUBLISH carries it (a two-byte length, UTF-8); ValueError for
    one the wire cannot carry. Worth keeping for a topic sent again and again."""
    return _string(topic)


def publish_head(
    topic: bytes,
    qos: int,
    retain: bool,
    dup: bool,
    packet_id: int | None,
    properties: bytes | None,
    size: int,
) -> bytes:
    """A PUBLISH up to its payload of ``size`` bytes, made without a :class:`Publish`:
    ``topic`` from :func:`topic_field`, ``properties`` an encoded property block (MQTT
    5; None for 3.1.1). The same bytes :func:`encode` makes (the hot path of delivery)."""
    variable = topic + struct.pack("!H", packet_id) if qos else topic
    if properties is not None:
        variable += properties
    first = 0x30 | dup << 3 | qos << 1 | retain
    remaining = len(variable) + size
    if remaining < 128:
        return bytes((first, remaining)) + variable
    return bytes((first,)) + _varint(remaining) + variable


_PUBACK = struct.Struct("!BBH")


def puback(packet_id: int) -> bytes:
    """PUBACK success for ``packet_id``, as :func:`encode` makes it in 3.1.1 and 5.0
    (5.0 leaves out a success code without properties, §3.4.2.1)."""
    return _PUBACK.pack(PUBACK << 4, 2, packet_id)


def pubrec(packet_id: int) -> bytes:
    """PUBREC success for ``packet_id`` (see :func:`puback`)."""
    return _PUBACK.pack(PUBREC << 4, 2, packet_id)


def encode(packet: Packet, version: int = MQTT_5) -> bytes:
    """``packet`` on the wire for protocol level ``version`` (4: 3.1.1, 5: 5.0): fixed
    header (§2.1), variable header and payload. In 3.1.1 properties, and reason codes
    of packets that have none there, are left out. Raises ValueError for a value the
    wire form cannot carry (a string with U+0000, a length past its field)."""
    if version not in VERSIONS:
        raise ValueError(f"protocol level {version} is neither 4 (3.1.1) nor 5 (5.0)")
    v5 = version == MQTT_5
    kind = _TYPES[type(packet)]
    flags = _FLAGS.get(kind, 0)
    body = bytearray()
    if isinstance(packet, Connect):
        will = packet.will
        connect_flags = (packet.clean_start << 1) | (packet.username is not None) << 7
        connect_flags |= (packet.password is not None) << 6
        if will is not None:
            connect_flags |= 0x04 | will.qos << 3 | will.retain << 5
        body += _string("MQTT") + bytes([version, connect_flags]) + struct.pack("!H", packet.keep_alive)
        if v5:
            body += _properties(packet.properties)
        body += _string(packet.client_id)
        if will is not None:
            if v5:
                body += _properties(will.properties)
            body += _string(will.topic) + _binary(will.payload)
        if packet.username is not None:
            body += _string(packet.username)
        if packet.password is not None:
            body += _binary(packet.password)
    elif isinstance(packet, ConnAck):
        body += bytes([int(packet.session_present), packet.reason_code])
        if v5:
            body += _properties(packet.properties)
    elif isinstance(packet, Publish):
        flags = packet.dup << 3 | packet.qos << 1 | int(packet.retain)
        body += _string(packet.topic)
        if packet.qos:
            if packet.packet_id is None:
                raise ValueError("a QoS 1 or 2 PUBLISH needs a packet identifier (§2.2.1)")
            body += struct.pack("!H", packet.packet_id)
        if v5:
            body += _properties(packet.properties)
        body += packet.payload
    elif isinstance(packet, Subscribe | Unsubscribe | SubAck | UnsubAck):
        body += struct.pack("!H", packet.packet_id)
        if v5:
            body += _properties(packet.properties)
        if isinstance(packet, Subscribe):
            for sub in packet.subscriptions:
                options = sub.qos
                if v5:
                    options |= sub.no_local << 2 | sub.retain_as_published << 3 | sub.retain_handling << 4
                body += _string(sub.topic_filter) + bytes([options])
        elif isinstance(packet, Unsubscribe):
            for topic_filter in packet.topic_filters:
                body += _string(topic_filter)
        elif v5 or isinstance(packet, SubAck):
            body += bytes(packet.reason_codes)
    elif isinstance(packet, PingReq | PingResp):
        pass
    else:  # PUBACK, PUBREC, PUBREL, PUBCOMP, DISCONNECT, AUTH: short forms (§3.4.2.1, §3.14.2.1)
        if isinstance(packet, Auth) and not v5:
            raise ValueError("there is no AUTH packet in MQTT 3.1.1")
        if not isinstance(packet, Disconnect | Auth):
            body += struct.pack("!H", packet.packet_id)
        if v5 and (packet.reason_code or packet.properties):
            body.append(packet.reason_code)
            if packet.properties:
                body += _properties(packet.properties)
    return bytes([kind << 4 | flags]) + _varint(len(body)) + bytes(body)


# -- decoding ----------------------------------------------------------------------------


class _Cursor:
    """Reads fields (§1.5) from one packet's body, refusing any that runs past it."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def left(self) -> int:
        return len(self.data) - self.pos

    def take(self, n: int, what: str) -> bytes:
        if n > self.left():
            raise MalformedPacket(f"{what} runs past the remaining length (§2.1.4)")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def byte(self, what: str = "a byte") -> int:
        return self.take(1, what)[0]

    def u16(self, what: str = "a two byte integer") -> int:
        return int.from_bytes(self.take(2, what), "big")

    def u32(self, what: str = "a four byte integer") -> int:
        return int.from_bytes(self.take(4, what), "big")

    def varint(self, what: str = "a variable byte integer") -> int:
        value, used = _read_varint(self.data, self.pos)
        if used < 0:
            raise MalformedPacket(f"{what} runs past the remaining length (§1.5.5)")
        self.pos += used
        return value

    def binary(self, what: str = "binary data") -> bytes:
        return self.take(self.u16(what), what)

    def string(self, what: str = "a UTF-8 string") -> str:
        return _utf8(self.binary(what), what)

    def packet_id(self) -> int:
        value = self.u16("the packet identifier")
        if not value:
            raise MalformedPacket("packet identifier 0 (MQTT 5.0 §2.2.1, 3.1.1 §2.3.1)", PROTOCOL_ERROR)
        return value

    def properties(self, kind: int) -> Properties:
        """The properties of a packet of type ``kind`` (or :data:`WILL`), checked
        against table 2-4: each where it may be, once unless repeatable, in range."""
        repeatable = (USER_PROPERTY, SUBSCRIPTION_IDENTIFIER) if kind == PUBLISH else (USER_PROPERTY,)
        length = self.varint("the property length")
        end = self.pos + length
        if end > len(self.data):
            raise MalformedPacket("the properties run past the remaining length (§2.2.2.1)")
        out: list[tuple[int, PropertyValue]] = []
        seen: set[int] = set()
        while self.pos < end:
            identifier = self.varint("a property identifier")
            data_type = PROPERTY_TYPES.get(identifier)
            if data_type is None:
                raise MalformedPacket(f"unknown property identifier {identifier:#x} (§2.2.2.2)")
            if kind not in PROPERTY_PACKETS[identifier]:
                raise MalformedPacket(
                    f"property {identifier:#x} not allowed in packet type {kind} (§2.2.2.2)"
                )
            if identifier in seen and identifier not in repeatable:
                raise MalformedPacket(
                    f"property {identifier:#x} given more than once (§2.2.2.2)", PROTOCOL_ERROR
                )
            seen.add(identifier)
            value: PropertyValue
            if data_type == BYTE:
                value = self.byte()
            elif data_type == TWO_BYTE:
                value = self.u16()
            elif data_type == FOUR_BYTE:
                value = self.u32()
            elif data_type == VARINT:
                value = self.varint()
            elif data_type == UTF8:
                value = self.string()
            elif data_type == BINARY:
                value = self.binary()
            else:
                value = (self.string("a user property name"), self.string("a user property value"))
            if value == 0 and identifier in _NOT_ZERO:
                raise MalformedPacket(f"property {identifier:#x} is 0 (§2.2.2.2)", PROTOCOL_ERROR)
            if identifier in _FLAG and not 0 <= value <= 1:  # type: ignore[operator]
                raise MalformedPacket(
                    f"property {identifier:#x} is neither 0 nor 1 (§2.2.2.2)", PROTOCOL_ERROR
                )
            out.append((identifier, value))
        if self.pos != end:
            raise MalformedPacket("a property runs past the property length (§2.2.2.1)")
        if AUTHENTICATION_DATA in seen and AUTHENTICATION_METHOD not in seen:
            raise MalformedPacket("authentication data without a method (§3.1.2.11.10)", PROTOCOL_ERROR)
        return tuple(out)

    def end(self, what: str) -> None:
        if self.pos != len(self.data):
            raise MalformedPacket(f"{what} has bytes past its end (§2.1.4)")


def _utf8(data: bytes, what: str) -> str:
    try:
        text = data.decode("utf-8")  # strict: refuses surrogates and overlong forms
    except UnicodeDecodeError:
        raise MalformedPacket(f"{what} is not well-formed UTF-8 (§1.5.4)") from None
    if "\x00" in text:
        raise MalformedPacket(f"{what} holds U+0000 (§1.5.4)")
    return text


def _read_varint(data: bytes | bytearray, pos: int) -> tuple[int, int]:
    """The variable byte integer at ``pos`` and how many bytes it used, or ``(0, -1)``
    when ``data`` ends first. Raises MalformedPacket past 4 bytes or for a value not
    in the fewest bytes (MQTT 5.0 §1.5.5, 3.1.1 §2.2.3)."""
    value = 0
    for i in range(4):
        if pos + i >= len(data):
            return 0, -1
        digit = data[pos + i]
        value |= (digit & 0x7F) << (7 * i)
        if not digit & 0x80:
            if i and not digit:
                raise MalformedPacket("a variable byte integer not in the fewest bytes (§1.5.5)")
            return value, i + 1
    raise MalformedPacket("a variable byte integer longer than 4 bytes (§1.5.5)")


def _check_qos(qos: int, what: str) -> int:
    if qos == 3:
        raise MalformedPacket(f"{what} QoS 3 (§3.3.1.2, §3.1.2.6, §3.8.3.1)")
    return qos


def _topic_name(text: str, v5: bool) -> str:
    if "+" in text or "#" in text:
        raise MalformedPacket("a wildcard in a topic name (§3.3.2.1)", PROTOCOL_ERROR)
    if not text and not v5:
        raise MalformedPacket("an empty topic name (3.1.1 §4.7.3)", PROTOCOL_ERROR)
    return text


def _topic_filter(text: str) -> str:
    if not text:
        raise MalformedPacket("an empty topic filter (§4.7.3)", PROTOCOL_ERROR)
    return text


def _decode_connect(body: _Cursor) -> tuple[Connect, int]:
    name = body.string("the protocol name")
    level = body.byte("the protocol level")
    if name != "MQTT" or level not in VERSIONS:
        raise MalformedPacket(
            f"protocol {name!r} level {level}: only MQTT levels 4 and 5 (§3.1.2.1-2)",
            UNSUPPORTED_PROTOCOL_VERSION,
        )
    v5 = level == MQTT_5
    flags = body.byte("the connect flags")
    if flags & 0x01:
        raise MalformedPacket("the connect flags' reserved bit is set (§3.1.2.3)")
    will_flag, will_qos, will_retain = flags & 0x04, _check_qos(flags >> 3 & 3, "a will"), flags & 0x20
    if not will_flag and (will_qos or will_retain):
        raise MalformedPacket("will QoS or retain without a will (§3.1.2.6-7)")
    if not v5 and flags & 0x40 and not flags & 0x80:
        raise MalformedPacket("a password without a user name (3.1.1 §3.1.2.9)")
    keep_alive = body.u16("the keep alive")
    properties = body.properties(CONNECT) if v5 else ()
    client_id = body.string("the client identifier")
    will = None
    if will_flag:
        will_properties = body.properties(WILL) if v5 else ()
        topic = _topic_name(body.string("the will topic"), False)
        will = Will(topic, body.binary("the will payload"), will_qos, bool(will_retain), will_properties)
    username = body.string("the user name") if flags & 0x80 else None
    password = body.binary("the password") if flags & 0x40 else None
    body.end("CONNECT")
    connect = Connect(client_id, bool(flags & 0x02), keep_alive, username, password, will, properties)
    return connect, level


def _decode_publish(flags: int, body: _Cursor, v5: bool) -> Publish:
    """A PUBLISH (§3.3), read with fewer calls than the other packets: it is most of
    what a busy broker reads."""
    qos = flags >> 1 & 3
    if qos == 3 or (flags & 0x08 and not qos):
        _check_qos(qos, "a PUBLISH with")
        raise MalformedPacket("DUP set on a QoS 0 PUBLISH (§3.3.1.1)")
    data = body.data
    size = len(data)
    end = 2 + (data[0] << 8 | data[1]) if size >= 2 else size + 1
    if end > size:
        topic = body.string("the topic name")  # raises, with the cursor's text
    else:
        topic = _utf8(data[2:end], "the topic name")
    _topic_name(topic, v5)
    pos = end
    packet_id = None
    if qos:
        if pos + 2 > size or not (data[pos] or data[pos + 1]):
            body.pos = pos
            body.packet_id()  # raises
        packet_id = data[pos] << 8 | data[pos + 1]
        pos += 2
    properties: Properties = ()
    if v5:
        if pos < size and not data[pos]:  # no properties: the common case
            pos += 1
        else:
            body.pos = pos
            properties = body.properties(PUBLISH)
            pos = body.pos
    body.pos = size
    return Publish(topic, data[pos:], qos, bool(flags & 1), bool(flags & 8), packet_id, properties)


def _decode(kind: int, flags: int, data: bytes, version: int) -> Packet:
    v5 = version == MQTT_5
    body = _Cursor(data)
    packet: Packet
    properties: Properties
    if kind == CONNACK:
        ack_flags = body.byte("the connect acknowledge flags")
        if ack_flags & 0xFE:
            raise MalformedPacket("the connect acknowledge flags' reserved bits are set (§3.2.2.1)")
        code = body.byte("the connect reason code")
        packet = ConnAck(bool(ack_flags), code, body.properties(CONNACK) if v5 else ())
    elif kind == PUBLISH:
        packet = _decode_publish(flags, body, v5)
    elif kind in _ACKS:
        packet_id = body.packet_id()
        code, properties = 0, ()
        if v5 and body.left():
            code = body.byte()
            properties = body.properties(kind) if body.left() else ()
        packet = _ACKS[kind](packet_id, code, properties)
    elif kind == SUBSCRIBE:
        packet_id = body.packet_id()
        properties = body.properties(SUBSCRIBE) if v5 else ()
        subscriptions = []
        while body.left():
            topic_filter = _topic_filter(body.string("a topic filter"))
            options = body.byte("the subscription options")
            if options & (0xC0 if v5 else 0xFC) or options >> 4 & 3 == 3:
                raise MalformedPacket("reserved bits set in subscription options (§3.8.3.1)")
            subscriptions.append(
                Subscription(
                    topic_filter,
                    _check_qos(options & 3, "a subscription with"),
                    bool(options & 4),
                    bool(options & 8),
                    options >> 4 & 3,
                )
            )
        if not subscriptions:
            raise MalformedPacket("a SUBSCRIBE with no topic filter (§3.8.3)", PROTOCOL_ERROR)
        packet = Subscribe(packet_id, tuple(subscriptions), properties)
    elif kind in (SUBACK, UNSUBACK):
        packet_id = body.packet_id()
        properties = body.properties(kind) if v5 else ()
        codes = tuple(body.take(body.left(), "the reason codes"))
        if not codes and (v5 or kind == SUBACK):
            raise MalformedPacket("an acknowledgement with no reason code (§3.9.3, §3.11.3)", PROTOCOL_ERROR)
        if not v5 and kind == SUBACK and not set(codes) <= {0, 1, 2, 0x80}:
            raise MalformedPacket("a SUBACK return code other than 0, 1, 2 or 0x80 (3.1.1 §3.9.3)")
        if kind == SUBACK:
            packet = SubAck(packet_id, codes, properties)
        else:
            packet = UnsubAck(packet_id, codes if v5 else (), properties)
            if codes and not v5:
                raise MalformedPacket("an UNSUBACK longer than 2 bytes (3.1.1 §3.11.1)")
    elif kind == UNSUBSCRIBE:
        packet_id = body.packet_id()
        properties = body.properties(UNSUBSCRIBE) if v5 else ()
        filters = []
        while body.left():
            filters.append(_topic_filter(body.string("a topic filter")))
        if not filters:
            raise MalformedPacket("an UNSUBSCRIBE with no topic filter (§3.10.3)", PROTOCOL_ERROR)
        packet = Unsubscribe(packet_id, tuple(filters), properties)
    elif kind in (PINGREQ, PINGRESP):
        packet = PingReq() if kind == PINGREQ else PingResp()
    elif kind == DISCONNECT or (kind == AUTH and v5):
        code, properties = 0, ()
        if v5 and body.left():
            code = body.byte()
            properties = body.properties(kind) if body.left() else ()
        packet = Disconnect(code, properties) if kind == DISCONNECT else Auth(code, properties)
    elif kind == CONNECT:
        raise MalformedPacket("a second CONNECT (§3.1)", PROTOCOL_ERROR)
    else:
        raise MalformedPacket(f"packet type {kind} is reserved (§2.1.2)")
    body.end(type(packet).__name__.upper())
    return packet


class PacketReader:
    """Fed bytes as they arrive, returns whole packets (§2.1).

    ``version`` is the protocol level (4 or 5) if known; if None, the first packet must
    be a CONNECT, whose level sets it. A packet larger than ``max_packet_size`` bytes
    (fixed header included, as MQTT 5.0 §3.1.2.11.4 counts) is refused from its fixed
    header, before any of its body is held (reason code 0x95); until a CONNECT is read
    the limit is at most :data:`leveret.protocol.prelogin.MAX_BYTES` (64 KiB)."""

    def __init__(self, version: int | None = None, max_packet_size: int = MAX_VARINT + 5) -> None:
        if version is not None and version not in VERSIONS:
            raise ValueError(f"protocol level {version} is neither 4 nor 5")
        self.version = version
        self.max_packet_size = max_packet_size
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Packet]:
        """The packets completed by ``data`` (possibly none). Raises MalformedPacket; the
        reader is then unusable, as the connection must close."""
        return _feed(self, data)

    def _packet(self, kind: int, flags: int, body: bytes) -> Packet:
        if kind != PUBLISH and flags != _FLAGS.get(kind, 0):
            raise MalformedPacket(f"packet type {kind} with reserved flags {flags:#06b} (§2.1.3)")
        if self.version is None:
            if kind != CONNECT:
                raise MalformedPacket("the first packet must be CONNECT (§3.1)", PROTOCOL_ERROR)
            connect, self.version = _decode_connect(_Cursor(body))
            return connect
        return _decode(kind, flags, body, self.version)


def py_feed(reader: PacketReader, data: bytes) -> list[Packet]:
    """:meth:`PacketReader.feed` in pure Python (the compiled twin's reference)."""
    reader._buffer += data
    out: list[Packet] = []
    buffer = reader._buffer
    while buffer:
        remaining, used = _read_varint(buffer, 1)
        if used < 0:
            break
        size = 1 + used + remaining
        limit = reader.max_packet_size
        if reader.version is None:
            limit = min(limit, prelogin.MAX_BYTES)
        if size > limit:
            raise MalformedPacket(
                f"a packet of {size} bytes, more than the {limit} allowed (MQTT 5.0 §3.1.2.11.4)",
                PACKET_TOO_LARGE,
            )
        if len(buffer) < size:
            break
        first = buffer[0]
        body = bytes(buffer[1 + used : size])
        del buffer[:size]
        out.append(reader._packet(first >> 4, first & 0x0F, body))
    if not buffer and buffer.__alloc__() > 512:  # an idle connection holds no big buffer
        reader._buffer = bytearray()
    return out


_compiled = twin("leveret.protocol.mqtt._cpackets")
#: :meth:`PacketReader.feed`: the compiled twin when built (``_cpackets.pyx``), else
#: :func:`py_feed`.
_feed: Callable[[PacketReader, bytes], list[Packet]] = _compiled.feed if _compiled is not None else py_feed
