"""Users, their passwords and tags, and what they may do in each virtual host: the
internal database of RabbitMQ (``rabbit_auth_backend_internal``), with its rules.

- A user has a password hash (:mod:`.passwords`, RabbitMQ's scheme) and tags
  (``administrator``, ``monitoring``, ``policymaker``, ``management``, ``impersonator``
  or any other word): tags matter to the management API only.
- A **permission** gives one user three regular expressions in one vhost: *configure*
  (declare, delete), *write* (publish to an exchange, bind a queue or exchange as the
  destination), *read* (consume, get, purge; bind from an exchange). A user without a
  permission in a vhost cannot open it. An expression is searched for anywhere in the
  name (Erlang's ``re:run``, as RabbitMQ); ``""`` matches nothing.
- A **topic permission** narrows publishing to (*write*) and binding from (*read*) one
  topic exchange to routing keys matching an expression, in which ``{username}`` and
  ``{vhost}`` are replaced (and ``{client_id}`` for MQTT clients); without one, any
  routing key is allowed.

As in RabbitMQ, the default user ``guest``/``guest`` (tag administrator, full permission
on ``/``) exists unless the configuration defines users, and may only log in from a
loopback address (``loopback_users``).
"""

from __future__ import annotations

import functools
import hmac
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from .passwords import DEFAULT_ALGORITHM, check_password, hash_password

#: The internal user the nodes of a cluster log in to each other as (docs/cluster.md):
#: accepted only while :attr:`UserDatabase.cluster_secret` is set (an active node), with
#: that secret as password and full permissions in every vhost; never listed.
CLUSTER_USER = "leveret-cluster"

#: The tags RabbitMQ's management plugin knows (any other word is kept, and ignored).
KNOWN_TAGS = ("administrator", "monitoring", "policymaker", "management", "impersonator")


class AuthenticationError(Exception):
    """Login refused; the text is what connection.close 403 carries."""


class LoopbackOnly(AuthenticationError):
    """The password was right, but the user is one of ``loopback_users`` and the peer is
    not a loopback address (RabbitMQ's HTTP API answers this with its own reason)."""


@dataclass
class User:
    """A broker user: RabbitMQ's password hash and algorithm (an empty hash: no password
    login) and tags."""

    name: str
    password_hash: str = ""
    hashing_algorithm: str = DEFAULT_ALGORITHM
    tags: list[str] = field(default_factory=list)

    @classmethod
    def with_password(cls, name: str, password: str, tags: Iterable[str] = ()) -> User:
        """A user whose ``password`` is hashed with a fresh salt."""
        return cls(name, hash_password(password), DEFAULT_ALGORITHM, list(tags))

    def definition(self) -> dict:
        """The user as RabbitMQ's definitions write it (``tags`` a list, as 3.10)."""
        return {
            "name": self.name,
            "password_hash": self.password_hash,
            "hashing_algorithm": self.hashing_algorithm,
            "tags": list(self.tags),
        }


@functools.lru_cache(maxsize=4096)
def _compiled(pattern: str) -> re.Pattern[str] | None:
    try:
        return re.compile(pattern or "^$")  # RabbitMQ reads "" as "^$"
    except re.error:
        return None


def matches(pattern: str, name: str) -> bool:
    """Whether the permission expression ``pattern`` allows ``name`` (an unanchored
    search; an invalid expression allows nothing)."""
    compiled = _compiled(pattern)
    return compiled is not None and compiled.search(name) is not None


def check_pattern(pattern: str) -> str | None:
    """None if ``pattern`` is a valid expression, else why not."""
    try:
        re.compile(pattern)
    except re.error as exc:
        return str(exc)
    return None


@dataclass(frozen=True)
class Permission:
    """One user's configure, write and read expressions in one vhost."""

    configure: str = ".*"
    write: str = ".*"
    read: str = ".*"


@dataclass(frozen=True)
class TopicPermission:
    """One user's write and read expressions on routing keys of one topic exchange."""

    exchange: str
    write: str = ".*"
    read: str = ".*"


FULL = Permission()
#: Keys of removed grants: permissions (vhost, user), topic permissions (vhost, user, exchange).
Grants = tuple[list[tuple[str, str]], list[tuple[str, str, str]]]


