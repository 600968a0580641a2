"""A third protocol needs no copy of the connection bookkeeping: a tiny line protocol,
written here on :class:`leveret.protocol.adapter.AdapterConnection` and
:mod:`leveret.core.lifecycle` alone, on a real TCP listener inside an in-process broker.
Its connections are listed by the management API (real HTTP) and by ``leveret ctl``
(a real subprocess), closed by an operator both ways and by a vhost deletion, share
the login throttle and the resource alarms, and leave nothing registered behind.

The protocol: the client sends ``LOGIN <user> <password> <vhost> [<client-id>]``; the
broker answers ``OK`` or ``ERROR <text>`` (then closes), and ``CLOSED <text>`` when it
closes an open connection. ``PING`` is answered ``PONG``.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import subprocess
import sys
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import pytest
from eventually import eventually
from targets import Target

from leveret import BlockingBroker
from leveret.core.auth import AuthenticationError
from leveret.core.connections import ChannelFacts, ConnectionFacts
from leveret.core.lifecycle import ClientIdInUse, ConnectionRefused
from leveret.core.login_throttle import ThrottleSettings
from leveret.protocol.adapter import AdapterConnection

log = logging.getLogger("leveret.line")
PROTOCOL = "LINE 1.0"


class LineConnection(AdapterConnection):
    """The whole adapter: its own checks in its own order, then the lifecycle."""

    def _init_protocol(self) -> None:
        self.state = "login"
        self.alarms: list[bool] = []

    def _resume(self) -> None:  # (no deliveries in this protocol)
        pass

    def line_received(self, line: str) -> None:
        words = line.split()
        if self.state == "opened" and words == ["PING"]:
            self.send(b"PONG\n")
        elif self.state == "login" and words[:1] == ["LOGIN"] and len(words) in (4, 5):
            self._login(*words[1:])
        else:
            self._refuse(f"unexpected {line[:20]!r}")

    def _login(self, name: str, password: str, vhost_name: str, client_id: str | None = None) -> None:
        try:
            user = self.core.users.authenticate(name, password, self.from_loopback, "PLAIN")
        except AuthenticationError as exc:
            self._login_refused(log, "LINE", name, str(exc), protocol="line")
            self._refuse("login refused")
            return
        self._login_accepted()
        vhost = self.core.vhosts.get(vhost_name)
        if vhost is None or not self.core.users.may_access(user, vhost.name):
            self._refuse(f"no access to vhost '{vhost_name}'")
            return
        try:
            self._open_life(user, vhost, PROTOCOL, client_id)
        except ConnectionRefused as exc:
            self._refuse(("client id: " if isinstance(exc, ClientIdInUse) else "") + exc.text)
            return
        self.state = "opened"
        self.send(b"OK\n")

    def _refuse(self, text: str) -> None:
        self.send(f"ERROR {text}\n".encode())
        self.close_transport()

    def _closed_by_broker(self, text: str) -> None:
        self.send(f"CLOSED {text}\n".encode())
        self.close_transport()

    def close_transport(self) -> None:
        if self.state != "closed":
            self.flush()
            self.state = "closed"
            self.transport.close()

    def connection_lost(self) -> None:
        self.state = "closed"
        self._end_life()

    # -- what the lifecycle calls --------------------------------------------------------
    def facts(self) -> ConnectionFacts:
        host, port = self.peer_address()
        return ConnectionFacts(
            host, port, *self.local, PROTOCOL, self.user.name if self.user else "",
            self.vhost.name if self.vhost else "", self.connected_at, channels=(ChannelFacts(1),),
            state="running" if self.state == "opened" else self.state)

    def close_by_operator(self, reason: str) -> None:
        self._closed_by_broker(reason)

    def on_vhost_deleted(self, name: str) -> None:
        self._closed_by_broker(f"vhost '{name}' is deleted")

    def on_alarm(self, active: bool) -> None:
        self.alarms.append(active)


class LineServer(asyncio.Protocol):
    """The I/O half: the server's part, bytes in, lines to the adapter."""

    def __init__(self, broker: BlockingBroker, opened: list[LineConnection]) -> None:
        self.core, self.opened, self.buffer = broker.core, opened, b""

    def connection_made(self, transport) -> None:
        loop = asyncio.get_running_loop()
        host, port = transport.get_extra_info("peername")[:2]
        self.connection = LineConnection(
            self.core, transport, loop, lambda c: loop.call_soon(c.flush), f"{host}:{port}")
        self.connection.local = transport.get_extra_info("sockname")[:2]
        self.opened.append(self.connection)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while b"\n" in self.buffer and self.connection.state != "closed":
            line, _, self.buffer = self.buffer.partition(b"\n")
            self.connection.line_received(line.decode())

    def connection_lost(self, exc: BaseException | None) -> None:
        self.connection.connection_lost()


class LineClient:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.file = self.sock.makefile("rb")
        host, client_port = self.sock.getsockname()[:2]
        self.name = f"{host}:{client_port} -> 127.0.0.1:{port}"

    def say(self, line: str) -> str:
        self.sock.sendall(line.encode() + b"\n")
        return self.read()

    def read(self) -> str:
        return self.file.readline().decode().rstrip("\n")

    def closed(self) -> bool:
        return self.file.read() == b""  # (EOF: the broker closed the socket)

    def close(self) -> None:
        self.file.close()
        self.sock.close()


