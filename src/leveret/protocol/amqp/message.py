"""AMQP 0-9-1's form of core messages (RabbitMQ's ``mc_amqpl``).

A message published over AMQP keeps its content header payload as its encoded form;
delivered over AMQP it goes out as it came, unless core annotated it: deaths are then
rendered as the ``x-death`` header RabbitMQ 3.10 writes, and messages core built itself
are encoded here. Per-delivery headers (``x-delivery-count``, ``x-stream-offset``,
``x-lease-seq``) are spliced into the header without decoding it.
"""

from __future__ import annotations

import re
from typing import Any

from ...amqp import field_table, properties as wire
from ...amqp.errors import SYNTAX_ERROR, AMQPConnectionError
from ...core.errors import precondition_failed
from ...core.message import NEUTRAL, RABBIT_FIELD_TYPES, Death, Message, Properties, register_format, ttl_of

_EXPIRATION = re.compile(r"[+-]?[0-9]+")


class AMQPFormat:
    """The content header payload (§4.2.6.1) as a message's encoded form."""

    name = "amqp-0-9-1"

    def properties(self, message: Message) -> Properties:
        """The properties as a consumer would get them: with the deaths rendered
        (``x-death``, ``x-first-death-*``, no ``CC`` after a readdressing death), so a
        headers exchange routing dead letters sees what RabbitMQ's does (``type`` is
        AMQP's ``message-type``)."""
        decoded = wire.decode(content_header(message))
        return Properties(
            decoded.content_type,
            decoded.content_encoding,
            decoded.headers,
            decoded.delivery_mode,
            decoded.priority,
            decoded.correlation_id,
            decoded.reply_to,
            decoded.expiration,
            decoded.message_id,
            decoded.timestamp,
            decoded.message_type,
            decoded.user_id,
            decoded.app_id,
        )

    def death_history(self, message: Message) -> list[tuple[str, str]]:
        """The ``x-death`` entries, read from the raw header (typed, so a ``count`` of
        any integer type is fine)."""
        header = message.encoded
        offset = field_table.headers_offset(header)
        if offset is None:
            return []
        deaths = field_table.decode_table(header, offset)[0].get("x-death")
        if deaths is None or deaths[0] != "A":
            return []
        return [
            (field_table.text(item[1].get("queue")) or "", field_table.text(item[1].get("reason")) or "")
            for item in deaths[1]
            if item[0] == "F"
        ]

    def header(self, message: Message, name: str) -> Any:
        """Read from the ``headers`` table alone (leveret's decoder: no pamqp decode of
        every property); values of the plain types come as pamqp gives them (text for
        ``S``, bool for ``t``), others (tables, arrays, decimals, timestamps) through
        the full decode."""
        header = message.encoded
        if not header[12] & _HEADERS_HIGH_BIT:
            return None
        offset = field_table.headers_offset(header)
        if offset is not None:
            typed = field_table.decode_table(header, offset)[0].get(name)
            if typed is None:
                return None
            tag, value = typed
            if tag == "S":
                try:
                    return value.decode()
                except UnicodeDecodeError:
                    return value
            if tag == "t":
                return bool(value)
            if tag in _PLAIN_TAGS:
                return value
        return message.headers.get(name)  # property flag continuation, or a nested type

    def typed_header(self, message: Message, name: str) -> tuple[str, Any] | None:
        """The header ``name`` with its wire type, ``(tag, value)`` as
        :mod:`leveret.amqp.field_table` decodes it, or None (the consistent-hash
        exchange hashes the type as RabbitMQ does)."""
        header = message.encoded
        if not header[12] & _HEADERS_HIGH_BIT:
            return None
        offset = field_table.headers_offset(header)
        if offset is None:
            return None
        return field_table.decode_table(header, offset)[0].get(name)

    def with_headers(self, message: Message, changes: dict[str, Any]) -> Message:
        """A copy whose ``headers`` table has ``changes`` applied (an int as a ``l``, a
        str as a ``S``, None removes); the other headers keep their wire types. Integers
        alone are spliced in without decoding (an earlier value of the same name is
        shadowed, as with per-delivery headers: decoders keep the last)."""
        header = message.encoded
        if all(type(value) is int for value in changes.values()):
            try:
                for name, value in changes.items():
                    header = field_table.add_long_header(header, name, value)
                return message.reencoded(header)
            except ValueError:  # property flag continuation: the long way
                header = message.encoded
        offset = field_table.headers_offset(header)
        headers = field_table.decode_table(header, offset)[0] if offset else {}
        for name, value in changes.items():
            if value is None:
                headers.pop(name, None)
            else:
                headers[name] = ("l", value) if isinstance(value, int) else ("S", str(value).encode())
        decoded = wire.decode(header)
        decoded.headers = None
        encoded = wire.encode(decoded, len(message.body))
        if headers:
            encoded = field_table.with_headers(encoded, headers)
        return message.reencoded(encoded)

    def restore(self, exchange: str, routing_key: str, encoded: bytes, body: bytes) -> Message:
        """A message read back from the store: its facts scanned from the header,
        whose ``expiration`` was checked at publish."""
        delivery_mode, priority, expiration = wire.scan(encoded)
        return Message(
            exchange, routing_key, body, self, encoded, delivery_mode == 2, ttl_of(expiration), priority
        )


