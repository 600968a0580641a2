"""What a sans-I/O connection (AMQP or STOMP) has to send, written once per event-loop
turn.

A connection queues encoded bytes with :meth:`Output.send` and deliveries with
:meth:`Output.send_parts`; the first asks the server (``request_flush``) to call
:meth:`Output.flush` at the end of the turn, which writes everything in one transport
write. Deliveries stop (``writable`` false) once a turn has queued
:data:`OUTPUT_LIMIT` body bytes, or while the transport is above its high water mark
(:meth:`Output.set_writable`), so a client that never reads cannot make the broker
buffer a whole backlog for it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

OUTPUT_LIMIT = 1024 * 1024  # bytes of delivered bodies queued in one loop turn, at most
HIGH_WATER = 4 * 1024 * 1024  # bytes a client's socket buffers before its consumers pause


class Output:
    """The output half of a connection; subclasses call :meth:`_init_output` and
    implement :meth:`_resume` (consumers may deliver again) and, if they have
    something to add at the last moment, :meth:`_flushing`."""

    transport: Any
    loop: Any
    state: str

    def _init_output(self, request_flush: Callable[[Any], None]) -> None:
        self._request_flush = request_flush
        #: Deliveries may be queued now: the transport is below its high water mark and
        #: this loop turn has queued less than OUTPUT_LIMIT body bytes.
        self.writable = True
        self._transport_writable = True  # below the transport's high water mark
        #: Encoded bytes (and, on a connection a worker holds, deliveries it encodes).
        self._out: list[Any] = []
        self._out_size = 0  # body bytes of deliveries queued since the last flush
        self._flush_requested = False
        self.last_sent = self.loop.time()

    def _want_flush(self) -> None:
        if not self._flush_requested:
            self._flush_requested = True
            self._request_flush(self)

    def send(self, data: bytes) -> None:
        """Queue encoded bytes; the server writes them at :meth:`flush`, once per
        event-loop turn."""
        if not self._flush_requested:
            self._flush_requested = True
            self._request_flush(self)
        self._out.append(data)

    def send_parts(self, parts: list[bytes], size: int) -> None:
        """Queue a delivery in pieces (AMQP: method, header, body frames; STOMP: head,
        body, NUL) carrying a body of ``size`` bytes."""
        if not self._flush_requested:
            self._flush_requested = True
            self._request_flush(self)
        self._out += parts
        self._out_size += size
        if self._out_size >= OUTPUT_LIMIT:
            # One loop turn could otherwise queue a whole backlog for a client that
            # never reads: consumers wait for the flush (and the transport's room).
            self.writable = False

    def flush(self) -> None:
        """Write everything queued since the last flush in one transport write."""
        self._flush_requested = False
        self._flushing()
        if self._out and self.state != "closed":
            self._write(self._out)  # may call set_writable(False)
            self.last_sent = self.loop.time()
        self._out.clear()
        full, self._out_size = self._out_size >= OUTPUT_LIMIT, 0
        if full and self._transport_writable:  # room again: consumers carry on
            self.writable = True
            self._resume()

    def _write(self, out: list[Any]) -> None:
        """Write the turn's output (the list is cleared afterwards)."""
        self.transport.write(b"".join(out))

    def set_writable(self, writable: bool) -> None:
        """The transport's buffer crossed its high (False) or low (True) water mark."""
        self._transport_writable = writable
        self.writable = writable and self._out_size < OUTPUT_LIMIT
        if self.writable:
            self._resume()

    def _flushing(self) -> None:
        """Just before a flush writes: the last frames of the turn may be queued."""

    def _resume(self) -> None:
        """Deliveries may go out again."""
        raise NotImplementedError
