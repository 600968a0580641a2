"""AMQP 1.0's form of core messages (RabbitMQ 4's ``mc_amqp``), and the payload of a
transfer to a receiver, sans-I/O.

**The encoded form.** A transfer's payload becomes a
:class:`~leveret.core.message.Message` in the ``amqp-1.0`` format whose encoded form is
a 21-byte prefix (layout kind and five offsets) then the sections *as received*:
header, message-annotations, properties, application-properties, the body sections
but for the bytes of a single data section's binary, which are ``Message.body``, and
the footer. Delivery-annotations are dropped (they are for one hop, as RabbitMQ 4
drops them). ``Message.body`` is the body "byte for byte" for every other protocol:

- one or more ``data`` sections: their bytes, concatenated;
- ``amqp-sequence`` / ``amqp-value``: the body sections and footer *as encoded*, with
  the AMQP 0-9-1 ``type`` property ``amqp-1.0`` (RabbitMQ 4's ``mc_amqpl``: an AMQP
  0-9-1 consumer gets the AMQP encoding, and an AMQP 0-9-1 publisher that sets that
  type has its body read back as AMQP sections).

**The hot path.** :func:`decode_transfer` scans the sections' boundaries
(:mod:`.sections`) and decodes only the header (``durable`` → ``persistent``,
``priority``, ``ttl`` ms → ``Message.ttl``) and, when there is one, the
message-annotations map (``x-cc`` routing keys); properties and
application-properties are checked from their constructors, the body and footer only
scanned. :func:`address_fields` (``to``, ``subject``; also :func:`message_to`,
:func:`message_subject`) and :func:`delivery_time` / :func:`delivery_delay` read one
section each when the adapter needs it; :meth:`Amqp10Format.properties` decodes the
rest lazily.
:func:`encode_transfer` writes a receiver's payload: a new header (durable, priority,
ttl, ``first-acquirer`` and ``delivery-count``, which change per delivery), the
message-annotations with RabbitMQ 4's ``x-exchange`` and ``x-routing-key`` (and
``x-opt-deaths`` after dead-lettering), then the bare message and footer as they came:
AMQP 1.0 to AMQP 1.0 passes the bare message (§3.2: what signatures cover) untouched.

**The mapping** to and from neutral properties (AMQP 0-9-1's, which STOMP and MQTT
consumers are rendered from), as RabbitMQ 4's ``mc_amqpl`` converts:

=====================================  ==============================================
AMQP 1.0                               neutral / AMQP 0-9-1 property
=====================================  ==============================================
header ``durable``                     ``delivery_mode`` 2 / 1 (absent header:
                                       annotation ``x-basic-delivery-mode``)
header ``priority``                    ``priority`` (else ``x-basic-priority``)
header ``ttl`` (ms)                    ``expiration`` (else ``x-basic-expiration``)
properties ``message-id``              ``message_id``: a uuid as ``urn:uuid:…``, a
                                       ulong in decimal, a string of at most 255
                                       bytes as it is; binary or a longer string:
                                       header ``x-message-id`` instead
properties ``correlation-id``          ``correlation_id`` (the same; header
                                       ``x-correlation-id``)
properties ``user-id`` (binary)        ``user_id`` when UTF-8 without NUL, ≤ 255 bytes
properties ``reply-to``                ``reply_to``; ``/queues/:q`` becomes ``q``
properties ``content-type`` / ``-encoding``  ``content_type`` / ``content_encoding``
properties ``creation-time`` (ms)      ``timestamp``
properties ``group-id``                ``app_id``
annotation ``x-basic-type``            ``type`` (``amqp-1.0`` for an amqp-value or
                                       amqp-sequence body)
application-properties                 ``headers`` (string keys ≤ 255 bytes)
message-annotations ``x-…``            ``headers`` (``x-cc`` → ``CC``,
                                       ``x-opt-deaths`` → ``x-death``; RabbitMQ's
                                       internal ``x-basic-*``, ``x-exchange``,
                                       ``x-routing-key`` left out)
=====================================  ==============================================

and back, for a message published over AMQP 0-9-1, STOMP or MQTT: the same table read
from right to left, with ``type`` as annotation ``x-basic-type``, ``x-`` headers as
message-annotations, ``CC`` as ``x-cc``, other headers whose values are not tables or
arrays as application-properties, a ``urn:uuid:`` message or correlation id as a uuid,
``reply_to`` as the address ``/queues/:q`` (a STOMP ``/queue/``, ``/topic/`` or
``/exchange/`` destination as its v2 address, an MQTT response topic as
``/exchanges/amq.topic/:key``), and the body as one data section.

Differences from RabbitMQ 4: header values are plain Python values between the
formats (an AMQP 0-9-1 ``unsignedbyte`` header arrives as an AMQP 1.0 ``long``); a
uuid application property becomes its text; a decimal header becomes its text; a
timestamp keeps its milliseconds for STOMP consumers.
"""

from __future__ import annotations

import datetime
import functools
import struct
import urllib.parse
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...compiled import twin
from ...core.message import Death, HeaderFormat, Message, Properties, register_format
from . import sections as s
from .types import Array, DecodeError, Symbol, Timestamp, UInt, ULong, encode

