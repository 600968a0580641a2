"""The message fields AMQP 1.0 source filters read, as selector lookups see them.

Core's selector lookup (:func:`leveret.core.selector.message_lookup`) knows the JMS
header fields and the application headers of any message. AMQP 1.0 filters also name
the fields of the ``properties`` section that core's neutral properties do not keep
(``to``, ``subject``, ``group-id``, ``absolute-expiry-time``…) and message-annotations
(RabbitMQ's ``x-stream-filter-value``). They are registered with core as the lookup
namespace ``amqp10`` (names ``"\\x00amqp10:<kind>:<field>"``, see :func:`name`), read
from the message as an AMQP 1.0 receiver would get it (whatever protocol published it:
RabbitMQ 4's ``mc:property`` does the same conversion), decoded once per message for
all the consumers that look at it in a row (a one-message cache).

Kinds: ``p`` a properties field (its AMQP 1.0 value: ids as str, int, bytes or UUID,
times as int milliseconds), ``a`` an application property as is (:data:`MISSING` when
absent, unlike None for a null value), ``jms-type`` the JMSType of Qpid JMS (the
``subject``; else the AMQP 0-9-1 ``type``), ``sfv`` the stream filter value (the
header ``x-stream-filter-value`` of AMQP 0-9-1, else that message-annotation).
"""

from __future__ import annotations

from typing import Any

from ...core.message import Message
from ...core.selector_lookup import register_namespace
from ...core.stream_filter import FILTER_VALUE_HEADER, as_filter_value, filter_value
from . import performatives as perf
from .message import AMQP10, encode_transfer
from .types import DecodeError, Described, decode

NAMESPACE = "amqp10"

#: The properties section's fields (§3.2.4), in order.
PROPERTY_FIELDS = (
    "message-id",
    "user-id",
    "to",
    "subject",
    "reply-to",
    "correlation-id",
    "content-type",
    "content-encoding",
    "absolute-expiry-time",
    "creation-time",
    "group-id",
    "group-sequence",
    "reply-to-group-id",
)
_INDEX = {field: i for i, field in enumerate(PROPERTY_FIELDS)}
STREAM_FILTER_VALUE = FILTER_VALUE_HEADER


class _Missing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


#: An application property that the message does not have.
MISSING: Any = _Missing()


def name(kind: str, field: str = "") -> str:
    """The lookup name of ``field`` of ``kind`` (see the module doc)."""
    return f"\x00{NAMESPACE}:{kind}:{field}"


_NO_FIELDS: tuple[Any, ...] = (None,) * len(PROPERTY_FIELDS)
# the last message decoded and its (properties fields, message-annotations)
_last: list[Any] = [None, _NO_FIELDS, {}]


def _decoded(message: Message) -> tuple[tuple[Any, ...], dict[Any, Any]]:
    if _last[0] is message:
        return _last[1], _last[2]
    fields, annotations = _NO_FIELDS, {}
    payload = encode_transfer(message, 0, True, None)
    pos = 0
    try:  # the sections up to the properties (§3.2: header, annotations, properties, …)
        while pos < len(payload):
            value, pos = decode(payload, pos)
            section = perf.from_described(value) if isinstance(value, Described) else None
            if isinstance(section, perf.MessageAnnotations):
                annotations = section.value
            elif isinstance(section, perf.Properties):
                fields = tuple(getattr(section, f.replace("-", "_")) for f in PROPERTY_FIELDS)
                break
            elif not isinstance(section, perf.Header | perf.DeliveryAnnotations):
                break  # application-properties or the body: no properties section
    except (DecodeError, ValueError):
        pass  # a message that does not render: no fields
    _last[:] = [message, fields, annotations]
    return fields, annotations


def read(message: Message, rest: str) -> Any:
    """The value of ``rest`` (``<kind>:<field>``) for ``message`` (see the module doc)."""
    kind, _, field = rest.partition(":")
    if kind == "a":
        return message.headers.get(field, MISSING)
    if kind == "p":
        index = _INDEX.get(field)
        return None if index is None else _decoded(message)[0][index]
    if kind == "jms-type":
        subject = _decoded(message)[0][3]
        return subject if isinstance(subject, str) else message.properties.type
    if kind == "sfv":
        value = filter_value(message)
        if value is None and message.format is AMQP10:
            value = as_filter_value(_decoded(message)[1].get(STREAM_FILTER_VALUE))
        return value
    return None


register_namespace(NAMESPACE, read)
