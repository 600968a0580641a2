"""A tiny raw AMQP 0-9-1 client over a plain socket, for tests that must send what no
real client library would: bad frames, half messages, abrupt disconnects.

Frames are encoded and decoded with :mod:`leveret.amqp` (its frames and fast paths,
which are checked against pamqp); the socket and the framing loop are written out here so
a test can also send arbitrary bytes.
"""

from __future__ import annotations

import socket
import struct
import time

from pamqp import commands, heartbeat

from leveret.amqp.delivery import decode_frame
from leveret.amqp.frames import (
    HEARTBEAT,
    PROTOCOL_HEADER,
    encode_method,
    encode_publish,
)
from leveret.amqp.properties import properties_dict

PLAIN_GUEST = "\x00guest\x00guest"
FRAME_END = b"\xce"


def raw_frame(frame_type: int, channel: int, payload: bytes, end: bytes = FRAME_END) -> bytes:
    """One frame built by hand (so tests can get any field wrong)."""
    return struct.pack(">BHI", frame_type, channel, len(payload)) + payload + end


class ConnectionGone(Exception):
    """The broker closed the socket."""


class RawClient:
    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 5.0,
                 source: str | None = None) -> None:
        """``source``: the local address to connect from (another host, as the broker sees it)."""
        self.sock = socket.create_connection((host, port), timeout=timeout,
                                             source_address=(source, 0) if source else None)
        self.buffer = b""
        self.heartbeats_received = 0

    # -- sending --------------------------------------------------------------------
    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_method(self, channel: int, method) -> None:
        self.send(encode_method(channel, method))

    def publish(self, channel: int, routing_key: str, body: bytes, exchange: str = "",
                properties: commands.Basic.Properties | None = None) -> None:
        self.send(self.publish_frames(channel, routing_key, body, exchange, properties))

    @staticmethod
    def publish_frames(channel: int, routing_key: str, body: bytes, exchange: str = "",
                       properties: commands.Basic.Properties | None = None) -> bytes:
        # the body in one frame, whatever its size (a test may want it too large)
        return encode_publish(channel, exchange, routing_key, body,
                              properties_dict(properties), len(body) + 9)

    def send_heartbeat(self) -> None:
        self.send(HEARTBEAT)

    # -- receiving ------------------------------------------------------------------
    def _fill(self, count: int) -> None:
        while len(self.buffer) < count:
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                data = b""
            if not data:
                raise ConnectionGone(f"socket closed with {self.buffer!r} buffered")
            self.buffer += data

    def read_raw(self, count: int) -> bytes:
        self._fill(count)
        data, self.buffer = self.buffer[:count], self.buffer[count:]
        return data

    def read_frame(self) -> tuple[int, object]:
        """(channel, pamqp frame), heartbeats included."""
        self._fill(7)
        size = struct.unpack_from(">I", self.buffer, 3)[0]
        data = self.read_raw(7 + size + 1)
        channel, value = decode_frame(data)
        if isinstance(value, heartbeat.Heartbeat):
            self.heartbeats_received += 1
        return channel, value

    def expect(self, kind: type, channel: int | None = None):
        """Read frames (skipping heartbeats) until one of ``kind``; fail on anything
        else."""
        while True:
            number, value = self.read_frame()
            if isinstance(value, heartbeat.Heartbeat):
                continue
            assert isinstance(value, kind), f"expected {kind.__name__}, got {value!r} on channel {number}"
            if channel is not None:
                assert number == channel
            return value

    def skip_until(self, kind: type):
        """Read frames, whatever they are, until one of ``kind``."""
        while True:
            _, value = self.read_frame()
            if isinstance(value, kind):
                return value

    def expect_connection_close(self) -> commands.Connection.Close:
        """Read frames until connection.close, answer close-ok, check the socket
        then closes; returns the close method."""
        value = self.skip_until(commands.Connection.Close)
        self.send_method(0, commands.Connection.CloseOk())
        assert self.closed_within(3.0), "socket still open after connection.close-ok"
        return value

    def closed_within(self, seconds: float) -> bool:
        """Whether the broker closes the socket within ``seconds`` (data read meanwhile
        is discarded)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                return False
            except (ConnectionResetError, BrokenPipeError):
                return True
            if not data:
                return True
        return False

    # -- handshake ------------------------------------------------------------------
    def handshake(self, heartbeat_interval: int = 0, channel_max: int = 0,
                  frame_max: int = 0, vhost: str = "/",
                  mechanism: str = "PLAIN", response: str = PLAIN_GUEST) -> None:
        self.send(PROTOCOL_HEADER)
        self.expect(commands.Connection.Start, 0)
        self.send_method(0, commands.Connection.StartOk(
            client_properties={"product": "raw test client"}, mechanism=mechanism,
            response=response, locale="en_US"))
        self.expect(commands.Connection.Tune, 0)
        self.send_method(0, commands.Connection.TuneOk(
            channel_max=channel_max, frame_max=frame_max, heartbeat=heartbeat_interval))
        self.send_method(0, commands.Connection.Open(virtual_host=vhost))
        self.expect(commands.Connection.OpenOk, 0)

    def open_channel(self, number: int = 1) -> None:
        self.send_method(number, commands.Channel.Open())
        self.expect(commands.Channel.OpenOk, number)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connected(port: int, **handshake) -> RawClient:
    """A raw client past connection.open with channel 1 open."""
    client = RawClient(port)
    client.handshake(**handshake)
    client.open_channel(1)
    return client
