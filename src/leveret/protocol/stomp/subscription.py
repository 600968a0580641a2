"""A STOMP subscription: core's Consumer on one queue, written as MESSAGE frames.

Ack modes (STOMP 1.2 §SUBSCRIBE, ActiveMQ's): ``auto`` counts a message acknowledged
once sent; ``client`` is cumulative (ACK of one message acknowledges every earlier
message of the subscription); ``client-individual`` acknowledges just that one.
``activemq.prefetchSize`` bounds the unacknowledged deliveries (defaults: 1000 on a
queue, 32767 on a topic, as ActiveMQ). A ``selector`` (JMS SQL-92, evaluated in core)
picks the messages it gets. ``activemq.exclusive`` subscriptions are ActiveMQ's
exclusive consumers: the oldest gets everything, the others stand by.
``activemq.priority`` is the consumer's priority (any integer, 0 by default): messages
go to the highest-priority subscriptions that have room, round-robin among equals.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from typing import TYPE_CHECKING

from ...core.queues import Queue, QueuedMessage
from ...core.selector import Selector

if TYPE_CHECKING:
    from .connection import StompConnection

ACK_MODES = ("auto", "client", "client-individual")
QUEUE_PREFETCH = 1000
TOPIC_PREFETCH = 32767


_ORDER = itertools.count()


def active_exclusive(queue: Queue) -> Subscription | None:
    """ActiveMQ's exclusive consumer: of the exclusive subscriptions on ``queue``, the
    oldest gets every message; the others (and the non-exclusive ones) stand by and
    take over when it leaves."""
    exclusive = [c for c in queue.consumers if isinstance(c, Subscription) and c.exclusive]
    return min(exclusive, key=lambda c: c.order) if exclusive else None


class Subscription:
    """Subscription ``id`` of ``connection`` on ``queue``."""

    __slots__ = (
        "ack_mode",
        "arguments",
        "connection",
        "destination",
        "examined",
        "exclusive",
        "frame_start",
        "id",
        "no_ack",
        "on_topic",
        "order",
        "prefetch",
        "priority",
        "queue",
        "selector",
        "tag",
        "temporary",
        "unacked",
    )

    def __init__(
        self,
        connection: StompConnection,
        id: str,
        destination: str,
        queue: Queue,
        ack_mode: str,
        prefetch: int,
        exclusive: bool,
        temporary: bool,
        selector: Selector | None = None,
        priority: int = 0,
    ) -> None:
        self.connection = connection
        self.id = id
        self.tag = f"stomp-{id}"
        self.destination = destination
        self.queue = queue
        self.ack_mode = ack_mode
        self.no_ack = ack_mode == "auto"
        self.prefetch = prefetch
        self.exclusive = exclusive
        self.order = next(_ORDER)  # subscription order, for the exclusive one's standbys
        self.arguments: dict = {}
        self.selector = selector
        self.examined = 0
        self.priority = priority  # activemq.priority: the consumer's priority
        #: a topic subscription's own queue, deleted with the subscription
        self.temporary = temporary
        #: subscribed to a topic (or an exchange), durably or not, rather than a queue
        self.on_topic = temporary
        #: a queue subscription's MESSAGE frames start alike (command, destination,
        #: subscription): made once
        self.frame_start: str | None = None
        #: delivery number -> entry, in delivery order (client modes only)
        self.unacked: OrderedDict[int, QueuedMessage] = OrderedDict()

    @property
    def global_prefetch(self) -> int:
        return 0

    def can_accept(self) -> bool:
        """Room in the prefetch window (client modes), a writable socket, and not on
        standby behind an exclusive subscription."""
        if not self.connection.writable:
            return False
        if (self.no_ack or len(self.unacked) < self.prefetch) and self.queue.has_exclusive_consumer:
            return self is active_exclusive(self.queue)
        return self.no_ack or len(self.unacked) < self.prefetch

    def deliver(self, queue: Queue | None, entry: QueuedMessage) -> None:
        """Send ``entry`` as a MESSAGE frame (called by the queue)."""
        self.connection.deliver(self, entry)

    def cancel_by_broker(self) -> None:
        """The queue was deleted: the subscription ends (ActiveMQ sends nothing; the
        connection forgets it)."""
        self.connection.subscription_cancelled(self)
