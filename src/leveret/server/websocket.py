"""A protocol over WebSocket, for browser applications: ``ws://HOST:PORT/ws`` on aiohttp's
WebSocket server, one sans-I/O connection per WebSocket. Web STOMP (:mod:`.web_stomp`),
Web MQTT (:mod:`.web_mqtt`) and Web AMQP (:mod:`.web_amqp`) are this server with their own
:class:`WebSocketProtocol`.

Each WebSocket is one connection of the protocol's class, fed the bytes of every message
received (text or binary): a frame or packet may span messages, and one message may hold
several. What the connection writes goes out once per event-loop turn as one message:
binary, or for a protocol with text output (STOMP) text when it is UTF-8. The HTTP
port's limits (:mod:`.http_guard`) bound the upgrade request; until the connection has
logged in, :class:`PreloginGuard` bounds the bytes read.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from dataclasses import dataclass
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web

from ..core.broker import BrokerCore
from ..protocol import prelogin
from ..protocol.amqp10.connection import Amqp10Connection
from ..protocol.mqtt.connection import MqttConnection
from ..protocol.output import HIGH_WATER
from ..protocol.stomp import StompConnection
from .http_guard import ConnectionGuard, GuardedSite
from .http_limits import HttpLimits
from .listener import Flusher

log = logging.getLogger("leveret.server")

PATH = "/ws"
#: Bytes of WebSocket framing (headers, masks) allowed on top of prelogin.MAX_BYTES
#: before login: a login sent in many small messages still fits.
FRAMING_SLACK = 4096

#: A WebSocket's connection, whichever protocol it speaks.
WebConnection = StompConnection | MqttConnection | Amqp10Connection


@dataclass(frozen=True)
class WebSocketProtocol:
    """What one protocol over WebSocket needs from the server."""

    #: As logs and the port's guard name it ("Web STOMP").
    name: str
    connection_class: type[StompConnection] | type[MqttConnection] | type[Amqp10Connection]
    #: The subprotocols offered, preferred first (``Sec-WebSocket-Protocol``).
    subprotocols: tuple[str, ...]
    #: Bytes in one WebSocket message, at most (aiohttp closes with 1009 beyond).
    max_message: int
    #: A client must ask for one of :attr:`subprotocols`; else the upgrade gets
    #: ``400 Bad Request`` (else it may ask for none).
    subprotocol_required: bool = False
    #: Output that is UTF-8 goes out as text messages (else always binary).
    text_output: bool = False
    #: Text messages are read as their UTF-8 bytes (else a text message closes the
    #: WebSocket with 1003 Unsupported Data, as MQTT's §6.0 wants and RabbitMQ does).
    text_input: bool = True
    #: The connection's states before it has logged in, while :class:`PreloginGuard`
    #: counts the bytes received (STOMP's and MQTT's; AMQP 1.0 has its own).
    prelogin_states: tuple[str, ...] = ("connecting", "refusing")

    def choose(self, asked: list[str]) -> str | None:
        """The subprotocol answered to a client asking for ``asked`` (in its order of
        preference): the first of them we offer; None if none."""
        return next((name for name in asked if name in self.subprotocols), None)


class PreloginGuard:
    """Stands between aiohttp's connection and its WebSocket reader, which assembles a
    whole message (up to the protocol's ``max_message`` bytes) before leveret sees it:
    while the connection is in one of ``prelogin_states`` (not logged in, or for AMQP
    1.0 not open yet), the bytes received are counted, and past
    :data:`leveret.protocol.prelogin.MAX_BYTES` (plus :data:`FRAMING_SLACK`) the
    connection refuses (``refuse_before_login``: STOMP sends an ERROR frame, MQTT and
    AMQP 1.0 just close) and nothing more the client sends is read. Past those states it
    only passes bytes on."""

    __slots__ = ("_connection", "_prelogin", "_protocol", "_reader", "_received", "_refused")

    def __init__(
        self,
        protocol: Any,
        reader: Any,
        connection: WebConnection,
        prelogin_states: tuple[str, ...] = ("connecting", "refusing"),
    ) -> None:
        self._protocol = protocol  # aiohttp's, which feeds its reader through this
        self._reader = reader
        self._connection = connection
        self._prelogin = prelogin_states
        self._received = 0  # bytes, until login
        self._refused = False

    def feed_data(self, data: bytes) -> Any:
        if self._refused:
            return False, b""
        connection = self._connection
        if connection.state in self._prelogin:
            self._received += len(data)
            if prelogin.over_limit(self._received, prelogin.MAX_BYTES + FRAMING_SLACK):
                self._refused = True
                connection.refuse_before_login()
                return False, b""
        else:  # logged in (or closed for another reason): out of the way from now on
            self._protocol._payload_parser = self._reader
        return self._reader.feed_data(data)

    def feed_eof(self) -> Any:
        return self._reader.feed_eof()


class WebSocketTransport:
    """The transport a connection writes to: queued messages sent in order by one
    writer task (text or binary, see :attr:`WebSocketProtocol.text_output`); reading
    pauses between messages."""

    def __init__(
        self, socket: web.WebSocketResponse, connection_ready: asyncio.Event, text_output: bool
    ) -> None:
        self.socket = socket
        self.connection: WebConnection | None = None
        self._outbox: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._queued = 0
        self._writable = True
        self._text = text_output
        self.reading = connection_ready  # set while reading is allowed
        self.closing = False
        #: The WebSocket close code sent once the queue is written (1000 normal closure).
        self.close_code = WSCloseCode.OK
        self._writer = asyncio.get_running_loop().create_task(self._write_loop())

    def write(self, data: bytes) -> None:
        if self.closing:
            return
        self._queued += len(data)
        self._outbox.put_nowait(data)
        if self._writable and self._queued > HIGH_WATER and self.connection is not None:
            self._writable = False
            self.connection.set_writable(False)

    async def _send(self, data: bytes) -> None:
        if self._text:
            try:
                await self.socket.send_str(data.decode())
                return
            except UnicodeDecodeError:
                pass
        await self.socket.send_bytes(data)

    async def _write_loop(self) -> None:
        while True:
            data = await self._outbox.get()
            if data is None:
                break
            try:
                await self._send(data)
            except (ConnectionError, RuntimeError):  # the client went away
                break
            self._queued -= len(data)
            if not self._writable and self._queued < HIGH_WATER // 4 and self.connection is not None:
                self._writable = True
                self.connection.set_writable(True)
        if not self.socket.closed:
            await self.socket.close(code=self.close_code)

    def close(self) -> None:
        """Close once everything queued is sent. The reading loop is woken if it waits
        for :meth:`resume_reading` (a refusal the login throttle delayed, a DISCONNECT
        whose receipt waited for the store, a blocked publisher): nothing resumes a
        closed connection, and that loop alone ends it in the broker."""
        if not self.closing:
            self.closing = True
            self._outbox.put_nowait(None)
            self.reading.set()

    def abort(self) -> None:
        self.close()

    def pause_reading(self) -> None:
        self.reading.clear()

    def resume_reading(self) -> None:
        self.reading.set()

    def is_closing(self) -> bool:
        return self.closing


class WebSocketServer:
    """Serves ``protocol`` over WebSocket on ``host:port`` (0 picks a free port),
    path :data:`PATH`; ``limits`` and ``cap``: the upgrade request's header timeout,
    the keep-alive timeout and the most connections the port holds (:mod:`.http_guard`)."""

    def __init__(
        self,
        core: BrokerCore,
        protocol: WebSocketProtocol,
        host: str,
        port: int,
        limits: HttpLimits | None = None,
        cap: int | None = None,
        reuse_port: bool = False,
    ) -> None:
        self.core = core
        self.protocol = protocol
        self.reuse_port = reuse_port  # SO_REUSEPORT: the nodes of --nodes N share the port
        self.limits = limits or HttpLimits()
        self.guard = ConnectionGuard(f"{protocol.name} port", self.limits, cap)
        self.host = host
        self.port = port
        self.connections: set[WebConnection] = set()
        self._runner: web.AppRunner | None = None
        self._flusher: Flusher | None = None
        self.app = web.Application()
        self.app.add_routes([web.get(PATH, self._websocket)])

    @property
    def url(self) -> str:
        """``ws://host:port/ws`` (the port bound, after :meth:`start`)."""
        return f"ws://{self.host}:{self.port}{PATH}"

    async def start(self) -> None:
        """Listen; :attr:`port` is then the port bound (OSError if it cannot be)."""
        self._flusher = Flusher(asyncio.get_running_loop())
        self._runner = web.AppRunner(
            self.app, access_log=None, keepalive_timeout=self.limits.keepalive_timeout
        )
        await self._runner.setup()
        await GuardedSite(
            self._runner, self.host, self.port, self.guard, reuse_port=self.reuse_port or None
        ).start()
        self.port = self._runner.addresses[-1][1]

    async def stop(self) -> None:
        """Close every connection (the protocol's shutdown notice, then the socket),
        then stop listening."""
        for connection in list(self.connections):
            connection.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _websocket(self, request: web.Request) -> web.StreamResponse:
        spec = self.protocol
        asked = [name.strip() for name in request.headers.get("Sec-WebSocket-Protocol", "").split(",")]
        chosen = spec.choose([name for name in asked if name])
        if chosen is None and spec.subprotocol_required:
            # RabbitMQ's Web MQTT answers 400 to an upgrade without an MQTT subprotocol
            return web.Response(
                status=400, text=f"{spec.name} needs the subprotocol {spec.subprotocols[0]}\n"
            )
        protocols = (chosen,) if chosen is not None else spec.subprotocols
        socket = web.WebSocketResponse(protocols=protocols, max_msg_size=spec.max_message, heartbeat=None)
        await socket.prepare(request)
        loop = asyncio.get_running_loop()
        reading = asyncio.Event()
        reading.set()
        transport = WebSocketTransport(socket, reading, spec.text_output)
        peer = request.transport.get_extra_info("peername") if request.transport else None
        host, port = (peer[0], peer[1]) if peer else ("", 0)
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        assert self._flusher is not None
        connection = spec.connection_class(
            self.core, transport, loop, self._flusher.request, f"{host}:{port}", loopback
        )
        transport.connection = connection
        # aiohttp's reader, guarded until login (a private attribute: left alone if absent)
        protocol = request.protocol
        reader = getattr(protocol, "_payload_parser", None)
        if reader is not None and hasattr(reader, "feed_data"):
            protocol._payload_parser = PreloginGuard(protocol, reader, connection, spec.prelogin_states)
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        connection.local = (str(sockname[0]), int(sockname[1])) if sockname else ("", 0)
        self.connections.add(connection)
        self.core.metrics.connections_opened += 1
        try:
            async for message in socket:
                if message.type == WSMsgType.TEXT and spec.text_input:
                    data: Any = message.data.encode()
                elif message.type == WSMsgType.BINARY:
                    data = message.data
                else:  # a close, or a text message the protocol refuses: 1003, as RabbitMQ
                    if message.type == WSMsgType.TEXT:
                        transport.close_code = WSCloseCode.UNSUPPORTED_DATA
                    break
                try:
                    connection.data_received(data)
                except Exception:  # a bug costs this connection only
                    log.exception("internal error on %s connection %s", spec.name, connection.peer)
                    connection.close(541, "internal error")
                    break
                if connection.state == "closed":
                    break
                await reading.wait()
        finally:
            self.connections.discard(connection)
            self.core.metrics.connections_closed += 1
            connection.connection_lost()
            transport.close()
            await transport._writer
        return socket
