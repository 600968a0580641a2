"""Broker settings, from keyword arguments or a TOML file (``leveret server --config``).

Example file::

    vhosts = ["/", "orders"]
    loopback_users = ["guest"]      # users that may only connect from 127.0.0.1 / ::1

    [server]
    bind = "127.0.0.1"
    amqp_port = 5672
    http_port = 15672               # the management HTTP API (RabbitMQ's port)
    prometheus_port = 15692         # Prometheus metrics, /metrics (rabbitmq_prometheus's port)
    stomp_port = 61613              # STOMP 1.0-1.2 (ActiveMQ's port); the AMQP port takes STOMP too
    web_stomp_port = 15674          # STOMP over WebSocket, ws://HOST:PORT/ws (RabbitMQ's port)
    mqtt_port = 1883                # MQTT 3.1.1 and 5.0 (docs/mqtt.md)
    web_mqtt_port = 15675           # MQTT over WebSocket, ws://HOST:PORT/ws (RabbitMQ's port)
    mqtts_port = 8883               # MQTT over TLS (needs [ssl_options]); off by default
    web_amqp_port = 15678           # AMQP 1.0 over WebSocket, ws://HOST:PORT/ws; off by default
    data_dir = "./leveret-data"
    heartbeat = 60                  # seconds proposed in connection.tune; 0 disables
    frame_max = 131072              # bytes
    channel_max = 2047
    stomp_heartbeat_grace = 1.5     # STOMP clients may be this many heart-beat intervals late
    global_qos = "per_consumer"     # basic.qos global=true on quorum/stream queues; or "refuse" (540)
    max_message_size = 134217728    # bytes; larger messages get 406 PRECONDITION_FAILED
    consumer_timeout = 1800000      # ms a delivery may stay unacked (RabbitMQ's); 0: never
    disk_free_limit = 50000000      # bytes free under data_dir; below it publishers block
    disk_reserve = 16777216         # bytes message writes always leave free (deletes, WAL)
    vm_memory_high_watermark = 0.4  # of RAM; above it publishers are blocked (RabbitMQ's)
    vm_memory_high_watermark_paging_ratio = 0.5  # of the watermark; queues page out above
    store_flow_high = 33554432      # bytes of unwritten messages above which publishers are held
    store_flow_low = 16777216       # ... and under which they are read again (docs/operations.md)
    queue_memory_budget = 134217728  # bytes queues hold messages in before paging; 0: none
    read_coalesce_ms = 1            # hold a client streaming small writes this long; 0: off
    workers = 0                     # AMQP connection worker processes (docs/multicore.md); 0: none
    http_allowed_hosts = ["broker.example.com"]  # Host names the HTTP API answers
    collect_statistics_interval = 5000  # ms between readings for the HTTP API's rates
    amqps_port = 5671               # AMQP 0-9-1 and 1.0 over TLS (needs [ssl_options])
    https_port = 15671              # the HTTP API over TLS
    ssl_cert_login_from = "distinguished_name"  # EXTERNAL: the user a certificate names

    [http]                          # every HTTP port: management, Prometheus, Web STOMP/MQTT/AMQP
    header_timeout = 20.0           # seconds to send a complete first request head; else closed
    keepalive_timeout = 60.0        # seconds an idle keep-alive connection is kept
    max_connections = 1024          # per HTTP port; beyond it 503 and closed at once
    fd_fraction = 0.25              # of RLIMIT_NOFILE for all HTTP ports (the rest: AMQP/STOMP)

    [login_throttle]                # failed logins (AMQP, STOMP, HTTP); a right password never waits
    address_burst = 10              # failures per address answered at once ...
    address_interval = 0.5          # ... then one per this many seconds
    user_burst = 20                 # failures per user name, from anywhere, answered at once ...
    user_interval = 1.0             # ... then one per this many seconds
    max_unauthenticated = 1024      # connections per address not logged in; beyond: refused

    [store]                         # where persistent state lives (default: SQLite in data_dir)
    url = "postgresql://leveret:secret@db.example:5432/leveret"   # a shared PostgreSQL
    cluster = "leveret"             # brokers of one cluster: one master, the others standbys

    [stomp_queue_arguments]         # queues STOMP clients create (default: ActiveMQ's policy)
    x-max-redeliveries = 6
    x-redelivery-delay = 1000
    x-dead-letter-strategy = "shared"
    x-dead-letter-queue = "ActiveMQ.DLQ"

    [ssl_options]                   # RabbitMQ's words
    certfile = "server.pem"
    keyfile = "server.key"
    cacertfile = "ca.pem"           # CAs of client certificates
    verify = "verify_peer"          # or verify_none (the default)
    fail_if_no_peer_cert = true

    [[policies]]                    # RabbitMQ's policies: keys without the x- prefix
    name = "orders-dlx"
    pattern = '^orders\\.'          # a regular expression on the queue name
    apply_to = "queues"             # queues, exchanges or all
    priority = 1                    # the highest-priority matching policy applies
    definition = { dead-letter-exchange = "dlx", message-ttl = 60000, max-redeliveries = 5 }

    [[shovels]]                     # static shovels (RabbitMQ's dynamic-shovel keys)
    name = "to-dc2"
    vhost = "/"
    src-uri = "amqp://"             # this broker
    src-queue = "outbox"
    dest-uri = "amqp://user:pass@dc2.example:5672/%2F"
    dest-queue = "inbox"
    ack-mode = "on-confirm"

    [[users]]
    name = "alice"
    password = "s3cret"             # or password_hash (+ hashing_algorithm), RabbitMQ's
    vhosts = ["/", "orders"]        # full permissions there ("*": every vhost above)
    tags = ["administrator"]

    [[permissions]]                 # finer permissions: RabbitMQ's regular expressions
    user = "bob"
    vhost = "orders"
    configure = '^bob\\.'
    write = ".*"
    read = ".*"

    [[topic_permissions]]
    user = "bob"
    vhost = "orders"
    exchange = "amq.topic"
    write = '^orders\\.'
    read = ".*"

The guest/guest user (tag administrator, full permissions on ``/``, loopback only)
exists unless ``[[users]]`` redefines ``guest``, as in RabbitMQ. Users and permissions
seed a new data directory; once the broker has stored them, the stored ones (changed
through the HTTP API) win.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .core import passwords
from .core.auth import Permission, TopicPermission, User, UserDatabase, check_pattern
from .core.broker import BrokerCore, Limits
from .core.clock import Clock
from .core.errors import BrokerError
from .core.login_throttle import ThrottleSettings
from .core.passwords import DEFAULT_ALGORITHM
from .core.policy import Policy
from .core.queues.features import build
from .server.http_limits import HttpLimits
from .server.tls import LOGIN_FROM, TLSError, TLSOptions
from .shovel.spec import ShovelError, ShovelSpec


class ConfigError(ValueError):
    """The config file is unreadable or has an unknown or ill-typed key."""


@dataclass
class Settings:
    """Everything a broker is started with (see the module doc for the file form)."""

    bind: str = "127.0.0.1"
    amqp_port: int = 5672
    data_dir: str | None = None  # None: keep nothing on disk (embedded default)
    #: ``postgresql://…``: keep state in PostgreSQL (master/standby) instead of SQLite
    #: under data_dir; None: SQLite (or nothing, without data_dir)
    store_url: str | None = None
    #: the brokers sharing one PostgreSQL store: one master, the rest standbys (also
    #: the store's schema name)
    store_cluster: str = "leveret"
    #: this broker's node name in an active-active cluster on the PostgreSQL store
    #: (docs/cluster.md); None: master/standby as before
    node_name: str | None = None
    #: the host other nodes of the cluster reach this node's AMQP port on
    cluster_advertise: str = "127.0.0.1"
    #: the cluster's shared secret (the internal ``leveret-cluster`` user's password);
    #: None: the one kept in the cluster's schema (made by the first node)
    cluster_secret: str | None = None
    #: where a new queue lives: ``client-local`` (the declaring node) or ``balanced``
    #: (the live node with the fewest queues), RabbitMQ's ``queue_leader_locator``
    queue_leader_locator: str = "client-local"
    #: the AMQP port other nodes of the cluster reach this node on (on ``bind``), when it
    #: differs from ``amqp_port``: ``leveret server --nodes N`` gives each node its own,
    #: since the shared client port reaches any of them; None: ``amqp_port``
    cluster_port: int | None = None
    #: bind every client port with SO_REUSEPORT, so the nodes of ``leveret server
    #: --nodes N`` share them and the kernel spreads connections over the nodes
    reuse_port: bool = False
    log_level: str = "info"
    disk_free_limit: int = 50_000_000  # bytes; below it publishers are blocked
    disk_reserve: int = 16 * 1024 * 1024  # bytes the store never fills with messages
    vm_memory_high_watermark: float = 0.4  # of the machine's RAM: above it publishers block
    vm_memory_high_watermark_absolute: int | None = None  # bytes; wins over the fraction
    vm_memory_high_watermark_paging_ratio: float = 0.5  # of the watermark: queues page out
    #: flow control (:mod:`leveret.core.flow`): bytes of messages the store has not
    #: written yet above which publishers are no longer read, and under which they are
    store_flow_high: int = 32 * 1024 * 1024
    store_flow_low: int = 16 * 1024 * 1024
    #: bytes every queue together holds messages in (bodies plus an estimate of their
    #: objects) before memory pressure pages them to the store (:mod:`leveret.core.
    #: queue_memory`); None: 128 MiB or a quarter of the watermark, the smaller; 0: none
    queue_memory_budget: int | None = None
    http_port: int | None = None  # management API port; None: off
    #: Prometheus metrics (``/metrics``, RabbitMQ's 15692; ``leveret server``'s default);
    #: None: off
    prometheus_port: int | None = None
    #: STOMP port (ActiveMQ's is 61613; ``leveret server`` listens there by default);
    #: None: off (clients may still speak STOMP on the AMQP port)
    stomp_port: int | None = None
    #: STOMP over WebSocket (``ws://HOST:PORT/ws``; RabbitMQ's Web STOMP port is 15674,
    #: ``leveret server``'s default); None: off
    web_stomp_port: int | None = None
    #: MQTT 3.1.1 and 5.0 (1883, ``leveret server``'s default); None: off
    mqtt_port: int | None = None
    #: MQTT over WebSocket (``ws://HOST:PORT/ws``; RabbitMQ's Web MQTT port is 15675,
    #: ``leveret server``'s default); None: off
    web_mqtt_port: int | None = None
    #: MQTT over TLS (8883 by convention; needs ``ssl_options``); None: off
    mqtts_port: int | None = None
    #: AMQP 1.0 over WebSocket (``ws://HOST:PORT/ws``, subprotocol ``amqp``; Tanzu
    #: RabbitMQ's Web AMQP port is 15678); None: off, ``leveret server``'s default too
    web_amqp_port: int | None = None
    #: The MQTT adapter's settings (``[mqtt]``, :class:`leveret.protocol.mqtt.settings.MqttSettings`)
    mqtt: dict[str, Any] = field(default_factory=dict)
    read_coalesce_ms: int = 1  # see server/read_coalescing.py; 0 reads every write at once
    #: AMQP connection worker processes (server/workers/, docs/multicore.md); 0: none,
    #: the broker's own process does all the work
    workers: int = 0
    #: Host header names the HTTP API answers (None: loopback names and the bind address).
    http_allowed_hosts: list[str] | None = None
    #: milliseconds between two readings of the counters the HTTP API's rates come from
    #: (RabbitMQ's setting and default)
    collect_statistics_interval: int = 5000
    amqps_port: int | None = None  # AMQP 0-9-1 and 1.0 over TLS (RabbitMQ: 5671); None: off
    https_port: int | None = None  # the management API over TLS (RabbitMQ: 15671); None: off
    ssl_options: TLSOptions | None = None  # RabbitMQ's words; needed by the TLS ports
    ssl_cert_login_from: str = "distinguished_name"  # or common_name: a certificate's user
    limits: Limits = field(default_factory=Limits)
    vhosts: list[str] = field(default_factory=lambda: ["/"])
    users: list[User] = field(default_factory=list)
    permissions: list[tuple[str, str, Permission]] = field(default_factory=list)  # user, vhost
    topic_permissions: list[tuple[str, str, TopicPermission]] = field(default_factory=list)
    loopback_users: list[str] = field(default_factory=lambda: ["guest"])
    policies: list[Policy] = field(default_factory=list)
    #: static shovels: (vhost, name, definition with RabbitMQ's keys), see leveret.shovel
    shovels: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    #: x-arguments of the queues STOMP clients create (None: ActiveMQ's defaults, see
    #: core.broker.ACTIVEMQ_QUEUE_DEFAULTS)
    stomp_queue_arguments: dict[str, Any] | None = None
    #: the HTTP ports' header and keep-alive timeouts, connection cap and descriptor
    #: share (``[http]``; see server/http_limits.py)
    http: HttpLimits = field(default_factory=HttpLimits)
    #: failed logins slowed per address and user name, unauthenticated connections
    #: per address (``[login_throttle]``; see core/login_throttle.py)
    login_throttle: ThrottleSettings = field(default_factory=ThrottleSettings)

    def memory_limit(self) -> int:
        """The memory high watermark in bytes (0: unknown RAM, no alarm)."""
        if self.vm_memory_high_watermark_absolute is not None:
            return self.vm_memory_high_watermark_absolute
        from .server.memory_monitor import total_memory

        return int(total_memory() * self.vm_memory_high_watermark)

    def queue_memory_budget_bytes(self) -> int:
        """The queue memory budget in bytes (0: none): ``queue_memory_budget``, or by
        default 128 MiB or a quarter of the memory high watermark, the smaller."""
        if self.queue_memory_budget is not None:
            return self.queue_memory_budget
        from .core.queue_memory import default_budget

        return default_budget(self.memory_limit())

    def build_core(self, clock: Clock) -> BrokerCore:
        """A BrokerCore with these users, permissions, limits, policies and vhosts, on
        ``clock``; the default guest stays unless the users redefine it."""
        users = UserDatabase(loopback_users=self.loopback_users)
        for user in self.users:
            if user.name == "guest":  # redefined: its default permission goes too
                users.permissions.clear()
            users.users[user.name] = user
        for name, vhost, permission in self.permissions:
            for target in self.vhosts if vhost == "*" else [vhost]:
                users.permissions[(target, name)] = permission
        for name, vhost, topic in self.topic_permissions:
            users.topic_permissions[(vhost, name, topic.exchange)] = topic
        core = BrokerCore(clock, users=users, limits=self.limits, policies=list(self.policies))
        core.login_throttle.settings = self.login_throttle
        if self.stomp_queue_arguments is not None:
            core.auto_queue_arguments = dict(self.stomp_queue_arguments)
        if self.mqtt:
            from .protocol.mqtt.settings import mqtt_settings  # (`leveret ctl` loads no adapter)

            core.adapter_settings["mqtt"] = mqtt_settings(self.mqtt)
        for name in self.vhosts:
            core.add_vhost(name)
        return core


#: ``[store]`` keys of a cluster node and the settings they set
_CLUSTER_KEYS = {
    "node": "node_name",
    "advertise": "cluster_advertise",
    "secret": "cluster_secret",
    "queue_leader_locator": "queue_leader_locator",
}

_SERVER_KEYS = {
    "bind": str,
    "amqp_port": int,
    "data_dir": str,
    "log_level": str,
    "disk_free_limit": int,
    "disk_reserve": int,
    "vm_memory_high_watermark": float,
    "vm_memory_high_watermark_absolute": int,
    "vm_memory_high_watermark_paging_ratio": float,
    "store_flow_high": int,
    "store_flow_low": int,
    "queue_memory_budget": int,
    "http_port": int,
    "prometheus_port": int,
    "stomp_port": int,
    "web_stomp_port": int,
    "mqtt_port": int,
    "web_mqtt_port": int,
    "mqtts_port": int,
    "web_amqp_port": int,
    "read_coalesce_ms": int,
    "workers": int,
    "collect_statistics_interval": int,
    "amqps_port": int,
    "https_port": int,
    "ssl_cert_login_from": str,
}
_LOG_LEVELS = ("debug", "info", "warning", "error")
_TABLE_KEYS = {
    "permissions": ("user", "vhost", "configure", "write", "read"),
    "topic_permissions": ("user", "vhost", "exchange", "write", "read"),
}


def _user(path: str | Path, entry: dict) -> User:
    """A [[users]] table: name, password or password_hash (+ hashing_algorithm), tags,
    vhosts (full permissions there; default ``["/"]``)."""
    unknown = set(entry) - {"name", "password", "password_hash", "hashing_algorithm", "vhosts", "tags"}
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) users.{', users.'.join(sorted(unknown))}")
    name, password, password_hash = entry.get("name"), entry.get("password"), entry.get("password_hash")
    if not isinstance(name, str) or not (isinstance(password, str) or isinstance(password_hash, str)):
        raise ConfigError(f"{path}: each [[users]] needs string name and password (or password_hash)")
    tags = entry.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise ConfigError(f"{path}: users.tags must be a list of strings")
    if isinstance(password, str):
        return User.with_password(name, password, tags)
    algorithm = entry.get("hashing_algorithm", DEFAULT_ALGORITHM)
    try:
        passwords.validate(str(password_hash), str(algorithm))
    except passwords.HashError as exc:
        raise ConfigError(f"{path}: users.password_hash of '{name}': {exc}") from None
    return User(name, str(password_hash), str(algorithm), tags)


def _tables(path: str | Path, value: object, key: str) -> list[dict]:
    """[[permissions]] or [[topic_permissions]] tables, each with exactly its string
    keys and valid regular expressions."""
    keys = _TABLE_KEYS[key]
    if not isinstance(value, list) or not all(isinstance(e, dict) for e in value):
        raise ConfigError(f"{path}: {key} must be [[{key}]] tables")
    for entry in value:
        if set(entry) != set(keys) or not all(isinstance(entry[k], str) for k in keys):
            raise ConfigError(f"{path}: each [[{key}]] needs exactly the strings {', '.join(keys)}")
        for field_name in ("configure", "write", "read"):
            problem = field_name in entry and check_pattern(entry[field_name])
            if problem:
                raise ConfigError(f"{path}: {key}.{field_name} '{entry[field_name]}': {problem}")
    return value


GLOBAL_QOS_MODES = ("per_consumer", "refuse")
_LIMIT_KEYS = {
    "heartbeat": int,
    "frame_max": int,
    "channel_max": int,
    "max_message_size": int,
    "stomp_heartbeat_grace": float,
    "consumer_timeout": int,
    "global_qos": str,
}


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
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
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
        if key == "http_allowed_hosts":
            continue  # a list, read below
        if key in _SERVER_KEYS:
            setattr(settings, key, typed("server.", key, value, _SERVER_KEYS[key]))
        elif key in _LIMIT_KEYS:
            if key == "consumer_timeout" and isinstance(value, int) and value < 0:
                raise ConfigError(f"{path}: server.consumer_timeout must be 0 (never) or more ms")
            setattr(settings.limits, key, typed("server.", key, value, _LIMIT_KEYS[key]))
            if key == "global_qos" and value not in GLOBAL_QOS_MODES:
                raise ConfigError(f"{path}: server.global_qos must be one of {', '.join(GLOBAL_QOS_MODES)}")
        else:
            raise ConfigError(f"{path}: unknown key server.{key}")
    store = data.pop("store", {})
    if not isinstance(store, dict):
        raise ConfigError(f"{path}: [store] must be a table")
    for key, value in store.items():
        if key in _CLUSTER_KEYS:  # [store] node = "n1" … (docs/cluster.md)
            setattr(settings, _CLUSTER_KEYS[key], typed("store.", key, value, str))
            continue
        if key not in ("url", "cluster"):
            raise ConfigError(f"{path}: unknown key store.{key}")
        setattr(settings, f"store_{key}", typed("store.", key, value, str))
    if settings.queue_leader_locator not in ("client-local", "balanced"):
        raise ConfigError(f"{path}: store.queue_leader_locator must be client-local or balanced")
    if settings.store_url is not None and not settings.store_url.startswith(("postgresql://", "postgres://")):
        raise ConfigError(f"{path}: store.url must be a postgresql:// URL")
    shovels = data.pop("shovels", [])
    if not isinstance(shovels, list) or not all(isinstance(e, dict) and "name" in e for e in shovels):
        raise ConfigError(f"{path}: shovels must be [[shovels]] tables with a name")
    for entry in shovels:
        definition = {k: v for k, v in entry.items() if k not in ("name", "vhost")}
        try:
            ShovelSpec.from_parameter(definition)
        except ShovelError as exc:
            raise ConfigError(f"{path}: shovel {entry['name']}: {exc}") from None
        settings.shovels.append((str(entry.get("vhost", "/")), str(entry["name"]), definition))
    if "http" in data:
        try:
            settings.http = HttpLimits.from_table(data.pop("http"))
        except ValueError as exc:
            raise ConfigError(f"{path}: {exc}") from None
    if "login_throttle" in data:
        try:
            settings.login_throttle = ThrottleSettings.from_table(data.pop("login_throttle"))
        except ValueError as exc:
            raise ConfigError(f"{path}: {exc}") from None
    mqtt = data.pop("mqtt", None)
    if mqtt is not None:
        from .protocol.mqtt.settings import mqtt_settings  # (`leveret ctl` loads no adapter)

        try:
            mqtt_settings(mqtt)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{path}: [mqtt]: {exc}") from None
        settings.mqtt = mqtt
    stomp_queue_arguments = data.pop("stomp_queue_arguments", None)
    if stomp_queue_arguments is not None:
        if not isinstance(stomp_queue_arguments, dict) or not all(
            isinstance(k, str) and k.startswith("x-") for k in stomp_queue_arguments
        ):
            raise ConfigError(f"{path}: [stomp_queue_arguments] must be a table of x-arguments")
        settings.stomp_queue_arguments = stomp_queue_arguments
    ssl_options = data.pop("ssl_options", None)
    if ssl_options is not None:
        if not isinstance(ssl_options, dict):
            raise ConfigError(f"{path}: ssl_options must be a table")
        try:
            settings.ssl_options = TLSOptions.from_dict(ssl_options)
        except TLSError as exc:
            raise ConfigError(f"{path}: {exc}") from None
    if settings.ssl_cert_login_from not in LOGIN_FROM:
        raise ConfigError(f"{path}: server.ssl_cert_login_from must be one of {', '.join(LOGIN_FROM)}")
    tls_ports = (settings.amqps_port, settings.https_port, settings.mqtts_port)
    if any(port is not None for port in tls_ports) and settings.ssl_options is None:
        raise ConfigError(
            f"{path}: amqps_port, https_port and mqtts_port need [ssl_options] (certfile, keyfile)"
        )
    if settings.read_coalesce_ms < 0:
        raise ConfigError(f"{path}: server.read_coalesce_ms must be 0 or more")
    if settings.workers < 0:
        raise ConfigError(f"{path}: server.workers must be 0 or more")
    if settings.log_level.lower() not in _LOG_LEVELS:
        raise ConfigError(f"{path}: server.log_level must be one of {', '.join(_LOG_LEVELS)}")
    if "vhosts" in data:
        settings.vhosts = strings("vhosts", data.pop("vhosts"))
    allowed = server.get("http_allowed_hosts") if isinstance(server, dict) else None
    if allowed is not None:
        settings.http_allowed_hosts = strings("server.http_allowed_hosts", allowed)
    if "loopback_users" in data:
        settings.loopback_users = strings("loopback_users", data.pop("loopback_users"))
    users = data.pop("users", [])
    if not isinstance(users, list) or not all(isinstance(e, dict) for e in users):
        raise ConfigError(f"{path}: users must be [[users]] tables")
    for entry in users:
        user = _user(path, entry)
        settings.users.append(user)
        for vhost in strings("users.vhosts", entry.get("vhosts", ["/"])):
            settings.permissions.append((user.name, vhost, Permission()))
    for entry in _tables(path, data.pop("permissions", []), "permissions"):
        settings.permissions.append(
            (entry["user"], entry["vhost"], Permission(entry["configure"], entry["write"], entry["read"]))
        )
    for entry in _tables(path, data.pop("topic_permissions", []), "topic_permissions"):
        settings.topic_permissions.append(
            (entry["user"], entry["vhost"], TopicPermission(entry["exchange"], entry["write"], entry["read"]))
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
        try:  # its values, as a queue would take them (PUT /api/policies checks the same)
            build({}, settings.policies[-1].definition, f" in policy '{entry['name']}'")
        except BrokerError as exc:
            raise ConfigError(f"{path}: [[policies]] {entry['name']}: {exc.text}") from None
    if data:
        raise ConfigError(f"{path}: unknown key(s) {', '.join(sorted(data))}")
    return settings
