"""``leveret ctl``'s cluster commands (docs/cluster.md), on the local node's control
socket: ``cluster_status`` and ``forget_cluster_node`` as rabbitmqctl's, and
``move_queue``, leveret's own.

The catalog's calls block (PostgreSQL round trips): they run in a thread, never on the
broker's event loop. A broker that is not a cluster node answers ``cluster_status`` as
a single RabbitMQ node does (itself, the only disk and running node) and refuses the
other two.

``move_queue VHOST QUEUE NODE`` moves a durable queue's ownership to another live node.
RabbitMQ 3.10 has no verb for it: a classic queue never leaves its node there, and
``rabbitmq-queues``' verbs (``rebalance``: the leaders of every replicated queue;
``grow``/``shrink``/``add_member``/``delete_member``: quorum replicas) do something else.
"""

from __future__ import annotations

import asyncio
import inspect
import platform
import time
from typing import TYPE_CHECKING, Any

from ..cluster.move import move_queue
from ..core.errors import BrokerError
from ..management.cluster_view import address, cluster_name, registered_nodes, running, this_node
from ..management.runtime import NODE
from ..store.base import StoreError
from ..version import __version__

if TYPE_CHECKING:
    from .broker import Broker


class CommandError(BrokerError):
    """A cluster command that cannot be carried out; its text goes back to ``leveret ctl``."""


#: the commands, by name: ``(handler, changes)`` (``changes``: audited); registered by
#: :mod:`.control`
CLUSTER_COMMANDS: dict[str, tuple[Any, bool]] = {}


def command(name: str, changes: bool = False) -> Any:
    def register(handler: Any) -> Any:
        CLUSTER_COMMANDS[name] = (handler, changes)
        return handler

    return register


#: seconds ``move_queue`` waits for this node to see the queue on its new owner
MOVE_SEEN_TIMEOUT = 5.0

#: what a listener's protocol is for, in rabbitmqctl cluster_status's words
_PURPOSES = {
    "amqp": "AMQP 0-9-1 and AMQP 1.0",
    "amqp/ssl": "AMQP 0-9-1 and AMQP 1.0 over TLS",
    "http": "HTTP API",
    "https": "HTTP API over TLS (HTTPS)",
    "stomp": "STOMP",
    "mqtt": "MQTT",
    "mqtt/ssl": "MQTT over TLS",
    "http/web-stomp": "STOMP over WebSockets",
    "http/web-mqtt": "MQTT over WebSockets",
    "http/web-amqp": "AMQP 1.0 over WebSockets",
}


def _listener(node: str, protocol: str, interface: str, port: int) -> dict[str, Any]:
    return {
        "interface": interface,
        "node": node,
        "port": port,
        "protocol": protocol,
        "purpose": _PURPOSES.get(protocol, protocol),
    }


async def status_document(broker: Broker) -> dict[str, Any]:
    """rabbitmqctl cluster_status's JSON (``--formatter json``): ``cluster_name``,
    ``disk_nodes`` (every registered node: each keeps its queues in the shared store),
    ``running_nodes`` (the live ones), ``ram_nodes`` (none), ``partitions`` (none: a
    node cut from PostgreSQL stops, it never runs apart), ``alarms``, ``listeners``
    and ``versions`` per node (another node's: the ports it registered), and
    ``maintenance_status``."""
    core = broker.core
    me = this_node(core, NODE)
    info = broker.node_info()
    nodes = await registered_nodes(core) or [{"name": me, "running": True}]
    names = [str(row["name"]) for row in nodes]
    if me not in names:
        names.append(me)
    live = [str(row["name"]) for row in nodes if running(row)]
    if me not in live:
        live.append(me)
    listeners: dict[str, list[dict[str, Any]]] = {
        me: [_listener(me, p, ip, port) for p, ip, port in info.get("listeners", [])]
    }
    for row in nodes:
        name = str(row["name"])
        if name == me or not running(row):
            continue
        listeners[name] = [
            _listener(name, protocol, *found)
            for protocol in ("amqp", "http")
            if (found := address(row, protocol)) is not None
        ]
    return {
        "alarms": [{"node": me, "resource": source} for source in sorted(core.alarm_sources)],
        "cluster_name": cluster_name(core, NODE),
        "disk_nodes": sorted(names),
        "feature_flags": [],
        "listeners": listeners,
        "maintenance_status": {name: "not under maintenance" for name in sorted(live)},
        "partitions": {},
        "ram_nodes": [],
        "running_nodes": sorted(live),
        "versions": {
            me: {
                "erlang_version": platform.python_version(),
                "rabbitmq_name": "leveret",
                "rabbitmq_version": __version__,
            }
        },
    }


