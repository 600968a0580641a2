"""Permission checks of one logged-in user in one virtual host, with RabbitMQ's texts
(``rabbit_access_control``): a refused check raises AccessRefused (AMQP: channel.close
403 ACCESS_REFUSED), e.g. ``access to queue 'q' in vhost '/' refused for user 'bob'``.

Which operation needs which permission is :mod:`.session`'s business; this module only
answers "may this user configure/write/read this exchange or queue" and "may this user
publish to/bind from this topic exchange with this routing key".
"""

from __future__ import annotations

import re

from .auth import User, UserDatabase, matches
from .errors import access_refused

DEFAULT_EXCHANGE_RESOURCE = "amq.default"  # the default exchange's name in permission checks


class Access:
    """What ``user`` may do in ``vhost``, looked up in ``users`` at each check (a
    permission changed at run time applies at once; the last allowed publish target is
    remembered until anything changes). ``variables`` are more ``{name}`` placeholders
    of topic permissions than ``{username}`` and ``{vhost}`` (MQTT: ``client_id``, as
    RabbitMQ's MQTT plugin passes in its authorisation context)."""

    def __init__(
        self, users: UserDatabase, user: User, vhost: str, variables: dict[str, str] | None = None
    ) -> None:
        self.users = users
        self.user = user
        self.vhost = vhost
        self.variables = {"username": user.name, "vhost": vhost, **(variables or {})}
        self._allowed_write: tuple[int, str] | None = None  # (generation, exchange)

    def _check(self, operation: str, kind: str, name: str) -> None:
        if kind == "exchange" and name == "":
            name = DEFAULT_EXCHANGE_RESOURCE
        permission = self.users.permission(self.user.name, self.vhost)
        if permission is None or not matches(getattr(permission, operation), name):
            raise access_refused(
                f"access to {kind} '{name}' in vhost '{self.vhost}' refused for user '{self.user.name}'"
            )

    def configure(self, kind: str, name: str) -> None:
        """Declare or delete ``kind`` (``exchange`` or ``queue``) ``name``."""
        self._check("configure", kind, name)

    def write(self, kind: str, name: str) -> None:
        """Publish to an exchange, or be the destination of a binding."""
        self._check("write", kind, name)

    def read(self, kind: str, name: str) -> None:
        """Consume from, get from or purge a queue; be the source of a binding."""
        self._check("read", kind, name)

    def publish(self, exchange: str) -> None:
        """``write`` on ``exchange``, cached for a publisher sending to one exchange."""
        generation = self.users.generation
        if self._allowed_write == (generation, exchange):
            return
        self._check("write", "exchange", exchange)
        self._allowed_write = (generation, exchange)

    def topic(self, operation: str, exchange: str, routing_key: str) -> None:
        """``write`` (publish) or ``read`` (bind from) topic ``exchange`` with
        ``routing_key``: allowed unless a topic permission for the exchange says no.
        Its expression's ``{username}``, ``{vhost}`` and the connection's other
        ``variables`` are replaced by their values with every regular-expression
        character escaped (``re.escape``), as RabbitMQ does since CVE-2026-44838 (a
        client id ``.*`` or ``a-z`` must not widen ``^{client_id}/`` or
        ``[{client_id}]``); an unknown ``{name}`` stays."""
        topic = self.users.topic_permission(self.user.name, self.vhost, exchange)
        if topic is None:
            return
        pattern = getattr(topic, operation)
        if "{" in pattern:
            for name, value in self.variables.items():
                pattern = pattern.replace("{" + name + "}", re.escape(value))
        if not matches(pattern, routing_key):
            raise access_refused(
                f"access to topic '{routing_key}' in exchange '{exchange}' in vhost '{self.vhost}' "
                f"refused for user '{self.user.name}'"
            )
