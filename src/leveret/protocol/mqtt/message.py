"""MQTT's form of core messages (RabbitMQ's ``mc_mqtt``), and MQTT 5 properties of any
message.

A PUBLISH becomes a :class:`~leveret.core.message.Message` whose encoded form is

- one byte: the publish QoS (bits 0-1) and the retain flag (bit 2);
- the publishing client's identifier (a two-byte length, UTF-8), for *no local*;
- the PUBLISH's MQTT 5 property block as it came (empty from MQTT 3.1.1), less the
  topic alias and subscription identifiers, which belong to one hop (and a will's delay).

An MQTT subscriber gets the block back as it was sent, so MQTT to MQTT passes through
untouched (but for a message expiry interval, which counts down). AMQP and STOMP
consumers see neutral properties decoded from it, mapped as RabbitMQ's MQTT plugin
maps them:

=====================================  ==============================================
MQTT 5                                 AMQP 0-9-1 property (STOMP header)
=====================================  ==============================================
QoS 1 or 2 / QoS 0                     ``delivery_mode`` 2 / 1 (``persistent:true``)
publish QoS                            header ``x-mqtt-publish-qos`` (RabbitMQ 3.x's)
Content Type                           ``content_type``
Correlation Data (UTF-8)               ``correlation_id`` (other bytes: header
                                       ``x-correlation-id``, binary)
Response Topic                         ``reply_to`` (the MQTT topic, unchanged)
Message Expiry Interval (seconds)      ``expiration`` (milliseconds) and the TTL
User Property                          a header each (string values)
Payload Format Indicator               header ``x-mqtt-payload-format-indicator``
=====================================  ==============================================

and back, for a message published over AMQP or STOMP and delivered to an MQTT 5
subscriber (:func:`publish_properties`): its publish QoS is 1 when persistent, else 0
(RabbitMQ's), string and number headers become user properties.
"""

from __future__ import annotations

import struct
from typing import Any

from ...core.message import HeaderFormat, Message, Properties, register_format
from . import packets as p

_SKIP = frozenset((p.TOPIC_ALIAS, p.SUBSCRIPTION_IDENTIFIER, p.WILL_DELAY_INTERVAL))
#: Headers the mapping owns (not turned into user properties on the way back).
_OWN_HEADERS = frozenset(
    ("x-mqtt-publish-qos", "x-mqtt-payload-format-indicator", "x-correlation-id", "x-mqtt-dup")
)


def publish_prefix(qos: int, retain: bool, client_id: str) -> bytes:
    """The encoded form's start, before the property block (see the module doc): the
    same for every PUBLISH of a client with the same QoS and retain flag."""
    ident = client_id.encode()
    return bytes((qos | retain << 2,)) + struct.pack("!H", len(ident)) + ident


def property_block(properties: p.Properties) -> bytes:
    """The encoded form's property block: a PUBLISH's properties less those of one hop."""
    if not properties:
        return b""
    kept = tuple(prop for prop in properties if prop[0] not in _SKIP)
    return p.encode_properties(kept) if kept else b""


def encode_publish(qos: int, retain: bool, client_id: str, properties: p.Properties) -> bytes:
    """The encoded form of a PUBLISH's message (see the module doc)."""
    return publish_prefix(qos, retain, client_id) + property_block(properties)


def publish_qos(message: Message) -> int:
    """The QoS a message was published with: an MQTT PUBLISH's own, else 1 for a
    persistent message and 0 for a transient one (RabbitMQ's)."""
    if message.format is MQTT:
        return message.encoded[0] & 3
    return 1 if message.persistent else 0


def was_retained(message: Message) -> bool:
    """Whether an MQTT PUBLISH had its retain flag set (for *retain as published*)."""
    return message.format is MQTT and bool(message.encoded[0] & 4)


def publisher_id(message: Message) -> str | None:
    """The client identifier of the MQTT client that published ``message`` (None for
    another protocol's): *no local* compares it."""
    if message.format is not MQTT:
        return None
    encoded = message.encoded
    size = struct.unpack_from("!H", encoded, 1)[0]
    return encoded[3 : 3 + size].decode()


