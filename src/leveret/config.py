"""Broker settings, from keyword arguments or a TOML file (``leveret server --config``).

Example file::

    vhosts = ["/", "orders"]
    loopback_users = ["guest"]      # users that may only connect from 127.0.0.1 / ::1

    [server]
    bind = "127.0.0.1"
    amqp_port = 5672
    http_port = 15672               # the management HTTP API (RabbitMQ's port)
    data_dir = "./leveret-data"
    heartbeat = 60                  # seconds proposed in connection.tune; 0 disables
    frame_max = 131072              # bytes
    channel_max = 2047
    max_message_size = 134217728    # bytes; larger messages get 406 PRECONDITION_FAILED
    disk_free_limit = 50000000      # bytes free under data_dir; below it publishers block
    read_coalesce_ms = 1            # hold a client streaming small writes this long; 0: off

    [[policies]]                    # RabbitMQ's policies: keys without the x- prefix
    name = "orders-dlx"
    pattern = "^orders\\."          # a regular expression on the queue name
    apply_to = "queues"             # queues, exchanges or all
    priority = 1                    # the highest-priority matching policy applies
    definition = { dead-letter-exchange = "dlx", message-ttl = 60000, max-redeliveries = 5 }

    [[users]]
    name = "alice"
    password = "s3cret"
    vhosts = ["/", "orders"]        # "*" for all
    tags = ["administrator"]

The guest/guest user always exists (vhost ``/``, loopback only) unless ``[[users]]``
redefines ``guest``, as in RabbitMQ.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from .core.auth import User, UserDatabase
from .core.broker import BrokerCore, Limits
from .core.clock import Clock
from .core.policy import Policy


class ConfigError(ValueError):
    """The config file is unreadable or has an unknown or ill-typed key."""


@dataclass
class Settings:
    """Everything a broker is started with (see the module doc for the file form)."""

    bind: str = "127.0.0.1"
    amqp_port: int = 5672
    data_dir: str | None = None  # None: keep nothing on disk (embedded default)
    log_level: str = "info"
    disk_free_limit: int = 50_000_000  # bytes; below it publishers are blocked
    http_port: int | None = None  # management API port; None: off
    read_coalesce_ms: int = 1  # see server/read_coalescing.py; 0 reads every write at once
    limits: Limits = field(default_factory=Limits)
    vhosts: list[str] = field(default_factory=lambda: ["/"])
    users: list[User] = field(default_factory=list)
    loopback_users: list[str] = field(default_factory=lambda: ["guest"])
    policies: list[Policy] = field(default_factory=list)

    def build_core(self, clock: Clock) -> BrokerCore:
        """A BrokerCore with these users, limits, policies and vhosts, on ``clock``."""
        users = UserDatabase(loopback_users=self.loopback_users)
        for user in self.users:
            users.users[user.name] = user
        core = BrokerCore(clock, users=users, limits=self.limits, policies=list(self.policies))
        for name in self.vhosts:
            core.add_vhost(name)
        return core


_SERVER_KEYS = {
    "bind": str,
    "amqp_port": int,
    "data_dir": str,
    "log_level": str,
    "disk_free_limit": int,
    "http_port": int,
    "read_coalesce_ms": int,
}
_LOG_LEVELS = ("debug", "info", "warning", "error")
_LIMIT_KEYS = {"heartbeat": int, "frame_max": int, "channel_max": int, "max_message_size": int}


def load(path: str | Path, settings: Settings | None = None) -> Settings:
    """Read a TOML config file into ``settings`` (a new Settings by default).

    Raises ConfigError naming the file and the offending key.
    """
    settings = settings or Settings()
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from None

    def typed(section: str, key: str, value: object, kind: type) -> object:
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
            raise ConfigError(f"{path}: {section}{key} must be {kind.__name__}")
        return value

    def strings(key: str, value: object) -> list[str]:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{path}: {key} must be a list of strings")
        return list(value)

    server = data.pop("server", {})
    if not isinstance(server, dict):
        raise ConfigError(f"{path}: [server] must be a table")
    for key, value in server.items():
        if key in _SERVER_KEYS:
            setattr(settings, key, typed("server.", key, value, _SERVER_KEYS[key]))
        elif key in _LIMIT_KEYS:
            setattr(settings.limits, key, typed("server.", key, value, _LIMIT_KEYS[key]))
        else:
            raise ConfigError(f"{path}: unknown key server.{key}")
    if settings.read_coalesce_ms < 0:
        raise ConfigError(f"{path}: server.read_coalesce_ms must be 0 or more")
    if settings.log_level.lower() not in _LOG_LEVELS:
        raise ConfigError(f"{path}: server.log_level must be one of {', '.join(_LOG_LEVELS)}")
    if "vhosts" in data:
        settings.vhosts = strings("vhosts", data.pop("vhosts"))
    if "loopback_users" in data:
        settings.loopback_users = strings("loopback_users", data.pop("loopback_users"))
    users = data.pop("users", [])
    if not isinstance(users, list) or not all(isinstance(e, dict) for e in users):
        raise ConfigError(f"{path}: users must be [[users]] tables")
    for entry in users:
        unknown = set(entry) - {"name", "password", "vhosts", "tags"}
        if unknown:
            raise ConfigError(f"{path}: unknown key(s) users.{', users.'.join(sorted(unknown))}")
        if not isinstance(entry.get("name"), str) or not isinstance(entry.get("password"), str):
            raise ConfigError(f"{path}: each [[users]] needs string name and password")
        settings.users.append(
            User(
                name=entry["name"],
                password=entry["password"],
                vhosts=strings("users.vhosts", entry.get("vhosts", ["/"])),
                tags=strings("users.tags", entry.get("tags", [])),
            )
        )
    policies = data.pop("policies", [])
    if not isinstance(policies, list) or not all(isinstance(e, dict) for e in policies):
        raise ConfigError(f"{path}: policies must be [[policies]] tables")
    for entry in policies:
        try:
            settings.policies.append(
                Policy(
                    name=entry["name"],
                    pattern=entry["pattern"],
                    definition=dict(entry["definition"]),
                    apply_to=entry.get("apply_to", "all"),
                    priority=int(entry.get("priority", 0)),
                    vhost=entry.get("vhost", "/"),
                )
            )
        except (KeyError, TypeError, ValueError, re.error) as exc:
            raise ConfigError(
                f"{path}: each [[policies]] needs name, pattern (a regular "
                f"expression) and a definition table ({exc})"
            ) from None
    if data:
        raise ConfigError(f"{path}: unknown key(s) {', '.join(sorted(data))}")
    return settings