AMQP = AMQPFormat()
register_format(AMQP)


def from_publish(
    exchange: str,
    routing_key: str,
    header: bytes,
    body: bytes,
    facts: tuple[int | None, int | None, str | None] | None = None,
) -> Message:
    """The message of a basic.publish; ``facts`` is what :func:`wire.scan` returned for
    ``header``, if it was called already. Its ``CC`` and ``BCC`` headers become
    ``Message.cc`` routing keys and ``BCC`` leaves the header (see
    :func:`sender_selected`). Raises AMQPConnectionError 502 for properties that do not
    decode, and PreconditionFailed (406) for an ``expiration`` that is not a
    non-negative integer or a ``CC``/``BCC`` that is not an array, with RabbitMQ's
    texts."""
    delivery_mode, priority, expiration = facts or wire.scan(header)
    ttl = None if expiration is None else _check_expiration(expiration)
    cc: tuple[str, ...] = ()
    # A cheap look at the bytes first: most headers tables name neither key.
    if header[12] & _HEADERS_HIGH_BIT and (b"\x02CC" in header or b"\x03BCC" in header):
        header, cc = sender_selected(header)
    return Message(exchange, routing_key, body, AMQP, header, delivery_mode == 2, ttl, priority, cc=cc)


_HEADERS_HIGH_BIT = wire.HEADERS_FLAG >> 8
#: field types whose leveret-decoded value is what pamqp gives (integers, floats, bytes, void)
_PLAIN_TAGS = frozenset("bBsuIilLfdxV")


def sender_selected(header: bytes) -> tuple[bytes, tuple[str, ...]]:
    """RabbitMQ's sender-selected distribution: ``(header without BCC, CC keys then BCC
    keys)``. Each header, when present, must be an array (else PreconditionFailed 406
    ``invalid message: {unacceptable_type_in_header,"CC",longstr}``, CC checked first);
    only its long-string items are keys, other items are ignored, as RabbitMQ 3.10
    does. The names are case-sensitive. ``CC`` stays for consumers; ``BCC`` is removed,
    leaving an empty table if it was the only header, and the other headers keep their
    wire types. AMQPConnectionError 502 for a table that only pamqp can read."""
    offset = field_table.headers_offset(header)
    if offset is None:  # property flag continuation: no client sends it
        return header, ()
    try:
        table, end = field_table.decode_table(header, offset)
    except ValueError as exc:  # a field type only pamqp reads
        raise AMQPConnectionError(SYNTAX_ERROR, f"cannot decode content properties: {exc}") from None
    keys: list[str] = []
    for name in ("CC", "BCC"):
        typed = table.get(name)
        if typed is None:
            continue
        if typed[0] != "A":
            kind = RABBIT_FIELD_TYPES.get(typed[0], typed[0])
            raise precondition_failed(f'invalid message: {{unacceptable_type_in_header,"{name}",{kind}}}')
        keys += [value.decode(errors="replace") for tag, value in typed[1] if tag == "S"]
    if "BCC" in table:
        del table["BCC"]
        header = header[:offset] + field_table.encode_table(table) + header[end:]
    return header, tuple(keys)


def _check_expiration(expiration: str) -> int:
    match = _EXPIRATION.match(expiration)
    if match is None:
        raise precondition_failed(f"invalid expiration '{expiration}': no_integer")
    rest = expiration[match.end() :]
    if rest:
        raise precondition_failed(f"invalid expiration '{expiration}': {{leftover_string,\"{rest}\"}}")
    value = int(match.group())
    if value < 0:
        raise precondition_failed(f"invalid expiration '{expiration}': {{value_negative,{value}}}")
    return value


def content_header(message: Message) -> bytes:
    """The content header payload to deliver ``message`` with."""
    if message.format is AMQP and not message.deaths:
        return message.encoded
    header = message.rendered
    if type(header) is not bytes:  # None, or another adapter's cache (AMQP 1.0's)
        if message.format is AMQP:
            header = message.encoded
        else:  # NEUTRAL, or another protocol's message
            header = encode_properties(message.properties, len(message.body))
        if message.deaths:
            header = _render_deaths(header, message.deaths, len(message.body))
        if message.rendered is None:
            message.rendered = header
    return header


