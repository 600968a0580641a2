"""The broker's protocol-independent state: virtual hosts, users, limits, alarms.

Protocol adapters (:mod:`leveret.protocol`) drive it; it knows nothing of sockets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from .auth import User, UserDatabase
from .vhost import VirtualHost


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
    vhosts: dict[str, VirtualHost] = field(default_factory=dict)
    users: UserDatabase = field(default_factory=UserDatabase)
    limits: Limits = field(default_factory=Limits)
    #: Called with True/False when a resource alarm starts/ends (connection.blocked).
    alarm_listeners: list[Callable[[bool], None]] = field(default_factory=list)
    alarm_active: bool = False

    def __post_init__(self) -> None:
        if not self.vhosts:
            self.add_vhost("/")

    def add_vhost(self, name: str) -> VirtualHost:
        return self.vhosts.setdefault(name, VirtualHost(name))

    def add_user(self, user: User) -> None:
        self.users.users[user.name] = user

    def set_alarm(self, active: bool) -> None:
        """Raise or clear a resource alarm; publishers get connection.blocked/unblocked."""
        if active == self.alarm_active:
            return
        self.alarm_active = active
        for listener in list(self.alarm_listeners):
            listener(active)
