"""Federation link status over HTTP, as RabbitMQ 3.10's ``rabbitmq_federation_management``
has it (checked against a node with a running, a refused and a badly authenticated
upstream):

- ``GET /api/federation-links[/{vhost}]``: one row per link (one upstream of one
  federated exchange or queue): ``node``, ``exchange``/``upstream_exchange`` or
  ``queue``/``upstream_queue``/``consumer_tag``, ``type``, ``vhost``, ``upstream``,
  ``id``, ``status`` (``starting``, ``running``, ``error``, ``shutdown``), then
  ``local_connection`` when running or ``error`` (the failure's text) when not,
  ``uri`` without credentials or query (RabbitMQ's ``amqp_uri:remove_credentials``:
  ``scheme://host:port/path``), ``timestamp`` of the last change in local time as
  RabbitMQ prints it (``2026-11-28 8:05:35``: the hour unpadded), and
  ``local_channel`` (the link's channel on this broker, as ``/api/channels`` shows
  it) when its local connection has exactly one channel;
- ``GET /api/federation-links/state/down/`` and ``/api/federation-links/{vhost}/state/down``:
  only the links neither ``running`` nor ``starting``;
- ``DELETE /api/federation-links/vhost/{vhost}/{id}/{node}/restart``: restart a link
  (its connections are dropped and it starts over at once); 204, 404 when no link of
  that vhost has the id or the node is not this broker's.

As in RabbitMQ, these need the ``monitoring`` or ``administrator`` tag (401 ``Not
monitor user``; see :data:`PATHS`, checked by :mod:`.api`), rows are limited to the
vhosts the user works in (an administrator's: all), a missing vhost is a 404, and the
lists take ``sort``/``sort_reverse``/``columns`` (:mod:`.listing`). What differs: the
``error`` text is RabbitMQ's term then words (``econnrefused: connection refused by
HOST:PORT``, :mod:`leveret.federation.errors`), not an Erlang term, and ids are
leveret's own 8 hex digits (RabbitMQ's are a hash of the Erlang key: opaque either way).
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from aiohttp import web

from ..core.broker import BrokerCore
from ..core.connections import ConnectionFacts
from ..federation.uri import safe_uri
from .common import object_not_found, works_in
from .listing import list_answer
from .runtime import NODE, channel_row

#: The routes, for :mod:`.api`'s tag check (``monitoring`` or ``administrator``).
PATHS = frozenset(
    (
        "/api/federation-links",
        "/api/federation-links/{vhost}",
        "/api/federation-links/state/down",
        "/api/federation-links/state/down/",
        "/api/federation-links/{vhost}/state/down",
        "/api/federation-links/vhost/{vhost}/{id}/{node}/restart",
    )
)
#: States in which a link counts as up (``state/down`` and ``--only-down`` leave them out).
UP_STATES = ("running", "starting")
#: Every state a link reports, as RabbitMQ's federation status names them.
STATES = ("starting", "running", "error", "shutdown")


class FederationLinks(Protocol):
    """The broker's links (:class:`leveret.federation.manager.Federation`), each a
    :class:`leveret.federation.links.Link`."""

    def links(self, vhost: str | None = None) -> list[Any]: ...

    def restart(self, vhost: str | None, link_id: str) -> bool: ...


def http_timestamp(epoch: float) -> str:
    """Local time as RabbitMQ's management plugin prints a link's timestamp
    (``~w`` for the hour: ``2026-11-28 8:05:35``)."""
    t = time.localtime(epoch)
    return f"{t.tm_year}-{t.tm_mon:02}-{t.tm_mday:02} {t.tm_hour}:{t.tm_min:02}:{t.tm_sec:02}"


def ctl_timestamp(epoch: float) -> str:
    """Local time as ``rabbitmqctl federation_status`` prints ``last_changed``."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))


def consumer_tag(link: Any) -> str:
    """The tag a queue link consumes from its upstream queue with (the upstream's
    ``consumer-tag``, else RabbitMQ's ``federation-link-UPSTREAM``)."""
    return getattr(link.upstream, "consumer_tag", None) or f"federation-link-{link.upstream.name}"


def _ordered(row: dict[str, Any]) -> dict[str, Any]:
    """The fields in RabbitMQ's order (JSON readers do not care; people do)."""
    order = (
        "node",
        "exchange",
        "upstream_exchange",
        "queue",
        "upstream_queue",
        "consumer_tag",
        "type",
        "vhost",
        "upstream",
        "id",
        "status",
        "local_connection",
        "error",
        "uri",
        "timestamp",
    )
    shaped = {key: row[key] for key in order if key in row}
    shaped.update((key, value) for key, value in row.items() if key not in shaped)
    return shaped