def with_delivery_headers(header: bytes, headers: tuple[tuple[str, int], ...]) -> bytes:
    """``header`` with integer headers (type ``l``) added for this delivery only."""
    for name, value in headers:
        try:
            header = field_table.add_long_header(header, name, value)
        except ValueError:  # property flag continuation: take the long way
            decoded = wire.decode(header)
            decoded.headers = {**(decoded.headers or {}), name: value}
            header = wire.encode(decoded, wire.declared_body_size(header))
    return header


def encode_properties(properties: Properties, body_size: int) -> bytes:
    """A content header payload for neutral ``properties`` (pamqp)."""
    return wire.encode(
        wire.Properties(
            content_type=properties.content_type,
            content_encoding=properties.content_encoding,
            headers=properties.headers,
            delivery_mode=properties.delivery_mode,
            priority=properties.priority,
            correlation_id=properties.correlation_id,
            reply_to=properties.reply_to,
            expiration=properties.expiration,
            message_id=properties.message_id,
            timestamp=properties.timestamp,
            message_type=properties.type,
            user_id=properties.user_id,
            app_id=properties.app_id,
        ),
        body_size,
    )


def replace_reply_to(message: Message, reply_to: str) -> Message:
    """A copy of an AMQP message with another ``reply_to`` (direct reply-to)."""
    decoded = wire.decode(message.encoded)
    decoded.reply_to = reply_to
    header = wire.encode(decoded, len(message.body))
    copy = from_publish(message.exchange, message.routing_key, header, message.body)
    copy.cc = message.cc  # the BCC keys are no longer in the header
    return copy


def _render_deaths(header: bytes, deaths: tuple[Death, ...], body_size: int) -> bytes:
    """``header`` with each death applied in turn as RabbitMQ 3.10 writes it
    (``rabbit_dead_letter:make_msg``): the first death's entry is ``count`` (a ``l``),
    ``reason``, ``queue``, ``time``, ``exchange``, ``routing-keys``, then
    ``original-expiration`` if the message had one, plus ``x-first-death-reason``,
    ``-queue`` and ``-exchange``; a later death in the same queue for the same reason
    increments that entry's ``count`` only (its ``time`` stays) and moves it first; a new
    entry goes first. Changed entries have their keys sorted, as has the whole headers
    table; other headers keep their wire types. The ``expiration`` property is removed,
    and ``CC`` too when the dead-letter routing key replaced the routing key."""
    offset = field_table.headers_offset(header)
    try:
        headers = field_table.decode_table(header, offset)[0] if offset else {}
    except ValueError:  # checked at publish, so not expected: keep going without them
        headers = {}
    for death in deaths:
        _apply_death(headers, death)
    decoded = wire.decode(header)
    decoded.expiration = None
    decoded.headers = None
    return field_table.with_headers(wire.encode(decoded, body_size), dict(sorted(headers.items())))


def _apply_death(headers: dict[str, Any], death: Death) -> None:
    if death.readdressed:
        headers.pop("CC", None)
    info: dict[str, Any] = {
        "reason": ("S", death.reason.encode()),
        "queue": ("S", death.queue.encode()),
        "time": ("T", death.time),
        "exchange": ("S", death.exchange.encode()),
        "routing-keys": ("A", [("S", key.encode()) for key in death.routing_keys]),
    }
    if death.original_expiration is not None:
        info["original-expiration"] = ("S", death.original_expiration.encode())
    existing = headers.get("x-death")
    if existing is None or existing[0] != "A":
        headers["x-first-death-reason"] = info["reason"]
        headers["x-first-death-queue"] = info["queue"]
        headers["x-first-death-exchange"] = info["exchange"]
        headers["x-death"] = ("A", [("F", {"count": ("l", 1), **info})])
        return
    entries = list(existing[1])
    for i, item in enumerate(entries):
        if (
            item[0] == "F"
            and field_table.text(item[1].get("queue")) == death.queue
            and field_table.text(item[1].get("reason")) == death.reason
        ):
            entry = dict(item[1])
            count = entry.get("count")
            entry["count"] = ("l", (count[1] if count and isinstance(count[1], int) else 0) + 1)
            del entries[i]
            break
    else:
        entry = {"count": ("l", 1), **info}
    entries.insert(0, ("F", dict(sorted(entry.items()))))
    headers["x-death"] = ("A", entries)


__all__ = [
    "AMQP",
    "NEUTRAL",
    "content_header",
    "encode_properties",
    "from_publish",
    "replace_reply_to",
    "sender_selected",
    "with_delivery_headers",
]
