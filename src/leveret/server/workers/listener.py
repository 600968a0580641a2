"""The AMQP listener with connection workers (``leveret server --workers N``,
docs/multicore.md §6).

The core accepts each client and passes its socket to one of N worker processes in
turn (:mod:`.process`), which do the connection's byte work on another core: reading,
splitting frames, parsing publishes, encoding deliveries, writing. The core keeps a
:class:`~leveret.protocol.amqp.remote.RemoteConnection` per client, so channels,
consumers, unacknowledged deliveries, confirms and transactions behave exactly as
without workers, and management, ``leveret ctl`` and shutdown see every connection.

A worker that dies takes its clients' sockets with it: their connections end as if the
clients had gone (unacknowledged messages are requeued), and the core starts a new
worker in its place.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import socket
import subprocess
import sys
from collections import deque
from pathlib import Path
from typing import Any

from ...core.broker import BrokerCore
from ...protocol.amqp.remote import RemoteConnection
from ..listener import Flusher, Listener
from .link import (
    ABORT,
    CLOSE,
    CONNECTION_ID,
    FRAME_ERROR,
    FRAME_MAX,
    FRAMES,
    HEADER,
    LOST,
    OUTPUT,
    PAUSE,
    RESUME,
    WRITABLE,
    Link,
)

log = logging.getLogger("leveret.server")

ACCEPTS_PER_TURN = 64  # clients accepted in one loop turn, at most
ACCEPT_PAUSE = 1.0  # seconds without accepting after accept failed (asyncio's own pause)
BACKLOG = 1024  # the listening sockets' queue of clients not yet accepted
RESTART_PAUSE = 1.0  # seconds before a worker that died is replaced
WORKER_EXIT_WAIT = 5.0  # seconds a worker has to exit once its link is closed


class RemoteTransport:
    """What a :class:`RemoteConnection` writes to: records on its worker's link."""

    __slots__ = ("id", "link", "paused")

    def __init__(self, link: WorkerLink, connection_id: int) -> None:
        self.link = link
        self.id = connection_id
        self.paused = False  # reading paused: PAUSE and RESUME are sent on a change only

    def write(self, data: bytes) -> None:
        self.link.send((OUTPUT, self.id, [data]))

    def write_items(self, items: list[Any]) -> None:
        self.link.send((OUTPUT, self.id, items))

    def close(self) -> None:
        self.link.send((CLOSE, self.id))

    def abort(self) -> None:
        self.link.send((ABORT, self.id))

    def pause_reading(self) -> None:
        if not self.paused:
            self.paused = True
            self.link.send((PAUSE, self.id))

    def resume_reading(self) -> None:
        if self.paused:
            self.paused = False
            self.link.send((RESUME, self.id))

    def set_frame_max(self, frame_max: int) -> None:
        self.link.send((FRAME_MAX, self.id, frame_max))


