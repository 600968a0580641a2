"""Publisher flow control: publishers stop being read while the store lags.

As RabbitMQ's credit flow (a publisher's connection goes to the ``flow`` state and is
not read from while the processes downstream of it lag), but with one signal for the
whole broker: the store's backlog of writes not yet committed
(:attr:`leveret.store.batched.BatchedStore.backlog_bytes`). Above its high mark the store
sets :attr:`PublisherFlow.active`; a connection that publishes while it is active
stops reading its socket (:meth:`PublisherFlow.hold`), without connection.blocked (as
RabbitMQ's flow state, and unlike a resource alarm), and reads again once the backlog
is back under the low mark (:meth:`PublisherFlow.set`). The message in hand, and the
rest of what was read with it, are still published: the backlog overshoots the high
mark by one read per publisher at most.

Unlike RabbitMQ, whose credit is per link (a publisher to a fast queue is not held
back by a slow one), every publisher is held while the store lags, whatever it
publishes to; ActiveMQ's producer flow control blocks producers of a destination
over its memory limit, or of every destination when the store's limit is reached.
"""

from __future__ import annotations

from typing import Protocol


class Held(Protocol):
    """A connection held by flow control."""

    def flow_released(self) -> None:
        """Flow control ended: read again (unless something else pauses reading)."""


class PublisherFlow:
    """Whether publishers are held, and which connections are (see the module)."""

    __slots__ = ("active", "held", "holds")

    def __init__(self) -> None:
        #: whether a publish now pauses its connection (the store's backlog is high)
        self.active = False
        self.held: set[Held] = set()
        #: connections held since start (a counter for metrics and probes)
        self.holds = 0

    def hold(self, connection: Held) -> None:
        """``connection`` published while flow control is active and stopped reading:
        it is told when to read again."""
        self.held.add(connection)
        self.holds += 1

    def forget(self, connection: Held) -> None:
        """``connection`` closed: it is no longer held (else a closed connection stayed
        referenced for as long as flow control lasts, which a stalled store makes
        indefinite)."""
        self.held.discard(connection)

    def set(self, active: bool) -> None:
        """The store's backlog went over its high mark (True) or under its low mark
        (False: every held connection is released)."""
        self.active = active
        if not active and self.held:
            held, self.held = self.held, set()
            for connection in held:
                connection.flow_released()
