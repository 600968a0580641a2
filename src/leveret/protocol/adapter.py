"""What every protocol adapter's connection has, whatever it speaks: the server's
transport and loop, the peer, the listener it came through, the user and vhost once open,
and its life in core (:mod:`leveret.core.lifecycle`).

An adapter subclasses :class:`AdapterConnection`, runs its own sequence of login checks
(as RabbitMQ's ``rabbit_reader`` and STOMP processor each do), and calls
:meth:`~AdapterConnection._open_life` once they pass and :meth:`~AdapterConnection._end_life`
when the connection ends; it implements ``facts``, ``close_by_operator``, ``on_alarm``
and ``on_vhost_deleted`` (:class:`leveret.core.lifecycle.Adapter`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..core import lifecycle
from ..core.connections import ConnectionFacts
from ..core.lifecycle import ConnectionHandle
from .output import Output

log = logging.getLogger("leveret.server")

if TYPE_CHECKING:
    from ..core.auth import User
    from ..core.broker import BrokerCore
    from ..core.session import Session
    from ..core.vhost import VirtualHost
    from .transport import Loop, Transport


class AdapterConnection(Output):
    """One client connection of some protocol, from accept to close."""

    def __init__(
        self,
        core: BrokerCore,
        transport: Transport,
        loop: Loop,
        request_flush: Callable[[Any], None],
        peer: str = "",
        from_loopback: bool = True,
        input_waiting: Callable[[], bool] | None = None,
        certificate_user: str | None = None,
    ) -> None:
        self.core = core
        self.transport = transport
        self.loop = loop
        #: The client's ``"host:port"`` (IPv6 hosts in brackets).
        self.peer = peer
        self.from_loopback = from_loopback
        # The user a verified TLS client certificate names (None without one).
        self.certificate_user = certificate_user
        #: The listening address this connection came to (set by the listener).
        self.local: tuple[str, int] = ("", 0)
        self.tls = False  # came through a TLS listener (set by the listener)
        self.connected_at = core.clock.time()  # epoch seconds
        self.client_properties: dict[str, Any] = {}
        self.user: User | None = None  # once logged in
        self.vhost: VirtualHost | None = None  # once open
        self.session: Session | None = None  # the user's operations in the vhost, likewise
        #: Its registrations in core while open (see :meth:`_open_life`), else None.
        self.life: ConnectionHandle | None = None
        self.blocked = False  # not read during a resource alarm or flow control
        #: blocked by flow control only (:mod:`leveret.core.flow`): no alarm told the client
        self.flow_held = False
        self._input_waiting = input_waiting  # whether unread bytes wait (heartbeat checks)
        self._init_output(request_flush)
        self.last_received = loop.time()
        # counted as unauthenticated for its address until it logs in, is refused or ends
        # (the login throttle); False: its address had too many, so it is refused now
        self._unauthenticated = lifecycle.connection_accepted(core, peer)
        self._init_protocol()
        if not self._unauthenticated:
            text = f"too many unauthenticated connections from {lifecycle.address_of(peer)}"
            if lifecycle.report_refusal(core, peer):
                log.warning("connection %s refused: %s (logged once a minute per address)", peer, text)
            self._refuse_unauthenticated(text)

    def _init_protocol(self) -> None:
        """The adapter's own state machine starts (its first state, its handshake timer)."""
        raise NotImplementedError

    def flow_released(self) -> None:
        """Flow control ended (:mod:`leveret.core.flow`): read again, unless something
        else pauses reading (each adapter's own)."""
        raise NotImplementedError

    # -- logging in -----------------------------------------------------------------------
    def _refuse_unauthenticated(self, text: str) -> None:
        """Just accepted, but its address already has the most unauthenticated
        connections the login throttle allows: refuse it before reading anything (an
        adapter whose protocol lets the server speak first sends its error; this
        default closes the socket)."""
        self.transport.close()

    def _login_refused(
        self, log: logging.Logger, mechanism: str, username: str | None, reason: str, /, **details: object
    ) -> float:
        """Log, audit and count a refused login (:func:`leveret.core.lifecycle.login_refused`);
        returns the seconds to wait before sending the refusal (the login throttle's)."""
        self._unauthenticated = False
        return lifecycle.login_refused(self.core, log, self.peer, mechanism, username, reason, **details)

    def _login_accepted(self) -> None:
        """The login succeeded (answered at once, whatever the address's failures)."""
        if self._unauthenticated:
            self._unauthenticated = False
            lifecycle.login_accepted(self.core, self.peer)

    # -- open and closed ------------------------------------------------------------------
    def _open_life(self, user: User, vhost: VirtualHost, protocol: str, client_id: str | None = None) -> None:
        """Register this connection in core (see :func:`leveret.core.lifecycle.open_connection`)
        and take ``user`` and ``vhost`` as its own. Raises ConnectionLimitReached or
        ClientIdInUse (both ConnectionRefused), having changed nothing."""
        self.life = lifecycle.open_connection(
            self.core, self, user.name, vhost, protocol, self.peer, client_id
        )
        self.user, self.vhost = user, vhost

    def _end_life(self) -> None:
        """Undo :meth:`_open_life` (idempotent): exclusive queues go, the registry and
        listeners forget this connection, the advisory says ``removed``."""
        if self.life is not None:
            self.life.close()
        self.vhost = None
        self.core.flow.forget(self)  # held by flow control when it closed
        if self._unauthenticated:  # it ended before logging in
            self._unauthenticated = False
            lifecycle.connection_ended(self.core, self.peer)

    # -- closing ------------------------------------------------------------------------
    def close_transport(self, abort: bool = False) -> None:
        """Write what is queued and close the socket (``abort``: drop it). The
        connection is released now (:meth:`_release`), not when the socket is gone, so
        a client that reconnects at once finds its messages back in their queues."""
        if self.state == "closed":
            return
        self.flush()
        self.state = "closed"
        (self.transport.abort if abort else self.transport.close)()
        self._release()

    def connection_lost(self) -> None:
        """The socket is gone: released (:meth:`_release`) unless it was closed already."""
        if self.state == "closed":
            return
        self.state = "closed"
        self._out.clear()
        self._release()

    def _release(self) -> None:
        """The adapter's end of a connection: its subscriptions, transactions, timers,
        then :meth:`_end_life`."""
        raise NotImplementedError

    def peer_address(self) -> tuple[str, int]:
        """The peer's host (without IPv6 brackets) and port, as management shows them."""
        host, _, port = self.peer.rpartition(":")
        return host.strip("[]"), int(port or 0)

    # -- what the lifecycle calls (leveret.core.lifecycle.Adapter) -----------------------
    def facts(self) -> ConnectionFacts:
        """This connection as management and ``leveret ctl`` show it."""
        raise NotImplementedError

    def close_by_operator(self, reason: str) -> None:
        """An operator closed it (RabbitMQ's ``CONNECTION_FORCED - <reason>``)."""
        raise NotImplementedError

    def on_alarm(self, active: bool) -> None:
        """A resource alarm started or ended (each adapter unblocks in its own way)."""
        raise NotImplementedError

    def on_vhost_deleted(self, name: str) -> None:
        """This connection's vhost is being deleted: close it in the protocol's way."""
        raise NotImplementedError
