"""AMQP 1.0's form of core messages (interim: the full mapping lands with the message
helper's branch). The encoded form is the transfer payload as received; ``body`` is
the data sections' bytes (else the whole payload)."""

from __future__ import annotations

from typing import Any

from ...core.message import HeaderFormat, Message, Properties, register_format
from . import performatives as perf
from .types import DecodeError, Described, decode_all, encode


def _sections(payload: bytes) -> list[Any]:
    out = []
    for value in decode_all(payload):
        if not isinstance(value, Described):
            raise DecodeError("a message section that is not a described value")
        out.append(perf.from_described(value))
    return out


def decode_transfer(payload: bytes, exchange: str, routing_key: str) -> Message:
    """A transfer's message as core's; DecodeError for a malformed one."""
    sections = _sections(payload)
    header = next((s for s in sections if isinstance(s, perf.Header)), None)
    data = [s.value for s in sections if isinstance(s, perf.Data)]
    body = b"".join(data) if data else payload
    persistent = bool(header and header.durable)
    ttl = header.ttl if header is not None else None
    priority = header.priority if header is not None and header.priority != 4 else None
    return Message(exchange, routing_key, body, AMQP10, payload, persistent, ttl, priority)


def address_fields(message: Message) -> tuple[str | None, str | None]:
    """The message's ``to`` and ``subject``."""
    props = next((s for s in _sections(message.encoded) if isinstance(s, perf.Properties)), None)
    if props is None:
        return None, None
    return (props.to if isinstance(props.to, str) else None), props.subject


def encode_transfer(
    message: Message, delivery_count: int, first_acquirer: bool, ttl_left: int | None
) -> bytes:
    """The payload of a transfer carrying ``message`` to a receiver."""
    if message.format is AMQP10:
        return message.encoded
    props = message.properties
    parts = [
        encode(perf.to_described(perf.Header(durable=message.persistent, delivery_count=delivery_count))),
    ]
    parts.append(
        encode(
            perf.to_described(
                perf.Properties(
                    message_id=props.message_id,
                    correlation_id=props.correlation_id,
                    reply_to=props.reply_to,
                    content_type=props.content_type,
                )
            )
        )
    )
    if props.headers:
        plain = {k: v for k, v in props.headers.items() if isinstance(v, (str, int, float, bool, bytes))}
        parts.append(encode(perf.to_described(perf.ApplicationProperties(plain))))
    parts.append(encode(perf.to_described(perf.Data(message.body))))
    return b"".join(parts)


class Amqp10Format(HeaderFormat):
    name = "amqp-1.0"

    def properties(self, message: Message) -> Properties:
        out = Properties()
        for section in _sections(message.encoded):
            if isinstance(section, perf.Properties):
                out.message_id = None if section.message_id is None else str(section.message_id)
                out.correlation_id = None if section.correlation_id is None else str(section.correlation_id)
                out.reply_to = section.reply_to if isinstance(section.reply_to, str) else None
                out.content_type = section.content_type
            elif isinstance(section, perf.ApplicationProperties):
                out.headers = dict(section.value)
        out.delivery_mode = 2 if message.persistent else 1
        return out

    def with_headers(self, message: Message, changes: dict[str, Any]) -> Message:
        return message

    def restore(self, exchange: str, routing_key: str, encoded: bytes, body: bytes) -> Message:
        return decode_transfer(encoded, exchange, routing_key)


AMQP10 = Amqp10Format()
register_format(AMQP10)


def delivery_delay(message: Message, now_ms: int) -> int:
    """Milliseconds to hold ``message`` before routing it: its ``x-opt-delivery-delay``
    message annotation, or its ``x-opt-delivery-time`` (ms since the epoch) less
    ``now_ms`` (RabbitMQ Tanzu 4.3's names); 0 for none or a time past."""
    for section in _sections(message.encoded):
        if isinstance(section, perf.MessageAnnotations):
            delay = section.value.get("x-opt-delivery-delay")
            if isinstance(delay, int) and not isinstance(delay, bool):
                return max(0, delay)
            due = section.value.get("x-opt-delivery-time")
            if isinstance(due, int) and not isinstance(due, bool):
                return max(0, due - now_ms)
    return 0
