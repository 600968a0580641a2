"""RabbitMQ 4's management node over AMQP 1.0 (``/management``, HTTP over AMQP): the
requests ``rabbitmq-amqp-python-client`` and RabbitMQ's other AMQP 1.0 clients send to
declare, delete, bind, unbind, purge and read queues and exchanges, answered with
RabbitMQ 4's status codes and bodies (``rabbit_amqp_management``). Sans-I/O: a request
is a method (the message's ``subject``), a target (its ``to``) and a body (its
amqp-value section); :func:`handle_request` carries it out through a core
:class:`~leveret.core.session.Session` (the connection's user and virtual host) and
returns the status code text and the response body (plain Python for an amqp-value).

==============================================  =====================================
request                                         success (body)
==============================================  =====================================
``GET /queues/:q``                              ``200`` (queue info map)
``PUT /queues/:q``                              ``201`` new, ``200`` existing (info)
``DELETE /queues/:q``                           ``200`` (``{message_count}``)
``DELETE /queues/:q/messages`` (purge)          ``200`` (``{message_count}``)
``PUT /exchanges/:x``                           ``204`` (null), new or existing
``DELETE /exchanges/:x``                        ``204``, missing or not
``POST /bindings``                              ``204``
``DELETE /bindings/src=…;dstq=…;key=…;args=…``  ``204``, found or not
``GET /bindings?src=…&dstq=…&key=…``            ``200`` (list of binding maps)
==============================================  =====================================

Failures, as RabbitMQ 4 answers them, with its text as the body: ``400`` a malformed
request or body, a name with CR or LF, any error of the operation itself (a missing
binding end, another connection's exclusive queue, a stream's purge); ``403`` the
default exchange, a reserved ``amq.`` name, the vhost's queue limit; ``404`` a missing
queue (info, purge); ``409`` an inequivalent redeclaration or an invalid queue
argument. A refused *permission* is not a status: :func:`handle_request` raises core's
:class:`~leveret.core.errors.AccessRefused`, and the link layer ends the AMQP session
with ``amqp:unauthorized-access``, as RabbitMQ 4 does. Beyond RabbitMQ: an unknown path
is ``404`` and a known path with another method ``405`` (RabbitMQ's session fails), and
``PUT /auth/tokens`` (OAuth 2 token refresh) is ``501`` (leveret has no OAuth 2).
"""

from __future__ import annotations

import datetime
import decimal
import socket
import uuid
from dataclasses import dataclass
from typing import Any

from leveret.core.errors import AccessRefused, BrokerError, PreconditionFailed
from leveret.core.exchange import DEFAULT_EXCHANGE, exchange_class
from leveret.core.queues import Queue
from leveret.core.session import Session

from .management_paths import (
    BadTarget,
    args_hash,
    binding_location,
    parse_binding_segment,
    split_target,
    unquote,
)
from .performatives import AmqpValue, ApplicationProperties, Composite, Properties
from .types import (
    Array,
    Char,
    Decimal32,
    Decimal64,
    Decimal128,
    Described,
    Float32,
    Timestamp,
    UInt,
    ULong,
)

#: The management node's address (source and target of the link pair).
MANAGEMENT_ADDRESS = "/management"
#: The ``reply-to`` of every request: the response goes back on the paired link
#: (AMQP Link Pair CS 01 §2.1).
REPLY_TO_ME = "$me"
#: The node RabbitMQ reports as a queue's leader and replicas; one leveret is one node
#: (the same name as the HTTP management API's ``node``).
NODE = f"leveret@{socket.gethostname().split('.')[0] or 'localhost'}"

OK, CREATED, NO_CONTENT = "200", "201", "204"
BAD_REQUEST, FORBIDDEN, NOT_FOUND, METHOD_NOT_ALLOWED, CONFLICT = "400", "403", "404", "405", "409"
NOT_IMPLEMENTED = "501"

_DEFAULT_EXCHANGE_REFUSED = "operation not permitted on the default exchange"


