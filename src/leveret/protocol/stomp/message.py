"""STOMP's form of core messages, and the MESSAGE frames messages go out as.

A SEND becomes a :class:`~leveret.core.message.Message` whose encoded form is the
header block it will be delivered with (``name:value`` lines, escaped as STOMP 1.2
escapes them): the client's headers less those that address the frame (``destination``,
``receipt``, ``transaction``, ``content-length``, …), plus what the broker fills in as
ActiveMQ does (``message-id``, ``timestamp``, ``expires``, ``priority``,
``persistent``). A STOMP consumer gets that block as it is, with the per-delivery
headers (``destination``, ``subscription``, ``ack``, ``redelivered``,
``content-length``) in front; an AMQP consumer gets the neutral properties decoded from
it, and an AMQP message consumed over STOMP is rendered from its properties.

Header ↔ property mapping (ActiveMQ's JMS headers; RabbitMQ's STOMP plugin maps the
same ones): ``persistent:true`` ↔ ``delivery_mode`` 2, ``priority`` (0-9, JMS default 4),
``expires`` (absolute epoch ms, ActiveMQ) or ``expiration`` (relative ms, RabbitMQ) ↔ the
message's TTL, ``correlation-id``, ``reply-to``, ``type``, ``content-type``,
``message-id``, ``timestamp`` (epoch ms) ↔ their AMQP properties, every other header ↔
an application header (a string).
"""

from __future__ import annotations

import datetime
import decimal
import functools
import itertools
import time
from typing import Any

from ...core.errors import precondition_failed
from ...core.message import HeaderFormat, Message, Properties, register_format
from .destinations import TEMP_QUEUE_PREFIX, TEMP_TOPIC_PREFIX
from .frames import escape, unescape

#: SEND headers that address the frame, not the message (never stored nor echoed).
FRAME_HEADERS = frozenset(
    (
        "destination",
        "receipt",
        "transaction",
        "content-length",
        "message-id",
        "redelivered",
        "subscription",
        "ack",
        "expiration",
    )
)
#: Headers a MESSAGE carries for one delivery only.
DELIVERY_HEADERS = frozenset(("destination", "subscription", "ack", "redelivered", "content-length"))

_PROPERTY_HEADERS = {
    "correlation-id": "correlation_id",
    "reply-to": "reply_to",
    "type": "type",
    "content-type": "content_type",
    "message-id": "message_id",
}
DEFAULT_PRIORITY = 4  # JMS's
#: The line that marks a JMS text message in a stored header block (ActiveMQ's
#: ``amq-msg-type``; AMQP consumers see it as a header too).
TEXT_MARK = "amq-msg-type:text"


def is_text(message: Message) -> bool:
    """Whether a message sent over STOMP was a text message (MESSAGE without
    content-length, as ActiveMQ sends a TextMessage), which needs a body without NUL."""
    return (
        message.format is STOMP and b"\namq-msg-type:text\n" in message.encoded and b"\0" not in message.body
    )


class StompFormat(HeaderFormat):
    """The MESSAGE header block (see the module doc) as a message's encoded form."""

    name = "stomp"

    def properties(self, message: Message) -> Properties:
        """Neutral properties from the stored headers; ``expiration`` is the TTL the
        message was published with (relative ms, as AMQP carries it)."""
        headers = decode_block(message.encoded)
        properties = Properties(headers={})
        assert properties.headers is not None
        for name, value in headers.items():
            field = _PROPERTY_HEADERS.get(name)
            if field is not None:
                setattr(properties, field, value)
            elif name == "persistent":
                properties.delivery_mode = 2 if value == "true" else 1
            elif name == "priority":
                properties.priority = message.priority
            elif name == "timestamp":
                properties.timestamp = _from_epoch_ms(value)
            elif name != "expires":
                properties.headers[name] = value
        if properties.delivery_mode is None:
            properties.delivery_mode = 1
        if message.ttl is not None:
            properties.expiration = str(message.ttl)
        return properties

    def with_headers(self, message: Message, changes: dict[str, Any]) -> Message:
        """A copy whose header block has ``changes`` applied (a value replaces the
        header, None removes it); the broker's first lines stay first."""
        names = {escape(name, "1.2").encode() for name in changes}
        lines = [
            line for line in message.encoded.split(b"\n") if line and line.partition(b":")[0] not in names
        ]
        for name, value in changes.items():
            if value is not None:
                lines.append(f"{escape(name, '1.2')}:{escape(str(value), '1.2')}".encode())
        return message.reencoded(b"".join(line + b"\n" for line in lines))

    def restore(self, exchange: str, routing_key: str, encoded: bytes, body: bytes) -> Message:
        """A message read back from the store: its facts from the stored headers (the
        TTL is what was left at publish; the store keeps the absolute expiry)."""
        headers = _facts(encoded)
        return Message(
            exchange,
            routing_key,
            body,
            self,
            encoded,
            headers.get("persistent") == "true",
            _ttl_from(headers, int(time.time() * 1000)),
            _int(headers.get("priority"), DEFAULT_PRIORITY),
        )


