"""TCP listeners: asyncio protocol objects feeding sans-I/O connections (AMQP, STOMP, MQTT).

Output of every connection is written once per event-loop turn: a connection with
something to send registers here, and one ``call_soon`` callback flushes them all, so a
read that publishes to many consumers costs one ``write`` per socket.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import struct
from collections.abc import Callable
from ssl import SSLContext
from typing import cast

try:
    from fcntl import ioctl
    from termios import FIONREAD
except ImportError:  # Windows: the connection then defers its heartbeat verdict instead
    ioctl = None  # type: ignore[assignment]

from ..core.broker import BrokerCore
from ..protocol.amqp import Connection
from ..protocol.amqp10.connection import Amqp10Connection
from ..protocol.mqtt.connection import MqttConnection
from ..protocol.output import HIGH_WATER
from ..protocol.stomp import StompConnection
from .read_coalescing import ReadCoalescer
from .tls import certificate_identity

log = logging.getLogger("leveret.server")

READ_SIZE = 256 * 1024  # bytes per read of a held socket (asyncio's own read size)
DRAIN_LIMIT = 4 * READ_SIZE  # bytes read from a held socket at once, at most


#: A client's sans-I/O connection, whichever protocol it speaks.
AnyConnection = Connection | StompConnection | MqttConnection | Amqp10Connection
ConnectionClass = type[Connection] | type[StompConnection] | type[MqttConnection] | type[Amqp10Connection]


class Flusher:
    """Flushes connections with pending output at the end of the loop turn."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._dirty: list[AnyConnection] = []

    def request(self, connection: AnyConnection) -> None:
        """Flush ``connection`` at the end of this loop turn (the Connection asks once
        per turn)."""
        if not self._dirty:
            self._loop.call_soon(self._flush)
        self._dirty.append(connection)

    def _flush(self) -> None:
        dirty, self._dirty = self._dirty, []
        for connection in dirty:
            connection.flush()


def input_waiting_probe(transport: asyncio.BaseTransport) -> Callable[[], bool] | None:
    """A function telling whether bytes wait unread in the kernel on ``transport``'s
    socket (FIONREAD), for the heartbeat check; None where it cannot be asked (no
    socket, or no FIONREAD). Works the same under asyncio and uvloop: it asks the
    kernel, not the loop."""
    sock = transport.get_extra_info("socket")
    if sock is None or ioctl is None:
        return None

    def input_waiting() -> bool:
        try:
            return struct.unpack("i", ioctl(sock.fileno(), FIONREAD, b"\0\0\0\0"))[0] > 0
        except (OSError, ValueError):  # the socket is closed (fileno -1) or gone
            return False

    return input_waiting


