"""How much of a classic queue's backlog stays in memory before new messages are paged
out to the store (:mod:`..backlog`): ``x-max-in-memory-length`` (messages, at least 0),
``x-max-in-memory-bytes`` (body bytes, as RabbitMQ's quorum queues name it) and
RabbitMQ's ``x-queue-mode`` (``lazy``: a small in-memory part). 406 for invalid values."""

from __future__ import annotations

from typing import Any

from ...queue_config import DEFAULT_IN_MEMORY, DEFAULT_IN_MEMORY_BYTES, LAZY_IN_MEMORY, Arguments, or_default

#: The arguments this feature reads (without ``x-``; also policy keys).
KEYS = ("max-in-memory-length", "max-in-memory-bytes", "queue-mode")


def configure(args: Arguments) -> dict[str, Any]:
    """The :class:`.QueueConfig` fields of this feature: ``max_in_memory`` (messages)
    and ``max_in_memory_bytes``."""
    in_memory = args.get("max-in-memory-length", int, 0)
    if in_memory is None:
        in_memory = LAZY_IN_MEMORY if args.get("queue-mode", str) == "lazy" else DEFAULT_IN_MEMORY
    return {
        "max_in_memory": in_memory,
        "max_in_memory_bytes": or_default(args.get("max-in-memory-bytes", int, 0), DEFAULT_IN_MEMORY_BYTES),
    }