def ctl(data: Path, *args: str) -> list[list[str]]:
    """``leveret ctl -q`` in a subprocess; a listing's rows under its header."""
    result = subprocess.run([sys.executable, "-m", "leveret", "ctl", "--data-dir", str(data), "-q", *args],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return [line.split("\t") for line in result.stdout.splitlines()[1:]]


@dataclass
class LineBroker:
    """An in-process broker (AMQP, management HTTP, ``leveret ctl``'s socket) that also
    listens for the line protocol on ``port``."""

    broker: BlockingBroker
    port: int
    http: Target
    opened: list[LineConnection]

    def registrations(self) -> tuple[int, int, int, int]:
        """What open connections leave in core: (registry, alarm listeners, vhost-deleted
        listeners, client ids)."""
        core = self.broker.core
        return self.broker.call(lambda: (len(core.connections), len(core.alarm_listeners),
                                         len(core.vhost_deleted_listeners), len(core.client_ids)))


@pytest.fixture
def line_broker(tmp_path: Path):
    with BlockingBroker(amqp_port=0, http_port=0, data_dir=str(tmp_path / "data")) as broker:
        opened: list[LineConnection] = []

        async def listen():
            loop = asyncio.get_running_loop()
            return await loop.create_server(lambda: LineServer(broker, opened), "127.0.0.1", 0)

        server = asyncio.run_coroutine_threadsafe(listen(), broker._loop).result(10)
        http = Target("leveret", "127.0.0.1", broker.amqp_port, broker.broker.management.port)
        yield LineBroker(broker, server.sockets[0].getsockname()[1], http, opened)
        broker.call(server.close)


def test_a_line_connection_is_listed_and_closed_by_management_and_ctl(line_broker, tmp_path):
    broker, data = line_broker, tmp_path / "data"
    before = broker.registrations()
    client = LineClient(broker.port)
    assert client.say("LOGIN guest guest /") == "OK"
    assert client.say("PING") == "PONG"
    assert broker.registrations() == (before[0] + 1, before[1] + 1, before[2] + 1, before[3])

    status, listed = broker.http.http("GET", "/api/connections")
    assert status == 200
    mine = [c for c in listed if c["name"] == client.name]
    assert [(c["protocol"], c["user"], c["vhost"], c["state"]) for c in mine] == \
        [(PROTOCOL, "guest", "/", "running")]
    assert [client.name, PROTOCOL, "guest", "running"] in \
        ctl(data, "list_connections", "name", "protocol", "user", "state")

    ctl(data, "close_connection", client.name, "maintenance")
    assert client.read() == "CLOSED maintenance"
    assert client.closed()
    assert eventually(lambda: broker.registrations() == before, timeout=10)
    client.close()

    client = LineClient(broker.port)
    assert client.say("LOGIN guest guest /") == "OK"
    status, _ = broker.http.http("DELETE", f"/api/connections/{urllib.parse.quote(client.name, safe='')}",
                                 headers={"X-Reason": "by HTTP"})
    assert status == 204
    assert client.read() == "CLOSED by HTTP"
    assert client.closed()
    assert eventually(lambda: broker.registrations() == before, timeout=10)
    assert broker.http.http("GET", "/api/connections")[1] == []
    assert not [row for row in ctl(data, "list_connections", "protocol") if row == [PROTOCOL]]
    client.close()


def test_a_vhost_deletion_closes_a_line_connection_and_leaves_nothing(line_broker):
    broker = line_broker
    before = broker.registrations()
    assert broker.http.http("PUT", "/api/vhosts/lines", {})[0] == 201
    # (RabbitMQ grants the vhost's creator its permissions: this replaces them)
    assert broker.http.http("PUT", "/api/permissions/lines/guest",
                            {"configure": ".*", "write": ".*", "read": ".*"})[0] in (201, 204)
    client = LineClient(broker.port)
    assert client.say("LOGIN guest guest lines line-1") == "OK"
    assert broker.registrations() == (before[0] + 1, before[1] + 1, before[2] + 1, before[3] + 1)
    # the client id is the broker's, whatever the protocol: a second one is refused
    other = LineClient(broker.port)
    refused = other.say("LOGIN guest guest lines line-1")
    assert refused == "ERROR client id: client-id 'line-1' is already connected"
    assert other.closed()
    other.close()
    # resource alarms reach it as they reach AMQP and STOMP connections
    broker.broker.call(broker.broker.core.set_alarm, True, "memory")
    broker.broker.call(broker.broker.core.set_alarm, False, "memory")
    opened = [c for c in broker.opened if c.state == "opened"]
    assert [c.alarms for c in opened] == [[True, False]]

    assert broker.http.http("DELETE", "/api/vhosts/lines")[0] == 204
    assert client.read() == "CLOSED vhost 'lines' is deleted"
    assert client.closed()
    assert eventually(lambda: broker.registrations() == before, timeout=10)
    client.close()


def test_refused_line_logins_are_logged_without_the_secret_and_share_the_login_throttle(line_broker, caplog):
    broker = line_broker
    caplog.set_level(logging.WARNING, "leveret.line")
    before = broker.registrations()
    throttle = broker.broker.core.login_throttle
    throttled = lambda: broker.broker.call(throttle.throttled, "127.0.0.1")  # noqa: E731
    free = ThrottleSettings().address_burst
    for _ in range(free):
        client = LineClient(broker.port)
        assert client.say("LOGIN guest not-the-password /") == "ERROR login refused"
        assert client.closed()
        client.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "leveret.line"]
    assert len(lines) == free and all("LINE login refused: user 'guest'" in line for line in lines)
    assert not any("not-the-password" in r.getMessage() for r in caplog.records)
    # the failures count for the address as AMQP's and STOMP's do: its next one waits
    assert throttled()
    client = LineClient(broker.port)
    assert client.say("LOGIN guest guest /") == "OK"  # a right password does not
    assert throttled()  # and wipes nothing
    client.close()
    assert eventually(lambda: broker.registrations() == before, timeout=10)
