"""What a sans-I/O connection of any protocol is given by the server: the
:class:`Transport` it writes to and the :class:`Loop` whose time and timers it uses.

The server passes an asyncio transport and event loop (or a connection worker's link,
``protocol/amqp/remote.py``); tests pass fakes that move time by hand. Both are
structural types: nothing here imports asyncio.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ..core.clock import Timer


class Transport(Protocol):
    """What a connection writes to and closes: an asyncio transport (the server's), or
    a test's fake."""

    def write(self, data: bytes) -> None:
        """Queue ``data`` for the socket (never blocks)."""

    def close(self) -> None:
        """Close once the queued data is written."""

    def abort(self) -> None:
        """Close at once, dropping queued data."""

    def pause_reading(self) -> None:
        """Stop calling the connection's ``data_received`` (a blocked publisher)."""

    def resume_reading(self) -> None:
        """Read again after :meth:`pause_reading`."""


class Loop(Protocol):
    """The event loop as a connection uses it: monotonic time and timers (an asyncio
    loop, or a test's fake that moves time by hand)."""

    def time(self) -> float:
        """Monotonic time in seconds."""

    def call_later(self, delay: float, callback: Callable[[], object]) -> Timer:
        """Run ``callback`` once after ``delay`` seconds."""

    def call_soon(self, callback: Callable[[], object]) -> object:
        """Run ``callback`` in the next turn (the rest of a long read, protocol/turns.py)."""
