"""One AMQP 1.0 connection, sans-I/O, with RabbitMQ 4's model (its "AMQP 1.0" docs).

The server feeds it bytes (:meth:`Amqp10Connection.data_received`) as it feeds the other
adapters (:class:`~leveret.protocol.adapter.AdapterConnection`). The connection goes

- ``header``: the client's protocol header. SASL's (``AMQP\\x03\\x01\\x00\\x00``) is
  answered with ours and the mechanisms; anything else (plain AMQP without SASL, TLS
  in-band, another version) with the SASL header, then the socket closes (§2.2): as
  RabbitMQ 4, a client must authenticate with SASL;
- ``sasl``: one ``sasl-init``: PLAIN, ANONYMOUS (the ``anonymous_login_user``, ``guest``
  by default, as RabbitMQ 4; refused from other hosts as guest is), EXTERNAL with a
  verified client certificate. A refusal is ``sasl-outcome`` code 1 (auth), after the
  login throttle's wait, then the socket closes;
- ``amqp-header``: the AMQP header again (§5.3.2), answered with ours;
- ``opening``: ``open``: its hostname names the vhost (``vhost:NAME``, or the name of
  an existing vhost, else ``/``, as RabbitMQ 4). A vhost the user may not use is
  refused with ``open`` then ``close`` ``amqp:unauthorized-access`` (§2.4.1);
- ``open``: sessions (:mod:`.session`) on their channels; ``close`` is answered and the
  socket closes;
- ``closed``.

The client has :data:`~leveret.protocol.prelogin.HANDSHAKE_TIMEOUT` (10 s) to open, and
frames are at most 512 bytes until then (§2.7.1). Heartbeats (§2.4.5): an empty frame
goes out when nothing else did for half the client's ``idle-time-out``; the broker
announces :data:`IDLE_TIME_OUT` and closes a client silent for twice that with
``amqp:resource-limit-exceeded``. A framing or decode error closes the connection with
``close`` carrying the condition (``amqp:connection:framing-error``,
``amqp:decode-error``, ``amqp:invalid-field``); other connections are not touched.
"""

from __future__ import annotations

import logging
import platform
from typing import Any

from ...core.access import Access
from ...core.auth import AuthenticationError, User
from ...core.clock import Timer
from ...core.connections import ChannelFacts, ConnectionFacts, SessionFacts
from ...core.lifecycle import ConnectionRefused
from ...core.session import Session
from ...version import __version__
from .. import prelogin
from ..adapter import AdapterConnection
from ..turns import TurnBudget
from . import errors as e, performatives as perf
from .frames import (
    AMQP_HEADER,
    EMPTY_FRAME,
    PROTOCOL_AMQP,
    PROTOCOL_SASL,
    SASL_HEADER,
    TYPE_AMQP,
    TYPE_SASL,
    FastTransfer,
    Frame,
    FrameReader,
    ProtocolHeader,
    as_frame,
    encode_frame,
)
from .info import session_facts
from .session import Amqp10Session
from .types import DecodeError, Symbol

log = logging.getLogger("leveret.amqp10")

PROTOCOL = "AMQP 1.0"
#: Bytes: the largest frame the broker takes and announces (RabbitMQ 4's default
#: ``frame_max`` for AMQP 1.0, 128 KiB). Larger messages come in several transfers.
MAX_FRAME_SIZE = 128 * 1024
#: The highest channel number a client may use (RabbitMQ 4 allows 64 sessions).
CHANNEL_MAX = 63
#: Milliseconds the broker announces as its idle-time-out (RabbitMQ 4's 60 s heartbeat).
IDLE_TIME_OUT = 60_000
#: The smallest ``idle-time-out`` of a client the broker heartbeats for, in ms (a
#: shorter one would have it write empty frames all the time).
MIN_PEER_IDLE_TIME_OUT = 1000
MECHANISMS = ("PLAIN", "ANONYMOUS")
#: RabbitMQ 4's ``anonymous_login_user``/``anonymous_login_pass``.
ANONYMOUS_USER = ("guest", "guest")
#: The RabbitMQ version the open frame announces (as product ``RabbitMQ``): the RabbitMQ 4
#: model leveret follows, which rabbitmq-amqp-python-client checks (leveret's own version
#: is in the ``information`` property).
RABBITMQ_VERSION = "4.2.0"
#: The broker's container-id (RabbitMQ 4 sends its node name, ``rabbit@host``).
CONTAINER_ID = f"leveret@{platform.node() or 'localhost'}"
OFFERED_CAPABILITIES = (Symbol("LINK_PAIR_V1_0"), Symbol("ANONYMOUS-RELAY"))


