"""Exchanges, queues and bindings over HTTP, in RabbitMQ 3.10's paths and shapes.

- ``GET /api/exchanges[/{vhost}]``, ``GET|PUT|DELETE /api/exchanges/{vhost}/{name}``
  (``amq.default`` names the default exchange; DELETE takes ``?if-unused=true``);
  ``GET /api/exchanges/{vhost}/{name}/bindings/{source,destination}``
- ``GET /api/queues[/{vhost}]``, ``GET|PUT|DELETE /api/queues/{vhost}/{name}`` (DELETE
  takes ``?if-empty=true``, ``?if-unused=true``), ``GET /api/queues/{vhost}/{name}/bindings``,
  ``DELETE /api/queues/{vhost}/{name}/contents`` (purge)
- ``GET /api/bindings[/{vhost}]``; ``GET|POST /api/bindings/{vhost}/e/{source}/{q|e}/{dest}``
  (POST answers 201 with a ``Location`` ending in the binding's ``properties_key``);
  ``GET|DELETE /api/bindings/{vhost}/e/{source}/{q|e}/{dest}/{properties_key}``

Changes are made as the user, with their AMQP permissions (core's
:class:`~leveret.core.session.Session`), as RabbitMQ's API makes them through an AMQP
channel: a refusal is 401 ``Access refused.``, an inequivalent or invalid declaration
400 with core's text. Lists take RabbitMQ's query parameters (:mod:`.listing`).

``properties_key`` is RabbitMQ's: the routing key (form-quoted, ``~`` as ``%7E``; ``~``
for an empty key without arguments), followed by ``~`` and a hash of the arguments when
there are any. The hash is leveret's own (a 32-bit digest of the arguments' JSON, in
RabbitMQ's base64url form): RabbitMQ's is ``erlang:phash2`` of its Erlang term, which
clients read from the API and never compute.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote_plus, unquote_plus

from aiohttp import web

from ..core.broker import BrokerCore
from ..core.definitions_document import jsonable
from ..core.exchange import DEFAULT_EXCHANGE, Binding, Exchange
from ..core.policy import matching
from ..core.queues import Queue
from ..core.queues.remote import RemoteQueue
from ..core.vhost import VirtualHost
from .cluster_view import queue_node
from .common import (
    amqp,
    arguments,
    boolean,
    flag,
    json_body,
    json_error,
    object_not_found,
    route_vhost,
    session,
    visible_vhosts,
)
from .listing import list_answer, list_response
from .queue_index import QueueIndex
from .rates import LENGTHS, QUEUE_STATS, RateSampler, queue_reading, total_sliced, window, with_details
from .runtime import connection_facts, consumer_rows
from .slicing import Slicer

DEFAULT_EXCHANGE_PATH = "amq.default"  # the default exchange's name in a path


def args_hash(args: dict) -> str:
    """A 32-bit digest of binding arguments, base64url without padding (6 chars)."""
    canonical = json.dumps(jsonable(args), sort_keys=True, separators=(",", ":"), default=str)
    digest = hashlib.sha256(canonical.encode()).digest()[:4]
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def _quote(text: str) -> str:
    return quote_plus(text).replace("~", "%7E")


def properties_key(routing_key: str, args: dict) -> str:
    """RabbitMQ's ``properties_key`` of a binding (see the module doc)."""
    if not args:
        return _quote(routing_key) if routing_key else "~"
    return f"{_quote(routing_key)}~{_quote(args_hash(args))}"


def unpack_properties(key: str) -> tuple[str, str | None] | None:
    """``(routing key, args hash or None)`` of a ``properties_key``; None if it cannot
    be one."""
    if key == "~":
        return "", None
    parts = key.split("~")
    if len(parts) == 1:
        return unquote_plus(parts[0]), None
    if len(parts) == 2:
        return unquote_plus(parts[0]), unquote_plus(parts[1]) or None
    return None


