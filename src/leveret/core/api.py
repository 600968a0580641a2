"""leveret's broker extensions over plain AMQP: JSON requests to ``amq.leveret.api``.

A client publishes to the exchange ``amq.leveret.api`` with the operation as routing
key, a JSON object as body, ``reply_to`` (a queue, or RabbitMQ's direct reply-to) and
optionally ``correlation_id``; the broker answers on the default exchange to
``reply_to`` with ``{"ok": true, ...}`` or, for a bad request, ``{"ok": false, "error":
"..."}`` (a bug instead closes the connection with 541, see :func:`handle`). Any AMQP
client can use it; the Spark connector does. Operations, in the connection's vhost:

- ``stream.info`` ``{"stream"}`` → ``{"first", "next", "messages"}`` offsets of a stream
- ``lease.acquire`` ``{"queue", "group", "max", "ttl_ms"?}`` → ``{"start", "end"}``
- ``lease.ack`` ``{"queue", "group", "upto", "from"?}`` (held leases ``from`` … ``upto``,
  from the first by default) or ``{..., "seqs": [...]}`` → ``{"acked"}``
- ``lease.release`` ``{"queue", "group", "seqs": [...], "failed"?}`` → ``{"released"}``
  (``failed``, default true: the messages count as failed deliveries, toward the delivery
  limit; false: a plain return)
- ``lease.info`` ``{"queue", "group"}`` → ``{"next", "held"}``

See :mod:`leveret.core.queues.features.leases` for what a lease is.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeGuard

from .errors import BrokerError
from .message import Message, Properties
from .queues import Queue, StreamQueue
from .session import Session

API_EXCHANGE = "amq.leveret.api"


_KINDS = {int: "an integer", str: "a string", list: "a list", bool: "a boolean"}
# Sequence numbers and offsets are SQLite integers: none can be larger.
MAX_INT = 2**63 - 1
# A lease's TTL, as RabbitMQ bounds its TTLs (Erlang's timer limit): about 49.7 days.
MAX_TTL_MS = 2**32 - 1
_REQUIRED = object()


class APIError(ValueError):
    """A request the broker cannot carry out; its text goes back to the client."""


def _field(request: dict, name: str, kind: type) -> Any:
    """Field ``name`` of type ``kind``; APIError if missing or of another type."""
    value = request.get(name)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise APIError(f"'{name}' must be {_KINDS.get(kind, kind.__name__)}")
    return value


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)  # JSON true is no number


def _integer(
    request: dict, name: str, minimum: int = 0, maximum: int = MAX_INT, default: Any = _REQUIRED
) -> int:
    """Integer field ``name`` with ``minimum <= value <= maximum`` (``default`` when
    absent, if given); APIError if missing, not an integer, or out of range."""
    if default is not _REQUIRED and name not in request:
        return default
    value = request.get(name)
    if not _is_int(value):
        raise APIError(f"'{name}' must be an integer")
    if not minimum <= value <= maximum:
        raise APIError(f"'{name}' must be an integer from {minimum} to {maximum}")
    return value


def _seqs(request: dict) -> list[int]:
    """Field ``seqs``: a list of sequence numbers (integers from 0 to MAX_INT); APIError
    otherwise."""
    seqs = request.get("seqs")
    if not isinstance(seqs, list) or not all(_is_int(s) and 0 <= s <= MAX_INT for s in seqs):
        raise APIError(f"'seqs' must be a list of integers from 0 to {MAX_INT}")
    return seqs


def _queue(session: Session, request: dict) -> Queue:
    """The request's queue: every operation reads it (read permission, as consuming)."""
    return session.readable_queue(_field(request, "queue", str))


def _stream_info(session: Session, request: dict) -> dict:
    stream = session.readable_queue(_field(request, "stream", str))
    if not isinstance(stream, StreamQueue):
        raise APIError(f"'{stream.name}' is not a stream")
    return {"first": stream.first_offset, "next": stream.next_offset, "messages": stream.message_count}


def _lease_acquire(session: Session, request: dict) -> dict:
    queue = _queue(session, request)
    maximum = _integer(request, "max")
    group = _field(request, "group", str)
    ttl = request.get("ttl_ms")
    if ttl is not None and not (_is_int(ttl) and 0 < ttl <= MAX_TTL_MS):
        raise APIError(f"'ttl_ms' must be a positive integer up to {MAX_TTL_MS}")
    start, end = queue.lease(group).acquire(maximum, ttl / 1000 if ttl else None)
    return {"start": start, "end": end}


def _lease_ack(session: Session, request: dict) -> dict:
    queue, group = _queue(session, request), _field(request, "group", str)
    if "seqs" in request:
        seqs = _seqs(request)
        return {"acked": queue.lease(group).ack(seqs)}
    low, upto = _integer(request, "from", default=0), _integer(request, "upto")
    return {"acked": queue.lease(group).ack_upto(upto, low)}


def _lease_release(session: Session, request: dict) -> dict:
    queue, group = _queue(session, request), _field(request, "group", str)
    seqs = _seqs(request)
    failed = _field(request, "failed", bool) if "failed" in request else True
    return {"released": queue.lease(group).release(seqs, failed)}


def _lease_info(session: Session, request: dict) -> dict:
    lease = _queue(session, request).lease(_field(request, "group", str))
    return {"next": lease.next_seq, "held": len(lease.held)}


OPERATIONS: dict[str, Callable[[Session, dict], dict]] = {
    "stream.info": _stream_info,
    "lease.acquire": _lease_acquire,
    "lease.ack": _lease_ack,
    "lease.release": _lease_release,
    "lease.info": _lease_info,
}


def handle(session: Session, request: Message) -> Message | None:
    """Carry out one request for ``session`` (its user's permissions apply: every
    operation reads its queue); returns the reply to route (None without reply_to).

    Bad requests are answered ``{"ok": false, "error": ...}``: an unknown operation, a
    body that is not a JSON object, a field missing, of the wrong type or out of range
    (:class:`APIError`), and broker errors such as a missing or locked queue
    (:class:`~.errors.BrokerError`, whose condition comes as ``"condition"``, e.g.
    ``not_found``). Any other exception is
    a bug in leveret and propagates, so it is seen: the server logs it and closes this
    connection with 541 INTERNAL_ERROR.
    """
    properties = request.properties
    try:
        reply = {"ok": True, **_carry_out(session, request)}
    except APIError as exc:
        reply = {"ok": False, "error": str(exc)}
    except BrokerError as exc:
        reply = {"ok": False, "error": f"{exc.condition.upper()} - {exc.text}", "condition": exc.condition}
    if not properties.reply_to:
        return None
    return Message.build(
        "",
        properties.reply_to,
        json.dumps(reply).encode(),
        Properties(content_type="application/json", correlation_id=properties.correlation_id),
    )


def _carry_out(session: Session, request: Message) -> dict:
    operation = OPERATIONS.get(request.routing_key)
    if operation is None:
        raise APIError(f"unknown operation '{request.routing_key}'")
    try:
        body = json.loads(request.body or b"{}")
    except ValueError as exc:  # JSONDecodeError, or UnicodeDecodeError for bad UTF-8
        raise APIError(f"the request body is not JSON: {exc}") from None
    except RecursionError:  # nesting too deep for the parser: bad input, not a bug
        raise APIError("the request body nests too deeply") from None
    if not isinstance(body, dict):
        raise APIError("the request body must be a JSON object")
    return operation(session, body)
