"""The link between the core and one connection worker (``leveret server --workers N``,
docs/multicore.md §6): a Unix socket pair carrying batches of records, one batch per
event-loop turn, each a length-prefixed list of tuples in :mod:`marshal`'s format
(built-in types only; both ends run the same interpreter, and marshal is a third to a
half cheaper than pickle for these records).

Records from the worker, each naming the connection by the id the core gave it:

- ``(HEADER, id, bytes)``: the client's protocol header;
- ``(FRAMES, id, items)``: frames and parsed publishes (:mod:`leveret.amqp.handoff`);
- ``(FRAME_ERROR, id, text)``: the client sent a malformed frame (nothing more is read);
- ``(WRITABLE, id, bool)``: the client's socket crossed its high or low water mark;
- ``(LOST, id)``: the socket is closed.

Records from the core:

- ``(OUTPUT, id, items)``: bytes and deliveries to encode
  (:data:`leveret.protocol.amqp.remote.Delivery`), in order;
- ``(CLOSE, id)`` after the output, ``(ABORT, id)`` at once;
- ``(PAUSE, id)`` and ``(RESUME, id)``: stop and start reading the client;
- ``(FRAME_MAX, id, n)``: the negotiated frame_max.

The sockets themselves go from the core to the worker over a second socket pair
(datagrams with ``SCM_RIGHTS``), each with its id as an 8-byte big-endian integer.
"""

from __future__ import annotations

import asyncio
import marshal
import struct
from typing import Any, cast

HEADER, FRAMES, FRAME_ERROR, WRITABLE, LOST = "h", "f", "e", "w", "l"
OUTPUT, CLOSE, ABORT, PAUSE, RESUME, FRAME_MAX = "o", "c", "a", "p", "r", "m"

#: Bytes buffered towards the other side before the sender pauses (its clients'
#: reading in a worker, its deliveries in the core).
LINK_HIGH_WATER = 8 * 1024 * 1024
CONNECTION_ID = struct.Struct(">Q")  # the datagram that comes with a passed socket
_LENGTH = struct.Struct(">I")


def pack(records: list[tuple[Any, ...]]) -> bytes:
    """One batch, framed for the link."""
    data = marshal.dumps(records)
    return _LENGTH.pack(len(data)) + data


class Link(asyncio.Protocol):
    """One end of the link: records sent are written once per loop turn as one batch;
    batches received are passed, record by record, to :meth:`received`."""

    transport: asyncio.Transport | None = None

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._records: list[tuple[Any, ...]] = []
        self._buffer = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # a stream transport (uvloop's is no subclass)
        self.transport = transport
        transport.set_write_buffer_limits(high=LINK_HIGH_WATER)

    def send(self, record: tuple[Any, ...]) -> None:
        """Queue ``record`` for this turn's batch."""
        if not self._records:
            self.loop.call_soon(self._flush)
        self._records.append(record)

    def _flush(self) -> None:
        records, self._records = self._records, []
        transport = self.transport
        if records and transport is not None and not transport.is_closing():
            try:
                data = pack(records)
            except (ValueError, OverflowError, struct.error):  # over 2 GiB: one batch a record
                data = b"".join(pack([record]) for record in records)
            transport.write(data)

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        offset, end = 0, len(buffer)
        batches = []
        while end - offset >= 4:
            (size,) = _LENGTH.unpack_from(buffer, offset)
            if end - offset - 4 < size:
                break
            with memoryview(buffer) as view, view[offset + 4 : offset + 4 + size] as batch:
                batches.append(marshal.loads(batch))
            offset += 4 + size
        del buffer[:offset]  # first: a record that raises must not be applied twice
        for records in batches:
            for record in records:
                self.received(record)

    def received(self, record: tuple[Any, ...]) -> None:
        """One record from the other side."""
        raise NotImplementedError