def binding_row(vhost: str, source: str, destination: str, kind: str, key: str, args: dict) -> dict:
    """A binding in RabbitMQ's shape."""
    return {
        "source": source,
        "vhost": vhost,
        "destination": destination,
        "destination_type": kind,
        "routing_key": key,
        "arguments": jsonable(args),
        "properties_key": properties_key(key, args),
    }


def _row(vhost: VirtualHost, binding: Binding) -> dict:
    kind = "queue" if isinstance(binding.destination, Queue) else "exchange"
    return binding_row(
        vhost.name,
        binding.source.name,
        binding.destination.name,
        kind,
        binding.routing_key,
        binding.arguments,
    )


def _order(row: dict) -> tuple:
    """RabbitMQ's order of bindings: source, destination name and kind, routing key."""
    return (
        row["source"],
        row["destination"],
        row["destination_type"],
        row["routing_key"],
        json.dumps(row["arguments"], sort_keys=True),
    )


def _default_row(vhost: VirtualHost, queue: Queue) -> dict:
    """The default exchange's implicit binding of ``queue``."""
    return binding_row(vhost.name, "", queue.name, "queue", queue.name, {})


#: A binding to list: a queue (its implicit binding to the default exchange) or a
#: binding, with its vhost.
BindingHandle = tuple[VirtualHost, "Queue | Binding"]


def _handle_key(handle: BindingHandle) -> tuple:
    """:func:`_order` of the handle's row, without making the row."""
    what = handle[1]
    if isinstance(what, Queue):
        return ("", what.name, "queue", what.name, "{}")
    kind = "queue" if isinstance(what.destination, Queue) else "exchange"
    args = json.dumps(jsonable(what.arguments), sort_keys=True)
    return (what.source.name, what.destination.name, kind, what.routing_key, args)


def _handle_row(handle: BindingHandle) -> dict:
    vhost, what = handle
    return _default_row(vhost, what) if isinstance(what, Queue) else _row(vhost, what)


async def vhost_binding_handles(vhost: VirtualHost, slicer: Slicer) -> list[BindingHandle]:
    """Every binding of ``vhost`` with the default exchange's implicit one per queue,
    in RabbitMQ's order (:func:`_order`), as handles: sorted in slices by keys read
    from the bindings, no rows made (100,000 queues are 100,000 implicit bindings, and
    rows held until sorted were most of a full collection's work)."""
    handles: list[BindingHandle] = [(vhost, q) for q in list(vhost.queues.values())]
    for exchange in list(vhost.exchanges.values()):
        handles += [(vhost, b) for b in list(exchange.bindings.values())]
    return await slicer.take(await slicer.sorted(handles, _handle_key), len(handles))


def queue_binding_rows(vhost: VirtualHost, queue: Queue) -> list[dict]:
    """The bindings to ``queue`` (the default exchange's first), without going
    through every binding of the vhost."""
    rows = [_default_row(vhost, queue), *(_row(vhost, b) for b in queue.bindings)]
    return sorted(rows, key=_order)


def bindings_between(vhost: VirtualHost, source: str, kind: str, destination: str) -> list[dict]:
    """The bindings from exchange ``source`` to the ``kind`` (queue or exchange) named
    ``destination`` (none when either is missing)."""
    if source == DEFAULT_EXCHANGE:
        queue = vhost.queues.get(destination) if kind == "queue" else None
        return [_default_row(vhost, queue)] if queue is not None else []
    exchange = vhost.exchanges.get(source)
    if exchange is None:
        return []
    rows = [
        _row(vhost, b)
        for b in exchange.bindings.values()
        if b.destination.name == destination and isinstance(b.destination, Queue) == (kind == "queue")
    ]
    return sorted(rows, key=_order)


