"""The fault tests' TCP proxy (tests/tcp_proxy.py) against a plain echo server: it
forwards, :meth:`cut` resets open connections, ``block("refuse")`` resets new ones,
``block("blackhole")`` swallows them, :meth:`unblock` restores forwarding."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
from tcp_proxy import CuttableProxy


@pytest.fixture
def echo() -> Iterator[int]:
    server = socket.create_server(("127.0.0.1", 0))

    def serve(connection: socket.socket) -> None:
        with connection:
            try:
                while data := connection.recv(65536):
                    connection.sendall(data)
            except ConnectionResetError:  # the proxy's cut reaches this side too
                pass

    def accept() -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(connection,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield server.getsockname()[1]
    server.close()


def roundtrip(port: int, payload: bytes = b"hello") -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=2) as client:
        client.sendall(payload)
        got = b""
        while len(got) < len(payload):
            chunk = client.recv(65536)
            if not chunk:
                break
            got += chunk
        return got


def test_it_forwards_both_ways_and_counts_connections(echo):
    with CuttableProxy(echo) as proxy:
        big = bytes(range(256)) * 4096  # 1 MiB: more than one read
        assert roundtrip(proxy.port, big) == big
        assert roundtrip(proxy.port) == b"hello"
        assert proxy.accepted == 2


def test_cut_resets_open_connections_and_new_ones_work(echo):
    with CuttableProxy(echo) as proxy:
        client = socket.create_connection(("127.0.0.1", proxy.port), timeout=2)
        client.sendall(b"x")
        assert client.recv(1) == b"x"
        assert proxy.open_count() == 1
        assert proxy.cut() == 1
        with pytest.raises(ConnectionResetError):
            client.sendall(b"y")
            client.recv(1)
        client.close()
        assert proxy.open_count() == 0
        assert roundtrip(proxy.port) == b"hello"


def test_refuse_resets_new_connections_until_unblocked(echo):
    with CuttableProxy(echo) as proxy:
        proxy.block("refuse")
        refused = pytest.raises((ConnectionResetError, BrokenPipeError))
        with refused, socket.create_connection(("127.0.0.1", proxy.port), timeout=2) as client:
            client.sendall(b"x")
            if client.recv(1) == b"":
                raise ConnectionResetError("closed")
        proxy.unblock()
        assert roundtrip(proxy.port) == b"hello"


def test_blackhole_answers_nothing(echo):
    with CuttableProxy(echo) as proxy:
        proxy.block("blackhole")
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=0.3) as client:
            client.sendall(b"x")
            with pytest.raises(TimeoutError):
                client.recv(1)
        proxy.unblock()
        assert roundtrip(proxy.port) == b"hello"


def test_a_backend_that_is_down_resets_the_client():
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    with CuttableProxy(port) as proxy:
        try:  # the reset may come during the connect itself
            with socket.create_connection(("127.0.0.1", proxy.port), 2) as client:
                assert client.recv(1) == b""
        except ConnectionResetError:
            pass
        assert proxy.accepted == 1 and proxy.open_count() == 0


def test_freeze_holds_open_connections_until_thawed(echo):
    with CuttableProxy(echo) as proxy:
        client = socket.create_connection(("127.0.0.1", proxy.port), timeout=0.3)
        client.sendall(b"x")
        assert client.recv(1) == b"x"
        assert proxy.freeze() == 1
        client.sendall(b"y")
        with pytest.raises(TimeoutError):
            client.recv(1)
        assert roundtrip(proxy.port) == b"hello"  # new connections still work
        proxy.thaw()
        client.settimeout(2)
        assert client.recv(1) == b"y"
        proxy.freeze()
        assert proxy.cut() == 1  # a frozen connection can be cut too
        client.close()
