"""A message's place in one queue (:class:`QueuedMessage`) and its states."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..message import Message

# QueuedMessage.state
READY, UNACKED, GONE, DELAYED = 0, 1, 2, 3


class QueuedMessage:
    """A message's place in one queue: ``seq`` orders it, ``delivery_count`` counts the
    deliveries so far (0 before the first), ``expires_at`` is epoch seconds (0: never)."""

    __slots__ = (
        "delivery_count",
        "expires_at",
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
        self.store_id = store_id  # > 0 while the message is in the store
        self.state = READY
        self.expires_at = expires_at

    def __lt__(self, other: QueuedMessage) -> bool:
        return self.seq < other.seq


__all__ = ["DELAYED", "GONE", "READY", "UNACKED", "QueuedMessage"]
