"""MQTT's durable state beyond queues: retained messages and persistent sessions.

One :class:`MqttState` per broker core (:meth:`MqttState.of`) holds every vhost's
retained messages (MQTT 5.0 §3.3.1.3) and the durable facts of its persistent sessions
(§4.1: subscriptions, the QoS 2 packet ids in flight, the session expiry interval). It
keeps them in memory and writes each change to the broker's store as a definition, so
they live on SQLite and on PostgreSQL, survive a restart, ``kill -9`` and a standby's
take-over (the new master reads them with the rest of the store at start-up; core keeps
them in ``BrokerCore.adapter_definitions`` until :meth:`MqttState.of` takes them).

Store kinds (``vhost``: the MQTT vhost; ``name``: the topic or client id, or
``#sha256:<hex>`` of it when it is longer than 512 bytes or starts with that prefix, to
stay within PostgreSQL's index row limit; the data always holds it whole):

- ``mqtt_retained``: ``{topic, payload, qos, properties, expires_at}``;
- ``mqtt_session``: ``{client_id, expiry_interval, disconnected_at, subscriptions:
  [{filter, qos, no_local, retain_as_published, retain_handling, identifier}]}``;
- ``mqtt_packet_ids``: ``{awaiting_rel: [ids], awaiting_comp: [ids]}``, a session's
  QoS 2 state, kept apart so that a PUBREC or PUBCOMP rewrites a few bytes, not the
  session's subscriptions.

Writes are queued in the store's current batch (in call order, one transaction per
batch); a change is durable once ``store.when_durable(callback)`` (or
:meth:`MqttState.when_durable`) calls back with True. The adapter waits for that before
it sends PUBACK/PUBREC of a retained QoS 1/2 PUBLISH and a persistent session's SUBACK;
the id a PUBREC adds to ``awaiting_rel`` is written before its message, whose confirm
the PUBREC waits for. CONNACK does not wait (a session made just before a crash may be
lost with its batch).

What differs: mosquitto keeps retained messages and sessions in memory and writes them
to its persistence file every ``autosave_interval`` (1800 s) and at a clean shutdown,
so a ``kill -9`` loses what changed since; RabbitMQ 3.10 keeps retained messages per
node (DETS or ETS, lost on failover to another node) and persistent sessions as durable
queues, without QoS 2. Here both are written through the store's group commit.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ...core.broker import BrokerCore
    from ...core.clock import Timer
    from ...store import Store

#: ``expiry_interval`` of a session that never expires (MQTT 5.0 §3.1.2.11.2).
NEVER_EXPIRES = 0xFFFFFFFF
NEVER = NEVER_EXPIRES

RETAINED_KIND = "mqtt_retained"
SESSION_KIND = "mqtt_session"
PACKET_IDS_KIND = "mqtt_packet_ids"
KINDS = (RETAINED_KIND, SESSION_KIND, PACKET_IDS_KIND)

#: Longest topic or client id (UTF-8 bytes) stored as the definition's name as is.
NAME_LIMIT = 512
HASHED_PREFIX = "#sha256:"


@dataclass(frozen=True, slots=True)
class SubscriptionOptions:
    """A subscription's options (MQTT 5.0 §3.8.3.1; 3.1.1 has the QoS only):
    ``retain_handling`` 0 send retained at subscribe, 1 only if new, 2 never;
    ``identifier`` the subscription identifier (§3.8.2.1.2), None if none."""

    qos: int
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0
    identifier: int | None = None


@dataclass(slots=True)
class RetainedMessage:
    """A retained message: its ``topic`` name, ``payload``, ``qos``, the MQTT 5
    ``properties`` block as encoded on the wire (``b""``: none) and ``expires_at``
    (epoch seconds, from the Message Expiry Interval; None: never)."""

    topic: str
    payload: bytes
    qos: int
    properties: bytes = b""
    expires_at: float | None = None

    def expired(self, now: float) -> bool:
        """Whether it is past its expiry at ``now`` (epoch seconds)."""
        return self.expires_at is not None and self.expires_at <= now


@dataclass(slots=True)
class SessionRecord:
    """A persistent session's durable facts. ``expiry_interval`` in seconds
    (:data:`NEVER_EXPIRES`: never); ``subscriptions`` by topic filter as subscribed
    (``$share/...`` included); ``awaiting_rel`` inbound QoS 2 packet ids (PUBREC sent,
    PUBREL not yet received); ``awaiting_comp`` outbound ones (PUBREL sent, PUBCOMP not
    yet received); ``disconnected_at`` epoch seconds, None while connected.

    :meth:`MqttState.session` returns the record it holds: change it, then
    :meth:`MqttState.save_session` makes the change durable."""

    vhost: str
    client_id: str
    expiry_interval: int
    subscriptions: dict[str, SubscriptionOptions] = field(default_factory=dict)
    awaiting_rel: set[int] = field(default_factory=set)
    awaiting_comp: set[int] = field(default_factory=set)
    disconnected_at: float | None = None

    def expires_at(self) -> float | None:
        """When the session ends (epoch seconds): ``disconnected_at`` plus the
        expiry interval; None while connected or when it never expires."""
        if self.disconnected_at is None or self.expiry_interval >= NEVER_EXPIRES:
            return None
        return self.disconnected_at + self.expiry_interval


def store_name(key: str) -> str:
    """The definition name of a topic or client id (see the module's docstring)."""
    if (len(key) * 4 <= NAME_LIMIT or len(key.encode()) <= NAME_LIMIT) and not key.startswith(HASHED_PREFIX):
        return key
    return HASHED_PREFIX + hashlib.sha256(key.encode()).hexdigest()


class _Node:
    """A trie node: one topic level. ``message`` is retained on the topic that ends here."""

    __slots__ = ("children", "message")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.message: RetainedMessage | None = None


class RetainedIndex:
    """One vhost's retained messages, by topic (a dict, for a filter without
    wildcards) and in a trie of topic levels (for ``+`` and ``#``), so that a filter
    visits only the levels it can match, not every retained topic."""

    __slots__ = ("by_topic", "root")

    def __init__(self) -> None:
        self.by_topic: dict[str, RetainedMessage] = {}
        self.root = _Node()

    def __len__(self) -> int:
        return len(self.by_topic)

    def put(self, message: RetainedMessage) -> None:
        """Set or replace the message of its topic."""
        node = self.root
        for level in message.topic.split("/"):
            child = node.children.get(level)
            if child is None:
                child = node.children[level] = _Node()
            node = child
        node.message = message
        self.by_topic[message.topic] = message

    def remove(self, topic: str) -> RetainedMessage | None:
        """Forget the message of ``topic`` (and the trie nodes left empty); it, or None."""
        message = self.by_topic.pop(topic, None)
        if message is None:
            return None
        path = [self.root]
        levels = topic.split("/")
        for level in levels:
            path.append(path[-1].children[level])
        path[-1].message = None
        for depth in range(len(levels), 0, -1):
            node = path[depth]
            if node.children or node.message is not None:
                break
            del path[depth - 1].children[levels[depth - 1]]
        return message

    def match(self, topic_filter: str) -> list[RetainedMessage]:
        """The messages whose topic ``topic_filter`` matches (MQTT 5.0 §4.7, as
        :func:`~leveret.protocol.mqtt.topics.matches`), in no particular order."""
        if "+" not in topic_filter and "#" not in topic_filter:
            found = self.by_topic.get(topic_filter)
            return [] if found is None else [found]
        levels = topic_filter.split("/")
        last = len(levels)
        out: list[RetainedMessage] = []
        stack: list[tuple[_Node, int]] = [(self.root, 0)]
        while stack:
            node, depth = stack.pop()
            if depth == last:
                if node.message is not None:
                    out.append(node.message)
                continue
            level = levels[depth]
            if level == "#":  # this level (the parent's topic: "a/#" matches "a") and below
                if depth and node.message is not None:
                    out.append(node.message)
                below = [child for name, child in node.children.items() if depth or name[:1] != "$"]
                while below:
                    child = below.pop()
                    if child.message is not None:
                        out.append(child.message)
                    below.extend(child.children.values())
            elif level == "+":
                for name, child in node.children.items():
                    if depth or name[:1] != "$":  # §4.7.2: wildcards skip "$..." topics
                        stack.append((child, depth + 1))
            else:
                step = node.children.get(level)
                if step is not None:
                    stack.append((step, depth + 1))
        return out


class MqttState:
    """Retained messages and persistent sessions of every vhost of one broker core,
    in memory and in the core's store (none: in memory only, as the broker keeps
    nothing else). Methods run on the event loop and do not block it."""

    def __init__(self, core: BrokerCore) -> None:
        self.core = core
        self._retained: dict[str, RetainedIndex] = {}
        #: Retained messages with an expiry, ``(expires_at, order, vhost, message)``
        #: (an entry whose message was replaced or cleared since is skipped).
        self._expiring: list[tuple[float, int, str, RetainedMessage]] = []
        self._order = 0
        #: The timer of :meth:`expire_retained` and when it fires (epoch seconds).
        self._expiry_timer: Timer | None = None
        self._expiry_due: float | None = None
        self._sessions: dict[tuple[str, str], SessionRecord] = {}
        #: What the store holds of each session, to write only the part that changed:
        #: (expiry interval, subscriptions, disconnected_at) and the packet ids.
        self._saved_head: dict[tuple[str, str], _Head] = {}
        self._saved_ids: dict[tuple[str, str], tuple[frozenset[int], frozenset[int]]] = {}
        self._load()
        core.vhost_deleted_listeners.append(self.forget_vhost)

    @classmethod
    def of(cls, core: BrokerCore) -> MqttState:
        """The state of ``core``, made on first use from what its store held at
        start-up (``core.adapter_definitions``). Make it once the store is attached
        (the MQTT listener opens after recovery): the session expiry of sessions that
        were connected when the broker stopped counts from then."""
        state = core.adapter_settings.get("mqtt_state")
        if state is None:
            state = core.adapter_settings["mqtt_state"] = cls(core)
        return state

    @property
    def store(self) -> Store | None:
        return self.core.store

    def when_durable(self, callback: Callable[[bool], None]) -> None:
        """``callback(True)`` once every change made so far is on disk (at once
        without a store), ``callback(False)`` if the store failed to write them."""
        if self.store is None:
            callback(True)
        else:
            self.store.when_durable(callback)

    # -- loading ------------------------------------------------------------------------
    def _load(self) -> None:
        rows = {kind: self.core.adapter_definitions.pop(kind, []) for kind in KINDS}
        now = self.core.clock.time()
        vhosts = self.core.vhosts
        for vhost, name, data in rows[RETAINED_KIND]:
            message = _retained_from(data)
            if vhost not in vhosts or message.expired(now):
                self._delete_name(RETAINED_KIND, vhost, name)
            else:
                self._index(vhost, message)
        ids: dict[tuple[str, str], dict] = {(v, name): data for v, name, data in rows[PACKET_IDS_KIND]}
        for vhost, name, data in rows[SESSION_KIND]:
            packet_ids = ids.pop((vhost, name), {})
            if vhost not in vhosts:
                self._delete_name(SESSION_KIND, vhost, name)
                self._delete_name(PACKET_IDS_KIND, vhost, name)
                continue
            record = _session_from(vhost, data, packet_ids)
            key = (vhost, record.client_id)
            self._sessions[key] = record
            self._saved_ids[key] = (frozenset(record.awaiting_rel), frozenset(record.awaiting_comp))
            self._saved_head[key] = _head(record)
            if record.disconnected_at is None:  # connected when the broker stopped
                record.disconnected_at = now
                self._write_head(record)
        for vhost, name in ids:  # packet ids of a session that is gone
            self._delete_name(PACKET_IDS_KIND, vhost, name)

    def _index(self, vhost: str, message: RetainedMessage) -> None:
        index = self._retained.get(vhost)
        if index is None:
            index = self._retained[vhost] = RetainedIndex()
        index.put(message)
        if message.expires_at is not None:
            self._order += 1
            heapq.heappush(self._expiring, (message.expires_at, self._order, vhost, message))
            self._arm_expiry(message.expires_at)
            if len(self._expiring) > 1024 + 2 * sum(map(len, self._retained.values())):
                self._compact_expiring()

    def _compact_expiring(self) -> None:
        """Drop the heap's entries of messages replaced or cleared since (a topic
        retained again and again would grow it until the old expiries pass)."""
        self._expiring = [
            entry
            for entry in self._expiring
            if (index := self._retained.get(entry[2])) is not None
            and index.by_topic.get(entry[3].topic) is entry[3]
        ]
        heapq.heapify(self._expiring)

    def _save(self, kind: str, vhost: str, key: str, data: dict) -> None:
        if self.store is not None:
            self.store.save_definition(kind, vhost, store_name(key), data)

    def _delete(self, kind: str, vhost: str, key: str) -> None:
        """Delete the row of a topic or client id."""
        self._delete_name(kind, vhost, store_name(key))

    def _delete_name(self, kind: str, vhost: str, name: str) -> None:
        """Delete a row by its stored name."""
        if self.store is not None:
            self.store.delete_definition(kind, vhost, name)

    # -- retained messages --------------------------------------------------------------
    def retain(self, vhost: str, message: RetainedMessage) -> None:
        """Set or replace the retained message of ``message.topic`` (durable once the
        store's batch is written). An empty payload clears it (MQTT 5.0 §3.3.1.3)."""
        if not message.payload:
            self.clear_retained(vhost, message.topic)
            return
        self._index(vhost, message)
        self._save(
            RETAINED_KIND,
            vhost,
            message.topic,
            {
                "topic": message.topic,
                "payload": bytearray(message.payload),
                "qos": message.qos,
                "properties": bytearray(message.properties),
                "expires_at": None if message.expires_at is None else float(message.expires_at),
            },
        )

    def clear_retained(self, vhost: str, topic: str) -> None:
        """Forget the retained message of ``topic`` (a PUBLISH with retain and an empty
        payload); nothing happens if there is none."""
        index = self._retained.get(vhost)
        if index is not None and index.remove(topic) is not None:
            self._delete(RETAINED_KIND, vhost, topic)
            if not index:
                del self._retained[vhost]

    def retained_matching(self, vhost: str, topic_filter: str, now: float) -> list[RetainedMessage]:
        """The retained messages of ``vhost`` that ``topic_filter`` matches (a filter
        without its ``$share/<group>/`` prefix; MQTT 5.0 §4.7, ``+``/``#`` do not match
        a first level starting with ``$``), in no particular order. Those past their
        expiry at ``now`` (epoch seconds) are left out and deleted. A shared
        subscription gets no retained messages (MQTT 5.0 §4.8.2) and retain handling
        (§3.8.3.1) is the adapter's: it does not call this then."""
        index = self._retained.get(vhost)
        if index is None:
            return []
        found = index.match(topic_filter)
        if any(m.expires_at is not None and m.expires_at <= now for m in found):
            for message in [m for m in found if m.expired(now)]:
                self.clear_retained(vhost, message.topic)
            found = [m for m in found if not m.expired(now)]
        return found

    def retained_count(self, vhost: str) -> int:
        """How many retained messages ``vhost`` holds (expired ones not yet swept
        count: see :meth:`expire_retained`)."""
        index = self._retained.get(vhost)
        return 0 if index is None else len(index)

    def expire_retained(self, now: float) -> int:
        """Delete every retained message past its expiry at ``now`` (epoch seconds), of
        every vhost, in expiry order; how many. Run by this state's timer at each next
        expiry (:meth:`next_retained_expiry`): a message nobody subscribes to again
        would stay otherwise."""
        count = 0
        expiring = self._expiring
        while expiring and expiring[0][0] <= now:
            _, _, vhost, message = heapq.heappop(expiring)
            index = self._retained.get(vhost)
            if index is not None and index.by_topic.get(message.topic) is message:
                self.clear_retained(vhost, message.topic)
                count += 1
        return count

    def _arm_expiry(self, due: float) -> None:
        """Have :meth:`expire_retained` run at ``due`` (epoch seconds, on
        ``core.clock``) unless its timer fires earlier already."""
        if self._expiry_due is not None and self._expiry_due <= due:
            return
        if self._expiry_timer is not None:
            self._expiry_timer.cancel()
        self._expiry_due = due
        self._expiry_timer = self.core.clock.call_later(due - self.core.clock.time(), self._expiry_fired)

    def _expiry_fired(self) -> None:
        self._expiry_timer = self._expiry_due = None
        self.expire_retained(self.core.clock.time())
        due = self.next_retained_expiry()
        if due is not None:
            self._arm_expiry(due)

    def next_retained_expiry(self) -> float | None:
        """The earliest expiry (epoch seconds) of a retained message, None if none
        expires (it may have been replaced since: :meth:`expire_retained` then finds
        nothing to do)."""
        return self._expiring[0][0] if self._expiring else None

    # -- sessions -----------------------------------------------------------------------
    def session(self, vhost: str, client_id: str) -> SessionRecord | None:
        """The persistent session of ``client_id`` in ``vhost`` (the record held here:
        save a change with :meth:`save_session`), or None."""
        return self._sessions.get((vhost, client_id))

    def sessions(self, vhost: str | None = None) -> list[SessionRecord]:
        """Every persistent session (of ``vhost``, if given), for management."""
        return [r for (v, _), r in self._sessions.items() if vhost is None or v == vhost]

    def all_sessions(self) -> list[SessionRecord]:
        """Every persistent session of every vhost (:meth:`sessions` without a vhost)."""
        return list(self._sessions.values())

    def save_session(self, record: SessionRecord) -> None:
        """Create or replace a session's record; only what changed since the last save
        is written (its head, its packet ids, or both)."""
        key = (record.vhost, record.client_id)
        self._sessions[key] = record
        head = self._saved_head.get(key)
        if (
            head is None
            or head[0] != record.expiry_interval
            or head[2] != record.disconnected_at
            or head[1] != record.subscriptions
        ):
            self._write_head(record)
        ids = self._saved_ids.get(key)
        if ids is None or ids[0] != record.awaiting_rel or ids[1] != record.awaiting_comp:
            self._saved_ids[key] = (frozenset(record.awaiting_rel), frozenset(record.awaiting_comp))
            self._save(
                PACKET_IDS_KIND,
                record.vhost,
                record.client_id,
                {"awaiting_rel": sorted(record.awaiting_rel), "awaiting_comp": sorted(record.awaiting_comp)},
            )

    def _write_head(self, record: SessionRecord) -> None:
        key = (record.vhost, record.client_id)
        self._saved_head[key] = _head(record)
        subscriptions = [
            {
                "filter": topic_filter,
                "qos": options.qos,
                "no_local": options.no_local,
                "retain_as_published": options.retain_as_published,
                "retain_handling": options.retain_handling,
                "identifier": options.identifier,
            }
            for topic_filter, options in record.subscriptions.items()
        ]
        self._save(
            SESSION_KIND,
            record.vhost,
            record.client_id,
            {
                "client_id": record.client_id,
                "expiry_interval": record.expiry_interval,
                "disconnected_at": None if record.disconnected_at is None else float(record.disconnected_at),
                "subscriptions": subscriptions,
            },
        )

    def delete_session(self, vhost: str, client_id: str) -> None:
        """Forget a session (clean start, expiry, takeover with clean start); nothing
        happens if there is none. Its queue is the adapter's to delete."""
        key = (vhost, client_id)
        if self._sessions.pop(key, None) is None:
            return
        self._saved_head.pop(key, None)
        if self._saved_ids.pop(key, None) is not None:
            self._delete(PACKET_IDS_KIND, vhost, client_id)
        self._delete(SESSION_KIND, vhost, client_id)

    def expired_sessions(self, now: float) -> list[SessionRecord]:
        """The sessions disconnected and past their expiry at ``now`` (epoch seconds),
        earliest first; they stay until :meth:`delete_session` (the adapter deletes
        their queues and sends due wills first)."""
        due = [r for r in self._sessions.values() if (at := r.expires_at()) is not None and at <= now]
        due.sort(key=lambda r: r.expires_at() or 0.0)
        return due

    def next_session_expiry(self) -> float | None:
        """The earliest expiry (epoch seconds) of a disconnected session, None if none
        will expire: when the adapter's timer should call :meth:`expired_sessions`."""
        times = [at for r in self._sessions.values() if (at := r.expires_at()) is not None]
        return min(times, default=None)

    # -- vhosts -------------------------------------------------------------------------
    def forget_vhost(self, vhost: str) -> None:
        """A deleted vhost's retained messages and sessions go, from memory and store
        (a listener of ``BrokerCore.vhost_deleted_listeners``, registered by
        :meth:`of`; calling it again does nothing)."""
        index = self._retained.pop(vhost, None)
        if index is not None:
            for topic in index.by_topic:
                self._delete(RETAINED_KIND, vhost, topic)
        for v, client_id in [key for key in self._sessions if key[0] == vhost]:
            self.delete_session(v, client_id)
        self._expiring = [entry for entry in self._expiring if entry[2] != vhost]
        heapq.heapify(self._expiring)


#: A session's head as last written: expiry interval, subscriptions, disconnected_at.
_Head = tuple[int, dict[str, SubscriptionOptions], float | None]


def _head(record: SessionRecord) -> _Head:
    return (record.expiry_interval, dict(record.subscriptions), record.disconnected_at)


def _retained_from(data: dict) -> RetainedMessage:
    expires_at = data.get("expires_at")
    return RetainedMessage(
        str(data["topic"]),
        bytes(data["payload"]),
        int(data["qos"]),
        bytes(data.get("properties") or b""),
        None if expires_at is None else float(expires_at),
    )


def _session_from(vhost: str, data: dict, packet_ids: dict) -> SessionRecord:
    disconnected_at = data.get("disconnected_at")
    subscriptions: dict[str, SubscriptionOptions] = {}
    for item in _rows(data.get("subscriptions")):
        identifier = item.get("identifier")
        subscriptions[str(item["filter"])] = SubscriptionOptions(
            int(item["qos"]),
            bool(item.get("no_local")),
            bool(item.get("retain_as_published")),
            int(item.get("retain_handling") or 0),
            None if identifier is None else int(identifier),
        )
    return SessionRecord(
        vhost,
        str(data["client_id"]),
        int(data["expiry_interval"]),
        subscriptions,
        {int(i) for i in packet_ids.get("awaiting_rel") or []},
        {int(i) for i in packet_ids.get("awaiting_comp") or []},
        None if disconnected_at is None else float(disconnected_at),
    )


def _rows(value: Any) -> Iterable[dict]:
    return [item for item in value or [] if isinstance(item, dict)]