class UserDatabase:
    """The broker's users, permissions and topic permissions; ``loopback_users`` may
    connect only from 127/8 or ::1. ``generation`` grows with every change, so checks
    may cache what they found until it moves."""

    def __init__(self, users: list[User] | None = None, loopback_users: list[str] | None = None) -> None:
        self.users: dict[str, User] = {}
        self.permissions: dict[tuple[str, str], Permission] = {}  # (vhost, user)
        self.topic_permissions: dict[tuple[str, str, str], TopicPermission] = {}  # (vhost, user, x)
        self.loopback_users = set(loopback_users if loopback_users is not None else ["guest"])
        self.generation = 0
        #: set on an active cluster node (:mod:`leveret.cluster.owner`): the password of
        #: :data:`CLUSTER_USER`
        self.cluster_secret: str | None = None
        self._cluster_user = User(CLUSTER_USER)
        if users is None:
            self.users["guest"] = User.with_password("guest", "guest", ["administrator"])
            self.permissions[("/", "guest")] = FULL
        else:
            for user in users:
                self.users[user.name] = user

    def changed(self) -> None:
        """Count a change (cached permission checks are then redone)."""
        self.generation += 1

    def authenticate(
        self, username: str, password: str, from_loopback: bool, mechanism: str = "PLAIN"
    ) -> User:
        """The user, if ``password`` is right and the user may log in from here
        (``from_loopback``: the peer is 127/8 or ::1). Raises AuthenticationError with
        RabbitMQ's texts (the AMQP adapter sends them in connection.close 403)."""
        secret = self.cluster_secret
        if secret is not None and username == CLUSTER_USER:
            if password and hmac.compare_digest(password.encode(), secret.encode()):
                return self._cluster_user
            raise AuthenticationError(
                f"Login was refused using authentication mechanism {mechanism}. "
                "For details see the broker logfile."
            )
        user = self.users.get(username)
        if (
            user is None
            or not password  # RabbitMQ refuses a blank password whatever the hash
            or not check_password(password, user.password_hash, user.hashing_algorithm)
        ):
            raise AuthenticationError(
                f"Login was refused using authentication mechanism {mechanism}. "
                "For details see the broker logfile."
            )
        if username in self.loopback_users and not from_loopback:
            raise LoopbackOnly(f"user '{username}' can only connect via localhost")
        return user

    def authenticate_external(self, username: str, from_loopback: bool) -> User:
        """The user a verified client certificate names (SASL EXTERNAL): it must exist,
        no password is asked. AuthenticationError with RabbitMQ's texts otherwise."""
        user = self.users.get(username)
        if user is None:
            raise AuthenticationError(
                "Login was refused using authentication mechanism EXTERNAL. "
                "For details see the broker logfile."
            )
        if username in self.loopback_users and not from_loopback:
            raise LoopbackOnly(f"user '{username}' can only connect via localhost")
        return user

    def permission(self, user: str, vhost: str) -> Permission | None:
        """``user``'s permission in ``vhost``, if any."""
        if user == CLUSTER_USER and self.cluster_secret is not None:
            return FULL
        return self.permissions.get((vhost, user))

    def is_cluster_peer(self, user: User) -> bool:
        """Whether ``user`` is another node of the cluster (:data:`CLUSTER_USER`)."""
        return user is self._cluster_user and self.cluster_secret is not None

    def may_access(self, user: User, vhost: str) -> bool:
        """Whether ``user`` may open ``vhost`` (has a permission there; AMQP: else
        connection.open gets 530)."""
        return (vhost, user.name) in self.permissions or self.is_cluster_peer(user)

    def topic_permission(self, user: str, vhost: str, exchange: str) -> TopicPermission | None:
        """``user``'s topic permission on ``exchange`` in ``vhost``, if any."""
        return self.topic_permissions.get((vhost, user, exchange))

    def delete_user(self, name: str) -> Grants | None:
        """Remove a user with its permissions and topic permissions; returns the keys of
        those removed (None if the user is unknown)."""
        if self.users.pop(name, None) is None:
            return None
        return self._forget(lambda vhost, user: user == name)

    def delete_vhost(self, vhost: str) -> Grants:
        """Forget every permission and topic permission in ``vhost``; returns their keys."""
        return self._forget(lambda in_vhost, user: in_vhost == vhost)

    def _forget(self, doomed: Callable[[str, str], bool]) -> Grants:
        permissions = [k for k in self.permissions if doomed(*k)]
        topics = [k for k in self.topic_permissions if doomed(k[0], k[1])]
        for key in permissions:
            del self.permissions[key]
        for topic_key in topics:
            del self.topic_permissions[topic_key]
        self.changed()
        return permissions, topics
