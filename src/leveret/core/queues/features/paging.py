"""How much of a classic queue's backlog stays in memory before new messages are paged
out to the store (:mod:`..backlog`).

As RabbitMQ 3.10's classic queues: a default queue keeps its messages in memory (a
persistent one is in the store too) until the broker's memory passes the paging
threshold of the memory watermark (``vm_memory_high_watermark_paging_ratio``, the
memory monitor); then new messages go to the store only, and those in memory move
there but for a batch. ``x-queue-mode: lazy``
(RabbitMQ: "move contents to disk as early as practically possible") keeps a small
in-memory part, :data:`.LAZY_IN_MEMORY` messages; ``x-max-in-memory-length``
(messages, at least 0) and ``x-max-in-memory-bytes`` (body bytes, as RabbitMQ's
quorum queues name it) bound it (arguments or policy keys; the one not given is
:data:`.BOUNDED_IN_MEMORY` / :data:`.BOUNDED_IN_MEMORY_BYTES`). 406 for invalid
values."""

from __future__ import annotations

from typing import Any

from ...queue_config import (
    BOUNDED_IN_MEMORY,
    BOUNDED_IN_MEMORY_BYTES,
    DEFAULT_IN_MEMORY,
    DEFAULT_IN_MEMORY_BYTES,
    LAZY_IN_MEMORY,
    STORED_IN_MEMORY,
    STORED_IN_MEMORY_BYTES,
    Arguments,
    or_default,
)

#: The arguments this feature reads (without ``x-``; also policy keys).
KEYS = ("max-in-memory-length", "max-in-memory-bytes", "queue-mode")


def configure(args: Arguments) -> dict[str, Any]:
    """The :class:`.QueueConfig` fields of this feature: ``max_in_memory`` (messages)
    and ``max_in_memory_bytes``; unlimited (:data:`.DEFAULT_IN_MEMORY`) for a default
    queue, which pages under memory pressure only, or once it holds
    :data:`.STORED_IN_MEMORY` messages or :data:`.STORED_IN_MEMORY_BYTES` body bytes in
    memory and a persistent message comes (``stored_in_memory``,
    ``stored_in_memory_bytes``: the in-memory limits when they are given)."""
    length = args.get("max-in-memory-length", int, 0)
    size = args.get("max-in-memory-bytes", int, 0)
    lazy = args.get("queue-mode", str) == "lazy"
    if length is None and size is None and not lazy:
        return {
            "max_in_memory": DEFAULT_IN_MEMORY,
            "max_in_memory_bytes": DEFAULT_IN_MEMORY_BYTES,
            "stored_in_memory": STORED_IN_MEMORY,
            "stored_in_memory_bytes": STORED_IN_MEMORY_BYTES,
        }
    max_in_memory = or_default(length, LAZY_IN_MEMORY if lazy else BOUNDED_IN_MEMORY)
    max_in_memory_bytes = or_default(size, BOUNDED_IN_MEMORY_BYTES)
    return {
        "max_in_memory": max_in_memory,
        "max_in_memory_bytes": max_in_memory_bytes,
        "stored_in_memory": max_in_memory,
        "stored_in_memory_bytes": max_in_memory_bytes,
    }