class Amqp10Connection(AdapterConnection):
    """State machine of one AMQP 1.0 client connection (see the module doc)."""

    def _init_protocol(self) -> None:
        self.state = "header"
        self.reader = FrameReader()
        #: Sessions by the client's channel number.
        self.sessions: dict[int, Amqp10Session] = {}
        self._our_channels: set[int] = set()
        self.container_id = ""
        self.mechanism = ""
        self._login: User | None = None
        #: The largest frame the client takes (bytes; 512 until its open says more).
        self.peer_max_frame_size = 512
        self._peer_idle = 0.0  # seconds: the client's idle-time-out (0: none)
        self._rest: list[ProtocolHeader | Frame | FastTransfer] | None = None
        #: Bytes of unfinished multi-frame deliveries its links hold (see
        #: :data:`.links.MAX_PARTIAL_BYTES`).
        self.partial_bytes = 0
        self._timer: Timer = self.loop.call_later(prelogin.HANDSHAKE_TIMEOUT, self._handshake_timeout)
        self._heartbeat: Timer | None = None

    # -- what the server asks -------------------------------------------------------------
    @property
    def reading_paused(self) -> bool:
        return self.blocked or self._rest is not None

    @property
    def quiet(self) -> bool:
        return not self._flush_requested and self.state == "open" and not self.blocked

    def send_frame(self, body: Any, channel: int = 0, payload: bytes = b"", type_: int = TYPE_AMQP) -> None:
        self.send(encode_frame(body, channel, payload, type_))

    def _resume(self) -> None:
        for session in list(self.sessions.values()):
            session.resume()

    def _flushing(self) -> None:
        for session in self.sessions.values():
            if session.confirms_waiting:
                session.send_confirms()

    # -- input --------------------------------------------------------------------------
    def data_received(self, data: bytes, whole: bool = False) -> None:
        """Feed bytes read from the socket: frames are handled in order, over several
        loop turns when they take long (protocol/turns.py) unless ``whole``."""
        self.last_received = self.loop.time()
        if self.state in ("closed", "refusing"):
            return
        try:
            items = self.reader.read(data)
        except DecodeError as exc:
            self._fail(exc.condition, str(exc))
            return
        if self._rest is not None:
            self._rest += items
            return
        self._run(items, whole)

    def _run(self, items: list[ProtocolHeader | Frame | FastTransfer], whole: bool = False) -> None:
        budget = TurnBudget(0 if whole else len(items), self.core.clock.monotonic)
        sessions = self.sessions
        for i, item in enumerate(items):
            if budget.spent():
                self._rest = items[i:]
                self.transport.pause_reading()
                self.loop.call_soon(self._next_turn)
                return
            try:
                if isinstance(item, tuple):  # a transfer (frames.FastTransfer): the hot path
                    session = sessions.get(item[0]) if self.state == "open" else None
                    if session is not None:
                        session.transfer_item(item)
                    else:
                        self._frame(as_frame(item))
                elif isinstance(item, ProtocolHeader):
                    self._header(item)
                else:
                    self._frame(item)
            except e.ConnectionFault as exc:
                self._fail(exc.condition, exc.text)
            if self.state not in ("open", "header", "sasl", "amqp-header", "opening"):
                return

    def _next_turn(self) -> None:
        rest, self._rest = self._rest, None
        if self.state == "closed" or rest is None:
            return
        self._run(rest)
        if self._rest is None and not self.blocked and self.state == "open":
            self.transport.resume_reading()

    # -- protocol headers and SASL (§2.2, §5.3) -----------------------------------------
    def _header(self, header: ProtocolHeader) -> None:
        if self.state == "header" and header.protocol_id == PROTOCOL_SASL and header.supported:
            self.send(SASL_HEADER)
            mechanisms = MECHANISMS + (("EXTERNAL",) if self.certificate_user else ())
            self.send_frame(perf.SaslMechanisms(tuple(Symbol(m) for m in mechanisms)), type_=TYPE_SASL)
            self.state = "sasl"
        elif self.state == "amqp-header" and header.protocol_id == PROTOCOL_AMQP and header.supported:
            self.send(AMQP_HEADER)
            self.state = "opening"
        else:
            # §2.2: answer with the header we would take here, then close
            self.send(SASL_HEADER if self.state == "header" else AMQP_HEADER)
            log.info("AMQP 1.0 connection %s: protocol header %r refused", self.peer, header.to_bytes())
            self.close_transport()

    def _sasl_init(self, init: perf.SaslInit) -> None:
        mechanism = str(init.mechanism)
        response = init.initial_response or b""
        self.mechanism = mechanism
        users = self.core.users
        username: str | None = None
        try:
            if mechanism == "PLAIN":
                parts = response.split(b"\x00")
                if len(parts) != 3:
                    raise AuthenticationError("PLAIN response is not authzid NUL authcid NUL passwd")
                username = parts[1].decode("utf-8", "replace")
                user = users.authenticate(
                    username, parts[2].decode("utf-8", "replace"), self.from_loopback, "PLAIN"
                )
            elif mechanism == "ANONYMOUS":
                username = ANONYMOUS_USER[0]
                user = users.authenticate(*ANONYMOUS_USER, self.from_loopback, "ANONYMOUS")
            elif mechanism == "EXTERNAL" and self.certificate_user:
                username = self.certificate_user
                user = users.authenticate_external(self.certificate_user, self.from_loopback)
            else:
                raise AuthenticationError(f"SASL mechanism {mechanism[:40]} is not offered")
        except AuthenticationError as exc:
            delay = self._login_refused(log, mechanism, username, str(exc), protocol="amqp10")
            self.state = "refusing"
            self.transport.pause_reading()
            self._timer.cancel()
            self._timer = self.loop.call_later(delay, self._refuse_login)
            return
        self._login_accepted()
        self._login = user
        self.send_frame(perf.SaslOutcome(perf.SASL_OK), type_=TYPE_SASL)
        self.state = "amqp-header"

    def _refuse_login(self) -> None:
        """sasl-outcome ``auth`` (§5.3.3.6), then close."""
        if self.state == "closed":
            return
        self.send_frame(perf.SaslOutcome(perf.SASL_AUTH), type_=TYPE_SASL)
        self.close_transport()

    # -- frames ---------------------------------------------------------------------------
    def _frame(self, frame: Frame) -> None:
        body = frame.body
        if frame.type == TYPE_SASL:
            if self.state == "sasl" and isinstance(body, perf.SaslInit):
                self._sasl_init(body)
                return
            raise e.ConnectionFault(e.ILLEGAL_STATE, f"a SASL {type(body).__name__} frame here")
        if self.state == "opening":
            if not isinstance(body, perf.Open) or frame.channel != 0:
                raise e.ConnectionFault(e.ILLEGAL_STATE, "the first frame must be open, on channel 0")
            self._open(body)
            return
        if self.state != "open":
            raise e.ConnectionFault(e.ILLEGAL_STATE, f"a frame before the {self.state} is done")
        if body is None:  # an empty frame: a heartbeat
            return
        if isinstance(body, perf.Begin):
            self._begin(frame.channel, body)
        elif isinstance(body, perf.Close):
            self._peer_close(body)
        elif isinstance(body, perf.Open):
            raise e.ConnectionFault(e.ILLEGAL_STATE, "open came twice")
        else:
            session = self.sessions.get(frame.channel)
            if session is None:
                raise e.ConnectionFault(e.NOT_FOUND, f"channel {frame.channel} has no session")  # §2.7.2
            session.handle(body, frame.payload)

    def _open(self, open_: perf.Open) -> None:
        """open (§2.7.1): pick the vhost, register the connection, answer open."""
        user = self._login
        assert user is not None
        self.container_id = open_.container_id
        self.peer_max_frame_size = max(512, open_.max_frame_size)
        properties = open_.properties or {}
        self.client_properties = {str(k): _plain(v) for k, v in properties.items()}
        if open_.container_id:
            self.client_properties.setdefault("container_id", open_.container_id)
        vhost_name = _vhost_name(open_.hostname, self.core.vhosts)
        self.reader.max_frame_size = MAX_FRAME_SIZE
        self._answer_open()
        self.state = "open"
        self._timer.cancel()
        vhost = self.core.vhosts.get(vhost_name)
        if vhost is None:
            raise e.ConnectionFault(e.NOT_FOUND, f"vhost '{vhost_name}' not found")
        if not self.core.users.may_access(user, vhost.name):
            raise e.ConnectionFault(
                e.UNAUTHORIZED_ACCESS, f"access to vhost '{vhost.name}' refused for user '{user.name}'"
            )
        try:
            self._open_life(user, vhost, PROTOCOL, None)
        except ConnectionRefused as exc:
            raise e.ConnectionFault(e.RESOURCE_LIMIT_EXCEEDED, exc.text) from None
        self.session = Session(vhost, Access(self.core.users, user, vhost.name), self)
        idle = open_.idle_time_out
        if idle:
            self._peer_idle = max(idle, MIN_PEER_IDLE_TIME_OUT) / 1000
            self._heartbeat = self.loop.call_later(self._peer_idle / 2, self._send_heartbeat)
        self._timer = self.loop.call_later(IDLE_TIME_OUT / 1000, self._check_idle)

    def _answer_open(self) -> None:
        self.send_frame(
            perf.Open(
                container_id=CONTAINER_ID,
                max_frame_size=MAX_FRAME_SIZE,
                channel_max=CHANNEL_MAX,
                idle_time_out=IDLE_TIME_OUT,
                offered_capabilities=OFFERED_CAPABILITIES,
                properties={
                    # rabbitmq-amqp-python-client refuses a server whose product is
                    # not RabbitMQ or whose version is below 4.0.0, and enables its
                    # stream and SQL filter options by version (4.1.0, 4.2.0).
                    Symbol("product"): "RabbitMQ",
                    Symbol("version"): RABBITMQ_VERSION,
                    Symbol("information"): f"leveret {__version__}",
                    Symbol("platform"): "Python",
                },
            )
        )

    def _begin(self, channel: int, begin: perf.Begin) -> None:
        """begin (§2.7.2): a new session, on the lowest free channel of ours."""
        if channel in self.sessions:
            raise e.ConnectionFault(e.ILLEGAL_STATE, f"channel {channel} already has a session")
        if channel > CHANNEL_MAX:
            raise e.ConnectionFault(e.FRAMING_ERROR, f"channel {channel} is above channel-max {CHANNEL_MAX}")
        if begin.remote_channel is not None:
            raise e.ConnectionFault(e.NOT_ALLOWED, "the broker begins no sessions of its own")
        ours = next(n for n in range(CHANNEL_MAX + 1) if n not in self._our_channels)
        self._our_channels.add(ours)
        session = Amqp10Session(self, ours, channel, begin)
        self.sessions[channel] = session
        session.answer_begin()

    def session_ended(self, session: Amqp10Session) -> None:
        """``session`` is over (ended by either side): its channels are free again."""
        self.sessions.pop(session.remote_channel, None)
        self._our_channels.discard(session.channel)

    # -- closing --------------------------------------------------------------------------
    def _peer_close(self, close: perf.Close) -> None:
        """close (§2.7.9): answered, then the socket closes."""
        if close.error is not None:
            log.info("AMQP 1.0 connection %s closed by the client: %s", self.peer, close.error.condition)
        self.send_frame(perf.Close())
        self.close_transport()

    def _fail(self, condition: str, text: str) -> None:
        """Close the connection with an error: ``close`` carrying it when the
        connection is open (or being opened: §2.4.1 has open sent first), else the
        socket alone."""
        if self.state == "closed":
            return
        log.info("AMQP 1.0 connection %s: closed with %s: %s", self.peer, condition, text)
        if self.state == "opening":
            self._answer_open()
            self.state = "open"
        if self.state == "open":
            self.send_frame(perf.Close(perf.Error(condition, text[:1000])))
        self.close_transport()

    def close(self, reply_code: int = 320, text: str = "broker shutting down") -> None:
        """Close from the broker's side: shutdown (``amqp:connection:forced``) or an
        internal error (541: ``amqp:internal-error``)."""
        self._fail(e.INTERNAL_ERROR if reply_code == 541 else e.CONNECTION_FORCED, text)

    def close_by_operator(self, reason: str) -> None:
        """An operator closed it: ``close`` ``amqp:connection:forced`` with the reason."""
        self._fail(e.CONNECTION_FORCED, reason)

    def on_vhost_deleted(self, name: str) -> None:
        """The vhost is being deleted: ``close`` ``amqp:connection:forced``."""
        self._fail(e.CONNECTION_FORCED, f"vhost '{name}' is deleted")

    def refuse_before_login(self) -> None:
        """More came before open than may (counted by the server): close."""
        self.close_transport()

    def _refuse_unauthenticated(self, text: str) -> None:
        """Over the login throttle's cap: closed before a byte is read."""
        self.state = "closed"
        self.transport.close()

    def _handshake_timeout(self) -> None:
        if self.state in ("header", "sasl", "amqp-header", "opening", "refusing"):
            log.warning("AMQP 1.0 connection %s: not open within %ss", self.peer, prelogin.HANDSHAKE_TIMEOUT)
            self.close_transport(abort=True)

    def _check_idle(self) -> None:
        """A client silent for twice the broker's idle-time-out is closed (§2.4.5);
        the time it is not read (an alarm, flow control) does not count."""
        if self.state != "open":
            return
        allowed = 2 * IDLE_TIME_OUT / 1000
        if self.blocked:
            self.last_received = self.loop.time()
        silent = self.loop.time() - self.last_received
        if silent >= allowed and not (self._input_waiting is not None and self._input_waiting()):
            self._fail(
                e.RESOURCE_LIMIT_EXCEEDED, f"no frame for {silent:.0f} s (idle-time-out {IDLE_TIME_OUT} ms)"
            )
            return
        self._timer = self.loop.call_later(max(0.05, allowed - silent), self._check_idle)

    def _send_heartbeat(self) -> None:
        if self.state != "open":
            return
        if self.loop.time() - self.last_sent >= self._peer_idle / 2 * 0.9 and not self._out:
            self.send(EMPTY_FRAME)
        self._heartbeat = self.loop.call_later(self._peer_idle / 2, self._send_heartbeat)

    # -- alarms and flow control ----------------------------------------------------------
    def hold_for_flow(self) -> None:
        """A transfer arrived while the store lags (:mod:`leveret.core.flow`): read no
        more from this connection until it has caught up."""
        if not self.blocked:
            self.blocked = self.flow_held = True
            self.transport.pause_reading()
            self.core.flow.hold(self)

    def block_for_alarm(self) -> None:
        """A transfer arrived during a resource alarm: read no more until it ends
        (link credit is not renewed meanwhile either, as RabbitMQ 4 grants none)."""
        if self.flow_held:
            self.flow_held = False
        elif not self.blocked:
            self.blocked = True
            self.transport.pause_reading()

    def flow_released(self) -> None:
        if self.flow_held:
            self.flow_held = False
            self.blocked = False
            if self._rest is None and self.state == "open":
                self.transport.resume_reading()

    def on_alarm(self, active: bool) -> None:
        """The alarm ended: read again and renew the links' credit."""
        if not active and self.blocked and not self.flow_held:
            self.blocked = False
            if self._rest is None:
                self.transport.resume_reading()
        if not active:
            for session in list(self.sessions.values()):
                session.renew_credit()

    def _release(self) -> None:
        """The connection is over: every session ends (unsettled deliveries go back to
        their queues, redelivered), then its life in core."""
        self._timer.cancel()
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        self.reader = FrameReader()
        self._rest = None
        for session in self.sessions.values():
            session.stop_links()  # what one session gives back goes to no other
        for session in list(self.sessions.values()):
            session.release()
        self.sessions.clear()
        self._end_life()

    # -- the broker's connection registry (core.connections) -----------------------------
    def facts(self) -> ConnectionFacts:
        """This connection as management shows it: protocol ``AMQP 1.0``, a channel per
        session with its consumers (outgoing links), as RabbitMQ 4 lists sessions."""
        peer_host, peer_port = self.peer_address()
        channels: tuple[ChannelFacts, ...] = tuple(s.facts() for s in self.sessions.values())
        return ConnectionFacts(
            peer_host=peer_host,
            peer_port=peer_port,
            host=self.local[0],
            port=self.local[1],
            protocol=PROTOCOL,
            user=self.user.name if self.user is not None else "",
            vhost=self.vhost.name if self.vhost is not None else "",
            connected_at=self.connected_at,
            client_properties=self.client_properties,
            auth_mechanism=self.mechanism or "PLAIN",
            channel_max=CHANNEL_MAX,  # RabbitMQ 4: the highest channel number
            frame_max=self.peer_max_frame_size,  # RabbitMQ 4: the largest frame sent to the client
            heartbeat=int(self._peer_idle),
            ssl=self.tls,
            state=("flow" if self.flow_held else "blocked")
            if self.blocked
            else ("running" if self.state == "open" else self.state),
            channels=channels,
        )

    def session_facts(self) -> tuple[SessionFacts, ...]:
        """Its sessions and their links, as RabbitMQ 4's ``/api/connections/:name/sessions``
        shows them (:mod:`.info`)."""
        return session_facts(list(self.sessions.values()))


def _vhost_name(hostname: str | None, vhosts: Any) -> str:
    """The vhost an open's hostname names (RabbitMQ 4): ``vhost:NAME``, else the name
    of an existing vhost, else the default vhost ``/``."""
    if hostname is None:
        return "/"
    if hostname.startswith("vhost:"):
        return hostname[len("vhost:") :]
    return hostname if vhosts.get(hostname) is not None else "/"


def _plain(value: Any) -> Any:
    """A client property as JSON can show it."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)
