"""Selector lookups on core messages: the names a JMS selector may use, resolved on a
:class:`~leveret.core.message.Message` (see :mod:`leveret.core.selector`)."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from leveret.core.message import Message


def _timestamp(m: Message) -> int | None:
    ts = m.properties.timestamp
    return None if ts is None else int(ts.timestamp() * 1000)


_JMS_FIELDS: dict[str, Callable[[Message], Any]] = {
    "JMSMessageID": lambda m: m.properties.message_id,
    "JMSCorrelationID": lambda m: m.properties.correlation_id,
    "JMSType": lambda m: m.properties.type,
    "JMSReplyTo": lambda m: m.properties.reply_to,
    "JMSXUserID": lambda m: m.properties.user_id,
    "JMSPriority": lambda m: 4 if m.priority is None else m.priority,
    "JMSDeliveryMode": lambda m: "PERSISTENT" if m.persistent else "NON_PERSISTENT",
    "JMSTimestamp": _timestamp,
}


def _plain(value: Any) -> Any:
    """A header value as selectors see it: bytes as UTF-8 text, a Decimal as int or
    float, a datetime as milliseconds since the epoch; others unchanged."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, Decimal):
        try:
            whole = value.is_finite() and value == value.to_integral_value() and value.adjusted() < 30
            return int(value) if whole else float(value)
        except (ArithmeticError, ValueError):
            return None
    if isinstance(value, datetime.datetime):
        return int(value.timestamp() * 1000)
    return value


#: Readers of names in a namespace of an adapter's own (``\x00namespace:field``): message
#: fields its filters use that are neither JMS header fields nor application headers
#: (AMQP 1.0's ``subject``, ``to``, ``group-id``…). A JMS identifier never starts with
#: NUL, so no selector text can name them. See :func:`register_namespace`.
_NAMESPACES: dict[str, Callable[[Message, str], Any]] = {}


def register_namespace(namespace: str, read: Callable[[Message, str], Any]) -> None:
    """Let lookups resolve ``"\x00<namespace>:<field>"`` as ``read(message, field)``
    (an adapter's filters, e.g. :mod:`leveret.protocol.amqp10.filters`)."""
    _NAMESPACES[namespace] = read


def message_lookup(message: Message) -> Callable[[str], Any]:
    """A lookup for ``message``: the JMS header fields (JMSMessageID, JMSCorrelationID,
    JMSType, JMSReplyTo, JMSXUserID from its properties; JMSPriority, 4 by default;
    JMSDeliveryMode 'PERSISTENT'/'NON_PERSISTENT'; JMSTimestamp in ms), which shadow
    headers of the same name as in ActiveMQ's PropertyExpression, then its application
    headers; a name starting with NUL is an adapter's field (:func:`register_namespace`).
    Each name is resolved when the selector asks for it, nothing before."""

    def lookup(name: str) -> Any:
        field = _JMS_FIELDS.get(name)
        if field is not None:
            return field(message)
        if name[:1] == "\x00":
            namespace, _, rest = name[1:].partition(":")
            read = _NAMESPACES.get(namespace)
            return None if read is None else read(message, rest)
        return _plain(message.headers.get(name))

    return lookup
