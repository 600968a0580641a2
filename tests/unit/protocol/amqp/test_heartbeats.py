"""The missed-heartbeat verdict of protocol.amqp.Connection, sans I/O: the fake loop
(tests/sans_io.py) whose time moves only when the test says, a fake transport, and
``input_waiting`` standing for the server's question "are bytes waiting unread on the
socket?"."""

from __future__ import annotations

import pytest
from pamqp import commands, frame, heartbeat
from sans_io import FakeLoop, FakeTransport

from leveret.amqp.frames import PROTOCOL_HEADER
from leveret.core import BrokerCore
from leveret.protocol.amqp import Connection
from leveret.protocol.amqp.connection import HEARTBEAT_RECHECK

HEARTBEAT = 2  # seconds, as negotiated in tune-ok


def opened(input_waiting) -> tuple[Connection, FakeLoop, FakeTransport]:
    loop, transport = FakeLoop(), FakeTransport()
    connection = Connection(BrokerCore(loop), transport, loop, lambda c: None, "test:1", True,
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