#: The error condition for an annotation or property whose value is refused.
INVALID_FIELD = "amqp:invalid-field"
#: The type property of a message whose body is AMQP sections (RabbitMQ's).
AMQP10_TYPE = "amqp-1.0"

# layout kinds of the encoded form
_ONE_DATA = 1  # Message.body is the single data section's bytes, spliced back at `ins`
_ENCODED_BODY = 2  # Message.body is the body sections and footer as encoded
_MANY_DATA = 3  # the encoded form holds the whole message; Message.body their bytes
_PREFIX = struct.Struct(">BIIIII")  # kind, header end, bare start, app-props start, body start, ins
_P = _PREFIX.size

#: Message-annotations RabbitMQ sets itself (left out of AMQP 0-9-1 headers).
_INTERNAL = frozenset(("x-exchange", "x-routing-key", "x-death", "x-opt-deaths", "x-cc"))
_SHORTSTR = 255
_FLOAT32_MAX = 3.4028234663852886e38
#: Headers the mapping makes from other annotations or properties.
_RENAMED = frozenset(("CC", "x-death", "x-message-id", "x-correlation-id", "timestamp_in_ms"))


# -- decoding a transfer -----------------------------------------------------------------


def decode_transfer(payload: bytes, exchange: str, routing_key: str) -> Message:
    """The message a transfer's ``payload`` carries (all its frames' bytes joined),
    addressed to ``exchange`` / ``routing_key``; see the module doc. The header, the
    message-annotations, the properties and the application-properties are checked
    (decoded) when they hold anything; the body and footer only scanned. Its facts come
    from the header: ``persistent`` (``durable``, false when absent as the spec and
    RabbitMQ 4.2 have it), ``priority`` (None when absent), ``ttl`` in ms; its ``cc``
    from annotation ``x-cc`` (a list of strings: RabbitMQ's sender-selected routing
    keys).

    Raises DecodeError: ``amqp:decode-error`` for a payload that is not an AMQP 1.0
    message (bad encoding, sections out of order, no body, a header field of the wrong
    type: RabbitMQ 4 detaches the link with that condition), ``amqp:invalid-field``
    for an ``x-cc`` that is not a list of strings (RabbitMQ 4's)."""
    return _decode(payload, exchange, routing_key)[0]


def decode_publish(payload: bytes, now: Callable[[], float]) -> tuple[Message, int]:
    """:func:`decode_transfer` for the publish path (not addressed yet) and the
    milliseconds to hold the message first (:func:`delivery_delay`), read from the
    message-annotations decoded once; ``now`` gives the time (seconds since the
    epoch), read only for a message with annotations. Raises DecodeError as
    :func:`decode_transfer`."""
    message, values = _decode(payload, "", "")
    if not values:
        return message, 0
    now_ms = int(now() * 1000)
    at = delivery_time_of(values, now_ms)
    return message, 0 if at is None else at - now_ms


def _decode(payload: bytes, exchange: str, routing_key: str) -> tuple[Message, dict[Any, Any] | None]:
    """:func:`decode_transfer`, and the message-annotations it decoded (None: none).
    The compiled twin (``_ctransfer.decode_message``) takes the common case (no
    delivery- or message-annotations, a header in the usual forms) when built."""
    if _compiled is not None:
        message = _compiled.decode_message(payload, exchange, routing_key)
        if message is not None:
            return message, None
    return py_decode(payload, exchange, routing_key)


def py_decode(payload: bytes, exchange: str, routing_key: str) -> tuple[Message, dict[Any, Any] | None]:
    """:func:`_decode` in pure Python (the compiled twin's reference)."""
    if type(payload) is not bytes:
        payload = bytes(payload)
    header, delivery, annotations, properties, application, b, _, data, _ = s.scan(payload)
    if delivery is not None:
        return py_decode(payload[: delivery[0]] + payload[delivery[1] :], exchange, routing_key)
    durable = priority = ttl = None
    values: dict[Any, Any] | None = None
    if header is not None:
        durable, priority, ttl = s.read_header(payload, header[0], header[1])
    cc: tuple[str, ...] = ()
    if annotations is not None:
        values = _annotations(payload, *annotations)
        if durable is None and values.get("x-basic-delivery-mode") == 2:
            durable = True
        if priority is None and isinstance(values.get("x-basic-priority"), int):
            priority = int(values["x-basic-priority"])
        if ttl is None and "x-basic-expiration" in values:
            try:
                ttl = max(0, int(values["x-basic-expiration"]))
            except (TypeError, ValueError):
                pass
        if "x-cc" in values:
            cc = _cc(values["x-cc"])
    # checked now (RabbitMQ 4 parses the bare message up to its body): a client learns
    # of a bad section at once, and core never meets one later
    ap = b
    if application is not None:
        s.check_application_properties(payload, application[0], application[1])
        ap = application[0]
    bare = ap
    if properties is not None:
        s.check_properties(payload, properties[0], properties[1])
        bare = properties[0]
    h = _P + header[1] if header is not None else _P
    if len(data) == 1:
        start, stop = data[0]
        body = payload[start:stop]
        prefix = _PREFIX.pack(_ONE_DATA, h, _P + bare, _P + ap, _P + b, _P + start)
        if stop < len(payload):
            encoded = b"".join((prefix, payload[:start], payload[stop:]))
        else:
            encoded = prefix + payload[:start]
    elif data:
        body = b"".join([payload[start:stop] for start, stop in data])
        encoded = _PREFIX.pack(_MANY_DATA, h, _P + bare, _P + ap, _P + b, _P + len(payload)) + payload
    else:
        body = payload[b:]
        encoded = _PREFIX.pack(_ENCODED_BODY, h, _P + bare, _P + ap, _P + b, _P + b) + payload[:b]
    message = Message(exchange, routing_key, body, AMQP10, encoded, durable is True, ttl, priority, cc=cc)
    return message, values


