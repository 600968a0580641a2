"""One STOMP 1.0-1.2 connection, sans-I/O, with ActiveMQ 5.17's semantics.

The server feeds it bytes (:meth:`StompConnection.data_received`) and gives it the same
transport, loop and ``request_flush`` callback an AMQP connection gets: both are
:class:`~leveret.protocol.adapter.AdapterConnection`, whose life in the broker (login
throttle, registry, alarms, vhost deletion) is :mod:`leveret.core.lifecycle`'s; CONNECT
runs its own sequence of checks (login, vhost, access, client-id). Everything a client
asks goes through core: its :class:`~leveret.core.session.Session` (users, permissions
and their RabbitMQ texts), one :class:`~leveret.core.publish.Publisher` (confirm mode:
a RECEIPT for a persistent SEND goes out once the message is on disk) and one more per
open transaction.

Errors follow STOMP 1.2: an ERROR frame (``message`` header, ``receipt-id`` when the
failing frame asked for a receipt, a short text body), then the connection is closed;
other clients are not touched. See ``shared/reference/stomp-activemq.md`` for the
ActiveMQ behaviour this follows and where leveret differs.

Until CONNECT is complete at most :data:`leveret.protocol.prelogin.MAX_BYTES` are held
(more: ERROR "Frame too large before login"), CONNECT must come within 30 s, and
heart-beat intervals are agreed at 1 s at least (:mod:`leveret.protocol.prelogin`).
"""

from __future__ import annotations

import logging
import re
import secrets
from collections import deque
from collections.abc import Callable, Sequence
from typing import ClassVar

from ...core.access import Access
from ...core.auth import AuthenticationError
from ...core.clock import Timer
from ...core.connections import ChannelFacts, ConnectionFacts, ConsumerFacts
from ...core.errors import BrokerError
from ...core.lifecycle import ClientIdInUse, ConnectionRefused
from ...core.message import Message
from ...core.publish import Publisher
from ...core.queues import Queue, QueuedMessage
from ...core.selector import Selector, SelectorError, compile_selector
from ...core.session import Session
from ...version import __version__
from .. import prelogin
from ..adapter import AdapterConnection
from ..turns import TurnBudget
from . import destinations
from .destinations import TEMP_QUEUE_PREFIX, TEMP_TOPIC_PREFIX, Destination
from .frames import HEARTBEAT, Frame, FrameError, FrameParser, encode, escape, message_head
from .message import (
    STOMP,
    MessageIds,
    decode_block,
    destination_of,
    from_send,
    header_block,
    is_text,
    queue_destination,
)
from .subscription import ACK_MODES, QUEUE_PREFETCH, TOPIC_PREFETCH, Subscription

log = logging.getLogger("leveret.stomp")

VERSIONS = ("1.0", "1.1", "1.2")
CONNECT_TIMEOUT = prelogin.STOMP_CONNECT_TIMEOUT  # seconds to send CONNECT (ActiveMQ's default)
#: ActiveMQ's virtual topics: a queue ``Consumer.<group>.VirtualTopic.<name>`` gets a copy
#: of every message sent to the topic ``VirtualTopic.<name>`` once it exists.
VIRTUAL_TOPIC_CONSUMER = re.compile(r"^Consumer\.[^.]+\.(VirtualTopic\..+)$")
_TOO_MUCH = f"more than {prelogin.MAX_BYTES} bytes came before the CONNECT frame was complete"
BROWSE_LIMIT = 400  # messages a queue browser sees (ActiveMQ's maxBrowsePageSize)


def durable_queue_name(client_id: str, name: str) -> str:
    """The queue holding durable topic subscription ``name`` of ``client_id``."""
    return f"durable.{client_id}.{name}"


_NEVER = 1 << 62  # a commit barrier's publish seq until its commit is on disk


class _Pending:
    """A RECEIPT that waits: for publish ``needed`` to be confirmed, in order with the
    others; ``own`` when it is that SEND's receipt; ``then`` runs after it is sent (a
    DISCONNECT's close). A commit barrier has no receipt id until its commit is done."""

    __slots__ = ("needed", "own", "receipt_id", "then")

    def __init__(
        self, needed: int, receipt_id: str | None, own: bool, then: Callable[[], None] | None
    ) -> None:
        self.needed = needed
        self.receipt_id = receipt_id
        self.own = own
        self.then = then


