"""A queue that lives on another node of the cluster (docs/cluster.md).

Every node holds each queue of the cluster under its name in ``vhost.queues``: the
queue's owner node holds the real queue (classic, quorum, stream …), every other node a
:class:`RemoteQueue`. It routes like any queue (bindings, ``x-`` arguments and policies
are shared metadata) and hands the work to the owner through an :class:`OwnerLink` (the
cluster's link to that node, :mod:`leveret.cluster.peers`): a publish is forwarded once
per owner node, a consumer is relayed, acknowledgements go back with the owner's
delivery tags. Core never sees the link's transport.

SKELETON (issue 32): the interface other items build on; the message path fills it in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from .base import Queue

if TYPE_CHECKING:
    from ..message import Message
    from .host import QueueHost


class OwnerLink(Protocol):
    """The link from this node to the owner node of some queues
    (:class:`leveret.cluster.peers.PeerLink` implements it)."""

    #: the owner's node name
    node: str

    @property
    def alive(self) -> bool:
        """Whether the link is up (False: the owner is unreachable or gone)."""

    def forward(self, vhost: str, message: Message, done: Callable[[bool], None]) -> None:
        """Publish ``message`` (its exchange, routing key, header and body, unchanged) on
        the owner, which routes it to its own queues only; ``done(True)`` once the owner
        confirmed it (durably for a persistent message), ``done(False)`` if it nacked or
        the link went first."""


class RemoteQueue(Queue):
    """Queue ``name`` of ``host`` owned by node ``owner``, reached through ``link``."""

    def __init__(
        self,
        host: QueueHost,
        name: str,
        durable: bool,
        auto_delete: bool,
        arguments: dict | None,
        owner: str,
        link: OwnerLink | None,
    ) -> None:
        super().__init__(host, name, durable, None, auto_delete, arguments)
        #: the node that holds the real queue
        self.owner = owner
        self.link = link

    def retarget(self, owner: str, link: OwnerLink | None) -> None:
        """The queue moved to ``owner`` (a takeover, ``leveret ctl move_queue``)."""
        self.owner = owner
        self.link = link

    def owner_lost(self) -> None:
        """The owner went: consumers are cancelled (RabbitMQ's consumer cancel
        notification); publishes are refused until :meth:`retarget`."""
        for consumer in list(self.consumers):
            consumer.cancel_by_broker()
        self.consumers.clear()
