"""One user's operations in one virtual host, each checked as RabbitMQ checks it
(``rabbit_channel``) before :class:`~.vhost.VirtualHost` carries it out. Every protocol
adapter goes through a Session, so every protocol enforces the same permissions:

=====================================  ===============================================
operation                              permission (see :mod:`.access`)
=====================================  ===============================================
declare an exchange (not passive)      configure on it; with ``alternate-exchange``,
                                       when it is created: read on it, write on the AE
delete an exchange                     configure on it
declare a queue (not passive)          configure on it (a server-named one too); with
                                       ``x-dead-letter-exchange``, when it is created:
                                       read on it, write on the DLX; with
                                       ``x-dead-letter-strategy``: read on it,
                                       configure and write on the dead-letter queue
delete a queue                         configure on it
bind, unbind                           write on the destination, read on the source;
                                       topic read on a topic source's routing key
consume, get, purge                    read on the queue
publish                                write on the exchange (``amq.default`` for the
                                       default one); topic write on a topic exchange
=====================================  ===============================================

Passive declares check nothing but existence, as RabbitMQ. Checks come before the
existence checks, in RabbitMQ's order, so the same request gets the same error.
"""

from __future__ import annotations

from typing import Any

from .access import Access
from .errors import access_refused
from .exchange import DEFAULT_EXCHANGE, Exchange, exchange_class
from .queue_config import DEFAULT_DLQ_PREFIX, DEFAULT_SHARED_DLQ
from .queues import Queue
from .vhost import DEFAULT_EXCHANGE_REFUSED, VirtualHost


def _strategy_queue(name: str, arguments: dict) -> str | None:
    """The queue an ``x-dead-letter-strategy`` (ActiveMQ's) sends dead messages to."""
    strategy = arguments.get("x-dead-letter-strategy")
    if strategy == "shared":
        queue = arguments.get("x-dead-letter-queue")
        return queue if isinstance(queue, str) and queue else DEFAULT_SHARED_DLQ
    if strategy == "individual":
        prefix = arguments.get("x-dead-letter-queue-prefix")
        return (prefix if isinstance(prefix, str) and prefix else DEFAULT_DLQ_PREFIX) + name
    return None


