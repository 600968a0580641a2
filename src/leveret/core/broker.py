"""The broker's protocol-independent state: virtual hosts, users, limits, alarms.

Protocol adapters (:mod:`leveret.protocol`) drive it; it knows nothing of sockets.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .auth import User, UserDatabase
from .clock import Clock
from .policy import Policy
from .vhost import VirtualHost

if TYPE_CHECKING:
    from ..store import Store


@dataclass
class Limits:
    """Negotiated and enforced limits; defaults are RabbitMQ 3.10's.

    ``heartbeat`` in seconds, sizes in bytes.
    """

    channel_max: int = 2047
    frame_max: int = 131072
    heartbeat: int = 60
    max_message_size: int = 128 * 1024 * 1024


@dataclass
class BrokerCore:
    """The broker's state. ``clock`` gives time and timers (the server's event loop, or
    a test's :class:`~.clock.ManualClock`)."""

    clock: Clock
    vhosts: dict[str, VirtualHost] = field(default_factory=dict)
    users: UserDatabase = field(default_factory=UserDatabase)
    limits: Limits = field(default_factory=Limits)
    #: Called with True/False when a resource alarm starts/ends (connection.blocked).
    alarm_listeners: list[Callable[[bool], None]] = field(default_factory=list)
    alarm_active: bool = False
    #: Durable definitions and messages; None for a broker that keeps nothing.
    store: Store | None = None
    policies: list[Policy] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.vhosts:
            self.add_vhost("/")

    def add_vhost(self, name: str) -> VirtualHost:
        """Create (and persist, once a store is attached) a virtual host."""
        vhost = self.vhosts.get(name)
        if vhost is None:
            vhost = self.vhosts[name] = VirtualHost(name, self.clock, self.store, self.policies)
            if self.store is not None:
                self.store.save_definition("vhost", name, "", {})
        return vhost

    def add_user(self, user: User) -> None:
        """Create or replace a user (persisted once a store is attached)."""
        self.users.users[user.name] = user
        if self.store is not None:
            self.store.save_definition(
                "user", "", user.name, {"password": user.password, "vhosts": user.vhosts, "tags": user.tags}
            )

    def attach_store(self, store: Store) -> int:
        """Recover definitions and messages from ``store`` and persist from now on;
        returns the number of messages recovered. Raises StoreError (naming the file) if
        the store cannot be read."""
        from .definitions import recover

        snapshot = store.load()
        for _, name, data in snapshot.definitions.get("user", []):
            if name not in self.users.users:
                self.users.users[name] = User(
                    name,
                    str(data["password"]),
                    [str(v) for v in data["vhosts"]],
                    [str(t) for t in data["tags"]],
                )
        self.store = store
        return recover(self, snapshot, store)

    def set_alarm(self, active: bool) -> None:
        """Raise or clear a resource alarm; publishers get connection.blocked/unblocked."""
        if active == self.alarm_active:
            return
        self.alarm_active = active
        for listener in list(self.alarm_listeners):
            listener(active)
