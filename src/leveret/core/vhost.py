"""A virtual host: its exchanges, queues and bindings, and routing between them.

Operations raise core's neutral errors (:mod:`~leveret.core.errors`) with RabbitMQ's
texts: NotFound (AMQP 404) for a missing exchange or queue, AccessRefused (403) for the
reserved ``amq.`` prefix or the default exchange, ResourceLocked (405) for another
connection's exclusive queue, PreconditionFailed (406) for an inequivalent redeclaration,
an invalid argument or a failed if-unused/if-empty, CommandInvalid (503) for an unknown
exchange type.

A vhost is its queues' host (:class:`.queues.host.QueueHost`, and a
:class:`.router.Router` for what publishes on the broker's behalf): its queues read its
clock and policies and record actions, which :meth:`VirtualHost.carry_out`, the one
driver, performs once their entry point has returned (dead-letter a message, delete an
unused queue, publish a consumer advisory).
"""

from __future__ import annotations

import base64
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import advisory
from .clock import Clock
from .dead_letter import EVENT_EXCHANGE, dead_letter
from .definitions import binding_definition, binding_name, exchange_definition, queue_definition
from .errors import access_refused, not_found, precondition_failed, resource_locked
from .exchange import DEFAULT_EXCHANGE, Binding, Exchange, exchange_class
from .message import Message
from .metrics import BrokerCounters
from .policy import Policy, matching, with_operator_policy
from .queue_config import amqp_type_name
from .queue_memory import QueueMemory
from .queues import Consumer, Queue, queue_class
from .queues.host import ConsumerChanged, DeadLetter, QueueAction, Unused

if TYPE_CHECKING:
    from ..store import Store
    from .replicator import Replicator
    from .scheduler import Scheduler

log = logging.getLogger("leveret.vhost")

#: Exchanges every virtual host has, as in RabbitMQ.
PREDECLARED = {
    "amq.direct": "direct",
    "amq.fanout": "fanout",
    "amq.topic": "topic",
    "amq.headers": "headers",
    "amq.match": "headers",
    EVENT_EXCHANGE: "topic",  # leveret's advisories (dead-lettering)
    "amq.leveret.api": "direct",  # leveret's extensions (see core.api); never routes
}

#: Queue arguments compared on redeclaration (others are not, as in RabbitMQ 3.10).
EQUIVALENCE_ARGS = (
    "x-message-ttl",
    "x-expires",
    "x-max-length",
    "x-max-length-bytes",
    "x-overflow",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-max-priority",
    "x-queue-mode",
    "x-queue-type",
    "x-single-active-consumer",
    "x-delivery-limit",
)


#: RabbitMQ's text for any declare, delete, bind or unbind naming the default exchange.
DEFAULT_EXCHANGE_REFUSED = "operation not permitted on the default exchange"


def _amqp_bool(value: bool) -> str:
    return "true" if value else "false"


