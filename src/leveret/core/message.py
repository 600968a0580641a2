"""Messages as the broker holds them: a protocol-neutral container (RabbitMQ's ``mc``).

A :class:`Message` carries

- the body, the address it was published to (``exchange``, ``routing_key``, and
  ``cc``: the sender-selected routing keys of RabbitMQ's ``CC``/``BCC`` headers) and
  the neutral facts core acts on at once: ``persistent``, ``ttl`` (the message's own
  expiration, milliseconds) and ``priority``;
- the encoded form it arrived in (``encoded``, in ``format``: for AMQP 0-9-1 the content
  header payload), so a message published and consumed over the same protocol passes
  through without re-encoding;
- ``deaths``: annotations core adds when the message is dead-lettered
  (:class:`Death`). Each adapter renders them in its own form: ``x-death`` for AMQP.

Everything else (``properties``: message id, reply-to, headers, …) is decoded from the
encoded form by its :class:`MessageFormat` on first use, which happens only when routing
(headers exchange), deduplication, dead-lettering or the broker's API needs it.

Core builds messages of its own (dead-letter advisories, API replies) in the
:data:`NEUTRAL` format: properties only, encoded as JSON for the store.
"""

from __future__ import annotations

import datetime
import functools
import json
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Protocol


@dataclass(slots=True)
class Properties:
    """The properties core knows by name; AMQP's basic properties (§4.2.6.1), which are
    also JMS's message header fields. ``expiration`` is a TTL in milliseconds, as text;
    ``headers`` holds application headers with plain values (str, int, bytes, …)."""

    content_type: str | None = None
    content_encoding: str | None = None
    headers: dict[str, Any] | None = None
    delivery_mode: int | None = None
    priority: int | None = None
    correlation_id: str | None = None
    reply_to: str | None = None
    expiration: str | None = None
    message_id: str | None = None
    timestamp: datetime.datetime | None = None
    type: str | None = None
    user_id: str | None = None
    app_id: str | None = None


PROPERTY_NAMES = tuple(f.name for f in fields(Properties))

#: An AMQP 0-9-1 field type tag -> RabbitMQ's name for the type, as its
#: ``rabbit_binary_parser`` decodes it (``l`` and ``L`` alike to a signed 64-bit
#: ``long``): the type in a ``{Type, Value}`` header (consistent-hash exchange) and in
#: ``unacceptable_type_in_header`` texts.
RABBIT_FIELD_TYPES = {
    "S": "longstr",
    "T": "timestamp",
    "b": "byte",
    "B": "unsignedbyte",
    "s": "short",
    "u": "unsignedshort",
    "I": "signedint",
    "i": "unsignedint",
    "d": "double",
    "f": "float",
    "l": "long",
    "L": "long",
    "t": "bool",
    "D": "decimal",
    "F": "table",
    "A": "array",
    "x": "binary",
    "V": "void",
}


class MessageFormat(Protocol):
    """A protocol's encoded form of a message; each adapter registers one."""

    name: str

    def properties(self, message: Message) -> Properties:
        """Decode ``message.encoded`` into neutral properties."""

    def death_history(self, message: Message) -> list[tuple[str, str]]:
        """``(queue, reason)`` of the deaths the encoded form records, most recent
        first (a message republished by a client after it died carries them)."""

    def restore(self, exchange: str, routing_key: str, encoded: bytes, body: bytes) -> Message:
        """A message of this format read back from the store."""

    def with_headers(self, message: Message, changes: dict[str, Any]) -> Message:
        """A copy of ``message`` in this format with application headers set (a str or
        an int value) or removed (None); everything else as it is."""

    def header(self, message: Message, name: str) -> Any:
        """One application header's value as :attr:`Message.headers` has it (None
        when absent), read without decoding what the caller does not need where the
        encoded form allows."""


@dataclass(frozen=True, slots=True)
class Death:
    """One dead-lettering of a message (an annotation core adds).

    ``time`` is epoch seconds; ``exchange`` and ``routing_keys`` are where the message
    had been published to (its routing key and any ``CC`` keys); ``original_expiration``
    its ``expiration`` property (milliseconds as text), which the dead copy loses;
    ``readdressed`` is true when the dead-letter routing key replaced the routing key
    (the ``CC`` header is then dropped, as RabbitMQ does)."""

    queue: str
    reason: str
    time: int
    exchange: str
    routing_keys: tuple[str, ...]
    original_expiration: str | None = None
    readdressed: bool = False