STOMP = StompFormat()
register_format(STOMP)


def decode_block(block: bytes) -> dict[str, str]:
    """The headers of a stored block (1.2 escaping; the first of a repeated name wins)."""
    headers: dict[str, str] = {}
    for line in block.decode().split("\n"):
        if line:
            name, _, value = line.partition(":")
            headers.setdefault(unescape(name, "1.2"), unescape(value, "1.2"))
    return headers


_FACTS = (b"priority", b"expires", b"persistent", b"expiration")


def _facts(block: bytes) -> dict[str, str]:
    """The headers a message's facts come from (priority, expiry, persistence), read
    from the first lines of a stored block, where :func:`from_send` writes them,
    without decoding the rest."""
    facts: dict[str, str] = {}
    for line in block.split(b"\n", 6)[:6]:
        name, _, value = line.partition(b":")
        if name in _FACTS and name.decode() not in facts:
            facts[name.decode()] = value.decode()
    return facts


def _int(value: str | None, default: int) -> int:
    try:
        return int(value) if value is not None else default
    except ValueError:
        return default


def _from_epoch_ms(value: str) -> datetime.datetime | None:
    try:
        return datetime.datetime.fromtimestamp(int(value) / 1000, datetime.UTC)
    except (ValueError, OverflowError, OSError):
        return None


def _ttl_from(headers: dict[str, str], now_ms: int) -> int | None:
    """The TTL in ms from ``expires`` (absolute; 0 never) or ``expiration`` (relative)."""
    expires = headers.get("expires")
    if expires is not None and expires.strip() not in ("", "0"):
        try:
            return max(0, int(expires) - now_ms)
        except ValueError:
            raise precondition_failed(f"invalid expires '{expires}': not an integer") from None
    expiration = headers.get("expiration")
    if expiration is not None:
        try:
            ttl = int(expiration)
        except ValueError:
            raise precondition_failed(f"invalid expiration '{expiration}': not an integer") from None
        if ttl < 0:
            raise precondition_failed(f"invalid expiration '{expiration}': negative")
        return ttl
    return None


class MessageIds:
    """ActiveMQ-style message ids for one connection: ``ID:<session>:<n>``
    (``prefix`` is the part before the number)."""

    def __init__(self, session: str) -> None:
        self.prefix = f"ID:{session}:"
        self._escaped = escape(self.prefix, "1.2")
        self._counter = itertools.count(1)

    def next(self) -> str:
        """The next id as a 1.2 header value (escaped, as a header block holds it)."""
        return f"{self._escaped}{next(self._counter)}"


def from_send(
    exchange: str, routing_key: str, headers: dict[str, str], body: bytes, message_id: str
) -> Message:
    """The message of a SEND (see the module doc); ``message_id`` is escaped already
    (:meth:`MessageIds.next`). Raises PreconditionFailed for a ``priority`` outside
    0-9 or an ``expires``/``expiration`` that is not an integer."""
    now_ms = int(time.time() * 1000)
    ttl = _ttl_from(headers, now_ms) if "expires" in headers or "expiration" in headers else None
    key = tuple(
        (name, "" if name == "content-length" else value)
        for name, value in headers.items()
        if name not in _PER_FRAME
    )
    priority, persistent, rest = _send_form(key)
    timestamp = headers.get("timestamp")
    timestamp = escape(timestamp, "1.2") if timestamp else str(now_ms)
    expires = now_ms + ttl if ttl is not None else 0
    block = (
        f"message-id:{message_id}\npriority:{priority}\nexpires:{expires}\ntimestamp:{timestamp}\n"
    ).encode() + rest
    return Message(exchange, routing_key, body, STOMP, block, persistent, ttl, priority)


@functools.lru_cache(maxsize=256)
def _send_form(items: tuple[tuple[str, str], ...]) -> tuple[int, bool, bytes]:
    """What a SEND's headers make of a message besides its id and times: priority,
    persistence and the rest of its header block (``persistent``, the text mark, the
    client's headers), worked out once for a producer that sends the same headers
    again and again."""
    headers = dict(items)
    priority_text = headers.get("priority")
    priority = DEFAULT_PRIORITY
    if priority_text is not None:
        try:
            priority = int(priority_text)
        except ValueError:
            raise precondition_failed(f"invalid priority '{priority_text}': not an integer") from None
        if not 0 <= priority <= 9:
            raise precondition_failed(f"invalid priority '{priority_text}': not between 0 and 9")
    persistent = headers.get("persistent") == "true"
    # ActiveMQ: a SEND without content-length (or amq-msg-type:text) is a JMS text message
    # and goes out without one; with it, a bytes message
    kind = headers.get("amq-msg-type")
    text = kind == "text" or (kind is None and "content-length" not in headers)
    lines = []
    if persistent:
        lines.append("persistent:true")
    if text:
        lines.append(TEXT_MARK)
    lines += [
        f"{escape(name, '1.2')}:{escape(value, '1.2')}"
        for name, value in items
        if name not in FRAME_HEADERS and name not in _BROKER_SET
    ]
    return priority, persistent, "".join(line + "\n" for line in lines).encode()


