"""``leveret server --workers 2``: AMQP clients served through connection worker
processes (server/workers/). Real pika clients over TCP against a real server
process; a worker killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from eventually import eventually
from pika.exceptions import ChannelClosedByBroker
from servers import ServerProcess

from leveret.amqp.frames import PROTOCOL_HEADER


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = ServerProcess(tmp_path_factory.mktemp("workers") / "data", "--workers", "2")
    yield server
    server.kill()


def workers_of(pid: int) -> list[int]:
    """The connection worker processes of server ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat[1]) == pid and b"leveret.server.workers.process" in command:
            found.append(int(entry.name))
    return sorted(found)


def worker_holding(server: ServerProcess, connection: pika.BlockingConnection) -> int:
    """The worker holding ``connection``'s socket: the one with a descriptor of the TCP
    socket whose peer is the client's address."""
    client_port = connection._impl._transport._sock.getsockname()[1]
    inode = None
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local_port, remote_port = int(fields[1].split(":")[1], 16), int(fields[2].split(":")[1], 16)
        if local_port == server.port and remote_port == client_port:
            inode = fields[9]
    assert inode is not None
    for pid in workers_of(server.proc.pid):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                if os.readlink(fd) == f"socket:[{inode}]":
                    return pid
            except OSError:
                continue
    raise AssertionError("no worker holds the connection")


def connect(server: ServerProcess) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(server.url))


def test_two_workers_run_beside_the_core(server: ServerProcess) -> None:
    assert len(workers_of(server.proc.pid)) == 2


def test_publish_confirm_consume_ack_across_workers(server: ServerProcess) -> None:
    publisher, consumer = connect(server), connect(server)
    assert worker_holding(server, publisher) != worker_holding(server, consumer)  # round robin
    pub = publisher.channel()
    pub.confirm_delivery()
    pub.queue_declare("w-basic", durable=True)
    bodies = [f"m{i}".encode() * (i + 1) for i in range(200)]
    for i, body in enumerate(bodies):
        pub.basic_publish(
            "", "w-basic", body, pika.BasicProperties(delivery_mode=2, headers={"i": i}, message_id=str(i))
        )
    sub = consumer.channel()
    sub.basic_qos(prefetch_count=50)
    got = []
    for method, properties, body in sub.consume("w-basic", inactivity_timeout=5):
        assert method is not None, f"only {len(got)} of {len(bodies)} arrived"
        assert properties.headers == {"i": len(got)} and properties.message_id == str(len(got))
        got.append(body)
        sub.basic_ack(method.delivery_tag)
        if len(got) == len(bodies):
            break
    sub.cancel()
    assert got == bodies
    assert pub.queue_declare("w-basic", passive=True).method.message_count == 0
    publisher.close()
    consumer.close()


def test_a_message_larger_than_a_frame_both_ways(server: ServerProcess) -> None:
    connection = connect(server)
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("w-large", auto_delete=True)
    body = os.urandom(1_000_000)  # several body frames in, several out (frame_max 131072)
    channel.basic_publish("", "w-large", body)
    method, _, got = channel.basic_get("w-large", auto_ack=True)
    assert method is not None and got == body
    connection.close()


def test_a_channel_error_closes_that_channel_only(server: ServerProcess) -> None:
    connection, other = connect(server), connect(server)
    channel = connection.channel()
    with pytest.raises(ChannelClosedByBroker) as caught:
        channel.queue_declare("w-missing", passive=True)
    assert caught.value.reply_code == 404
    again = connection.channel()
    again.queue_declare("w-after", auto_delete=True)
    other_channel = other.channel()
    other_channel.queue_declare("w-other", auto_delete=True)
    connection.close()
    other.close()


def raw(server: ServerProcess, data: bytes) -> bytes:
    """What the server sends back to a raw client that sent ``data``, until it closes."""
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        sock.sendall(data)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
        return received


def test_a_wrong_protocol_header_gets_the_right_one(server: ServerProcess) -> None:
    assert raw(server, b"AMQP\x01\x01\x00\x0a") == PROTOCOL_HEADER


def test_a_malformed_frame_closes_the_connection_with_501(server: ServerProcess) -> None:
    bad_end = struct.pack(">BHI", 1, 0, 4) + b"\x00\x0a\x00\x0b" + b"\x00"  # end marker not 0xCE
    reply = raw(server, PROTOCOL_HEADER + bad_end)
    # connection.start, then connection.close 501 FRAME_ERROR
    assert b"\x00\x0a\x00\x32\x01\xf5" in reply


def test_a_killed_worker_requeues_its_connections_unacked_messages(server: ServerProcess) -> None:
    publisher, victim = connect(server), connect(server)
    pub = publisher.channel()
    pub.confirm_delivery()
    pub.queue_declare("w-kill")
    for i in range(20):
        pub.basic_publish("", "w-kill", str(i).encode())
    channel = victim.channel()
    channel.basic_qos(prefetch_count=20)
    held = []
    for method, _, body in channel.consume("w-kill", inactivity_timeout=5):
        assert method is not None
        held.append(body)
        if len(held) == 20:
            break
    assert pub.queue_declare("w-kill", passive=True).method.message_count == 0  # all unacked
    survivor_pid, victim_pid = worker_holding(server, publisher), worker_holding(server, victim)
    assert survivor_pid != victim_pid
    os.kill(victim_pid, signal.SIGKILL)
    back = eventually(lambda: pub.queue_declare("w-kill", passive=True).method.message_count >= 20, 10, 0.05)
    assert back, "the killed worker's unacked messages did not come back"  # the publisher carries on
    replaced = eventually(
        lambda: len(alive := workers_of(server.proc.pid)) >= 2 and victim_pid not in alive, 10, 0.05
    )
    assert replaced, "no worker replaced the killed one"
    fresh = connect(server)
    again = []
    for method, _, body in fresh.channel().consume("w-kill", auto_ack=True, inactivity_timeout=5):
        assert method is not None and method.redelivered
        again.append(body)
        if len(again) == 20:
            break
    assert sorted(again) == sorted(held)
    fresh.close()
    publisher.close()


@pytest.mark.parametrize("to_group", [False, True], ids=["to-the-broker", "to-its-process-group"])
def test_sigterm_closes_clients_with_320_and_stops_the_workers(tmp_path: Path, to_group: bool) -> None:
    # systemd (KillMode=control-group) and Ctrl-C signal every process of the group
    server = ServerProcess(tmp_path / "data", "--workers", "2", new_session=to_group)
    try:
        workers = workers_of(server.proc.pid)
        connection = connect(server)
        if to_group:
            os.killpg(server.proc.pid, signal.SIGTERM)
        else:
            server.proc.send_signal(signal.SIGTERM)
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as caught:
            connection.process_data_events(time_limit=10)
        assert caught.value.reply_code == 320
        assert server.proc.wait(10) == 0
        gone = eventually(lambda: not any(Path(f"/proc/{pid}").exists() for pid in workers), 10, 0.05)
        assert gone, "a worker outlived the broker"  # no worker outlives it
    finally:
        server.kill()
