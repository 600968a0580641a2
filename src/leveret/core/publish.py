"""The one publish path: route, enqueue, persist, confirm, return, transactions.

Every protocol adapter publishes through a :class:`Publisher` (one per AMQP channel, one
per STOMP connection …), which

- routes the message from its exchange (exchange-to-exchange bindings, alternate
  exchanges), delivers to a direct reply-to consumer (RabbitMQ's
  ``amq.rabbitmq.reply-to.<key>``), or answers a request to the broker's own API
  (:mod:`.api`);
- enqueues it on every queue it reaches, which writes a persistent message of a durable
  queue to the store;
- with confirms on, numbers publishes from 1 and confirms them in order, each once it is
  safe: at once, or once the store has it on disk (a confirm means "on disk" for a
  persistent message in a durable queue); a queue at its length limit with
  ``x-overflow: reject-publish`` makes it a negative confirm, as a failed write does.
  Positive confirms are aggregated: the adapter is told once that some are ready
  (:meth:`PublisherEvents.confirms_ready`) and takes them all with
  :meth:`Publisher.take_confirms` when it writes (AMQP: one ``basic.ack multiple``);
- hands an unroutable ``mandatory`` message back to the adapter (AMQP: basic.return
  312 NO_ROUTE);
- in a transaction, holds publishes (and the adapter's acknowledgements, as opaque
  actions) until commit, which runs them in order and reports once they are on disk.

Confirms and transactions exclude each other, as in RabbitMQ (406).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from . import api
from .errors import access_refused, precondition_failed
from .exchange import DEFAULT_EXCHANGE, DelayedMessageExchange, Exchange
from .message import Message
from .metrics import BUCKET_BY_BITS
from .queues import ACCEPTED, REJECTED, STORED, Enqueued, Queue, QueuedMessage
from .queues.remote import RemoteQueue
from .scheduler import SCHEDULE_MARK, Schedule, schedule_from_headers

if TYPE_CHECKING:
    from .session import Session

#: Direct reply-to (RabbitMQ): a reply published to ``REPLY_TO_PREFIX + key`` goes to the
#: reply consumer registered under ``key`` in :attr:`VirtualHost.reply_consumers`.
REPLY_TO = "amq.rabbitmq.reply-to"
REPLY_TO_PREFIX = REPLY_TO + "."


class PublisherEvents(Protocol):
    """What a publisher tells its adapter."""

    def confirms_ready(self) -> None:
        """Positive confirms wait in :meth:`Publisher.take_confirms` (called once until
        they are taken)."""

    def rejected(self, seq: int, before: tuple[int, bool] | None) -> None:
        """Publish ``seq`` is not safe (a failed write, a full queue): a negative
        confirm. ``before`` holds the positive confirms that must go out first, as
        :meth:`Publisher.take_confirms` gives them (or None)."""

    def returned(self, exchange: str, message: Message) -> None:
        """A ``mandatory`` message reached no queue."""


class Publisher:
    """One publisher in ``session`` (its vhost, its user's permissions, its connection
    as the owner of exclusive queues). ``counted``: it counts in the broker's
    publishers gauge once it publishes (not a STOMP transaction's, which is part of
    its connection's publisher)."""

    def __init__(self, session: Session, events: PublisherEvents, counted: bool = True) -> None:
        self.session = session
        self.vhost = session.vhost
        self.access = session.access
        self.events = events
        self.confirming = False
        self.seq = 0  # publishes numbered while confirming
        self._taken = 0  # confirms handed to the adapter (positive or negative)
        self._ready = 0  # confirms that may be handed out
        self._awaiting_store = 0
        # confirms waiting for the store's current batch: seqs, negative when refused
        self._store_group: list[int] | None = None
        self._store_token: object = None
        self.transaction: list[tuple[Callable[..., None], tuple]] | None = None
        self.closed = False
        self.counters = session.vhost.metrics
        #: another node of the cluster publishes here (:mod:`leveret.cluster.owner`): its
        #: messages go to local queues only, never forwarded again, and count in the
        #: queues' figures only (the node it came from counted the publish)
        self.local_only = session.access.users.is_cluster_peer(session.access.user)
        self._published = not counted or self.local_only
        self._counted = False

    @property
    def unconfirmed(self) -> int:
        """Publishes not confirmed yet (confirm mode; 0 otherwise)."""
        return self.seq - self._taken if self.confirming else 0

    @property
    def uncommitted(self) -> int:
        """Publishes held by the open transaction (0 outside one)."""
        return sum(1 for action, _ in self.transaction or () if action == self._route)

    # -- modes --------------------------------------------------------------------------
    def select_confirms(self) -> None:
        """Confirm every publish from now on; PreconditionFailed in a transaction."""
        if self.transaction is not None:
            raise precondition_failed("cannot switch from tx to confirm mode")
        self.confirming = True

    def select_transaction(self) -> None:
        """Hold publishes until commit; PreconditionFailed with confirms on."""
        if self.confirming:
            raise precondition_failed("cannot switch from confirm to tx mode")
        if self.transaction is None:
            self.transaction = []

    # -- publishing ---------------------------------------------------------------------
    def exchange(self, name: str, routing_key: str) -> Exchange:
        """The exchange to publish to with ``routing_key``, in RabbitMQ's order: write
        permission on it (AccessRefused), NotFound if missing, AccessRefused if
        internal, topic write permission on a topic exchange (AccessRefused)."""
        self.access.publish(name)
        exchange = self.vhost.get_exchange(name)
        if exchange.internal:
            raise access_refused(f"cannot publish to internal exchange '{name}' in vhost '{self.vhost.name}'")
        if exchange.type == "topic" and self.access.users.topic_permissions:
            self.access.topic("write", name, routing_key)
        return exchange

    def publish(self, exchange: Exchange, message: Message, mandatory: bool = False, delay: int = 0) -> None:
        """Publish ``message`` through ``exchange`` (see the module doc); ``delay`` in
        milliseconds holds it in the scheduler first (AMQP 1.0's
        ``x-opt-delivery-delay``/``x-opt-delivery-time`` annotations), as a
        delayed-message exchange holds a message with ``x-delay``."""
        if exchange.name == api.API_EXCHANGE and message.properties.reply_to:
            self.access.publish(DEFAULT_EXCHANGE)  # the reply goes through the default exchange
        seq = 0
        if not self._published:
            self._published = self._counted = True
            self.counters.publishers += 1
        if self.confirming:
            self.seq = seq = self.seq + 1
            self.counters.received_confirm += 1
        if self.transaction is not None:
            if SCHEDULE_MARK in message.encoded:
                schedule_from_headers(message.headers)  # refused now, not half-way through the commit
            self.transaction.append((self._route, (exchange, message, mandatory, seq, True, delay)))
        else:
            self._route(exchange, message, mandatory, seq, True, delay)

    def _route(
        self,
        exchange: Exchange,
        message: Message,
        mandatory: bool,
        seq: int,
        counted: bool = True,
        delay: int = 0,
    ) -> None:
        vhost = self.vhost
        # Enqueued outcomes combined with | (see .queues.outcome): an int on the way,
        # as IntEnum's | returns one, read with the members in _settle
        outcome: int = ACCEPTED
        if exchange.name == api.API_EXCHANGE:  # a request to leveret's extensions
            reply = api.handle(self.session, message)
            if reply is not None:  # the broker's own message: not counted
                self._route(vhost.exchanges[DEFAULT_EXCHANGE], reply, False, 0, False)
            routed = True
        elif exchange.name == DEFAULT_EXCHANGE and message.routing_key.startswith(REPLY_TO_PREFIX):
            consumer = vhost.reply_consumers.get(message.routing_key[len(REPLY_TO_PREFIX) :])
            routed = consumer is not None
            if consumer is not None:
                consumer.deliver(None, QueuedMessage(message, 0))
        elif (
            (exchange.holds_messages or delay > 0 or SCHEDULE_MARK in message.encoded)
            and not self.local_only  # a node forwards a held message once it is due
            and (held := self._hold(exchange, message, delay)) is not None
        ):
            routed = True  # held: routed when due (neither the plugin nor ActiveMQ return it)
            outcome = held
        else:
            queues = vhost.route(exchange, message)
            routed = bool(queues)
            if self.local_only:
                kept = self._local_only(queues)
                if kept is None:  # a queue the sender may have meant for this node is moving
                    kept = []
                    outcome = REJECTED
                queues = kept
                routed = routed and (bool(queues) or outcome == REJECTED)
                counted = False
            for queue in queues:
                queue.counters.published += counted or self.local_only
                outcome |= queue.enqueue(message)
            if vhost.actions:  # what the queues handed back (dead letters of a full queue)
                vhost.carry_out()
        if counted:  # received here, so a transaction's count once committed
            counters = self.counters
            counters.received += 1  # routed: received less the unroutable ones
            size = len(message.body)
            counters.message_size_sum += size
            counters.message_sizes[BUCKET_BY_BITS[(size - 1).bit_length()]] += 1
            if not routed:
                if mandatory:
                    counters.unroutable_returned += 1
                else:
                    counters.unroutable_dropped += 1
        if not routed and mandatory:
            self.events.returned(exchange.name, message)
        if seq:
            self._settle(seq, outcome)

    @staticmethod
    def _local_only(queues: list[Queue]) -> list[Queue] | None:
        """A peer's publish (:attr:`local_only`): the real queues of ``queues``; the
        other nodes' queues are skipped (the sender forwarded to their owners), but
        None (refused: a negative confirm, the publisher sends again) when one of them
        is changing owner (:attr:`RemoteQueue.in_transition`): the sender's view of
        its owner and this node's may differ, the message might be meant for it."""
        kept = []
        for queue in queues:
            if not isinstance(queue, RemoteQueue):
                kept.append(queue)
            elif queue.in_transition:
                return None
        return kept

    def _hold(self, exchange: Exchange, message: Message, delay: int = 0) -> Enqueued | None:
        """A message for later: a delayed-message exchange's with an ``x-delay``, one
        published with a ``delay`` (ms), or one with ActiveMQ's ``AMQ_SCHEDULED_*``
        headers, goes to the scheduler (STORED
        when it went to the store durably; its job id is its message id, when it has
        one, as ActiveMQ's); None without a schedule (it is routed now). PreconditionFailed
        for schedule headers that do not parse."""
        vhost = self.vhost
        scheduler = vhost.scheduler
        schedule = None
        activemq = False
        if isinstance(exchange, DelayedMessageExchange):
            exchange_delay = exchange.delay_of(message)
            if exchange_delay > 0:
                schedule = Schedule(delay=exchange_delay, headers={"x-delay": -exchange_delay})
        if schedule is None and delay > 0:
            schedule = Schedule(delay=delay)
        if schedule is None and SCHEDULE_MARK in message.encoded:
            schedule = schedule_from_headers(message.headers)
            activemq = True
        if schedule is None or scheduler is None:
            return None
        job_id = message.properties.message_id if activemq else None
        kept = scheduler.schedule(
            vhost.name, exchange.name, message, schedule, job_id, tag_deliveries=activemq
        )
        return STORED if kept else ACCEPTED

    # -- confirms -----------------------------------------------------------------------
    def _settle(self, seq: int, outcome: int) -> None:
        # outcome: Enqueued members combined with |.
        # Confirms stay in publish order: once one waits for the store, the ones after
        # it wait their turn too. Those waiting for the same write share one callback.
        if outcome & STORED or self._awaiting_store:
            self._awaiting_store += 1
            store = self.vhost.store
            assert store is not None
            if self.local_only:  # forwarded by another node: this node's writes alone
                store = store.local
            token = store.batch_token()
            group = self._store_group
            if group is None or token is not self._store_token:
                self._store_group = group = []
                self._store_token = token
                store.when_durable(lambda ok: self._stored(group, ok))
            group.append(-seq if outcome & REJECTED else seq)
        elif outcome & REJECTED:
            self._reject(seq)
        else:
            self._confirm(seq)

    def _stored(self, group: list[int], ok: bool) -> None:
        self._awaiting_store -= len(group)
        if self._store_group is group:
            self._store_group = self._store_token = None
        if self.closed:
            return
        for seq in group:
            if ok and seq > 0:
                self._confirm(seq)
            else:  # not stored, or refused by a full queue: the publisher must not count on it
                self._reject(abs(seq))

    def _confirm(self, seq: int) -> None:
        first = self._ready == self._taken
        self._ready = seq
        if first:
            self.events.confirms_ready()

    def _reject(self, seq: int) -> None:
        before = self.take_confirms()
        self._ready = self._taken = max(self._taken, seq)
        self.events.rejected(seq, before)

    def take_confirms(self) -> tuple[int, bool] | None:
        """The positive confirms ready since the last call: ``(highest seq, multiple)``
        (``multiple``: it covers more than one publish), or None."""
        upto = self._ready
        if upto <= self._taken:
            return None
        multiple = upto - self._taken > 1
        self.counters.confirmed += upto - self._taken
        self._taken = upto
        return upto, multiple

    # -- transactions -------------------------------------------------------------------
    def defer(self, action: Callable[..., None], *args: Any) -> bool:
        """In a transaction, hold ``action(*args)`` (an adapter's acknowledgement) until
        commit and return True; otherwise return False (the caller runs it now)."""
        if self.transaction is None:
            return False
        self.transaction.append((action, args))
        return True

    def commit(self, done: Callable[[bool], None]) -> None:
        """Run the transaction's work in order; ``done(ok)`` once it is on disk (at once
        if nothing had to be written). PreconditionFailed outside a transaction."""
        if self.transaction is None:
            raise precondition_failed("channel is not transactional")
        work, self.transaction = self.transaction, []
        for action, args in work:
            action(*args)
        store = self.vhost.store
        if store is not None and store.pending:
            store.when_durable(lambda ok: None if self.closed else done(ok))
        else:
            done(True)

    def rollback(self) -> list[tuple[Callable[..., None], tuple]]:
        """Drop the transaction's work and return it, so the adapter can undo its own
        actions (acknowledgements become unacknowledged again). PreconditionFailed
        outside a transaction."""
        if self.transaction is None:
            raise precondition_failed("channel is not transactional")
        work, self.transaction = self.transaction, []
        return work

    def close(self) -> list[tuple[Callable[..., None], tuple]]:
        """The publisher is gone: no more events; returns an open transaction's work
        (never committed) for the adapter to undo."""
        if self._counted and not self.closed:
            self.counters.publishers -= 1
        self.closed = True
        work, self.transaction = self.transaction or [], None
        return work
