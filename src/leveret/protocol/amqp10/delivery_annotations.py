"""Per-delivery message-annotations: what a queue adds to one delivery (a stream's
``x-stream-offset``, :meth:`~leveret.core.queues.base.Queue.delivery_headers`), put into
a transfer payload as RabbitMQ 4 does for AMQP 1.0 receivers of a stream (a long
annotation; rabbitmq-amqp-python-client reads it to resume from the right offset).

Only the leading header and delivery-annotations sections are decoded to find where
the message-annotations go: an existing message-annotations section is merged (the
queue's values win), else one is inserted before the bare message.
"""

from __future__ import annotations

from collections.abc import Iterable

from .types import DecodeError, Described, Symbol, ULong, decode, encode

_HEADER, _DELIVERY_ANNOTATIONS, _MESSAGE_ANNOTATIONS = 0x70, 0x71, 0x72
_NAMES = {
    "amqp:header:list": _HEADER,
    "amqp:delivery-annotations:map": _DELIVERY_ANNOTATIONS,
    "amqp:message-annotations:map": _MESSAGE_ANNOTATIONS,
}


def _code(value: object) -> int | None:
    if not isinstance(value, Described):
        return None
    descriptor = value.descriptor
    if isinstance(descriptor, str):
        return _NAMES.get(descriptor)
    return int(descriptor) if isinstance(descriptor, int) else None


def with_annotations(payload: bytes, values: Iterable[tuple[str, int]]) -> bytes:
    """``payload`` (a transfer's sections) with ``values`` as message-annotations.
    A payload that does not decode is returned as it is."""
    extra = {Symbol(key): value for key, value in values}
    pos = 0
    try:
        while pos < len(payload):
            value, end = decode(payload, pos)
            code = _code(value)
            if code in (_HEADER, _DELIVERY_ANNOTATIONS):
                pos = end
                continue
            if code == _MESSAGE_ANNOTATIONS and isinstance(value.value, dict):
                merged = {**value.value, **extra}
                section = encode(Described(ULong(_MESSAGE_ANNOTATIONS), merged))
                return payload[:pos] + section + payload[end:]
            break
    except DecodeError:
        return payload
    section = encode(Described(ULong(_MESSAGE_ANNOTATIONS), extra))
    return payload[:pos] + section + payload[pos:]
