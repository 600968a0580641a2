"""One MQTT 3.1.1 or 5.0 connection, sans-I/O, on leveret's core.

The server feeds it bytes (:meth:`MqttConnection.data_received`) and gives it the same
transport, loop and ``request_flush`` callback AMQP and STOMP connections get; its life
in the broker (login throttle, registry, alarms, vhost deletion) is
:mod:`leveret.core.lifecycle`'s, its users, permissions and publishes are core's.

The mapping is RabbitMQ's MQTT plugin's: a topic is a routing key on the ``amq.topic``
exchange (:mod:`.topics`), each session's subscriptions are bindings of its own queue
``mqtt-subscription-<client id>qos1`` (durable for a session that outlives its
connection, exclusive otherwise), a shared subscription ``$share/<group>/<filter>`` is
a queue its members consume together. What mosquitto 2.0 does where RabbitMQ 3.10
falls short: QoS 2 end to end (exactly once), MQTT 5 (reason codes, properties, topic
aliases, receive maximum, maximum packet size, subscription identifiers, no local,
retain handling, shared subscriptions, will delay, session expiry).

Errors: a malformed packet or a protocol violation closes the connection, after a
DISCONNECT with the reason code for an MQTT 5 client (MQTT 5.0 §4.13); a refused
CONNECT gets its CONNACK code (3.1.1's return codes, 5.0's reason codes); a refused
publish gets 0x87 in its PUBACK/PUBREC (5.0) or closes the connection (3.1.1, as
RabbitMQ); a refused subscription gets 0x80/0x87/0x8F in its SUBACK.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import secrets
from collections import deque
from typing import TYPE_CHECKING, Any

from ...core.access import Access
from ...core.auth import AuthenticationError
from ...core.clock import Timer
from ...core.connections import ChannelFacts, ConnectionFacts, ConsumerFacts
from ...core.errors import AccessRefused, BrokerError
from ...core.lifecycle import ConnectionLimitReached, ConnectionRefused
from ...core.message import Message
from ...core.publish import Publisher
from ...core.session import Session
from ..adapter import AdapterConnection
from ..turns import TurnBudget
from . import packets as p, reason_codes as rc
from .consumer import MqttConsumer
from .message import (
    MQTT,
    encode_publish,
    property_block,
    publish_prefix,
    publish_properties,
    publish_qos,
    publisher_id,
    was_retained,
)
from .sessions import SessionTimers, session_queue_name
from .settings import MqttSettings, settings_of
from .state import NEVER, MqttState, RetainedMessage, SessionRecord, SubscriptionOptions
from .topics import (
    TopicError,
    deliverable,
    matches,
    name_part,
    split_shared,
    system_topic,
    to_routing_key,
    to_topic,
)

if TYPE_CHECKING:
    from ...core.queues import QueuedMessage

log = logging.getLogger("leveret.mqtt")

PROTOCOL_NAMES = {p.MQTT_3_1_1: "MQTT 3.1.1", p.MQTT_5: "MQTT 5.0"}
MAX_PACKET_ID = 0xFFFF
MAX_EXPIRY = 0xFFFFFFFF  # seconds: the most a Message Expiry Interval holds (§3.3.2.3.3)


def shared_queue_name(group: str, topic_filter: str) -> str:
    """The queue of shared subscription ``$share/<group>/<topic_filter>``."""
    return f"mqtt-shared-{group}-{name_part(topic_filter)}"


_NOTHING: frozenset[int] = frozenset()


class MqttError(Exception):
    """A protocol violation: DISCONNECT with ``reason_code`` (MQTT 5), then close."""

    def __init__(self, text: str, reason_code: int = rc.PROTOCOL_ERROR) -> None:
        super().__init__(text)
        self.text = text
        self.reason_code = reason_code


class _InFlight:
    """An outbound QoS 1 or 2 PUBLISH waiting for its PUBACK or PUBREC: the consumer
    and queue entry it came from (None for a retained message sent on subscribe, whose
    ``packet`` is kept instead)."""

    __slots__ = ("consumer", "entry", "packet", "qos")

    def __init__(
        self,
        consumer: MqttConsumer | None,
        entry: QueuedMessage | None,
        qos: int,
        packet: p.Publish | None = None,
    ) -> None:
        self.consumer = consumer
        self.entry = entry
        self.qos = qos
        self.packet = packet


class _Match:
    """The subscriptions of a session a message on one topic reached, and what they
    make of it (MQTT 5.0 §3.3.4: one PUBLISH, at their highest QoS, with every
    identifier); ``local`` the same without the *no local* ones, for the session's own
    messages."""

    __slots__ = ("identifiers", "local", "no_local", "qos", "retain_as_published", "subscriptions")

    def __init__(self, subscriptions: list[SubscriptionOptions]) -> None:
        self.subscriptions = subscriptions
        self.qos = max((o.qos for o in subscriptions), default=0)
        self.retain_as_published = any(o.retain_as_published for o in subscriptions)
        self.identifiers = tuple(
            (p.SUBSCRIPTION_IDENTIFIER, o.identifier) for o in subscriptions if o.identifier
        )
        self.no_local = any(o.no_local for o in subscriptions)
        self.local = _Match([o for o in subscriptions if not o.no_local]) if self.no_local else self


class _WillEvents:
    """A will's publisher tells nobody anything (its connection is gone)."""

    def confirms_ready(self) -> None:
        pass

    def rejected(self, seq: int, before: tuple[int, bool] | None) -> None:
        pass

    def returned(self, exchange: str, message: Message) -> None:
        pass


