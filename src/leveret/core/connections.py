"""The broker's open client connections, seen without their protocol.

Each protocol adapter's connection is registered once it is open (logged in, in a
vhost) and unregistered when it ends, by its :class:`~.lifecycle.ConnectionHandle`
(:func:`.lifecycle.open_connection`); management, ``leveret ctl`` and metrics read
:class:`ConnectionFacts` from it and may ask it to close (RabbitMQ's "close
connection": AMQP 320 CONNECTION_FORCED, a STOMP ERROR frame). Nothing here knows a
frame or a socket: the adapter fills in the facts.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class ConsumerFacts:
    """One consumer (AMQP basic.consume, a STOMP SUBSCRIBE) of a channel: ``active``
    false while it waits behind a queue's single active consumer (``single_active``:
    its queue has one)."""

    tag: str
    queue: str
    ack_required: bool
    exclusive: bool
    prefetch_count: int
    arguments: dict
    active: bool = True
    single_active: bool = False


@dataclass(frozen=True, slots=True)
class ChannelFacts:
    """One channel (AMQP) or session (STOMP: the connection's one channel, number 1)."""

    number: int
    prefetch_count: int = 0
    global_prefetch_count: int = 0
    confirm: bool = False
    transactional: bool = False
    messages_unacknowledged: int = 0
    messages_unconfirmed: int = 0
    messages_uncommitted: int = 0
    acks_uncommitted: int = 0
    state: str = "running"
    consumers: tuple[ConsumerFacts, ...] = ()


@dataclass(frozen=True, slots=True)
class ConnectionFacts:
    """What a client connection is: ``name`` is RabbitMQ's ``"peer -> listener"``
    (``"127.0.0.1:50000 -> 127.0.0.1:5672"``), or ``given_name`` when set;
    ``connected_at`` epoch seconds. ``kind`` is RabbitMQ's ``type``: ``network`` (a
    client on a socket), or ``direct`` (inside the broker, no socket: a federation
    link's publishing, :mod:`leveret.federation.direct`)."""

    peer_host: str
    peer_port: int
    host: str
    port: int
    protocol: str
    user: str
    vhost: str
    connected_at: float
    client_properties: dict[str, Any] = field(default_factory=dict)
    auth_mechanism: str = "PLAIN"
    channel_max: int = 0
    frame_max: int = 0
    heartbeat: int = 0
    ssl: bool = False
    state: str = "running"
    channels: tuple[ChannelFacts, ...] = ()
    kind: str = "network"
    given_name: str = ""

    @property
    def name(self) -> str:
        return self.given_name or connection_name(self.peer_host, self.peer_port, self.host, self.port)


@dataclass(frozen=True, slots=True)
class LinkFacts:
    """One AMQP 1.0 link of a session (RabbitMQ 4's link infos), seen from the broker:
    ``incoming`` when the client sends on it (a publisher), else outgoing (a consumer).
    ``address`` is the target's (incoming) or source's (outgoing) address, None when
    null; ``delivery_count`` and ``credit`` are the link's flow state (§2.6.7);
    ``max_message_size`` bytes, None for unlimited (an outgoing link's is the client's,
    an incoming link's the broker's). Incoming only: ``snd_settle_mode``
    (``settled``/``unsettled``/``mixed``) and ``unconfirmed`` (deliveries waiting for
    their outcome). Outgoing only: ``queue`` (the source queue's name),
    ``send_settled`` (the broker sends settled: no acknowledgements) and ``filters``
    (name, descriptor: a symbol's text or a numeric code, value as JSON holds it)."""

    handle: int
    name: str
    incoming: bool
    address: str | None
    delivery_count: int = 0
    credit: int = 0
    max_message_size: int | None = None
    snd_settle_mode: str = "unsettled"
    unconfirmed: int = 0
    queue: str = ""
    send_settled: bool = False
    filters: tuple[tuple[str, str | int, Any], ...] = ()


@dataclass(frozen=True, slots=True)
class SessionFacts:
    """One AMQP 1.0 session (§2.5; RabbitMQ 4's session infos): ``channel`` is the
    broker's channel number, ``remote_channel`` the client's; the windows count
    transfer frames (§2.5.6); ``outgoing_unsettled`` deliveries the broker sent and the
    client has not settled."""

    channel: int
    remote_channel: int
    handle_max: int
    next_incoming_id: int
    incoming_window: int
    next_outgoing_id: int
    remote_incoming_window: int
    remote_outgoing_window: int
    outgoing_unsettled: int
    links: tuple[LinkFacts, ...] = ()


def connection_name(peer_host: str, peer_port: int, host: str, port: int) -> str:
    """RabbitMQ's connection name, ``"peer:port -> local:port"``."""
    return f"{peer_host}:{peer_port} -> {host}:{port}"


class ClientConnection(Protocol):
    """What each adapter's open connection offers the registry."""

    def facts(self) -> ConnectionFacts:
        """The connection as it is now."""

    def close_by_operator(self, reason: str) -> None:
        """Close it because an operator said so (``reason``: their text, shown to the
        client as RabbitMQ does: ``CONNECTION_FORCED - <reason>``)."""


class WithSessions(Protocol):
    """A connection whose protocol has sessions and links (AMQP 1.0)."""

    def session_facts(self) -> tuple[SessionFacts, ...]:
        """Its sessions as they are now, by channel."""


def sessions_of(connection: ClientConnection) -> tuple[SessionFacts, ...] | None:
    """``connection``'s sessions, or None when its protocol has none (AMQP 0-9-1's
    channels, STOMP, MQTT): management asks without knowing the protocol."""
    facts = getattr(connection, "session_facts", None)
    return None if facts is None else facts()


class Connections:
    """The registry (one per broker, :attr:`BrokerCore.connections`)."""

    def __init__(self) -> None:
        self._open: dict[int, tuple[ClientConnection, str]] = {}

    def add(self, connection: ClientConnection, vhost: str) -> None:
        """``connection`` is open in ``vhost`` (idempotent)."""
        self._open[id(connection)] = (connection, vhost)

    def remove(self, connection: ClientConnection) -> None:
        """``connection`` ended (idempotent)."""
        self._open.pop(id(connection), None)

    def __len__(self) -> int:
        return len(self._open)

    def __iter__(self) -> Iterator[ClientConnection]:
        return iter([connection for connection, _ in self._open.values()])

    def count_in(self, vhost: str) -> int:
        """How many connections are open in ``vhost``."""
        return sum(1 for _, name in self._open.values() if name == vhost)

    def facts(self) -> list[tuple[ConnectionFacts, ClientConnection]]:
        """Every open connection with its facts, by name."""
        found = [(c.facts(), c) for c in self]
        return sorted(found, key=lambda item: item[0].name)

    def find(self, name: str) -> tuple[ConnectionFacts, ClientConnection] | None:
        """The open connection of that name, or None."""
        for facts, connection in self.facts():
            if facts.name == name:
                return facts, connection
        return None