def exchange_info(vhost: VirtualHost, exchange: Exchange, user: str = "") -> dict:
    info = {
        "name": exchange.name,
        "vhost": vhost.name,
        "type": exchange.type,
        "durable": exchange.durable,
        "auto_delete": exchange.auto_delete,
        "internal": exchange.internal,
        "arguments": jsonable(exchange.arguments),
        "user_who_performed_action": user or "rmq-internal",
    }
    policy = matching(vhost.policies, vhost.name, exchange.name, "exchanges")
    if policy is not None:
        info["policy"] = policy.name
    return info


def queue_info(
    core: BrokerCore,
    queue: Queue,
    rates: RateSampler | None = None,
    query: Mapping[str, str] | None = None,
) -> dict:
    """A queue in RabbitMQ's shape; with ``rates``, its ``message_stats`` (once it has
    seen a message, as RabbitMQ) and ``*_details`` (samples when ``query`` asks:
    :mod:`.rates`)."""
    vhost = core.vhosts[queue.host.name]
    policy, operator = vhost.policies_of(queue.name)
    info: dict[str, Any] = {
        "name": queue.name,
        "vhost": queue.host.name,
        "durable": queue.durable,
        "auto_delete": queue.auto_delete,
        "exclusive": queue.exclusive_owner is not None,
        "type": queue.type_name,
        "arguments": jsonable(queue.arguments),
        "policy": policy.name if policy else None,
        "operator_policy": operator.name if operator else None,
        "effective_policy_definition": jsonable(vhost.policy_for(queue.name, "queues") or {}),
        "state": "running",
        "node": queue_node(core, queue),  # its owner (:mod:`.cluster_view`)
        "messages_ready": queue.message_count,
        "messages_unacknowledged": queue.unacked_count,
        "messages": queue.message_count + queue.unacked_count,
        "consumers": len(queue.consumers),
    }
    if rates is not None:
        reading = queue_reading(queue)
        query = query or {}
        series = rates.queue_series(queue, watch=window(query, "lengths") is not None)
        info.update(with_details({n: reading[n] for n in LENGTHS}, series, window(query, "lengths")))
        if any(reading[name] for name, _ in QUEUE_STATS):
            stats = {name: reading[name] for name, _ in QUEUE_STATS}
            info["message_stats"] = with_details(stats, series, window(query, "msg_rates"))
    if queue.config.single_active_consumer:  # RabbitMQ shows it for such queues only
        active = queue.single_active_consumer
        info["single_active_consumer_tag"] = active.tag if active is not None else None
    return info


#: The values :func:`queue_info` puts at these paths, read from the queue without
#: making its row (for ``sort`` over many queues).
_QUEUE_KEYS: dict[str, Any] = {
    "name": lambda q: q.name,
    "vhost": lambda q: q.host.name,
    "durable": lambda q: q.durable,
    "auto_delete": lambda q: q.auto_delete,
    "exclusive": lambda q: q.exclusive_owner is not None,
    "type": lambda q: q.type_name,
    "state": lambda q: "running",
    "node": lambda q: "leveret@localhost",
    "messages": lambda q: q.message_count + q.unacked_count,
    "messages_ready": lambda q: q.message_count,
    "messages_unacknowledged": lambda q: q.unacked_count,
    "consumers": lambda q: len(q.consumers),
}


async def vhost_info(vhost: VirtualHost, rates: RateSampler, query: Mapping[str, str]) -> dict:
    """A vhost in RabbitMQ's shape: its queues' message counts and, once they have seen
    messages, ``message_stats``, with ``*_details`` (:mod:`.rates`). Its queues are
    read in slices (:mod:`.slicing`)."""
    reading = await total_sliced(list(vhost.queues.values()), Slicer())
    series = rates.vhost_series([vhost])
    info: dict[str, Any] = {
        "name": vhost.name,
        "description": "",
        "tags": [],
        "tracing": False,
        **with_details({n: reading.get(n, 0) for n in LENGTHS}, series, window(query, "lengths")),
    }
    if any(reading.get(n) for n, _ in QUEUE_STATS):
        stats = {n: reading[n] for n, _ in QUEUE_STATS}
        info["message_stats"] = with_details(stats, series, window(query, "msg_rates"))
    return info


