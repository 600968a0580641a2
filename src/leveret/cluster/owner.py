"""The owner side of the links between nodes (docs/cluster.md).

Another node reaches this one as an ordinary AMQP 0-9-1 client logged in as
:data:`~leveret.core.auth.CLUSTER_USER` with the cluster secret. :func:`accept_peers`
lets that user in, only on an active node (``core.cluster`` set): full permissions in
every vhost, never listed among the users. Its connections are marked by their user
(:meth:`~leveret.core.auth.UserDatabase.is_cluster_peer`), and their publishers route to
this node's own queues only: a forwarded message is never forwarded again (RemoteQueues
are skipped), and it counts in the real queues' figures only, not in the vhost's
publish rates, since the node it came from counted the publish.

What the peers' connections look like to operators (chosen): like RabbitMQ's
inter-node distribution links, they are not client connections: not listed in
``/api/connections`` nor counted in the connection gauges, never refused by a vhost's
``max-connections``, no connection advisories (:func:`leveret.core.lifecycle.open_connection`).
Their publishers do not count in the publishers gauge nor in the vhost's publish
rates (the node they came from counted them); the queues' own counters do count them.
Relayed consumers count among the owner's queue consumers (they are the queue's
consumers, on other nodes), so a queue's consumer count is cluster-wide on its owner.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..core.broker import BrokerCore


class NotClustered(RuntimeError):
    """:func:`accept_peers` on a broker that is not an active node."""


def accept_peers(core: BrokerCore, secret: str | None) -> None:
    """Accept the other nodes of the cluster (user ``leveret-cluster``, password
    ``secret``). Raises NotClustered unless ``core.cluster`` is set, ValueError for an
    empty or missing secret."""
    if getattr(core, "cluster", None) is None:
        raise NotClustered("the cluster's peer user is accepted on an active cluster node only")
    if not secret:
        raise ValueError("the cluster secret must not be empty")
    core.users.cluster_secret = secret
    core.users.changed()


def refuse_peers(core: BrokerCore) -> None:
    """Stop accepting the other nodes (the node leaves the cluster)."""
    core.users.cluster_secret = None
    core.users.changed()
