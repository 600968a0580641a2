"""Message deduplication (the RabbitMQ plugin's arguments): ``x-message-deduplication``
(bool), ``x-deduplication-header`` (the header holding the key), ``x-cache-size``
(keys kept, at least 1), ``x-cache-ttl`` (ms, at least 1). The cache itself is
:class:`...deduplication.DeduplicationCache`."""

from __future__ import annotations

from typing import Any

from ...deduplication import DEFAULT_CACHE_SIZE
from ...queue_config import Arguments, flag, or_default

#: The arguments this feature reads (without ``x-``; also policy keys).
KEYS = ("message-deduplication", "deduplication-header", "cache-size", "cache-ttl")


def configure(args: Arguments) -> dict[str, Any]:
    """The :class:`.QueueConfig` fields of this feature: ``deduplication``,
    ``dedup_header``, ``cache_size``, ``cache_ttl`` (ms)."""
    return {
        "deduplication": flag(args.get("message-deduplication", bool), False),
        "dedup_header": args.get("deduplication-header", str),
        "cache_size": or_default(args.get("cache-size", int, 1), DEFAULT_CACHE_SIZE),
        "cache_ttl": args.get("cache-ttl", int, 1),
    }
