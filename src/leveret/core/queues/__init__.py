"""Queue types behind one interface, as RabbitMQ's ``rabbit_queue_type``.

- :mod:`.base`: :class:`Queue`, the interface every type implements (and what they
  share: identity, configuration, consumers, bindings, ``x-expires``), the
  :class:`Consumer` protocol adapters implement;
- :mod:`.entry`: :class:`QueuedMessage`, a message's place in a queue, and its states;
- :mod:`.host`: :class:`.host.QueueHost`, what a queue needs of its vhost, and the
  actions it hands back to it (dead-letter, unused, consumer advisory);
- :mod:`.features`: the features queues are made of, each checking its own ``x-``
  arguments (TTL, length limits, redelivery, dead-lettering, deduplication, message
  groups, leases, the console's hold/scan);
- :mod:`.classic`: the classic queue (FIFO, round-robin dispatch), its ordered storage
  with paging in :mod:`.backlog`, by priority (``x-max-priority``) in
  :mod:`.priority_backlog`;
- :mod:`.quorum`: the quorum queue (a classic queue under RabbitMQ's quorum rules,
  every message stored);
- :mod:`.stream`: the stream queue (an append-only log read by offset);
- :mod:`.outcome`: :class:`.Enqueued`, what enqueueing did, for a publisher's confirm;
- :mod:`.timers`: named timers on core's clock.

A new type is a new module registered in :data:`QUEUE_TYPES`.
"""

from __future__ import annotations

from .base import DELAYED, GONE, READY, UNACKED, Consumer, Queue, QueuedMessage
from .classic import ClassicQueue
from .outcome import ACCEPTED, REJECTED, STORED, STORED_REJECTED, Enqueued
from .quorum import QuorumQueue
from .stream import StreamQueue

#: x-queue-type -> the type's class.
QUEUE_TYPES: dict[str, type[Queue]] = {cls.type_name: cls for cls in (ClassicQueue, QuorumQueue, StreamQueue)}


def queue_class(arguments: dict) -> type[Queue]:
    """The class for a queue declared with ``arguments`` (by ``x-queue-type``, classic
    by default). An unknown type gets the classic class, whose configuration
    (:func:`.features.build`) refuses it with RabbitMQ's 406 text."""
    name = arguments.get("x-queue-type", "classic")
    if isinstance(name, (bytes, bytearray)):
        name = name.decode("utf-8", "replace")
    return QUEUE_TYPES.get(name, ClassicQueue) if isinstance(name, str) else ClassicQueue


__all__ = [
    "ACCEPTED",
    "DELAYED",
    "GONE",
    "QUEUE_TYPES",
    "READY",
    "REJECTED",
    "STORED",
    "STORED_REJECTED",
    "UNACKED",
    "ClassicQueue",
    "Consumer",
    "Enqueued",
    "Queue",
    "QueuedMessage",
    "QuorumQueue",
    "StreamQueue",
    "queue_class",
]