def _same(row: dict) -> dict:
    return row


def _queue_name(queue: Queue | None) -> str:
    return queue.name if queue is not None else ""


def _or_none(read: Any) -> Any:
    return lambda queue: None if queue is None else read(queue)


#: :data:`_QUEUE_KEYS` for items that may be None (a queue deleted meanwhile).
QUEUE_KEYS = {path: _or_none(read) for path, read in _QUEUE_KEYS.items()}


class Resources:
    """The handlers, on ``core``; changes are recorded in the audit log."""

    def __init__(self, core: BrokerCore, rates: RateSampler | None = None) -> None:
        self.core = core
        self.rates = rates
        self.index = QueueIndex()

    def routes(self) -> list[web.RouteDef]:
        b = "/api/bindings/{vhost}/e/{source}/{kind:[qe]}/{destination}"
        return [
            web.get("/api/exchanges", self.exchanges),
            web.get("/api/exchanges/{vhost}", self.exchanges),
            web.get("/api/exchanges/{vhost}/{name}", self.exchange),
            web.put("/api/exchanges/{vhost}/{name}", self.put_exchange),
            web.delete("/api/exchanges/{vhost}/{name}", self.delete_exchange),
            web.get("/api/exchanges/{vhost}/{name}/bindings/source", self.exchange_source_bindings),
            web.get("/api/exchanges/{vhost}/{name}/bindings/destination", self.exchange_destination_bindings),
            web.get("/api/queues", self.queues),
            web.get("/api/queues/{vhost}", self.queues),
            web.get("/api/queues/{vhost}/{name}", self.queue),
            web.put("/api/queues/{vhost}/{name}", self.put_queue),
            web.delete("/api/queues/{vhost}/{name}", self.delete_queue),
            web.get("/api/queues/{vhost}/{name}/bindings", self.queue_bindings),
            web.delete("/api/queues/{vhost}/{name}/contents", self.purge),
            web.get("/api/bindings", self.bindings),
            web.get("/api/bindings/{vhost}", self.bindings),
            web.get(b, self.bindings_between),
            web.post(b, self.create_binding),
            web.get(b + "/{props}", self.binding),
            web.delete(b + "/{props}", self.delete_binding),
        ]

    # -- exchanges ------------------------------------------------------------------
    def _exchange(self, request: web.Request) -> tuple[VirtualHost, Exchange]:
        vhost = route_vhost(self.core, request)
        name = request.match_info["name"]
        exchange = vhost.exchanges.get(DEFAULT_EXCHANGE if name == DEFAULT_EXCHANGE_PATH else name)
        if exchange is None:
            raise object_not_found()
        return vhost, exchange

    async def exchanges(self, request: web.Request) -> web.Response:
        """``GET /api/exchanges[/{vhost}]``: by vhost, then name."""
        rows = [
            exchange_info(v, e)
            for v in visible_vhosts(self.core, request)
            for e in sorted(v.exchanges.values(), key=lambda e: e.name)
        ]
        return list_response(request, rows, pageable=True)

    async def exchange(self, request: web.Request) -> web.Response:
        vhost, exchange = self._exchange(request)
        return web.json_response({**exchange_info(vhost, exchange), "incoming": [], "outgoing": []})

    async def put_exchange(self, request: web.Request) -> web.Response:
        """Declare (201) or redeclare (204, 400 if inequivalent); body ``{"type",
        "durable", "auto_delete", "internal", "arguments"}`` (type ``direct``, the rest
        false by default, as RabbitMQ 3.10)."""
        vhost = route_vhost(self.core, request)
        body = await json_body(request)
        name = request.match_info["name"]
        kind = body.get("type", "direct")
        if not isinstance(kind, str):
            raise json_error(400, "bad_request", "type must be a string")
        durable, auto_delete = boolean(body, "durable", False), boolean(body, "auto_delete", False)
        internal = boolean(body, "internal", False)
        args = arguments(body)
        created = name not in vhost.exchanges
        user_session = session(self.core, request, vhost)
        amqp(lambda: user_session.declare_exchange(name, kind, False, durable, auto_delete, internal, args))
        if created:
            self.core.audit.record(
                "exchange.declare",
                request["user"].name,
                request.remote or "",
                vhost=vhost.name,
                exchange=name,
            )
        return web.Response(status=201 if created else 204)

    async def delete_exchange(self, request: web.Request) -> web.Response:
        vhost = route_vhost(self.core, request)
        name = request.match_info["name"]
        if name not in vhost.exchanges and name != DEFAULT_EXCHANGE_PATH:
            raise object_not_found()
        if_unused = flag(request, "if-unused")
        user_session = session(self.core, request, vhost)
        amqp(lambda: user_session.delete_exchange(name, if_unused))
        self.core.audit.record(
            "exchange.delete", request["user"].name, request.remote or "", vhost=vhost.name, exchange=name
        )
        return web.Response(status=204)

    def _exchange_name(self, request: web.Request) -> tuple[VirtualHost, str]:
        """The vhost and the exchange named (which need not exist: RabbitMQ lists no
        bindings for a missing one, with a 200)."""
        name = request.match_info["name"]
        return route_vhost(self.core, request), DEFAULT_EXCHANGE if name == DEFAULT_EXCHANGE_PATH else name

    async def exchange_source_bindings(self, request: web.Request) -> web.Response:
        vhost, name = self._exchange_name(request)
        if name == DEFAULT_EXCHANGE:  # one implicit binding per queue
            slicer = Slicer()
            handles = [h for h in await vhost_binding_handles(vhost, slicer) if isinstance(h[1], Queue)]
            return await list_answer(request, handles, _handle_row)
        else:
            exchange = vhost.exchanges.get(name)
            found = exchange.bindings.values() if exchange is not None else ()
            rows = sorted((_row(vhost, b) for b in found), key=_order)
        return await list_answer(request, rows, _same)

    async def exchange_destination_bindings(self, request: web.Request) -> web.Response:
        vhost, name = self._exchange_name(request)
        rows = [
            _row(vhost, b)
            for exchange in vhost.exchanges.values()
            for b in exchange.bindings.values()
            if isinstance(b.destination, Exchange) and b.destination.name == name
        ]
        return list_response(request, sorted(rows, key=_order))

    # -- queues ---------------------------------------------------------------------
    def _queue(self, request: web.Request) -> tuple[VirtualHost, Queue]:
        vhost = route_vhost(self.core, request)
        queue = vhost.queues.get(request.match_info["name"])
        if queue is None:
            raise object_not_found()
        return vhost, queue

    async def queues(self, request: web.Request) -> web.Response:
        """``GET /api/queues[/{vhost}]``: by vhost, then name. Only the rows shown are
        made (a page of 100 costs the same with 100 or 100,000 queues); see
        :func:`~.listing.list_answer`."""
        queues = await self.index.queues(visible_vhosts(self.core, request), Slicer())
        core, rates, query = self.core, self.rates, request.query

        def row(queue: Queue | None) -> dict | None:
            if queue is None:
                return None  # deleted since the names were taken
            return queue_info(core, queue, rates, query)

        keys = QUEUE_KEYS
        if core.cluster is not None:  # sort=node: each queue's owner
            keys = {**QUEUE_KEYS, "node": _or_none(lambda queue: queue_node(core, queue))}
        return await list_answer(request, queues, row, True, name_of=_queue_name, keys=keys)

    async def queue(self, request: web.Request) -> web.Response:
        """One queue, with its consumers (``consumer_details``, RabbitMQ's shape)."""
        vhost, queue = self._queue(request)
        details = [
            row
            for facts in await connection_facts(self.core, Slicer())
            if facts.vhost == vhost.name
            for channel in facts.channels
            for row in consumer_rows(facts, channel)
            if row["queue"]["name"] == queue.name
        ]
        return web.json_response(
            {
                **queue_info(self.core, queue, self.rates, request.query),
                "consumer_details": details,
                "incoming": [],
            }
        )

    async def put_queue(self, request: web.Request) -> web.Response:
        """Declare (201) or redeclare (204, 400 if inequivalent or invalid); body
        ``{"durable", "auto_delete", "arguments"}`` (false by default, as RabbitMQ
        3.10; ``node`` is ignored)."""
        vhost = route_vhost(self.core, request)
        body = await json_body(request)
        name = request.match_info["name"]
        durable, auto_delete = boolean(body, "durable", False), boolean(body, "auto_delete", False)
        args = arguments(body)
        created = name not in vhost.queues
        user_session = session(self.core, request, vhost)
        amqp(lambda: user_session.declare_queue(name, False, durable, False, auto_delete, args))
        if created:
            self.core.audit.record(
                "queue.declare", request["user"].name, request.remote or "", vhost=vhost.name, queue=name
            )
        return web.Response(status=201 if created else 204)

    async def delete_queue(self, request: web.Request) -> web.Response:
        """Delete (204); 400 when ``?if-empty=true`` or ``?if-unused=true`` does not
        hold (nothing is deleted then), 404 if there is none."""
        vhost, queue = self._queue(request)
        if_empty, if_unused = flag(request, "if-empty"), flag(request, "if-unused")
        user_session = session(self.core, request, vhost)
        link = queue.link if isinstance(queue, RemoteQueue) else None
        if (if_empty or if_unused) and link is not None:
            # another cluster node owns it: only the owner knows whether it is empty or
            # unused (docs/cluster.md); it deletes it, or refuses
            amqp(lambda: user_session.access.configure("queue", queue.name))
            answer: asyncio.Future[tuple[int, tuple[int, str] | None]] = (
                asyncio.get_running_loop().create_future()
            )

            def replied(count: int, refusal: tuple[int, str] | None) -> None:
                if not answer.done():
                    answer.set_result((count, refusal))

            link.delete(queue.name, if_unused, if_empty, replied)
            count, refusal = await answer
            if refusal is not None:
                code, text = refusal
                if code == 404:
                    raise json_error(404, "not_found", text)
                raise json_error(400, "bad_request", text)
            amqp(lambda: user_session.delete_queue(queue.name))
        else:
            count = amqp(lambda: user_session.delete_queue(queue.name, if_unused, if_empty))
        self.core.audit.record(
            "queue.delete",
            request["user"].name,
            request.remote or "",
            vhost=vhost.name,
            queue=queue.name,
            messages=count,
        )
        return web.Response(status=204)

    async def queue_bindings(self, request: web.Request) -> web.Response:
        vhost, queue = self._queue(request)
        return list_response(request, queue_binding_rows(vhost, queue))

    async def purge(self, request: web.Request) -> web.Response:
        """``DELETE /api/queues/{vhost}/{name}/contents``: purge ready messages (204); 401
        ``Access refused.`` without read permission on the queue (RabbitMQ's answer),
        404 if missing, 400 for a stream (which cannot be purged)."""
        vhost = route_vhost(self.core, request)
        name = request.match_info["name"]
        user_session = session(self.core, request, vhost)
        try:
            user_session.access.read("queue", name)
        except Exception:
            raise json_error(401, "not_authorised", "Access refused.") from None
        if name not in vhost.queues:
            raise object_not_found()
        queue = amqp(lambda: vhost.get_queue(name, user_session.owner))  # 400 if exclusive elsewhere
        count = queue.purge()
        self.core.audit.record(
            "queue.purge",
            request["user"].name,
            request.remote or "",
            vhost=vhost.name,
            queue=name,
            messages=count,
        )
        return web.Response(status=204)

    # -- bindings -------------------------------------------------------------------
    async def bindings(self, request: web.Request) -> web.Response:
        slicer = Slicer()
        handles = [
            h for v in visible_vhosts(self.core, request) for h in await vhost_binding_handles(v, slicer)
        ]
        return await list_answer(request, handles, _handle_row)

    def _ends(self, request: web.Request) -> tuple[VirtualHost, str, str, str]:
        vhost = route_vhost(self.core, request)
        info = request.match_info
        kind = "queue" if info["kind"] == "q" else "exchange"
        source = DEFAULT_EXCHANGE if info["source"] == DEFAULT_EXCHANGE_PATH else info["source"]
        return vhost, source, kind, info["destination"]

    def _between(self, request: web.Request) -> tuple[VirtualHost, list[dict]]:
        """The bindings from source to destination (none when either is missing: a
        200 with ``[]``, as RabbitMQ)."""
        vhost, source, kind, destination = self._ends(request)
        rows = bindings_between(vhost, source, kind, destination)
        return vhost, rows

    async def bindings_between(self, request: web.Request) -> web.Response:
        return list_response(request, self._between(request)[1])

    async def create_binding(self, request: web.Request) -> web.Response:
        """Bind (201, also when the binding existed, as RabbitMQ); ``Location`` is the
        binding's path relative to this one: ``{destination}/{properties_key}``."""
        vhost, source, kind, destination = self._ends(request)
        body = await json_body(request)
        key = body.get("routing_key", "")
        if not isinstance(key, str):
            raise json_error(400, "bad_request", "routing_key must be a string")
        args = arguments(body)
        user_session = session(self.core, request, vhost)
        amqp(lambda: user_session.bind(source, kind, destination, key, args))
        self.core.audit.record(
            "binding.create",
            request["user"].name,
            request.remote or "",
            vhost=vhost.name,
            source=source,
            destination=destination,
            kind=kind,
            routing_key=key,
        )
        location = f"{quote_plus(destination)}/{quote_plus(properties_key(key, args))}"
        return web.Response(status=201, headers={"Location": location})

    def _binding(self, request: web.Request) -> tuple[VirtualHost, dict]:
        vhost, rows = self._between(request)
        unpacked = unpack_properties(request.match_info["props"])
        if unpacked is None:
            raise object_not_found()
        key, digest = unpacked
        for row in rows:
            if (
                row["routing_key"] == key
                and (args_hash(row["arguments"]) if row["arguments"] else None) == digest
            ):
                return vhost, row
        raise object_not_found()

    async def binding(self, request: web.Request) -> web.Response:
        return web.json_response(self._binding(request)[1])

    async def delete_binding(self, request: web.Request) -> web.Response:
        vhost, row = self._binding(request)
        kind = row["destination_type"]
        source, destination = row["source"], row["destination"]
        exchange = vhost.exchanges[source] if source else None
        # The binding's own arguments (not their JSON form) identify it in core.
        args = next(
            (
                b.arguments
                for b in (exchange.bindings.values() if exchange is not None else ())
                if b.destination.name == destination
                and isinstance(b.destination, Queue) == (kind == "queue")
                and b.routing_key == row["routing_key"]
                and properties_key(b.routing_key, b.arguments) == row["properties_key"]
            ),
            {},
        )
        user_session = session(self.core, request, vhost)
        amqp(lambda: user_session.unbind(source, kind, destination, row["routing_key"], args))
        self.core.audit.record(
            "binding.delete",
            request["user"].name,
            request.remote or "",
            vhost=vhost.name,
            source=source,
            destination=destination,
            kind=kind,
            routing_key=row["routing_key"],
        )
        return web.Response(status=204)
