"""``leveret ctl move_queue VHOST QUEUE NODE``: a durable queue handed to another live
node (leveret's own: a RabbitMQ classic queue never leaves its node; docs/cluster.md).

The move is an ``owner`` change in the catalog (:meth:`Catalog.move_queue`): every other
node applies it as it applies a takeover's (the old owner drops its real queue for a
:class:`~leveret.core.queues.remote.RemoteQueue`, the new owner restores the queue from
the shared store at once, the others retarget their RemoteQueue). A node never applies
its own changes from the log, so the node the command runs on applies it itself.

When that node is the queue's owner, the queue's timers stop and what the store holds is
committed before the change is written, so the new owner restores every message
(unacknowledged ones as redelivered); then its real queue gives way to a RemoteQueue
(its consumers are cancelled: RabbitMQ's consumer cancel notification, as when a
queue's node goes). A move under load is not atomic: what the old owner stores or
delivers in the milliseconds between the change and its switch may be missed by the new
owner's restore or delivered again (at-least-once; the issue asks for takeovers of dead
nodes, and this is an operator's command).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ..core.queues.remote import RemoteQueue

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
    if queue is not None and not isinstance(queue, RemoteQueue) and before != target:
        queue.stop()  # no more timers writing its rows
        await _durable(node.store)
    epoch = int(await asyncio.to_thread(node.catalog.move_queue, vhost, name, target))
    if epoch:
        owners = await asyncio.to_thread(node.catalog.owners)
        queue_id = owners.get((vhost, name), (target, 0))[1]
        node.replication.apply_own_owner_change(vhost, name, target, queue_id)
        if not await asyncio.to_thread(node.catalog.wait_applied, epoch, APPLIED_TIMEOUT):
            log.warning("moving queue %r of vhost %r to %s: not applied everywhere yet", name, vhost, target)
    log.info("queue %r in vhost %r moved from node %s to node %s", name, vhost, before, target)
    return before, epoch


async def _durable(store: Any) -> None:
    """Until what ``store`` holds now is committed (or :data:`DURABLE_TIMEOUT`)."""
    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    store.when_durable(lambda ok: loop.call_soon_threadsafe(done.set))
    try:
        await asyncio.wait_for(done.wait(), DURABLE_TIMEOUT)
    except TimeoutError:
        log.warning("move: the store did not commit within %.0f s", DURABLE_TIMEOUT)


__all__ = ["move_queue"]