def _annotations(data: bytes, start: int, end: int) -> dict[Any, Any]:
    value = s.section_value(data, start, end)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise DecodeError("message-annotations that are not a map")
    return value


def _cc(value: Any) -> tuple[str, ...]:
    if isinstance(value, Array):
        value = list(value.items)
    if not isinstance(value, list) or not all(isinstance(key, str) for key in value):
        raise DecodeError(f"bad value for 'x-cc' message-annotation: {value!r:.80}", INVALID_FIELD)
    return tuple(str(key) for key in value)


class _Layout:
    """The offsets of an encoded form (see the module doc)."""

    __slots__ = ("ap", "b", "bare", "h", "ins", "kind")

    def __init__(self, encoded: bytes) -> None:
        self.kind, self.h, self.bare, self.ap, self.b, self.ins = _PREFIX.unpack_from(encoded)

    def annotations(self) -> tuple[int, int] | None:
        return (self.h, self.bare) if self.h < self.bare else None

    def properties(self) -> tuple[int, int] | None:
        return (self.bare, self.ap) if self.bare < self.ap else None

    def application_properties(self) -> tuple[int, int] | None:
        return (self.ap, self.b) if self.ap < self.b else None


def message_to(message: Message) -> str | None:
    """The ``to`` field of an AMQP 1.0 message's properties (the address a message
    sent on a link with a null target goes to, RabbitMQ 4's address v2), None when
    absent or for a message of another format. Only that field is decoded. Raises
    DecodeError (``amqp:decode-error``) for a ``to`` that is not a string."""
    return _property_field(message, 2, "to")


def message_subject(message: Message) -> str | None:
    """The ``subject`` of an AMQP 1.0 message's properties (RabbitMQ 4 routes on it
    for the target ``/exchanges/:exchange`` without a key), None when absent. Raises
    DecodeError for a subject that is not a string."""
    return _property_field(message, 3, "subject")


def _section_of(
    message: Message, section: Callable[[_Layout], tuple[int, int] | None]
) -> tuple[bytes, int, int] | None:
    """``message``'s encoding and where in it the ``section`` (a :class:`_Layout`
    method) starts and ends; None for a message of another format or without it."""
    if message.format is not AMQP10:
        return None
    encoded = message.encoded
    span = section(_Layout(encoded))
    return None if span is None else (encoded, span[0], span[1])


def _property_field(message: Message, index: int, name: str) -> str | None:
    found = _section_of(message, _Layout.properties)
    if found is None:
        return None
    value = s.list_field(*found, index)
    if value is not None and not isinstance(value, str):
        raise DecodeError(f"properties: {name} is not a string")
    return None if value is None else str(value)


def delivery_time(message: Message, now_ms: int) -> int | None:
    """When an AMQP 1.0 message asks to be delivered, in ms since the epoch: its
    message-annotation ``x-opt-delivery-time`` (ms since the epoch), else ``now_ms``
    plus ``x-opt-delivery-delay`` (ms); None when it has neither (or is of another
    format), or when the time is not after ``now_ms`` (due already); a value that is
    not an integer is ignored. The adapter hands a later time to core's scheduler
    (RabbitMQ Tanzu 4.3's annotations)."""
    found = _section_of(message, _Layout.annotations)
    if found is None:
        return None
    return delivery_time_of(_annotations(*found), now_ms)


def delivery_time_of(annotations: dict[Any, Any], now_ms: int) -> int | None:
    """:func:`delivery_time` of an annotations map (a message's, or a ``modified``
    outcome's)."""
    at: Any = annotations.get("x-opt-delivery-time")
    if not _is_integer(at):
        delay: Any = annotations.get("x-opt-delivery-delay")
        if not _is_integer(delay):
            return None
        at = now_ms + delay
    return int(at) if at > now_ms else None


def _is_integer(value: Any) -> bool:
    return isinstance(value, int) and type(value) is not bool


def delivery_delay(message: Message, now_ms: int) -> int:
    """Milliseconds to hold ``message`` before routing it (:func:`delivery_time` less
    ``now_ms``; 0: route it now)."""
    at = delivery_time(message, now_ms)
    return 0 if at is None else at - now_ms


def address_fields(message: Message) -> tuple[str | None, str | None]:
    """The ``to`` and ``subject`` of an AMQP 1.0 message's properties
    (:func:`message_to`, :func:`message_subject`), from one look at the section."""
    found = _section_of(message, _Layout.properties)
    if found is None:
        return None, None
    to = s.list_field(*found, 2)
    subject = s.list_field(*found, 3)
    return (None if to is None else str(to)), (None if subject is None else str(subject))


