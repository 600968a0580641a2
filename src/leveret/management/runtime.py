"""The running broker over HTTP, in RabbitMQ 3.10's shapes: overview, nodes,
connections (and closing them), channels, consumers, aliveness test, health checks.

Connections, channels and consumers come from core's protocol-neutral registry
(:mod:`leveret.core.connections`): AMQP and STOMP connections alike. Who sees what
follows RabbitMQ: administrators and monitoring users see every connection, others
their own; an administrator may close any, others their own. The overview's
``message_stats``, ``churn_rates`` and ``queue_totals`` carry rates from the
:class:`~.rates.RateSampler` (RabbitMQ's ``*_details``; samples with ``lengths_age`` /
``msg_rates_age``); a user who does not see every vhost gets the sums of those they
see.

What only the server knows (its listeners, memory and disk limits) comes from the
``node_info`` callable the server gives :class:`~.api.ManagementAPI`.
"""

from __future__ import annotations

import itertools
import os
import platform
import resource
import socket
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from ..core.broker import BrokerCore
from ..core.connections import ChannelFacts, ConnectionFacts, sessions_of
from ..core.exchange import EXCHANGE_TYPES
from ..core.message import Message, Properties
from ..version import __version__
from .cluster_view import cluster_name, node_rows, registered_nodes, this_node
from .common import json_error, object_not_found, route_vhost, works_in
from .connection_sessions import session_row
from .listing import list_answer, list_response
from .rates import (
    BROKER_STATS,
    CHURN,
    LENGTHS,
    QUEUE_STATS,
    RateSampler,
    broker_reading_sliced,
    total_sliced,
    window,
    with_details,
)
from .slicing import Slicer

#: The RabbitMQ version whose management API this one follows: tools (Terraform's
#: provider) read ``rabbitmq_version`` and need it to parse as 3.7 or later.
RABBITMQ_VERSION = "3.10.8"
NODE = f"leveret@{socket.gethostname().split('.')[0] or 'localhost'}"
SEES_ALL_TAGS = frozenset(("administrator", "monitoring"))

NodeInfo = Callable[[], dict[str, Any]]


def _ms(seconds: float) -> int:
    return int(seconds * 1000)


def connection_row(facts: ConnectionFacts) -> dict:
    """A connection in RabbitMQ's shape (without statistics); an AMQP 1.0 connection's
    ``container_id`` (its ``open``'s) at the top level too, as RabbitMQ 4 lists it."""
    row = _connection_row(facts)
    if facts.protocol == "AMQP 1.0" and "container_id" in facts.client_properties:
        row["container_id"] = facts.client_properties["container_id"]
    return row


def _connection_row(facts: ConnectionFacts) -> dict:
    if facts.kind == "direct":  # RabbitMQ 3.10's row of a direct connection: no socket facts
        return {
            "client_properties": _plain(facts.client_properties),
            "connected_at": _ms(facts.connected_at),
            "name": facts.name,
            "node": NODE,
            "protocol": facts.protocol,
            "type": "direct",
            "user": facts.user,
            "user_who_performed_action": facts.user,
            "vhost": facts.vhost,
        }
    return {
        "auth_mechanism": facts.auth_mechanism,
        "channel_max": facts.channel_max,
        "channels": len(facts.channels),
        "client_properties": _plain(facts.client_properties),
        "connected_at": _ms(facts.connected_at),
        "frame_max": facts.frame_max,
        "host": facts.host,
        "name": facts.name,
        "node": NODE,
        "peer_cert_issuer": None,
        "peer_cert_subject": None,
        "peer_cert_validity": None,
        "peer_host": facts.peer_host,
        "peer_port": facts.peer_port,
        "port": facts.port,
        "protocol": facts.protocol,
        "ssl": facts.ssl,
        "ssl_cipher": None,
        "ssl_hash": None,
        "ssl_key_exchange": None,
        "ssl_protocol": None,
        "state": facts.state,
        "timeout": facts.heartbeat,
        "type": "network",
        "user": facts.user,
        "user_who_performed_action": facts.user,
        "vhost": facts.vhost,
    }