class VirtualHost:
    """One virtual host; ``name`` as in connection.open. It is its queues'
    :class:`.queues.host.QueueHost`: they record in :attr:`actions` what it must do, and
    :meth:`carry_out` does it."""

    def __init__(
        self,
        name: str,
        clock: Clock,
        store: Store | None = None,
        policies: list[Policy] | None = None,
        operator_policies: list[Policy] | None = None,
    ) -> None:
        self.name = name
        self.clock = clock
        #: The broker's policies (shared list); queues apply the matching one.
        self.policies: list[Policy] = policies if policies is not None else []
        #: The broker's operator policies (shared list; see :mod:`.policy`).
        self.operator_policies: list[Policy] = operator_policies if operator_policies is not None else []
        #: Where durable definitions and persistent messages go (None: nowhere).
        self.store = store
        #: Called as ``listener(vhost, kind, name)`` (kind ``exchange``/``queue``) when
        #: an exchange or queue is created or removed (the broker's shared list; the
        #: federation manager is one). Not called by recovery (listeners start after it).
        self.entity_listeners: list[Callable[[str, str, str], None]] = []
        self.exchanges: dict[str, Exchange] = {}
        self.queues: dict[str, Queue] = {}
        #: Direct reply-to consumers by the key in ``amq.rabbitmq.reply-to.<key>``.
        self.reply_consumers: dict[str, Consumer] = {}
        #: Memory is short (see BrokerCore.set_memory_pressure): queues with a store page
        #: every new message out instead of keeping it in memory.
        self.memory_pressure = False
        #: Bytes its queues hold messages in: the broker's count, shared by every
        #: vhost (:mod:`.queue_memory`; the BrokerCore gives its own).
        self.queue_memory = QueueMemory()
        #: The broker's scheduler (delayed and scheduled messages); None: none.
        self.scheduler: Scheduler | None = None
        #: The broker's counters (:mod:`.metrics`; the BrokerCore shares its own).
        self.metrics = BrokerCounters()
        #: RabbitMQ's vhost limits (``max-connections``, ``max-queues``); absent or
        #: negative: none. Set through :meth:`BrokerCore.set_vhost_limit`.
        self.limits: dict[str, int] = {}
        #: What the queues handed back, not carried out yet (see :meth:`carry_out`);
        #: each queue holds this very list, so it is cleared, never replaced.
        self.actions: list[QueueAction] = []
        #: Called as ``listener(vhost, event, binding)``, ``event`` ``"bind"`` or
        #: ``"unbind"``, after a binding is added or removed (queue or exchange
        #: destination; also those removed with their queue or exchange): the
        #: federation's exchange links follow them. The BrokerCore shares its list.
        self.binding_listeners: list[Callable[[str, str, Binding], None]] = []
        self._carrying = False
        #: Who wants to hear that a queue gained or lost a consumer, by queue name (a
        #: queue federation link, :mod:`leveret.federation.queue_link`): called with no
        #: argument once the consume or cancel is done, and must not re-enter the broker
        #: (schedule the work). Empty unless federation runs: consume and cancel then pay
        #: one dict look-up, publish and delivery nothing.
        self.consumer_watchers: dict[str, list[Callable[[], None]]] = {}
        #: The cluster's side of declares, deletes, binds and unbinds on a cluster node
        #: (:mod:`.replicator`), None elsewhere (the BrokerCore sets its own).
        self.replicator: Replicator | None = None
        self.exchanges[DEFAULT_EXCHANGE] = exchange_class("direct")(DEFAULT_EXCHANGE, durable=True)
        for ex_name, ex_type in PREDECLARED.items():
            self.exchanges[ex_name] = exchange_class(ex_type)(ex_name, durable=True)

    def policy_for(self, name: str, kind: str) -> dict | None:
        """The definition of the policy that applies to a queue or exchange, with the
        operator policy that applies to a queue (see :mod:`.policy`)."""
        policy = matching(self.policies, self.name, name, kind)
        definition = policy.definition if policy is not None else None
        operator = matching(self.operator_policies, self.name, name, None) if kind == "queues" else None
        return with_operator_policy(definition, operator.definition) if operator is not None else definition

    def policies_of(self, name: str) -> tuple[Policy | None, Policy | None]:
        """The policy and operator policy that apply to queue ``name`` (or None)."""
        operator = matching(self.operator_policies, self.name, name, None)
        return matching(self.policies, self.name, name, "queues"), operator

    # -- the queue driver -----------------------------------------------------------
    def carry_out(self) -> None:
        """Carry out what the queues handed back (:mod:`.queues.host`), in order, until
        none is left: dead-letter a message (:func:`.dead_letter.dead_letter`; one that
        cannot be is logged and dropped, so it never stops its queue), delete an unused
        queue, publish a consumer advisory. Called when a queue's entry point returns; a
        call while it runs (an action reached another queue's entry point) returns at
        once, the running one takes the new actions too."""
        if self._carrying:
            return
        self._carrying = True
        actions = self.actions
        try:
            done = 0
            while done < len(actions):
                action = actions[done]
                done += 1
                if type(action) is DeadLetter:
                    try:
                        dead_letter(self, action.queue, action.message, action.reason)
                    except Exception:  # a message that cannot be dead-lettered must not stop the queue
                        log.exception(
                            "queue '%s': dead-lettering a message (%s) failed; it is dropped",
                            action.queue.name,
                            action.reason,
                        )
                elif type(action) is Unused:
                    queue = action.queue
                    if not queue.deleted and self.queues.get(queue.name) is queue:
                        self.delete_queue(queue.name)
                elif type(action) is ConsumerChanged:
                    advisory.consumer_event(self, action.queue.name, action.tag, action.event)
                    watchers = self.consumer_watchers.get(action.queue.name)
                    if watchers:
                        for watcher in tuple(watchers):
                            watcher()
        finally:
            actions.clear()
            self._carrying = False

    # -- look-ups -------------------------------------------------------------------
    def _where(self) -> str:
        return f"in vhost '{self.name}'"

    def get_exchange(self, name: str) -> Exchange:
        """The exchange; NotFound if there is none."""
        try:
            return self.exchanges[name]
        except KeyError:
            raise not_found(f"no exchange '{name}' {self._where()}") from None

    def get_queue(self, name: str, owner: Any = None) -> Queue:
        """The queue; NotFound if there is none, ResourceLocked if ``owner`` is given and
        another connection owns it exclusively."""
        queue = self.queues.get(name)
        if queue is None:
            raise not_found(f"no queue '{name}' {self._where()}")
        if owner is not None and queue.exclusive_owner not in (None, owner):
            raise self._locked(name)
        return queue

    def _locked(self, name: str) -> Exception:
        return resource_locked(
            f"cannot obtain exclusive access to locked queue '{name}' {self._where()}. "
            "It could be originally declared on another connection or the exclusive "
            "property value does not match that of the original declaration."
        )

    # -- exchanges ------------------------------------------------------------------
    def declare_exchange(
        self,
        name: str,
        type: str,
        passive: bool = False,
        durable: bool = False,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: dict | None = None,
    ) -> Exchange:
        """exchange.declare (§1.7.2.1); returns the existing or new exchange, in
        RabbitMQ 3.10's order: CommandInvalid (503) for an unknown type (not checked
        when passive), AccessRefused (403) for the default exchange, even passive,
        NotFound (404) for a passive declare of a missing one, AccessRefused for
        creating an ``amq.`` name, PreconditionFailed (406) if inequivalent (an
        existing ``amq.`` exchange may be redeclared as it is)."""
        cls = None if passive else exchange_class(type)
        if name == DEFAULT_EXCHANGE:
            raise access_refused(DEFAULT_EXCHANGE_REFUSED)
        if passive:
            return self.get_exchange(name)
        assert cls is not None
        arguments = dict(arguments or {})
        existing = self.exchanges.get(name)
        if existing is None:
            if name.startswith("amq."):
                raise access_refused(f"exchange name '{name}' contains reserved prefix 'amq.*'")
            exchange = cls(name, durable, auto_delete, internal, arguments)
            self.exchanges[name] = exchange
            if durable and self.store is not None:
                self.store.save_definition("exchange", self.name, name, exchange_definition(exchange))
            if self.replicator is not None:
                self.replicator.exchange_added(self, exchange)
            self._entity_changed("exchange", name)
            return exchange
        what = f"for exchange '{name}' {self._where()}"
        if type != existing.type:
            raise precondition_failed(
                f"inequivalent arg 'type' {what}: received '{type}' but current is '{existing.type}'"
            )
        for field, received, current in (
            ("durable", durable, existing.durable),
            ("auto_delete", auto_delete, existing.auto_delete),
            ("internal", internal, existing.internal),
        ):
            if received != current:
                raise precondition_failed(
                    f"inequivalent arg '{field}' {what}: received '{_amqp_bool(received)}' "
                    f"but current is '{_amqp_bool(current)}'"
                )
        self._check_args(arguments, existing.arguments, ("alternate-exchange",), what)
        return existing

    def delete_exchange(self, name: str, if_unused: bool = False) -> None:
        """exchange.delete: idempotent for a missing exchange, as in RabbitMQ.
        AccessRefused (403) for the default exchange or any ``amq.`` name (RabbitMQ's
        texts), PreconditionFailed (406) with ``if_unused`` while it has bindings."""
        if name == DEFAULT_EXCHANGE:
            raise access_refused(DEFAULT_EXCHANGE_REFUSED)
        if name.startswith("amq."):
            raise access_refused(f"deletion of system exchange '{name}' {self._where()} not allowed")
        exchange = self.exchanges.get(name)
        if exchange is None:
            return
        if if_unused and exchange.bindings:
            raise precondition_failed(f"exchange '{name}' {self._where()} in use")
        self._remove_exchange(exchange)

    def _remove_exchange(self, exchange: Exchange) -> None:
        del self.exchanges[exchange.name]
        if exchange.durable and self.store is not None:
            self.store.delete_definition("exchange", self.name, exchange.name)
        for binding in list(exchange.bindings.values()):
            self._drop_binding(binding)
        for other in list(self.exchanges.values()):
            for binding in [b for b in other.bindings.values() if b.destination is exchange]:
                self._drop_binding(binding)
        if self.replicator is not None:
            self.replicator.exchange_removed(self, exchange)
        self._entity_changed("exchange", exchange.name)

    def _entity_changed(self, kind: str, name: str) -> None:
        if not self.entity_listeners:
            return
        for listener in list(self.entity_listeners):
            try:
                listener(self.name, kind, name)
            except Exception:  # the declare or delete is done: a listener must not fail it
                log.exception("entity listener failed on %s %r", kind, name)

    # -- queues ---------------------------------------------------------------------
    def new_queue_name(self) -> str:
        """A server-named queue's name, RabbitMQ's form: ``amq.gen-`` and 22 random
        URL-safe base64 characters."""
        return "amq.gen-" + base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")

    def declare_queue(
        self,
        name: str,
        owner: Any,
        passive: bool = False,
        durable: bool = False,
        exclusive: bool = False,
        auto_delete: bool = False,
        arguments: dict | None = None,
        server_named: bool = False,
    ) -> Queue:
        """queue.declare (§1.8.2.1). ``owner`` is the declaring connection; an empty
        ``name`` gets a server-generated ``amq.gen-…`` name (``server_named``: ``name`` is
        one already, from :meth:`new_queue_name`). NotFound for a passive declare of a
        missing queue, AccessRefused for an ``amq.`` name, ResourceLocked for another
        connection's exclusive queue, PreconditionFailed for an invalid argument or an
        inequivalent redeclaration."""
        if passive:
            return self.get_queue(name, owner)
        given = name if not server_named else ""
        if not name:
            name = self.new_queue_name()
        elif name.startswith("amq.") and not server_named:
            raise access_refused(f"queue name '{name}' contains reserved prefix 'amq.*'")
        arguments = dict(arguments or {})
        existing = self.queues.get(name)
        if existing is None:
            limit = self.limits.get("max-queues", -1)
            if 0 <= limit <= len(self.queues):
                raise precondition_failed(
                    f"cannot declare queue '{name}': queue limit in vhost '{self.name}' ({limit}) is reached"
                )
            cls = queue_class(arguments)
            cls.check_declaration(
                given, durable, exclusive, auto_delete, arguments, f" for queue '{name}' {self._where()}"
            )
            queue_id = 0
            if self.replicator is not None:  # a cluster node: claim it first
                placed = self.replicator.place_queue(self, name, durable, exclusive, auto_delete, arguments)
                if isinstance(placed, Queue):  # another node's: a redeclaration of it
                    return self.declare_queue(
                        name, owner, False, durable, exclusive, auto_delete, arguments, True
                    )
                queue_id = placed
            queue = cls(self, name, durable, owner if exclusive else None, auto_delete, arguments)
            self.queues[name] = queue
            queue.store = self.store
            # Exclusive queues end with their connection, so never outlive a restart.
            if durable and not exclusive and self.store is not None:
                queue.queue_id = queue_id or self.store.new_queue_id()
                self.store.save_definition("queue", self.name, name, queue_definition(queue))
            if self.replicator is not None:
                self.replicator.queue_added(self, queue)
            advisory.queue_event(self, name, "added")
            self.metrics.queues_declared += 1
            self.metrics.queues_created += 1
            self._entity_changed("queue", name)
            return queue
        existing.touch()
        if existing.exclusive_owner is not None and existing.exclusive_owner is not owner:
            raise self._locked(name)
        if exclusive != (existing.exclusive_owner is not None):
            raise self._locked(name)
        what = f"for queue '{name}' {self._where()}"
        for field, received, current in (
            ("durable", durable, existing.durable),
            ("auto_delete", auto_delete, existing.auto_delete),
        ):
            if received != current:
                raise precondition_failed(
                    f"inequivalent arg '{field}' {what}: received '{_amqp_bool(received)}' "
                    f"but current is '{_amqp_bool(current)}'"
                )
        self._check_args(arguments, existing.arguments, EQUIVALENCE_ARGS, what)
        self.metrics.queues_declared += 1
        return existing

    def delete_queue(
        self, name: str, owner: Any = None, if_unused: bool = False, if_empty: bool = False
    ) -> int:
        """queue.delete: returns the number of ready messages deleted (0 if missing);
        its consumers are cancelled. ResourceLocked for another connection's exclusive
        queue, PreconditionFailed for ``if_unused``/``if_empty`` when it is not."""
        queue = self.queues.get(name)
        if queue is None:
            return 0
        if owner is not None and queue.exclusive_owner not in (None, owner):
            raise self._locked(name)
        if if_unused and queue.consumers:
            raise precondition_failed(f"queue '{name}' {self._where()} in use")
        if if_empty and queue.message_count:  # ready, paged out or delayed
            raise precondition_failed(f"queue '{name}' {self._where()} not empty")
        count = queue.message_count
        del self.queues[name]
        queue.deleted = True
        queue.stop()
        self.metrics.queues_deleted += 1
        self.metrics.retire(queue)
        if queue.store is not None:
            if queue.queue_id:
                queue.store.remove_queue(queue.queue_id)
            if queue.durable and queue.exclusive_owner is None:
                queue.store.delete_definition("queue", self.name, name)
            queue.store = None
        for binding in list(queue.bindings):
            self._drop_binding(binding)
        for consumer in list(queue.consumers):
            consumer.cancel_by_broker()
        queue.consumers.clear()
        if self.replicator is not None:
            self.replicator.queue_removed(self, queue)
        advisory.queue_event(self, name, "removed")
        self._entity_changed("queue", name)
        return count

    def delete_all(self) -> None:
        """The vhost is being deleted: delete every queue (consumers are cancelled) and
        exchange, and their stored definitions and messages."""
        for name in list(self.queues):
            self.delete_queue(name)
        for exchange in list(self.exchanges.values()):
            if exchange.name in self.exchanges:
                self._remove_exchange(exchange)

    def connection_refusal(self, user: str, open_connections: int) -> str | None:
        """RabbitMQ's text refusing ``user`` a new connection when ``max-connections``
        is reached with ``open_connections`` open, else None."""
        limit = self.limits.get("max-connections", -1)
        if 0 <= limit <= open_connections:
            return (
                f"access to vhost '{self.name}' refused for user '{user}': "
                f"connection limit ({limit}) is reached"
            )
        return None

    def connection_closed(self, owner: Any) -> None:
        """Delete the exclusive queues of a closed connection."""
        for queue in [q for q in self.queues.values() if q.exclusive_owner is owner]:
            self.delete_queue(queue.name)

    # -- bindings -------------------------------------------------------------------
    def bind(
        self, source_name: str, destination: Queue | Exchange, routing_key: str, arguments: dict | None = None
    ) -> None:
        """queue.bind / exchange.bind; binding twice is a no-op. AccessRefused (403) for
        the default exchange as source or destination, NotFound (404) for a missing
        source, PreconditionFailed (406) for a binding the source's type refuses
        (:meth:`Exchange.validate_binding`: a headers binding's bad ``x-match``, a
        consistent-hash binding's key that is not a weight …)."""
        source = self._bindable(source_name, destination)
        binding = Binding(source, destination, routing_key, dict(arguments or {}))
        source.validate_binding(binding)
        if not source.add_binding(binding):
            return
        if isinstance(destination, Queue):
            destination.bindings.append(binding)
        store = self.store
        if store is not None and self._durable(binding):
            store.save_definition("binding", self.name, binding_name(binding), binding_definition(binding))
        if self.replicator is not None:
            self.replicator.binding_added(self, binding)
        if self.binding_listeners:
            self._binding_changed("bind", binding)

    def unbind(
        self,
        source_name: str,
        destination: Queue | Exchange | None,
        routing_key: str,
        arguments: dict | None = None,
        owner: Any = None,
    ) -> None:
        """queue.unbind / exchange.unbind, as RabbitMQ 3.10 answers them: a missing
        source, a missing destination (None) or a missing binding is not an error (the
        -ok follows). AccessRefused (403) for the default exchange as source or
        destination; ResourceLocked (405) if the binding exists and its queue is
        another connection's exclusive queue (``owner``: the unbinding connection)."""
        if source_name == DEFAULT_EXCHANGE or _is_default(destination):
            raise access_refused(DEFAULT_EXCHANGE_REFUSED)
        source = self.exchanges.get(source_name)
        if source is None or destination is None:
            return
        binding = source.bindings.get(Binding(source, destination, routing_key, dict(arguments or {})).key)
        if binding is None:
            return
        if owner is not None and getattr(destination, "exclusive_owner", None) not in (None, owner):
            raise self._locked(destination.name)
        self._drop_binding(binding)

    def _binding_changed(self, event: str, binding: Binding) -> None:
        for listener in list(self.binding_listeners):
            try:
                listener(self.name, event, binding)
            except Exception:  # a listener's failure must not undo or stop the binding
                log.exception("binding listener failed on %s of %r", event, binding)

    def _bindable(self, name: str, destination: Queue | Exchange) -> Exchange:
        if name == DEFAULT_EXCHANGE or _is_default(destination):
            raise access_refused(DEFAULT_EXCHANGE_REFUSED)
        return self.get_exchange(name)

    def _drop_binding(self, binding: Binding) -> None:
        source = binding.source
        removed = source.remove_binding(binding)
        if removed is None:
            return
        if isinstance(removed.destination, Queue):
            removed.destination.bindings.remove(removed)
        store = self.store
        if store is not None and self._durable(removed):
            store.delete_definition("binding", self.name, binding_name(removed))
        if self.replicator is not None:
            self.replicator.binding_removed(self, removed)
        if self.binding_listeners:
            self._binding_changed("unbind", removed)
        if source.auto_delete and not source.bindings and source.name in self.exchanges:
            self._remove_exchange(source)

    # -- routing --------------------------------------------------------------------
    def route(self, exchange: Exchange, message: Message) -> list[Queue]:
        """The queues ``message`` reaches from ``exchange``, following exchange-to-exchange
        bindings and alternate exchanges, each queue once. Every exchange on the way
        sees the message's ``cc`` keys too (RabbitMQ's ``CC``/``BCC``); the default
        exchange names a queue by each of them."""
        if exchange.name == DEFAULT_EXCHANGE:
            if message.cc:
                named = dict.fromkeys((message.routing_key, *message.cc))
                return [self.queues[name] for name in named if name in self.queues]
            queue = self.queues.get(message.routing_key)
            return [queue] if queue is not None else []
        found = exchange.route(message)
        if found and not exchange.exchange_bindings and not exchange.alternate_exchange:
            return list(found)
        queues: dict[Queue, None] = {}
        seen: set[int] = set()
        pending = [exchange]
        while pending:
            current = pending.pop()
            if id(current) in seen:
                continue
            seen.add(id(current))
            destinations = current.route(message)
            if not destinations:
                alternate = self.exchanges.get(current.alternate_exchange or "")
                if alternate is not None and alternate.name:
                    pending.append(alternate)
                continue
            for destination in destinations:
                if isinstance(destination, Queue):
                    queues[destination] = None
                else:
                    pending.append(destination)
        return list(queues)

    # -- helpers --------------------------------------------------------------------
    def _durable(self, binding: Binding) -> bool:
        """RabbitMQ: a binding is durable when its source and destination are."""
        destination = binding.destination
        return (
            self.store is not None
            and binding.source.durable
            and destination.durable
            and bool(binding.source.name)
            and getattr(destination, "exclusive_owner", None) is None
        )

    @staticmethod
    def _check_args(received: dict, current: dict, keys: tuple, what: str) -> None:
        for key in keys:
            new, old = received.get(key), current.get(key)
            if new != old:
                both = new is not None and old is not None
                raise precondition_failed(
                    f"inequivalent arg '{key}' {what}: received {_shown(new, both)} "
                    f"but current is {_shown(old, both)}"
                )


def _is_default(destination: Queue | Exchange | None) -> bool:
    return isinstance(destination, Exchange) and destination.name == DEFAULT_EXCHANGE


def _shown(value: Any, both: bool) -> str:
    """A value in an inequivalent-argument text, as rabbit_misc:equivalence_fail."""
    if value is None:
        return "none"
    if both:
        return f"'{value}'"
    return f"the value '{value}' of type '{amqp_type_name(value)}'"
