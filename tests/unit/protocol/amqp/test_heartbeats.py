"""The missed-heartbeat verdict of protocol.amqp.Connection, sans I/O: a fake loop whose
time moves only when the test says, a fake transport, and ``input_waiting`` standing
for the server's question "are bytes waiting unread on the socket?"."""

from __future__ import annotations

import pytest
from pamqp import commands, frame, heartbeat

from leveret.amqp.frames import PROTOCOL_HEADER
from leveret.core import BrokerCore
from leveret.core.clock import ManualClock
from leveret.protocol.amqp import Connection
from leveret.protocol.amqp.connection import HEARTBEAT_RECHECK

HEARTBEAT = 2  # seconds, as negotiated in tune-ok


class Timer:
    def __init__(self, when: float, callback) -> None:
        self.when, self.callback, self.cancelled = when, callback, False

    def cancel(self) -> None:
        self.cancelled = True


class Loop:
    def __init__(self) -> None:
        self.now = 100.0
        self.timers: list[Timer] = []

    def time(self) -> float:
        return self.now

    def call_later(self, delay: float, callback) -> Timer:
        self.timers.append(Timer(self.now + delay, callback))
        return self.timers[-1]

    def call_soon(self, callback) -> Timer:
        return self.call_later(0, callback)

    def advance(self, seconds: float) -> None:
        """Move time on, running each timer at its time (a loop that keeps up)."""
        end = self.now + seconds
        while due := sorted((t for t in self.timers if not t.cancelled and t.when <= end),
                            key=lambda t: t.when):
            self.timers.remove(due[0])
            self.now = max(self.now, due[0].when)
            due[0].callback()
        self.now = end

    def stall(self, seconds: float) -> None:
        """The loop is stuck for ``seconds``; then the overdue timers run, late."""
        self.now += seconds
        self.advance(0)


class Transport:
    aborted = closed = False

    def write(self, data: bytes) -> None:
        pass

    def abort(self) -> None:
        self.aborted = True

    def close(self) -> None:
        self.closed = True


def opened(input_waiting) -> tuple[Connection, Loop, Transport]:
    loop, transport = Loop(), Transport()
    connection = Connection(BrokerCore(ManualClock()), transport, loop, lambda c: None, "test:1", True,
                            input_waiting)
    connection.data_received(PROTOCOL_HEADER)
    for method in (commands.Connection.StartOk(mechanism="PLAIN", response="\0guest\0guest",
                                               locale="en_US"),
                   commands.Connection.TuneOk(channel_max=16, frame_max=4096, heartbeat=HEARTBEAT),
                   commands.Connection.Open(virtual_host="/")):
        connection.data_received(frame.marshal(method, 0))
    assert connection.state == "opened"
    return connection, loop, transport


def send_heartbeat(connection: Connection) -> None:
    connection.data_received(frame.marshal(heartbeat.Heartbeat(), 0))


@pytest.mark.parametrize("input_waiting", [lambda: False, None], ids=["nothing-waiting", "no-probe"])
def test_a_silent_client_is_dropped(input_waiting):
    connection, loop, transport = opened(input_waiting)
    loop.advance(2 * HEARTBEAT)
    assert not transport.aborted  # two intervals are allowed
    loop.advance(HEARTBEAT / 2 + 2 * HEARTBEAT_RECHECK)
    assert transport.aborted and connection.state == "closed"


def test_bytes_waiting_unread_keep_the_client_after_a_stall():
    waiting = [False]
    connection, loop, transport = opened(lambda: waiting[0])
    waiting[0] = True  # the client's heartbeats arrive while the loop stalls
    loop.stall(3 * HEARTBEAT)
    assert not transport.aborted
    send_heartbeat(connection)  # the loop reads them at last
    waiting[0] = False
    loop.advance(HEARTBEAT)
    assert not transport.aborted
    loop.advance(2 * HEARTBEAT)  # and then silence: dropped
    assert transport.aborted


def test_without_a_probe_the_verdict_waits_for_one_poll():
    connection, loop, transport = opened(None)
    loop.stall(3 * HEARTBEAT)  # overdue: the check looks again HEARTBEAT_RECHECK later
    assert not transport.aborted
    send_heartbeat(connection)  # read by the poll in between
    loop.advance(2 * HEARTBEAT_RECHECK)
    assert not transport.aborted
    loop.stall(3 * HEARTBEAT)  # overdue again, and nothing comes: dropped after the recheck
    assert not transport.aborted
    loop.advance(2 * HEARTBEAT_RECHECK)
    assert transport.aborted
