"""A queue that lives on another node of the cluster (docs/cluster.md).

Every node holds each queue of the cluster under its name in ``vhost.queues``: the
queue's owner node holds the real queue (classic, quorum, stream …), every other node a
:class:`RemoteQueue`. It routes like any queue (bindings, ``x-`` arguments and policies
are shared metadata) and hands the work to the owner through an :class:`OwnerLink` (the
cluster's link to that node, :mod:`leveret.cluster.peers`):

- a publish is forwarded once per owner node (:meth:`OwnerLink.forward`; the owner
  routes it again with its own, identical bindings, to its own queues only) and the
  outcome is STORED: the publisher's confirm waits for the owner's confirm (the cluster's
  store wrapper, :mod:`leveret.cluster.confirms`, waits for the links);
- a consumer is relayed (:meth:`OwnerLink.open_relay`: one channel per consumer on the
  link, its prefetch as basic.qos, manual acks); the owner's deliveries wait here, one
  buffer per consumer, until the local consumer can take them; its ack, requeue and
  discard go back with the owner's delivery tag (basic.ack; basic.nack requeue for a
  failed delivery, basic.reject requeue for a plain return, which the owner counts as
  such on a peer's link; basic.reject requeue=false);
- basic.get, purge and the figures (message and consumer counts, from a passive
  queue.declare on the owner, at most once a second, when asked) go over the link.

A lost owner (link down, relay cancelled by the owner: the queue was deleted or moved)
cancels the local consumers (RabbitMQ's consumer cancel notification) and publishes get
a negative confirm until :meth:`RemoteQueue.retarget`. Core never sees the link's
transport.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from . import queue_class
from .base import GONE, READY, UNACKED, Consumer, Queue, QueuedMessage
from .host import ConsumerChanged, hands_back
from .outcome import REJECTED, STORED, Enqueued

if TYPE_CHECKING:
    from ..message import Message
    from .host import QueueHost

#: basic.qos of a relay for a consumer without a prefetch limit (its window on the owner)
UNLIMITED_WINDOW = 1000
#: seconds between two refreshes of a remote queue's figures
REFRESH_SECONDS = 1.0


class RelayHandle(Protocol):
    """One relayed consumer (or the link's basic.get channel) on the owner."""

    def ack(self, tag: int) -> None:
        """basic.ack of the owner's delivery ``tag``."""

    def nack(self, tag: int, requeue: bool) -> None:
        """basic.nack (``requeue``) of the owner's delivery ``tag``."""

    def reject(self, tag: int, requeue: bool) -> None:
        """basic.reject (``requeue``) of the owner's delivery ``tag``."""

    def cancel(self) -> None:
        """basic.cancel: no more deliveries (those unacknowledged stay so)."""

    def close(self) -> None:
        """Close the relay's channel: what it still holds unacknowledged goes back to the
        owner's queue."""


class RelaySink(Protocol):
    """What a relay tells the remote queue."""

    def delivered(self, tag: int, redelivered: bool, message: Message) -> None:
        """The owner delivered ``message`` with its delivery ``tag``."""

    def ended(self) -> None:
        """The owner cancelled the relay (queue deleted or moved) or the link went."""


class OwnerLink(Protocol):
    """The link from this node to the owner node of some queues
    (:class:`leveret.cluster.peers.PeerLink` implements it)."""

    #: the owner's node name
    node: str

    @property
    def alive(self) -> bool:
        """Whether the link is up or coming up (False: the owner is unreachable)."""

    def forward(self, message: Message) -> bool:
        """Publish ``message`` (its exchange, routing key, header and body, unchanged) on
        the owner, which routes it to its own queues only; at most once per message
        (the same message object again, as several queues of one owner reach it in
        one publish: nothing more). False when the link is down (the publish is then
        refused). Its confirm is waited for by :mod:`leveret.cluster.confirms`."""

    def open_relay(
        self, queue: str, sink: RelaySink, prefetch: int, exclusive: bool, arguments: dict
    ) -> RelayHandle:
        """basic.consume ``queue`` on the owner for one local consumer (basic.qos
        ``prefetch``, manual acks); deliveries and the end go to ``sink``."""

    def get(
        self, queue: str, callback: Callable[[tuple[RelayHandle, int, bool, Message, int] | None], None]
    ) -> None:
        """basic.get ``queue`` on the owner (manual ack); ``callback((handle, tag,
        redelivered, message, message_count))`` or ``callback(None)`` (empty, failed)."""

    def purge(self, queue: str) -> None:
        """queue.purge ``queue`` on the owner."""

    def delete(
        self,
        queue: str,
        if_unused: bool,
        if_empty: bool,
        callback: Callable[[int, tuple[int, str] | None], None],
    ) -> None:
        """queue.delete ``queue`` on the owner (``if_unused``, ``if_empty`` as AMQP):
        ``callback(message_count, None)``, or ``callback(0, (reply_code, reply_text))``
        when the owner refused (406 in use or not empty, 404) or could not be reached."""

    def inspect(self, queue: str, callback: Callable[[int, int], None]) -> None:
        """A passive queue.declare on the owner: ``callback(message_count,
        consumer_count)`` (not called when it fails)."""


class RemoteEntry(QueuedMessage):
    """A delivery of the owner held here: ``seq`` is the owner's delivery tag, ``handle``
    the relay (or get channel) to settle it on."""

    __slots__ = ("handle", "relay")

    def __init__(self, message: Message, tag: int, handle: RelayHandle, relay: _Relay | None) -> None:
        super().__init__(message, tag)
        self.handle = handle
        self.relay = relay
        # the owner's failed-delivery count, which it sends as a header (entry.
        # delivery_counts), for this node's adapters (AMQP 1.0's header.delivery-count)
        failed = message.header("x-delivery-count")
        if type(failed) is int and failed > 0:
            self.failed_count = failed


class _Relay:
    """One local consumer's relay: the owner's deliveries wait in ``buffer`` until the
    consumer can take them; ``outstanding`` counts those handed over and unsettled."""

    __slots__ = ("buffer", "cancelled", "consumer", "handle", "outstanding", "queue")

    def __init__(self, queue: RemoteQueue, consumer: Consumer) -> None:
        self.queue = queue
        self.consumer = consumer
        self.buffer: deque[RemoteEntry] = deque()
        self.outstanding = 0
        self.cancelled = False
        self.handle: RelayHandle | None = None

    def delivered(self, tag: int, redelivered: bool, message: Message) -> None:
        assert self.handle is not None
        entry = RemoteEntry(message, tag, self.handle, self)
        entry.redelivered = redelivered
        if self.cancelled:  # in flight when cancelled: back to the owner (not failed)
            self.handle.reject(tag, True)
            return
        self.buffer.append(entry)
        queue = self.queue
        if len(self.buffer) == 1:
            queue.drain()

    def ended(self) -> None:
        queue = self.queue
        if self.cancelled:
            return
        self.cancelled = True
        handle = self.handle
        if handle is not None:  # still unacknowledged on the owner: back to its queue
            for entry in self.buffer:  # never delivered here: a plain return
                handle.reject(entry.seq, True)
            if not self.outstanding:  # else once the consumer settled what it holds
                handle.close()
        self.buffer.clear()
        queue._relays.pop(id(self.consumer), None)
        if self.consumer in queue.consumers:
            queue.forget_consumer(self.consumer)
            self.consumer.cancel_by_broker()
        if queue.actions:
            queue.host.carry_out()

    def settled(self) -> None:
        self.outstanding -= 1
        if self.cancelled and not self.outstanding and self.handle is not None:
            self.handle.close()


class RemoteQueue(Queue):
    """Queue ``name`` of ``host`` owned by node ``owner``, reached through ``link``."""

    type_name = "remote"  # an instance takes its real type's (x-queue-type)

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
        real = queue_class(self.arguments)  # what the owner holds: shown as such
        self.type_name = real.type_name
        self.rabbitmq_type = real.rabbitmq_type
        self.channel_prefetch = real.channel_prefetch
        self.timers.cancel_all()  # x-expires and the like are the owner's business
        self.dedup = None
        #: the node that holds the real queue
        self.owner = owner
        self.link = link
        #: the queue is changing owner (a takeover or move under way, see
        #: :attr:`in_transition`)
        self.transition = False
        #: the owner's last figures (see :meth:`inspect`)
        self.owner_message_count = 0
        self.consumer_count = 0
        self._refreshed = -REFRESH_SECONDS
        self._relays: dict[int, _Relay] = {}  # id(consumer) -> relay
        self._got: deque[RemoteEntry | None] = deque()  # basic.get answers not yet taken
        self._getting = False
        self._get_waiters: list[Callable[[bool], None]] = []

    def retarget(self, owner: str, link: OwnerLink | None) -> None:
        """The queue moved to ``owner`` (a takeover, ``leveret ctl move_queue``): the
        consumers relayed to the old owner are cancelled."""
        self.owner_lost()
        self.owner = owner
        self.link = link

    @property
    def in_transition(self) -> bool:
        """Whether the nodes' views of the owner may differ now: the owner was lost
        (no link), this node is acquiring the queue, or the queue just moved and not
        every live node applied the change yet (:attr:`transition`). Publishes routed
        here are then refused (a negative confirm: the publisher sends again), those
        forwarded by another node too (:class:`leveret.core.publish.Publisher`: the
        sender may have meant this node as the owner); none is confirmed and lost."""
        return self.transition or self.link is None

    def owner_lost(self) -> None:
        """The owner went: consumers are cancelled (RabbitMQ's consumer cancel
        notification); publishes are refused until :meth:`retarget`."""
        for relay in list(self._relays.values()):
            if relay.handle is not None:
                relay.handle.close()
            relay.ended()
        self._relays.clear()
        for consumer in list(self.consumers):
            consumer.cancel_by_broker()
        self.consumers.clear()
        self.link = None
        self._answer_gets(None)

    # -- figures ------------------------------------------------------------------------
    @property
    def message_count(self) -> int:
        """The owner's last figure (refreshed in the background at most once a
        second when read)."""
        self.inspect()
        return self.owner_message_count

    def inspect(self) -> None:
        """Ask the owner for its figures unless asked less than a second ago."""
        now = self.host.clock.time()
        link = self.link
        if link is not None and now - self._refreshed >= REFRESH_SECONDS:
            self._refreshed = now
            link.inspect(self.name, self._figures)

    def _figures(self, message_count: int, consumer_count: int) -> None:
        self.owner_message_count = message_count
        self.consumer_count = consumer_count

    # -- publishing ---------------------------------------------------------------------
    def enqueue(self, message: Message) -> Enqueued:
        """Forward ``message`` to the owner: STORED (the confirm waits for the owner),
        REJECTED when the owner cannot be reached or is changing (:attr:`in_transition`)."""
        link = self.link
        if link is None or self.transition or not link.forward(message):
            return REJECTED
        return STORED

    # -- consuming ----------------------------------------------------------------------
    def prepare_consumer(self, consumer: Consumer) -> None:
        """Nothing to check here: the owner answers (a refusal cancels the consumer)."""

    @hands_back
    def add_consumer(self, consumer: Consumer) -> None:
        """Relay ``consumer`` from the owner: basic.qos its prefetch (or its session's,
        or :data:`UNLIMITED_WINDOW`), manual acks, its exclusive flag, priority,
        selector (``x-selector``) and arguments."""
        relay = _Relay(self, consumer)
        self._relays[id(consumer)] = relay
        consumer.examined = 0
        if consumer.exclusive:
            self._exclusive += 1
        if consumer.priority:
            self.prioritized += 1
        self._place(consumer)
        self.touch()
        self.actions.append(ConsumerChanged(self, consumer.tag, "added"))
        link = self.link
        arguments = dict(consumer.arguments or {})
        if consumer.priority and "x-priority" not in arguments:
            arguments["x-priority"] = consumer.priority
        if consumer.selector is not None:  # the owner filters (AMQP's x-selector)
            arguments["x-selector"] = consumer.selector.text
        prefetch = consumer.prefetch or consumer.global_prefetch or UNLIMITED_WINDOW
        if link is None:
            relay.cancelled = True
            self.timers.arm(f"lost-{id(consumer)}", 0, lambda: self._lost_at_once(relay))
            return
        relay.handle = link.open_relay(self.name, relay, prefetch, consumer.exclusive, arguments)

    def _lost_at_once(self, relay: _Relay) -> None:
        self.timers.fired(f"lost-{id(relay.consumer)}")
        relay.cancelled = False
        relay.ended()

    @hands_back
    def remove_consumer(self, consumer: Consumer) -> None:
        """Cancel ``consumer``'s relay: its buffered deliveries go back to the owner, its
        unacknowledged ones stay so until settled (the relay's channel closes then)."""
        if not self.forget_consumer(consumer):
            return
        relay = self._relays.pop(id(consumer), None)
        if relay is None or relay.cancelled:
            return
        relay.cancelled = True
        handle = relay.handle
        if handle is None:
            return
        handle.cancel()
        for entry in relay.buffer:  # never handed over here: a plain return
            handle.reject(entry.seq, True)
        relay.buffer.clear()
        if not relay.outstanding:
            handle.close()

    def _dispatch(self) -> None:
        for relay in self._relays.values():
            buffer = relay.buffer
            if not buffer:
                continue
            consumer = relay.consumer
            while buffer and consumer.can_accept():
                entry = buffer.popleft()
                entry.state = UNACKED
                entry.delivery_count += 1
                self.unacked_count += 1
                relay.outstanding += 1
                consumer.deliver(self, entry)

    # -- basic.get ----------------------------------------------------------------------
    def get(self) -> QueuedMessage | None:
        """The answer of a basic.get on the owner, once it came (:meth:`paging_in`
        says it is on its way); None when the owner had nothing."""
        if self._got:
            entry = self._got.popleft()
            if entry is not None:
                entry.state = UNACKED
                entry.delivery_count += 1
                self.unacked_count += 1
            return entry
        link = self.link
        if link is not None and not self._getting:
            self._getting = True
            link.get(self.name, self._got_one)
        return None

    def _got_one(self, answer: tuple[RelayHandle, int, bool, Message, int] | None) -> None:
        self._getting = False
        entry = None
        if answer is not None:
            handle, tag, redelivered, message, count = answer
            entry = RemoteEntry(message, tag, handle, None)
            entry.redelivered = redelivered
            self.owner_message_count = count
        self._answer_gets(entry)

    def _answer_gets(self, entry: RemoteEntry | None) -> None:
        waiters, self._get_waiters = self._get_waiters, []
        if waiters:
            self._got.append(entry)
        elif entry is not None:  # nobody waits any more: back to the owner (not failed)
            entry.handle.reject(entry.seq, True)
        for waiter in waiters:
            waiter(True)

    def paging_in(self) -> bool:
        """Whether a basic.get is on its way to the owner."""
        return self._getting

    def when_paged_in(self, callback: Callable[[bool], None]) -> None:
        """``callback(True)`` once the owner answered the basic.get."""
        if self._getting:
            self._get_waiters.append(callback)
        else:
            callback(True)

    # -- settling -----------------------------------------------------------------------
    def _settled(self, entry: QueuedMessage) -> RemoteEntry | None:
        if entry.state != UNACKED or not isinstance(entry, RemoteEntry):
            return None
        self.unacked_count -= 1
        entry.state = GONE
        return entry

    def ack(self, entry: QueuedMessage) -> None:
        """basic.ack on the owner (also for a no-ack consumer's delivery, handed over)."""
        remote = self._settled(entry)
        if remote is not None:
            remote.handle.ack(remote.seq)
            if remote.relay is not None:
                remote.relay.settled()

    def requeue(self, entries: list[QueuedMessage], failed: bool = False) -> None:
        """Back to the owner: a failed delivery as basic.nack requeue=true (the owner
        counts it), a plain return (AMQP 1.0 released, a cancelled consumer) as
        basic.reject requeue=true, which the owner takes from a peer as not failed."""
        for entry in entries:
            remote = self._settled(entry)
            if remote is not None:
                if failed:
                    remote.handle.nack(remote.seq, True)
                else:
                    remote.handle.reject(remote.seq, True)
                remote.state = READY
                if remote.relay is not None:
                    remote.relay.settled()

    def discard(self, entry: QueuedMessage, reason: str) -> None:
        """basic.reject requeue=false on the owner (it dead-letters as configured)."""
        remote = self._settled(entry)
        if remote is not None:
            remote.handle.reject(remote.seq, False)
            if remote.relay is not None:
                remote.relay.settled()

    def purge(self) -> int:
        """queue.purge on the owner; returns the owner's last count (the purge-ok's
        figure is not waited for)."""
        count = self.owner_message_count
        if self.link is not None:
            self.link.purge(self.name)
        self.owner_message_count = 0
        return count

    def restore_paged(self, count: int, last_seq: int, size: int) -> None:
        """Nothing is stored for a remote queue on this node."""

    def stop(self) -> None:
        """The queue is deleted here or the node stops: relays are closed."""
        super().stop()
        for relay in list(self._relays.values()):
            relay.cancelled = True
            if relay.handle is not None:
                relay.handle.close()
        self._relays.clear()