class _Answer(Exception):
    """A failed request's status code and text (the response body)."""

    def __init__(self, status: str, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


# -- request and response messages ---------------------------------------------------------


class BadRequestMessage(ValueError):
    """A message on the management link that is no request: no ``subject`` (method)
    or ``to`` (target) string, or a ``reply-to`` other than ``$me``. ``condition`` is
    the AMQP error to detach the link with (``amqp:invalid-field``)."""

    condition = "amqp:invalid-field"


@dataclass(frozen=True, slots=True)
class Request:
    """One management request: ``message_id`` (any AMQP message-id, echoed as the
    response's correlation-id), ``method`` (``GET``, ``PUT``, …), ``target`` (the
    percent-encoded path and query) and ``body`` (the amqp-value section, None if
    absent)."""

    message_id: Any
    method: str
    target: str
    body: Any


def parse_request(sections: list[Any]) -> Request:
    """The request in a message's decoded sections (other sections are ignored, as
    RabbitMQ does). BadRequestMessage when its properties are not a request's."""
    properties, body = None, None
    for section in sections:
        if isinstance(section, Properties):
            properties = section
        elif isinstance(section, AmqpValue):
            body = section.value
    if properties is None:
        raise BadRequestMessage("management request without properties")
    if not isinstance(properties.subject, str) or not properties.subject:
        raise BadRequestMessage("management request without a method (subject)")
    if not isinstance(properties.to, str):
        raise BadRequestMessage("management request without a target (to)")
    if properties.reply_to != REPLY_TO_ME:
        raise BadRequestMessage(f"management request reply-to must be '{REPLY_TO_ME}'")
    return Request(properties.message_id, properties.subject, properties.to, body)


def response_sections(request: Request, status: str, body: Any) -> list[Composite]:
    """The response message's sections, as RabbitMQ 4 sends them: properties with the
    status code as ``subject`` and the request's message-id as ``correlation-id``,
    application properties ``{"http:response": "1.1"}`` and the body as amqp-value."""
    return [
        Properties(subject=status, correlation_id=request.message_id),
        ApplicationProperties({"http:response": "1.1"}),
        AmqpValue(body),
    ]


# -- argument tables -------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """An AMQP 1.0 value as core keeps queue/exchange/binding arguments (AMQP 0-9-1's
    Python values): strings and symbols as ``str``, every integer type as ``int``,
    timestamps as aware datetimes (0-9-1 timestamps are seconds). _Answer 400 for what a
    0-9-1 table cannot hold (described values, decimals, chars, UUIDs, a timestamp
    outside the years 1-9999)."""
    if isinstance(value, Char | uuid.UUID | Described | Decimal32 | Decimal64 | Decimal128):
        raise _Answer(BAD_REQUEST, f"unsupported argument {value!r}")
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, bytes):
        return bytes(value)
    if isinstance(value, Timestamp):
        try:
            return datetime.datetime.fromtimestamp(int(value) // 1000, datetime.UTC)
        except (ValueError, OverflowError, OSError):  # beyond the years a datetime holds
            raise _Answer(BAD_REQUEST, f"unsupported argument {value!r}") from None
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, Array):
        return [_plain(item) for item in value.items]
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return _arguments(value)
    raise _Answer(BAD_REQUEST, f"unsupported argument {value!r}")


def _arguments(value: Any) -> dict:
    """A request's ``arguments`` map as core's arguments; 400 unless a map with string
    (or symbol) keys."""
    if not isinstance(value, dict):
        raise _Answer(BAD_REQUEST, f"unsupported arguments {value!r}")
    out = {}
    for key, item in value.items():
        if not isinstance(key, str):
            raise _Answer(BAD_REQUEST, f"unsupported argument {key!r}")
        out[str(key)] = _plain(item)
    return out


def _amqp(value: Any) -> Any:
    """Core's argument value as an AMQP 1.0 value for a response (RabbitMQ's
    ``mc_amqpl:from_091``): datetimes as timestamps, decimals as strings, tables as
    maps, arrays as lists; the rest as it is (``int`` encodes as long, a larger one as
    ulong, one beyond that as its text)."""
    if isinstance(value, datetime.datetime):
        return Timestamp(int(value.timestamp() * 1000))
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, dict):
        return {str(key): _amqp(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_amqp(item) for item in value]
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    if isinstance(value, Float32):
        return float(value)
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**63:
        return ULong(value) if 0 <= value < 2**64 else str(value)  # beyond a long
    return value


def _decode_fields(body: Any, what: str, fields: dict[str, type]) -> dict[str, Any]:
    """A request body map's known fields, each of its type; 400 (``bad queue property
    …``) for anything else, as RabbitMQ."""
    if not isinstance(body, dict):
        raise _Answer(BAD_REQUEST, f"bad {what} body {body!r}")
    out: dict[str, Any] = {}
    for key, value in body.items():
        wanted = fields.get(key) if isinstance(key, str) else None
        if wanted is None or (wanted is not dict and not isinstance(value, wanted)):
            raise _Answer(BAD_REQUEST, f"bad {what} property {key!r}: {value!r}")
        out[str(key)] = _arguments(value) if wanted is dict else value
    return out


# -- names -----------------------------------------------------------------------------------


def _name(segment: str) -> str:
    try:
        return unquote(segment)
    except BadTarget as exc:
        raise _Answer(BAD_REQUEST, str(exc)) from None


def _no_cr_lf(name: str) -> None:
    if "\n" in name or "\r" in name:
        raise _Answer(BAD_REQUEST, f"Bad name '{name}': line feed and carriage return characters not allowed")


def _not_reserved(kind: str, name: str, vhost: str) -> None:
    if name.startswith("amq."):
        raise _Answer(FORBIDDEN, f"{kind} '{name}' in vhost '{vhost}' starts with reserved prefix 'amq.'")


def _not_default(kind: str, name: str) -> None:
    if kind == "exchange" and name == DEFAULT_EXCHANGE:
        raise _Answer(FORBIDDEN, _DEFAULT_EXCHANGE_REFUSED)


# -- queues ----------------------------------------------------------------------------------


def queue_info(queue: Queue) -> dict[str, Any]:
    """A queue's info map, with RabbitMQ 4's keys and types: ``message_count`` (ulong:
    messages ready), ``consumer_count`` (uint), ``name``, ``vhost``, ``durable``,
    ``auto_delete``, ``exclusive``, ``type`` (``classic``, ``quorum``, ``stream``),
    ``arguments``, ``leader`` and ``replicas`` (this node)."""
    return {
        "leader": NODE,
        "replicas": Array("string", (NODE,)),
        "message_count": ULong(queue.message_count),
        "consumer_count": UInt(len(queue.consumers)),
        "name": queue.name,
        "vhost": queue.host.name,
        "durable": queue.durable,
        "auto_delete": queue.auto_delete,
        "exclusive": queue.exclusive_owner is not None,
        "type": queue.type_name,
        "arguments": {key: _amqp(value) for key, value in queue.arguments.items()},
    }


def _any_access(session: Session, kind: str, name: str) -> None:
    """Any of read, write or configure (a passive declare's check in RabbitMQ 4); the
    last refusal is raised."""
    access = session.access
    try:
        access.read(kind, name)
        return
    except AccessRefused:
        pass
    try:
        access.write(kind, name)
        return
    except AccessRefused:
        pass
    access.configure(kind, name)


def _get_queue(session: Session, name: str) -> tuple[str, Any]:
    _any_access(session, "queue", name)
    queue = session.vhost.queues.get(name)
    if queue is None:
        raise _Answer(NOT_FOUND, f"queue '{name}' in vhost '{session.vhost.name}' not found")
    return OK, queue_info(queue)


_QUEUE_FIELDS: dict[str, type] = {"durable": bool, "exclusive": bool, "auto_delete": bool, "arguments": dict}


def _declare_queue(session: Session, name: str, body: Any) -> tuple[str, Any]:
    fields = _decode_fields(body, "queue", _QUEUE_FIELDS)
    durable = fields.get("durable", True)
    exclusive = fields.get("exclusive", False)
    auto_delete = fields.get("auto_delete", False)
    arguments = fields.get("arguments", {})
    vhost = session.vhost
    if not name:
        raise _Answer(BAD_REQUEST, "declare queue with empty name not allowed")
    _no_cr_lf(name)
    _not_reserved("queue", name, vhost.name)
    session.access.configure("queue", name)
    existing = vhost.queues.get(name)
    if existing is not None:
        arguments = _same_queue_type(arguments, existing)
    try:
        queue = session.declare_queue(name, False, durable, exclusive, auto_delete, arguments)
    except PreconditionFailed as exc:
        limit = vhost.limits.get("max-queues", -1)
        if existing is None and 0 <= limit <= len(vhost.queues):
            raise _Answer(FORBIDDEN, exc.text) from None
        raise _Answer(CONFLICT, exc.text) from None
    except AccessRefused:
        raise
    except BrokerError as exc:
        raise _Answer(BAD_REQUEST, exc.text) from None
    return (OK if existing is not None else CREATED), queue_info(queue)


def _same_queue_type(arguments: dict, existing: Queue) -> dict:
    """``x-queue-type`` naming the existing queue's own type is equivalent whether or
    not the queue was declared with it (RabbitMQ 4 adds the default type to every
    declaration; a queue declared over AMQP 0-9-1 without it is a classic queue)."""
    given, kept = arguments.get("x-queue-type"), existing.arguments.get("x-queue-type")
    if given == kept:
        return arguments
    if given is None and kept == existing.type_name:
        return {**arguments, "x-queue-type": kept}
    if kept is None and given == existing.type_name:
        return {key: value for key, value in arguments.items() if key != "x-queue-type"}
    return arguments


def _delete_queue(session: Session, name: str) -> tuple[str, Any]:
    _no_cr_lf(name)
    try:
        count = session.delete_queue(name)
    except AccessRefused:
        raise
    except BrokerError as exc:
        raise _Answer(BAD_REQUEST, exc.text) from None
    return OK, {"message_count": ULong(count)}


def _purge_queue(session: Session, name: str) -> tuple[str, Any]:
    session.access.read("queue", name)
    vhost = session.vhost
    if name not in vhost.queues:
        raise _Answer(NOT_FOUND, f"no queue '{name}' in vhost '{vhost.name}'")
    try:
        count = session.readable_queue(name).purge()
    except AccessRefused:
        raise
    except BrokerError as exc:
        raise _Answer(BAD_REQUEST, exc.text) from None
    return OK, {"message_count": ULong(count)}


# -- exchanges -------------------------------------------------------------------------------

_EXCHANGE_FIELDS: dict[str, type] = {
    "type": str,
    "durable": bool,
    "auto_delete": bool,
    "internal": bool,
    "arguments": dict,
}


def _declare_exchange(session: Session, name: str, body: Any) -> tuple[str, Any]:
    fields = _decode_fields(body, "exchange", _EXCHANGE_FIELDS)
    vhost = session.vhost
    type_name = str(fields.get("type", "direct"))
    try:
        exchange_class(type_name)
    except BrokerError as exc:
        raise _Answer(BAD_REQUEST, exc.text) from None
    _not_default("exchange", name)
    session.access.configure("exchange", name)
    if name not in vhost.exchanges:
        _no_cr_lf(name)
        _not_reserved("exchange", name, vhost.name)
    try:
        session.declare_exchange(
            name,
            type_name,
            False,
            fields.get("durable", True),
            fields.get("auto_delete", False),
            fields.get("internal", False),
            fields.get("arguments", {}),
        )
    except PreconditionFailed as exc:
        raise _Answer(CONFLICT, exc.text) from None
    except AccessRefused:
        raise
    except BrokerError as exc:
        raise _Answer(BAD_REQUEST, exc.text) from None
    return NO_CONTENT, None


def _delete_exchange(session: Session, name: str) -> tuple[str, Any]:
    _no_cr_lf(name)
    _not_default("exchange", name)
    _not_reserved("exchange", name, session.vhost.name)
    try:
        session.delete_exchange(name)
    except AccessRefused:
        raise
    except BrokerError as exc:
        raise _Answer(BAD_REQUEST, exc.text) from None
    return NO_CONTENT, None


# -- bindings --------------------------------------------------------------------------------


def _binding_checks(session: Session, source: str, kind: str, destination: str, key: str) -> None:
    """RabbitMQ 4's checks before any binding operation: the default exchange at either
    end (403), CR or LF in either name (400); core's session then checks the
    permissions (write on the destination, read on the source, topic read)."""
    for end_kind, end_name in (("exchange", source), (kind, destination)):
        _not_default(end_kind, end_name)
        _no_cr_lf(end_name)


_BINDING_FIELDS: dict[str, type] = {
    "source": str,
    "destination_queue": str,
    "destination_exchange": str,
    "binding_key": str,
    "arguments": dict,
}


def _bind(session: Session, body: Any) -> tuple[str, Any]:
    fields = _decode_fields(body, "binding", _BINDING_FIELDS)
    if "source" not in fields or "binding_key" not in fields:
        raise _Answer(BAD_REQUEST, "binding without source or binding_key")
    if "destination_queue" in fields:
        kind, destination = "queue", fields["destination_queue"]
    elif "destination_exchange" in fields:
        kind, destination = "exchange", fields["destination_exchange"]
    else:
        raise _Answer(BAD_REQUEST, "binding without destination_queue or destination_exchange")
    source, key = str(fields["source"]), str(fields["binding_key"])
    destination = str(destination)
    _binding_checks(session, source, kind, destination, key)
    try:
        session.bind(source, kind, destination, key, fields.get("arguments", {}))
    except AccessRefused:
        raise
    except BrokerError as exc:
        raise _Answer(BAD_REQUEST, exc.text) from None
    return NO_CONTENT, None


def _bindings_between(session: Session, source: str, kind: str, destination: str) -> list:
    exchange = session.vhost.exchanges.get(source)
    if exchange is None:
        return []
    return [
        binding
        for binding in exchange.bindings.values()
        if binding.destination.name == destination
        and (isinstance(binding.destination, Queue) == (kind == "queue"))
    ]


def _unbind(session: Session, segment: str) -> tuple[str, Any]:
    try:
        ref = parse_binding_segment(segment)
    except BadTarget as exc:
        raise _Answer(BAD_REQUEST, str(exc)) from None
    _binding_checks(session, ref.source, ref.kind, ref.destination, ref.key)
    session.check_binding(ref.source, ref.kind, ref.destination, ref.key)
    for binding in _bindings_between(session, ref.source, ref.kind, ref.destination):
        if binding.routing_key == ref.key and args_hash(binding.arguments) == ref.args_hash:
            try:
                session.unbind(ref.source, ref.kind, ref.destination, ref.key, binding.arguments)
            except AccessRefused:
                raise
            except BrokerError as exc:
                raise _Answer(BAD_REQUEST, exc.text) from None
            break
    return NO_CONTENT, None


def _list_bindings(session: Session, query: dict[str, str]) -> tuple[str, Any]:
    if "src" not in query or "key" not in query:
        raise _Answer(BAD_REQUEST, f"missing 'src' or 'key' in query: {query!r}")
    if "dste" in query:
        kind, destination = "exchange", query["dste"]
    elif "dstq" in query:
        kind, destination = "queue", query["dstq"]
    else:
        raise _Answer(BAD_REQUEST, f"missing 'dste' or 'dstq' in query: {query!r}")
    source, key = query["src"], query["key"]
    _binding_checks(session, source, kind, destination, key)
    session.check_binding(source, kind, destination, key)
    found = []
    for binding in _bindings_between(session, source, kind, destination):
        if binding.routing_key != key:
            continue
        found.append(
            {
                "source": source,
                f"destination_{kind}": destination,
                "binding_key": key,
                "arguments": {k: _amqp(v) for k, v in binding.arguments.items()},
                "location": binding_location(source, kind, destination, key, binding.arguments),
            }
        )
    return OK, found


# -- dispatch --------------------------------------------------------------------------------


def _route(
    session: Session, method: str, segments: list[str], query: dict[str, str], body: Any
) -> tuple[str, Any]:
    match segments:
        case ["queues", quoted]:
            name = _name(quoted)
            if method == "GET":
                return _get_queue(session, name)
            if method == "PUT":
                return _declare_queue(session, name, body)
            if method == "DELETE":
                return _delete_queue(session, name)
        case ["queues", quoted, "messages"]:
            if method == "DELETE":
                return _purge_queue(session, _name(quoted))
        case ["exchanges", quoted]:
            name = _name(quoted)
            if method == "PUT":
                return _declare_exchange(session, name, body)
            if method == "DELETE":
                return _delete_exchange(session, name)
        case ["bindings"]:
            if method == "POST":
                return _bind(session, body)
            if method == "GET":
                return _list_bindings(session, query)
        case ["bindings", segment]:
            if method == "DELETE":
                return _unbind(session, segment)
        case ["auth", "tokens"]:
            if method == "PUT":
                raise _Answer(NOT_IMPLEMENTED, "token refresh needs OAuth 2, which leveret does not have")
        case _:
            raise _Answer(NOT_FOUND, f"no management resource '/{'/'.join(segments)}'")
    raise _Answer(METHOD_NOT_ALLOWED, f"method {method} not allowed on '/{'/'.join(segments)}'")


def handle_request(session: Session, method: str, path: str, body: Any) -> tuple[str, Any]:
    """Carry out one management request as ``session``'s user in its virtual host:
    ``method`` (``GET``, ``PUT``, ``POST``, ``DELETE``), ``path`` (the request target,
    percent-encoded, with any query) and ``body`` (the decoded amqp-value, None for
    none). Returns the status code text (``"200"``, ``"201"``, ``"204"``, ``"400"``,
    ``"403"``, ``"404"``, ``"405"``, ``"409"``, ``"501"``) and the response body: the
    info map, list or null on success, RabbitMQ's error text on failure. Raises
    :class:`~leveret.core.errors.AccessRefused` when a permission is refused (the
    session must end with ``amqp:unauthorized-access``)."""
    try:
        segments, query = split_target(path)
        return _route(session, method, segments, query, body)
    except BadTarget as exc:
        return BAD_REQUEST, str(exc)
    except _Answer as answer:
        return answer.status, answer.text


__all__ = [
    "MANAGEMENT_ADDRESS",
    "NODE",
    "REPLY_TO_ME",
    "BadRequestMessage",
    "Request",
    "handle_request",
    "parse_request",
    "queue_info",
    "response_sections",
]
