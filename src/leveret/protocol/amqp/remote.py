"""An AMQP connection whose socket a connection worker holds (``leveret server
--workers N``, docs/multicore.md §6).

The whole protocol state (handshake, channels, consumers, unacknowledged deliveries,
confirms, transactions) stays here, in the core, exactly as for a socket the core reads
itself: only the byte work moves. The worker sends the protocol header, then frames
already split, with whole publishes already parsed (:mod:`leveret.amqp.handoff`);
deliveries leave as tuples the worker encodes, everything else as encoded bytes, in
one ordered list per flush.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from ...amqp.errors import FRAME_ERROR, from_reply
from ...amqp.frames import FrameError
from ..output import OUTPUT_LIMIT
from ..transport import Transport
from .connection import Connection

#: Frames and publishes waiting for a later turn before the worker is told to stop
#: reading the client (about 10 ms of the core's work)...
STASH_LIMIT = 2000
#: ...or bytes read meanwhile (a single process reads at most 1 MiB before it pauses).
STASH_BYTES = 4 * 1024 * 1024

#: A delivery for the worker to encode: ``(channel, consumer_tag, delivery_tag,
#: redelivered, exchange, routing_key, header, body)``, as :meth:`Connection.send_delivery`.
Delivery = tuple[int, bytes, int, bool, str, str, bytes, bytes]


class WorkerTransport(Transport, Protocol):
    """A transport that also takes a flush's items (bytes and :data:`Delivery` tuples)
    and tells the worker a connection's ``frame_max``."""

    def write_items(self, items: list[Any]) -> None:
        """Send ``items`` to the client, in order."""

    def set_frame_max(self, frame_max: int) -> None:
        """The negotiated frame_max: the worker's frame reader refuses larger frames."""


class RemoteConnection(Connection):
    """A :class:`Connection` fed by a worker: :meth:`header_received`, then
    :meth:`frames_received`; :meth:`frame_error` when the worker's frame reader failed.
    Deliveries stop while the client's socket or the link to the worker is full."""

    transport: WorkerTransport

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._client_writable = True
        self._link_writable = True
        self._stash_bytes = 0  # bytes of the reads appended to the stash since it formed

    def header_received(self, header: bytes) -> None:
        """The protocol header (8 bytes, or fewer that cannot start it)."""
        self.data_received(header)

    def frames_received(self, items: list[tuple[int, int, Any]], size: int) -> None:
        """Frames and parsed publishes, in the order the client sent them; ``size``: the
        bytes they were read from."""
        self.last_received = self.loop.time()
        if self.state in ("closed", "refusing", "header"):
            return
        if self._stash is not None:  # earlier frames wait (for the store, or a turn)
            self._stash += items
            self._stash_bytes += size
            if self._stash_bytes > STASH_BYTES or len(self._stash) > STASH_LIMIT:
                self.transport.pause_reading()  # resumed once the stash is empty
            return
        self._run_frames(items)

    def _stored(self, ok: bool, callback: Callable[[bool], None]) -> None:
        super()._stored(ok, callback)
        if self._stash is None:  # all handled: a new stash counts from zero
            self._stash_bytes = 0

    def _defer(self, frames: list[tuple[int, int, Any]]) -> None:
        """The rest of a batch waits for the next turn. The worker keeps reading (a
        pause costs a round trip) until :data:`STASH_LIMIT` items wait: each turn copies
        what is left, so a core slower than its clients must stop them there."""
        self._stash = frames
        if len(frames) > STASH_LIMIT:
            self.transport.pause_reading()  # resumed once the stash is empty
        self.loop.call_soon(self._next_turn)

    def frame_error(self, text: str) -> None:
        """The worker found a malformed frame: 501 FRAME_ERROR, then the socket is closed
        (as :meth:`Connection.data_received`). ``text`` is the worker's reply text,
        already ``FRAME_ERROR - ...``."""
        error = from_reply(FrameError, FRAME_ERROR, text)
        assert isinstance(error, FrameError)
        self._connection_error(error, 0, 0)
        self.close_transport()

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
        """Queue the delivery for the worker to encode (see :meth:`Connection.send_delivery`)."""
        self._want_flush()
        self._out.append(
            (channel, consumer_tag, delivery_tag, redelivered, exchange, routing_key, header, body)
        )
        self._out_size += len(body)
        if self._out_size >= OUTPUT_LIMIT:
            self.writable = False

    def _write(self, out: list[Any]) -> None:
        self.transport.write_items(list(out))

    def _tune_ok(self, m: Any) -> None:
        super()._tune_ok(m)
        self.transport.set_frame_max(self.frame_max)

    def set_client_writable(self, writable: bool) -> None:
        """The client's socket crossed its worker's high (False) or low (True) water mark."""
        self._client_writable = writable
        self.set_writable(writable and self._link_writable)

    def set_link_writable(self, writable: bool) -> None:
        """The link to the worker crossed its high (False) or low (True) water mark."""
        self._link_writable = writable
        self.set_writable(writable and self._client_writable)
