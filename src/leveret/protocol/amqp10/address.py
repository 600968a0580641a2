"""Node addresses as RabbitMQ 4 reads them (its "AMQP 1.0" docs, address v2), and the
v1 addresses of RabbitMQ 3.x's plugin, which RabbitMQ 4 still takes (deprecated).

v2, each segment percent-encoded (RFC 3986):

- ``/exchanges/:exchange/:routing-key``: a target, publishing with that routing key;
- ``/exchanges/:exchange``: a target, each message's ``subject`` is its routing key;
- ``/queues/:queue``: a target (the default exchange, the queue's name as routing key)
  or a source;
- a null target: each message's ``to`` holds one of the target addresses above.

The default exchange is addressed through ``/queues/:queue`` only: ``/exchanges/`` with
an empty name or ``amq.default`` is refused, as in RabbitMQ 4.

v1 (RabbitMQ 3.x): ``/queue/:queue`` (and a bare queue name) creates a durable queue
when missing; ``/amq/queue/:queue`` names an existing queue; ``/exchange/:x/:key`` and
``/topic/:key`` (``amq.topic``) are targets, or as sources a new exclusive queue bound
with that key. Anything else: :class:`~.errors.LinkFault` ``amqp:invalid-field``.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote

from .errors import INVALID_FIELD, LinkFault

TOPIC_EXCHANGE = "amq.topic"


@dataclass(frozen=True, slots=True)
class Address:
    """A parsed address: ``kind`` ``"queue"`` or ``"exchange"``; ``name`` the queue's or
    exchange's; ``routing_key`` the key a target publishes with (None: each message's
    subject) or the binding key of a v1 exchange source; ``declare``: a v1 queue made
    durable when missing; ``text`` as the peer sent it."""

    kind: str
    name: str
    routing_key: str | None = None
    declare: bool = False
    text: str = ""


def _segment(text: str, address: str) -> str:
    try:
        return unquote(text, errors="strict")
    except UnicodeDecodeError:
        raise LinkFault(
            INVALID_FIELD, f"address '{address[:200]}' is not valid percent-encoded UTF-8"
        ) from None


def parse(address: str, as_source: bool) -> Address:
    """``address`` (a source's when ``as_source``, else a target's or a message's ``to``)
    as :class:`Address`; LinkFault ``amqp:invalid-field`` for one RabbitMQ 4 would not
    take."""
    if address.startswith("/queues/"):
        name = _segment(address[len("/queues/") :], address)
        if name and "/" not in address[len("/queues/") :]:
            return Address("queue", name, name, text=address)
    elif address.startswith("/exchanges/") and not as_source:
        rest = address[len("/exchanges/") :]
        exchange, slash, key = rest.partition("/")
        name = _segment(exchange, address)
        if name and name != "amq.default" and "/" not in key:
            return Address("exchange", name, _segment(key, address) if slash else None, text=address)
        if name in ("", "amq.default"):
            raise LinkFault(INVALID_FIELD, "the default exchange is addressed as /queues/:queue")
    else:
        v1 = _v1(address, as_source)
        if v1 is not None:
            return v1
    raise LinkFault(INVALID_FIELD, f"address '{address[:200]}' is not a RabbitMQ 4 (v2) or v1 address")


def _v1(address: str, as_source: bool) -> Address | None:
    """A RabbitMQ 3.x address (``rabbit_routing_util``'s forms), or None."""
    parts = address.split("/")
    if len(parts) == 1 and address:
        return Address("queue", address, address, declare=True, text=address)
    if parts[0] != "" or len(parts) < 3:
        return None
    kind, rest = parts[1], parts[2:]
    if kind == "queue" and len(rest) == 1 and rest[0]:
        return Address("queue", rest[0], rest[0], declare=True, text=address)
    if kind == "amq" and len(rest) == 2 and rest[0] == "queue" and rest[1]:
        return Address("queue", rest[1], rest[1], text=address)
    if kind == "exchange" and len(rest) in (1, 2) and rest[0]:
        key = rest[1] if len(rest) == 2 else ("#" if as_source else "")
        return Address("exchange", rest[0], key, text=address)
    if kind == "topic" and len(rest) == 1:
        return Address("exchange", TOPIC_EXCHANGE, rest[0], text=address)
    return None
