"""One client connection's life in the broker, whatever its protocol.

Each protocol adapter runs its own *sequence* of checks (authenticate, pick the vhost,
check access), as RabbitMQ's STOMP processor calls the same ``rabbit_access_control``
checks as ``rabbit_reader`` does for AMQP, but the bookkeeping around them is here, once:

- :func:`connection_accepted`, :func:`login_refused`, :func:`login_accepted`,
  :func:`connection_ended`: a connection before it logs in (the login throttle's count
  of unauthenticated connections and failures, RabbitMQ's log line, the audit record);
- :func:`open_connection`: the connection is open in a vhost. It is refused if the
  vhost's ``max-connections`` is reached or its client id is in use (as RabbitMQ's
  ``rabbit_connection_tracking`` and ActiveMQ's ``InvalidClientIDException``), else it is
  registered (:attr:`BrokerCore.connections`, read by management and ``leveret ctl``),
  subscribed to resource alarms and vhost deletions, and announced (the ActiveMQ
  advisory). The :class:`ConnectionHandle` it returns undoes all of it at
  :meth:`~ConnectionHandle.close`.

The adapter's connection is called back through :class:`Adapter` (alarm ended, vhost
deleted, an operator's close, facts). Nothing here knows a frame or a socket; none of it
runs per message.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from . import advisory, audit
from .auth import CLUSTER_USER
from .connections import ClientConnection
from .errors import NotAllowed

if TYPE_CHECKING:
    from .broker import BrokerCore
    from .vhost import VirtualHost


class ConnectionRefused(NotAllowed):
    """:func:`open_connection` refused the connection (AMQP 530 NOT_ALLOWED, which
    closes it; a STOMP ERROR frame)."""


class ConnectionLimitReached(ConnectionRefused):
    """The vhost's ``max-connections`` limit is reached (RabbitMQ's text)."""


class ClientIdInUse(ConnectionRefused):
    """Another open connection has this client id (ActiveMQ's InvalidClientIDException)."""


class Adapter(ClientConnection, Protocol):
    """What a protocol adapter's connection offers its :class:`ConnectionHandle`:
    :meth:`facts` and :meth:`close_by_operator` (the registry's), and the two events."""

    def on_alarm(self, active: bool) -> None:
        """A resource alarm started (True) or ended (False): RabbitMQ blocks publishers
        while one is active."""

    def on_vhost_deleted(self, name: str) -> None:
        """The connection's vhost ``name`` is being deleted: close it (RabbitMQ: 320
        CONNECTION_FORCED)."""


def address_of(peer: str) -> str:
    """The address of ``"host:port"`` (the login throttle counts per address)."""
    return peer.rpartition(":")[0]


def connection_accepted(core: BrokerCore, peer: str) -> bool:
    """A connection from ``peer`` (``"host:port"``) was accepted: True if it may go on
    (it now counts as unauthenticated for its address until :func:`login_accepted`,
    :func:`login_refused` or :func:`connection_ended`), False if its address already
    has the most unauthenticated connections allowed (refuse it at once:
    :meth:`~.login_throttle.LoginThrottle.connection_opened`)."""
    return core.login_throttle.connection_opened(address_of(peer))


def report_refusal(core: BrokerCore, peer: str) -> bool:
    """Whether to log that ``peer``'s connection was refused by :func:`connection_accepted`
    (once a minute per address at most)."""
    return core.login_throttle.report(address_of(peer))


def connection_ended(core: BrokerCore, peer: str) -> None:
    """A connection counted by :func:`connection_accepted` ended before logging in."""
    core.login_throttle.connection_settled(address_of(peer))


def login_accepted(core: BrokerCore, peer: str) -> None:
    """``peer`` logged in: no longer unauthenticated. Its address's and user's failures
    are kept (a right password now and then buys a guesser nothing)."""
    core.login_throttle.connection_settled(address_of(peer))


def login_refused(
    core: BrokerCore,
    log: logging.Logger,
    peer: str,
    mechanism: str,
    username: str | None,
    reason: str,
    /,
    **details: object,
) -> float:
    """A login from ``peer`` (``"host:port"``) was refused: RabbitMQ's warning on the
    adapter's ``log`` (``connection <peer>: <mechanism> login refused: user '<u>' -
    <reason>``, never the secret), the audit record ``login.refused`` with ``details``
    (``protocol=…``), and one more failure for the address and for ``username`` (None:
    none could be read). Returns the seconds to wait before sending the refusal (the
    login throttle's: :meth:`~.login_throttle.LoginThrottle.failed`); the connection no
    longer counts as unauthenticated, the refusal does until it is due."""
    name = "?" if username is None else username
    log.warning("connection %s: %s login refused: user '%s' - %s", peer, mechanism, name, reason)
    address = address_of(peer)
    audit.record("login.refused", name, address, **details)
    throttle = core.login_throttle
    throttle.connection_settled(address)
    return throttle.failed(address, username)


@dataclass(eq=False, slots=True)
class ConnectionHandle:
    """An open connection's registrations in core (made by :func:`open_connection`);
    :meth:`close` undoes them. ``user`` is a name, ``peer`` ``"host:port"``."""

    core: BrokerCore
    connection: Adapter
    user: str
    vhost: VirtualHost
    protocol: str
    peer: str
    client_id: str | None
    closed: bool = False
    #: another node of the cluster's link: not listed, no advisory
    internal: bool = False

    def _on_alarm(self, active: bool) -> None:
        self.connection.on_alarm(active)

    def _on_vhost_deleted(self, name: str) -> None:
        if name == self.vhost.name:
            self.connection.on_vhost_deleted(name)

    def close(self) -> None:
        """The connection ended (idempotent): its exclusive queues are deleted, the
        advisory says ``removed``, and it leaves the registry, the client ids and the
        alarm and vhost-deletion listeners."""
        if self.closed:
            return
        self.closed = True
        core, connection = self.core, self.connection
        self.vhost.connection_closed(connection)
        if not self.internal:
            advisory.connection_event(
                self.vhost, "removed", self.peer, self.user, self.protocol, self.client_id
            )
        if self.client_id is not None and core.client_ids.get(self.client_id) is connection:
            del core.client_ids[self.client_id]
        if self._on_alarm in core.alarm_listeners:
            core.alarm_listeners.remove(self._on_alarm)
        if self._on_vhost_deleted in core.vhost_deleted_listeners:
            core.vhost_deleted_listeners.remove(self._on_vhost_deleted)
        core.connections.remove(connection)


def open_connection(
    core: BrokerCore,
    connection: Adapter,
    user: str,
    vhost: VirtualHost,
    protocol: str,
    peer: str,
    client_id: str | None = None,
) -> ConnectionHandle:
    """``connection`` of ``user`` (a name) is open in ``vhost``, speaking ``protocol``
    (as management shows it: ``"AMQP 0-9-1"``, ``"STOMP 1.2"``), from ``peer``
    (``"host:port"``), with an optional ``client_id`` unique in the broker.

    Raises :class:`ConnectionLimitReached` when the vhost's ``max-connections`` is
    reached, then :class:`ClientIdInUse`; nothing is registered then. The adapter has
    checked the user and their access to the vhost before, in its own order."""
    # another node of the cluster (docs/cluster.md): inter-node traffic, as RabbitMQ's
    # distribution links, is neither limited by max-connections nor listed
    internal = user == CLUSTER_USER and core.users.cluster_secret is not None
    refusal = None if internal else core.connection_refusal(vhost.name, user)
    if refusal is not None:
        raise ConnectionLimitReached(refusal)
    if client_id is not None:
        if client_id in core.client_ids:
            raise ClientIdInUse(f"client-id '{client_id}' is already connected")
        core.client_ids[client_id] = connection
    handle = ConnectionHandle(core, connection, user, vhost, protocol, peer, client_id, internal=internal)
    core.alarm_listeners.append(handle._on_alarm)
    core.vhost_deleted_listeners.append(handle._on_vhost_deleted)
    if not internal:
        core.connections.add(connection, vhost.name)
        advisory.connection_event(vhost, "added", peer, user, protocol, client_id)
    return handle
