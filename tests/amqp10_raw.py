"""A tiny raw AMQP 1.0 client over a plain socket, for tests that must send what no real
client would (a silent peer, bad headers, oversized frames, garbage performatives) or read
exactly what the broker sends (the SASL outcome, the open's idle-time-out, empty frames).

Frames are encoded and read with leveret's codec (:mod:`leveret.protocol.amqp10.frames`,
checked against proton's C codec by its own tests); the socket is handled here.
"""

from __future__ import annotations

import socket
import time
from typing import Any

from leveret.protocol.amqp10 import performatives as perf
from leveret.protocol.amqp10.frames import (
    AMQP_HEADER,
    SASL_HEADER,
    TYPE_SASL,
    Frame,
    FrameReader,
    ProtocolHeader,
    encode_frame,
)


def plain_init(user: str = "guest", password: str = "guest") -> bytes:
    """A sasl-init frame for SASL PLAIN (RFC 4616: authzid, authcid, password)."""
    response = b"\0" + user.encode() + b"\0" + password.encode()
    return encode_frame(perf.SaslInit("PLAIN", response), type=TYPE_SASL)


class Closed(Exception):
    """The broker closed the socket."""


class RawAmqp10:
    """One TCP connection: :meth:`send` bytes or frames, :meth:`read` what comes back."""

    def __init__(self, host: str, port: int, timeout: float = 5.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.timeout = timeout
        # Big enough for anything a broker sends us (it respects our open's max-frame-size).
        self.reader = FrameReader(max_frame_size=1 << 24)
        self.pending: list[ProtocolHeader | Frame] = []

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawAmqp10:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_frame(self, body: Any, channel: int = 0, payload: bytes = b"", type: int = 0) -> None:
        self.send(encode_frame(body, channel, payload, type))

    def read(self, timeout: float | None = None) -> ProtocolHeader | Frame:
        """The next header or frame; raises :class:`Closed` when the broker closed the
        socket first, TimeoutError when nothing came in ``timeout`` seconds."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while not self.pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("nothing from the broker")
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                raise
            except ConnectionResetError as error:
                raise Closed("reset") from error
            if not data:
                raise Closed("end of stream")
            self.pending.extend(self.reader.feed(data))
        return self.pending.pop(0)

    def read_body(self, kind: type, timeout: float | None = None, skip: tuple[type, ...] = ()) -> Any:
        """Skip empty frames (heartbeats) and bodies of the ``skip`` types, and return the
        next frame body, which must be a ``kind``."""
        while True:
            item = self.read(timeout)
            if isinstance(item, Frame) and (item.body is None or isinstance(item.body, skip)):
                continue
            body = item.body if isinstance(item, Frame) else item
            assert isinstance(body, kind), f"expected {kind.__name__}, got {body!r:.300}"
            return body

    def wait_closed(self, timeout: float) -> list[ProtocolHeader | Frame]:
        """Read until the broker closes the socket (within ``timeout`` seconds), returning
        what came before; TimeoutError if it stays open."""
        seen: list[ProtocolHeader | Frame] = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                seen.append(self.read(max(0.001, deadline - time.monotonic())))
            except Closed:
                return seen
            except OSError as error:  # other resets
                if isinstance(error, TimeoutError):
                    raise
                return seen

    # -- handshakes ----------------------------------------------------------------------

    def sasl(self, user: str | None = "guest", password: str = "guest") -> perf.SaslOutcome:
        """SASL header and PLAIN (or ANONYMOUS with ``user=None``); the outcome."""
        self.send(SASL_HEADER)
        header = self.read()
        assert header == ProtocolHeader(3), header
        self.read_body(perf.SaslMechanisms)
        if user is None:
            self.send_frame(perf.SaslInit("ANONYMOUS", b""), type=TYPE_SASL)
        else:
            self.send(plain_init(user, password))
        return self.read_body(perf.SaslOutcome)

    def open(self, user: str = "guest", password: str = "guest", **fields: Any) -> perf.Open:
        """SASL PLAIN, the AMQP header and an open; returns the broker's open."""
        outcome = self.sasl(user, password)
        assert outcome.code == perf.SASL_OK, outcome
        self.send(AMQP_HEADER)
        fields.setdefault("container_id", "raw-test")
        fields.setdefault("hostname", "localhost")
        self.send_frame(perf.Open(**fields))
        assert self.read() == ProtocolHeader(0)
        return self.read_body(perf.Open)

    def begin(self, channel: int = 0) -> perf.Begin:
        self.send_frame(perf.Begin(next_outgoing_id=0, incoming_window=1000, outgoing_window=1000), channel)
        return self.read_body(perf.Begin)

    def attach_sender(self, target: str, name: str = "l", handle: int = 0) -> None:
        """Attach a link the client sends on to the ``target`` address (no answer read)."""
        self.send_frame(
            perf.Attach(
                name=name,
                handle=handle,
                role=perf.ROLE_SENDER,
                source=perf.Source(address="s"),
                target=perf.Target(address=target),
                initial_delivery_count=0,
            )
        )

    def sender(self, target: str, name: str = "l", handle: int = 0) -> perf.Flow:
        """:meth:`attach_sender`, then read the broker's attach; returns its flow (the
        credit it grants)."""
        self.attach_sender(target, name, handle)
        self.read_body(perf.Attach)
        return self.read_body(perf.Flow)
