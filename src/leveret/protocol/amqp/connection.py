"""One AMQP 0-9-1 connection: handshake, channels, heartbeats, errors and close.

Sans-I/O at its edges, an :class:`~leveret.protocol.adapter.AdapterConnection` whose
life in the broker is :mod:`leveret.core.lifecycle`'s: the server feeds it bytes
(:meth:`Connection.data_received`) and gives it a
:class:`~leveret.protocol.transport.Transport` (``write``, ``close``, ``abort``,
``pause_reading``), a :class:`~leveret.protocol.transport.Loop` for time and timers, a
``request_flush`` callback through which output is written once per event-loop turn,
and optionally ``input_waiting``, which tells whether bytes wait unread on the socket
(the heartbeat check counts them as a sign of life). Handshake and reply codes
follow AMQP 0-9-1 §2.2.4 and RabbitMQ 3.10: a wrong protocol header is answered with
``AMQP\\x00\\x00\\x09\\x01`` and the socket closed; refused logins get
connection.close 403; hard errors (320, 5xx) close the connection, soft ones only the
channel.
"""

from __future__ import annotations

import logging
import platform
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pamqp import commands
from pamqp.base import Frame as Method

from ...amqp.errors import (
    ACCESS_REFUSED,
    CHANNEL_ERROR,
    COMMAND_INVALID,
    CONNECTION_FORCED,
    FRAME_ERROR,
    INTERNAL_ERROR,
    NOT_ALLOWED,
    UNEXPECTED_FRAME,
    AMQPConnectionError,
    ChannelError,
)
from ...amqp.frames import (
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    HEARTBEAT,
    PROTOCOL_HEADER,
    FrameError,
    FrameReader,
    decode_method,
    encode_delivery,
    encode_method,
    tune_ok_end,
)
from ...amqp.handoff import PARSED_PUBLISH, Fields, as_frames, parse_publishes
from ...core.access import Access
from ...core.auth import AuthenticationError
from ...core.clock import Timer
from ...core.connections import ChannelFacts, ConnectionFacts, ConsumerFacts
from ...core.errors import BrokerError
from ...core.lifecycle import ConnectionRefused
from ...core.session import Session
from ...version import __version__
from .. import prelogin
from ..adapter import AdapterConnection
from ..turns import TurnBudget
from .channel import Channel
from .errors import to_amqp
from .sasl import MECHANISMS, parse_response

if TYPE_CHECKING:
    from ...store import Store

log = logging.getLogger("leveret.amqp")

C = commands.Connection
_PUBLISH_IDS = (60, 40)
HANDSHAKE_TIMEOUT = prelogin.HANDSHAKE_TIMEOUT  # seconds, as RabbitMQ's handshake_timeout
CLOSE_TIMEOUT = 3.0  # seconds to wait for connection.close-ok
HEARTBEAT_RECHECK = 0.1  # seconds: long enough for the loop to poll its sockets once


def server_properties(cluster_name: str | None = None) -> dict:
    """connection.start's ``server-properties`` table (§1.4.2.1), with RabbitMQ's
    ``capabilities`` so clients enable confirms, consumer cancel notifications,
    connection.blocked and direct reply-to, and RabbitMQ's ``cluster_name`` when known
    (a federation downstream writes it in ``x-received-from``)."""
    properties: dict[str, Any] = {
        "product": "leveret",
        "version": __version__,
        "platform": f"Python {platform.python_version()}",
        "copyright": "leveret contributors",
        "information": "Licensed under the Apache License 2.0",
        "capabilities": {
            "publisher_confirms": True,
            "exchange_exchange_bindings": True,
            "basic.nack": True,
            "consumer_cancel_notify": True,
            "connection.blocked": True,
            "consumer_priorities": True,
            "authentication_failure_close": True,
            "per_consumer_qos": True,
            "direct_reply_to": True,
        },
    }
    if cluster_name:
        properties["cluster_name"] = cluster_name
    return properties