class StompError(Exception):
    """Something the client did wrong: ERROR with this message, then close."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail


class StompConnection(AdapterConnection):
    """State machine of one STOMP client connection: ``connecting`` until CONNECT (or
    STOMP), ``refusing`` while a wrong login's ERROR waits for the login throttle,
    ``connected``, then ``closed``."""

    def _init_protocol(self) -> None:
        self.state = "connecting"
        self.version = "1.0"
        self.publisher: Publisher | None = None
        self.client_id: str | None = None
        self.session_id = ""
        self.subscriptions: dict[str, list[Subscription]] = {}
        self.transactions: dict[str, Publisher] = {}
        #: delivery number -> its subscription, for every unacknowledged MESSAGE
        self.deliveries: dict[int, Subscription] = {}
        #: 1.0/1.1 ACK by message-id: (subscription, message-id) -> delivery number, and back
        self.message_ids: dict[tuple[str, str], int] = {}
        self._id_of: dict[int, tuple[str, str]] = {}
        self._delivery_seq = 0
        #: receipts waiting for publishes to be confirmed: (publish seq, receipt-id, is
        #: that SEND's own receipt, then-callback)
        self._receipts: deque[_Pending] = deque()
        self._confirmed = 0
        self._ids: MessageIds | None = None
        self._uid = secrets.token_hex(6)  # names this connection's temporary destinations
        # the rest of a read whose turn's budget ran out (see protocol/turns.py), else None
        self._rest: list[Frame | None] | None = None
        self._disconnecting = False  # DISCONNECT came: nothing more is read
        self._erred = False  # the broker sent ERROR: the client did not vanish
        self.parser = FrameParser()
        self._timer: Timer = self.loop.call_later(CONNECT_TIMEOUT, self._connect_timeout)
        self._send_timer: Timer | None = None
        self._read_interval = 0.0  # seconds between client heart-beats (0: none)
        self._send_interval = 0.0

    # -- what the server asks -----------------------------------------------------------
    @property
    def reading_paused(self) -> bool:
        """Whether reading waits on this connection's account (a resource alarm, flow
        control, the rest of a read left for the next turn)."""
        return self.blocked or self._rest is not None

    @property
    def quiet(self) -> bool:
        """Nothing queued to send, connected: reads may be coalesced."""
        return not self._flush_requested and self.state == "connected" and not self.blocked

    # -- output (see protocol/output.py) -----------------------------------------------
    def send_frame(self, command: str, headers: dict[str, str], body: bytes = b"") -> None:
        self.send(encode(command, headers, body, self.version))

    def _resume(self) -> None:
        for subscriptions in list(self.subscriptions.values()):
            for subscription in subscriptions:
                subscription.queue.drain()

    # -- input --------------------------------------------------------------------------
    def data_received(self, data: bytes, whole: bool = False) -> None:
        """Feed bytes read from the socket; frames are handled in order, over several
        loop turns when they take long (protocol/turns.py) unless ``whole``, and the
        first error ends the connection (ERROR frame, then close)."""
        self.last_received = self.loop.time()
        if self.state == "closed":
            return
        if self.state == "refusing":  # a wrong login waits for its ERROR: nothing more is read
            return
        try:
            frames = self.parser.feed(data)
        except FrameError as exc:
            self._error(str(exc), None)
            return
        if (
            self.state == "connecting"
            and prelogin.over_limit(self.parser.buffered)
            and not any(frame is not None and frame.command in ("CONNECT", "STOMP") for frame in frames)
        ):  # no CONNECT yet, and more held than one may be (see protocol/prelogin.py)
            self._error("Frame too large before login", None, _TOO_MUCH)
            return
        if self._rest is not None:  # behind what waits for the next turn
            self._rest += frames
            return
        self._run(frames, whole)

    def _run(self, frames: list[Frame | None], whole: bool = False) -> None:
        budget = TurnBudget(0 if whole else len(frames), self.core.clock.monotonic)
        for i, frame in enumerate(frames):
            if budget.spent():  # the rest in a later turn (see protocol/turns.py)
                self._defer(frames[i:])
                return
            if frame is HEARTBEAT:
                continue
            assert frame is not None
            self._handle(frame)
            if self.state == "closed":
                return
            if self.state == "refusing":  # the rest is dropped with the connection
                return

    def _defer(self, frames: list[Frame | None]) -> None:
        self._rest = frames
        self.transport.pause_reading()
        self.loop.call_soon(self._next_turn)

    def _next_turn(self) -> None:
        """Go on with the frames a read left over when its turn's budget ran out."""
        rest, self._rest = self._rest, None
        if self.state == "closed" or rest is None:
            return
        self._run(rest)
        if self._rest is None and not self.blocked and self.state == "connected" and not self._disconnecting:
            self.transport.resume_reading()

    def _handle(self, frame: Frame) -> None:
        receipt = frame.headers.get("receipt")
        try:
            try:
                self._dispatch(frame)
            except BrokerError as exc:
                raise StompError(exc.text) from None
        except StompError as exc:
            self._error(exc.message, receipt, exc.detail)
            return
        # (a handler that sent the receipt itself, or will, took the header out)
        receipt = frame.headers.get("receipt")
        if receipt is not None and frame.command not in ("CONNECT", "STOMP", "DISCONNECT"):
            self._receipt(receipt, frame.command == "SEND" and "transaction" not in frame.headers)

    def _dispatch(self, frame: Frame) -> None:
        command = frame.command
        if self.state == "connecting":
            if command in ("CONNECT", "STOMP"):
                self._connect(frame)
                return
            raise StompError("Not connected", f"a {command[:20]} frame came before CONNECT")
        handler = self._HANDLERS.get(command)
        if handler is None:
            if command in ("CONNECT", "STOMP"):
                raise StompError("Already connected")
            raise StompError(f"Unknown STOMP action: {command[:40]}")
        handler(self, frame)

    # -- CONNECT ------------------------------------------------------------------------
    def _connect(self, frame: Frame) -> None:
        headers = frame.headers
        self.version = _negotiate(headers.get("accept-version"))
        self.parser.version = self.version
        heart_beat = _heart_beat(headers.get("heart-beat", "0,0"))
        self._login(frame, heart_beat)

    def _refuse_unauthenticated(self, text: str) -> None:
        """Over the login throttle's cap of unauthenticated connections per address: an
        ERROR frame (``Too many unauthenticated connections``) and close, before a byte
        is read (STOMP lets the server send ERROR at any time)."""
        self._error("Too many unauthenticated connections", None, text)

    def _login(self, frame: Frame, heart_beat: tuple[int, int]) -> None:
        """Authenticate login/passcode (no login: ``guest``, as RabbitMQ's STOMP
        ``default_user``), pick the vhost (the ``host`` header when a vhost has that
        name, else ``/``), register ``client-id``; CONNECTED."""
        headers = frame.headers
        login = headers.get("login", "guest")
        try:
            user = self.core.users.authenticate(
                login, headers.get("passcode", "guest"), self.from_loopback, "STOMP"
            )
        except AuthenticationError as exc:
            delay = self._login_refused(log, "STOMP", login, str(exc), protocol="stomp")
            if not delay:
                raise StompError("Authentication failed", str(exc)) from None
            # the ERROR waits for the login throttle's slot; nothing more is read
            self.state = "refusing"
            self.transport.pause_reading()
            self._timer.cancel()
            receipt, detail = headers.get("receipt"), str(exc)
            self._timer = self.loop.call_later(
                delay, lambda: self._error("Authentication failed", receipt, detail)
            )
            return
        self._login_accepted()
        host = headers.get("host", "/")
        vhost = self.core.vhosts.get(host) or self.core.vhosts.get("/")
        if vhost is None:
            raise StompError("Virtual host not found", f"vhost {host} not found")
        if not self.core.users.may_access(user, vhost.name):
            raise StompError(
                "Access refused", f"access to vhost '{vhost.name}' refused for user '{user.name}'"
            )
        client_id = headers.get("client-id")
        try:  # the vhost's max-connections, then the client-id (ActiveMQ: unique)
            self._open_life(user, vhost, f"STOMP {self.version}", client_id)
        except ClientIdInUse as exc:
            raise StompError("Client ID in use", exc.text) from None
        except ConnectionRefused as exc:
            raise StompError("Access refused", exc.text) from None
        self.client_id = client_id
        self.session = Session(vhost, Access(self.core.users, user, vhost.name), self)
        self.publisher = Publisher(self.session, self)
        self.publisher.select_confirms()
        self.session_id = client_id or f"{self.peer}-{id(self):x}"
        # the connection's own part keeps ids unique when a client-id reconnects
        self._ids = MessageIds(f"{self.session_id}-{self._uid}")
        self.state = "connected"
        self._timer.cancel()
        # at least HEARTBEAT_FLOOR ms either way (RabbitMQ's STOMP: one second)
        client_sends, client_wants = map(prelogin.heartbeat_interval, heart_beat)
        self._read_interval = client_sends / 1000
        self._send_interval = client_wants / 1000
        connected = {
            "version": self.version,
            "session": self.session_id,
            "server": f"leveret/{__version__}",
            "heart-beat": f"{client_wants},{client_sends}",
        }
        self.send_frame("CONNECTED", connected)
        if self._read_interval:
            self._timer = self.loop.call_later(
                self._read_interval * self.core.limits.stomp_heartbeat_grace, self._check_heartbeat
            )
        if self._send_interval:
            self._send_timer = self.loop.call_later(self._send_interval, self._send_heartbeat)

    # -- the broker's connection registry (core.connections) -------------------------
    def facts(self) -> ConnectionFacts:
        """This connection as management shows it: RabbitMQ's STOMP plugin shows a
        STOMP connection with one channel."""
        peer_host, peer_port = self.peer_address()
        subscriptions = [sub for group in self.subscriptions.values() for sub in group]
        channel = ChannelFacts(
            number=1,
            confirm=True,
            transactional=bool(self.transactions),
            messages_unacknowledged=len(self.deliveries),
            consumers=tuple(
                ConsumerFacts(sub.tag, sub.queue.name, not sub.no_ack, sub.exclusive, sub.prefetch, {})
                for sub in subscriptions
            ),
        )
        return ConnectionFacts(
            peer_host=peer_host,
            peer_port=peer_port,
            host=self.local[0],
            port=self.local[1],
            protocol=f"STOMP {self.version}",
            user=self.user.name if self.user is not None else "",
            vhost=self.vhost.name if self.vhost is not None else "",
            connected_at=self.connected_at,
            client_properties=self.client_properties,
            heartbeat=int(self._read_interval),
            ssl=self.tls,
            state=("flow" if self.flow_held else "blocked")
            if self.blocked
            else ("running" if self.state == "connected" else self.state),
            channels=(channel,),
        )

    def close_by_operator(self, reason: str) -> None:
        """An operator closed it (management's DELETE): an ERROR frame with the
        reason, then the socket."""
        self.close(320, reason)

    # -- SEND ---------------------------------------------------------------------------
    def _send(self, frame: Frame) -> None:
        """Publish to every destination named; a persistent message's receipt waits
        for the disk. During a resource alarm the connection is read no more (STOMP has
        no connection.blocked) until it ends."""
        headers = frame.headers
        targets = destinations.parse(headers.get("destination", ""))
        publisher = self._publisher_for(headers.get("transaction"))
        self._reply_to(headers)
        core = self.core
        if core.alarm_active:
            self._block()
        elif core.flow.active:
            self.hold_for_flow()
        assert self._ids is not None
        message_id = self._ids.next()
        for target in targets:
            exchange_name, routing_key = self._send_address(target)
            exchange = publisher.exchange(exchange_name, routing_key)
            publisher.publish(
                exchange, from_send(exchange_name, routing_key, headers, frame.body, message_id)
            )

    def _send_address(self, target: Destination) -> tuple[str, str]:
        target = self._resolve(target)
        if target.kind == "queue":
            self._queue(target)
            return "", target.name
        return target.exchange, target.name

    def _resolve(self, target: Destination) -> Destination:
        """A ``/temp-queue/N`` or ``/temp-topic/N`` as this connection's own queue or
        topic (their names are unique to the connection); others as they are."""
        if target.kind == "temp-queue":
            return Destination("queue", TEMP_QUEUE_PREFIX + self._uid + "." + target.name, "", target.text)
        if target.kind == "temp-topic":
            name = TEMP_TOPIC_PREFIX + self._uid + "." + target.name
            return Destination("topic", name, destinations.TOPIC_EXCHANGE, target.text, False)
        return target

    def _reply_to(self, headers: dict[str, str]) -> None:
        """A ``reply-to`` naming a temporary destination of this connection is rewritten
        to the name other connections send to (ActiveMQ's ``/remote-temp-queue/``), and
        the temporary queue is made if need be."""
        reply_to = headers.get("reply-to", "")
        if not reply_to.startswith(("/temp-queue/", "/temp-topic/")):
            return
        target = self._resolve(destinations.parse(reply_to)[0])
        if target.kind == "queue":
            self._queue(target)
            headers["reply-to"] = "/remote-temp-queue/" + target.name
        else:
            headers["reply-to"] = "/remote-temp-topic/" + target.name

    def _publisher_for(self, transaction: str | None) -> Publisher:
        if transaction is None:
            assert self.publisher is not None
            return self.publisher
        publisher = self.transactions.get(transaction)
        if publisher is None:
            raise StompError("Invalid transaction id", f"transaction '{transaction}' was not begun")
        return publisher

    def _queue(self, target: Destination) -> Queue:
        """The queue a ``/queue/`` destination names, created durable (with the STOMP
        redelivery and dead-letter defaults) when missing, as ActiveMQ creates it."""
        session = self.session
        assert session is not None
        queue = session.vhost.queues.get(target.name)
        if queue is not None:
            return queue
        if not target.create:  # RabbitMQ's /amq/queue/, a gone temporary queue: NotFound
            return session.vhost.get_queue(target.name, self)
        if target.name.startswith(TEMP_QUEUE_PREFIX):  # ours (others' are not created)
            return session.declare_queue(target.name, exclusive=True)
        queue = session.declare_queue(target.name, durable=True, defaults=self.core.auto_queue_arguments)
        virtual = VIRTUAL_TOPIC_CONSUMER.match(target.name)
        if virtual is not None:  # ActiveMQ's virtual topic: this group gets its own copy
            session.bind(destinations.TOPIC_EXCHANGE, "queue", queue.name, virtual.group(1))
        return queue

    # -- receipts and publisher events ----------------------------------------------------
    def _receipt(self, receipt_id: str, own: bool, then: Callable[[], None] | None = None) -> None:
        """RECEIPT once every publish so far is safe (on disk when it must be), and
        every transaction committed before it too."""
        assert self.publisher is not None
        needed = self.publisher.seq
        if needed <= self._confirmed and not self._receipts:
            self.send_frame("RECEIPT", {"receipt-id": receipt_id})
            if then is not None:
                then()
        else:
            self._receipts.append(_Pending(needed, receipt_id, own, then))

    def _commit_barrier(self) -> _Pending:
        """A place in the receipts' queue for a commit on its way to disk: receipts
        asked for after it wait for it (:meth:`_committed` lifts it)."""
        barrier = _Pending(_NEVER, None, False, None)
        self._receipts.append(barrier)
        return barrier

    def confirms_ready(self) -> None:
        assert self.publisher is not None
        confirms = self.publisher.take_confirms()
        if confirms is not None:
            self._release_receipts(confirms[0])

    def _release_receipts(self, upto: int) -> None:
        self._confirmed = max(self._confirmed, upto)
        receipts = self._receipts
        while receipts and receipts[0].needed <= self._confirmed and self.state == "connected":
            pending = receipts.popleft()
            if pending.receipt_id is not None:
                self.send_frame("RECEIPT", {"receipt-id": pending.receipt_id})
            if pending.then is not None:
                pending.then()

    def rejected(self, seq: int, before: tuple[int, bool] | None) -> None:
        """A publish was refused (a failed write, a full queue): a SEND that asked for
        a receipt gets ERROR instead (the client must not count on it)."""
        if before is not None:
            self._release_receipts(before[0])
        for pending in self._receipts:
            if pending.needed == seq and pending.own:
                self._error(
                    "Message not accepted", pending.receipt_id, "the broker could not take the message"
                )
                return
        self._confirmed = max(self._confirmed, seq - 1)
        self._release_receipts(seq)

    def returned(self, exchange: str, message: Message) -> None:
        """Never called: STOMP publishes are not mandatory."""

    # -- SUBSCRIBE / UNSUBSCRIBE --------------------------------------------------------
    def _subscribe(self, frame: Frame) -> None:
        headers = frame.headers
        destination = headers.get("destination", "")
        targets = destinations.parse(destination)
        sub_id = headers.get("id")
        if sub_id is None:
            if self.version != "1.0":
                raise StompError("Subscription id missing", "SUBSCRIBE needs an id header from STOMP 1.1 on")
            sub_id = destination
        if sub_id in self.subscriptions:
            raise StompError("Duplicate subscription id", f"subscription '{sub_id}' already exists")
        ack_mode = headers.get("ack", "auto")
        if ack_mode not in ACK_MODES:
            raise StompError(
                "Invalid ack mode", f"ack mode '{ack_mode}' is not one of {', '.join(ACK_MODES)}"
            )
        selector = self._selector(headers)
        exclusive = headers.get("activemq.exclusive") == "true"
        priority = _int_header(headers, "activemq.priority", 0)
        if headers.get("browser") == "true":
            self._browse(sub_id, targets, headers, selector)
            return
        made = []
        try:
            for target in targets:
                target = self._resolve(target)
                queue, temporary = self._subscription_queue(target, headers)
                prefetch = _int_header(
                    headers,
                    "activemq.prefetchSize",
                    QUEUE_PREFETCH if target.kind == "queue" else TOPIC_PREFETCH,
                )
                if any(c.exclusive and not isinstance(c, Subscription) for c in queue.consumers):
                    raise StompError(  # an AMQP exclusive consumer holds it
                        "Exclusive consumer in use",
                        f"queue '{queue.name}' in vhost '{queue.host.name}' in exclusive use",
                    )
                subscription = Subscription(
                    self,
                    sub_id,
                    target.text,
                    queue,
                    ack_mode,
                    max(1, prefetch),
                    exclusive,
                    temporary,
                    selector,
                    priority,
                )
                subscription.on_topic = target.kind != "queue"
                if subscription.temporary or target.kind != "queue":
                    # a topic subscription's queue keeps only what it will deliver
                    queue.admit = selector
                queue.prepare_consumer(subscription)
                made.append(subscription)
        except (StompError, BrokerError):
            for subscription in made:
                if subscription.temporary and self.session is not None:
                    self.session.vhost.delete_queue(subscription.queue.name)
            raise
        self.subscriptions[sub_id] = made
        receipt = headers.pop("receipt", None)
        if receipt is not None:  # at once, before the first MESSAGE (it promises no write)
            self.send_frame("RECEIPT", {"receipt-id": receipt})
        for subscription in made:
            subscription.queue.add_consumer(subscription)

    def _selector(self, headers: dict[str, str]) -> Selector | None:
        """The subscription's filter: its ``selector`` (header strings compare with
        numbers as numbers, as ActiveMQ's STOMP does) and, with ``activemq.noLocal``,
        not what this connection sent (as ActiveMQ adds a NoLocalExpression), so a
        message it does not want stays for other consumers."""
        text = headers.get("selector")
        if text is not None:
            try:
                compile_selector(text, convert_strings=True)
            except SelectorError as exc:
                raise StompError("Invalid selector", str(exc)) from None
            text = f"({text})"
        if headers.get("activemq.noLocal") == "true" and self._ids is not None:
            prefix = "".join("!" + c if c in "!%_" else c for c in self._ids.prefix).replace("'", "''")
            mine = f"NOT (JMSMessageID LIKE '{prefix}%' ESCAPE '!')"
            text = mine if text is None else f"{text} AND {mine}"
        return compile_selector(text, convert_strings=True) if text is not None else None

    def _browse(
        self, sub_id: str, targets: Sequence[Destination], headers: dict[str, str], selector: Selector | None
    ) -> None:
        """A queue browser (``browser:true``): the messages waiting, as MESSAGE frames,
        left in the queue (at most ActiveMQ's maxBrowsePageSize, 400), then one MESSAGE
        with ``browser:end``. Nothing stays subscribed."""
        receipt = headers.pop("receipt", None)
        if receipt is not None:
            self.send_frame("RECEIPT", {"receipt-id": receipt})
        for target in targets:
            target = self._resolve(target)
            if target.kind != "queue":
                raise StompError("Only queues can be browsed", f"'{target.text}' is not a queue")
            session = self.session
            assert session is not None
            queue = session.readable_queue(target.name)
            for entry in queue.browse(BROWSE_LIMIT, selector):
                self._message(sub_id, queue, entry, None)
        self.send_frame("MESSAGE", {"subscription": sub_id, "message-id": "", "browser": "end"})

    def _subscription_queue(self, target: Destination, headers: dict[str, str]) -> tuple[Queue, bool]:
        """A queue destination's queue; for a topic (or exchange) a new exclusive,
        auto-delete queue bound to it, which ends with the subscription, or with
        ``activemq.subscriptionName`` a durable subscription (:meth:`_durable_queue`)."""
        session = self.session
        assert session is not None
        if target.kind == "queue":
            self._queue(target)
            return session.readable_queue(target.name), False
        name = headers.get("activemq.subscriptionName")
        if name is not None:
            return self._durable_queue(target, name), False
        queue = session.declare_queue("", exclusive=True, auto_delete=True)
        try:
            key = target.binding_key if target.kind == "topic" else target.name
            session.bind(target.exchange, "queue", queue.name, key)
        except BrokerError:
            session.vhost.delete_queue(queue.name)
            raise
        return queue, True

    def _subscription_to(self, destination: str) -> str:
        """STOMP 1.0's UNSUBSCRIBE by destination: the id of a subscription to it."""
        for sub_id, group in self.subscriptions.items():
            if sub_id == destination or any(sub.destination == destination for sub in group):
                return sub_id
        return destination

    def _durable_queue(self, target: Destination, name: str) -> Queue:
        """The queue of durable subscription ``name`` of this connection's client-id
        (ActiveMQ's identity): durable, bound to the topic, kept while nobody
        subscribes (persistent messages across restarts too); one consumer at a time."""
        session = self.session
        assert session is not None
        if self.client_id is None:
            raise StompError(
                "Durable subscription needs a client-id", "CONNECT with a client-id header first"
            )
        queue_name = durable_queue_name(self.client_id, name)
        existing = session.vhost.queues.get(queue_name)
        if existing is not None and existing.consumers:
            raise StompError("Durable consumer is in use", f"subscription '{name}' has an active consumer")
        session.declare_queue(queue_name, durable=True, defaults=self.core.auto_queue_arguments)
        key = target.binding_key if target.kind == "topic" else target.name
        session.bind(target.exchange, "queue", queue_name, key)
        return session.readable_queue(queue_name)

    def _unsubscribe(self, frame: Frame) -> None:
        headers = frame.headers
        sub_id = headers.get("id")
        if sub_id is None:
            if self.version != "1.0" or "destination" not in headers:
                raise StompError("Subscription id missing", "UNSUBSCRIBE needs an id header")
            sub_id = self._subscription_to(headers["destination"])
        subscriptions = self.subscriptions.pop(sub_id, None)
        durable = headers.get("activemq.subscriptionName")
        if subscriptions is None and durable is None:
            raise StompError("No subscription matched", f"no subscription '{sub_id}'")
        for subscription in subscriptions or ():
            self._end_subscription(subscription)
        if durable is not None:  # ActiveMQ: UNSUBSCRIBE with the name destroys it
            self._destroy_durable(durable)

    def _destroy_durable(self, name: str) -> None:
        session = self.session
        assert session is not None
        if self.client_id is None:
            raise StompError(
                "Durable subscription needs a client-id", "CONNECT with a client-id header first"
            )
        queue = session.vhost.queues.get(durable_queue_name(self.client_id, name))
        if queue is None:
            return
        if queue.consumers:
            raise StompError("Durable consumer is in use", f"subscription '{name}' has an active consumer")
        session.delete_queue(queue.name)

    def _end_subscription(self, subscription: Subscription, failed: bool = False) -> None:
        """Stop deliveries and give back what it did not acknowledge (redelivered;
        ``failed``: as failed deliveries); a standby exclusive subscription takes over."""
        subscription.queue.remove_consumer(subscription)
        if subscription.exclusive:
            subscription.queue.drain()
        unacked = list(subscription.unacked.items())
        subscription.unacked.clear()
        for number, _ in unacked:
            self._forget(number)
        if unacked:
            subscription.queue.requeue([entry for _, entry in unacked], failed)

    def subscription_cancelled(self, subscription: Subscription) -> None:
        """Its queue was deleted: forget the subscription."""
        subscriptions = self.subscriptions.get(subscription.id)
        if subscriptions is not None and subscription in subscriptions:
            subscriptions.remove(subscription)
            if not subscriptions:
                del self.subscriptions[subscription.id]
        for number in subscription.unacked:
            self._forget(number)
        subscription.unacked.clear()

    # -- MESSAGE ------------------------------------------------------------------------
    def deliver(self, subscription: Subscription, entry: QueuedMessage) -> None:
        """One MESSAGE to ``subscription`` (called through its queue)."""
        queue = subscription.queue
        counters = queue.counters
        if subscription.no_ack:
            queue.ack(entry)
            number = None
            counters.delivered_consume_auto_ack += 1
        else:
            self._delivery_seq += 1
            number = self._delivery_seq
            subscription.unacked[number] = entry
            self.deliveries[number] = subscription
            counters.delivered_consume_manual_ack += 1
        if entry.redelivered:
            counters.redelivered += 1
        self._message(subscription.id, queue, entry, number, subscription)

    def _message(
        self,
        sub_id: str,
        queue: Queue,
        entry: QueuedMessage,
        number: int | None,
        subscription: Subscription | None = None,
    ) -> None:
        """Write ``entry`` as a MESSAGE of subscription ``sub_id``; ``number`` is the
        delivery's number when it waits for an ACK; ``subscription`` is None for a
        browser's copy."""
        message = entry.message
        block = header_block(message, entry.expires_at, f"ID:{queue.name}:{entry.seq}")
        version = self.version
        origin = destination_of(message)
        if subscription is not None and subscription.on_topic:
            start = (
                f"MESSAGE\ndestination:{escape(origin, version)}\nsubscription:{escape(sub_id, version)}\n"
            )
        else:
            # from a queue, ActiveMQ names the queue; a message sent elsewhere (a virtual
            # topic's copy, a dead letter) also says where it was sent
            here = queue_destination(queue.name)
            known = subscription.frame_start if subscription is not None else None
            if known is None:
                known = (
                    f"MESSAGE\ndestination:{escape(here, version)}\nsubscription:{escape(sub_id, version)}\n"
                )
                if subscription is not None:
                    subscription.frame_start = known  # the same for every MESSAGE it gets
            start = known
            if here != origin and not message.deaths:  # a dead letter has its own
                start += f"original-destination:{escape(origin, version)}\n"
        ack = None
        if number is not None:
            if version == "1.2":
                ack = number
            else:
                key = (sub_id, _message_id(message, block))
                self.message_ids[key] = number
                self._id_of[number] = key
        body = message.body
        length = None if is_text(message) else len(body)
        if version != "1.2" and b"\\" in block:
            block = _reescape(block, version)
        head = message_head(start, ack, entry.redelivered, queue.delivery_headers(entry), length, block)
        self.send_parts([head, body, b"\x00"], len(body))

    # -- ACK / NACK -----------------------------------------------------------------------
    def _ack(self, frame: Frame) -> None:
        self._settle(frame, None)

    def _nack(self, frame: Frame) -> None:
        if self.version == "1.0":
            raise StompError("Unknown STOMP action: NACK", "NACK exists from STOMP 1.1 on")
        # RabbitMQ's header: requeue:false dead-letters at once; else the redelivery policy
        self._settle(frame, frame.headers.get("requeue", "true") != "false")

    def _settle(self, frame: Frame, requeue: bool | None) -> None:
        """ACK (``requeue`` None) or NACK a delivery, in a transaction at COMMIT. The
        ``client`` ack mode settles every earlier delivery of the subscription too."""
        number = self._delivery_number(frame)
        subscription = self.deliveries.get(number) if number is not None else None
        if subscription is None or number is None:
            name = "id" if self.version == "1.2" else "message-id"
            # ActiveMQ's text, which says message-id whatever the version
            raise StompError(
                f"Unexpected {frame.command} received for message-id [{frame.headers.get(name, '')}]"
            )
        transaction = frame.headers.get("transaction")
        if transaction is not None:
            self._publisher_for(transaction).defer(self._settle_now, subscription, number, requeue)
        else:
            self._settle_now(subscription, number, requeue)

    def _delivery_number(self, frame: Frame) -> int | None:
        headers = frame.headers
        if self.version == "1.2":
            try:
                return int(headers.get("id", ""))
            except ValueError:
                return None
        message_id = headers.get("message-id", "")
        sub_id = headers.get("subscription")
        if sub_id is not None:  # 1.1 names the subscription
            return self.message_ids.get((sub_id, message_id))
        for candidate in self.subscriptions:  # 1.0 does not
            number = self.message_ids.get((candidate, message_id))
            if number is not None:
                return number
        return None

    def _forget(self, number: int) -> None:
        """Delivery ``number`` is settled or given back: no ACK may name it now."""
        self.deliveries.pop(number, None)
        key = self._id_of.pop(number, None)
        if key is not None and self.message_ids.get(key) == number:
            del self.message_ids[key]

    def _settle_now(self, subscription: Subscription, number: int, requeue: bool | None) -> None:
        unacked = subscription.unacked
        if number not in unacked:  # settled meanwhile (a transaction's second ACK)
            return
        if subscription.ack_mode == "client":
            taken = []
            while unacked:
                current, entry = unacked.popitem(last=False)
                taken.append((current, entry))
                if current == number:
                    break
        else:
            taken = [(number, unacked.pop(number))]
        for current, _ in taken:
            self._forget(current)
        queue = subscription.queue
        entries = [entry for _, entry in taken]
        if requeue is None:
            for entry in entries:
                queue.ack(entry)
            queue.counters.acknowledged += len(entries)
        elif requeue:
            queue.requeue(entries, failed=True)  # a NACK: a failed delivery, as ActiveMQ counts it
        else:
            for entry in entries:
                queue.discard(entry, "rejected")
        queue.drain()

    # -- transactions -------------------------------------------------------------------
    def _begin(self, frame: Frame) -> None:
        name = _required(frame, "transaction")
        if name in self.transactions:
            raise StompError("Transaction already started", f"transaction '{name}' is already open")
        assert self.session is not None
        publisher = Publisher(self.session, self, counted=False)  # the connection's publisher counts
        publisher.select_transaction()
        self.transactions[name] = publisher

    def _commit(self, frame: Frame) -> None:
        """Run the transaction's SENDs and ACKs; its RECEIPT once they are on disk."""
        name = _required(frame, "transaction")
        publisher = self.transactions.pop(name, None)
        if publisher is None:
            raise StompError("Invalid transaction id", f"transaction '{name}' was not begun")
        receipt = frame.headers.pop("receipt", None)
        barrier = self._commit_barrier()
        publisher.commit(lambda ok: self._committed(ok, receipt, barrier))  # (a closed one would not call)

    def _committed(self, ok: bool, receipt: str | None, barrier: _Pending) -> None:
        """The transaction is on disk (or failed): its receipt, and the receipts behind
        it, may go."""
        if self.state != "connected":
            return
        if not ok:
            self._error("Transaction not committed", receipt, "the store could not write it")
            return
        assert self.publisher is not None
        barrier.needed = self.publisher.seq  # and what was published before the COMMIT
        barrier.receipt_id = receipt
        self._release_receipts(self._confirmed)

    def _abort(self, frame: Frame) -> None:
        """Drop the transaction's SENDs; its ACKs never happened (the messages stay
        with their subscription, as ActiveMQ keeps them)."""
        name = _required(frame, "transaction")
        publisher = self.transactions.pop(name, None)
        if publisher is None:
            raise StompError("Invalid transaction id", f"transaction '{name}' was not begun")
        publisher.close()

    # -- DISCONNECT, errors, closing ----------------------------------------------------------
    def _disconnect(self, frame: Frame) -> None:
        receipt = frame.headers.get("receipt")
        self._disconnecting = True
        self.transport.pause_reading()
        if receipt is None:
            self.close_transport()
        else:  # after everything before it is safe
            self._receipt(receipt, False, self.close_transport)

    def _error(self, message: str, receipt: str | None, detail: str = "") -> None:
        """ERROR (with ``receipt-id`` when the failing frame asked for a receipt), then
        close once it is written."""
        if self.state == "closed":
            return
        log.info("STOMP connection %s: ERROR %s %s", self.peer, message, detail)
        headers = {"message": message[:1000], "content-type": "text/plain"}
        if receipt is not None:
            headers["receipt-id"] = receipt
        body = (detail or message)[:4000].encode()
        headers["content-length"] = str(len(body))
        self.send(encode("ERROR", headers, body, self.version))
        self._erred = True
        self.close_transport()

    def refuse_before_login(self) -> None:
        """More came before CONNECT than may (:data:`leveret.protocol.prelogin.MAX_BYTES`,
        counted by the server, as Web STOMP does): ERROR, then close."""
        self._error("Frame too large before login", None, _TOO_MUCH)

    def _block(self) -> None:
        if self.flow_held:  # held by flow control already: now by the alarm
            self.flow_held = False
        elif not self.blocked:
            self.blocked = True
            self.transport.pause_reading()

    def hold_for_flow(self) -> None:
        """A SEND arrived while the store lags (:mod:`leveret.core.flow`): read no more
        from this connection until the store has caught up (as ActiveMQ's producer flow
        control, which stops reading a producer without telling it)."""
        if not self.blocked:
            self.blocked = self.flow_held = True
            self.transport.pause_reading()
            self.core.flow.hold(self)

    def flow_released(self) -> None:
        """The store caught up: read again, unless a resource alarm holds the
        connection or the rest of a read waits for the next turn."""
        if self.flow_held:
            self.flow_held = False
            self.blocked = False
            if self._rest is None and self.state == "connected" and not self._disconnecting:
                self.transport.resume_reading()

    def on_alarm(self, active: bool) -> None:
        """The alarm ended: read from a blocked connection again (one held by flow
        control waits for the flow's end: :meth:`flow_released`)."""
        if not active and self.blocked and not self.flow_held:
            self.blocked = False
            if self._rest is None:  # else the next turn resumes reading
                self.transport.resume_reading()

    def on_vhost_deleted(self, name: str) -> None:
        """This connection's vhost is being deleted: an ERROR frame, then close."""
        self._error("Virtual host deleted", None, f"vhost '{name}' is deleted")

    def _connect_timeout(self) -> None:
        if self.state in ("connecting", "refusing"):
            log.warning("STOMP connection %s: no CONNECT within %ss", self.peer, CONNECT_TIMEOUT)
            self.close_transport(abort=True)

    def _check_heartbeat(self) -> None:
        """Drop a client silent for its heart-beat interval times the grace factor (the
        time it is not read, blocked by an alarm or held by flow control, does not
        count: its heart-beats wait unread, and RabbitMQ pauses its monitor likewise)."""
        if self.state != "connected":
            return
        allowed = self._read_interval * self.core.limits.stomp_heartbeat_grace
        if self.blocked:
            self.last_received = self.loop.time()
        silent = self.loop.time() - self.last_received
        if silent > allowed and not (self._input_waiting is not None and self._input_waiting()):
            log.warning("STOMP connection %s: no heart-beat for %.1f s", self.peer, silent)
            self.close_transport(abort=True)
            return
        self._timer = self.loop.call_later(max(0.05, allowed - silent), self._check_heartbeat)

    def _send_heartbeat(self) -> None:
        if self.state != "connected":
            return
        if self.loop.time() - self.last_sent >= self._send_interval * 0.9 and not self._out:
            self.send(b"\n")
        self._send_timer = self.loop.call_later(self._send_interval, self._send_heartbeat)

    def close(self, reply_code: int = 320, text: str = "broker shutting down") -> None:
        """Close from the broker's side (shutdown): ERROR, then the socket."""
        if self.state == "connected":
            self._error("Connection closed by the broker", None, text)
        else:
            self.close_transport()

    def _release(self) -> None:
        """Open transactions roll back, unacknowledged messages come back
        (redelivered), temporary queues go (once). A client that vanished (its socket
        closed, or silent past the heart-beat, without DISCONNECT) failed its
        deliveries: they count toward the delivery limit, as RabbitMQ 4.3 counts a
        consumer that went down; after DISCONNECT or the broker's ERROR they are plain
        returns."""
        vanished = not (self._disconnecting or self._erred)
        self._timer.cancel()
        if self._send_timer is not None:
            self._send_timer.cancel()
        # what was read and not handled goes now: the connection lives on in reference
        # cycles until the garbage collector's next full pass (100 MB per socket, once)
        self.parser = FrameParser()
        self._rest = None
        for publisher in self.transactions.values():
            publisher.close()
        self.transactions.clear()
        if self.publisher is not None:
            self.publisher.close()
        subscriptions, self.subscriptions = self.subscriptions, {}
        for group in subscriptions.values():
            for subscription in group:
                self._end_subscription(subscription, vanished)
        self.deliveries.clear()
        self.message_ids.clear()
        self._id_of.clear()
        self._end_life()

    _HANDLERS: ClassVar[dict[str, Callable[[StompConnection, Frame], None]]] = {
        "SEND": _send,
        "SUBSCRIBE": _subscribe,
        "UNSUBSCRIBE": _unsubscribe,
        "ACK": _ack,
        "NACK": _nack,
        "BEGIN": _begin,
        "COMMIT": _commit,
        "ABORT": _abort,
        "DISCONNECT": _disconnect,
    }


