"""``leveret ctl move_queue VHOST QUEUE NODE``: a durable queue handed to another live
node (leveret's own: a RabbitMQ classic queue never leaves its node; docs/cluster.md).

The move is an ``owner`` change in the catalog (:meth:`Catalog.move_queue`): every other
node applies it as it applies a takeover's (the old owner drops its real queue for a
:class:`~leveret.core.queues.remote.RemoteQueue`, the new owner restores the queue from
the shared store, the others retarget their RemoteQueue). A node never applies its own
changes from the log, so the node the command runs on applies it itself.

No confirmed message is lost under load. When the command runs on the queue's owner,
its real queue gives way to a RemoteQueue *before* the change is written (its timers
stop, its consumers are cancelled: RabbitMQ's consumer cancel notification, as when a
queue's node goes), and what the store holds is committed; an old owner that learns
of the move from the log commits likewise before it reports the change applied. The
new owner restores the queue only once every live node applied the change (so after
the old owner's last write). Meanwhile — and until every live node applied the change
— the queue is *in transition* on every node
(:attr:`~leveret.core.queues.remote.RemoteQueue.in_transition`): publishes routed to
it, and those another node forwarded that reach it, get a negative confirm (the
publisher sends them again), since the sender's view of the owner may not be the
receiver's. Delivery stays at-least-once: a message delivered by the old owner and
not yet acknowledged comes back (redelivered) from the new one.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ..core.queues.remote import RemoteQueue
from ..store import StoreError
from .restore import make_remote, restore_queue

log = logging.getLogger("leveret.cluster")

#: seconds the store may take to commit what it holds before the change is written
DURABLE_TIMEOUT = 10.0
#: seconds the change may take to be applied by every live node
APPLIED_TIMEOUT = 5.0


async def move_queue(node: Any, vhost: str, name: str, target: str) -> tuple[str | None, int]:
    """Make live node ``target`` the owner of durable queue ``name`` of ``vhost``, from
    ``node`` (a :class:`~.node.ClusterNode`). Returns (the previous owner as this node
    saw it, the change's epoch; 0: it already was). StoreError (CatalogError) if the
    queue has no owner, ``target`` is not live or this node is fenced."""

    host = node.core.vhosts.get(vhost)
    queue = host.queues.get(name) if host is not None else None
    before = node.owner_of(vhost, name)
    stand_in = None
    if host is not None and queue is not None and not isinstance(queue, RemoteQueue) and before != target:
        # nothing stored here from now on: publishes to it are refused until the move is done
        stand_in = make_remote(host, queue, target, node.link(target, vhost))
        stand_in.transition = True
        await durable(node.store)
    try:
        epoch = int(await asyncio.to_thread(node.catalog.move_queue, vhost, name, target))
    except (StoreError, OSError):
        if stand_in is not None and host is not None and host.queues.get(name) is stand_in:
            counts = await asyncio.to_thread(node.store.count_blocks, stand_in.queue_id)
            restore_queue(host, stand_in, stand_in.queue_id, node.store, counts)  # still ours
        raise
    if epoch:
        owners = await asyncio.to_thread(node.catalog.owners)
        queue_id = owners.get((vhost, name), (target, 0))[1]
        node.replication.apply_own_owner_change(vhost, name, target, queue_id, epoch)
        if not await asyncio.to_thread(node.catalog.wait_applied, epoch, APPLIED_TIMEOUT):
            log.warning("moving queue %r of vhost %r to %s: not applied everywhere yet", name, vhost, target)
    elif stand_in is not None:
        stand_in.transition = False
    log.info("queue %r in vhost %r moved from node %s to node %s", name, vhost, before, target)
    return before, epoch


async def durable(store: Any) -> None:
    """Until what ``store`` holds now is committed (or :data:`DURABLE_TIMEOUT`)."""
    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    store.when_durable(lambda ok: loop.call_soon_threadsafe(done.set))
    try:
        await asyncio.wait_for(done.wait(), DURABLE_TIMEOUT)
    except TimeoutError:
        log.warning("move: the store did not commit within %.0f s", DURABLE_TIMEOUT)


__all__ = ["durable", "move_queue"]