def _plain(value: Any) -> Any:
    """Field-table values as JSON holds them."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def channel_name(connection: ConnectionFacts, channel: ChannelFacts) -> str:
    return f"{connection.name} ({channel.number})"


def _peer(connection: ConnectionFacts) -> tuple[Any, Any]:
    """``peer_host`` and ``peer_port`` in a channel's or consumer's details: a direct
    connection's are ``"undefined"``, as RabbitMQ prints them."""
    if connection.kind == "direct":
        return "undefined", "undefined"
    return connection.peer_host, connection.peer_port


def channel_row(connection: ConnectionFacts, channel: ChannelFacts) -> dict:
    """A channel in RabbitMQ's shape (without statistics)."""
    peer_host, peer_port = _peer(connection)
    return {
        "acks_uncommitted": channel.acks_uncommitted,
        "confirm": channel.confirm,
        "connection_details": {
            "name": connection.name,
            "peer_host": peer_host,
            "peer_port": peer_port,
        },
        "consumer_count": len(channel.consumers),
        "global_prefetch_count": channel.global_prefetch_count,
        "messages_unacknowledged": channel.messages_unacknowledged,
        "messages_uncommitted": channel.messages_uncommitted,
        "messages_unconfirmed": channel.messages_unconfirmed,
        "name": channel_name(connection, channel),
        "node": NODE,
        "number": channel.number,
        "prefetch_count": channel.prefetch_count,
        "state": channel.state,
        "transactional": channel.transactional,
        "user": connection.user,
        "user_who_performed_action": connection.user,
        "vhost": connection.vhost,
    }


def consumer_rows(connection: ConnectionFacts, channel: ChannelFacts) -> list[dict]:
    """The channel's consumers in RabbitMQ's shape."""
    peer_host, peer_port = _peer(connection)
    details = {
        "connection_name": connection.name,
        "name": channel_name(connection, channel),
        "node": NODE,
        "number": channel.number,
        "peer_host": peer_host,
        "peer_port": peer_port,
        "user": connection.user,
    }
    return [
        {
            "arguments": _plain(consumer.arguments),
            "ack_required": consumer.ack_required,
            "active": consumer.active,
            "activity_status": _activity(consumer.active, consumer.single_active),
            "channel_details": details,
            "consumer_tag": consumer.tag,
            "exclusive": consumer.exclusive,
            "prefetch_count": consumer.prefetch_count,
            "queue": {"name": consumer.queue, "vhost": connection.vhost},
        }
        for consumer in channel.consumers
    ]


def _facts(connection: Any) -> ConnectionFacts:
    return connection.facts()


async def connection_facts(core: BrokerCore, slicer: Slicer) -> list[ConnectionFacts]:
    """Every open connection's facts, by name, taken in slices (1,000 connections with
    10,000 consumers take ~50 ms)."""
    everyone = await slicer.map(_facts, list(core.connections), step=16)
    everyone.sort(key=_name)
    return everyone


def _name(facts: ConnectionFacts) -> str:
    return facts.name


def _channel_row(pair: tuple[ConnectionFacts, ChannelFacts]) -> dict:
    return channel_row(*pair)


def _channel_name(pair: tuple[ConnectionFacts, ChannelFacts]) -> str:
    return channel_name(*pair)


def _consumer_rows(pair: tuple[ConnectionFacts, ChannelFacts]) -> list[dict]:
    return consumer_rows(*pair)


def _same(row: dict) -> dict:
    return row


def _activity(active: bool, single_active: bool) -> str:
    """RabbitMQ's ``activity_status`` of a consumer."""
    if not active:
        return "waiting"
    return "single_active" if single_active else "up"


