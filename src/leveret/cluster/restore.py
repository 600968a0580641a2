"""Swapping a queue's stand-in: the real queue restored from the shared store in place
of its :class:`~leveret.core.queues.remote.RemoteQueue`, and back.

A node that becomes a queue's owner (a takeover, ``leveret ctl move_queue``, a peer's
graceful stop) restores it as start-up recovery does (:mod:`leveret.core.recovery`):
the queue object of its type, its ``queue_id``, then ``restore_paged`` with the counts
of its committed rows (:meth:`~leveret.store.batched.BatchedStore.count_blocks`), so
every persistent message comes back in publish order, ``redelivered`` set on those
delivered before (their stored delivery count), TTL (``expires_at``) and back-off
(``available_at``) as stored. Bindings move to the new object; local consumers of the
stand-in were cancelled when the old owner went (RabbitMQ's consumer cancel
notification), new ones attach to the real queue.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..core.exchange_base import Binding
from ..core.queues import Queue, queue_class
from ..core.queues.remote import RemoteQueue
from ..core.queues.stream import StreamQueue

if TYPE_CHECKING:
    from ..core.queues.remote import OwnerLink
    from ..core.vhost import VirtualHost
    from ..store import Store

log = logging.getLogger("leveret.cluster")

#: ``count_blocks`` rows: block -> (count, last seq, body bytes)
Counts = dict[int, tuple[int, int, int]]


def totals(counts: Counts) -> tuple[int, int, int]:
    """``(count, last seq, bytes)`` of a queue's stored rows, all blocks together."""
    return (
        sum(c for c, _, _ in counts.values()),
        max((s for _, s, _ in counts.values()), default=0),
        sum(b for _, _, b in counts.values()),
    )


def swap(vhost: VirtualHost, old: Queue, new: Queue) -> None:
    """Put ``new`` in ``old``'s place in ``vhost.queues``, with ``old``'s bindings."""
    vhost.queues[new.name] = new
    for binding in list(old.bindings):
        source = binding.source
        source.remove_binding(binding)
        moved = Binding(source, new, binding.routing_key, dict(binding.arguments))
        if source.add_binding(moved):
            new.bindings.append(moved)
    old.bindings.clear()
    vhost._entity_changed("queue", new.name)  # (queue federation runs where the queue is real)


def restore_queue(
    vhost: VirtualHost,
    stand_in: Queue,
    queue_id: int,
    store: Store,
    counts: Counts,
    dedup: Sequence[tuple[str, float]] = (),
) -> Queue:
    """The real queue of ``stand_in`` (a RemoteQueue, or a real queue recovered at
    start-up), owned by this node from now on, its messages read back from ``store``
    (``counts``: its committed rows, ``dedup`` its deduplication keys with their
    expiry, both read off the loop beforehand)."""
    arguments = dict(stand_in.arguments)
    queue = queue_class(arguments)(vhost, stand_in.name, True, None, stand_in.auto_delete, arguments)
    queue.store, queue.queue_id = store, queue_id
    if isinstance(stand_in, RemoteQueue):
        stand_in.owner_lost()
    else:
        stand_in.stop()
    swap(vhost, stand_in, queue)
    if queue.dedup is not None:
        for key, expires_at in dedup:
            queue.dedup.restore(key, expires_at)
    count, last_seq, size = totals(counts)
    queue.restore_paged(count, last_seq, size)
    if isinstance(queue, StreamQueue):
        queue.rebuild_index()
    return queue


def make_remote(vhost: VirtualHost, queue: Queue, owner: str, link: OwnerLink | None) -> RemoteQueue:
    """A RemoteQueue for ``owner`` in ``queue``'s place (``queue`` stops: timers off,
    its local consumers cancelled; its stored rows stay, the owner serves them)."""
    remote = RemoteQueue(
        vhost, queue.name, queue.durable, queue.auto_delete, dict(queue.arguments), owner, link
    )
    remote.queue_id = queue.queue_id
    queue.stop()
    for consumer in list(queue.consumers):
        consumer.cancel_by_broker()
    queue.consumers.clear()
    swap(vhost, queue, remote)
    return remote


def describe(queue: Any) -> str:
    """``'name' in vhost 'v'`` for logs."""
    return f"'{queue.name}' in vhost '{queue.host.name}'"
