"""A federation link's direct connection: how a link's publishing into this broker
(:class:`~.local_publish.LocalPublisher`, no socket) shows among the broker's
connections, as RabbitMQ 3.10's federation link's direct (in-VM) connection does.

Checked on RabbitMQ 3.10.8 with ``rabbitmq_federation``: ``/api/connections`` lists the
link's local connection with ``type`` ``direct``, ``protocol`` ``Direct 0-9-1``, a name
of its own (RabbitMQ's is an Erlang pid, ``<rabbit@host.1795856166.835.0>``; leveret's
has the same shape, ``<NODE.CREATION.N.0>``: this broker's cluster name, the epoch
second this process started, a counter), ``client_properties`` with only
``connection_name`` (``Federation link (upstream: U, policy: P)``), no host, port or
peer; it has one channel (number 1, ``confirm`` with ``on-confirm``), which the link's
``/api/federation-links`` row shows as ``local_channel``, and the row's
``local_connection`` names it.

The connection is registered through core's lifecycle
(:func:`~leveret.core.lifecycle.open_connection`) as an AMQP or STOMP connection is: it
counts towards the vhost's ``max-connections`` and the user's limits (a refusal fails
the link's session, retried after ``reconnect-delay``), and leaves the registry when
the link's session ends. An operator closing it (``DELETE /api/connections/{name}``,
``leveret ctl close_connection``) or the vhost's deletion ends the link's session with
``CONNECTION_FORCED - <reason>`` as its error; the link starts again after
``reconnect-delay`` seconds, as RabbitMQ's link is restarted when its direct connection
is closed.

What differs from RabbitMQ: ``user`` is the user whose permissions the publishes are
checked with (``guest``), where RabbitMQ's link connects as its internal user ``none``
(no permission checks).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..core.connections import ChannelFacts, ConnectionFacts
from ..core.lifecycle import ConnectionHandle, open_connection

if TYPE_CHECKING:
    from ..core.broker import BrokerCore

#: RabbitMQ's ``protocol`` and ``type`` of a direct connection.
PROTOCOL = "Direct 0-9-1"
KIND = "direct"
#: The second part of the names (an Erlang pid's "creation"): when this process started.
_CREATION = int(time.time())
_serial = itertools.count(1)


def direct_name(node: str) -> str:
    """A new direct connection's name, as an Erlang pid prints: ``<NODE.CREATION.N.0>``."""
    return f"<{node}.{_CREATION}.{next(_serial)}.0>"


class DirectConnection:
    """One link's registered direct connection in ``vhost`` of ``core`` as ``user``.
    ``channel()`` gives its one channel's facts as they are now; ``closed(reason)`` is
    called once when an operator closes it or its vhost is deleted (RabbitMQ's text:
    ``CONNECTION_FORCED - <reason>``). Raises core's
    :class:`~leveret.core.lifecycle.ConnectionRefused` when the vhost's or user's
    connection limit is reached."""

    def __init__(
        self,
        core: BrokerCore,
        vhost: str,
        user: str,
        node: str,
        connection_name: str | None,
        channel: Callable[[], ChannelFacts],
        closed: Callable[[str], None],
    ) -> None:
        self.name = direct_name(node)
        self.user, self.vhost = user, vhost
        self.client_properties: dict[str, Any] = {}
        if connection_name is not None:
            self.client_properties["connection_name"] = connection_name
        self.connected_at = time.time()
        self._channel, self._closed = channel, closed
        self.handle: ConnectionHandle | None = None
        self.handle = open_connection(core, self, user, core.vhosts[vhost], PROTOCOL, self.name)

    def facts(self) -> ConnectionFacts:
        """The connection as management and ``leveret ctl`` list it."""
        return ConnectionFacts(
            peer_host="",
            peer_port=0,
            host="",
            port=0,
            protocol=PROTOCOL,
            user=self.user,
            vhost=self.vhost,
            connected_at=self.connected_at,
            client_properties=self.client_properties,
            auth_mechanism="",
            channels=(self._channel(),),
            kind=KIND,
            given_name=self.name,
        )

    def close_by_operator(self, reason: str) -> None:
        """End the link's session (it restarts after ``reconnect-delay``)."""
        self._closed(f"CONNECTION_FORCED - {reason}")

    def on_alarm(self, active: bool) -> None:
        """Nothing: the publisher looks at the alarm before each publish."""

    def on_vhost_deleted(self, name: str) -> None:
        self._closed(f"CONNECTION_FORCED - vhost '{name}' is deleted")

    def close(self) -> None:
        """Leave the registry (idempotent)."""
        if self.handle is not None:
            self.handle.close()
