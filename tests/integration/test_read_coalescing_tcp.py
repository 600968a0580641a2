"""Read coalescing over real TCP: a client writing each frame on its own (as pika's
SelectConnection does) is read in batches, loses nothing and still gets prompt answers;
a client that waits for answers (publisher confirms) is never held."""

from __future__ import annotations

import socket
import time

import pytest
from amqp_raw import connected
from eventually import eventually_equal, poll
from pamqp import commands

from leveret import BlockingBroker

MESSAGES = 2000
ROUNDS = 5  # a broker starved of CPU reads big chunks by itself: try a few streams


def frames_of(data: bytes) -> list[bytes]:
    """Encoded frames cut apart by their size fields (7-byte header, payload, end)."""
    frames = []
    while data:
        stop = 7 + int.from_bytes(data[3:7], "big") + 1
        frames.append(data[:stop])
        data = data[stop:]
    return frames


def trickle(client, count: int) -> None:
    """Publish ``count`` messages to queue ``q``, one frame per send, no Nagle."""
    client.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    parts = frames_of(client.publish_frames(1, "q", b"x" * 100))
    assert len(parts) == 3  # method, content header, body
    for _ in range(count):
        for part in parts:
            client.send(part)


def depth(client) -> tuple[int, float]:
    """The queue's message count by passive queue.declare, and how long the answer took
    (seconds); publisher confirms before it are skipped."""
    started = time.monotonic()
    client.send_method(1, commands.Queue.Declare(queue="q", passive=True))
    ok = client.skip_until(commands.Queue.DeclareOk)
    return ok.message_count, time.monotonic() - started


@pytest.mark.parametrize("hold_ms", [1, 0])
def test_a_frame_by_frame_publisher_is_read_in_batches_and_loses_nothing(hold_ms):
    with BlockingBroker(amqp_port=0, read_coalesce_ms=hold_ms) as broker:
        listener = broker.broker.listener
        with connected(broker.amqp_port) as client:
            client.send_method(1, commands.Queue.Declare(queue="q"))
            client.expect(commands.Queue.DeclareOk, 1)
            for sent in range(MESSAGES, MESSAGES * (ROUNDS + 1), MESSAGES):
                trickle(client, MESSAGES)
                count, answered_in = depth(client)
                assert count == sent
                assert answered_in < 0.5  # a request after the stream waits at most one hold
                if listener.read_holds or not hold_ms:
                    break
        assert listener.read_holds > 0 if hold_ms else listener.read_holds == 0


def test_what_a_held_client_sent_is_seen_by_the_next_connection_read():
    """A 10 s hold, so only the early release can explain the count: a passive declare
    from a second connection sees every message the first one sent before it."""
    with BlockingBroker(amqp_port=0, read_coalesce_ms=10_000) as broker:
        listener = broker.broker.listener
        with connected(broker.amqp_port) as client, connected(broker.amqp_port) as observer:
            client.send_method(1, commands.Queue.Declare(queue="q"))
            client.expect(commands.Queue.DeclareOk, 1)
            for sent in range(MESSAGES, MESSAGES * (ROUNDS + 1), MESSAGES):
                trickle(client, MESSAGES)
                # What was not held is handled within milliseconds (a long read over a
                # few loop turns, see protocol/turns.py); a held socket would take 10 s.
                count = poll(lambda: depth(observer), lambda count, sent=sent: count[0] >= sent, 1.0, 0.01)
                assert count[0] == sent and count[1] < 1
                if listener.read_holds:
                    break
            assert listener.read_holds > 0 and not listener.held
            trickle(client, 10)  # and the released socket is read again by the loop
            assert eventually_equal(lambda: depth(observer)[0], sent + 10) == sent + 10


def test_a_publisher_waiting_for_confirms_is_never_held():
    with BlockingBroker(amqp_port=0) as broker:
        with connected(broker.amqp_port) as client:
            client.send_method(1, commands.Queue.Declare(queue="q"))
            client.expect(commands.Queue.DeclareOk, 1)
            client.send_method(1, commands.Confirm.Select())
            client.expect(commands.Confirm.SelectOk, 1)
            trickle(client, MESSAGES)
            count, _ = depth(client)
        assert count == MESSAGES
        assert broker.broker.listener.read_holds == 0
