"""Driving the broker's adapters without sockets: the one fake loop (a steppable clock)
and fake transport of the unit tests, and a :class:`Harness` that feeds a real
:class:`~leveret.protocol.amqp.Connection` (on a real BrokerCore whose clock is the fake
loop) bytes and decodes what it writes. Used by the unit tests of the protocol and server
layers and by benchmarks of the publish path."""

from __future__ import annotations

import functools
import itertools
import os
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, settings
from pamqp import commands, frame as pamqp_frame

from leveret.amqp.frames import FRAME_METHOD, PROTOCOL_HEADER, FrameReader, encode_frame
from leveret.core.broker import BrokerCore
from leveret.core.clock import ManualClock, Timer
from leveret.protocol.amqp import Connection

# LEVERET_FUZZ_EXAMPLES=5000 for a longer hunt; the default keeps the suite fast.
FUZZ = settings(max_examples=int(os.environ.get("LEVERET_FUZZ_EXAMPLES", 150)), deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    """``data`` cut at the given points (taken modulo its length)."""
    points = sorted({c % (len(data) + 1) for c in cuts})
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


class FakeLoop(ManualClock):
    """The event loop of every sans-I/O test, and the broker's clock too
    (``BrokerCore(loop)``), so one clock moves everything: time stands still unless the
    test calls :meth:`advance` (seconds), which runs due timers in the order they fall
    due (a loop that keeps up). ``call_soon`` is a timer due now: it runs at the next
    :meth:`advance`, ``advance(0)`` being the next loop turn. ``monotonic()`` is the same
    time, so a turn's budget (protocol/turns.py) never runs out on a busy machine,
    unless a test sets :attr:`work_per_look`."""

    #: Seconds of work each look at ``monotonic()`` finds done since the last one: a
    #: test whose turns must run out of budget sets it (timers do not see this time).
    work_per_look = 0.0

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        super().__init__(start)
        self._worked = 0.0

    def monotonic(self) -> float:
        self._worked += self.work_per_look
        return self.now + self._worked

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> Timer:
        return super().call_later(delay, functools.partial(callback, *args) if args else callback)

    def call_soon(self, callback: Callable[..., Any], *args: Any) -> Timer:
        return self.call_later(0, callback, *args)

    def stall(self, seconds: float) -> None:
        """The loop is stuck for ``seconds`` (nothing runs); then the overdue timers
        run, late."""
        self.now += seconds
        self.advance(0)

    def pending(self) -> list[float]:
        """When each timer not yet run nor cancelled falls due, soonest first."""
        return sorted(when for when, _, timer, _ in self._timers if not timer.cancelled)


class FakeTransport:
    """Records what the connection writes, and whether reading is paused (the turn
    budget and read coalescing pause it; a blocked publisher too)."""

    def __init__(self) -> None:
        self.output = bytearray()
        self.closed = self.aborted = False
        self.reading = True
        self.pauses = 0  # pause_reading calls

    def write(self, data: bytes) -> None:
        assert not (self.closed or self.aborted), "write after close"
        self.output += data

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def pause_reading(self) -> None:
        self.reading = False
        self.pauses += 1

    def resume_reading(self) -> None:
        self.reading = True

    def get_extra_info(self, name: str, default=None):
        return default

    def set_write_buffer_limits(self, **kwargs) -> None:
        pass


class Harness:
    """A Connection fed bytes directly; output flushed after every read, as the
    listener does once per loop turn. The loop is the broker's clock too."""

    def __init__(self) -> None:
        self.loop = FakeLoop()
        self.core = BrokerCore(self.loop)
        self.transport = FakeTransport()
        self.pending = set()
        self.connection = Connection(self.core, self.transport, self.loop, self.pending.add,
                                     "fuzz:1", True)

    def feed(self, data: bytes) -> None:
        """One read: fed, flushed, then the turns that are due at once run (the rest of
        a read whose turn's budget ran out)."""
        self.connection.data_received(data)
        self.run_turns()

    def flush(self) -> None:
        """Write what connections queued (the listener does it at the end of a turn)."""
        for conn in list(self.pending):
            conn.flush()
        self.pending.clear()

    def run_turns(self) -> None:
        """Flush, then run the next loop turns (what is due now: the rest of a read
        left for a later turn, say) until nothing is due."""
        self.flush()
        while self.loop.pending() and self.loop.pending()[0] <= self.loop.now:
            self.loop.advance(0)
            self.flush()

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