class Message:
    """One published message, shared by every queue it was routed to; never changed
    once published (dead-lettering makes a copy)."""

    __slots__ = (
        "_properties",
        "body",
        "cc",
        "deaths",
        "encoded",
        "exchange",
        "format",
        "persistent",
        "priority",
        "rendered",
        "routing_key",
        "ttl",
    )

    def __init__(
        self,
        exchange: str,
        routing_key: str,
        body: bytes,
        format: MessageFormat,
        encoded: bytes,
        persistent: bool = False,
        ttl: int | None = None,
        priority: int | None = None,
        deaths: tuple[Death, ...] = (),
        cc: tuple[str, ...] = (),
    ) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        #: More routing keys the publisher chose (RabbitMQ's sender-selected
        #: distribution: ``CC`` then ``BCC`` keys). Direct and topic exchanges (and the
        #: default exchange) route on each of them as well as ``routing_key``.
        self.cc = cc
        self.body = body
        self.format = format
        self.encoded = encoded
        self.persistent = persistent
        self.ttl = ttl
        self.priority = priority
        self.deaths = deaths
        self._properties: Properties | None = None
        #: An adapter's rendering of this message, cached by that adapter (AMQP: the
        #: content header with ``x-death``), for messages not in its own format.
        self.rendered: Any = None

    @classmethod
    def build(
        cls, exchange: str, routing_key: str, body: bytes, properties: Properties | None = None
    ) -> Message:
        """A message made by the broker itself (advisories, API replies), in the
        :data:`NEUTRAL` format."""
        properties = properties or Properties()
        message = cls(
            exchange,
            routing_key,
            body,
            NEUTRAL,
            b"",
            properties.delivery_mode == 2,
            ttl_of(properties.expiration),
            properties.priority,
        )
        message._properties = properties
        return message

    @property
    def properties(self) -> Properties:
        """All properties, decoded on first use by the message's format."""
        if self._properties is None:
            self._properties = self.format.properties(self)
        return self._properties

    @property
    def headers(self) -> dict[str, Any]:
        """Application headers (empty if none)."""
        return self.properties.headers or {}

    def header(self, name: str) -> Any:
        """The application header ``name`` as :attr:`headers` has it, or None; cheaper
        than :attr:`headers` while the properties are not decoded (the delayed-message
        exchange's ``x-delay`` on every publish)."""
        if self._properties is not None:
            return self.headers.get(name)
        return self.format.header(self, name)

    def dead(self, death: Death, exchange: str, routing_key: str) -> Message:
        """The copy that dead-lettering publishes: annotated with ``death``, addressed to
        ``exchange``/``routing_key``, without its own expiration. It keeps the ``CC`` and
        ``BCC`` routing keys unless ``death.readdressed`` (RabbitMQ routes a dead letter
        on all of its original keys, or on the dead-letter routing key alone). Its
        properties are decoded anew (its format shows the deaths in them), except a
        NEUTRAL message's, which are all it has."""
        copy = Message(
            exchange,
            routing_key,
            self.body,
            self.format,
            self.encoded,
            self.persistent,
            None,
            self.priority,
            (*self.deaths, death),
            () if death.readdressed else self.cc,
        )
        if self.format is NEUTRAL:
            copy._properties = self._properties
        return copy

    def reencoded(self, encoded: bytes) -> Message:
        """The same message in the same format with another encoded form (a format's
        :meth:`MessageFormat.with_headers`); its facts, deaths and CC keys are kept."""
        return Message(
            self.exchange,
            self.routing_key,
            self.body,
            self.format,
            encoded,
            self.persistent,
            self.ttl,
            self.priority,
            self.deaths,
            self.cc,
        )

    def readdressed(self, exchange: str, routing_key: str) -> Message:
        """The same message (format, encoded form, deaths) addressed to ``exchange`` and
        ``routing_key`` alone (no ``CC`` keys): an operator's retry or move of a dead
        letter."""
        copy = Message(
            exchange,
            routing_key,
            self.body,
            self.format,
            self.encoded,
            self.persistent,
            self.ttl,
            self.priority,
            self.deaths,
        )
        copy._properties = self._properties
        return copy

    def with_headers(self, changes: dict[str, Any]) -> Message:
        """A copy with application headers set (str or int) or removed (None), in the
        message's own format (the scheduler's ``scheduledJobId``, the delayed-message
        exchange's negated ``x-delay``)."""
        return self.format.with_headers(self, changes)

    def death_history(self) -> list[tuple[str, str]]:
        """``(queue, reason)`` of every death, most recent first, one entry per queue and
        reason (as ``x-death`` lists them)."""
        history = self.format.death_history(self) if self.format is not NEUTRAL else []
        for death in self.deaths:
            key = (death.queue, death.reason)
            if key in history:
                history.remove(key)
            history.insert(0, key)
        return history

    # -- the store --------------------------------------------------------------------
    def meta(self) -> str | None:
        """What the store must keep besides the address, the encoded form and the body:
        JSON, or None for a message in the default format without annotations (the
        common case costs nothing)."""
        if not self.deaths and not self.cc and self.format is not NEUTRAL:
            # the common case: one string per format, made once
            return None if self.format.name == DEFAULT_FORMAT else _format_meta(self.format.name)
        meta: dict[str, Any] = {"format": self.format.name}
        if self.format is NEUTRAL:
            meta["properties"] = _properties_json(self.properties)
        if self.deaths:
            meta["deaths"] = [asdict(d) for d in self.deaths]
        if self.cc:  # BCC keys are gone from the headers: only here do they survive
            meta["cc"] = list(self.cc)
        return json.dumps(meta)

    @classmethod
    def restore(
        cls, exchange: str, routing_key: str, encoded: bytes, body: bytes, meta: str | None
    ) -> Message:
        """A message read back from the store (see :meth:`meta`). Raises LookupError for
        a format no adapter has registered."""
        # a format's name alone (the common case) is parsed once; the rest each time
        data = (_parsed_meta(meta) if len(meta) < 48 else json.loads(meta)) if meta else {}
        name = data.get("format", DEFAULT_FORMAT)
        if name == NEUTRAL.name:
            properties = _properties_from_json(data["properties"])
            message = cls.build(exchange, routing_key, body, properties)
        else:
            try:
                message_format = FORMATS[name]
            except KeyError:
                raise LookupError(f"stored message in unknown format '{name}'") from None
            message = message_format.restore(exchange, routing_key, encoded, body)
        if "deaths" in data:
            message.deaths = tuple(
                Death(**{**d, "routing_keys": tuple(d["routing_keys"])}) for d in data["deaths"]
            )
            message.ttl = None
        if "cc" in data:
            message.cc = tuple(data["cc"])
        return message

    def __repr__(self) -> str:
        return f"<Message {self.exchange!r} {self.routing_key!r} {len(self.body)} B>"