class Session:
    """``access``'s operations on ``vhost``; ``owner`` is the connection, for exclusive
    queues. Errors: core's neutral ones (AccessRefused for a refused permission with
    RabbitMQ's text, then whatever the vhost raises)."""

    def __init__(self, vhost: VirtualHost, access: Access, owner: Any) -> None:
        self.vhost = vhost
        self.access = access
        self.owner = owner

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
        """exchange.declare (see :meth:`VirtualHost.declare_exchange`): as RabbitMQ, an
        unknown type (503) comes before the permission check (403)."""
        if not passive and name != DEFAULT_EXCHANGE:  # the default: the vhost refuses it
            exchange_class(type)
            self.access.configure("exchange", name)
            alternate = (arguments or {}).get("alternate-exchange")
            if name not in self.vhost.exchanges and isinstance(alternate, str):
                self.access.read("exchange", name)
                self.access.write("exchange", alternate)
        return self.vhost.declare_exchange(name, type, passive, durable, auto_delete, internal, arguments)

    def delete_exchange(self, name: str, if_unused: bool = False) -> None:
        """exchange.delete; the default and ``amq.`` exchanges are refused first."""
        if name != DEFAULT_EXCHANGE and not name.startswith("amq."):
            self.access.configure("exchange", name)
        self.vhost.delete_exchange(name, if_unused)

    # -- queues ---------------------------------------------------------------------
    def declare_queue(
        self,
        name: str,
        passive: bool = False,
        durable: bool = False,
        exclusive: bool = False,
        auto_delete: bool = False,
        arguments: dict | None = None,
        defaults: dict | None = None,
    ) -> Queue:
        """queue.declare (see :meth:`VirtualHost.declare_queue`); an empty ``name`` gets a
        server-generated one, checked like any other. ``defaults`` are arguments the
        broker adds for a queue it creates on a client's behalf (STOMP's redelivery and
        dead-letter defaults): the client did not choose them, so they are not checked
        against its permissions."""
        vhost = self.vhost
        if passive:
            return vhost.declare_queue(name, self.owner, True)
        server_named = not name
        if server_named:
            name = vhost.new_queue_name()
        if not name.startswith("amq.") or server_named:  # else the vhost refuses the name
            self.access.configure("queue", name)
            args = arguments or {}
            dead_letter_exchange = args.get("x-dead-letter-exchange")
            if name not in vhost.queues and isinstance(dead_letter_exchange, str):
                self.access.read("queue", name)
                self.access.write("exchange", dead_letter_exchange)
            dead_letter_queue = _strategy_queue(name, args)
            if name not in vhost.queues and dead_letter_queue is not None:
                # ActiveMQ's strategy sends dead messages straight to a queue it may
                # create: read on this one, configure and write on that one.
                self.access.read("queue", name)
                self.access.configure("queue", dead_letter_queue)
                self.access.write("queue", dead_letter_queue)
        if defaults:
            arguments = {**defaults, **(arguments or {})}
        return vhost.declare_queue(
            name, self.owner, False, durable, exclusive, auto_delete, arguments, server_named
        )

    def delete_queue(self, name: str, if_unused: bool = False, if_empty: bool = False) -> int:
        """queue.delete: the number of messages deleted (0 for a missing queue)."""
        self.access.configure("queue", name)
        return self.vhost.delete_queue(name, self.owner, if_unused, if_empty)

    def readable_queue(self, name: str) -> Queue:
        """The queue to consume from, get from or purge: read on it, then NotFound or
        ResourceLocked from the vhost."""
        self.access.read("queue", name)
        return self.vhost.get_queue(name, self.owner)

    # -- bindings -------------------------------------------------------------------
    def _check_binding(self, source: str, kind: str, destination: str, routing_key: str) -> None:
        # RabbitMQ's order: write on the destination, the default exchange (either end),
        # read on the source, topic read; existence only after all of them.
        self.access.write(kind, destination)
        if source == DEFAULT_EXCHANGE or (kind == "exchange" and destination == DEFAULT_EXCHANGE):
            raise access_refused(DEFAULT_EXCHANGE_REFUSED)
        self.access.read("exchange", source)
        exchange = self.vhost.exchanges.get(source)
        if exchange is not None and exchange.type == "topic":
            self.access.topic("read", source, routing_key)

    def check_binding(self, source: str, kind: str, destination: str, routing_key: str) -> None:
        """The permission checks of a bind or unbind, alone (AMQP 1.0 management's
        unbind and binding listing check them whether or not the binding exists):
        AccessRefused with RabbitMQ's text."""
        self._check_binding(source, kind, destination, routing_key)

    def _destination(self, kind: str, name: str) -> Queue | Exchange:
        if kind == "queue":
            return self.vhost.get_queue(name, self.owner)
        return self.vhost.get_exchange(name)

    def bind(
        self, source: str, kind: str, destination: str, routing_key: str, arguments: dict | None = None
    ) -> None:
        """queue.bind (``kind`` ``queue``) or exchange.bind (``exchange``): after the
        permissions, NotFound (404) for a missing source, then for a missing
        destination, then ResourceLocked (405) for another connection's exclusive queue,
        as RabbitMQ 3.10."""
        self._check_binding(source, kind, destination, routing_key)
        self.vhost.get_exchange(source)
        self.vhost.bind(source, self._destination(kind, destination), routing_key, arguments)

    def unbind(
        self, source: str, kind: str, destination: str, routing_key: str, arguments: dict | None = None
    ) -> None:
        """queue.unbind or exchange.unbind: after the permissions, a missing source,
        destination or binding is not an error, as RabbitMQ 3.10 (clients unbind from
        queues that were auto-deleted); see :meth:`VirtualHost.unbind`."""
        self._check_binding(source, kind, destination, routing_key)
        found: Queue | Exchange | None
        if kind == "queue":
            found = self.vhost.queues.get(destination)
        else:
            found = self.vhost.exchanges.get(destination)
        self.vhost.unbind(source, found, routing_key, arguments, self.owner)
