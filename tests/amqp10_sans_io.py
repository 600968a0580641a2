"""An AMQP 1.0 client on a sans-I/O :class:`~leveret.protocol.amqp10.connection.Amqp10Connection`
(tests/sans_io.py's fake loop is the broker's clock too), for the adapter's unit tests:
it sends performatives and reads back what the broker wrote, decoded with leveret's own
codec (which tests/unit/protocol/amqp10 compares with proton's)."""

from __future__ import annotations

from typing import Any

from sans_io import FakeLoop, FakeTransport

from leveret.core.broker import BrokerCore
from leveret.protocol.amqp10 import performatives as perf
from leveret.protocol.amqp10.connection import Amqp10Connection
from leveret.protocol.amqp10.frames import (
    AMQP_HEADER,
    SASL_HEADER,
    TYPE_SASL,
    Frame,
    FrameReader,
    ProtocolHeader,
    encode_frame,
)
from leveret.protocol.amqp10.types import encode


def message_payload(
    body: bytes = b"hello",
    durable: bool = False,
    to: str | None = None,
    annotations: dict[str, Any] | None = None,
    **app: Any,
) -> bytes:
    """A bare message: header, message annotations, properties (with ``to``),
    application properties, data."""
    parts: list[Any] = [perf.Header(durable=durable)]
    if annotations:
        parts.append(perf.MessageAnnotations(annotations))
    if to is not None:
        parts.append(perf.Properties(to=to))
    if app:
        parts.append(perf.ApplicationProperties(app))
    parts.append(perf.Data(body))
    return b"".join(encode(perf.to_described(p)) for p in parts)


class Client:
    """One AMQP 1.0 client on a sans-I/O connection."""

    def __init__(self, core: BrokerCore, loop: FakeLoop, peer: str = "127.0.0.1:5000") -> None:
        self.loop = loop
        self.transport = FakeTransport()
        self.pending: set[Amqp10Connection] = set()
        self.connection = Amqp10Connection(core, self.transport, loop, self.pending.add, peer)
        self.reader = FrameReader(2**30)
        self._read = 0

    def write(self, data: bytes) -> None:
        self.connection.data_received(data)
        self.flush()

    def send(self, body: Any, channel: int = 0, payload: bytes = b"", type_: int = 0) -> None:
        self.write(encode_frame(body, channel, payload, type_))

    def flush(self) -> None:
        while self.pending:
            self.pending.pop().flush()

    def received(self) -> list[ProtocolHeader | Frame]:
        """Headers and frames written since the last call (after the loop turns due now)."""
        self.loop.advance(0)
        self.flush()
        data = bytes(self.transport.output[self._read :])
        self._read = len(self.transport.output)
        return self.reader.feed(data)

    def bodies(self) -> list[Any]:
        return [item.body for item in self.received() if isinstance(item, Frame)]

    def login(self, mechanism: str = "PLAIN", response: bytes = b"\x00guest\x00guest") -> list[Any]:
        self.write(SASL_HEADER)
        self.send(perf.SaslInit(mechanism, response), type_=TYPE_SASL)
        return self.received()

    def open(self, hostname: str | None = None, idle_time_out: int | None = None) -> perf.Open:
        self.login()
        self.write(AMQP_HEADER)
        self.send(perf.Open("client", hostname=hostname, idle_time_out=idle_time_out))
        items = self.received()
        assert items[0] == ProtocolHeader(0)
        assert isinstance(items[1].body, perf.Open), items
        return items[1].body

    def begin(self, channel: int = 0) -> perf.Begin:
        self.send(perf.Begin(None, 0, 1000, 1000), channel)
        (begin,) = self.bodies()
        return begin

    def attach_sender(
        self, address: str | None, handle: int = 0, channel: int = 0, settled: bool = False
    ) -> list[Any]:
        """Attach a link the client sends on (target ``address``): the broker's attach
        and its flow granting credit (or its refusal)."""
        mode = perf.SND_SETTLED if settled else perf.SND_UNSETTLED
        self.send(
            perf.Attach(
                f"sender-{handle}",
                handle,
                perf.ROLE_SENDER,
                mode,
                perf.RCV_FIRST,
                perf.Source(),
                perf.Target(address),
                initial_delivery_count=0,
            ),
            channel,
        )
        return self.bodies()

    def attach_receiver(
        self, address: str, handle: int = 1, channel: int = 0, settled: bool = False
    ) -> list[Any]:
        mode = perf.SND_SETTLED if settled else perf.SND_UNSETTLED
        self.send(
            perf.Attach(
                f"receiver-{handle}",
                handle,
                perf.ROLE_RECEIVER,
                mode,
                perf.RCV_FIRST,
                perf.Source(address),
                perf.Target(),
            ),
            channel,
        )
        return self.bodies()

    def transfer(
        self,
        handle: int,
        delivery_id: int,
        payload: bytes,
        settled: bool = False,
        more: bool = False,
        channel: int = 0,
    ) -> None:
        self.send(
            perf.Transfer(handle, delivery_id, delivery_id.to_bytes(4, "big"), 0, settled, more),
            channel,
            payload,
        )

    def flow(
        self,
        handle: int,
        credit: int,
        delivery_count: int = 0,
        drain: bool = False,
        channel: int = 0,
        next_incoming_id: int = 0,
    ) -> None:
        self.send(
            perf.Flow(next_incoming_id, 1000, 0, 1000, handle, delivery_count, credit, drain=drain), channel
        )

    @property
    def closed(self) -> bool:
        return self.transport.closed or self.transport.aborted