class MqttConnection(AdapterConnection):
    """State machine of one MQTT client connection: ``connecting`` until CONNECT,
    ``refusing`` while a wrong login's CONNACK waits for the login throttle,
    ``connected``, then ``closed``."""

    # (its own attributes out of the instance dict: 10,000 idle connections are common)
    __slots__ = (
        "_aliases_in",
        "_auth_method",
        "_clean_close",
        "_confirmed_upto",
        "_confirms",
        "_confirms_ready",
        "_keys",
        "_match_cache",
        "_next_id",
        "_prefixes",
        "_qos1_waiting",
        "_resent_ids",
        "_rest",
        "_retained_waiting",
        "_retaining",
        "_timer",
        "_topics",
        "client_id",
        "client_max_packet",
        "consumers",
        "inflight",
        "keep_alive",
        "publisher",
        "reader",
        "record",
        "send_window",
        "settings",
        "state",
        "subscriptions",
        "v5",
        "version",
        "will",
    )

    settings: MqttSettings

    def _init_protocol(self) -> None:
        self.state = "connecting"
        self.settings = settings_of(self.core)
        self.version = p.MQTT_3_1_1
        self.v5 = False  # MQTT 5.0 (protocol level 5), known from the CONNECT
        self.reader = p.PacketReader()
        self.client_id = ""
        self.keep_alive = 0  # seconds (0: none)
        self.publisher: Publisher | None = None
        self.record: SessionRecord | None = None  # the session, once connected
        self.subscriptions: dict[str, SubscriptionOptions] = {}
        #: queue name -> this connection's consumer on it
        self.consumers: dict[str, MqttConsumer] = {}
        #: outbound packet id -> what waits for its PUBACK/PUBREC
        self.inflight: dict[int, _InFlight] = {}
        #: retained QoS 1/2 messages for new subscriptions, waiting for room in the
        #: client's Receive Maximum (MQTT 5.0 §4.9); their packet ids come when sent
        #: (None until there are some)
        self._retained_waiting: deque[p.Publish] | None = None
        self._next_id = 0
        #: (queue name, seq) -> the packet id an earlier connection of the session sent
        #: it with: a redelivery goes with the same id (MQTT 3.1.1 §4.4, 5.0 §4.4)
        self._resent_ids: dict[tuple[str, int], int] = {}
        #: inbound QoS 1/2 publishes waiting for the publisher's confirm:
        #: (publish seq, QoS, packet id)
        self._confirms: list[tuple[int, int, int]] = []
        self._confirmed_upto = 0  # the publisher's confirms so far
        self._qos1_waiting = 0  # QoS 1 publishes in _confirms (QoS 2: in awaiting_rel)
        self._confirms_ready = False  # some wait to be taken at the flush
        #: seqs of retained QoS 1/2 publishes whose acknowledgement waits for the
        #: retained message to be on disk (the message itself may have reached no queue)
        self._retaining: set[int] | frozenset[int] = _NOTHING
        self.will: p.Will | None = None
        self._auth_method: str | None = None  # MQTT 5 enhanced authentication's
        self._clean_close = False  # DISCONNECT 0x00: the will is not sent
        self._aliases_in: dict[int, str] = {}
        #: topic (or a shared subscription's filter) -> what a message there matched
        self._match_cache: dict[str, _Match] = {}
        #: topic -> routing key, for publishes
        self._keys: dict[str, str] = {}
        #: the start of the encoded form of this client's messages, by QoS | retain << 2
        self._prefixes: dict[int, bytes] = {}
        #: routing key -> (MQTT topic, its encoded field), for deliveries
        self._topics: dict[str, tuple[str, bytes]] = {}
        # what the client allows us (MQTT 5 CONNECT properties)
        self.send_window = self.settings.prefetch
        self.client_max_packet = p.MAX_VARINT + 5
        self._rest: list[p.Packet] | None = None
        self._timer: Timer = self.loop.call_later(self.settings.connect_timeout, self._connect_timeout)

    # -- what the server asks ---------------------------------------------------------
    @property
    def reading_paused(self) -> bool:
        return self.blocked or self._rest is not None

    @property
    def quiet(self) -> bool:
        return not self._flush_requested and self.state == "connected" and not self.blocked

    @property
    def key(self) -> tuple[str, str]:
        """(vhost, client identifier): a session's name."""
        assert self.vhost is not None
        return self.vhost.name, self.client_id

    def send_packet(self, packet: p.Packet) -> None:
        self.send(p.encode(packet, self.version))

    def _resume(self) -> None:
        if self._retained_waiting:
            self._send_waiting_retained()
        for consumer in list(self.consumers.values()):
            consumer.queue.drain()

    # -- input ------------------------------------------------------------------------
    def data_received(self, data: bytes, whole: bool = False) -> None:
        """Feed bytes read from the socket: packets are handled in order, over several
        loop turns when they take long (protocol/turns.py) unless ``whole``."""
        self.last_received = self.loop.time()
        if self.state in ("closed", "refusing"):
            return
        try:
            packets = self.reader.feed(data)
        except p.MalformedPacket as exc:
            self._malformed(exc)
            return
        if self._rest is not None:
            self._rest += packets
            return
        self._run(packets, whole)

    def _run(self, packets: list[p.Packet], whole: bool = False) -> None:
        budget = TurnBudget(0 if whole else len(packets), self.core.clock.monotonic)
        for i, packet in enumerate(packets):
            if budget.spent():
                self._rest = packets[i:]
                self.transport.pause_reading()
                self.loop.call_soon(self._next_turn)
                return
            try:
                self._handle(packet)
            except MqttError as exc:
                self._violation(exc.text, exc.reason_code)
            except BrokerError as exc:  # core refused what a handler asked (an unbind, say)
                self._violation(exc.text, rc.UNSPECIFIED)
            if self.state != "connected":
                return

    def _next_turn(self) -> None:
        rest, self._rest = self._rest, None
        if self.state != "connected" or rest is None:
            return
        self._run(rest)
        if self._rest is None and not self.blocked and self.state == "connected":
            self.transport.resume_reading()

    def _handle(self, packet: p.Packet) -> None:
        if self.state == "connecting":
            if not isinstance(packet, p.Connect):
                raise MqttError(f"{type(packet).__name__} before CONNECT (§3.1)")
            self._connect(packet)
            return
        handler = _HANDLERS.get(type(packet))
        if handler is None:
            raise MqttError(f"a {type(packet).__name__} packet from a client (§3)")
        handler(self, packet)

    def _malformed(self, exc: p.MalformedPacket) -> None:
        """A packet the codec refused: a CONNECT of another protocol level gets 3.1.1's
        CONNACK 0x01 (§3.1.2.2, what mosquitto answers), anything else before CONNECT
        just a close; after it, DISCONNECT with the reason code (5.0) and close."""
        if self.state == "connecting":
            if exc.reason_code == p.UNSUPPORTED_PROTOCOL_VERSION:
                self.send(b"\x20\x02\x00\x01")
            log.info("MQTT connection %s: %s", self.peer, exc)
            self.close_transport()
            return
        self._violation(str(exc), exc.reason_code)

    def _violation(self, text: str, reason_code: int) -> None:
        log.info("MQTT connection %s (%s): %s", self.peer, self.client_id, text)
        self._disconnect_client(reason_code, text)

    def _disconnect_client(self, reason_code: int, text: str = "") -> None:
        """Close from the broker's side: DISCONNECT with ``reason_code`` first for an
        MQTT 5 client (§3.14), the will is sent (not a normal disconnect)."""
        if self.state == "closed":
            return
        if self.v5 and self.state == "connected":
            properties = ((p.REASON_STRING, text[:200]),) if text else ()
            data = p.encode(p.Disconnect(reason_code, properties), self.version)
            if len(data) > self.client_max_packet:  # no reason string then (§3.14.2.2.3)
                data = p.encode(p.Disconnect(reason_code), self.version)
            self.send(data)
        self.close_transport()

    # -- CONNECT ----------------------------------------------------------------------
    def _connect(self, packet: p.Connect) -> None:
        assert self.reader.version is not None
        self.version = self.reader.version
        self.v5 = self.version == p.MQTT_5
        self.reader.max_packet_size = self.settings.max_packet_size
        properties = packet.properties
        method = p.get_property(properties, p.AUTHENTICATION_METHOD)
        if method is not None and method not in ("PLAIN", "EXTERNAL"):
            self._refuse_connect(rc.BAD_AUTHENTICATION_METHOD, f"authentication method {method!r}")
            return
        client_id = packet.client_id
        assigned = None
        if not client_id:
            if not self.v5 and not packet.clean_start:  # 3.1.1 §3.1.3.1
                self._refuse_connect(rc.CLIENT_ID_NOT_VALID, "an empty client id needs a clean session")
                return
            client_id = assigned = f"leveret-{secrets.token_hex(8)}"
        self.client_id = client_id
        username, password = self._credentials(packet, method)
        vhost_name, username = self._vhost_of(username)
        mechanism = "EXTERNAL" if username is None and self.certificate_user else "PLAIN"
        try:
            if vhost_name not in self.core.vhosts:  # a failed login, as RabbitMQ 3.10 takes it
                raise AuthenticationError(f"vhost '{vhost_name}' does not exist")
            if mechanism == "EXTERNAL" and self.settings.ssl_cert_login:
                assert self.certificate_user is not None
                user = self.core.users.authenticate_external(self.certificate_user, self.from_loopback)
            elif username is None and not self.settings.allow_anonymous:
                raise AuthenticationError("anonymous login refused (mqtt allow_anonymous is off)")
            else:
                if username is None:
                    username, password = self.settings.default_user, self.settings.default_pass
                user = self.core.users.authenticate(username, password or "", self.from_loopback, "MQTT")
        except AuthenticationError as exc:
            delay = self._login_refused(log, "MQTT", username, str(exc), protocol="mqtt")
            self._refuse_later(delay, rc.BAD_USER_NAME_OR_PASSWORD, str(exc))
            return
        self._login_accepted()
        vhost = self.core.vhosts[vhost_name]
        if not self.core.users.may_access(user, vhost_name):
            self._refuse_connect(
                rc.NOT_AUTHORIZED, f"access to vhost '{vhost_name}' refused for '{user.name}'"
            )
            return
        self._take_over(f"mqtt:{vhost_name}:{client_id}")
        try:
            self._open_life(user, vhost, PROTOCOL_NAMES[self.version], f"mqtt:{vhost_name}:{client_id}")
        except ConnectionLimitReached as exc:  # 3.1.1: 5 not authorized, as RabbitMQ 3.10
            self._refuse_connect(rc.QUOTA_EXCEEDED if self.v5 else rc.NOT_AUTHORIZED, exc.text)
            return
        except ConnectionRefused as exc:
            self._refuse_connect(rc.SERVER_UNAVAILABLE, exc.text)
            return
        access = Access(self.core.users, user, vhost.name, {"client_id": client_id})
        self.session = Session(vhost, access, self)
        self.publisher = Publisher(self.session, self)
        self.publisher.select_confirms()
        self.will = packet.will
        self.keep_alive = packet.keep_alive
        granted = self.settings.max_keep_alive
        if self.v5 and granted and not 0 < self.keep_alive <= granted:
            self.keep_alive = granted  # told in the CONNACK's Server Keep Alive (§3.2.2.3.14)
        self._auth_method = method if isinstance(method, str) else None
        self._client_limits(properties)
        expiry = self._session_expiry(packet)
        present = self._open_session(packet.clean_start, expiry)
        self.state = "connected"
        self._timer.cancel()
        self._connack(present, assigned, expiry, packet)
        if self.keep_alive:
            self._timer = self.loop.call_later(self.keep_alive * 1.5, self._check_keep_alive)
        self._resume_session()

    def _credentials(self, packet: p.Connect, method: Any) -> tuple[str | None, str | None]:
        """User name and password: CONNECT's fields, or SASL PLAIN's
        ``authzid NUL authcid NUL passwd`` in the MQTT 5 Authentication Data."""
        password = packet.password.decode("utf-8", "replace") if packet.password is not None else None
        if method == "PLAIN":
            data = p.get_property(packet.properties, p.AUTHENTICATION_DATA)
            if isinstance(data, bytes) and data.count(b"\0") == 2:
                _, user, secret = data.decode("utf-8", "replace").split("\0")
                return user, secret
        return packet.username, password

    def _vhost_of(self, username: str | None) -> tuple[str, str | None]:
        """The vhost a login names, as RabbitMQ 3.10's MQTT plugin chooses it: the part
        of ``vhost:user`` before the last colon; else the listening port's vhost (the
        global parameter ``mqtt_port_to_vhost_mapping``, ``{"1883": "vhost"}``, then
        ``[mqtt] port_vhosts``); else ``[mqtt] vhost``."""
        if username is not None and ":" in username:
            vhost, _, user = username.rpartition(":")
            return vhost, user
        port = self.local[1]
        mapping = self.core.global_parameters.get("mqtt_port_to_vhost_mapping")
        mapped = mapping.get(str(port)) if isinstance(mapping, dict) else None
        if not isinstance(mapped, str):
            mapped = self.settings.port_vhosts.get(port)
        return (mapped or self.settings.vhost), username

    def _refuse_connect(self, reason_code: int, text: str) -> None:
        """CONNACK with a refusal, then close (§3.2.2.2)."""
        log.info("MQTT connection %s refused: %s", self.peer, text)
        code = rc.connack_code(reason_code, self.version)
        self.send_packet(p.ConnAck(False, code))
        self.close_transport()

    def _refuse_later(self, delay: float, reason_code: int, text: str) -> None:
        if not delay:
            self._refuse_connect(reason_code, text)
            return
        self.state = "refusing"  # the CONNACK waits for the login throttle's slot
        self.transport.pause_reading()
        self._timer.cancel()
        self._timer = self.loop.call_later(delay, lambda: self._refuse_connect(reason_code, text))

    def _take_over(self, key: str) -> None:
        """Another connection has this client id in this vhost: it is closed (5.0:
        DISCONNECT 0x8E Session taken over, §3.1.4-3), its will handled as for any
        connection that ends without DISCONNECT."""
        existing = self.core.client_ids.get(key)
        if isinstance(existing, MqttConnection) and existing is not self:
            existing._disconnect_client(rc.SESSION_TAKEN_OVER, "another connection took the session over")

    def _client_limits(self, properties: p.Properties) -> None:
        """What an MQTT 5 client allows: Receive Maximum, Maximum Packet Size."""
        receive_maximum = p.get_property(properties, p.RECEIVE_MAXIMUM)
        if isinstance(receive_maximum, int):
            self.send_window = receive_maximum
        max_packet = p.get_property(properties, p.MAXIMUM_PACKET_SIZE)
        if isinstance(max_packet, int):
            self.client_max_packet = max_packet

    def _session_expiry(self, packet: p.Connect) -> int:
        """Seconds the session outlives the connection: 3.1.1's clean session 0 never
        ends; MQTT 5's Session Expiry Interval (default 0), at most
        ``max_session_expiry``."""
        if not self.v5:
            return 0 if packet.clean_start else NEVER
        asked = p.get_property(packet.properties, p.SESSION_EXPIRY_INTERVAL)
        expiry = int(asked) if isinstance(asked, int) else 0
        if expiry == NEVER and self.settings.max_session_expiry >= NEVER:
            return NEVER
        return min(expiry, self.settings.max_session_expiry)

    def _open_session(self, clean_start: bool, expiry: int) -> bool:
        """Resume or start the session; True if one was resumed (session present)."""
        state = MqttState.of(self.core)
        timers = SessionTimers.of(self.core)
        key = self.key
        record = state.session(*key)
        if clean_start:  # the old session ends: a will waiting for its delay goes now
            timers.expire(key)
            record = None
        else:  # a will waiting for its delay is not sent (§3.1.3.2.2)
            timers.reconnected(key)
            self._resent_ids = timers.take_packet_ids(key)
            retained = timers.take_retained(key)
            if retained:
                self._retained_waiting = deque(retained)
        present = record is not None
        if record is None:
            record = SessionRecord(key[0], key[1], expiry)
        record.expiry_interval = expiry
        record.disconnected_at = None
        self.record = record
        self.subscriptions = dict(record.subscriptions)
        if expiry or present:  # (a resumed one now ending with its connection: said so)
            state.save_session(record)
        return present

    def _connack(self, present: bool, assigned: str | None, expiry: int, connect: p.Connect) -> None:
        """CONNACK 0x00; to an MQTT 5 client with what the broker allows and what it
        changed: the session expiry and keep alive granted, an assigned client id, the
        authentication method it used, Response Information when asked for (a topic
        prefix of the client's own, ``response/<client id>/``)."""
        properties: list[tuple[int, Any]] = []
        if self.v5:
            settings = self.settings
            properties += [
                (p.RECEIVE_MAXIMUM, settings.receive_maximum),
                (p.MAXIMUM_PACKET_SIZE, settings.max_packet_size),
                (p.TOPIC_ALIAS_MAXIMUM, settings.topic_alias_maximum),
            ]
            if assigned is not None:
                properties.append((p.ASSIGNED_CLIENT_IDENTIFIER, assigned))
            asked = p.get_property(connect.properties, p.SESSION_EXPIRY_INTERVAL)
            if isinstance(asked, int) and asked != expiry:
                properties.append((p.SESSION_EXPIRY_INTERVAL, expiry))
            if self.keep_alive != connect.keep_alive:
                properties.append((p.SERVER_KEEP_ALIVE, self.keep_alive))
            if self._auth_method is not None:
                properties.append((p.AUTHENTICATION_METHOD, self._auth_method))
            if p.get_property(connect.properties, p.REQUEST_RESPONSE_INFORMATION) == 1:
                properties.append((p.RESPONSE_INFORMATION, f"response/{self.client_id}/"))
        self.send_packet(p.ConnAck(present, rc.SUCCESS, tuple(properties)))

    def _resume_session(self) -> None:
        """A resumed session's subscriptions consume again, and PUBRELs it had not seen
        completed and retained messages it had not seen acknowledged go again (§4.4)."""
        assert self.record is not None
        for topic_filter in list(self.subscriptions):
            try:
                self._attach(topic_filter)
            except BrokerError as exc:
                log.warning(
                    "MQTT %s: subscription %r not resumed: %s", self.client_id, topic_filter, exc.text
                )
                self.subscriptions.pop(topic_filter, None)
        for packet_id in sorted(self.record.awaiting_comp):
            self.send_packet(p.PubRel(packet_id))
        self._send_waiting_retained()
        self._start_consumers()

    # -- PUBLISH (client to broker) ----------------------------------------------------
    def _publish(self, packet: p.Publish) -> None:
        topic = packet.topic
        properties = packet.properties
        if self.v5 and (properties or not topic):
            alias = p.get_property(properties, p.TOPIC_ALIAS)
            if isinstance(alias, int):
                if alias > self.settings.topic_alias_maximum:
                    raise MqttError(f"topic alias {alias} over the maximum", rc.TOPIC_ALIAS_INVALID)
                if topic:
                    self._aliases_in[alias] = topic
                else:
                    known = self._aliases_in.get(alias)
                    if known is None:
                        raise MqttError(f"topic alias {alias} was never set (§3.3.2.3.4)")
                    topic = known
            elif not topic:
                raise MqttError("a PUBLISH without topic name or alias (§3.3.2.1)", rc.TOPIC_NAME_INVALID)
        qos, packet_id = packet.qos, packet.packet_id
        record = self.record
        assert record is not None and self.publisher is not None
        if qos == 2 and packet_id in record.awaiting_rel:  # a resend: routed already (§4.3.3)
            if not any(waiting[2] == packet_id and waiting[1] == 2 for waiting in self._confirms):
                self.send_packet(p.PubRec(packet_id))  # (else its PUBREC waits for the confirm)
            return
        if qos and self.v5 and self._qos1_waiting + len(record.awaiting_rel) >= self.settings.receive_maximum:
            raise MqttError(
                "more QoS 1 and 2 PUBLISHes than the Receive Maximum", rc.RECEIVE_MAXIMUM_EXCEEDED
            )
        if topic.startswith("$"):  # $SYS and the like are the broker's (§4.7.2)
            self._refuse_publish(qos, packet_id, f"publishing to {topic!r} is not allowed", rc.NOT_AUTHORIZED)
            return
        routing_key = self._keys.get(topic)
        if routing_key is None:
            if len(self._keys) > 4096:
                self._keys.clear()
            routing_key = self._keys[topic] = to_routing_key(topic)
        try:
            exchange = self.publisher.exchange(self.settings.exchange, routing_key)
        except BrokerError as exc:  # no write permission, no such exchange
            code = rc.NOT_AUTHORIZED if isinstance(exc, AccessRefused) else rc.UNSPECIFIED
            self._refuse_publish(qos, packet_id, exc.text, code)
            return
        core = self.core
        if core.alarm_active:
            self._block()
        elif core.flow.active:
            self.hold_for_flow()
        expiry = p.get_property(properties, p.MESSAGE_EXPIRY_INTERVAL) if properties else None
        ttl = int(expiry) * 1000 if isinstance(expiry, int) else None
        flags = qos | packet.retain << 2
        prefix = self._prefixes.get(flags)
        if prefix is None:
            prefix = self._prefixes[flags] = publish_prefix(qos, packet.retain, self.client_id)
        encoded = prefix + property_block(properties) if properties else prefix
        message = Message(self.settings.exchange, routing_key, packet.payload, MQTT, encoded, qos > 0, ttl)
        seq = self.publisher.seq + 1
        if qos:  # before publishing: a confirm may come at once, from inside publish()
            assert packet_id is not None
            self._confirms.append((seq, qos, packet_id))
            if qos == 1:
                self._qos1_waiting += 1
            else:  # noted before the message is routed, so that the store has the note
                # whenever it has the message: a PUBLISH resent after a crash that lost
                # its PUBREC is known (a store writes in call order)
                record.awaiting_rel.add(packet_id)
                if record.expiry_interval:
                    MqttState.of(core).save_session(record)
        if packet.retain:
            self._retain(topic, packet, encoded, expiry)
            if qos:
                if not self._retaining:
                    self._retaining = set()
                self._retaining.add(seq)  # type: ignore[union-attr]
                MqttState.of(core).when_durable(lambda ok: self._retained_durable(seq, ok))
        self.publisher.publish(exchange, message)
        core.metrics.mqtt_received[qos] += 1

    def _refuse_publish(self, qos: int, packet_id: int | None, text: str, code: int) -> None:
        """A publish that cannot be made: 5.0 answers ``code`` (0x87 Not authorized,
        0x80 Unspecified error) in its PUBACK/PUBREC (QoS 0: dropped); 3.1.1 has no way
        to say it, so the connection closes (as RabbitMQ's MQTT plugin does)."""
        log.info("MQTT %s: publish refused: %s", self.client_id, text)
        if not self.v5:
            self.close_transport()
        elif qos == 1 and packet_id is not None:
            self.send_packet(p.PubAck(packet_id, code))
        elif qos == 2 and packet_id is not None:
            self.send_packet(p.PubRec(packet_id, code))

    def _retain(self, topic: str, packet: p.Publish, encoded: bytes, expiry: Any) -> None:
        """Keep (or, with an empty payload, clear) the topic's retained message."""
        assert self.vhost is not None
        state = MqttState.of(self.core)
        if not packet.payload:
            state.clear_retained(self.vhost.name, topic)
            return
        block = encoded[3 + len(self.client_id.encode()) :]
        expires_at = self.core.clock.time() + expiry if isinstance(expiry, int) else None
        state.retain(self.vhost.name, RetainedMessage(topic, packet.payload, packet.qos, block, expires_at))

    # -- publisher events (core.publish.PublisherEvents) -------------------------------
    def confirms_ready(self) -> None:
        """Confirms are ready: their PUBACKs and PUBRECs go at this turn's flush, all
        at once (as AMQP's basic.ack multiple)."""
        self._confirms_ready = True
        self._want_flush()

    def _flushing(self) -> None:
        if self._confirms_ready and self.state == "connected":
            self._confirms_ready = False
            assert self.publisher is not None
            confirms = self.publisher.take_confirms()
            if confirms is not None:
                self._confirmed(confirms[0])

    def _retained_durable(self, seq: int, ok: bool) -> None:
        """The retained message of publish ``seq`` is on disk (or failed to be)."""
        if seq in self._retaining:
            self._retaining.remove(seq)  # type: ignore[union-attr]
        if self.state != "connected":
            return
        if not ok:  # the store failed: unacknowledged, the client publishes it again
            self._disconnect_client(rc.UNSPECIFIED, "the retained message could not be stored")
            return
        self._confirmed(self._confirmed_upto)

    def _confirmed(self, upto: int) -> None:
        """Publishes up to ``upto`` are safe: PUBACK (QoS 1) or PUBREC (QoS 2), in
        order; a retained one also waits for its retained message to be on disk."""
        self._confirmed_upto = upto = max(upto, self._confirmed_upto)
        pending = self._confirms
        record = self.record
        assert record is not None
        out = []
        retaining = self._retaining
        done = 0
        for seq, qos, packet_id in pending:
            if seq > upto or seq in retaining:
                break
            done += 1
            if qos == 1:
                self._qos1_waiting -= 1
                out.append(p.puback(packet_id))
            else:
                out.append(p.pubrec(packet_id))
        if done:
            del pending[:done]
            self.send(b"".join(out))

    def rejected(self, seq: int, before: tuple[int, bool] | None) -> None:
        """A publish was not taken (a failed write, a full queue): 5.0's PUBACK/PUBREC
        0x80; a 3.1.1 client cannot be told, so it is disconnected."""
        if before is not None:
            self._confirmed(before[0])
        pending = self._confirms
        found = next((i for i, waiting in enumerate(pending) if waiting[0] == seq), None)
        if found is None:
            return  # a QoS 0 publish: nothing to say
        _, qos, packet_id = pending.pop(found)
        if qos == 1:
            self._qos1_waiting -= 1
        elif self.record is not None:  # not taken: the client may send it again
            self.record.awaiting_rel.discard(packet_id)
        if not self.v5:
            self.close_transport()
        elif qos == 1:
            self.send_packet(p.PubAck(packet_id, rc.UNSPECIFIED))
        else:
            self.send_packet(p.PubRec(packet_id, rc.UNSPECIFIED))

    def returned(self, exchange: str, message: Message) -> None:
        """Never called: MQTT publishes are not mandatory."""

    def _settle_id(self, ids: set[int], packet_id: int) -> bool:
        """Take ``packet_id`` out of one of the session's QoS 2 sets (``awaiting_rel``
        or ``awaiting_comp``), saved for a persistent session; False if not there."""
        record = self.record
        assert record is not None
        if packet_id not in ids:
            return False
        ids.discard(packet_id)
        if record.expiry_interval:
            MqttState.of(self.core).save_session(record)
        return True

    def _pubrel(self, packet: p.PubRel) -> None:
        assert self.record is not None
        if self._settle_id(self.record.awaiting_rel, packet.packet_id):
            self.send_packet(p.PubComp(packet.packet_id))
        else:
            self.send_packet(p.PubComp(packet.packet_id, rc.PACKET_ID_NOT_FOUND if self.v5 else 0))

    # -- SUBSCRIBE / UNSUBSCRIBE --------------------------------------------------------
    def _subscribe(self, packet: p.Subscribe) -> None:
        identifier = p.get_property(packet.properties, p.SUBSCRIPTION_IDENTIFIER)
        codes: list[int] = []
        retained: list[tuple[str, SubscriptionOptions]] = []
        for request in packet.subscriptions:
            try:
                group, topic_filter = split_shared(request.topic_filter)
            except TopicError as exc:
                log.info("MQTT %s: %s", self.client_id, exc)
                codes.append(rc.TOPIC_FILTER_INVALID if self.v5 else rc.SUBSCRIPTION_FAILURE_3)
                continue
            if group is not None and request.no_local:
                raise MqttError("no local on a shared subscription (§3.8.3.1)")
            options = SubscriptionOptions(
                request.qos,
                request.no_local,
                request.retain_as_published,
                request.retain_handling,
                identifier if isinstance(identifier, int) else None,
            )
            existed = request.topic_filter in self.subscriptions
            self.subscriptions[request.topic_filter] = options
            try:
                self._attach(request.topic_filter)
            except BrokerError as exc:
                log.info(
                    "MQTT %s: subscription %r refused: %s", self.client_id, request.topic_filter, exc.text
                )
                if not existed:
                    del self.subscriptions[request.topic_filter]
                refused = rc.NOT_AUTHORIZED if isinstance(exc, AccessRefused) else rc.UNSPECIFIED
                codes.append(refused if self.v5 else rc.SUBSCRIPTION_FAILURE_3)
                continue
            codes.append(request.qos)
            if group is None and (
                request.retain_handling == 0 or (request.retain_handling == 1 and not existed)
            ):
                retained.append((topic_filter, options))
        self._match_cache.clear()
        self._save_subscriptions()
        suback = p.SubAck(packet.packet_id, tuple(codes))

        def answer(ok: bool) -> None:
            if self.state != "connected":
                return
            if not ok:  # the store failed: the client must not think it subscribed
                self._disconnect_client(rc.UNSPECIFIED, "the subscription could not be stored")
                return
            self.send_packet(suback)
            for topic_filter, options in retained:
                self._send_retained(topic_filter, options)
            self._start_consumers()

        assert self.record is not None
        if self.record.expiry_interval:  # a persistent session: SUBACK once it is on disk
            MqttState.of(self.core).when_durable(answer)
        else:
            answer(True)

    def _attach(self, topic_filter: str) -> None:
        """Make the queue and binding of subscription ``topic_filter`` exist and this
        connection's consumer on the queue (started by :meth:`_start_consumers`).
        Raises core's errors (AccessRefused for a refused permission)."""
        session = self.session
        record = self.record
        assert session is not None and record is not None
        group, plain = split_shared(topic_filter)
        durable = record.expiry_interval > 0
        if group is None:
            name = session_queue_name(self.client_id)
            if name not in session.vhost.queues:
                session.declare_queue(name, durable=durable, exclusive=not durable)
            shared = None
        else:
            name = shared_queue_name(group, plain)
            if name not in session.vhost.queues:
                # a durable one (its group's persistent sessions) goes after the longest
                # session expiry without a member, not never
                expires = self.settings.max_session_expiry * 1000
                arguments = {"x-expires": expires} if durable and expires else None
                session.declare_queue(name, durable=durable, auto_delete=not durable, arguments=arguments)
            shared = topic_filter
        session.bind(self.settings.exchange, "queue", name, to_routing_key(plain))
        if name not in self.consumers:
            queue = session.readable_queue(name)
            self.consumers[name] = MqttConsumer(self, queue, shared)

    def _start_consumers(self) -> None:
        for consumer in list(self.consumers.values()):
            if consumer not in consumer.queue.consumers:
                consumer.queue.add_consumer(consumer)

    def _save_subscriptions(self) -> None:
        record = self.record
        assert record is not None
        record.subscriptions = dict(self.subscriptions)
        if record.expiry_interval:
            MqttState.of(self.core).save_session(record)

    def _unsubscribe(self, packet: p.Unsubscribe) -> None:
        session = self.session
        assert session is not None
        codes = []
        for topic_filter in packet.topic_filters:
            if self.subscriptions.pop(topic_filter, None) is None:
                codes.append(rc.NO_SUBSCRIPTION_EXISTED)
                continue
            codes.append(rc.SUCCESS)
            try:
                group, plain = split_shared(topic_filter)
            except TopicError:
                continue
            if group is None:
                name = session_queue_name(self.client_id)
                session.unbind(self.settings.exchange, "queue", name, to_routing_key(plain))
            else:
                consumer = self.consumers.pop(shared_queue_name(group, plain), None)
                if consumer is not None:
                    self._end_consumer(consumer)
        self._match_cache.clear()
        self._save_subscriptions()
        self.send_packet(p.UnsubAck(packet.packet_id, tuple(codes) if self.v5 else ()))

    # -- PUBLISH (broker to client) ----------------------------------------------------
    def can_deliver(self) -> bool:
        """Room in the client's Receive Maximum for one more QoS 1/2 PUBLISH (a QoS 2
        one counts until its PUBCOMP, MQTT 5.0 §4.9), and a writable socket."""
        record = self.record
        in_flight = len(self.inflight) + (len(record.awaiting_comp) if record is not None else 0)
        return self.writable and in_flight < self.send_window and self.state == "connected"

    def _matching(self, consumer: MqttConsumer, topic: str) -> _Match:
        """The subscriptions a message on ``topic`` reached ``consumer`` for."""
        key = topic if consumer.shared is None else consumer.shared + "\0" + topic
        cached = self._match_cache.get(key)
        if cached is None:
            if consumer.shared is not None:
                options = self.subscriptions.get(consumer.shared)
                cached = _Match([options] if options is not None else [])
                if system_topic(topic) and consumer.shared.split("/", 3)[2][:1] in ("+", "#"):
                    cached = _Match([])
            else:
                cached = _Match(
                    [
                        options
                        for topic_filter, options in self.subscriptions.items()
                        if not topic_filter.startswith("$share/") and matches(topic_filter, topic)
                    ]
                )
            if len(self._match_cache) > 1024:
                self._match_cache.clear()
            self._match_cache[key] = cached
        return cached

    def deliver(self, consumer: MqttConsumer, entry: QueuedMessage) -> None:
        """One PUBLISH to the client (called through its queue): at the lower of the
        publish QoS and the highest granted QoS of the subscriptions it matched, with
        their identifiers (MQTT 5.0 §3.3.4); dropped (acknowledged) when no local, the
        client's Maximum Packet Size or the ``$`` rule says it must not go."""
        queue = consumer.queue
        message = entry.message
        topics = self._topics
        known = topics.get(message.routing_key)
        if known is None:
            if len(topics) > 4096:
                topics.clear()
            name = to_topic(message.routing_key)
            try:
                field = p.topic_field(name) if deliverable(name) else b""
            except ValueError:  # U+0000 (an AMQP routing key may hold it), or too long
                field = b""
            known = topics[message.routing_key] = (name, field)
        topic, field = known
        if not field:  # an AMQP routing key with * or #: no MQTT topic name can carry it
            queue.ack(entry)
            return
        match = self._matching(consumer, topic)
        if match.no_local and publisher_id(message) == self.client_id:
            match = match.local
        if not match.subscriptions:
            queue.ack(entry)
            return
        qos = min(match.qos, message.encoded[0] & 3 if message.format is MQTT else publish_qos(message))
        retain = match.retain_as_published and was_retained(message)
        expiry = None
        if entry.expires_at:
            expiry = min(math.ceil(entry.expires_at - self.core.clock.time()), MAX_EXPIRY)
            if expiry <= 0:
                queue.ack(entry)
                return
        block = None
        if self.v5:
            properties = publish_properties(message, expiry) + match.identifiers
            block = p.encode_properties(properties) if properties else b"\0"
        counters = queue.counters
        packet_id = None
        if qos:
            packet_id = self._resent_ids.pop((queue.name, entry.seq), None) if entry.redelivered else None
            record = self.record
            if (
                packet_id is None
                or packet_id in self.inflight
                or (record is not None and packet_id in record.awaiting_comp)
            ):  # (its old id went to another message meanwhile)
                packet_id = self._packet_id()
        body = message.body
        head = p.publish_head(field, qos, retain, entry.redelivered and qos > 0, packet_id, block, len(body))
        if len(head) + len(body) > self.client_max_packet:  # MQTT 5.0 §3.1.2.11.4: as if sent
            queue.ack(entry)
            return
        if qos:
            assert packet_id is not None
            self.inflight[packet_id] = _InFlight(consumer, entry, qos)
            counters.delivered_consume_manual_ack += 1
        else:
            queue.ack(entry)
            counters.delivered_consume_auto_ack += 1
        if entry.redelivered:
            counters.redelivered += 1
        self.core.metrics.mqtt_sent[qos] += 1
        self.send_parts([head, body], len(body))

    def _packet_id(self) -> int:
        """The next packet identifier free for an outbound PUBLISH (§2.2.1): not in
        flight, not waiting for PUBCOMP, not kept for a message the session's last
        connection had in flight (the client may still hold it, §4.3.3)."""
        record = self.record
        busy = self.inflight
        awaiting = record.awaiting_comp if record is not None else _NOTHING
        kept: set[int] | frozenset[int] = _NOTHING
        if self._resent_ids or self._retained_waiting:
            kept = set(self._resent_ids.values())
            kept.update(x.packet_id for x in self._retained_waiting or () if x.packet_id is not None)
        if len(busy) + len(awaiting) + len(kept) >= MAX_PACKET_ID:
            kept = set()  # (never more ids than a Receive Maximum of 65,535 needs)
        for _ in range(MAX_PACKET_ID):
            self._next_id = self._next_id % MAX_PACKET_ID + 1
            if self._next_id not in busy and self._next_id not in awaiting and self._next_id not in kept:
                return self._next_id
        raise MqttError("no packet identifier free", rc.IMPLEMENTATION_SPECIFIC)

    def _send_retained(self, topic_filter: str, options: SubscriptionOptions) -> None:
        """The retained messages matching a new subscription, retain flag set (§3.3.1.3)."""
        assert self.vhost is not None
        now = self.core.clock.time()
        for retained in MqttState.of(self.core).retained_matching(self.vhost.name, topic_filter, now):
            qos = min(retained.qos, options.qos)
            properties: tuple = ()
            if self.v5:
                stored = p.decode_properties(retained.properties) if retained.properties else ()
                if retained.expires_at is not None:
                    left = max(1, math.ceil(retained.expires_at - now))
                    stored = (
                        (p.MESSAGE_EXPIRY_INTERVAL, left),
                        *(x for x in stored if x[0] != p.MESSAGE_EXPIRY_INTERVAL),
                    )
                if options.identifier:
                    stored = (*stored, (p.SUBSCRIPTION_IDENTIFIER, options.identifier))
                properties = stored
            packet = p.Publish(retained.topic, retained.payload, qos, True, False, None, properties)
            if qos:
                if self._retained_waiting is None:
                    self._retained_waiting = deque()
                self._retained_waiting.append(packet)
            else:
                self._send_retained_packet(packet)
        self._send_waiting_retained()

    def _send_waiting_retained(self) -> None:
        """Retained QoS 1/2 messages go while the client's Receive Maximum has room."""
        waiting = self._retained_waiting
        while waiting and self.can_deliver():
            self._send_retained_packet(waiting.popleft())

    def _send_retained_packet(self, packet: p.Publish) -> None:
        """One retained message, with a packet id for QoS 1/2 (its own again, DUP set,
        when the session's last connection had sent it: §4.4); not sent when over the
        client's Maximum Packet Size (MQTT 5.0 §3.1.2.11.4)."""
        if packet.qos:
            packet_id = packet.packet_id
            record = self.record
            if (
                packet_id is None
                or packet_id in self.inflight
                or (record is not None and packet_id in record.awaiting_comp)
            ):
                packet = dataclasses.replace(packet, packet_id=self._packet_id(), dup=False)
            else:
                packet = dataclasses.replace(packet, dup=True)
        data = p.encode(packet, self.version)
        if len(data) > self.client_max_packet:
            return
        if packet.packet_id is not None:
            self.inflight[packet.packet_id] = _InFlight(None, None, packet.qos, packet)
        self.send(data)

    def _puback(self, packet: p.PubAck) -> None:
        flight = self.inflight.pop(packet.packet_id, None)
        if flight is None or flight.qos != 1:
            if flight is not None:
                self.inflight[packet.packet_id] = flight
            return  # an unknown id: nothing to do (mosquitto ignores it too)
        self._settled(flight)

    def _pubrec(self, packet: p.PubRec) -> None:
        """QoS 2, step 2: the client has the message; it leaves its queue and the
        packet id waits for PUBCOMP (kept in a persistent session's record)."""
        flight = self.inflight.pop(packet.packet_id, None)
        if flight is not None and flight.qos != 2:  # a PUBREC for a QoS 1 PUBLISH: ignored
            self.inflight[packet.packet_id] = flight
            return
        record = self.record
        assert record is not None
        if flight is not None and packet.reason_code < 0x80:
            record.awaiting_comp.add(packet.packet_id)
            if record.expiry_interval:
                MqttState.of(self.core).save_session(record)
            self.send_packet(p.PubRel(packet.packet_id))
        elif flight is None and packet.packet_id in record.awaiting_comp:
            self.send_packet(p.PubRel(packet.packet_id))
        elif flight is None:
            self.send_packet(p.PubRel(packet.packet_id, rc.PACKET_ID_NOT_FOUND if self.v5 else 0))
            return
        if flight is not None:
            self._settled(flight)

    def _pubcomp(self, packet: p.PubComp) -> None:
        assert self.record is not None
        if self._settle_id(self.record.awaiting_comp, packet.packet_id):
            self._resume()

    def _settled(self, flight: _InFlight) -> None:
        consumer, entry = flight.consumer, flight.entry
        if consumer is None or entry is None:  # a retained message sent on subscribe
            self._resume()
            return
        queue = consumer.queue
        queue.ack(entry)
        queue.counters.acknowledged += 1
        if self._retained_waiting:
            self._send_waiting_retained()
        queue.drain()
        if len(self.consumers) > 1:
            self._resume()

    def consumer_cancelled(self, consumer: MqttConsumer) -> None:
        """Its queue was deleted (an operator): the subscriptions it served are gone."""
        self.consumers.pop(consumer.queue.name, None)
        for packet_id, flight in list(self.inflight.items()):
            if flight.consumer is consumer:
                del self.inflight[packet_id]
        if consumer.shared is not None:
            self.subscriptions.pop(consumer.shared, None)
        else:
            for topic_filter in [f for f in self.subscriptions if not f.startswith("$share/")]:
                del self.subscriptions[topic_filter]
        self._match_cache.clear()
        self._save_subscriptions()

    def _end_consumer(
        self, consumer: MqttConsumer, keep_ids: dict[tuple[str, int], int] | None = None
    ) -> None:
        """Stop ``consumer``; what it had in flight goes back to its queue (redelivered),
        its packet ids noted in ``keep_ids`` for the session's next connection."""
        consumer.queue.remove_consumer(consumer)
        entries = []
        for packet_id, flight in list(self.inflight.items()):
            if flight.consumer is consumer:
                del self.inflight[packet_id]
                assert flight.entry is not None
                entries.append(flight.entry)
                if keep_ids is not None:
                    keep_ids[(consumer.queue.name, flight.entry.seq)] = packet_id
        if entries:
            consumer.queue.requeue(entries)

    # -- the rest of the packets -------------------------------------------------------
    def _pingreq(self, packet: p.PingReq) -> None:
        self.send_packet(p.PingResp())

    def _disconnect(self, packet: p.Disconnect) -> None:
        """A client's DISCONNECT: 0x00 drops the will, 0x04 keeps it (5.0); a Session
        Expiry Interval may change unless it was 0 (§3.14.2.2.2)."""
        record = self.record
        assert record is not None
        expiry = p.get_property(packet.properties, p.SESSION_EXPIRY_INTERVAL)
        if isinstance(expiry, int):
            if record.expiry_interval == 0 and expiry:
                raise MqttError("a session expiry interval set on DISCONNECT after 0 at CONNECT")
            record.expiry_interval = (
                min(expiry, self.settings.max_session_expiry) if expiry != NEVER else NEVER
            )
        self._clean_close = packet.reason_code != rc.DISCONNECT_WITH_WILL
        self.close_transport()

    def _auth(self, packet: p.Auth) -> None:
        """Re-authentication (MQTT 5.0 §4.12.1): AUTH 0x19 with the CONNECT's method
        (``PLAIN``: the same user's password checked again) is answered AUTH 0x00; a
        wrong password ends the connection (DISCONNECT 0x87)."""
        method = p.get_property(packet.properties, p.AUTHENTICATION_METHOD)
        if self._auth_method is None or packet.reason_code != 0x19 or method != self._auth_method:
            raise MqttError("AUTH without the connection's authentication method (§4.12)")
        if method == "PLAIN":
            data = p.get_property(packet.properties, p.AUTHENTICATION_DATA)
            parts = data.decode("utf-8", "replace").split("\0") if isinstance(data, bytes) else []
            assert self.user is not None
            try:
                if len(parts) != 3 or parts[1] != self.user.name:
                    raise AuthenticationError("re-authentication as another user")
                self.core.users.authenticate(parts[1], parts[2], self.from_loopback, "MQTT")
            except AuthenticationError as exc:
                self._login_refused(log, "MQTT", self.user.name, str(exc), protocol="mqtt")
                raise MqttError(str(exc), rc.NOT_AUTHORIZED) from None
        self.send_packet(p.Auth(rc.SUCCESS, ((p.AUTHENTICATION_METHOD, method),)))

    # -- keep alive, alarms, closing ---------------------------------------------------
    def _connect_timeout(self) -> None:
        if self.state in ("connecting", "refusing"):
            log.warning("MQTT connection %s: no CONNECT within %ss", self.peer, self.settings.connect_timeout)
            self.close_transport(abort=True)

    def _check_keep_alive(self) -> None:
        """A client silent for 1.5 times its keep alive is disconnected (§3.1.2.10);
        time it is not read (an alarm, flow control) does not count."""
        if self.state != "connected":
            return
        allowed = self.keep_alive * 1.5
        if self.blocked:
            self.last_received = self.loop.time()
        silent = self.loop.time() - self.last_received
        if silent >= allowed and not (self._input_waiting is not None and self._input_waiting()):
            log.info(
                "MQTT connection %s (%s): keep alive of %d s expired",
                self.peer,
                self.client_id,
                self.keep_alive,
            )
            self._disconnect_client(rc.KEEP_ALIVE_TIMEOUT, "keep alive timeout")
            return
        self._timer = self.loop.call_later(max(0.05, allowed - silent), self._check_keep_alive)

    def _block(self) -> None:
        if self.flow_held:
            self.flow_held = False
        elif not self.blocked:
            self.blocked = True
            self.transport.pause_reading()

    def hold_for_flow(self) -> None:
        """A PUBLISH arrived while the store lags (:mod:`leveret.core.flow`): read no
        more from this connection until it has caught up (MQTT has no way to say so)."""
        if not self.blocked:
            self.blocked = self.flow_held = True
            self.transport.pause_reading()
            self.core.flow.hold(self)

    def flow_released(self) -> None:
        if self.flow_held:
            self.flow_held = False
            self.blocked = False
            if self._rest is None and self.state == "connected":
                self.transport.resume_reading()

    def on_alarm(self, active: bool) -> None:
        """A resource alarm blocks publishers when they publish (as RabbitMQ); its end
        reads them again."""
        if not active and self.blocked and not self.flow_held:
            self.blocked = False
            if self._rest is None:
                self.transport.resume_reading()

    def on_vhost_deleted(self, name: str) -> None:
        """The vhost is being deleted: DISCONNECT 0x98 Administrative action (5.0)."""
        self._disconnect_client(rc.ADMINISTRATIVE_ACTION, f"vhost '{name}' is deleted")

    def close_by_operator(self, reason: str) -> None:
        """An operator closed it: DISCONNECT 0x98 Administrative action (5.0)."""
        self._disconnect_client(rc.ADMINISTRATIVE_ACTION, reason)

    def close(self, reply_code: int = 320, text: str = "broker shutting down") -> None:
        """Close from the broker's side: shutdown (DISCONNECT 0x8B) or an internal
        error (0x83)."""
        code = rc.IMPLEMENTATION_SPECIFIC if reply_code == 541 else rc.SERVER_SHUTTING_DOWN
        self._disconnect_client(code, text)

    def refuse_before_login(self) -> None:
        """More came before CONNECT than may (counted by the server): close."""
        self.close_transport()

    def _refuse_unauthenticated(self, text: str) -> None:
        """Over the login throttle's cap: closed before a byte is read (MQTT lets the
        server send nothing before CONNECT)."""
        self.state = "closed"
        self.transport.close()

    def _release(self) -> None:
        """The connection is over: its consumers stop (what was in flight goes back to
        its queue, redelivered), the will is sent or waits for its delay, and the
        session waits for its expiry or ends now (at once, without its will, when its
        vhost is being deleted)."""
        self._timer.cancel()
        self.reader = p.PacketReader()
        self._rest = None
        keep_ids: dict[tuple[str, int], int] = {}
        for consumer in list(self.consumers.values()):
            self._end_consumer(consumer, keep_ids)
        self.consumers.clear()
        if self.publisher is not None:
            self.publisher.close()
        record = self.record
        vhost_deleted = self.vhost is not None and self.core.vhosts.get(self.vhost.name) is not self.vhost
        if record is not None and self.life is not None and vhost_deleted:
            SessionTimers.of(self.core).expire(self.key)  # no will, no session left
            self._end_life()
        elif record is not None and self.life is not None:
            key = self.key
            timers = SessionTimers.of(self.core)
            if self.will is not None and not self._clean_close:
                self._schedule_will(timers, key, record.expiry_interval)
            record.subscriptions = dict(self.subscriptions)
            if record.expiry_interval:
                timers.keep_packet_ids(key, keep_ids)
                retained = [f.packet for f in self.inflight.values() if f.packet is not None]
                timers.keep_retained(key, retained + list(self._retained_waiting or ()))
                record.disconnected_at = self.core.clock.time()
                MqttState.of(self.core).save_session(record)
            self._end_life()  # an exclusive session queue goes here
            timers.expire_after(key, record.expiry_interval)
        else:
            self._end_life()
        self.inflight.clear()
        self._retained_waiting = None

    def _schedule_will(self, timers: SessionTimers, key: tuple[str, str], expiry: int) -> None:
        """The will goes now, or after its Will Delay Interval if the session lasts
        that long (MQTT 5.0 §3.1.3.2.2)."""
        will = self.will
        session = self.session
        assert will is not None and session is not None
        client_id, exchange_name = self.client_id, self.settings.exchange
        core = self.core

        def publish() -> None:
            publish_will(core, session, exchange_name, client_id, will)

        delay = p.get_property(will.properties, p.WILL_DELAY_INTERVAL)
        delay = int(delay) if isinstance(delay, int) else 0
        if delay and expiry:
            timers.delay_will(key, min(delay, expiry) if expiry != NEVER else delay, publish)
        else:
            publish()

    # -- the broker's connection registry (core.connections) -------------------------
    def facts(self) -> ConnectionFacts:
        """This connection as management shows it: protocol ``MQTT 3.1.1``/``MQTT 5.0``,
        its client id, keep alive and session in ``client_properties``, one channel
        with its consumers (as RabbitMQ's MQTT plugin shows one)."""
        peer_host, peer_port = self.peer_address()
        record = self.record
        expiry = record.expiry_interval if record is not None else 0
        channel = ChannelFacts(
            number=1,
            confirm=True,
            transactional=False,
            messages_unacknowledged=len(self.inflight),
            consumers=tuple(
                ConsumerFacts(c.tag, c.queue.name, True, False, self.send_window, {})
                for c in self.consumers.values()
            ),
        )
        return ConnectionFacts(
            peer_host=peer_host,
            peer_port=peer_port,
            host=self.local[0],
            port=self.local[1],
            protocol=PROTOCOL_NAMES[self.version],
            user=self.user.name if self.user is not None else "",
            vhost=self.vhost.name if self.vhost is not None else "",
            connected_at=self.connected_at,
            client_properties={
                "client_id": self.client_id,
                "keep_alive": self.keep_alive,
                "session_expiry_interval": expiry,
                "clean_session": expiry == 0,
                "subscriptions": len(self.subscriptions),
            },
            auth_mechanism="EXTERNAL" if self.certificate_user else "PLAIN",
            heartbeat=self.keep_alive,
            ssl=self.tls,
            state=("flow" if self.flow_held else "blocked")
            if self.blocked
            else ("running" if self.state == "connected" else self.state),
            channels=(channel,),
        )


