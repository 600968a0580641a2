"""A TCP load balancer for tests (HAProxy's ``balance roundrobin`` in miniature).

:class:`RoundRobin` listens on ``127.0.0.1`` (a free port, in ``port``) and hands each
client connection to the next backend port in turn, skipping those that refuse (a node
that is stopped or restarting), as HAProxy does with ``option redispatch`` and a
failed connect. A client connection is forwarded byte for byte; when either side
closes or resets, both are closed, so a client whose node went away sees its
connection drop and reconnects through here — to a live node.

``connections`` counts, per backend port, the connections handed to it so far;
``refused`` the connects that failed. Use as a context manager, or call :meth:`close`.
"""

from __future__ import annotations

import socket
import threading


class RoundRobin:
    """Round robin over ``ports`` (on ``host``); a backend that refuses is skipped,
    and a client with no live backend at all is closed at once."""

    def __init__(self, ports: list[int], host: str = "127.0.0.1", connect_timeout: float = 2.0) -> None:
        self.ports = list(ports)
        self.host = host
        self.connect_timeout = connect_timeout
        self.connections: dict[int, int] = dict.fromkeys(self.ports, 0)
        self.refused = 0
        self._next = 0
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._closed = False
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.server.getsockname()[1]
        threading.Thread(target=self._accept, name=f"balancer:{self.port}", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _order(self) -> list[int]:
        """The backends to try for one client: from the next one round the list."""
        with self._lock:
            start = self._next
            self._next = (self._next + 1) % len(self.ports)
        return self.ports[start:] + self.ports[:start]

    def _serve(self, client: socket.socket) -> None:
        for port in self._order():
            try:
                backend = socket.create_connection((self.host, port), timeout=self.connect_timeout)
            except OSError:
                with self._lock:
                    self.refused += 1
                continue
            backend.settimeout(None)
            with self._lock:
                if self._closed:
                    backend.close()
                    break
                self.connections[port] = self.connections.get(port, 0) + 1
                self._open.update((client, backend))
            for sock in (client, backend):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._pump, args=(backend, client), daemon=True).start()
            self._pump(client, backend)
            return
        client.close()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for sock in (source, sink):  # one side gone: end both
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
            with self._lock:
                self._open.discard(sock)

    def close(self) -> None:
        """Stop accepting and end every forwarded connection."""
        with self._lock:
            self._closed = True
            sockets = list(self._open)
        self.server.close()
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def __enter__(self) -> RoundRobin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
