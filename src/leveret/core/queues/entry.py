"""A message's place in one queue (:class:`QueuedMessage`) and its states."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..message import Message

# QueuedMessage.state
READY, UNACKED, GONE, DELAYED = 0, 1, 2, 3


class QueuedMessage:
    """A message's place in one queue: ``seq`` orders it, ``delivery_count`` counts the
    deliveries so far (0 before the first; RabbitMQ 4.3's acquired count + 1 while
    delivered), ``failed_count`` the failed ones among them (RabbitMQ 4.3's
    delivery-count: rejects, NACKs, ``modified`` with delivery-failed; what the delivery
    limit counts), ``expires_at`` is epoch seconds (0: never)."""

    __slots__ = (
        "delivery_count",
        "expires_at",
        "failed_count",
        "message",
        "redelivered",
        "seq",
        "state",
        "store_id",
    )

    def __init__(self, message: Message, seq: int, store_id: int = 0, expires_at: float = 0.0) -> None:
        self.message = message
        self.seq = seq
        self.redelivered = False
        self.delivery_count = 0
        self.failed_count = 0
        self.store_id = store_id  # > 0 while the message is in the store
        self.state = READY
        self.expires_at = expires_at

    def __lt__(self, other: QueuedMessage) -> bool:
        return self.seq < other.seq


def delivery_counts(entry: QueuedMessage, always: bool) -> tuple[tuple[str, int], ...]:
    """The per-delivery count headers, as RabbitMQ 4.3 names them: ``x-delivery-count``
    (failed deliveries so far) once one failed, or always with ``always`` (a queue with
    a redelivery policy: ActiveMQ's JMSXDeliveryCount - 1 on every delivery);
    ``x-acquired-count`` (deliveries before this one, returns included) once the
    message was delivered before."""
    acquired = entry.delivery_count - 1
    if entry.failed_count or always:
        if acquired > 0:
            return (("x-delivery-count", entry.failed_count), ("x-acquired-count", acquired))
        return (("x-delivery-count", entry.failed_count),)
    if acquired > 0:
        return (("x-acquired-count", acquired),)
    return ()


__all__ = ["DELAYED", "GONE", "READY", "UNACKED", "QueuedMessage", "delivery_counts"]
