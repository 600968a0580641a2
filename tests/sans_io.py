"""Driving the broker's AMQP adapter without sockets: a fake loop and transport, and a
:class:`Harness` that feeds a real :class:`~leveret.protocol.amqp.Connection` (on a real
BrokerCore with a manual clock) bytes and decodes what it writes. Used by the unit tests
of the protocol layer and by benchmarks of the publish path."""

from __future__ import annotations

import itertools
import os

from hypothesis import HealthCheck, settings
from pamqp import commands, frame as pamqp_frame

from leveret.amqp.frames import FRAME_METHOD, PROTOCOL_HEADER, FrameReader, encode_frame
from leveret.core.broker import BrokerCore
from leveret.core.clock import ManualClock
from leveret.protocol.amqp import Connection

# LEVERET_FUZZ_EXAMPLES=5000 for a longer hunt; the default keeps the suite fast.
FUZZ = settings(max_examples=int(os.environ.get("LEVERET_FUZZ_EXAMPLES", 150)), deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    """``data`` cut at the given points (taken modulo its length)."""
    points = sorted({c % (len(data) + 1) for c in cuts})
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


class FakeTimer:
    def __init__(self, loop: FakeLoop, when: float, callback) -> None:
        self.when, self.callback, self.cancelled = when, callback, False

    def cancel(self) -> None:
        self.cancelled = True


class FakeLoop:
    """Time stands still unless a test advances it; timers are recorded, not run."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.timers: list[FakeTimer] = []

    def time(self) -> float:
        return self.now

    def call_later(self, delay: float, callback, *args) -> FakeTimer:
        timer = FakeTimer(self, self.now + delay, lambda: callback(*args))
        self.timers.append(timer)
        return timer

    def call_soon(self, callback, *args) -> FakeTimer:
        return self.call_later(0, callback, *args)


class FakeTransport:
    def __init__(self) -> None:
        self.output = bytearray()
        self.closed = self.aborted = False

    def write(self, data: bytes) -> None:
        assert not (self.closed or self.aborted), "write after close"
        self.output += data

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def get_extra_info(self, name: str, default=None):
        return default

    def set_write_buffer_limits(self, **kwargs) -> None:
        pass


class Harness:
    """A Connection fed bytes directly; output flushed after every read, as the
    listener does once per loop turn."""

    def __init__(self) -> None:
        self.core = BrokerCore(ManualClock())
        self.transport = FakeTransport()
        self.loop = FakeLoop()
        self.pending = set()
        self.connection = Connection(self.core, self.transport, self.loop, self.pending.add,
                                     "fuzz:1", True)

    def feed(self, data: bytes) -> None:
        self.connection.data_received(data)
        for conn in list(self.pending):
            conn.flush()
        self.pending.clear()

    def frames(self) -> list[tuple[int, object]]:
        """Everything written: methods decoded, other frames as (type, payload) (content
        headers pass through the broker as the publisher sent them)."""
        data = bytes(self.transport.output)
        if data.startswith(b"AMQP"):
            data = data[8:]
        out = []
        for frame_type, channel, payload in FrameReader(1 << 40).feed(data):
            if frame_type == FRAME_METHOD:
                out.append((channel, pamqp_frame.unmarshal(encode_frame(frame_type, channel, payload))[2]))
            else:
                out.append((channel, (frame_type, payload)))
        return out

    def handshake(self) -> None:
        self.feed(PROTOCOL_HEADER)
        self.feed(pamqp_frame.marshal(commands.Connection.StartOk(
            mechanism="PLAIN", response="\x00guest\x00guest", locale="en_US"), 0))
        self.feed(pamqp_frame.marshal(commands.Connection.TuneOk(
            channel_max=16, frame_max=4096, heartbeat=0), 0))
        self.feed(pamqp_frame.marshal(commands.Connection.Open(virtual_host="/"), 0))
        self.feed(pamqp_frame.marshal(commands.Channel.Open(), 1))
        assert self.connection.state == "opened"
        assert isinstance(self.frames()[-1][1], commands.Channel.OpenOk)


def method_frame(channel: int, method) -> bytes:
    return pamqp_frame.marshal(method, channel)