# -- a transfer to a receiver ------------------------------------------------------------


@dataclass(slots=True)
class _Rendered:
    """What :func:`encode_transfer` caches on ``Message.rendered``: the payload after
    the header, in up to three parts (the body goes between ``head`` and ``tail``)."""

    head: bytes
    with_body: bool
    tail: bytes


def py_encode_transfer(
    message: Message, delivery_count: int, first_acquirer: bool, ttl_left_ms: int | None
) -> bytes:
    """The payload of a transfer of ``message`` to a receiver: a header with
    ``durable`` (``message.persistent``), ``priority``, ``ttl`` (``ttl_left_ms``, the
    ms the message has left to live; None: the message's own TTL, if any),
    ``first-acquirer`` (false for a dead-lettered message, as RabbitMQ 4 has it) and
    ``delivery-count`` (the failed deliveries before this one, RabbitMQ 4.3's), then
    the message-annotations (``x-exchange``, ``x-routing-key``, ``x-opt-deaths``
    after dead-lettering, as RabbitMQ 4 adds them), then the rest: for
    an AMQP 1.0 message its bare message and footer as received; for any other format
    properties, application-properties and one data section built from its neutral
    properties (see the module doc). What does not change between deliveries is
    cached on ``message.rendered``. Raises nothing for a message that was accepted (a
    priority outside a ubyte, which the HTTP API's publish takes, is clamped to 0-255)."""
    ttl = ttl_left_ms if ttl_left_ms is not None else message.ttl
    first = first_acquirer and not message.deaths  # RabbitMQ 4: a dead letter's is false
    priority = message.priority
    if priority is not None and not 0 <= priority < 256:
        priority = 255 if priority > 0 else 0
    header = s.header_bytes(message.persistent, priority, ttl, first, delivery_count)
    rendered = message.rendered
    if type(rendered) is not _Rendered:
        rendered = _render(message)
        if message.rendered is None:
            message.rendered = rendered
    if rendered.with_body:
        return b"".join((header, rendered.head, message.body, rendered.tail))
    return b"".join((header, rendered.head, rendered.tail))


def _render(message: Message) -> _Rendered:
    if message.format is AMQP10:
        encoded = message.encoded
        layout = _Layout(encoded)
        span = layout.annotations()
        if span is None and not message.deaths:
            annotations = _routing_annotations(message.exchange, message.routing_key)
        else:
            values = _annotations(encoded, *span) if span is not None else {}
            delivered = _delivery_annotations(values, message)
            try:
                annotations = _annotations_section(delivered)
            except ValueError:  # a routing key or death text with a lone surrogate (HTTP)
                annotations = b"\x00\x53\x72" + _encodable_map(utf8_safe(delivered))
        if layout.kind == _MANY_DATA:
            return _Rendered(annotations + encoded[layout.bare :], False, b"")
        return _Rendered(annotations + encoded[layout.bare : layout.ins], True, encoded[layout.ins :])
    return _Rendered(_foreign_head(message), True, b"")


def _delivery_annotations(values: dict[Any, Any], message: Message) -> dict[Any, Any]:
    """A message's annotations as a receiver gets them (RabbitMQ 4's
    ``protocol_state``): its own, with ``x-exchange``, ``x-routing-key`` and, after
    dead-lettering, ``x-opt-deaths`` set."""
    out = {key: value for key, value in values.items() if key not in ("x-exchange", "x-routing-key")}
    out[Symbol("x-exchange")] = message.exchange
    out[Symbol("x-routing-key")] = message.routing_key
    if message.deaths:
        out[Symbol("x-opt-deaths")] = _render_deaths(out.pop("x-opt-deaths", None), message.deaths)
    return out


@functools.lru_cache(maxsize=1024)
def _routing_annotations(exchange: str, routing_key: str) -> bytes:
    return _annotations_section({Symbol("x-exchange"): exchange, Symbol("x-routing-key"): routing_key})


def _annotations_section(values: dict[Any, Any]) -> bytes:
    return b"\x00\x53\x72" + encode({Symbol(k) if type(k) is str else k: v for k, v in values.items()})


def _render_deaths(existing: Any, deaths: tuple[Death, ...]) -> Array:
    """``x-opt-deaths`` (RabbitMQ 4): an array of maps, most recent first, one per
    queue and reason with ``queue``, ``reason``, ``count``, ``first-time``,
    ``last-time`` (ms), ``exchange``, ``routing-keys`` and, when the message had
    one, ``ttl`` (its expiration, ms); ``existing`` is the message's own array."""
    entries: list[dict[Any, Any]] = []
    if isinstance(existing, Array):
        entries = [dict(item) for item in existing.items if isinstance(item, dict)]
    for death in deaths:
        at = Timestamp(death.time * 1000)
        for i, entry in enumerate(entries):
            if entry.get("queue") == death.queue and entry.get("reason") == death.reason:
                del entries[i]
                count = entry.get("count")
                entry[Symbol("count")] = ULong((count if isinstance(count, int) else 0) + 1)
                entry[Symbol("last-time")] = at
                break
        else:
            entry = {}
            if death.original_expiration is not None and death.original_expiration.isdigit():
                entry[Symbol("ttl")] = UInt(min(int(death.original_expiration), 2**32 - 1))
            entry.update(
                {
                    Symbol("queue"): death.queue,
                    Symbol("reason"): Symbol(death.reason),
                    Symbol("count"): ULong(1),
                    Symbol("first-time"): at,
                    Symbol("last-time"): at,
                    Symbol("exchange"): death.exchange,
                    Symbol("routing-keys"): Array("string", tuple(death.routing_keys)),
                }
            )
        entries.insert(0, entry)
    return Array("map", tuple(entries))