def _status(ok: bool, reason: str = "", **extra: Any) -> web.Response:
    """A health check's answer: 200 ``{"status": "ok"}`` or 503 ``{"status":
    "failed", "reason": ...}``."""
    if ok:
        return web.json_response({"status": "ok", **extra})
    return web.json_response({"status": "failed", "reason": reason, **extra}, status=503)


class Runtime:
    """The handlers, on ``core``; ``node_info`` gives the server's facts (see the
    module doc), ``started`` is the broker's start (epoch seconds)."""

    def __init__(
        self, core: BrokerCore, node_info: NodeInfo | None = None, rates: RateSampler | None = None
    ) -> None:
        self.core = core
        self.node_info = node_info or (lambda: {})
        self.started = time.time()
        self.rates = rates or RateSampler(core)

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/api/overview", self.overview),
            web.get("/api/nodes", self.nodes),
            web.get("/api/nodes/{node}", self.node),
            web.get("/api/connections", self.connections),
            web.get("/api/connections/{name}", self.connection),
            web.delete("/api/connections/{name}", self.close_connection),
            web.get("/api/connections/{name}/channels", self.connection_channels),
            web.get("/api/connections/{name}/sessions", self.connection_sessions),
            web.get("/api/vhosts/{vhost}/connections", self.connections),
            web.get("/api/vhosts/{vhost}/channels", self.channels),
            web.get("/api/channels", self.channels),
            web.get("/api/channels/{name}", self.channel),
            web.get("/api/consumers", self.consumers),
            web.get("/api/consumers/{vhost}", self.consumers),
            web.get("/api/aliveness-test/{vhost}", self.aliveness),
            web.get("/api/health/checks/alarms", self.alarms),
            web.get("/api/health/checks/local-alarms", self.alarms),
            web.get("/api/health/checks/virtual-hosts", self.virtual_hosts),
            web.get("/api/health/checks/port-listener/{port}", self.port_listener),
            web.get("/api/health/checks/protocol-listener/{protocol}", self.protocol_listener),
            web.get("/api/health/checks/is-in-service", self.in_service),
            web.get("/api/health/checks/ready-to-serve-clients", self.in_service),
            web.get("/api/health/checks/node-is-quorum-critical", self.quorum_critical),
            web.get("/api/version", self.version),
        ]

    # -- overview and nodes ---------------------------------------------------------
    @property
    def node_name(self) -> str:
        """This broker's node name (its cluster node name when it is one:
        :mod:`.cluster_view`)."""
        return this_node(self.core, NODE)

    def _listeners(self) -> list[dict]:
        return [
            {"node": self.node_name, "protocol": protocol, "ip_address": ip, "port": port, "socket_opts": {}}
            for protocol, ip, port in self.node_info().get("listeners", [])
        ]

    async def overview(self, request: web.Request) -> web.Response:
        """``GET /api/overview``: product, versions, listeners, object and message
        totals and rates over what the user may see."""
        user = request["user"]
        vhosts = [v for name, v in self.core.vhosts.items() if works_in(self.core, user, name)]
        queues = list(itertools.chain.from_iterable(v.queues.values() for v in vhosts))
        slicer = Slicer()  # 100,000 queues are read in slices (:mod:`.slicing`)
        connections = await self._visible_sliced(request, slicer)
        channels = [c for facts in connections for c in facts.channels]
        if SEES_ALL_TAGS.intersection(user.tags):
            reading, series = await broker_reading_sliced(self.core, slicer), self.rates.broker
            # the broker's publish (each message once), then the queues' deliveries
            stats = [n for n, _ in BROKER_STATS] + [n for n, _ in QUEUE_STATS if n != "publish"]
        else:
            reading = await total_sliced(queues, slicer)
            series = self.rates.vhost_series(vhosts)
            stats = [name for name, _ in QUEUE_STATS]
        rates, lengths = window(request.query, "msg_rates"), window(request.query, "lengths")
        return web.json_response(
            {
                "management_version": __version__,
                "rates_mode": "basic",
                "exchange_types": self._exchange_types(),
                "product_version": __version__,
                "product_name": "leveret",
                "rabbitmq_version": RABBITMQ_VERSION,
                # the name federation uses (x-received-from, upstream queue names), as
                # RabbitMQ's cluster_name: the global parameter, else the broker's own
                "cluster_name": cluster_name(self.core, NODE),
                "erlang_version": platform.python_version(),
                "erlang_full_version": f"{platform.python_implementation()} {platform.python_version()}",
                "disable_stats": False,
                "enable_queue_totals": True,
                "message_stats": with_details({n: reading.get(n, 0) for n in stats}, series, rates),
                "churn_rates": with_details(
                    {name: reading.get(name, 0) for name, _ in CHURN}, self.rates.broker, rates
                ),
                "queue_totals": with_details({n: reading.get(n, 0) for n in LENGTHS}, series, lengths),
                "object_totals": {
                    "channels": len(channels),
                    "connections": len(connections),
                    "consumers": sum(len(c.consumers) for c in channels),
                    "exchanges": sum(len(v.exchanges) for v in vhosts),
                    "queues": len(queues),
                },
                "statistics_db_event_queue": 0,
                "node": self.node_name,
                "listeners": self._listeners(),
                "contexts": [],
            }
        )

    @staticmethod
    def _exchange_types() -> list[dict]:
        return [
            {
                "name": name,
                "description": EXCHANGE_TYPES[name].description or f"{name} exchange",
                "enabled": True,
            }
            for name in sorted(EXCHANGE_TYPES)
        ]

    def _node_row(self) -> dict:
        info = self.node_info()
        try:
            fd_used = len(os.listdir("/proc/self/fd"))
        except OSError:
            fd_used = 0
        soft_fds = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        alarms = self.core.alarm_sources
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return {
            "name": self.node_name,
            "type": "disc",
            "running": True,
            "os_pid": str(os.getpid()),
            "uptime": _ms(time.time() - self.started),
            "run_queue": 0,
            "processors": os.cpu_count() or 1,
            "fd_total": soft_fds,
            "fd_used": fd_used,
            "sockets_total": soft_fds,
            "sockets_used": len(self.core.connections),
            "proc_total": 1,
            "proc_used": 1,
            "mem_limit": info.get("mem_limit", 0),
            "mem_used": info.get("mem_used", rss),
            "mem_alarm": "memory" in alarms,
            # leveret's own: queues page to the store (budget or paging ratio passed)
            "mem_paging": self.core.memory_pressure,
            "queue_memory_used": self.core.queue_memory.held,
            "queue_memory_budget": self.core.queue_memory.budget,
            "disk_free_limit": info.get("disk_free_limit", 0),
            "disk_free": info.get("disk_free", 0),
            "disk_free_alarm": "disk" in alarms or "store" in alarms,
            "rates_mode": "none",
            "enabled_plugins": [],
            "being_drained": False,
            "partitions": [],
            "cluster_links": [],
            "exchange_types": self._exchange_types(),
            "auth_mechanisms": [{"name": "PLAIN", "description": "SASL PLAIN", "enabled": True}],
            "applications": [
                {"name": "leveret", "description": "leveret message broker", "version": __version__}
            ],
            "net_ticktime": 60,
        }

    async def _node_rows(self) -> list[dict]:
        """This broker's row, or every node of its cluster (:mod:`.cluster_view`)."""
        local = self._node_row()
        if self.core.cluster is None:
            return [local]
        return node_rows(await registered_nodes(self.core), local)

    async def nodes(self, request: web.Request) -> web.Response:
        """``GET /api/nodes``: this broker, or every node of its cluster (running or
        not) as RabbitMQ lists a cluster's members."""
        return list_response(request, await self._node_rows())

    async def node(self, request: web.Request) -> web.Response:
        """``GET /api/nodes/{node}``: one of :meth:`nodes`' rows; 404 for another name."""
        for row in await self._node_rows():
            if row["name"] == request.match_info["node"]:
                return web.json_response(row)
        raise object_not_found()

    # -- connections, channels, consumers ------------------------------------------
    def _here(self, make: Callable[[Any], dict]) -> Callable[[Any], dict]:
        """``make``, its rows' ``node`` (a consumer's ``channel_details.node``) this
        node's cluster node name when the broker is a cluster node."""
        if self.core.cluster is None:
            return make
        name = self.node_name

        def made(item: Any) -> dict:
            row = make(item)
            if "node" in row:
                row["node"] = name
            details = row.get("channel_details")
            if isinstance(details, dict) and "node" in details:
                row["channel_details"] = {**details, "node": name}
            return row

        return made

    def _visible(self, request: web.Request) -> list[ConnectionFacts]:
        """The connections the user sees (all, or their own), of the route's vhost."""
        return self._seen(request, [facts for facts, _ in self.core.connections.facts()])

    def _seen(self, request: web.Request, everyone: list[ConnectionFacts]) -> list[ConnectionFacts]:
        user = request["user"]
        sees_all = bool(SEES_ALL_TAGS.intersection(user.tags))
        vhost = route_vhost(self.core, request).name if "vhost" in request.match_info else None
        return [
            facts
            for facts in everyone
            if (sees_all or facts.user == user.name) and vhost in (None, facts.vhost)
        ]

    async def _visible_sliced(self, request: web.Request, slicer: Slicer) -> list[ConnectionFacts]:
        """:meth:`_visible`, the connections' facts taken in slices (1,000 connections
        with 10,000 consumers take ~50 ms)."""
        if "vhost" in request.match_info:
            route_vhost(self.core, request)  # its 401 or 404 before any work
        return self._seen(request, await connection_facts(self.core, slicer))

    def _connection(self, request: web.Request) -> tuple[ConnectionFacts, Any]:
        found = self.core.connections.find(request.match_info["name"])
        user = request["user"]
        if found is None:
            raise object_not_found()
        if not (SEES_ALL_TAGS.intersection(user.tags) or found[0].user == user.name):
            raise json_error(401, "not_authorised", "User not authorised to access object")
        return found

    async def connections(self, request: web.Request) -> web.Response:
        """``GET /api/connections``, ``/api/vhosts/{vhost}/connections`` (in slices:
        :func:`~.listing.list_answer`)."""
        slicer = Slicer()
        connections = await self._visible_sliced(request, slicer)
        return await list_answer(request, connections, self._here(connection_row), True, name_of=_name)

    async def connection(self, request: web.Request) -> web.Response:
        return web.json_response(self._here(connection_row)(self._connection(request)[0]))

    async def close_connection(self, request: web.Request) -> web.Response:
        """``DELETE /api/connections/{name}``: closed with 320 CONNECTION_FORCED and
        the ``X-Reason`` header's text (RabbitMQ's default otherwise); 204. Only an
        administrator may close another user's connection."""
        facts, connection = self._connection(request)
        user = request["user"]
        if facts.user != user.name and "administrator" not in user.tags:
            raise json_error(401, "not_authorised", "User not authorised to access object")
        reason = request.headers.get("X-Reason", "Closed via management plugin")
        connection.close_by_operator(reason)
        self.core.audit.record(
            "connection.close", user.name, request.remote or "", connection=facts.name, reason=reason
        )
        return web.Response(status=204)

    async def connection_channels(self, request: web.Request) -> web.Response:
        facts, _ = self._connection(request)
        return list_response(request, [self._here(_channel_row)((facts, c)) for c in facts.channels])

    async def connection_sessions(self, request: web.Request) -> web.Response:
        """``GET /api/connections/{name}/sessions``: an AMQP 1.0 connection's sessions
        and links (:mod:`.connection_sessions`); 400 for another protocol's, as
        RabbitMQ 4."""
        _, connection = self._connection(request)
        sessions = sessions_of(connection)
        if sessions is None:
            raise json_error(400, "bad_request", "connection does not use AMQP 1.0")
        return list_response(request, [session_row(s) for s in sessions])

    async def channels(self, request: web.Request) -> web.Response:
        """``GET /api/channels``, ``/api/vhosts/{vhost}/channels`` (in slices)."""
        slicer = Slicer()
        pairs = [(f, c) for f in await self._visible_sliced(request, slicer) for c in f.channels]
        return await list_answer(request, pairs, self._here(_channel_row), True, name_of=_channel_name)

    async def channel(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        for facts in self._visible(request):
            for channel in facts.channels:
                if channel_name(facts, channel) == name:
                    consumers = [self._here(_same)(row) for row in consumer_rows(facts, channel)]
                    return web.json_response(
                        {**self._here(_channel_row)((facts, channel)), "consumer_details": consumers}
                    )
        raise object_not_found()

    async def consumers(self, request: web.Request) -> web.Response:
        """``GET /api/consumers[/{vhost}]``: the consumers of the connections the user
        sees."""
        slicer = Slicer()
        pairs = [(f, c) for f in await self._visible_sliced(request, slicer) for c in f.channels]
        here = self._here(_same)
        rows = [here(row) for part in await slicer.map(_consumer_rows, pairs) for row in part]
        return await list_answer(request, rows, _same)

    # -- health ---------------------------------------------------------------------
    async def aliveness(self, request: web.Request) -> web.Response:
        """``GET /api/aliveness-test/{vhost}``: declare ``aliveness-test`` in the vhost,
        publish to it and get the message back, as RabbitMQ does."""
        vhost = route_vhost(self.core, request)
        queue = vhost.declare_queue("aliveness-test", None)
        queue.purge()
        queue.enqueue(Message.build("", "aliveness-test", b"test_message", Properties()))
        entry = queue.get()
        if entry is None or entry.message.body != b"test_message":
            return web.json_response({"status": "failed", "reason": "message not received"}, status=503)
        queue.ack(entry)
        return web.json_response({"status": "ok"})

    async def alarms(self, request: web.Request) -> web.Response:
        """``/api/health/checks/{alarms,local-alarms}``: 503 while a resource alarm is
        raised."""
        sources = sorted(self.core.alarm_sources)
        if not sources:
            return _status(True)
        alarms = [{"node": self.node_name, "resource": s} for s in sources]
        return _status(False, "resource alarm(s) in effect", alarms=alarms)

    async def virtual_hosts(self, request: web.Request) -> web.Response:
        return _status(True)  # every vhost runs in the one process

    async def port_listener(self, request: web.Request) -> web.Response:
        text = request.match_info["port"]
        if not text.isdigit():
            raise json_error(400, "bad_request", f"invalid port '{text}'")
        ports = [port for _, _, port in self.node_info().get("listeners", [])]
        port = int(text)
        if port in ports:
            return _status(True, port=port)
        return _status(False, "No active listener", missing=port, ports=ports)

    async def protocol_listener(self, request: web.Request) -> web.Response:
        protocol = request.match_info["protocol"]
        protocols = [p for p, _, _ in self.node_info().get("listeners", [])]
        if protocol.lower() in protocols:
            return _status(True, protocol=protocol)
        return _status(False, "No active listener", missing=protocol, protocols=protocols)

    async def in_service(self, request: web.Request) -> web.Response:
        """``is-in-service``, ``ready-to-serve-clients`` (newer RabbitMQ's; no login):
        ok while no resource alarm blocks publishers."""
        if self.core.alarm_active:
            return _status(False, "resource alarm(s) in effect")
        return _status(True)

    async def quorum_critical(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "reason": "single node cluster"})

    async def version(self, request: web.Request) -> web.Response:
        """``GET /api/version`` (no login): the RabbitMQ version followed."""
        return web.json_response(RABBITMQ_VERSION)