class WorkerLink(Link):
    """The core's end of one worker's link, with the worker's process and the socket
    pair its clients' sockets are passed over."""

    def __init__(
        self, listener: WorkerListener, index: int, process: subprocess.Popen, sockets: socket.socket
    ) -> None:
        super().__init__(listener.loop)
        self.listener = listener
        self.index = index
        self.process = process
        self.sockets = sockets
        self.connections: dict[int, RemoteConnection] = {}
        self.writable = True  # below the link's high water mark: deliveries may go out
        self._unsent: deque[tuple[int, socket.socket]] = deque()  # sockets not yet passed

    # -- sockets to the worker -----------------------------------------------------
    def pass_socket(self, connection_id: int, client: socket.socket) -> None:
        """Give the worker ``client`` (closed here once passed)."""
        self._unsent.append((connection_id, client))
        if len(self._unsent) == 1:
            self._send_sockets()

    def _send_sockets(self) -> None:
        unsent = self._unsent
        while unsent:
            connection_id, client = unsent[0]
            try:
                socket.send_fds(self.sockets, [CONNECTION_ID.pack(connection_id)], [client.fileno()])
            except (BlockingIOError, InterruptedError):  # the worker's queue is full: later
                self.loop.add_writer(self.sockets.fileno(), self._send_sockets)
                return
            except OSError as exc:  # the worker is gone, or cannot take more descriptors
                log.warning("cannot pass a client to connection worker %d: %s", self.index, exc)
                client.close()
                unsent.popleft()
                if connection_id in self.connections:
                    self._release(connection_id)
                continue
            client.close()
            unsent.popleft()
        self.loop.remove_writer(self.sockets.fileno())

    # -- records from the worker ---------------------------------------------------
    def received(self, record: tuple[Any, ...]) -> None:
        kind, connection_id = record[0], record[1]
        connection = self.connections.get(connection_id)
        if connection is None:  # released already (the link broke, or a late record)
            return
        if kind == LOST:
            self._release(connection_id)
            return
        try:
            if kind == FRAMES:
                connection.frames_received(record[2], record[3])
            elif kind == HEADER:
                connection.header_received(record[2])
            elif kind == WRITABLE:
                connection.set_client_writable(record[2])
            elif kind == FRAME_ERROR:
                connection.frame_error(record[2])
        except Exception:  # a bug must cost one connection, never the broker
            log.exception("internal error on connection %s", connection.peer)
            connection.close(541, "internal error")

    def _release(self, connection_id: int) -> None:
        connection = self.connections.pop(connection_id)
        listener = self.listener
        listener.connections.discard(connection)
        listener.core.metrics.connections_closed += 1
        try:
            connection.connection_lost()
        except Exception:
            log.exception("internal error releasing connection %s", connection.peer)

    # -- flow control and the end -------------------------------------------------
    def pause_writing(self) -> None:
        """The worker reads slower than the core writes: its consumers pause."""
        self.writable = False
        for connection in list(self.connections.values()):
            connection.set_link_writable(False)

    def resume_writing(self) -> None:
        self.writable = True
        for connection in list(self.connections.values()):
            connection.set_link_writable(True)

    def connection_lost(self, exc: Exception | None) -> None:
        """The worker is gone (or the listener stopped): its connections end."""
        self.transport = None
        for connection_id in list(self.connections):
            self._release(connection_id)
        for _, client in self._unsent:
            client.close()
        self._unsent.clear()
        self.loop.remove_writer(self.sockets.fileno())
        self.sockets.close()
        self.listener.worker_lost(self)


