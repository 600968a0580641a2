"""What routing a message into a virtual host needs of it: :class:`Router`.

The vhost (:class:`.vhost.VirtualHost`) is one. The modules that publish on the
broker's own behalf - dead-lettering (:mod:`.dead_letter`), advisories
(:mod:`.advisory`), the scheduler (:mod:`.scheduler`) - take a Router rather than the
vhost itself, so that the vhost may use them without an import cycle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .clock import Clock
    from .exchange import Exchange
    from .message import Message
    from .queues import Queue
    from .queues.host import QueueAction


class Router(Protocol):
    """A virtual host as a place to route messages into."""

    #: The vhost's name.
    name: str
    #: Time and timers (epoch seconds).
    clock: Clock
    #: Its exchanges and queues by name.
    exchanges: dict[str, Exchange]
    queues: dict[str, Queue]
    #: What its queues handed back (:mod:`.queues.host`), for :meth:`carry_out`.
    actions: list[QueueAction]

    def route(self, exchange: Exchange, message: Message) -> list[Queue]:
        """The queues ``message`` reaches through ``exchange`` (each once)."""

    def carry_out(self) -> None:
        """Carry out what the queues handed back."""

    def declare_queue(self, name: str, owner: Any, passive: bool = False, durable: bool = False) -> Queue:
        """queue.declare (see :meth:`.vhost.VirtualHost.declare_queue`, which takes
        more)."""
