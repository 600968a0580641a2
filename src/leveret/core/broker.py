"""The broker's protocol-independent state: virtual hosts, users, limits, alarms.

Protocol adapters (:mod:`leveret.protocol`) drive it; it knows nothing of sockets.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from .audit import AuditTrail
from .auth import Grants, Permission, TopicPermission, User, UserDatabase
from .clock import Clock
from .connections import Connections
from .dead_letter_actions import DeadLetterJobs
from .flow import PublisherFlow
from .login_throttle import LoginThrottle
from .metrics import BrokerCounters
from .policy import Policy
from .queue_memory import QueueMemory
from .scheduler import Scheduler
from .vhost import VirtualHost

if TYPE_CHECKING:
    from ..store import Store
    from .replicator import Replicator


#: ActiveMQ's defaults (maximumRedeliveries 6, redeliveryDelay 1000 ms, the shared
#: ``ActiveMQ.DLQ``) as queue arguments, non-persistent messages dead-lettered too.
ACTIVEMQ_QUEUE_DEFAULTS: dict[str, Any] = {
    "x-max-redeliveries": 6,
    "x-redelivery-delay": 1000,
    "x-dead-letter-strategy": "shared",
    "x-dead-letter-queue": "ActiveMQ.DLQ",
    "x-dead-letter-non-persistent": True,
}


@dataclass
class Limits:
    """Negotiated and enforced limits; defaults are RabbitMQ 3.10's.

    ``heartbeat`` in seconds, sizes in bytes.
    """

    channel_max: int = 2047
    frame_max: int = 131072
    heartbeat: int = 60
    max_message_size: int = 128 * 1024 * 1024
    #: STOMP: a client silent for this many of its heart-beat intervals is dropped
    #: (ActiveMQ's multiplier is 1.0, which drops clients a little late by chance).
    stomp_heartbeat_grace: float = 1.5
    #: ms a delivery may stay unacknowledged before its consumer times out (RabbitMQ's
    #: ``consumer_timeout`` and default, 30 min; 0: never; see core/consumer_timeout.py)
    consumer_timeout: int = 1_800_000
    #: AMQP 0-9-1: what a channel-wide prefetch (basic.qos global=true) means to a
    #: consumer of a queue that has no channel-wide window (quorum and stream queues):
    #: ``"per_consumer"`` applies it as the consumer's own prefetch, so that old kombu /
    #: celery (global QoS by default) work on quorum queues; ``"refuse"`` closes the
    #: channel with 540 NOT_IMPLEMENTED "... does not support global qos", as RabbitMQ
    #: 3.10-4.2 do (4.3 refuses global QoS altogether).
    global_qos: str = "per_consumer"


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
    alarm_sources: set[str] = field(default_factory=set)
    #: Publishers held while the store's backlog of unwritten messages is high.
    flow: PublisherFlow = field(default_factory=PublisherFlow)
    memory_pressure: bool = False
    #: Called with a vhost's name when it is deleted (its connections close: 320).
    vhost_deleted_listeners: list[Callable[[str], None]] = field(default_factory=list)
    #: Durable definitions and messages; None for a broker that keeps nothing.
    store: Store | None = None
    policies: list[Policy] = field(default_factory=list)
    #: RabbitMQ's operator policies (see :mod:`.policy`), persisted.
    operator_policies: list[Policy] = field(default_factory=list)
    #: RabbitMQ's global runtime parameters (``cluster_name`` …), persisted.
    global_parameters: dict[str, Any] = field(default_factory=dict)
    #: RabbitMQ's runtime parameters by (component, vhost, name): a JSON value each
    #: (component ``shovel``: leveret.shovel), persisted.
    parameters: dict[tuple[str, str, str], Any] = field(default_factory=dict)
    #: Called as ``listener(component, vhost, name, value)`` after a runtime parameter
    #: is set or recovered (``value`` None: cleared); the shovels' manager is one.
    parameter_listeners: list[Callable[[str, str, str, Any], None]] = field(default_factory=list)
    #: Called as ``listener(vhost, event, binding)`` after a binding is added
    #: (``"bind"``) or removed (``"unbind"``), shared with every vhost
    #: (:attr:`VirtualHost.binding_listeners`): the federation's exchange links.
    binding_listeners: list[Callable[[str, str, Any], None]] = field(default_factory=list)
    #: The name this broker gives itself, as RabbitMQ's cluster name: the
    #: ``cluster_name`` global parameter, else what the server sets here (AMQP's
    #: ``cluster_name`` server property, federation's node name); None if neither.
    node_name: Callable[[], str] | None = None
    #: Called with a vhost's name after a policy or operator policy of it is set or
    #: cleared (the federation manager follows them).
    policy_listeners: list[Callable[[str], None]] = field(default_factory=list)
    #: Called as ``listener(vhost, kind, name)`` when an exchange or queue is created
    #: or removed (shared with every vhost: :attr:`VirtualHost.entity_listeners`).
    entity_listeners: list[Callable[[str, str, str], None]] = field(default_factory=list)
    #: The x-arguments of a queue an adapter creates on a client's behalf (a STOMP SEND
    #: or SUBSCRIBE to ``/queue/X``): ActiveMQ's default redelivery policy and shared
    #: dead-letter queue, without its silent drop of non-persistent messages.
    auto_queue_arguments: dict[str, Any] = field(default_factory=lambda: dict(ACTIVEMQ_QUEUE_DEFAULTS))
    #: JMS client ids of open connections (STOMP's ``client-id``): unique in the broker,
    #: as ActiveMQ refuses a second connection with one in use.
    client_ids: dict[str, object] = field(default_factory=dict)
    #: Settings and broker-wide state of protocol adapters, by protocol (``mqtt``: its
    #: settings, :mod:`leveret.protocol.mqtt.settings`; ``mqtt_state``:
    #: :class:`leveret.protocol.mqtt.state.MqttState`); core never reads them.
    adapter_settings: dict[str, Any] = field(default_factory=dict)
    #: Stored definitions of kinds core does not know (:data:`CORE_KINDS`): a protocol
    #: adapter's durable state (MQTT's ``mqtt_retained``, ``mqtt_session`` …), as
    #: :meth:`attach_store` read them, kind -> ``[(vhost, name, data)]``. Core does not
    #: import adapters: an adapter takes (pops) its kinds when it first needs them
    #: (:meth:`leveret.protocol.mqtt.state.MqttState.of`); rows of a deleted vhost that
    #: no adapter took are deleted with it.
    adapter_definitions: dict[str, list[tuple[str, str, dict]]] = field(default_factory=dict)

    #: The definition kinds core reads back itself in :meth:`attach_store`; the other
    #: kinds a store holds go to :attr:`adapter_definitions`.
    CORE_KINDS = frozenset(
        {
            "vhost",
            "user",
            "permission",
            "topic_permission",
            "exchange",
            "queue",
            "binding",
            "lease",
            "meta",
            "audit",
            "policy",
            "operator_policy",
            "global_parameter",
            "parameter",
            "stream_chunk",
        }
    )

    def __post_init__(self) -> None:
        #: Failed logins per source address and user name, and unauthenticated
        #: connections per address, for every protocol and the HTTP API.
        self.login_throttle = LoginThrottle(self.clock)
        #: Delayed and scheduled messages of every vhost (held until due).
        self.scheduler = Scheduler(self.clock, self.vhosts)
        #: Message and object counters (:mod:`.metrics`), shared by every vhost.
        self.metrics = BrokerCounters()
        #: Bytes every queue holds messages in, against the budget past which memory
        #: pressure starts (:mod:`.queue_memory`), shared by every vhost.
        self.queue_memory = QueueMemory()
        for vhost in self.vhosts.values():
            vhost.metrics = self.metrics
            vhost.queue_memory = self.queue_memory
            vhost.binding_listeners = self.binding_listeners
            vhost.entity_listeners = self.entity_listeners
        #: Open client connections of every protocol (see :mod:`.connections`).
        self.connections = Connections()
        #: The operators' latest actions (see :mod:`.audit`).
        self.audit = AuditTrail()
        #: The dead-letter console's bulk actions (see :mod:`.dead_letter_actions`).
        self.dead_letter_jobs = DeadLetterJobs(self)
        #: The cluster node this broker is (``leveret.cluster.node.ClusterNode``, set by
        #: the server; docs/cluster.md), None when it is not one. Opaque to core.
        self.cluster: Any = None
        #: What every vhost tells the cluster (:mod:`.replicator`; None: not a node).
        self.replicator: Replicator | None = None
        if not self.vhosts:
            self.add_vhost("/")

    def add_vhost(self, name: str) -> VirtualHost:
        """Create (and persist, once a store is attached) a virtual host."""
        vhost = self.vhosts.get(name)
        if vhost is None:
            vhost = self.vhosts[name] = VirtualHost(
                name, self.clock, self.store, self.policies, self.operator_policies
            )
            vhost.memory_pressure = self.memory_pressure
            vhost.scheduler = self.scheduler
            vhost.metrics = self.metrics
            vhost.queue_memory = self.queue_memory
            vhost.binding_listeners = self.binding_listeners
            vhost.entity_listeners = self.entity_listeners
            vhost.replicator = self.replicator
            if self.replicator is not None:  # a cluster node (:mod:`.replicator`)
                self.replicator.vhost_added(vhost)
            if self.store is not None:
                self.store.save_definition("vhost", name, "", {})
        return vhost

    def delete_vhost(self, name: str) -> bool:
        """Delete a virtual host with its queues, exchanges, bindings, messages and
        permissions; connections to it are closed (RabbitMQ: 320 CONNECTION_FORCED).
        False if there is none."""
        vhost = self.vhosts.pop(name, None)
        if vhost is None:
            return False
        for listener in list(self.vhost_deleted_listeners):
            listener(name)
        for kind, rows in self.adapter_definitions.items():  # (no adapter took them)
            for row in rows:
                if row[0] == name and self.store is not None:
                    self.store.delete_definition(kind, name, row[1])
            rows[:] = [row for row in rows if row[0] != name]
        vhost.delete_all()
        for component, parameter_vhost, parameter in list(self.parameters):
            if parameter_vhost == name:  # its shovels stop, as RabbitMQ's
                self.clear_parameter(component, name, parameter)
        self._forget_stored(self.users.delete_vhost(name))
        if self.store is not None:
            self.store.delete_definition("vhost", name, "")
        return True

    #: The vhost limits RabbitMQ knows (``rabbitmqctl set_vhost_limits``).
    VHOST_LIMITS = ("max-connections", "max-queues")

    def set_vhost_limit(self, vhost: str, name: str, value: int | None) -> None:
        """Set (``value`` None: clear) limit ``name`` (one of :data:`VHOST_LIMITS`; a
        negative value means none) of an existing vhost; persisted. It applies to
        connections and queues made from now on."""
        limits = self.vhosts[vhost].limits
        if value is None:
            limits.pop(name, None)
        else:
            limits[name] = value
        self._save("vhost", vhost, "", {"limits": dict(limits)})

    def connection_refusal(self, vhost: str, user: str) -> str | None:
        """Why ``user`` may not open one more connection to ``vhost`` (its
        ``max-connections`` limit), or None."""
        found = self.vhosts.get(vhost)
        if found is None or "max-connections" not in found.limits:
            return None  # (no count of the open connections then)
        return found.connection_refusal(user, self.connections.count_in(vhost))

    # -- users and permissions (persisted once a store is attached) -----------------
    def add_user(self, user: User) -> None:
        """Create or replace a user."""
        self.users.users[user.name] = user
        self.users.changed()
        self._save("user", "", user.name, user.definition())

    def delete_user(self, name: str) -> bool:
        """Delete a user with its permissions and topic permissions; False if unknown."""
        removed = self.users.delete_user(name)
        if removed is None:
            return False
        if self.store is not None:
            self.store.delete_definition("user", "", name)
        self._forget_stored(removed)
        return True

    def _forget_stored(self, removed: Grants) -> None:
        """Delete the stored rows of grants the user database removed."""
        if self.store is None:
            return
        permissions, topics = removed
        for vhost, user in permissions:
            self.store.delete_definition("permission", vhost, user)
        for vhost, user, exchange in topics:
            self.store.delete_definition("topic_permission", vhost, _topic_key(user, exchange))

    def set_permission(self, user: str, vhost: str, permission: Permission) -> None:
        """Give ``user`` ``permission`` in ``vhost`` (both must exist: the caller checks)."""
        self.users.permissions[(vhost, user)] = permission
        self.users.changed()
        self._save("permission", vhost, user, asdict(permission))

    def clear_permission(self, user: str, vhost: str) -> bool:
        """Take ``user``'s permission in ``vhost`` away; False if there was none."""
        if self.users.permissions.pop((vhost, user), None) is None:
            return False
        self.users.changed()
        if self.store is not None:
            self.store.delete_definition("permission", vhost, user)
        return True

    def set_topic_permission(self, user: str, vhost: str, topic: TopicPermission) -> None:
        """Give ``user`` ``topic`` (on its exchange) in ``vhost``."""
        self.users.topic_permissions[(vhost, user, topic.exchange)] = topic
        self.users.changed()
        self._save("topic_permission", vhost, _topic_key(user, topic.exchange), asdict(topic))

    def clear_topic_permissions(self, user: str, vhost: str, exchange: str | None = None) -> bool:
        """Take ``user``'s topic permissions in ``vhost`` away (on ``exchange`` only, if
        given); False if there were none."""
        keys = [
            k
            for k in self.users.topic_permissions
            if k[0] == vhost and k[1] == user and exchange in (None, k[2])
        ]
        for key in keys:
            del self.users.topic_permissions[key]
            if self.store is not None:
                self.store.delete_definition("topic_permission", vhost, _topic_key(user, key[2]))
        self.users.changed()
        return bool(keys)

    def _save(self, kind: str, vhost: str, name: str, data: dict) -> None:
        if self.store is not None:
            self.store.save_definition(kind, vhost, name, data)

    def attach_store(self, store: Store) -> int:
        """Recover definitions and messages from ``store`` and persist from now on;
        returns the number of messages recovered. Users and permissions: the store's
        win; the configured ones (or the default guest) seed a store that has never had
        any. Raises StoreError (naming the file) if the store cannot be read."""
        from .recovery import recover

        snapshot = store.load()
        self.store = store
        seeded = any(name == "users_seeded" for _, name, _ in snapshot.definitions.get("meta", []))
        if seeded or snapshot.definitions.get("user"):
            self.users.users.clear()
            self.users.permissions.clear()
            self.users.topic_permissions.clear()
        self._recover_users(snapshot.definitions)
        self.audit.attach(store, snapshot.definitions.get("audit", []))
        for kind, policies in (("policy", self.policies), ("operator_policy", self.operator_policies)):
            for vhost, name, data in snapshot.definitions.get(kind, []):
                stored = Policy(
                    name,
                    str(data["pattern"]),
                    dict(data["definition"]),
                    str(data["apply_to"]),
                    int(data["priority"]),
                    vhost,
                )
                policies[:] = [p for p in policies if (p.vhost, p.name) != (vhost, name)] + [stored]
        for _, name, data in snapshot.definitions.get("global_parameter", []):
            self.global_parameters[name] = data["value"]
        for vhost, key, data in snapshot.definitions.get("parameter", []):
            component, _, name = key.partition("\x00")
            self.parameters[(component, vhost, name)] = json.loads(str(data["json"]))
        if not seeded:
            for user in list(self.users.users.values()):
                self._save("user", "", user.name, user.definition())
            for (vhost, name), permission in self.users.permissions.items():
                self._save("permission", vhost, name, asdict(permission))
            for (vhost, name, exchange), topic in self.users.topic_permissions.items():
                self._save("topic_permission", vhost, _topic_key(name, exchange), asdict(topic))
            store.save_definition("meta", "", "users_seeded", {})
        self.users.changed()
        for kind, rows in snapshot.definitions.items():
            if kind not in self.CORE_KINDS:
                self.adapter_definitions[kind] = rows
        recovered = recover(self, snapshot, store)
        self.scheduler.attach(store, snapshot.scheduled)
        return recovered

    def _recover_users(self, definitions: dict) -> None:
        users = self.users
        for _, name, data in definitions.get("user", []):
            if "password" in data:  # written before passwords were hashed: hash it now
                user = User.with_password(name, str(data["password"]), [str(t) for t in data["tags"]])
                users.users[name] = user
                for vhost in data.get("vhosts", []):
                    users.permissions[(str(vhost), name)] = Permission()
                self._save("user", "", name, user.definition())
                continue
            users.users[name] = User(
                name,
                str(data["password_hash"]),
                str(data["hashing_algorithm"]),
                [str(t) for t in data["tags"]],
            )
        for vhost, name, data in definitions.get("permission", []):
            users.permissions[(vhost, name)] = Permission(
                str(data["configure"]), str(data["write"]), str(data["read"])
            )
        for vhost, key, data in definitions.get("topic_permission", []):
            user = key.partition("\x00")[0]
            topic = TopicPermission(str(data["exchange"]), str(data["write"]), str(data["read"]))
            users.topic_permissions[(vhost, user, topic.exchange)] = topic

    def set_policy(self, policy: Policy, operator: bool = False) -> None:
        """Add a policy (an operator policy when ``operator``), or replace the one of
        the same vhost and name; persisted (the config file's are not: they come from
        the file at each start). Like RabbitMQ's ``set_policy``, it applies to queues
        declared from now on."""
        policies = self.operator_policies if operator else self.policies
        policies[:] = [p for p in policies if (p.vhost, p.name) != (policy.vhost, policy.name)]
        policies.append(policy)  # the list is shared with every vhost
        self._save(
            "operator_policy" if operator else "policy",
            policy.vhost,
            policy.name,
            {
                "pattern": policy.pattern,
                "definition": policy.definition,
                "apply_to": policy.apply_to,
                "priority": policy.priority,
            },
        )
        self._policy_changed(policy.vhost)

    def _policy_changed(self, vhost: str) -> None:
        for listener in list(self.policy_listeners):
            listener(vhost)

    def clear_policy(self, vhost: str, name: str, operator: bool = False) -> bool:
        """Remove a policy (an operator policy when ``operator``); False if there is
        none by that name in ``vhost``."""
        policies = self.operator_policies if operator else self.policies
        kept = [p for p in policies if (p.vhost, p.name) != (vhost, name)]
        if len(kept) == len(policies):
            return False
        policies[:] = kept
        if self.store is not None:
            self.store.delete_definition("operator_policy" if operator else "policy", vhost, name)
        self._policy_changed(vhost)
        return True

    def cluster_name(self) -> str | None:
        """The ``cluster_name`` global parameter if set (RabbitMQ's
        ``set_cluster_name``), else :attr:`node_name`'s answer, else None."""
        name = self.global_parameters.get("cluster_name")
        if isinstance(name, str) and name:
            return name
        return self.node_name() if self.node_name is not None else None

    def set_global_parameter(self, name: str, value: Any) -> None:
        """Set a global runtime parameter (RabbitMQ's ``set_global_parameter``; a JSON
        value), persisted."""
        self.global_parameters[name] = value
        self._save("global_parameter", "", name, {"value": value})

    def clear_global_parameter(self, name: str) -> bool:
        """Remove one; False if it is not set."""
        if self.global_parameters.pop(name, None) is None:
            return False
        if self.store is not None:
            self.store.delete_definition("global_parameter", "", name)
        return True

    def set_parameter(self, component: str, vhost: str, name: str, value: Any) -> None:
        """Set a runtime parameter (RabbitMQ's ``set_parameter``; ``value`` is JSON,
        checked by the component's owner first), persisted; listeners are told."""
        self.parameters[(component, vhost, name)] = value
        self._save("parameter", vhost, f"{component}\x00{name}", {"json": json.dumps(value)})
        for listener in self.parameter_listeners:
            listener(component, vhost, name, value)

    def clear_parameter(self, component: str, vhost: str, name: str) -> bool:
        """Remove one; False if it is not set. Listeners are told (value None)."""
        if self.parameters.pop((component, vhost, name), None) is None:
            return False
        if self.store is not None:
            self.store.delete_definition("parameter", vhost, f"{component}\x00{name}")
        for listener in self.parameter_listeners:
            listener(component, vhost, name, None)
        return True

    def set_memory_pressure(self, active: bool) -> None:
        """Memory is past the paging threshold (RabbitMQ's
        ``vm_memory_high_watermark_paging_ratio``): queues page new messages out to
        the store rather than keep them in memory, and move what they hold in memory
        there too (:meth:`.Queue.memory_short`), until it is cleared."""
        self.memory_pressure = active
        for vhost in self.vhosts.values():
            vhost.memory_pressure = active
            if active:
                for queue in list(vhost.queues.values()):
                    queue.memory_short()

    def set_alarm(self, active: bool, source: str = "disk") -> None:
        """Raise or clear a resource alarm from ``source`` (``disk``: free space under
        the limit; ``store``: the store cannot write; ``memory``: over the high
        watermark); publishers are blocked while any
        source is raised, and get connection.blocked/unblocked as the first is raised
        and the last cleared."""
        was = self.alarm_active
        if active:
            self.alarm_sources.add(source)
        else:
            self.alarm_sources.discard(source)
        self.alarm_active = bool(self.alarm_sources)
        if self.alarm_active == was:
            return
        for listener in list(self.alarm_listeners):
            listener(self.alarm_active)


def _topic_key(user: str, exchange: str) -> str:
    """A topic permission's store key: user and exchange, NUL-separated."""
    return f"{user}\x00{exchange}"
