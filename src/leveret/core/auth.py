"""Users, passwords and virtual host permissions.

As in RabbitMQ, the default user ``guest``/``guest`` exists with access to ``/`` and
may only log in from a loopback address (``loopback_users``).
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field


class AuthenticationError(Exception):
    """Login refused; the text is what connection.close 403 carries."""


@dataclass
class User:
    """A broker user: ``vhosts`` it may open (``"*"``: all) and RabbitMQ's ``tags``
    (``administrator`` …; kept, not enforced)."""

    name: str
    password: str
    vhosts: list[str] = field(default_factory=lambda: ["/"])
    tags: list[str] = field(default_factory=list)


class UserDatabase:
    """The broker's users; ``loopback_users`` may connect only from 127/8 or ::1."""

    def __init__(self, users: list[User] | None = None, loopback_users: list[str] | None = None) -> None:
        self.users = {u.name: u for u in (users if users is not None else [User("guest", "guest")])}
        self.loopback_users = set(loopback_users if loopback_users is not None else ["guest"])

    def authenticate(
        self, username: str, password: str, from_loopback: bool, mechanism: str = "PLAIN"
    ) -> User:
        """The user, if ``password`` is right and the user may log in from here
        (``from_loopback``: the peer is 127/8 or ::1). Raises AuthenticationError with
        RabbitMQ's texts (the AMQP adapter sends them in connection.close 403)."""
        user = self.users.get(username)
        if user is None or not hmac.compare_digest(user.password.encode(), password.encode()):
            raise AuthenticationError(
                f"Login was refused using authentication mechanism {mechanism}. "
                "For details see the broker logfile."
            )
        if username in self.loopback_users and not from_loopback:
            raise AuthenticationError(f"user '{username}' can only connect via localhost")
        return user

    @staticmethod
    def may_access(user: User, vhost: str) -> bool:
        """Whether ``user`` may open ``vhost`` (AMQP: connection.open, else 530)."""
        return vhost in user.vhosts or "*" in user.vhosts