class WorkerListener(Listener):
    """The AMQP listener of a broker with ``workers`` connection workers: it accepts
    on ``host:port`` itself and passes clients round-robin. Not handled by the workers
    yet (docs/multicore.md): STOMP on the AMQP port (ActiveMQ's "auto" transport; the
    STOMP port is unaffected) and read coalescing."""

    def __init__(
        self, core: BrokerCore, host: str, port: int, workers: int, reuse_port: bool = False
    ) -> None:
        super().__init__(core, host, port, read_coalesce=0, reuse_port=reuse_port)
        self.workers = workers
        #: The running workers' links by index (None while one is being replaced).
        self.links: list[WorkerLink | None] = []
        self._sockets: list[socket.socket] = []
        self._replacing: set[asyncio.Task] = set()
        self._next_id = 0
        self._turn = 0
        self._stopping = False

    async def start(self) -> None:
        """Bind, start the workers, then accept. Raises OSError if the port cannot be
        bound or a worker cannot be started."""
        self.loop = asyncio.get_running_loop()
        self.flusher = Flusher(self.loop)
        self._stopping = False
        self._sockets = _bind(self.host, self.port, self.reuse_port)
        self.port = self._sockets[0].getsockname()[1]
        try:
            for index in range(self.workers):
                self.links.append(await self._start_worker(index))
        except BaseException:
            await self._stop_workers()
            for server in self._sockets:
                server.close()
            self._sockets = []
            raise
        for server in self._sockets:
            self.loop.add_reader(server.fileno(), self._accept, server)

    async def _start_worker(self, index: int) -> WorkerLink:
        core_end, worker_end = socket.socketpair()
        sockets_core, sockets_worker = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        package_root = str(Path(__file__).resolve().parents[2])  # where `leveret` is importable
        env = dict(
            os.environ, PYTHONPATH=os.pathsep.join(filter(None, (package_root, os.environ.get("PYTHONPATH"))))
        )
        command = [
            sys.executable,
            "-m",
            "leveret.server.workers.process",
            str(worker_end.fileno()),
            str(sockets_worker.fileno()),
            str(self.core.limits.frame_max),
        ]
        try:
            process = subprocess.Popen(
                command,
                pass_fds=(worker_end.fileno(), sockets_worker.fileno()),
                stdin=subprocess.DEVNULL,
                env=env,
            )
        finally:
            worker_end.close()
            sockets_worker.close()
        sockets_core.setblocking(False)
        core_end.setblocking(False)
        link = WorkerLink(self, index, process, sockets_core)
        await self.loop.connect_accepted_socket(lambda: link, core_end)
        log.info("connection worker %d started (pid %d)", index, process.pid)
        return link

    def _accept(self, server: socket.socket) -> None:
        for _ in range(ACCEPTS_PER_TURN):
            try:
                client, address = server.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:  # out of file descriptors, say: the clients wait a second
                log.warning("cannot accept an AMQP client: %s", exc)
                self.loop.remove_reader(server.fileno())
                self.loop.call_later(ACCEPT_PAUSE, self._accept_again, server)
                return
            self._hand_over(client, address)

    def _accept_again(self, server: socket.socket) -> None:
        if server in self._sockets:
            self.loop.add_reader(server.fileno(), self._accept, server)

    def _hand_over(self, client: socket.socket, address: Any) -> None:
        """Make the client's connection here, pass its socket to the next worker."""
        link = self._next_link()
        if link is None:  # every worker is being replaced: the client tries again
            client.close()
            return
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._next_id += 1
        connection_id = self._next_id
        host = str(address[0])
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        transport = RemoteTransport(link, connection_id)
        # The worker reads nothing while the core has paused it (a reply waiting for the
        # store, an alarm): the client's heartbeats wait unread then, and count as life.
        connection = RemoteConnection(
            self.core,
            transport,
            self.loop,
            self.flusher.request,
            f"{host}:{address[1]}",
            loopback,
            lambda: transport.paused,
        )
        if not link.writable:
            connection.set_link_writable(False)
        local = client.getsockname()
        connection.local = (str(local[0]), int(local[1]))
        link.connections[connection_id] = connection
        self.connections.add(connection)
        self.core.metrics.connections_opened += 1
        link.pass_socket(connection_id, client)

    def _next_link(self) -> WorkerLink | None:
        for _ in range(len(self.links)):
            self._turn = (self._turn + 1) % len(self.links)
            link = self.links[self._turn]
            if link is not None and link.transport is not None:
                return link
        return None

    def worker_lost(self, link: WorkerLink) -> None:
        """A worker's link closed: unless stopping, start another in its place (after
        :data:`RESTART_PAUSE`, so a worker that cannot start is not forked in a loop)."""
        if link.index < len(self.links) and self.links[link.index] is link:
            self.links[link.index] = None
        self.loop.run_in_executor(None, _reap, link.process)
        if self._stopping:
            return
        log.warning("connection worker %d (pid %d) is gone: starting another", link.index, link.process.pid)
        task = self.loop.create_task(self._replace(link.index))
        self._replacing.add(task)
        task.add_done_callback(self._replacing.discard)

    async def _replace(self, index: int) -> None:
        await asyncio.sleep(RESTART_PAUSE)
        if self._stopping:
            return
        try:
            link = await self._start_worker(index)
        except OSError:
            log.exception("cannot start connection worker %d", index)
            return
        self.links[index] = link  # stop() waits for this task before it closes the links

    async def stop(self, grace: float = 3.0) -> None:
        """Stop accepting, close every connection with 320 CONNECTION_FORCED, wait up to
        ``grace`` seconds for their close-ok, then stop the workers."""
        if not self._sockets:
            return
        self._stopping = True
        for server in self._sockets:
            self.loop.remove_reader(server.fileno())
            server.close()
        self._sockets = []
        await self._close_connections(grace)
        await asyncio.sleep(0)  # the links write this turn's records
        await self._stop_workers()

    async def _stop_workers(self) -> None:
        """Close every link (a worker exits when its link closes) and wait for the
        processes, a replacement being started included."""
        self._stopping = True
        await asyncio.gather(*self._replacing, return_exceptions=True)
        links = [link for link in self.links if link is not None]
        self.links = []
        for link in links:
            if link.transport is not None:
                link.transport.close()
        await asyncio.gather(*(self.loop.run_in_executor(None, _reap, link.process) for link in links))


def _bind(host: str, port: int, reuse_port: bool = False) -> list[socket.socket]:
    """Listening sockets for ``host:port``, as asyncio's ``create_server`` makes them:
    one per address ``host`` resolves to (every interface for an empty host), with
    SO_REUSEADDR (and SO_REUSEPORT if ``reuse_port``), an IPv6 one IPv6-only. Raises
    OSError if one cannot be bound."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            server = socket.socket(family, kind, proto)
            sockets.append(server)
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuse_port:
                server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6:
                server.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            server.bind(address)
            server.listen(BACKLOG)
            server.setblocking(False)
    except BaseException:
        for server in sockets:
            server.close()
        raise
    return sockets


def _reap(process: subprocess.Popen) -> None:
    """Wait for a worker whose link closed; kill it if it does not exit."""
    try:
        process.wait(WORKER_EXIT_WAIT)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