class LocalConnections:
    """This broker's connections by name, read once (on first use) for a listing."""

    def __init__(self, core: BrokerCore) -> None:
        self.core = core
        self._by_name: dict[str, ConnectionFacts] | None = None

    def _index(self) -> dict[str, ConnectionFacts]:
        if self._by_name is None:
            self._by_name = {facts.name: facts for facts, _ in self.core.connections.facts()}
        return self._by_name

    def channel(self, name: str) -> dict | None:
        """The channel row of the connection ``name`` when it has exactly one channel
        (RabbitMQ's rule for ``local_channel``)."""
        facts = self._index().get(name)
        if facts is None or len(facts.channels) != 1:
            return None
        return channel_row(facts, facts.channels[0])


def node_name(link: Any) -> str:
    """The node ``link`` runs on: the cluster node's name on a node of a cluster, else
    this broker's (:data:`.runtime.NODE`)."""
    name = getattr(getattr(getattr(link, "core", None), "cluster", None), "node", None)
    return name if isinstance(name, str) else NODE


def link_row(link: Any, local: LocalConnections | None = None) -> dict[str, Any]:
    """``link``'s ``/api/federation-links`` row (see the module doc); ``local`` names
    its connection to this broker and gives that connection's channel."""
    row = dict(link.status())
    # the node the link runs on, as /api/overview and /api/nodes name this broker (the
    # link's own name for itself, its cluster name, is in x-received-from and upstream
    # queue names), as RabbitMQ's rows name the Erlang node
    row["node"] = node_name(link)
    if row.get("type") == "queue":
        row.setdefault("consumer_tag", consumer_tag(link))
    if row.get("status") != "running":
        row.pop("local_connection", None)
    else:
        row.pop("error", None)
    row["uri"] = safe_uri(link.uri)
    row["timestamp"] = http_timestamp(link.since)
    shaped = _ordered(row)
    connection = shaped.get("local_connection")
    if connection and local is not None:
        channel = local.channel(connection)
        if channel is not None:
            shaped["local_channel"] = channel
    return shaped


def link_rows(core: BrokerCore, links: list[Any]) -> list[dict[str, Any]]:
    """The rows of ``links`` (this broker's connections read once for them all)."""
    local = LocalConnections(core)
    return [link_row(link, local) for link in links]


def is_down(row: dict[str, Any]) -> bool:
    """Whether RabbitMQ lists the link under ``state/down`` and ``--only-down``."""
    return row.get("status") not in UP_STATES


class FederationAPI:
    """The handlers, on ``core`` and the broker's ``federation`` links (None: no link
    anywhere)."""

    def __init__(self, core: BrokerCore, federation: FederationLinks | None) -> None:
        self.core = core
        self.federation = federation

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/api/federation-links", self.all_links),
            web.get("/api/federation-links/state/down", self.down_links),
            web.get("/api/federation-links/state/down/", self.down_links),
            web.get("/api/federation-links/{vhost}", self.all_links),
            web.get("/api/federation-links/{vhost}/state/down", self.down_links),
            web.delete("/api/federation-links/vhost/{vhost}/{id}/{node}/restart", self.restart),
        ]

    async def _answer(self, request: web.Request, down: bool) -> web.Response:
        """The rows of the links the user sees (only the down ones), made in slices that
        give the event loop back (:func:`~.listing.list_answer`: ~23 µs a row)."""
        vhost = request.match_info.get("vhost")
        if vhost is not None and vhost not in self.core.vhosts:
            raise object_not_found()
        user = request["user"]
        links = [] if self.federation is None else self.federation.links(vhost)
        seen = [
            link
            for link in links
            if works_in(self.core, user, link.vhost) and (not down or link.state not in UP_STATES)
        ]
        local = LocalConnections(self.core)
        return await list_answer(request, seen, lambda link: link_row(link, local))

    async def all_links(self, request: web.Request) -> web.Response:
        return await self._answer(request, down=False)

    async def down_links(self, request: web.Request) -> web.Response:
        return await self._answer(request, down=True)

    async def restart(self, request: web.Request) -> web.Response:
        """Restart the link ``id`` of ``vhost`` on ``node`` (this broker's name in the
        rows): 204, 404 otherwise."""
        info = request.match_info
        vhost, link_id, node = info["vhost"], info["id"], info["node"]
        if vhost not in self.core.vhosts or self.federation is None:
            raise object_not_found()
        link = next((link for link in self.federation.links(vhost) if link.id == link_id), None)
        if link is None or node != node_name(link):
            raise object_not_found()
        self.federation.restart(vhost, link_id)
        self.core.audit.record(
            "federation_link.restart",
            request["user"].name,
            request.remote or "",
            vhost=vhost,
            id=link_id,
            upstream=link.upstream.name,
        )
        return web.Response(status=204)
