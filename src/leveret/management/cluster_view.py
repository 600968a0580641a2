"""The cluster seen from any node (docs/cluster.md), in RabbitMQ 3.10's shapes.

A broker that is a node of an active-active cluster (``core.cluster``, a
``leveret.cluster.node.ClusterNode``) names itself by its node name (``--node``) in
every ``node`` field of the HTTP API, and ``/api/nodes`` lists every node registered
in the cluster's catalog, running or not, as RabbitMQ lists its cluster's members:

- this node's row is the full single-node row (memory, file descriptors, listeners'
  ports …) under its node name;
- another node's row has what the catalog knows of it, truthfully: ``name``, ``type``
  ``"disc"`` (every node keeps its queues in the shared store), ``running`` (its
  advisory lock is held: it is live), ``uptime`` (ms, while running), and leveret's own
  fields as ``ClusterNode.nodes()`` gives them (``state``: ``running`` or ``left``;
  ``amqp`` and ``http``: ``HOST:PORT``; ``queues``: how many it owns …). RabbitMQ
  3.10 answers a member whose statistics it has not collected with just ``name``,
  ``type``, ``running`` and ``cluster_links`` too.

A queue's ``node`` is its owner: a :class:`~leveret.core.queues.remote.RemoteQueue`'s
``owner``, this node's name for a queue held here. Without a cluster every name stays
what the single broker always said (``node`` of a queue ``leveret@localhost``, of the
broker ``leveret@HOST``).
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

from ..core.broker import BrokerCore
from ..core.queues import Queue
from ..core.queues.remote import RemoteQueue

#: a queue's ``node`` when the broker is not clustered (the single broker's, as before)
SINGLE_QUEUE_NODE = "leveret@localhost"

#: the fields of ``ClusterNode.nodes()``' rows that the API rows do not repeat
_NOT_SHOWN = frozenset(("this_node", "live"))


def this_node(core: BrokerCore, single: str) -> str:
    """This broker's node name: its cluster node name, else ``single``."""
    cluster = core.cluster
    return str(cluster.node) if cluster is not None else single


def queue_node(core: BrokerCore, queue: Queue) -> str:
    """The node ``queue`` lives on (its owner)."""
    cluster = core.cluster
    if cluster is None:
        return SINGLE_QUEUE_NODE
    if isinstance(queue, RemoteQueue):
        return queue.owner
    return str(cluster.node)


def cluster_name(core: BrokerCore, single: str) -> str:
    """RabbitMQ's ``cluster_name``: the global parameter if set, else the cluster's name
    (``--cluster``) on a node, else the single broker's name."""
    name = core.global_parameters.get("cluster_name")
    if isinstance(name, str) and name:
        return name
    cluster = core.cluster
    if cluster is not None:
        return str(cluster.cluster)
    return str(core.cluster_name() or single)


async def registered_nodes(core: BrokerCore) -> list[dict[str, Any]]:
    """``core.cluster.nodes()`` (the catalog's rows may be read with a blocking call: run
    in a thread), sorted by name; [] when not clustered."""
    cluster = core.cluster
    if cluster is None:
        return []
    rows = await asyncio.to_thread(cluster.nodes)
    if inspect.isawaitable(rows):
        rows = await rows
    return sorted((dict(row) for row in rows), key=lambda row: str(row.get("name", "")))


def running(row: dict[str, Any]) -> bool:
    """Whether a node of ``ClusterNode.nodes()`` is live."""
    return bool(row.get("running", row.get("live", False)))


def node_rows(nodes: list[dict[str, Any]], local: dict[str, Any]) -> list[dict]:
    """The ``/api/nodes`` rows of ``nodes`` (``ClusterNode.nodes()``), by name; ``local``
    is this node's own row (named with its node name). This node is listed even if the
    catalog has not got its row yet."""
    me = str(local["name"])
    rows = [_row(node, me, local) for node in nodes]
    if not any(row["name"] == me for row in rows):
        rows.append(local)
    return sorted(rows, key=lambda row: str(row["name"]))


def _row(node: dict[str, Any], me: str, local: dict[str, Any]) -> dict:
    name = str(node.get("name", ""))
    extra = {key: value for key, value in node.items() if key not in _NOT_SHOWN}
    if name == me:  # this node's own figures (uptime, memory …) over the catalog's
        return {**extra, **local, "name": name}
    live = running(node)
    row: dict[str, Any] = {
        **extra,
        "name": name,
        "type": "disc",
        "running": live,
        "cluster_links": [],
        "partitions": [],
        "being_drained": False,
    }
    row.pop("uptime", None)
    if live and node.get("uptime"):
        row["uptime"] = int(node["uptime"])
    return row


def address(node: dict[str, Any], protocol: str) -> tuple[str, int] | None:
    """A node's ``amqp`` or ``http`` address ``(host, port)`` from its
    ``ClusterNode.nodes()`` row (``"HOST:PORT"``, or ``host`` and ``amqp_port``), if it
    registered one."""
    value = node.get(protocol)
    if isinstance(value, str) and ":" in value:
        host, _, number = value.rpartition(":")
        return (host, int(number)) if number.isdigit() and int(number) else None
    port = node.get(f"{protocol}_port")
    return (str(node.get("host") or ""), int(port)) if port else None


__all__ = ["address", "cluster_name", "node_rows", "queue_node", "registered_nodes", "running", "this_node"]
