"""What a queue needs of its host, and what it hands back to it.

A queue never calls up into its virtual host. It reads what it needs through
:class:`QueueHost` (the clock, memory pressure, the matching policy, the host's name for
error texts) and *records* what the host must do as :data:`QueueAction` values: a
message to dead-letter with a reason (:class:`DeadLetter`), itself unused and to be
deleted (:class:`Unused`), a consumer advisory (:class:`ConsumerChanged`). The host's
driver (:meth:`QueueHost.carry_out`) performs them once the queue's method has returned,
so dead-lettering never re-enters routing inside the dying queue's own method (a dead
copy routed back to the same queue finds it consistent), as RabbitMQ's
``rabbit_queue_type`` callbacks return ``{State, Actions}`` and ``rabbit_fifo:apply/3``
returns effects.

Who runs the driver: the queue's public entry points (:func:`hands_back`; written out
in those that run per message: ``drain``, ``get``, ``discard``, ``requeue``), its timers
(:class:`.timers.Timers`), and callers of :meth:`.Queue.enqueue` on the publish path
(:meth:`.publish.Publisher._route`, the scheduler, advisories), which check
``host.actions`` once per publish rather than per queue.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from ..clock import Clock
    from ..message import Message
    from ..metrics import QueueCounters
    from ..queue_config import QueueConfig
    from ..queue_memory import QueueMemory


class HostedQueue(Protocol):
    """What the host's driver and dead-lettering read of a queue (every
    :class:`.base.Queue` is one; a protocol so that this module stays below the queue
    types)."""

    name: str
    deleted: bool
    config: QueueConfig
    counters: QueueCounters
    actions: list[QueueAction]
    host: QueueHost


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """``message`` died in ``queue`` for ``reason`` (``rejected``, ``expired``,
    ``maxlen``, ``delivery_limit``): send it where the queue's dead-letter
    configuration says (:func:`..dead_letter.dead_letter`). The queue has already let
    go of it (acknowledged: gone from the store in the same batch as the dead copy is
    written)."""

    queue: HostedQueue
    message: Message
    reason: str


@dataclass(frozen=True, slots=True)
class Unused:
    """``queue`` is unused: ``x-expires`` ran out, or an ``auto_delete`` queue lost
    its last consumer (RabbitMQ): delete it."""

    queue: HostedQueue


@dataclass(frozen=True, slots=True)
class ConsumerChanged:
    """Consumer ``tag`` was ``added`` or ``removed`` on ``queue``: ActiveMQ's consumer
    advisory (:func:`..advisory.consumer_event`)."""

    queue: HostedQueue
    tag: str
    event: str


#: What a queue hands back to its host.
QueueAction = DeadLetter | Unused | ConsumerChanged


class QueueHost(Protocol):
    """What a queue needs of the virtual host it lives in (implemented by
    :class:`..vhost.VirtualHost`)."""

    #: The host's name (a virtual host's), for error texts.
    name: str
    #: Time and timers (epoch seconds).
    clock: Clock
    #: Memory is short: a queue with a store pages every new message out.
    memory_pressure: bool
    #: The broker's count of bytes queues hold messages in (:mod:`..queue_memory`).
    queue_memory: QueueMemory
    #: Actions recorded by the host's queues, carried out by :meth:`carry_out` (a queue
    #: appends, never runs them).
    actions: list[QueueAction]

    def policy_for(self, name: str, kind: str) -> dict | None:
        """The definition of the policy that applies to queue ``name`` (``kind``
        ``"queues"``), with the operator policy merged in; None: none."""

    def carry_out(self) -> None:
        """Perform the recorded :attr:`actions`, in order, until none is left (an
        action may lead to more: a dead copy overflowing its dead-letter queue)."""


F = TypeVar("F", bound=Callable[..., Any])


def hands_back(method: F) -> F:
    """A queue's public entry point: once ``method`` has returned, the host carries out
    the actions it recorded. Internal calls go to undecorated methods, so the actions
    run only when the outermost entry point is done."""

    @functools.wraps(method)
    def entry(self: HostedQueue, *args: Any, **kwargs: Any) -> Any:
        result = method(self, *args, **kwargs)
        if self.actions:
            self.host.carry_out()
        return result

    return entry  # type: ignore[return-value]
