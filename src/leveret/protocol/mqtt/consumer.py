"""An MQTT session's consumer on one queue: its own queue (every non-shared
subscription is a binding of it) or a shared subscription's queue (MQTT 5.0 §4.8.2:
``$share/<group>/<filter>``, one queue per group and filter, its members competing).

QoS 1 and 2 messages in flight count against the client's Receive Maximum (MQTT 5.0
§4.9; RabbitMQ's ``mqtt.prefetch`` for 3.1.1 clients), across all the session's
queues: :meth:`can_accept` asks the connection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ...core.queues import Queue, QueuedMessage
    from ...core.selector import Selector
    from .connection import MqttConnection


class MqttConsumer:
    """``connection``'s consumer on ``queue``; ``shared`` is the shared subscription's
    full filter (``$share/g/f``) or None for the session's own queue."""

    __slots__ = ("connection", "examined", "queue", "shared", "tag")

    exclusive = False
    no_ack = False
    prefetch = 0
    priority = 0
    selector: Selector | None = None
    arguments: dict = {}  # noqa: RUF012 (read only, shared)

    def __init__(self, connection: MqttConnection, queue: Queue, shared: str | None) -> None:
        self.connection = connection
        self.queue = queue
        self.shared = shared
        self.tag = f"mqtt-{connection.client_id}-{shared or 'session'}"
        self.examined = 0

    @property
    def global_prefetch(self) -> int:
        return 0

    def can_accept(self) -> bool:
        """Room in the client's Receive Maximum, and a writable socket."""
        return self.connection.can_deliver()

    def deliver(self, queue: Queue | None, entry: QueuedMessage) -> None:
        """Send ``entry`` as a PUBLISH (called by the queue)."""
        self.connection.deliver(self, entry)

    def cancel_by_broker(self) -> None:
        """The queue was deleted (by an operator): the session's subscriptions on it
        are gone."""
        self.connection.consumer_cancelled(self)