@functools.lru_cache(maxsize=16)
def _format_meta(name: str) -> str:
    return json.dumps({"format": name})


@functools.lru_cache(maxsize=16)
def _parsed_meta(meta: str) -> dict[str, Any]:
    """Short metadata (a format's name), parsed once. Callers must not change it."""
    return json.loads(meta)


def ttl_of(expiration: str | None) -> int | None:
    """A message's own TTL in milliseconds from its ``expiration`` property (text, as
    AMQP and JMS carry it); None when absent or not a non-negative integer."""
    try:
        ttl = int(expiration) if expiration is not None else None
    except ValueError:
        return None
    return ttl if ttl is None or ttl >= 0 else None


def _properties_json(properties: Properties) -> dict[str, Any]:
    data = {k: v for k, v in asdict(properties).items() if v is not None}
    if "timestamp" in data:
        data["timestamp"] = data["timestamp"].timestamp()
    return data


def _properties_from_json(data: dict[str, Any]) -> Properties:
    if "timestamp" in data:
        data = {**data, "timestamp": datetime.datetime.fromtimestamp(data["timestamp"], datetime.UTC)}
    return Properties(**data)


class HeaderFormat:
    """What most formats share: no death history of their own (deaths are core's
    annotations), and a header read from the decoded properties. A format that can
    read one header without decoding the rest overrides :meth:`header`."""

    def death_history(self, message: Message) -> list[tuple[str, str]]:
        return []

    def header(self, message: Message, name: str) -> Any:
        return message.headers.get(name)


class _NeutralFormat:
    """Messages core builds: their properties are all there is."""

    name = "neutral"

    def properties(self, message: Message) -> Properties:
        return Properties()

    def death_history(self, message: Message) -> list[tuple[str, str]]:
        return []

    def restore(self, exchange: str, routing_key: str, encoded: bytes, body: bytes) -> Message:
        raise LookupError("neutral messages are restored with their properties")

    def header(self, message: Message, name: str) -> Any:
        return message.headers.get(name)

    def with_headers(self, message: Message, changes: dict[str, Any]) -> Message:
        headers = {**(message.properties.headers or {}), **changes}
        properties = replace(message.properties, headers={k: v for k, v in headers.items() if v is not None})
        copy = Message.build(message.exchange, message.routing_key, message.body, properties)
        copy.deaths, copy.ttl, copy.cc = message.deaths, message.ttl, message.cc
        return copy


NEUTRAL: MessageFormat = _NeutralFormat()

#: Formats by name, registered by the protocol adapters (:func:`register_format`).
FORMATS: dict[str, MessageFormat] = {NEUTRAL.name: NEUTRAL}
#: The format whose messages the store keeps without metadata (the first registered).
#: The format of stored rows without metadata: the store kept only AMQP 0-9-1 content
#: headers before messages had formats, and it is still the common case.
DEFAULT_FORMAT = "amqp-0-9-1"


def register_format(message_format: MessageFormat) -> None:
    """Make stored messages of ``message_format`` readable (adapters call this at
    import; reading a stored message of a format no adapter registered raises
    LookupError)."""
    FORMATS[message_format.name] = message_format
