"""Users, passwords and virtual host permissions; SASL PLAIN and AMQPLAIN.

As in RabbitMQ, the default user ``guest``/``guest`` exists with access to ``/`` and
may only log in from a loopback address (``loopback_users``).
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field

from pamqp import decode

MECHANISMS = ("PLAIN", "AMQPLAIN")


class AuthenticationError(Exception):
    """Login refused; the text is what connection.close 403 carries."""


@dataclass
class User:
    name: str
    password: str
    vhosts: list[str] = field(default_factory=lambda: ["/"])
    tags: list[str] = field(default_factory=list)


def parse_response(mechanism: str, response: bytes | str) -> tuple[str, str]:
    """(username, password) from a connection.start-ok response.

    PLAIN is ``authzid NUL authcid NUL password`` (RFC 4616); AMQPLAIN a field table
    without its length prefix holding LOGIN and PASSWORD. Raises AuthenticationError.
    """
    raw = response.encode("latin-1") if isinstance(response, str) else bytes(response)
    if mechanism == "PLAIN":
        parts = raw.split(b"\x00")
        if len(parts) != 3:
            raise AuthenticationError("PLAIN response is not 'authzid NUL user NUL password'")
        return parts[1].decode("utf-8", "replace"), parts[2].decode("utf-8", "replace")
    if mechanism == "AMQPLAIN":
        try:
            _, table = decode.field_table(len(raw).to_bytes(4, "big") + raw)
        except Exception as exc:  # pamqp raises several types for a bad table
            raise AuthenticationError(f"AMQPLAIN response is not a field table: {exc}") from None
        login, password = table.get("LOGIN"), table.get("PASSWORD")
        if login is None or password is None:
            raise AuthenticationError("AMQPLAIN response lacks LOGIN or PASSWORD")
        as_text = (lambda v: v.decode() if isinstance(v, bytes) else str(v))
        return as_text(login), as_text(password)
    raise AuthenticationError(f"unsupported authentication mechanism '{mechanism}'")


class UserDatabase:
    """The broker's users; ``loopback_users`` may connect only from 127/8 or ::1."""

    def __init__(self, users: list[User] | None = None, loopback_users: list[str] | None = None) -> None:
        self.users = {u.name: u for u in (users if users is not None else [User("guest", "guest")])}
        self.loopback_users = set(loopback_users if loopback_users is not None else ["guest"])

    def authenticate(self, username: str, password: str, from_loopback: bool,
                     mechanism: str = "PLAIN") -> User:
        """Raises AuthenticationError with RabbitMQ's texts."""
        user = self.users.get(username)
        if user is None or not hmac.compare_digest(user.password.encode(), password.encode()):
            raise AuthenticationError(
                f"Login was refused using authentication mechanism {mechanism}. "
                "For details see the broker logfile.")
        if username in self.loopback_users and not from_loopback:
            raise AuthenticationError(
                f"user '{username}' can only connect via localhost")
        return user

    @staticmethod
    def may_access(user: User, vhost: str) -> bool:
        return vhost in user.vhosts or "*" in user.vhosts