class ClientProtocol(asyncio.Protocol):
    """One accepted socket: asyncio's callbacks passed on to its connection (the
    listener's ``connection_class``)."""

    #: Made by :meth:`connection_made`, which asyncio calls before any other method.
    connection: AnyConnection
    coalescer: ReadCoalescer

    def __init__(self, listener: Listener) -> None:
        self.listener = listener

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """A client connected: make its Connection (loopback peers may log in as
        ``guest``) with a write buffer of :data:`HIGH_WATER` bytes."""
        # A stream server (create_server) gives a stream transport, asyncio's or uvloop's.
        transport = cast(asyncio.Transport, transport)
        transport.set_write_buffer_limits(high=HIGH_WATER)
        peer = transport.get_extra_info("peername") or ("", 0)
        try:
            loopback = ipaddress.ip_address(peer[0]).is_loopback
        except ValueError:
            loopback = False
        listener = self.listener
        certificate_user = None
        if listener.ssl is not None:
            ssl_object = transport.get_extra_info("ssl_object")
            certificate = ssl_object.getpeercert() if ssl_object is not None else None
            certificate_user = certificate_identity(certificate, listener.login_from)
        self._arguments = (
            listener.core,
            transport,
            listener.loop,
            listener.flusher.request,
            f"{peer[0]}:{peer[1]}",
            loopback,
            input_waiting_probe(transport),
            certificate_user,
        )
        self.connection = listener.connection_class(*self._arguments)
        self._local = transport.get_extra_info("sockname") or ("", 0)
        self._mark(self.connection)
        # An AMQP port also takes STOMP and MQTT (ActiveMQ's "auto" transport): told
        # apart by the first byte, before the AMQP connection has read anything.
        self._sniffing = listener.connection_class is Connection
        self._held_prefix = b""
        listener.connections.add(self.connection)
        listener.core.metrics.connections_opened += 1
        self.transport = transport
        # Holding needs a socket the listener can read itself when the hold ends early
        # (plain TCP: under TLS the bytes on the socket are not the frames).
        sock = transport.get_extra_info("socket")
        plain = sock is not None and transport.get_extra_info("sslcontext") is None
        self._fileno = sock.fileno() if plain else -1
        self.coalescer = ReadCoalescer(
            transport,
            listener.loop,
            listener.read_coalesce if plain else 0,
            lambda: not self.connection.reading_paused,
            lambda: listener.hold_started(self),
            lambda: listener.held.discard(self),
            now=listener.core.clock.monotonic,
        )

    def data_received(self, data: bytes) -> None:
        """Read what held sockets have (so this connection sees what they sent before
        it), feed the Connection, then let read coalescing decide whether to hold this
        socket."""
        if self._sniffing:
            data = self._sniff(data)
            if not data:  # too few bytes yet to tell the protocol
                return
        if self.coalescer.holding:  # another pause was lifted during the hold: it is over
            self.coalescer.release()
        if self.listener.held:
            self.listener.read_held()
        if self._feed(data):
            self.coalescer.after_read(len(data), self.connection.quiet)

    def _sniff(self, data: bytes) -> bytes:
        r"""The first bytes on an AMQP port: ``AMQP`` then 0-9-1's version (or anything
        else, which the AMQP connection answers with its protocol header) stays AMQP
        0-9-1; ``AMQP`` then protocol id 0, 2 or 3 and major version 1 is AMQP 1.0 (as
        RabbitMQ 4 tells them apart); a STOMP frame or a heart-beat (``C``\ ONNECT,
        ``S``\ TOMP, end of line) becomes a STOMP connection, an MQTT CONNECT packet
        (first byte 0x10, the type of no AMQP or STOMP opening) an MQTT connection.
        Returns the bytes to feed: none while the first six bytes of an ``AMQP`` header
        are not all here (they are held meanwhile)."""
        data = self._held_prefix + data
        if len(data) < 6 and data and b"AMQP".startswith(data[:4]):
            self._held_prefix = data
            return b""
        self._held_prefix = b""
        self._sniffing = False
        first = data[:1]
        if first in (b"C", b"S", b"\n", b"\r"):
            sniffed: ConnectionClass = StompConnection
        elif first == b"\x10":
            sniffed = MqttConnection
        elif data[:4] == b"AMQP" and data[4] in (0, 2, 3) and data[5] == 1:
            sniffed = Amqp10Connection
        else:
            return data
        listener = self.listener
        amqp = self.connection
        listener.connections.discard(amqp)
        amqp.connection_lost()  # nothing happened yet: this only cancels its timer
        self.connection = sniffed(*self._arguments)
        self._mark(self.connection)
        listener.connections.add(self.connection)
        return data

    def _mark(self, connection: AnyConnection) -> None:
        """Tell the connection where it came in (for its name in core's registry)."""
        connection.local = (str(self._local[0]), int(self._local[1]))
        connection.tls = self.listener.ssl is not None

    def _feed(self, data: bytes, whole: bool = False) -> bool:
        """Feed the Connection (``whole``: every frame now, not over several turns);
        an exception from it is a bug: logged, and the connection closed with 541
        INTERNAL_ERROR (then False)."""
        connection = self.connection
        try:
            connection.data_received(data, whole)
        except Exception:  # a bug must cost one connection, never the broker
            log.exception("internal error on connection %s", connection.peer)
            connection.close(541, "internal error")
            return False
        return True

    def read_now(self) -> None:
        """End this socket's hold early: read and feed what waits on it (at most
        :data:`DRAIN_LIMIT` bytes, so a flooding client cannot keep the loop here), then
        let the loop read it again. Nothing is read while the connection has another
        reason not to read (a resource alarm, a reply waiting for the store). What is
        read is handled whole, not over several turns: the connection about to be read
        must see all of it."""
        if not self.coalescer.release():
            return
        for _ in range(DRAIN_LIMIT // READ_SIZE):
            try:
                data = os.read(self._fileno, READ_SIZE)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:  # reset: the loop reports it once reading resumes
                break
            if not data or not self._feed(data, whole=True):  # end of stream: likewise
                break
            if self.connection.reading_paused or self.transport.is_closing():
                return  # paused meanwhile: whoever paused it resumes it
        self.transport.resume_reading()

    def pause_writing(self) -> None:
        """Over :data:`HIGH_WATER` bytes buffered: consumers of this connection pause."""
        self.connection.set_writable(False)

    def resume_writing(self) -> None:
        """The buffer drained below the low water mark: deliveries resume."""
        self.connection.set_writable(True)

    def connection_lost(self, exc: Exception | None) -> None:
        """The socket is closed: release the Connection's channels, consumers and
        exclusive queues."""
        connection = self.connection
        self.listener.connections.discard(connection)
        self.listener.core.metrics.connections_closed += 1
        self.coalescer.release()  # a hold's timer must not outlive the socket
        try:
            connection.connection_lost()
        except Exception:
            log.exception("internal error releasing connection %s", connection.peer)


class Listener:
    """Accepts clients of ``connection_class``'s protocol (AMQP by default) on
    ``host:port`` (port 0 picks a free one); a client streaming small writes is read at
    most once per ``read_coalesce`` seconds (see :mod:`.read_coalescing`; 0 reads at
    once); ``reuse_port``: bind with SO_REUSEPORT (the nodes of ``--nodes N`` share
    the port)."""

    #: The running loop and its flusher, set by :meth:`start` (protocols exist only after).
    loop: asyncio.AbstractEventLoop
    flusher: Flusher

    def __init__(
        self,
        core: BrokerCore,
        host: str,
        port: int,
        read_coalesce: float = 0.001,
        ssl: SSLContext | None = None,
        login_from: str = "distinguished_name",
        connection_class: ConnectionClass = Connection,
        reuse_port: bool = False,
    ) -> None:
        self.core = core
        #: SO_REUSEPORT: several processes (``leveret server --nodes N``) share the port,
        #: the kernel spreads new connections over them
        self.reuse_port = reuse_port
        self.connection_class = connection_class
        self.host = host
        self.port = port
        self.ssl = ssl  # amqps: TLS, and EXTERNAL for verified client certificates
        self.login_from = login_from  # which part of a certificate names its user
        self.read_coalesce = read_coalesce  # seconds; see read_coalescing.py (0: off)
        self.read_holds = 0  # sockets held by read coalescing, since start
        self.held: set[ClientProtocol] = set()  # sockets held now
        self.connections: set[AnyConnection] = set()
        self._server: asyncio.base_events.Server | None = None

    def hold_started(self, protocol: ClientProtocol) -> None:
        """Read coalescing holds ``protocol``'s socket."""
        self.read_holds += 1
        self.held.add(protocol)

    def read_held(self) -> None:
        """End every hold and read what the held sockets have: another connection is
        about to be read, and must see what they sent before it."""
        for protocol in list(self.held):
            if protocol in self.held:  # reading one may have released another
                protocol.read_now()

    async def start(self) -> None:
        """Listen on the running loop; :attr:`port` is then the port bound. Raises
        OSError if it cannot be bound."""
        self.loop = asyncio.get_running_loop()
        self.flusher = Flusher(self.loop)
        self._server = await self.loop.create_server(
            lambda: ClientProtocol(self),
            self.host,
            self.port,
            reuse_address=True,
            reuse_port=self.reuse_port or None,
            ssl=self.ssl,
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self, grace: float = 3.0) -> None:
        """Stop accepting, close every connection with 320 CONNECTION_FORCED, wait up to
        ``grace`` seconds for their close-ok."""
        if self._server is None:
            return
        self._server.close()
        await self._close_connections(grace)
        await self._server.wait_closed()
        self._server = None

    async def _close_connections(self, grace: float) -> None:
        """Close every connection with 320 CONNECTION_FORCED; after ``grace`` seconds
        without their close-ok, drop the sockets of those left."""
        for connection in list(self.connections):
            connection.close()
        deadline = self.loop.time() + grace
        while self.connections and self.loop.time() < deadline:
            await asyncio.sleep(0.02)
        for connection in list(self.connections):
            connection.close_transport(abort=True)
