"""What every queue type is: identity, configuration, consumers, bindings, ``x-expires``.

:class:`Queue` is the interface the rest of core (and the adapters) use, as
``rabbit_queue_type`` is RabbitMQ's; each queue type (:mod:`.classic`, :mod:`.quorum`,
:mod:`.stream`) implements it, and talks to its vhost only through :mod:`.host`. A queue
hands a message to a consumer as a :class:`QueuedMessage` and forgets about it until the
adapter settles it: :meth:`Queue.ack`, :meth:`Queue.discard` or :meth:`Queue.requeue`
(AMQP 0-9-1 §3.1.4).
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from ..deduplication import DeduplicationCache
from ..errors import precondition_failed
from ..message import Message
from ..metrics import QueueCounters
from .entry import DELAYED, GONE, READY, UNACKED, QueuedMessage, delivery_counts
from .features import build
from .host import ConsumerChanged, QueueAction, QueueHost, Unused, hands_back
from .outcome import Enqueued
from .timers import Timers

if TYPE_CHECKING:
    from ...store import Store
    from ..selector import Selector
    from .features.leases import Lease


class Consumer(Protocol):
    """What a queue needs of a consumer; each adapter implements it.

    ``no_ack`` (deliveries count as acknowledged), ``prefetch`` (the consumer's own
    window, 0: none) and ``global_prefetch`` (its session's, 0: none) and ``arguments``
    (the subscription's, e.g. ``x-stream-offset``) let a queue type refuse a consumer
    it cannot serve (:meth:`Queue.prepare_consumer`). ``selector`` (a JMS message
    selector, :mod:`..selector`) limits the messages it gets; ``examined`` is the
    queue's bookmark for it (the last seq its selector turned down). ``priority``
    (AMQP ``x-priority``, ActiveMQ ``activemq.priority``; 0 by default): a consumer
    gets messages only while every consumer of a higher priority is blocked."""

    tag: str
    exclusive: bool
    no_ack: bool
    prefetch: int
    arguments: dict
    selector: Selector | None
    examined: int
    priority: int

    @property
    def global_prefetch(self) -> int:
        """The prefetch window of the consumer's session (AMQP: basic.qos global on its
        channel), 0: none."""

    def can_accept(self) -> bool:
        """Whether a delivery may go out now (window open, socket writable)."""

    def deliver(self, queue: Queue | None, entry: QueuedMessage) -> None:
        """Send ``entry`` (``queue`` None: a direct reply-to message)."""

    def cancel_by_broker(self) -> None:
        """The queue is gone (or a ranged read ended): RabbitMQ's consumer cancel
        notification."""


class Queue:
    """One queue of a virtual host; subclasses are the queue types.

    ``exclusive_owner`` is the connection that declared an exclusive queue (opaque to
    core); ``arguments`` the ``x-`` arguments of queue.declare, which with the matching
    policy make ``config`` (:mod:`.features`; raises PreconditionFailed if invalid).
    ``store`` and ``queue_id`` are set for a queue whose messages go to the store.
    ``host`` is the virtual host it lives in, seen as a :class:`.host.QueueHost`: the
    queue reads its clock and policies there and records in :attr:`actions` what the
    host must do (dead-letter, delete it unused, advise), which the host carries out
    once the queue's entry point returns (:func:`.host.hands_back`).
    """

    #: x-queue-type of this type.
    type_name = ""
    #: RabbitMQ's module name for the type, in its error texts.
    rabbitmq_type = ""
    #: Whether its consumers share their channel's prefetch window (AMQP 0-9-1 global
    #: QoS); RabbitMQ's quorum and stream queues have none (see Limits.global_qos).
    channel_prefetch = True
    #: Arguments of other queue types this one refuses (RabbitMQ: "invalid arg ... of
    #: queue type ..."); arguments no type knows are accepted and ignored.
    refused_arguments: frozenset[str] = frozenset()

    @classmethod
    def check_declaration(
        cls, name: str, durable: bool, exclusive: bool, auto_delete: bool, arguments: dict, where: str
    ) -> None:
        """Refuse, before anything is made, a declaration this type cannot take (406
        PreconditionFailed with RabbitMQ's text; ``name`` empty: a server-named queue;
        ``where``: `` for queue 'q' in vhost '/'``)."""
        for key in arguments:
            if key in cls.refused_arguments:
                raise precondition_failed(f"invalid arg '{key}'{where} of queue type {cls.rabbitmq_type}")

    def __init__(
        self,
        host: QueueHost,
        name: str,
        durable: bool = False,
        exclusive_owner: Any = None,
        auto_delete: bool = False,
        arguments: dict | None = None,
    ) -> None:
        self.host = host
        #: What the host must do, recorded here (the host's own list: see :mod:`.host`).
        self.actions: list[QueueAction] = host.actions
        self.name = name
        self.durable = durable
        self.exclusive_owner = exclusive_owner
        self.auto_delete = auto_delete
        self.arguments = dict(arguments or {})
        self.config = build(
            self.arguments, host.policy_for(name, "queues"), f" for queue '{name}' in vhost '{host.name}'"
        )
        self.consumers: deque[Consumer] = deque()
        self.bindings: list = []  # Bindings whose destination is this queue
        self.deleted = False
        self.store: Store | None = None
        self.queue_id = 0
        self.unacked_count = 0  # delivered, not yet acknowledged
        #: Message counters (:mod:`..metrics`): core bumps published and dead_lettered,
        #: the adapters the deliveries and acknowledgements.
        self.counters = QueueCounters()
        self.selective = 0  # consumers with a selector
        #: consumers with a priority other than 0: while there are any, ``consumers``
        #: is ordered by priority, highest first (see :meth:`served`)
        self.prioritized = 0
        self._exclusive = 0  # exclusive consumers
        #: Only messages this selector matches are kept (a JMS topic subscription's own
        #: queue with a selector or noLocal: what it would not deliver is not kept).
        self.admit: Selector | None = None
        self.timers = Timers(host)
        self._had_consumer = False
        self._last_used = host.clock.time()
        self.dedup: DeduplicationCache | None = None
        if self.config.deduplication:
            ttl = self.config.cache_ttl / 1000 if self.config.cache_ttl else None
            self.dedup = DeduplicationCache(
                self.config.cache_size, ttl, host.clock, self._dedup_added, self._dedup_evicted
            )
        if self.config.expires is not None:
            self.timers.arm("expires", self.config.expires / 1000, self._check_unused)

    # -- the interface each type implements ---------------------------------------------
    @property
    def message_count(self) -> int:
        """Messages waiting for delivery, not counting unacknowledged ones."""
        raise NotImplementedError

    def enqueue(self, message: Message) -> Enqueued:
        """Append ``message``; returns :data:`.Enqueued.STORED` when it went to the store
        durably (a confirm must wait for the store), ``REJECTED`` when the queue refused
        it, else ``ACCEPTED``."""
        raise NotImplementedError

    def drain(self) -> None:
        """Deliver to consumers that can take more (an entry point: it dispatches, then
        the host carries out what the queue recorded; written out rather than
        :func:`.host.hands_back`, as it runs per acknowledgement)."""
        self._dispatch()
        if self.actions:
            self.host.carry_out()

    def _dispatch(self) -> None:
        """:meth:`drain`'s work, for calls from inside the queue."""
        raise NotImplementedError

    def get(self) -> QueuedMessage | None:
        """basic.get: the head message (as a delivery), or None when empty."""
        raise NotImplementedError

    def memory_short(self) -> None:
        """Memory passed the paging threshold (:meth:`.BrokerCore.set_memory_pressure`):
        a queue that can move messages it holds in memory to its store starts to. A
        queue that cannot: nothing."""

    def paging_in(self) -> bool:
        """Whether nothing is ready in memory while the queue's next messages are on
        their way from the store (it reads by callback, never on the loop): basic.get
        then waits for them (:meth:`when_paged_in`) rather than answering get-empty. A
        queue that never pages: False."""
        return False

    def when_paged_in(self, callback: Callable[[bool], None]) -> None:
        """Run ``callback(True)`` on the loop once the read :meth:`paging_in` spoke of
        came back (at once when there is none)."""
        callback(True)

    def requeue(self, entries: list[QueuedMessage], failed: bool = False) -> None:
        """Delivered messages come back unacknowledged: ``failed`` for a failed delivery
        (basic.reject or basic.nack with requeue, STOMP NACK, AMQP 1.0 ``modified`` with
        delivery-failed, an expired lease, a vanished client: counted toward the
        delivery limit), else a plain return (basic.recover, a cancelled consumer, a
        channel closed in order, a consumer timeout: never counted), as RabbitMQ 4.3
        tells them apart but for basic.nack (see :mod:`..redelivery`)."""
        raise NotImplementedError

    def discard(self, entry: QueuedMessage, reason: str) -> None:
        """A delivered message is refused for good (``rejected``)."""
        raise NotImplementedError

    def purge(self) -> int:
        """Drop every waiting message; returns how many."""
        raise NotImplementedError

    def restore_paged(self, count: int, last_seq: int, size: int) -> None:
        """At start-up: ``count`` messages (``size`` body bytes, the highest seq
        ``last_seq``) wait in the store."""
        raise NotImplementedError

    def delivery_headers(self, entry: QueuedMessage) -> tuple[tuple[str, int], ...]:
        """Integer headers this delivery carries besides the message's own (each adapter
        renders them in its form)."""
        return ()

    def prepare_consumer(self, consumer: Consumer) -> None:
        """Check a new consumer before it is confirmed (consume-ok); raises a
        BrokerError if this queue cannot serve it."""

    def browse(
        self,
        limit: int,
        selector: Selector | None = None,
        where: Callable[[QueuedMessage], bool] | None = None,
    ) -> list[QueuedMessage]:
        """Up to ``limit`` waiting messages (those ``selector`` and ``where`` accept),
        in order, left where they are: no redelivered flag, no reordering (a JMS queue
        browser; the dead-letter console); PreconditionFailed for a queue type that
        cannot be browsed."""
        raise precondition_failed(
            f"queue '{self.name}' in vhost '{self.host.name}' is a {self.type_name} queue: "
            "it cannot be browsed"
        )

    def scan(
        self, limit: int, where: Callable[[QueuedMessage], bool], after_seq: int = 0
    ) -> tuple[list[QueuedMessage], int, bool]:
        """:meth:`browse` in steps: ``(found, position, complete)`` from the message
        after seq ``after_seq`` on (see :meth:`.ClassicQueue.scan`); PreconditionFailed
        for a queue type that cannot be browsed."""
        self.browse(0)  # refuses
        return [], after_seq, True

    def hold(
        self, limit: int, where: Callable[[QueuedMessage], bool], after_seq: int = 0
    ) -> tuple[list[QueuedMessage], int, bool]:
        """Take waiting messages out for an operator's action (see
        :meth:`.ClassicQueue.hold`); PreconditionFailed for a queue type that cannot be
        browsed."""
        self.browse(0)  # refuses
        return [], after_seq, True

    def settle_held(self, entries: list[QueuedMessage]) -> None:
        """Held messages are done with (see :meth:`.ClassicQueue.settle_held`)."""

    def release(self, entries: list[QueuedMessage]) -> None:
        """Held messages go back unchanged (see :meth:`.ClassicQueue.release`)."""

    def lease(self, group: str) -> Lease:
        """The lease of consumer ``group`` (:mod:`.features.leases`); PreconditionFailed for a
        queue type without leases."""
        raise precondition_failed(
            f"queue '{self.name}' in vhost '{self.host.name}' is a {self.type_name} queue: "
            "it cannot be leased"
        )

    # -- shared behaviour ---------------------------------------------------------------
    def touch(self) -> None:
        """The queue was used (declare, get, consume): restarts ``x-expires``."""
        self._last_used = self.host.clock.time()

    def ack(self, entry: QueuedMessage) -> None:
        """The message was acknowledged: it leaves the store."""
        if entry.state == UNACKED:
            self.unacked_count -= 1
        entry.state = GONE
        if entry.store_id:
            if self.store is not None:  # None once the queue is deleted
                self.store.remove_message(entry.store_id)
            entry.store_id = 0

    @hands_back
    def add_consumer(self, consumer: Consumer) -> None:
        """Subscribe ``consumer`` (checked by :meth:`prepare_consumer` first) and deliver
        to it what it can take."""
        consumer.examined = 0
        if consumer.selector is not None:
            self.selective += 1
        if consumer.exclusive:
            self._exclusive += 1
        if consumer.priority:
            self.prioritized += 1
        self._place(consumer)
        self._had_consumer = True
        self.touch()
        self.actions.append(ConsumerChanged(self, consumer.tag, "added"))
        self._dispatch()

    @hands_back
    def remove_consumer(self, consumer: Consumer) -> None:
        """Forget ``consumer``; an ``auto_delete`` queue that has had one goes with its
        last (RabbitMQ)."""
        if not self.forget_consumer(consumer):
            return
        if consumer.selector is not None:
            self.selective -= 1
        if self.config.single_active_consumer and self.consumers:
            # the next oldest takes over, once the caller is done (a closing channel
            # removes all its consumers first)
            self.timers.arm("handover", 0, self._hand_over)
        if self.auto_delete and not self.consumers and self._had_consumer and not self.deleted:
            self.actions.append(Unused(self))

    def forget_consumer(self, consumer: Consumer) -> bool:
        """Take ``consumer`` out of the consumers, its exclusive and priority counts with
        it, and report the change (False if it was not there)."""
        try:
            self.consumers.remove(consumer)
        except ValueError:
            return False
        if consumer.exclusive:
            self._exclusive -= 1
        if consumer.priority:
            self.prioritized -= 1
        self.touch()
        self.actions.append(ConsumerChanged(self, consumer.tag, "removed"))
        return True

    def _hand_over(self) -> None:
        self.timers.fired("handover")
        if not self.deleted:
            self._dispatch()

    @property
    def dispatching(self) -> Iterable[Consumer]:
        """The consumers messages may go to, in the order to try them: all of them, or
        with ``x-single-active-consumer`` the oldest alone (the others wait, RabbitMQ's
        single active consumer; consumer priorities do not change which, as in 3.10)."""
        if self.config.single_active_consumer:
            return itertools.islice(self.consumers, 1)
        return self.consumers

    @property
    def single_active_consumer(self) -> Consumer | None:
        """With ``x-single-active-consumer``, the consumer that gets the messages."""
        if self.config.single_active_consumer and self.consumers:
            return self.consumers[0]
        return None

    def served(self, consumer: Consumer) -> None:
        """``consumer`` was just given a message: it goes behind the others of its
        priority (round-robin among equals; RabbitMQ's and ActiveMQ's dispatch)."""
        consumers = self.consumers
        if consumers[-1] is consumer or self.config.single_active_consumer:
            return  # a single active consumer keeps its place: the oldest
        consumers.remove(consumer)
        self._place(consumer)

    def _place(self, consumer: Consumer) -> None:
        """Put ``consumer`` after every consumer of its priority or a higher one."""
        consumers = self.consumers
        if self.prioritized and not self.config.single_active_consumer:
            priority = consumer.priority
            for index, other in enumerate(consumers):
                if other.priority < priority:
                    consumers.insert(index, consumer)
                    return
        consumers.append(consumer)

    def has_demand(self) -> bool:
        """Whether the queue wants messages from elsewhere now: nothing waits in it and a
        consumer of priority 0 or more can take a delivery (its prefetch window open).
        RabbitMQ's queue federation runs its link exactly then (``IsEmpty`` and a max
        active priority >= 0 in ``rabbit_federation_queue:consumer_state_changed/3``), so
        a link's own consumer upstream, at priority -1, never pulls for a queue whose
        consumers are busy or absent. O(consumers); called by a federation link, never
        on the delivery path."""
        if self.message_count:
            return False
        return any(c.priority >= 0 and c.can_accept() for c in self.dispatching)

    @property
    def has_exclusive_consumer(self) -> bool:
        """Whether a consumer holds the queue exclusively (basic.consume exclusive)."""
        return self._exclusive > 0

    def stop(self) -> None:
        """The queue is deleted or the broker stops: cancel its timers."""
        self.timers.cancel_all()

    def _check_unused(self) -> None:
        """x-expires: delete the queue once unused (no consumers, no get, no
        redeclare) for that long."""
        self.timers.fired("expires")
        if self.deleted:
            return
        idle = self.host.clock.time() - self._last_used
        assert self.config.expires is not None  # this timer is armed only when it is set
        expires = self.config.expires / 1000
        if not self.consumers and idle >= expires:
            self.actions.append(Unused(self))
        else:
            self.timers.arm("expires", expires - idle if not self.consumers else expires, self._check_unused)

    def _dedup_added(self, key: str, expires_at: float) -> None:
        if self.store is not None and self.durable and self.queue_id:
            self.store.save_dedup(self.queue_id, key, expires_at)

    def _dedup_evicted(self, key: str) -> None:
        if self.store is not None and self.durable and self.queue_id:
            self.store.delete_dedup(self.queue_id, key)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


#: QueuedMessage and its states live in :mod:`.entry`; re-exported for the storage
#: modules (:mod:`.backlog`, :mod:`.priority_backlog`).
__all__ = ["DELAYED", "GONE", "READY", "UNACKED", "Consumer", "Queue", "QueuedMessage", "delivery_counts"]