@command("cluster_status")
async def _cluster_status(broker: Broker, args: dict[str, Any]) -> dict[str, Any]:
    return {"document": await status_document(broker), "node": this_node(broker.core, NODE)}


def _cluster(broker: Broker) -> Any:
    cluster = broker.core.cluster
    if cluster is None:
        raise CommandError("this broker is not a cluster node (start it with --node: docs/cluster.md)")
    return cluster


async def _call(function: Any, *args: Any) -> Any:
    """``function(*args)`` in a thread (a blocking catalog call), awaited if it answers
    with an awaitable (a coroutine function)."""
    result = await asyncio.to_thread(function, *args)
    if inspect.isawaitable(result):
        result = await result
    return result


@command("forget_cluster_node", changes=True)
async def _forget(broker: Broker, args: dict[str, Any]) -> dict[str, Any]:
    """Remove a stopped node from the catalog (its queues were taken over when it went);
    refused for a running node and for this one, as RabbitMQ refuses them."""
    cluster = _cluster(broker)
    name = str(args["node"])
    if name == cluster.node:
        raise CommandError(f"failed_to_remove_node: {name} is the node this command runs on")
    rows = {str(row["name"]): row for row in await registered_nodes(broker.core)}
    if name not in rows:
        raise CommandError(f"not_a_cluster_node: {name} is not a member of the cluster")
    if running(rows[name]):
        raise CommandError(f"failed_to_remove_node: {name} is running (stop it first)")
    await _call(cluster.catalog.forget_node, name)
    return {"message": f"Removing node {name} from the cluster"}


@command("move_queue", changes=True)
async def _move_queue(broker: Broker, args: dict[str, Any]) -> dict[str, Any]:
    """Move durable queue ``queue`` of ``vhost`` to live node ``node`` (its messages are
    in the shared store: the new owner restores them). Refused for a missing, exclusive,
    auto-delete or non-durable queue (they live with their connection's node) and for a
    node that is not running."""
    cluster = _cluster(broker)
    vhost_name, queue_name, target = str(args.get("vhost", "/")), str(args["queue"]), str(args["node"])
    vhost = broker.core.vhosts.get(vhost_name)
    if vhost is None:
        raise CommandError(f"virtual host '{vhost_name}' does not exist")
    queue = vhost.queues.get(queue_name)
    if queue is None:
        raise CommandError(f"queue '{queue_name}' in vhost '{vhost_name}' does not exist")
    if not queue.durable or queue.auto_delete or queue.exclusive_owner is not None:
        raise CommandError(
            f"queue '{queue_name}' is not durable (or is exclusive or auto-delete): it stays on its node"
        )
    rows = {str(row["name"]): row for row in await registered_nodes(broker.core)}
    if target not in rows or not running(rows[target]):
        raise CommandError(f"node {target} is not a running node of the cluster")
    before = cluster.owner_of(vhost_name, queue_name)
    if before == target:
        return {"message": f"Queue '{queue_name}' in vhost '{vhost_name}' is already on node {target}"}
    try:
        await move_queue(cluster, vhost_name, queue_name, target)
    except StoreError as exc:  # the catalog's refusal (CatalogError), a fenced node
        raise CommandError(str(exc)) from exc
    deadline = time.monotonic() + MOVE_SEEN_TIMEOUT
    while cluster.owner_of(vhost_name, queue_name) != target and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    what = f"queue '{queue_name}' in vhost '{vhost_name}'"
    return {"message": f"Moving {what} from node {before} to node {target}"}


__all__ = ["CLUSTER_COMMANDS", "CommandError", "status_document"]
