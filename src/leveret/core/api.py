"""leveret's broker extensions over plain AMQP: JSON requests to ``amq.leveret.api``.

A client publishes to the exchange ``amq.leveret.api`` with the operation as routing
key, a JSON object as body, ``reply_to`` (a queue, or RabbitMQ's direct reply-to) and
optionally ``correlation_id``; the broker answers on the default exchange to
``reply_to`` with ``{"ok": true, ...}`` or ``{"ok": false, "error": "..."}``. Any AMQP
client can use it; the Spark connector does. Operations, in the connection's vhost:

- ``stream.info`` ``{"stream"}`` → ``{"first", "next", "messages"}`` offsets of a stream
- ``lease.acquire`` ``{"queue", "group", "max", "ttl_ms"?}`` → ``{"start", "end"}``
- ``lease.ack`` ``{"queue", "group", "upto", "from"?}`` (held leases ``from`` … ``upto``,
  from the first by default) or ``{..., "seqs": [...]}`` → ``{"acked"}``
- ``lease.release`` ``{"queue", "group", "seqs": [...]}`` → ``{"released"}``
- ``lease.info`` ``{"queue", "group"}`` → ``{"next", "held"}``

See :mod:`leveret.core.lease` for what a lease is.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from .errors import BrokerError
from .message import Message, Properties
from .vhost import VirtualHost

API_EXCHANGE = "amq.leveret.api"


_KINDS = {int: "an integer", str: "a string", list: "a list"}


class APIError(ValueError):
    """A request the broker cannot carry out; its text goes back to the client."""


def _field(request: dict, name: str, kind: type) -> Any:
    value = request.get(name)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
        raise APIError(f"'{name}' must be {_KINDS.get(kind, kind.__name__)}")
    return value


def _queue(vhost: VirtualHost, request: dict, owner: Any) -> Any:
    return vhost.get_queue(_field(request, "queue", str), owner)


def _stream_info(vhost: VirtualHost, request: dict, owner: Any) -> dict:
    stream = vhost.get_queue(_field(request, "stream", str), owner)
    if getattr(stream, "first_offset", None) is None:
        raise APIError(f"'{stream.name}' is not a stream")
    return {"first": stream.first_offset, "next": stream.next_offset,
            "messages": stream.message_count}


def _lease_acquire(vhost: VirtualHost, request: dict, owner: Any) -> dict:
    queue = _queue(vhost, request, owner)
    maximum = _field(request, "max", int)
    ttl = request.get("ttl_ms")
    if ttl is not None and (not isinstance(ttl, int) or ttl <= 0):
        raise APIError("'ttl_ms' must be a positive integer")
    start, end = queue.lease(_field(request, "group", str)).acquire(
        maximum, ttl / 1000 if ttl else None)
    return {"start": start, "end": end}


def _lease_ack(vhost: VirtualHost, request: dict, owner: Any) -> dict:
    lease = _queue(vhost, request, owner).lease(_field(request, "group", str))
    if "seqs" in request:
        return {"acked": lease.ack([int(s) for s in _field(request, "seqs", list)])}
    low = request.get("from", 0)
    if not isinstance(low, int) or isinstance(low, bool):
        raise APIError("'from' must be an integer")
    return {"acked": lease.ack_upto(_field(request, "upto", int), low)}


def _lease_release(vhost: VirtualHost, request: dict, owner: Any) -> dict:
    lease = _queue(vhost, request, owner).lease(_field(request, "group", str))
    return {"released": lease.release([int(s) for s in _field(request, "seqs", list)])}


def _lease_info(vhost: VirtualHost, request: dict, owner: Any) -> dict:
    lease = _queue(vhost, request, owner).lease(_field(request, "group", str))
    return {"next": lease.next_seq, "held": len(lease.held)}


OPERATIONS: dict[str, Callable[[VirtualHost, dict, Any], dict]] = {
    "stream.info": _stream_info, "lease.acquire": _lease_acquire, "lease.ack": _lease_ack,
    "lease.release": _lease_release, "lease.info": _lease_info,
}


def handle(vhost: VirtualHost, request: Message, owner: Any) -> Message | None:
    """Carry out one request; returns the reply to route (None without reply_to)."""
    properties = request.properties
    try:
        operation = OPERATIONS.get(request.routing_key)
        if operation is None:
            raise APIError(f"unknown operation '{request.routing_key}'")
        body = json.loads(request.body or b"{}")
        if not isinstance(body, dict):
            raise APIError("the request body must be a JSON object")
        reply = {"ok": True, **operation(vhost, body, owner)}
    except BrokerError as exc:
        reply = {"ok": False, "error": f"{exc.condition.upper()} - {exc.text}"}
    except Exception as exc:  # noqa: BLE001 - any bad request is answered, never fatal
        reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    if not properties.reply_to:
        return None
    return Message.build("", properties.reply_to, json.dumps(reply).encode(), Properties(
        content_type="application/json", correlation_id=properties.correlation_id))