class Connection(AdapterConnection):
    """State machine of one client connection.

    States: ``header`` → ``start`` (start sent) → ``tune`` → ``open`` (awaiting
    connection.open) → ``opened``; ``refusing`` while a wrong password's refusal waits
    for the login throttle's slot (nothing is read); ``closing`` after
    connection.close is sent, ``closed`` at the end.
    """

    def _init_protocol(self) -> None:
        # EXTERNAL is offered when a verified TLS client certificate names a user.
        self.mechanisms = (("EXTERNAL",) if self.certificate_user else ()) + MECHANISMS
        self.state = "header"
        self.capabilities: dict[str, Any] = {}
        self.auth_mechanism = ""
        limits = self.core.limits
        self.channel_max = limits.channel_max
        self.frame_max = limits.frame_max
        self.heartbeat = 0
        self.channels: dict[int, Channel] = {}
        self.confirms_pending: set[Channel] = set()
        # until tune-ok a frame is at most 4,096 bytes, as RabbitMQ's (protocol/prelogin.py)
        self._reader = FrameReader(prelogin.AMQP_FRAME_MAX)
        self._header = b""
        self._timer: Timer = self.loop.call_later(HANDSHAKE_TIMEOUT, self._handshake_timeout)
        # Frames read while a reply waits for the store (wait_for_store), else None.
        self._stash: list[tuple[int, int, Any]] | None = None
        self._rechecking = False  # the missed-heartbeat verdict was deferred once

    @property
    def reading_paused(self) -> bool:
        """Whether this connection has a reason of its own not to be read now: blocked
        by a resource alarm or held by flow control, or a reply waiting for the store."""
        return self.blocked or self._stash is not None

    @property
    def quiet(self) -> bool:
        """Open, not blocked, and nothing queued to send: the last read asked for no
        answer, so reading the next one may wait a little (the server's read
        coalescing)."""
        return not self._flush_requested and self.state == "opened" and not self.reading_paused

    # -- output (see protocol/output.py) -------------------------------------------
    def confirm_later(self, channel: Channel) -> None:
        """``channel`` has publisher confirms to send: one basic.ack at the flush."""
        self.confirms_pending.add(channel)
        self._want_flush()

    def _flushing(self) -> None:
        """The turn's publisher confirms: one basic.ack per channel."""
        if self.confirms_pending:
            for channel in self.confirms_pending:
                if self.channels.get(channel.number) is channel and not channel.closing:
                    channel.flush_confirms()
            self.confirms_pending.clear()

    def send_method(self, channel: int, method: Method) -> None:
        """Queue ``method`` as a method frame on ``channel``."""
        self.send(encode_method(channel, method))

    def send_delivery(
        self,
        channel: int,
        consumer_tag: bytes,
        delivery_tag: int,
        redelivered: bool,
        exchange: str,
        routing_key: str,
        header: bytes,
        body: bytes,
    ) -> None:
        """Queue a basic.deliver with its content header and body frames
        (``consumer_tag`` UTF-8 encoded, ``header`` a content header payload)."""
        parts = encode_delivery(
            channel,
            consumer_tag,
            delivery_tag,
            redelivered,
            exchange,
            routing_key,
            header,
            body,
            self.frame_max,
        )
        self.send_parts(parts, len(body))

    # -- input ----------------------------------------------------------------------
    def data_received(self, data: bytes, whole: bool = False) -> None:
        """Feed bytes read from the socket: the protocol header first (§4.2.2), then
        frames, over several loop turns when they take long (protocol/turns.py), unless
        ``whole``: all of them now. Errors are answered here: channel.close for soft
        ones, connection.close for hard ones (a bad frame: 501, then the socket is
        closed). Anything else it raises is a bug in leveret (the server closes the
        connection with 541)."""
        self.last_received = self.loop.time()
        if self.state == "header":
            data = self._protocol_header(data)
            if not data:
                return
        if self.state == "closed" or self.state == "refusing":
            return
        rest = b""
        if self.state in ("start", "tune"):  # what follows tune-ok: read with its frame_max
            data, rest = self._split_after_tune_ok(data)
        try:
            # whole publishes parsed in one pass (compiled: amqp/_cframes.pyx), the
            # rest frame by frame
            frames = parse_publishes(self._reader.feed(data))
        except FrameError as exc:
            self._connection_error(exc, 0, 0)
            self.close_transport()
            return
        if self._stash is not None:  # a reply waits for the store: so does the rest
            self._stash += frames
        else:
            self._run_frames(frames, whole)
        if rest:
            self.data_received(rest, whole)

    def _split_after_tune_ok(self, data: bytes) -> tuple[bytes, bytes]:
        """``data`` cut after the connection.tune-ok frame in it, if there is one (a
        client may send tune-ok, open and more in one write): until tune-ok is handled
        frames are at most :data:`~leveret.protocol.prelogin.AMQP_FRAME_MAX` bytes, and
        the ones after it are read with the frame_max it chose, as RabbitMQ reads them.
        Only frame headers are looked at, and only up to that limit."""
        held = self._reader._buffer  # the start of a frame the last read did not complete
        stop = tune_ok_end(held + data if held else data, prelogin.AMQP_FRAME_MAX)
        if stop is None:
            return data, b""
        cut = stop - len(held)
        return data[:cut], data[cut:]

    def _run_frames(self, frames: list[tuple[int, int, Any]], whole: bool = False) -> None:
        i, count = 0, len(frames)
        budget = TurnBudget(0 if whole else count, self.core.clock.monotonic)
        while i < count:
            if self._stash is not None:  # the last frame made a reply wait for the store
                self._stash += frames[i:]
                return
            if budget.spent():  # the rest in a later turn (see protocol/turns.py)
                self._defer(frames[i:])
                return
            frame_type, number, payload = frames[i]
            if frame_type == PARSED_PUBLISH:  # a whole publish (amqp/handoff.py)
                if self._publish_parsed(number, payload):
                    i += 1
                    if self.state == "closed":
                        return
                else:  # not an ordinary publish: the frame path reports what is wrong
                    frames[i : i + 1] = as_frames(number, payload)
                    count = len(frames)
                continue
            i += 1
            try:
                try:
                    self._frame(frame_type, number, payload)
                except BrokerError as exc:
                    raise to_amqp(exc) from None
            except ChannelError as exc:
                self._channel_error(number, exc, payload if frame_type == FRAME_METHOD else None)
            except AMQPConnectionError as exc:
                class_id, method_id = _ids(payload) if frame_type == FRAME_METHOD else (0, 0)
                self._connection_error(exc, class_id, method_id)
            if self.state == "closed" or self.state == "refusing":
                return

    def wait_for_store(self, store: Store, callback: Callable[[bool], None]) -> None:
        """Run ``callback(ok)`` once ``store`` has written what is queued (a durable
        declare's -ok), reading and handling nothing else from this client until then,
        so replies keep their order."""
        self.wait_for(store.when_durable, callback)

    def wait_for(
        self, register: Callable[[Callable[[bool], None]], object], callback: Callable[[bool], None]
    ) -> None:
        """Run ``callback(ok)`` once ``register`` calls back the function it is given
        (``store.when_durable``; a queue's ``when_paged_in``, for a basic.get waiting
        for messages on their way from the store), reading and handling nothing else
        from this client until then, so replies keep their order."""
        self._stash = []
        self.transport.pause_reading()
        register(lambda ok: self._stored(ok, callback))

    def _defer(self, frames: list[tuple[int, int, Any]]) -> None:
        self._stash = frames
        self.transport.pause_reading()
        self.loop.call_soon(self._next_turn)

    def _next_turn(self) -> None:
        """Go on with the frames a read left over when its turn's budget ran out."""
        self._stored(True, lambda ok: None)

    def _stored(self, ok: bool, callback: Callable[[bool], None]) -> None:
        if self.state == "closed":
            return
        stash, self._stash = self._stash or [], None
        try:
            callback(ok)
            self._run_frames(stash)  # may wait again (and stash the rest)
        except Exception:  # a bug costs this connection only, not the store's callbacks
            log.exception("internal error on connection %s", self.peer)
            self.close(INTERNAL_ERROR, "internal error")
            return
        if self._stash is None and not self.blocked and self.state not in ("closed", "refusing"):
            self.transport.resume_reading()

    def _publish_parsed(self, number: int, fields: Fields) -> bool:
        """A whole publish, parsed (amqp/handoff.py: here, or by a connection worker):
        publish it and return True, or False if the channel is not ready for it (closed,
        closing, awaiting content) or it is over the size limit (the frame path then
        reports it). Its errors are reported against basic.publish, as the frame path's."""
        channel = self.channels.get(number)
        if (
            channel is None
            or channel.closing
            or channel.expecting_content
            or self.state != "opened"
            or len(fields[4]) > self.core.limits.max_message_size
        ):
            return False
        exchange, routing_key, mandatory, header, body, facts, _ = fields
        try:
            try:
                channel.publish_content(exchange, routing_key, mandatory, header, body, facts)
            except BrokerError as exc:
                raise to_amqp(exc) from None
        except ChannelError as exc:
            self._channel_error(number, exc, None)
        except AMQPConnectionError as exc:
            self._connection_error(exc, 0, 0)
        return True

    def _protocol_header(self, data: bytes) -> bytes:
        """Check the 8-byte protocol header (§4.2.2); returns the bytes after it."""
        self._header += data
        if len(self._header) < 8 and PROTOCOL_HEADER.startswith(self._header):
            return b""
        header, rest = self._header[:8], self._header[8:]
        self._header = b""
        if header != PROTOCOL_HEADER:
            self.transport.write(PROTOCOL_HEADER)
            self.close_transport()
            return b""
        self.state = "start"
        self.send_method(
            0,
            C.Start(
                version_major=0,
                version_minor=9,
                server_properties=server_properties(self.core.cluster_name()),
                mechanisms=" ".join(self.mechanisms),
                locales="en_US",
            ),
        )
        return rest

    def _frame(self, frame_type: int, number: int, payload: bytes) -> None:
        if frame_type == FRAME_METHOD:
            method = decode_method(payload)
            if number == 0:
                self._connection_method(method)
            else:
                self._channel_method(number, method)
        elif frame_type == FRAME_HEARTBEAT:
            if number != 0:
                raise AMQPConnectionError(FRAME_ERROR, f"heartbeat frame on channel {number}")
        else:
            channel = self._content_channel(frame_type, number)
            if channel is None:
                return
            try:
                try:
                    if frame_type == FRAME_HEADER:
                        channel.handle_header(payload)
                    else:
                        channel.handle_body(payload)
                except BrokerError as exc:
                    raise to_amqp(exc) from None
            except ChannelError as exc:  # a failed publish: reported against basic.publish
                self._channel_error(number, exc, None)

    def _content_channel(self, frame_type: int, number: int) -> Channel | None:
        kind = "content header" if frame_type == FRAME_HEADER else "content body"
        if number == 0 or self.state != "opened":
            raise AMQPConnectionError(UNEXPECTED_FRAME, f"unexpected {kind} frame on channel {number}")
        channel = self.channels.get(number)
        if channel is None:
            raise AMQPConnectionError(CHANNEL_ERROR, f"{kind} frame on closed channel {number}")
        return None if channel.closing else channel

    # -- channels -------------------------------------------------------------------
    def _channel_method(self, number: int, method: Method) -> None:
        if self.state != "opened":
            if self.state == "closing":
                return
            raise AMQPConnectionError(CHANNEL_ERROR, f"channel {number} used before connection.open")
        channel = self.channels.get(number)
        if isinstance(method, commands.Channel.Open):
            if channel is not None:
                raise AMQPConnectionError(CHANNEL_ERROR, "second 'channel.open' seen")
            # channel_max bounds how many channels are open at once, not their numbers
            # (RabbitMQ 3.10 opens channel 65535 under channel_max 2047); its 530 names
            # no method (class and method id 0).
            if self.channel_max and len(self.channels) >= self.channel_max:
                text = (
                    f"number of channels opened ({len(self.channels)}) has reached the "
                    f"negotiated channel_max ({self.channel_max})"
                )
                self._connection_error(AMQPConnectionError(NOT_ALLOWED, text), 0, 0)
                return
            self.channels[number] = Channel(self, number)
            self.send_method(number, commands.Channel.OpenOk())
            return
        if channel is None:
            raise AMQPConnectionError(CHANNEL_ERROR, f"expected 'channel.open' on channel {number}")
        if channel.closing:  # only the close handshake counts now (§1.5.2.5)
            if isinstance(method, (commands.Channel.CloseOk, commands.Channel.Close)):
                del self.channels[number]
                if isinstance(method, commands.Channel.Close):
                    self.send_method(number, commands.Channel.CloseOk())
            return
        if isinstance(method, commands.Channel.Close):
            del self.channels[number]
            channel.release()
            self.send_method(number, commands.Channel.CloseOk())
            return
        if channel.expecting_content:
            raise AMQPConnectionError(
                UNEXPECTED_FRAME, f"expected content header for class 60, got {method.name}"
            )
        if method.name.startswith("Connection."):  # RabbitMQ's words, whichever method
            raise AMQPConnectionError(COMMAND_INVALID, "unimplemented method")
        channel.handle_method(method)

    def _channel_error(self, number: int, exc: ChannelError, payload: bytes | None) -> None:
        self.fail(exc, number, _ids(payload) if payload is not None else _PUBLISH_IDS)

    def fail(self, exc: ChannelError, number: int, ids: tuple[int, int]) -> None:
        """Close channel ``number`` with ``exc``'s reply code, naming method ``ids``."""
        channel = self.channels.get(number)
        if channel is None or channel.closing:
            return
        class_id, method_id = ids
        channel.release()
        channel.closing = True
        self.send_method(
            number,
            commands.Channel.Close(
                reply_code=exc.reply_code,
                reply_text=exc.reply_text[:255],
                class_id=class_id,
                method_id=method_id,
            ),
        )

    # -- connection methods -----------------------------------------------------------
    def _connection_method(self, method: Method) -> None:
        if isinstance(method, C.Close):
            self._release_channels()  # closed in order: unacked messages are plain returns
            self.send_method(0, C.CloseOk())
            self.close_transport()
            return
        if self.state == "closing":
            if isinstance(method, C.CloseOk):
                self.close_transport()
            return
        state = self.state
        if state == "start" and isinstance(method, C.StartOk):
            self._start_ok(method)
        elif state == "tune" and isinstance(method, C.TuneOk):
            self._tune_ok(method)
        elif state == "open" and isinstance(method, C.Open):
            self._open(method)
        elif state == "opened" and isinstance(method, C.UpdateSecret):
            self._update_secret(method)
        elif not isinstance(method, (C.Blocked, C.Unblocked)):
            raise AMQPConnectionError(COMMAND_INVALID, f"unexpected {method.name} in state {self.state}")

    def _start_ok(self, m: C.StartOk) -> None:
        self.client_properties = m.client_properties or {}
        capabilities = self.client_properties.get("capabilities")
        self.capabilities = capabilities if isinstance(capabilities, dict) else {}
        if m.mechanism not in self.mechanisms:
            raise AMQPConnectionError(COMMAND_INVALID, f"unknown authentication mechanism '{m.mechanism}'")
        self._login(m)

    def _refuse_unauthenticated(self, text: str) -> None:
        """Over the login throttle's cap of unauthenticated connections per address:
        the socket is closed before a byte is read (AMQP lets the server say nothing
        before connection.start, and reading a start-ok is the work being refused)."""
        self.close_transport()

    def _login(self, m: C.StartOk) -> None:
        """Authenticate connection.start-ok: a right password gets connection.tune at
        once; a wrong one connection.close 403 ACCESS_REFUSED (RabbitMQ's
        ``authentication_failure_close``), sent when the login throttle allows it
        (state ``refusing`` until then, nothing read). The refusal is logged with user,
        address and mechanism, never the secret, and counted against both."""
        username: str | None = None
        try:
            if m.mechanism == "EXTERNAL":  # the certificate is the credential
                username = self.certificate_user
                self.user = self.core.users.authenticate_external(username or "?", self.from_loopback)
            else:
                username, password = parse_response(m.mechanism, m.response)
                self.user = self.core.users.authenticate(username, password, self.from_loopback, m.mechanism)
        except AuthenticationError as exc:
            reason = str(exc)
            delay = self._login_refused(
                log, m.mechanism, username, reason, protocol="amqp", mechanism=m.mechanism
            )
            refusal = AMQPConnectionError(ACCESS_REFUSED, reason)
            if not delay:
                raise refusal from None
            self.state = "refusing"
            self.transport.pause_reading()
            self._timer.cancel()
            self._timer = self.loop.call_later(delay, lambda: self._refuse(refusal))
            return
        self._login_accepted()
        self.auth_mechanism = m.mechanism
        self.state = "tune"
        limits = self.core.limits
        self.send_method(
            0, C.Tune(channel_max=limits.channel_max, frame_max=limits.frame_max, heartbeat=limits.heartbeat)
        )

    def _refuse(self, refusal: AMQPConnectionError) -> None:
        """A wrong password's slot came: connection.close 403, and read again (its
        close-ok, or the end of a client that gave up)."""
        self.transport.resume_reading()
        self._connection_error(refusal, 10, 11)

    def _tune_ok(self, m: C.TuneOk) -> None:
        limits = self.core.limits
        if m.frame_max and m.frame_max < prelogin.AMQP_FRAME_MAX:
            raise AMQPConnectionError(
                NOT_ALLOWED, f"frame_max={m.frame_max} < {prelogin.AMQP_FRAME_MAX} min size"
            )
        if m.frame_max > limits.frame_max:
            raise AMQPConnectionError(NOT_ALLOWED, f"frame_max={m.frame_max} > {limits.frame_max} max size")
        if m.channel_max > limits.channel_max:
            raise AMQPConnectionError(NOT_ALLOWED, f"channel_max={m.channel_max} > {limits.channel_max} max")
        self.frame_max = m.frame_max or limits.frame_max
        self.channel_max = m.channel_max or limits.channel_max
        self._reader.max_size = self.frame_max
        self.heartbeat = m.heartbeat
        self.state = "open"

    def _open(self, m: C.Open) -> None:
        user = self.user
        assert user is not None  # state "open" follows a successful start-ok
        vhost = self.core.vhosts.get(m.virtual_host)
        if vhost is None:
            raise AMQPConnectionError(NOT_ALLOWED, f"vhost {m.virtual_host} not found")
        if not self.core.users.may_access(user, vhost.name):
            raise AMQPConnectionError(
                NOT_ALLOWED, f"access to vhost '{vhost.name}' refused for user '{user.name}'"
            )
        try:  # the vhost's max-connections
            self._open_life(user, vhost, "AMQP 0-9-1")
        except ConnectionRefused as exc:
            raise AMQPConnectionError(NOT_ALLOWED, exc.text) from None
        self.session = Session(vhost, Access(self.core.users, user, vhost.name), self)
        self.state = "opened"
        self.send_method(0, C.OpenOk())
        self._timer.cancel()
        if self.heartbeat:
            self._timer = self.loop.call_later(self.heartbeat / 2, self._heartbeat_tick)

    # -- the broker's connection registry (core.connections) -------------------------
    def facts(self) -> ConnectionFacts:
        """This connection as management shows it (RabbitMQ's fields)."""
        peer_host, peer_port = self.peer_address()
        channels = tuple(
            ChannelFacts(
                number=channel.number,
                prefetch_count=channel.prefetch_count,
                global_prefetch_count=channel.global_prefetch,
                confirm=channel.publisher.confirming,
                transactional=channel.publisher.transaction is not None,
                messages_unacknowledged=len(channel.unacked),
                messages_unconfirmed=channel.publisher.unconfirmed,
                messages_uncommitted=channel.publisher.uncommitted,
                state="closing" if channel.closing else ("running" if channel.active else "flow"),
                consumers=tuple(
                    ConsumerFacts(
                        consumer.tag,
                        consumer.queue.name if consumer.queue is not None else "",
                        not consumer.no_ack,
                        consumer.exclusive,
                        consumer.prefetch,
                        consumer.arguments,
                        _active(consumer),
                        consumer.queue is not None and consumer.queue.config.single_active_consumer,
                    )
                    for consumer in channel.consumers.values()
                ),
            )
            for channel in sorted(self.channels.values(), key=lambda c: c.number)
        )
        return ConnectionFacts(
            peer_host=peer_host,
            peer_port=peer_port,
            host=self.local[0],
            port=self.local[1],
            protocol="AMQP 0-9-1",
            user=self.user.name if self.user is not None else "",
            vhost=self.vhost.name if self.vhost is not None else "",
            connected_at=self.connected_at,
            client_properties=self.client_properties,
            auth_mechanism=self.auth_mechanism,
            channel_max=self.channel_max,
            frame_max=self.frame_max,
            heartbeat=self.heartbeat,
            ssl=self.tls,
            state=("flow" if self.flow_held else "blocked")
            if self.blocked
            else ("running" if self.state == "opened" else self.state),
            channels=channels,
        )

    def close_by_operator(self, reason: str) -> None:
        """An operator closed it (management's DELETE): 320 CONNECTION_FORCED with
        their reason as the text, as RabbitMQ."""
        self.close(CONNECTION_FORCED, reason)

    def on_vhost_deleted(self, name: str) -> None:
        """This connection's vhost is being deleted: 320, as RabbitMQ."""
        self.close(CONNECTION_FORCED, f"vhost '{name}' is deleted")

    def _update_secret(self, m: C.UpdateSecret) -> None:
        """connection.update-secret, answered as RabbitMQ 3.10 does with its internal
        user database: update-secret-ok whatever the new secret, and nothing changes
        (the user, its permissions, the stored password). The method exists for
        backends whose credentials expire (OAuth 2 tokens), which leveret has not."""
        assert self.user is not None  # state "opened" follows a successful start-ok
        log.info("connection %s: update-secret from user '%s' (%s)", self.peer, self.user.name, m.reason)
        self.send_method(0, C.UpdateSecretOk())

    # -- timers and alarms ----------------------------------------------------------
    def _handshake_timeout(self) -> None:
        if self.state != "opened" and self.state != "closed":
            log.warning("connection %s: handshake timed out in state %s", self.peer, self.state)
            self.close_transport(abort=True)

    def _heartbeat_tick(self) -> None:
        """Every heartbeat/2 seconds: drop the client if nothing came from it for two
        heartbeat intervals (RabbitMQ's rule; the time it is not read, blocked by an
        alarm or held by flow control, does not count), send a heartbeat if we were
        quiet."""
        now = self.loop.time()
        if self.blocked:  # not read (alarm or flow control): its heartbeats wait unread,
            self.last_received = now  # so its silence does not count (RabbitMQ pauses
            # the heartbeat monitor of a blocked connection likewise)
        if now - self.last_received > 2 * self.heartbeat:
            # After the event loop stalls, this timer can run before the bytes that
            # arrived meanwhile are read (uvloop runs due timers before it polls the
            # sockets again). Bytes waiting unread are a sign of life; without a way
            # to ask, look once more after the loop has polled.
            if self._input_waiting is None and not self._rechecking:
                self._rechecking = True
                self._timer = self.loop.call_later(HEARTBEAT_RECHECK, self._heartbeat_tick)
                return
            if self._input_waiting is None or not self._input_waiting():
                log.warning(
                    "connection %s: missed heartbeats from client, timeout: %ss", self.peer, self.heartbeat
                )
                self.close_transport(abort=True)
                return
        self._rechecking = False
        if now - self.last_sent >= self.heartbeat / 2 and not self._out:
            self.send(HEARTBEAT)
        self._timer = self.loop.call_later(self.heartbeat / 2, self._heartbeat_tick)

    def on_alarm(self, active: bool) -> None:
        """The alarm ended: a connection blocked for publishing is read from again and
        told with connection.unblocked (one held by flow control waits for the flow's
        end: :meth:`flow_released`)."""
        if not active and self.blocked and not self.flow_held:
            self.blocked = False
            if self._stash is None:  # else the store's answer resumes reading
                self.transport.resume_reading()
            if self.capabilities.get("connection.blocked") and self.state == "opened":
                self.send_method(0, C.Unblocked())

    def block_publisher(self) -> None:
        """A publish arrived during a resource alarm: as RabbitMQ does, stop reading
        from this connection until the alarm ends, and say so with connection.blocked
        to clients that announced the capability."""
        if self.flow_held:  # held by flow control already: now by the alarm
            self.flow_held = False
            if self.capabilities.get("connection.blocked"):
                self.send_method(0, C.Blocked(reason="low on resources"))
        elif not self.blocked:
            self.blocked = True
            self.transport.pause_reading()
            if self.capabilities.get("connection.blocked"):
                self.send_method(0, C.Blocked(reason="low on resources"))

    def hold_for_flow(self) -> None:
        """A publish arrived while the store lags (:mod:`leveret.core.flow`): stop
        reading from this connection until the store has caught up, without
        connection.blocked (RabbitMQ's ``flow`` state: its credit flow does not tell the
        client either)."""
        if not self.blocked:
            self.blocked = self.flow_held = True
            self.transport.pause_reading()
            self.core.flow.hold(self)

    def flow_released(self) -> None:
        """The store caught up: read again, unless a resource alarm or a reply waiting
        for the store holds the connection."""
        if self.flow_held:
            self.flow_held = False
            self.blocked = False
            if self._stash is None and self.state not in ("closed", "refusing"):
                self.transport.resume_reading()

    def _resume(self) -> None:
        for channel in list(self.channels.values()):
            channel.resume()

    # -- closing --------------------------------------------------------------------
    def _connection_error(self, exc: AMQPConnectionError, class_id: int, method_id: int) -> None:
        if self.state in ("closing", "closed"):
            return
        log.info("connection %s: closing with %s", self.peer, exc.reply_text)
        self._release_channels()
        self.send_method(
            0,
            C.Close(
                reply_code=exc.reply_code,
                reply_text=exc.reply_text[:255],
                class_id=class_id,
                method_id=method_id,
            ),
        )
        self.state = "closing"
        self._timer.cancel()
        self._timer = self.loop.call_later(CLOSE_TIMEOUT, self.close_transport)

    def close(
        self,
        reply_code: int = CONNECTION_FORCED,
        text: str = "broker forced connection closure with reason 'shutdown'",
    ) -> None:
        """Close from the broker's side (shutdown): connection.close, then the socket."""
        if self.state == "refusing":  # a refusal waits: its end is read again
            self.transport.resume_reading()
        if self.state in ("opened", "open", "tune", "start", "refusing"):
            self._connection_error(AMQPConnectionError(reply_code, text), 0, 0)
        elif self.state == "header":
            self.close_transport()

    def _release_channels(self, vanished: bool = False) -> None:
        """Release every channel; ``vanished``: the client went without connection.close
        (socket lost, heartbeats missed), so its unacknowledged messages come back as
        failed deliveries (RabbitMQ 4.3 counts a consumer that went down so)."""
        channels, self.channels = self.channels, {}
        for channel in channels.values():
            if not channel.closing:
                channel.release(vanished)

    def close_transport(self, abort: bool = False) -> None:
        """Write what is queued and close the socket (``abort``: drop it at once);
        :meth:`connection_lost` follows from the server."""
        if self.state == "closed":
            return
        self.flush()
        self.state = "closed"
        (self.transport.abort if abort else self.transport.close)()

    def connection_lost(self) -> None:
        """The socket is gone (also after close_transport): release everything."""
        self.state = "closed"
        self._timer.cancel()
        self._release_channels(vanished=True)  # none left after a close in order
        self._out.clear()
        self._end_life()


def _active(consumer: Any) -> bool:
    """Whether a consumer gets messages: not one waiting behind a single active
    consumer (RabbitMQ shows those as not active)."""
    queue = consumer.queue
    if queue is None or not queue.config.single_active_consumer:
        return True
    return queue.single_active_consumer is consumer


def _ids(payload: bytes) -> tuple[int, int]:
    if len(payload) < 4:
        return 0, 0
    return int.from_bytes(payload[:2], "big"), int.from_bytes(payload[2:4], "big")