# -- another protocol's message as AMQP 1.0 -----------------------------------------------


def _foreign_head(message: Message) -> bytes:
    """Message-annotations, properties, application-properties and the body's start
    for a message of another format, from its neutral properties."""
    props = message.properties
    headers = props.headers or {}
    annotations: dict[Any, Any] = {}
    application: dict[str, Any] = {}
    deaths = bool(message.deaths)
    for name, value in headers.items():
        if not isinstance(name, str):
            continue
        if name.startswith("x-"):
            if deaths and (name == "x-death" or name.startswith("x-first-death-")):
                continue  # core's deaths are rendered as x-opt-deaths
            if name in ("x-exchange", "x-routing-key") or not name.isascii():
                continue
            converted = _to_amqp(value)
            if converted is not _SKIP:
                annotations[Symbol(name)] = converted
        elif name == "CC" and isinstance(value, list | tuple):
            annotations[Symbol("x-cc")] = [str(key) for key in value]
        elif not isinstance(value, list | tuple | dict):
            converted = _to_amqp(value)
            if converted is not _SKIP:
                application[name] = converted
    if props.type is not None and props.type != AMQP10_TYPE:
        annotations[Symbol("x-basic-type")] = props.type
    annotations = _delivery_annotations(annotations, message)
    fields = [
        _id_to_amqp(props.message_id),
        props.user_id.encode("utf-8", "replace") if props.user_id else None,
        None,
        None,
        _reply_to_address(message, props.reply_to),
        _id_to_amqp(props.correlation_id),
        _symbol(props.content_type),
        _symbol(props.content_encoding),
        None,
        Timestamp(int(props.timestamp.timestamp() * 1000)) if props.timestamp is not None else None,
        props.app_id,
    ]
    while fields and fields[-1] is None:
        fields.pop()
    out = [b"\x00\x53\x72" + _encodable_map(annotations)]
    try:
        properties = encode(fields) if fields else None
    except ValueError:  # a text no AMQP string holds (a lone surrogate): left out
        properties = encode([field if _encodes(field) else None for field in fields])
    if properties is not None:
        out.append(b"\x00\x53\x73" + properties)
    if application:
        out.append(b"\x00\x53\x74" + _encodable_map(application))
    body = message.body
    if props.type != AMQP10_TYPE or not _is_body(body):
        out.append(s.data_constructor(len(body)))
    return b"".join(out)