def publish_will(core: Any, session: Session, exchange_name: str, client_id: str, will: p.Will) -> None:
    """Publish ``will`` as its client would have, with the client's permissions (a
    refused one is logged and dropped); a retained will is retained too."""
    routing_key = to_routing_key(will.topic)
    publisher = Publisher(session, _WillEvents(), counted=False)
    try:
        exchange = publisher.exchange(exchange_name, routing_key)
    except BrokerError as exc:
        log.info("MQTT %s: will to %r not published: %s", client_id, will.topic, exc.text)
        return
    expiry = p.get_property(will.properties, p.MESSAGE_EXPIRY_INTERVAL)
    ttl = int(expiry) * 1000 if isinstance(expiry, int) else None
    encoded = encode_publish(will.qos, will.retain, client_id, will.properties)
    if will.retain:
        state = MqttState.of(core)
        if will.payload:
            block = encoded[3 + len(client_id.encode()) :]
            expires_at = core.clock.time() + expiry if isinstance(expiry, int) else None
            state.retain(
                session.vhost.name, RetainedMessage(will.topic, will.payload, will.qos, block, expires_at)
            )
        else:
            state.clear_retained(session.vhost.name, will.topic)
    message = Message(exchange_name, routing_key, will.payload, MQTT, encoded, will.qos > 0, ttl)
    publisher.publish(exchange, message)
    publisher.close()


_HANDLERS: dict[type, Any] = {
    p.Publish: MqttConnection._publish,
    p.PubAck: MqttConnection._puback,
    p.PubRec: MqttConnection._pubrec,
    p.PubRel: MqttConnection._pubrel,
    p.PubComp: MqttConnection._pubcomp,
    p.Subscribe: MqttConnection._subscribe,
    p.Unsubscribe: MqttConnection._unsubscribe,
    p.PingReq: MqttConnection._pingreq,
    p.Disconnect: MqttConnection._disconnect,
    p.Auth: MqttConnection._auth,
}
