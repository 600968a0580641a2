"""What a virtual host tells the cluster it belongs to (docs/cluster.md).

On a node of an active-active cluster every vhost holds a :class:`Replicator`
(``leveret.cluster.replication.Replication`` is the one); elsewhere
:attr:`.vhost.VirtualHost.replicator` is None and a vhost pays one attribute test per
declare, delete, bind or unbind, nothing per message. Durable definitions reach the
other nodes through the store (the node's store wrapper logs each save and delete);
the replicator hears about every entity, durable or not, so that transient queues,
exchanges and bindings, which the store never sees, are visible cluster-wide too, and
places and claims new queues.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .exchange import Binding, Exchange
    from .queues import Queue


class Replicator(Protocol):
    """The cluster side of a vhost's declares, deletes, binds and unbinds (``vhost``:
    the :class:`~.vhost.VirtualHost`, typed Any here: it imports this module)."""

    def vhost_added(self, vhost: Any) -> None:
        """A vhost was made here (at start-up, from another node's change, or by a
        client of this node), before its definition is saved: the cluster wraps its
        store (the node's publisher confirms wait for the queues' owners)."""

    def place_queue(
        self,
        vhost: Any,
        name: str,
        durable: bool,
        exclusive: bool,
        auto_delete: bool,
        arguments: dict,
    ) -> Queue | int:
        """Before a new queue is made: claim it for its owner node (may block on the
        database). An int: this node owns it, make it here with that store queue id
        (0: allocate one as usual). A Queue: another node owns it; it is in
        ``vhost.queues`` already (a RemoteQueue), and the declare goes on as a
        redeclaration of it."""

    def queue_added(self, vhost: Any, queue: Queue) -> None:
        """A queue was declared here (after its durable definition, if any, was saved)."""

    def queue_removed(self, vhost: Any, queue: Queue) -> None:
        """A queue was deleted here."""

    def exchange_added(self, vhost: Any, exchange: Exchange) -> None:
        """An exchange was declared here."""

    def exchange_removed(self, vhost: Any, exchange: Exchange) -> None:
        """An exchange was deleted here."""

    def binding_added(self, vhost: Any, binding: Binding) -> None:
        """A binding was added here."""

    def binding_removed(self, vhost: Any, binding: Binding) -> None:
        """A binding was removed here (also with its queue or exchange)."""