#: SEND headers that differ from frame to frame and that _send_form does not use
#: (content-length counts by its presence only).
_PER_FRAME = frozenset(("receipt", "transaction", "timestamp", "expires", "expiration"))
#: SEND headers the broker writes itself in the block (from the client's values or not).
_BROKER_SET = frozenset(("priority", "expires", "persistent", "timestamp", "amq-msg-type"))


def queue_destination(name: str) -> str:
    """The STOMP name of queue ``name`` (another connection's temporary queue is
    ``/remote-temp-queue/``)."""
    if name.startswith(TEMP_QUEUE_PREFIX):
        return "/remote-temp-queue/" + name
    return "/queue/" + name


def destination_of(message: Message) -> str:
    """The STOMP destination a message was sent to, from its address: the default
    exchange is ``/queue/<key>``, ``amq.topic`` is ``/topic/<key>``, any other exchange
    ``/exchange/<name>/<key>`` (RabbitMQ's STOMP name)."""
    if message.exchange == "":
        return queue_destination(message.routing_key)
    if message.exchange == "amq.topic":
        if message.routing_key.startswith(TEMP_TOPIC_PREFIX):
            return "/remote-temp-topic/" + message.routing_key
        return "/topic/" + message.routing_key
    return f"/exchange/{message.exchange}/{message.routing_key}"


def header_block(message: Message, expires_at: float, fallback_id: str) -> bytes:
    """The message's own headers for a MESSAGE frame (1.2 escaping): its stored block
    when it was sent over STOMP, else rendered from its properties (``expires_at``:
    the queue's expiry in epoch seconds, 0 none; ``fallback_id`` the message id when
    the message has none). Deaths add ActiveMQ's DLQ headers."""
    if message.format is STOMP:
        block = message.encoded
    else:
        block = _render_properties(message, expires_at, fallback_id)
    if message.deaths:
        block = _with_death_headers(block, message)
    return block


def _render_properties(message: Message, expires_at: float, fallback_id: str) -> bytes:
    properties = message.properties
    lines = [
        f"message-id:{escape(properties.message_id or fallback_id, '1.2')}",
        f"priority:{message.priority if message.priority is not None else DEFAULT_PRIORITY}",
        f"expires:{int(expires_at * 1000) if expires_at else 0}",
    ]
    if properties.timestamp is not None:
        lines.append(f"timestamp:{int(properties.timestamp.timestamp() * 1000)}")
    if message.persistent:
        lines.append("persistent:true")
    for header, field in _PROPERTY_HEADERS.items():
        value = getattr(properties, field)
        if value is not None and field != "message_id":
            lines.append(f"{header}:{escape(str(value), '1.2')}")
    for name, value in (properties.headers or {}).items():
        text = header_text(value)
        if text is not None and name not in DELIVERY_HEADERS:
            lines.append(f"{escape(name, '1.2')}:{escape(text, '1.2')}")
    return ("\n".join(lines) + "\n").encode()


def header_text(value: Any) -> str | None:
    """An AMQP header value as a STOMP header value (None: nothing a header can hold,
    such as a nested table)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, decimal.Decimal)):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode(errors="replace")
    if isinstance(value, datetime.datetime):
        return str(int(value.timestamp() * 1000))
    return None


def _with_death_headers(block: bytes, message: Message) -> bytes:
    """``block`` as ActiveMQ shows a dead-lettered copy: where it came from
    (``original-destination``), why (``dlqDeliveryFailureCause``), the expiration it
    lost (``originalExpiration``), and no expiry of its own (``expires:0``)."""
    death = message.deaths[-1]
    added = {
        "original-destination": "/queue/" + death.queue,
        "dlqDeliveryFailureCause": death.reason,
        "expires": "0",
    }
    if death.original_expiration is not None:
        added["originalExpiration"] = death.original_expiration
    kept = [
        line
        for line in block.decode().split("\n")
        if line and unescape(line.partition(":")[0], "1.2") not in added
    ]
    lines = [f"{name}:{escape(value, '1.2')}" for name, value in added.items()] + kept
    return ("\n".join(lines) + "\n").encode()
