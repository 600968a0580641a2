"""leveret: a message broker that RabbitMQ (AMQP 0-9-1) clients use unchanged.

``import leveret`` is light: the embedded :class:`Broker` and :class:`BlockingBroker`
(which load the server, the store and aiohttp) are imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .version import __version__

if TYPE_CHECKING:
    from .server.broker import BlockingBroker, Broker

__all__ = ["BlockingBroker", "Broker", "__version__"]


def __getattr__(name: str) -> Any:
    if name in ("Broker", "BlockingBroker"):
        from .server import broker

        return getattr(broker, name)
    raise AttributeError(f"module 'leveret' has no attribute {name!r}")
