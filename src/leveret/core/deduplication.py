"""Message deduplication for queues and streams (``x-message-deduplication``).

A queue declared with ``x-message-deduplication: true`` drops a message whose
``message_id`` (or the header named by ``x-deduplication-header``) it has seen among
the last ``x-cache-size`` accepted messages, within ``x-cache-ttl`` ms when set. The
publisher still gets its confirm. The names follow the rabbitmq-message-deduplication
plugin. For a durable queue the cache is kept in the store and survives a restart.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from .message import Message

if TYPE_CHECKING:
    from .clock import Clock

DEFAULT_CACHE_SIZE = 100_000


def dedup_key(message: Message, header: str | None) -> str | None:
    """The identity of ``message``: a header's value or its message_id; None if absent."""
    if header is not None:
        value = message.headers.get(header)
    else:
        value = message.properties.message_id
    if value is None or value == "":
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class DeduplicationCache:
    """The keys seen, oldest first; ``size`` entries at most, each valid ``ttl``
    seconds (None: until evicted). ``on_add``/``on_evict`` keep a store in step."""

    def __init__(
        self, size: int, ttl: float | None, clock: Clock, on_add: Any = None, on_evict: Any = None
    ) -> None:
        self.size = size
        self.ttl = ttl
        self.clock = clock
        self._seen: OrderedDict[str, float] = OrderedDict()  # key -> expires_at (0: never)
        self._on_add = on_add
        self._on_evict = on_evict

    def restore(self, key: str, expires_at: float) -> None:
        """At start-up: ``key`` was seen, valid until ``expires_at`` (epoch seconds, 0:
        until evicted); no ``on_add``, the store has it."""
        self._seen[key] = expires_at

    def check_and_add(self, key: str) -> bool:
        """True if ``key`` is new (and is now remembered); False for a duplicate."""
        now = self.clock.time()
        expires_at = self._seen.get(key)
        if expires_at is not None and (not expires_at or expires_at > now):
            return False
        if expires_at is not None:
            del self._seen[key]
        new_expiry = now + self.ttl if self.ttl is not None else 0.0
        self._seen[key] = new_expiry
        if self._on_add is not None:
            self._on_add(key, new_expiry)
        while len(self._seen) > self.size:
            old, _ = self._seen.popitem(last=False)
            if self._on_evict is not None:
                self._on_evict(old)
        return True

    def __len__(self) -> int:
        return len(self._seen)