def utf8_safe(value: Any) -> Any:
    """``value`` with every text's lone surrogates replaced (``?``), so it encodes."""
    if isinstance(value, str):
        return type(value)(value.encode("utf-8", "replace").decode("utf-8"))
    if isinstance(value, dict):
        return {utf8_safe(key): utf8_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [utf8_safe(item) for item in value]
    if isinstance(value, Array):
        return Array(value.type, tuple(utf8_safe(item) for item in value.items), value.descriptor)
    return value


def _encodable_map(values: dict[Any, Any]) -> bytes:
    """A map's encoding, less the entries AMQP cannot carry (keys or text with lone
    surrogates, which no AMQP string holds)."""
    try:
        return encode(values)
    except ValueError:
        return encode({key: value for key, value in values.items() if _encodes(key) and _encodes(value)})


def _encodes(value: Any) -> bool:
    try:
        encode(value)
    except ValueError:
        return False
    return True


def _is_body(body: bytes) -> bool:
    """Whether ``body`` is AMQP body sections (and a footer) alone."""
    try:
        sc = s.scan(body)
    except DecodeError:
        return False
    return sc.body == 0


def _symbol(value: str | None) -> Symbol | None:
    return Symbol(value) if value is not None and value.isascii() else None


def _id_to_amqp(value: str | None) -> Any:
    if value is None:
        return None
    if value.startswith("urn:uuid:") and len(value) == 45:
        try:
            return uuid.UUID(value[9:])
        except ValueError:
            pass
    return value


def _reply_to_address(message: Message, reply_to: str | None) -> str | None:
    """``reply_to`` as an AMQP 1.0 address (address v2, RabbitMQ 4)."""
    if reply_to is None:
        return None
    name = message.format.name
    if name == "mqtt":
        key = reply_to.translate(_MQTT_TO_KEY)
        return "/exchanges/amq.topic/" + urllib.parse.quote(key, safe="", errors="replace")
    if name == "stomp" and reply_to.startswith("/"):
        for prefix, address in _STOMP_DESTINATIONS:
            if reply_to.startswith(prefix):
                return address + "/".join(
                    urllib.parse.quote(part, safe="", errors="replace")
                    for part in reply_to[len(prefix) :].split("/", 1)
                )
        return reply_to
    # errors="replace": a lone surrogate (the HTTP API takes one) is no UTF-8
    return "/queues/" + urllib.parse.quote(reply_to, safe="", errors="replace")


_MQTT_TO_KEY = str.maketrans({"/": ".", ".": "/"})
_STOMP_DESTINATIONS = (
    ("/queue/", "/queues/"),
    ("/topic/", "/exchanges/amq.topic/"),
    ("/exchange/", "/exchanges/"),
)
_SKIP = object()


def _to_amqp(value: Any) -> Any:
    """A neutral header value as an AMQP 1.0 value (_SKIP: none fits)."""
    if value is None or isinstance(value, bool | str | bytes | float):
        return value
    if isinstance(value, int):
        if -(2**63) <= value < 2**63:
            return int(value)
        return ULong(value) if 0 <= value < 2**64 else str(value)
    if isinstance(value, datetime.datetime):
        return Timestamp(int(value.timestamp() * 1000))
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    if isinstance(value, list | tuple):
        items = [_to_amqp(item) for item in value]
        return [item for item in items if item is not _SKIP]
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            converted = _to_amqp(item)
            if converted is not _SKIP and isinstance(key, str) and key.isascii():
                out[Symbol(key)] = converted
        return out
    try:
        return str(value)  # decimal.Decimal and the like
    except Exception:
        return _SKIP


# -- AMQP 1.0 to neutral -------------------------------------------------------------------


def _to_plain(value: Any) -> Any:
    """An AMQP 1.0 value as a neutral header value (_SKIP: none fits)."""
    if value is None or type(value) is bool or type(value) is str:
        return value
    if isinstance(value, int) and not isinstance(value, Timestamp):
        # AMQP 0-9-1 tables hold signed 64-bit integers at most (a larger ulong: text)
        return int(value) if value < 2**63 else str(int(value))
    if isinstance(value, float):
        # pamqp writes floats as AMQP 0-9-1 'f' (binary32): a larger double as text
        return float(value) if not abs(value) > _FLOAT32_MAX else repr(float(value))
    if type(value) is bytes:
        return bytearray(value)  # AMQP 0-9-1's byte array ('x'), as pamqp has it
    if isinstance(value, Timestamp):
        return _datetime(value) or int(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, Array):
        value = list(value.items)
    if isinstance(value, list):
        items = [_to_plain(item) for item in value]
        return [item for item in items if item is not _SKIP]
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            converted = _to_plain(item)
            if converted is not _SKIP and isinstance(key, str | int):
                out[str(key)] = converted
        return out
    return _SKIP  # decimals, described values


def _datetime(ms: int) -> datetime.datetime | None:
    """A timestamp (ms since the epoch) as AMQP 0-9-1 can carry it (unsigned
    seconds), None for one before 1970 or past year 9999."""
    if ms < 0:
        return None
    try:
        return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
    except (OverflowError, ValueError, OSError):
        return None


def _id_to_neutral(value: Any, header: str, headers: dict[str, Any]) -> str | None:
    """A message or correlation id as RabbitMQ 4 renders it for AMQP 0-9-1."""
    if value is None:
        return None
    if isinstance(value, uuid.UUID):
        return "urn:uuid:" + str(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return str(int(value))
    if isinstance(value, str) and len(value.encode()) <= _SHORTSTR:
        return str(value)
    if isinstance(value, bytes | str):
        headers[header] = bytearray(value) if isinstance(value, bytes) else str(value)
    return None


def _deaths_to_x_death(value: Any) -> list[dict[str, Any]] | None:
    """``x-opt-deaths`` as AMQP 0-9-1's ``x-death`` (RabbitMQ 4's conversion)."""
    if not isinstance(value, Array):
        return None
    out = []
    for entry in value.items:
        if not isinstance(entry, dict):
            continue
        item: dict[str, Any] = {
            "count": int(entry.get("count") or 0),
            "reason": str(entry.get("reason") or ""),
            "queue": str(entry.get("queue") or ""),
        }
        first = entry.get("first-time")
        if isinstance(first, int):
            item["time"] = _datetime(first // 1000 * 1000) or 0
        item["exchange"] = str(entry.get("exchange") or "")
        keys = entry.get("routing-keys")
        item["routing-keys"] = [str(key) for key in keys.items] if isinstance(keys, Array) else []
        if isinstance(entry.get("ttl"), int):
            item["original-expiration"] = str(entry["ttl"])
        out.append(item)
    return out


class Amqp10Format(HeaderFormat):
    """The encoded form of a message received over AMQP 1.0 (see the module doc)."""

    name = "amqp-1.0"

    def properties(self, message: Message) -> Properties:
        """Neutral properties decoded from the sections (the module doc's table)."""
        encoded = message.encoded
        layout = _Layout(encoded)
        headers: dict[str, Any] = {}
        props = Properties()
        span = layout.annotations()
        annotations = _annotations(encoded, *span) if span is not None else {}
        span = layout.application_properties()
        if span is not None:
            application = _section_or_none(encoded, span) or {}
            for key, value in application.items():
                if isinstance(key, str) and len(key.encode()) <= _SHORTSTR:
                    converted = _to_plain(value)
                    if converted is not _SKIP:
                        headers[str(key)] = converted
        for key, value in annotations.items():
            if not isinstance(key, str) or not key.startswith("x-"):
                continue
            if key == "x-cc":
                headers["CC"] = _to_plain(value)
            elif key == "x-opt-deaths":
                x_death = _deaths_to_x_death(value)
                if x_death is not None:
                    headers["x-death"] = x_death
            elif key == "x-opt-rabbitmq-received-time" and isinstance(value, int):
                headers["timestamp_in_ms"] = int(value)
            elif key not in _INTERNAL and not key.startswith("x-basic-") and len(key) <= _SHORTSTR:
                converted = _to_plain(value)
                if converted is not _SKIP:
                    headers[str(key)] = converted
        span = layout.properties()
        fields = (_section_or_none(encoded, span) or []) if span is not None else []
        fields = fields + [None] * (13 - len(fields))
        props.message_id = _id_to_neutral(fields[0], "x-message-id", headers)
        user_id = fields[1]
        if isinstance(user_id, bytes) and len(user_id) <= _SHORTSTR and b"\x00" not in user_id:
            try:
                props.user_id = user_id.decode()
            except UnicodeDecodeError:
                pass
        reply_to = fields[4]
        if isinstance(reply_to, str) and len(reply_to.encode()) <= _SHORTSTR:
            if reply_to.startswith("/queues/"):
                try:
                    props.reply_to = urllib.parse.unquote(reply_to[8:], errors="strict")
                except UnicodeDecodeError:
                    pass
            else:
                props.reply_to = str(reply_to)
        props.correlation_id = _id_to_neutral(fields[5], "x-correlation-id", headers)
        props.content_type = str(fields[6]) if isinstance(fields[6], str) else None
        props.content_encoding = str(fields[7]) if isinstance(fields[7], str) else None
        if isinstance(fields[9], int) and not isinstance(fields[9], bool):
            props.timestamp = _datetime(fields[9])
        group_id = fields[10]
        if isinstance(group_id, str) and len(group_id.encode()) <= _SHORTSTR:
            props.app_id = str(group_id)
        durable = None
        if layout.h > _P:
            durable = s.read_header(encoded, _P, layout.h)[0]
        if durable is not None:
            props.delivery_mode = 2 if durable else 1
        elif isinstance(annotations.get("x-basic-delivery-mode"), int):
            props.delivery_mode = int(annotations["x-basic-delivery-mode"])
        props.priority = message.priority
        if message.ttl is not None:
            props.expiration = str(message.ttl)
        if layout.kind == _ENCODED_BODY:
            props.type = AMQP10_TYPE
        elif isinstance(annotations.get("x-basic-type"), str):
            props.type = str(annotations["x-basic-type"])
        props.headers = headers or None
        return props

    def death_history(self, message: Message) -> list[tuple[str, str]]:
        """The ``x-opt-deaths`` entries of a message published with them."""
        encoded = message.encoded
        span = _Layout(encoded).annotations()
        if span is None:
            return []
        deaths = _annotations(encoded, *span).get("x-opt-deaths")
        if not isinstance(deaths, Array):
            return []
        return [
            (str(entry.get("queue", "")), str(entry.get("reason", "")))
            for entry in deaths.items
            if isinstance(entry, dict)
        ]

    def header(self, message: Message, name: str) -> Any:
        """An application property (an ``x-`` name: a message-annotation first) read
        from its section alone; the names the mapping renames (``x-death``, ``CC``,
        ...) through the full decode."""
        if name in _RENAMED:
            return message.headers.get(name)
        encoded = message.encoded
        layout = _Layout(encoded)
        value = None
        if name.startswith("x-"):
            if name in _INTERNAL or name.startswith("x-basic-"):
                return None
            span = layout.annotations()
            if span is not None:
                value = _annotations(encoded, *span).get(name)
        if value is None:
            span = layout.application_properties()
            if span is None:
                return None
            application = _section_or_none(encoded, span)
            value = application.get(name) if isinstance(application, dict) else None
        converted = _to_plain(value)
        return None if converted is _SKIP else converted

    def with_headers(self, message: Message, changes: dict[str, Any]) -> Message:
        """A copy whose application-properties (``x-`` names: message-annotations)
        have ``changes`` applied (a str or int value sets, None removes); the other
        sections stay as they are."""
        annotation_changes = {k: v for k, v in changes.items() if k.startswith("x-")}
        property_changes = {k: v for k, v in changes.items() if not k.startswith("x-")}
        encoded = message.encoded
        layout = _Layout(encoded)
        annotations_bytes = encoded[layout.h : layout.bare]
        if annotation_changes:
            span = layout.annotations()
            values = _annotations(encoded, *span) if span is not None else {}
            values = _changed(values, annotation_changes)
            annotations_bytes = _annotations_section(values) if values else b""
        application_bytes = encoded[layout.ap : layout.b]
        if property_changes:
            span = layout.application_properties()
            values = (_section_or_none(encoded, span) or {}) if span is not None else {}
            values = _changed(values, property_changes)
            application_bytes = b"\x00\x53\x74" + encode(values) if values else b""
        bare = encoded[layout.bare : layout.ap]
        head = encoded[_P : layout.h] + annotations_bytes + bare + application_bytes
        shift = _P + len(head) - layout.b
        h = layout.h
        bare = h + len(annotations_bytes)
        ap = bare + (layout.ap - layout.bare)
        b = ap + len(application_bytes)
        prefix = _PREFIX.pack(layout.kind, h, bare, ap, b, layout.ins + shift)
        return message.reencoded(prefix + head + encoded[layout.b :])

    def restore(self, exchange: str, routing_key: str, encoded: bytes, body: bytes) -> Message:
        """A message read back from the store: its facts from its header (and the
        ``x-basic-*`` annotations of a message converted by RabbitMQ), its TTL the
        header's (core keeps the expiry)."""
        layout = _Layout(encoded)
        durable = priority = ttl = None
        if layout.h > _P:
            durable, priority, ttl = s.read_header(encoded, _P, layout.h)
        span = layout.annotations()
        cc: tuple[str, ...] = ()
        if span is not None:
            values = _annotations(encoded, *span)
            if durable is None and values.get("x-basic-delivery-mode") == 2:
                durable = True
            if "x-cc" in values:
                try:
                    cc = _cc(values["x-cc"])
                except DecodeError:
                    cc = ()
        return Message(exchange, routing_key, body, self, encoded, durable is True, ttl, priority, cc=cc)


def _section_or_none(encoded: bytes, span: tuple[int, int]) -> Any:
    """A section's value, or None when the codec cannot read it: a field past those
    AMQP 1.0 defines that :func:`decode_transfer` did not check (the rest is left
    out rather than failing core's routing or another protocol's delivery)."""
    try:
        return s.section_value(encoded, *span)
    except DecodeError:
        return None


def _changed(values: dict[Any, Any], changes: dict[str, Any]) -> dict[Any, Any]:
    out = {key: value for key, value in values.items() if key not in changes}
    for name, value in changes.items():
        if value is not None:
            out[name] = int(value) if isinstance(value, int) and not isinstance(value, bool) else str(value)
    return out


AMQP10 = Amqp10Format()
register_format(AMQP10)
_compiled = twin("leveret.protocol.amqp10._ctransfer")
if _compiled is not None:
    _compiled.init_message(Message, AMQP10)
    _compiled.init_delivery(_Rendered, _routing_annotations, py_encode_transfer)
#: :func:`py_encode_transfer`, by its compiled twin (``_ctransfer.encode_transfer``)
#: when built: it takes an AMQP 1.0 message without message-annotations or deaths of
#: its own (or whose rendering is cached) and hands the rest to the pure encoder.
encode_transfer: Callable[[Message, int, bool, int | None], bytes] = (
    _compiled.encode_transfer if _compiled is not None else py_encode_transfer
)


def annotated(message: Message, annotations: dict[Any, Any]) -> Message:
    """The message a ``modified`` outcome's ``message-annotations`` make of
    ``message`` (§3.4.5: merged into the message for its next deliveries). Only keys
    starting with ``x-`` may be given (§3.2.10 reserves the others; RabbitMQ 4 ends
    the session on them): DecodeError ``amqp:invalid-field`` otherwise. An AMQP 1.0
    message has them in its message-annotations (replacing its own of the same
    name); a message of another format gets them as headers where the value is a
    string or an integer (others are dropped). Core's facts, deaths and CC keys are
    kept."""
    for key in annotations:
        if not isinstance(key, str) or not key.startswith("x-"):
            raise DecodeError(f"modified: annotation key {key!r:.60} does not start with 'x-'", INVALID_FIELD)
    if not annotations:
        return message
    if message.format is not AMQP10:
        changes: dict[str, Any] = {}
        for key, value in annotations.items():
            if isinstance(value, bool):
                changes[str(key)] = "true" if value else "false"
            elif isinstance(value, int | str):
                changes[str(key)] = int(value) if isinstance(value, int) else str(value)
        return message.with_headers(changes) if changes else message
    encoded = message.encoded
    layout = _Layout(encoded)
    span = layout.annotations()
    values = _annotations(encoded, *span) if span is not None else {}
    merged = {key: value for key, value in values.items() if key not in annotations}
    merged.update({Symbol(str(key)): value for key, value in annotations.items()})
    try:
        section = _annotations_section(merged)
    except ValueError as exc:
        raise DecodeError(f"modified: annotations that cannot be encoded: {exc}", INVALID_FIELD) from None
    shift = len(section) - (layout.bare - layout.h)
    prefix = _PREFIX.pack(
        layout.kind, layout.h, layout.bare + shift, layout.ap + shift, layout.b + shift, layout.ins + shift
    )
    return message.reencoded(prefix + encoded[_P : layout.h] + section + encoded[layout.bare :])


def payload(message: Message) -> bytes:
    """An AMQP 1.0 message's payload as it was received, less delivery-annotations
    (for tests and tools)."""
    encoded = message.encoded
    layout = _Layout(encoded)
    if layout.kind == _MANY_DATA:
        return encoded[_P:]
    return encoded[_P : layout.ins] + message.body + encoded[layout.ins :]


__all__ = [
    "AMQP10",
    "AMQP10_TYPE",
    "Amqp10Format",
    "address_fields",
    "annotated",
    "decode_transfer",
    "delivery_delay",
    "delivery_time",
    "delivery_time_of",
    "encode_transfer",
    "message_subject",
    "message_to",
    "payload",
    "utf8_safe",
]