def _negotiate(accept_version: str | None) -> str:
    """The highest version both sides speak (absent: 1.0); StompError if none."""
    if accept_version is None:
        return "1.0"
    offered = {v.strip() for v in accept_version.split(",")}
    for version in reversed(VERSIONS):
        if version in offered:
            return version
    raise StompError("Invalid Protocol version", f"supported versions are {','.join(VERSIONS)}")


def _heart_beat(value: str) -> tuple[int, int]:
    """The CONNECT ``heart-beat`` pair (ms the client can send, ms it wants)."""
    try:
        sends, wants = (int(part.strip()) for part in value.split(","))
    except ValueError:
        raise StompError(
            "Invalid heart-beat header", f"heart-beat '{value[:40]}' is not two integers"
        ) from None
    if sends < 0 or wants < 0:
        raise StompError("Invalid heart-beat header", f"heart-beat '{value[:40]}' is negative")
    return sends, wants


def _required(frame: Frame, name: str) -> str:
    value = frame.headers.get(name)
    if value is None:
        raise StompError(f"Missing {name} header", f"{frame.command} needs a {name} header")
    return value


def _int_header(headers: dict[str, str], name: str, default: int) -> int:
    value = headers.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise StompError(f"Invalid {name} header", f"{name} '{value[:40]}' is not an integer") from None


def _message_id(message: Message, block: bytes) -> str:
    """The ``message-id`` a MESSAGE carries (its block's first line when sent over
    STOMP)."""
    if message.format is STOMP and block.startswith(b"message-id:"):
        return decode_block(block[: block.index(b"\n") + 1])["message-id"]
    return decode_block(block).get("message-id", "")


def _reescape(block: bytes, version: str) -> bytes:
    """A stored (1.2-escaped) header block as ``version`` writes headers."""
    headers = decode_block(block)
    return "".join(f"{escape(k, version)}:{escape(v, version)}\n" for k, v in headers.items()).encode()
