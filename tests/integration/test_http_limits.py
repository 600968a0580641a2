"""Slow and idle HTTP sockets (slowloris) against a real leveret over real TCP: the
connection cap of each HTTP port, the header timeout, the keep-alive timeout, and, in a
``leveret server`` subprocess with RLIMIT_NOFILE lowered to 256, AMQP (pika), STOMP and
the other HTTP ports still working while one HTTP port is flooded (issue 27, item 6).

Timeouts are set short through ``[http]`` settings, so no test waits long."""

from __future__ import annotations

import base64
import re
import resource
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from leveret import BlockingBroker
from leveret.server.http_limits import HttpLimits

PARTIAL_HEAD = b"GET /api/overview HTTP/1.1\r\nHost: 127.0.0.1\r\nX-slow: "
LOGIN = {"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()}


def _slow(port: int, head: bytes = PARTIAL_HEAD) -> socket.socket:
    """A socket to ``port`` that sent ``head`` (a request head never finished)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    if head:
        sock.sendall(head)
    return sock


def _answer(sock: socket.socket, timeout: float) -> bytes:
    """What the broker sent before closing ``sock`` (b"" if it closed without a word);
    raises TimeoutError if it kept the socket open ``timeout`` seconds."""
    sock.settimeout(timeout)
    data = b""
    while True:
        try:
            chunk = sock.recv(4096)
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


def _still_open(sock: socket.socket) -> bool:
    """Whether the broker holds ``sock`` without a word (no answer, not closed)."""
    sock.settimeout(0.05)
    try:
        sock.recv(1, socket.MSG_PEEK)  # an answer (503, 408) or the close
    except TimeoutError:
        return True
    except OSError:
        pass
    return False


def _get(url: str, timeout: float = 5) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=LOGIN), timeout=timeout) as response:
            response.read()
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.fixture
def broker() -> Iterator[BlockingBroker]:
    yield from _broker(HttpLimits(header_timeout=30, keepalive_timeout=30, max_connections=5))


def _broker(limits: HttpLimits) -> Iterator[BlockingBroker]:
    """A broker with every HTTP port on, under ``limits``."""
    with BlockingBroker(
        amqp_port=0, http_port=0, prometheus_port=0, web_stomp_port=0, http=limits
    ) as running:
        yield running


def _ports(broker: BlockingBroker) -> dict[str, int]:
    inner = broker.broker
    assert inner.management is not None and inner.prometheus is not None and inner.web_stomp is not None
    return {
        "management": inner.management.port,
        "prometheus": inner.prometheus.port,
        "web-stomp": inner.web_stomp.port,
    }


@pytest.mark.parametrize("kind", ["management", "prometheus", "web-stomp"])
def test_slow_sockets_beyond_the_cap_are_refused_at_once(broker, kind):
    port = _ports(broker)[kind]
    held = [_slow(port) for _ in range(5)]
    try:
        time.sleep(0.2)
        beyond = [_slow(port) for _ in range(3)]
        started = time.monotonic()
        for sock in beyond:  # 503 and closed at once, not after a timeout
            assert _answer(sock, timeout=2).startswith(b"HTTP/1.1 503 ")
            sock.close()
        assert time.monotonic() - started < 2
        assert all(_still_open(sock) for sock in held)
        inner = broker.broker
        guard = {"management": inner.management.guards[0], "prometheus": inner.prometheus.guard,
                 "web-stomp": inner.web_stomp.guard}[kind]
        assert (guard.open, guard.refused) == (5, 3)
    finally:
        for sock in held:
            sock.close()


def test_a_slowloris_on_one_port_leaves_the_others_answering(broker):
    ports = _ports(broker)
    held = [_slow(ports["management"]) for _ in range(8)]  # 5 held, 3 refused
    try:
        assert _get(f"{broker.prometheus_url}/metrics") == 200
        assert _get(f"http://127.0.0.1:{ports['management']}/api/overview") == 503
        params = pika.URLParameters(broker.amqp_url)
        connection = pika.BlockingConnection(params)
        connection.channel().queue_declare("after-slowloris")
        connection.close()
    finally:
        for sock in held:
            sock.close()
    # the slow sockets gone, the API answers again
    deadline = time.monotonic() + 5
    while _get(f"http://127.0.0.1:{ports['management']}/api/overview") != 200:
        assert time.monotonic() < deadline
        time.sleep(0.05)


@pytest.fixture
def quick() -> Iterator[BlockingBroker]:
    yield from _broker(HttpLimits(header_timeout=0.5, keepalive_timeout=2.5))


@pytest.mark.parametrize("kind", ["management", "prometheus", "web-stomp"])
def test_a_head_never_finished_is_closed_after_the_header_timeout(quick, kind):
    port = _ports(quick)[kind]
    partial, silent = _slow(port), _slow(port, b"")
    blank_lines = _slow(port, b"\r\n\r\n\r\n")  # empty lines before the request line do not count
    started = time.monotonic()
    try:
        assert _answer(partial, timeout=5).startswith(b"HTTP/1.1 408 ")
        assert 0.3 < time.monotonic() - started < 2
        assert _answer(silent, timeout=5) == b""
        assert _answer(blank_lines, timeout=5) == b""
        assert time.monotonic() - started < 2  # the header timeout's doing, not the keep-alive one's
    finally:
        for sock in (partial, silent, blank_lines):
            sock.close()


def test_a_keep_alive_connection_outlives_the_header_timeout_until_idle_too_long(quick):
    port = _ports(quick)["management"]
    request = (
        b"GET /api/overview HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: " + LOGIN["Authorization"].encode()
    )
    sock = _slow(port, request[:20])
    try:
        time.sleep(0.2)
        sock.sendall(request[20:] + b"\r\n\r\n")  # the head completes in time, in two reads
        sock.settimeout(5)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
        time.sleep(1.0)  # past the header timeout, within the keep-alive timeout
        sock.sendall(request + b"\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
        started = time.monotonic()
        assert b" 200 " not in _answer(sock, timeout=5)  # idle: closed by the keep-alive timeout
        assert 2.0 < time.monotonic() - started < 5
    finally:
        sock.close()


def test_a_websocket_stays_open_past_the_header_timeout(quick):
    import stomp

    port = _ports(quick)["web-stomp"]
    conn = stomp.WSStompConnection(
        [("127.0.0.1", port)], ws_path="/ws", header=["Sec-WebSocket-Protocol: v12.stomp"]
    )
    conn.connect("guest", "guest", wait=True)
    try:
        time.sleep(3.0)  # past both timeouts: an upgraded connection is no longer HTTP's
        assert conn.is_connected()
    finally:
        conn.disconnect()


def _start_limited(
    tmp_path: Path, nofile: int, hard: int | None = None
) -> tuple[subprocess.Popen, dict[str, int]]:
    """``leveret server`` with RLIMIT_NOFILE ``nofile`` (soft; the hard limit ``hard``,
    default the same) and a 2 s header timeout."""
    config = tmp_path / "leveret.toml"
    config.write_text("[http]\nheader_timeout = 2.0\n")

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, hard or nofile))

    args = [sys.executable, "-m", "leveret", "server", "--amqp-port", "0", "--stomp-port", "0",
            "--mqtt-port", "0", "--web-mqtt-port", "-1",
            "--web-stomp-port", "0", "--prometheus-port", "0", "--http-port", "0",
            "--data-dir", str(tmp_path / "data"), "--config", str(config)]
    log = open(tmp_path / "broker.log", "w")  # noqa: SIM115 (the child keeps it)
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, text=True, preexec_fn=limit)
    ports: dict[str, int] = {}
    while "prometheus" not in ports:
        line = proc.stdout.readline()
        if not line:
            proc.kill()
            raise RuntimeError((tmp_path / "broker.log").read_text())
        for name, pattern in (("amqp", r"ready: amqp://[\d.]+:(\d+)"), ("stomp", r"stomp://[\d.]+:(\d+)"),
                              ("management", r"management: http://[\d.]+:(\d+)"),
                              ("prometheus", r"prometheus: http://[\d.]+:(\d+)")):
            match = re.search(pattern, line)
            if match:
                ports[name] = int(match.group(1))
    return proc, ports


def test_at_a_low_descriptor_limit_an_http_flood_leaves_room_for_amqp_and_stomp(tmp_path):
    # 256 descriptors: the HTTP ports may hold 64 together (fd_fraction 0.25), 21 each;
    # 300 slow sockets would take them all without the budget (EMFILE: AMQP fails too)
    proc, ports = _start_limited(tmp_path, 256)
    slow: list[socket.socket] = []
    try:
        for _ in range(300):
            try:
                slow.append(_slow(ports["management"]))
            except OSError:
                pass
        time.sleep(0.3)
        assert sum(_still_open(sock) for sock in slow) <= 21
        params = pika.ConnectionParameters("127.0.0.1", ports["amqp"], socket_timeout=5)
        for _ in range(20):  # new AMQP connections, several at once
            connections = [pika.BlockingConnection(params) for _ in range(5)]
            for connection in connections:
                connection.close()
        with socket.create_connection(("127.0.0.1", ports["stomp"]), timeout=5) as stomp_socket:
            stomp_socket.sendall(b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\0")
            assert stomp_socket.recv(4096).startswith(b"CONNECTED")
        assert _get(f"http://127.0.0.1:{ports['prometheus']}/metrics") == 200  # another HTTP port
        # the header timeout drops the slow sockets: the HTTP API answers again
        deadline = time.monotonic() + 6
        while any(_still_open(sock) for sock in slow):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert _get(f"http://127.0.0.1:{ports['management']}/api/overview") == 200
        assert proc.poll() is None
        assert "refusing new ones with 503" in (tmp_path / "broker.log").read_text()
    finally:
        for sock in slow:
            sock.close()
        proc.terminate()
        proc.wait(10)


def test_the_server_raises_its_open_file_limit_to_the_hard_limit(tmp_path):
    """As the JVM under ActiveMQ: a shell's soft limit of 256 (or 1,024) would leave each
    HTTP port a few dozen connections, so ``leveret server`` takes the hard limit."""
    proc, _ = _start_limited(tmp_path, 256, hard=4096)
    try:
        limits = Path(f"/proc/{proc.pid}/limits").read_text()
        soft, hard = re.search(r"Max open files\s+(\d+)\s+(\d+)", limits).groups()
        assert (int(soft), int(hard)) == (4096, 4096)
        assert "open file limit raised from 256 to 4096" in (tmp_path / "broker.log").read_text()
    finally:
        proc.terminate()
        proc.wait(10)
