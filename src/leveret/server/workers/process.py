"""A connection worker: the process ``leveret server --workers N`` starts N of
(docs/multicore.md §6). Run as ``python -m leveret.server.workers.process LINK_FD SOCKETS_FD
FRAME_MAX``.

It holds AMQP clients' sockets the core accepted and passed to it, and does their byte
work: reading, splitting frames, parsing whole publishes (:mod:`leveret.amqp.handoff`),
encoding deliveries, writing. Everything with state beyond a socket stays in the core,
which it talks to over the link (:mod:`.link`). When the core goes (its end of
the link closes), the worker drops its clients and exits; the core starts a new worker
when one dies.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import sys
from typing import Any, cast

from ...amqp.frames import PROTOCOL_HEADER, FrameError, FrameReader, encode_delivery, tune_ok_end
from ...amqp.handoff import parse_publishes
from ...protocol.output import HIGH_WATER
from ...protocol.prelogin import AMQP_FRAME_MAX
from ..event_loop import new_event_loop
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


class Client(asyncio.Protocol):
    """One client socket: bytes in become HEADER/FRAMES records, OUTPUT records become
    bytes out."""

    transport: asyncio.Transport

    def __init__(self, worker: Worker, connection_id: int) -> None:
        self.worker = worker
        self.id = connection_id
        self.frame_max = worker.frame_max
        # until tune-ok a frame is at most 4,096 bytes, as the core's own reader takes
        # them (protocol/prelogin.py); then the broker's frame_max
        self.reader = FrameReader(AMQP_FRAME_MAX)
        self.tuned = False
        self.header: bytes | None = b""  # None once the protocol header is read
        self.paused_by_core = False  # PAUSE from the core (a reply waits for the store…)
        self.stopped = False  # after a bad header or frame: nothing more is read

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # a stream transport (uvloop's is no subclass)
        self.transport = transport
        transport.set_write_buffer_limits(high=HIGH_WATER)
        worker = self.worker
        worker.clients[self.id] = self
        closing = worker.connecting.pop(self.id, None)
        if closing == ABORT:
            transport.abort()
        elif closing == CLOSE:
            transport.close()
        elif worker.link_paused:
            transport.pause_reading()

    def data_received(self, data: bytes) -> None:
        link = self.worker.link
        if self.header is not None:
            header = self.header + data
            if len(header) < 8 and PROTOCOL_HEADER.startswith(header):
                self.header = header
                return
            self.header = None
            link.send((HEADER, self.id, header[:8]))
            if header[:8] != PROTOCOL_HEADER:  # the core answers and closes
                self._stop()
                return
            data = header[8:]
            if not data:
                return
        rest, stop = b"", None
        if not self.tuned:  # what follows tune-ok is read with the frame_max
            held = self.reader._buffer
            stop = tune_ok_end(held + data if held else data, AMQP_FRAME_MAX)
            if stop is not None:
                cut = stop - len(held)
                data, rest = data[:cut], data[cut:]
        try:
            frames = self.reader.feed(data)
        except FrameError as exc:
            link.send((FRAME_ERROR, self.id, exc.reply_text))
            self._stop()
            return
        if frames:
            link.send((FRAMES, self.id, parse_publishes(frames), len(data)))
        if stop is not None:
            self.tuned = True
            self.reader.max_size = self.frame_max
            if rest:
                self.data_received(rest)

    def _stop(self) -> None:
        self.stopped = True
        self.transport.pause_reading()

    def output(self, items: list[Any]) -> None:
        """Write bytes and encode deliveries (:data:`~leveret.protocol.amqp.remote.Delivery`)."""
        parts: list[bytes] = []
        frame_max = self.frame_max
        for item in items:
            if type(item) is bytes:
                parts.append(item)
            else:
                number, consumer_tag, delivery_tag, redelivered, exchange, routing_key, header, body = item
                parts += encode_delivery(
                    number,
                    consumer_tag,
                    delivery_tag,
                    redelivered,
                    exchange,
                    routing_key,
                    header,
                    body,
                    frame_max,
                )
        self.transport.write(b"".join(parts))

    def set_reading(self) -> None:
        """Read unless the core, the link or a bad frame says not to."""
        if self.stopped or self.transport.is_closing():
            return
        if self.paused_by_core or self.worker.link_paused:
            self.transport.pause_reading()
        else:
            self.transport.resume_reading()

    def pause_writing(self) -> None:
        self.worker.link.send((WRITABLE, self.id, False))

    def resume_writing(self) -> None:
        self.worker.link.send((WRITABLE, self.id, True))

    def connection_lost(self, exc: Exception | None) -> None:
        self.worker.clients.pop(self.id, None)
        self.worker.link.send((LOST, self.id))


class CoreLink(Link):
    """The worker's end of the link: applies the core's records to its clients."""

    def __init__(self, worker: Worker) -> None:
        super().__init__(worker.loop)
        self.worker = worker

    def received(self, record: tuple[Any, ...]) -> None:
        kind, connection_id = record[0], record[1]
        worker = self.worker
        client = worker.clients.get(connection_id)
        if client is None:  # gone, or its socket is still on the way
            if kind in (CLOSE, ABORT):
                worker.closed_before_connected(connection_id, kind)
            return
        if kind == OUTPUT:
            client.output(record[2])
        elif kind == CLOSE:
            client.transport.close()
        elif kind == ABORT:
            client.transport.abort()
        elif kind in (PAUSE, RESUME):
            client.paused_by_core = kind == PAUSE
            client.set_reading()
        elif kind == FRAME_MAX:
            client.frame_max = client.reader.max_size = record[2]

    def pause_writing(self) -> None:
        """The core reads slower than the clients send: stop reading them."""
        self.worker.set_link_paused(True)

    def resume_writing(self) -> None:
        self.worker.set_link_paused(False)

    def connection_lost(self, exc: Exception | None) -> None:
        """The core is gone: so is this worker."""
        self.worker.done.set()


class Worker:
    """The worker's state: its clients by id and the link to the core."""

    def __init__(self, loop: asyncio.AbstractEventLoop, frame_max: int) -> None:
        self.loop = loop
        self.frame_max = frame_max
        self.clients: dict[int, Client] = {}
        #: Sockets received and being set up, with a CLOSE or ABORT that came meanwhile.
        self.connecting: dict[int, str | None] = {}
        #: Connections the core closed before their socket came (ids above
        #: :attr:`last_passed`: the core numbers them in order), with how.
        self.closed_early: dict[int, str] = {}
        self.last_passed = 0  # the highest connection id whose socket came
        self.link_paused = False
        self.link = CoreLink(self)
        self.done = asyncio.Event()

    def set_link_paused(self, paused: bool) -> None:
        self.link_paused = paused
        for client in list(self.clients.values()):
            client.set_reading()

    def closed_before_connected(self, connection_id: int, kind: str) -> None:
        """The core closed a connection that has no Client here (yet)."""
        if connection_id in self.connecting:
            self.connecting[connection_id] = kind
        elif connection_id > self.last_passed:
            self.closed_early[connection_id] = kind
        # else: its socket is gone already (the core hears of it, or has)

    def socket_passed(self, sockets: socket.socket) -> None:
        """A socket the core accepted came over the second socket pair."""
        try:
            data, fds, _, _ = socket.recv_fds(sockets, CONNECTION_ID.size, 1)
        except (BlockingIOError, InterruptedError):
            return
        if not data:  # the core closed its end
            self.done.set()
            return
        (connection_id,) = CONNECTION_ID.unpack(data)
        self.last_passed = max(self.last_passed, connection_id)
        if not fds:  # not passed (this process is out of descriptors): the client is gone
            self.link.send((LOST, connection_id))
            return
        client_socket = socket.socket(fileno=fds[0])
        if self.closed_early.pop(connection_id, None) is not None:
            client_socket.close()
            self.link.send((LOST, connection_id))
            return
        client_socket.setblocking(False)
        self.connecting[connection_id] = None
        self.loop.create_task(self._connect(connection_id, client_socket))

    async def _connect(self, connection_id: int, client_socket: socket.socket) -> None:
        try:
            await self.loop.connect_accepted_socket(lambda: Client(self, connection_id), client_socket)
        except OSError:  # gone before it could be set up
            self.connecting.pop(connection_id, None)
            client_socket.close()
            self.link.send((LOST, connection_id))


async def run(link_fd: int, sockets_fd: int, frame_max: int) -> None:
    """Serve until the core closes the link."""
    loop = asyncio.get_running_loop()
    worker = Worker(loop, frame_max)
    link_socket = socket.socket(fileno=link_fd)
    link_socket.setblocking(False)
    await loop.connect_accepted_socket(lambda: worker.link, link_socket)
    sockets = socket.socket(fileno=sockets_fd)
    sockets.setblocking(False)
    loop.add_reader(sockets.fileno(), worker.socket_passed, sockets)
    await worker.done.wait()
    loop.remove_reader(sockets.fileno())
    for client in list(worker.clients.values()):
        client.transport.abort()


def main(argv: list[str]) -> None:
    """``LINK_FD SOCKETS_FD FRAME_MAX``: the inherited socket pairs' file descriptors."""
    link_fd, sockets_fd, frame_max = (int(arg) for arg in argv)
    # Ctrl-C in a terminal or systemd's SIGTERM reaches the whole process group: the
    # core closes the clients (320) and then the links, which is when a worker exits.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    loop = new_event_loop()
    try:
        loop.run_until_complete(run(link_fd, sockets_fd, frame_max))
    finally:
        loop.close()


if __name__ == "__main__":
    main(sys.argv[1:])