def _block(message: Message) -> bytes:
    encoded = message.encoded
    return encoded[3 + struct.unpack_from("!H", encoded, 1)[0] :]


def stored_properties(message: Message) -> p.Properties:
    """The MQTT 5 properties an MQTT PUBLISH carried (without alias and identifiers)."""
    block = _block(message)
    return p.decode_properties(block) if block else ()


def publish_properties(message: Message, expiry: int | None) -> p.Properties:
    """The properties of ``message`` as an MQTT 5 PUBLISH carries them to a subscriber
    (see the module doc); ``expiry`` is the seconds left of its life (None: no expiry),
    sent as its Message Expiry Interval (MQTT 5.0 §3.3.2.3.3)."""
    if message.format is MQTT:
        properties = stored_properties(message)
        if expiry is None:
            return properties
        kept = tuple(prop for prop in properties if prop[0] != p.MESSAGE_EXPIRY_INTERVAL)
        return ((p.MESSAGE_EXPIRY_INTERVAL, expiry), *kept)
    props = message.properties
    out: list[tuple[int, Any]] = []
    if expiry is not None:
        out.append((p.MESSAGE_EXPIRY_INTERVAL, expiry))
    if props.content_type:
        out.append((p.CONTENT_TYPE, props.content_type))
    if props.reply_to:
        out.append((p.RESPONSE_TOPIC, props.reply_to))
    if props.correlation_id:
        out.append((p.CORRELATION_DATA, props.correlation_id.encode()))
    for name, value in (props.headers or {}).items():
        if name in _OWN_HEADERS or not isinstance(name, str):
            continue
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        if isinstance(value, (str, int, float, bool)):
            out.append((p.USER_PROPERTY, (name, str(value).replace("\x00", ""))))
    return tuple(out)


def _user_property_in(prop: tuple[int, Any], names: dict[str, Any]) -> bool:
    return prop[0] == p.USER_PROPERTY and prop[1][0] in names


class MqttFormat(HeaderFormat):
    """The encoded form of a message published over MQTT (see the module doc)."""

    name = "mqtt"

    def properties(self, message: Message) -> Properties:
        qos = message.encoded[0] & 3
        headers: dict[str, Any] = {"x-mqtt-publish-qos": qos}
        properties = Properties(headers=headers, delivery_mode=2 if qos else 1)
        for identifier, value in stored_properties(message):
            if identifier == p.CONTENT_TYPE:
                properties.content_type = str(value)
            elif identifier == p.RESPONSE_TOPIC:
                properties.reply_to = str(value)
            elif identifier == p.CORRELATION_DATA:
                assert isinstance(value, bytes)
                try:
                    properties.correlation_id = value.decode()
                except UnicodeDecodeError:
                    headers["x-correlation-id"] = value
            elif identifier == p.MESSAGE_EXPIRY_INTERVAL and isinstance(value, int):
                properties.expiration = str(value * 1000)
            elif identifier == p.PAYLOAD_FORMAT_INDICATOR:
                headers["x-mqtt-payload-format-indicator"] = value
            elif identifier == p.USER_PROPERTY:
                assert isinstance(value, tuple)
                headers[value[0]] = value[1]
        if message.ttl is not None:
            properties.expiration = str(message.ttl)
        return properties

    def with_headers(self, message: Message, changes: dict[str, Any]) -> Message:
        """A copy whose user properties have ``changes`` applied (a value replaces the
        property, None removes it)."""
        kept = [prop for prop in stored_properties(message) if not _user_property_in(prop, changes)]
        kept += [
            (p.USER_PROPERTY, (name, str(value))) for name, value in changes.items() if value is not None
        ]
        head = message.encoded[: len(message.encoded) - len(_block(message))]
        return message.reencoded(head + (p.encode_properties(tuple(kept)) if kept else b""))

    def restore(self, exchange: str, routing_key: str, encoded: bytes, body: bytes) -> Message:
        message = Message(exchange, routing_key, body, self, encoded, bool(encoded[0] & 3))
        expiry = p.get_property(stored_properties(message), p.MESSAGE_EXPIRY_INTERVAL)
        message.ttl = int(expiry) * 1000 if isinstance(expiry, int) else None
        return message


MQTT = MqttFormat()
register_format(MQTT)
