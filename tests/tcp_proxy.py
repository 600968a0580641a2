"""A TCP proxy for fault tests: the network between two brokers, which a test can cut.

:class:`CuttableProxy` listens on ``127.0.0.1`` (port 0: a free port, in ``port``) and
forwards every connection it accepts to ``backend_port``. One thread owns every socket
(a ``selectors`` loop), so a fault is applied atomically between two reads:

- :meth:`cut` resets every connection open now, on both sides (``SO_LINGER`` 0 then
  close: an RST, as a dead route or a firewall's reject does; the peers see
  ``ECONNRESET``, not an orderly close);
- :meth:`block` makes new connections fail: ``"refuse"`` resets them as soon as they
  are accepted (the client sees its connection reset before the AMQP handshake, as
  with a closed port), ``"blackhole"`` accepts them and sends nothing either way (the
  client's handshake hangs until its own timeout, as when packets are dropped);
  :meth:`unblock` lets new connections through again (blackholed ones are reset);
- :meth:`sever` resets the backend side of every connection open now and keeps the
  client side open but silent (what it sends is swallowed): the server sees the
  session end at once, the client hears nothing until its own timeouts tell it (a
  partition the server notices first: PostgreSQL ends the session and frees its
  locks while the broker still believes it holds them); :meth:`unblock` resets them;
- :meth:`freeze` stops forwarding on the connections open now without closing them (a
  partition: neither peer hears anything, only heartbeats or timeouts tell), until
  :meth:`thaw`;
- the backend may be down: a connection then gets reset at once (ECONNREFUSED behind).

``accepted`` counts connections accepted so far (a reconnecting client adds one per
attempt); ``open_count()`` the connections being forwarded now. Use as a context
manager, or call :meth:`close`.
"""

from __future__ import annotations

import selectors
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any


def _reset(sock: socket.socket) -> None:
    """Close with an RST rather than a FIN."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()


class _Pair:
    def __init__(self, client: socket.socket, backend: socket.socket) -> None:
        self.client, self.backend = client, backend
        self.pending = {client: bytearray(), backend: bytearray()}  # bytes to write to that socket

    def peer(self, sock: socket.socket) -> socket.socket:
        return self.backend if sock is self.client else self.client


class CuttableProxy:
    def __init__(self, backend_port: int, backend_host: str = "127.0.0.1") -> None:
        self.backend = (backend_host, backend_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.setblocking(False)
        self.port: int = self.listener.getsockname()[1]
        self.accepted = 0
        self.mode: str | None = None  # None, "refuse" or "blackhole"
        self._pairs: dict[socket.socket, _Pair] = {}
        self._held: list[socket.socket] = []  # blackholed connections
        self._frozen: set[socket.socket] = set()  # connections not forwarded for now
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._calls: list[tuple[Callable[[], Any], threading.Event]] = []
        self._lock = threading.Lock()
        self._closed = False
        self._selector.register(self.listener, selectors.EVENT_READ, "accept")
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._thread = threading.Thread(target=self._loop, name=f"proxy:{self.port}", daemon=True)
        self._thread.start()

    # -- faults (run on the proxy's thread; they return once applied) ---------------------
    def cut(self) -> int:
        """Reset every connection forwarded now (both sides); how many there were."""
        return self._call(self._cut)

    def block(self, mode: str = "refuse") -> None:
        """New connections fail: ``"refuse"`` (reset at once) or ``"blackhole"`` (hang)."""
        assert mode in ("refuse", "blackhole"), mode
        self._call(lambda: setattr(self, "mode", mode))

    def unblock(self) -> None:
        """New connections are forwarded again; blackholed ones are reset."""
        self._call(self._unblock)

    def sever(self) -> int:
        """Reset the backend side of every connection forwarded now, leaving the client
        side open and silent; how many."""
        return self._call(self._sever)

    def freeze(self) -> int:
        """Stop forwarding on every connection open now, leaving it open; how many."""
        return self._call(self._freeze)

    def thaw(self) -> None:
        """Forward again on the frozen connections (those still open)."""
        self._call(self._thaw)

    def open_count(self) -> int:
        """Connections being forwarded now."""
        return self._call(lambda: len({id(pair) for pair in self._pairs.values()}))

    def set_backend(self, port: int, host: str = "127.0.0.1") -> None:
        """Forward new connections to another port (a restarted broker on a new port)."""
        self._call(lambda: setattr(self, "backend", (host, port)))

    def close(self) -> None:
        if self._closed:
            return
        self._call(self._shutdown)
        self._thread.join(5)
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()

    def __enter__(self) -> CuttableProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the loop -----------------------------------------------------------------------
    def _call(self, function: Callable[[], Any]) -> Any:
        if threading.current_thread() is self._thread:
            return function()
        done = threading.Event()
        box: list[Any] = []
        with self._lock:
            self._calls.append((lambda: box.append(function()), done))
        self._wake_w.send(b"x")
        if not done.wait(10):
            raise RuntimeError("the proxy's thread did not answer")
        return box[0] if box else None

    def _loop(self) -> None:
        while not self._closed:
            for key, events in self._selector.select(timeout=1.0):
                if key.data == "accept":
                    self._accept()
                elif key.data == "wake":
                    self._run_calls()
                elif key.data == "held":
                    self._drain_held(key.fileobj)  # type: ignore[arg-type]
                else:
                    self._service(key.fileobj, key.data, events)  # type: ignore[arg-type]
                if self._closed:
                    break

    def _run_calls(self) -> None:
        try:
            self._wake_r.recv(4096)
        except BlockingIOError:
            pass
        with self._lock:
            calls, self._calls = self._calls, []
        for function, done in calls:
            try:
                function()
            finally:
                done.set()

    def _accept(self) -> None:
        try:
            client, _ = self.listener.accept()
        except (BlockingIOError, OSError):
            return
        self.accepted += 1
        if self.mode == "refuse":
            _reset(client)
            return
        if self.mode == "blackhole":
            client.setblocking(False)
            self._held.append(client)
            self._selector.register(client, selectors.EVENT_READ, "held")
            return
        try:
            backend = socket.create_connection(self.backend, timeout=2)
        except OSError:
            _reset(client)
            return
        for sock in (client, backend):
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        pair = _Pair(client, backend)
        self._pairs[client] = self._pairs[backend] = pair
        self._selector.register(client, selectors.EVENT_READ, pair)
        self._selector.register(backend, selectors.EVENT_READ, pair)

    def _drain_held(self, sock: socket.socket) -> None:
        try:
            if sock.recv(65536):
                return  # swallowed
        except BlockingIOError:
            return
        except OSError:
            pass
        self._selector.unregister(sock)
        self._held.remove(sock)
        sock.close()

    def _service(self, sock: socket.socket, pair: _Pair, events: int) -> None:
        if sock not in self._pairs:
            return  # closed earlier in this round
        peer = pair.peer(sock)
        if events & selectors.EVENT_WRITE:
            buffer = pair.pending[sock]
            try:
                sent = sock.send(buffer)
                del buffer[:sent]
            except BlockingIOError:
                pass
            except OSError:
                self._end(pair, reset=True)
                return
        if events & selectors.EVENT_READ:
            try:
                data = sock.recv(65536)
            except BlockingIOError:
                data = None
            except OSError:
                self._end(pair, reset=True)
                return
            if data == b"":
                self._end(pair, reset=False)  # an orderly close: pass it on
                return
            if data:
                pair.pending[peer] += data
        self._interest(pair)

    def _interest(self, pair: _Pair) -> None:
        for sock in (pair.client, pair.backend):
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if pair.pending[sock] else 0)
            self._selector.modify(sock, events, pair)

    def _end(self, pair: _Pair, reset: bool) -> None:
        for sock in (pair.client, pair.backend):
            if self._pairs.pop(sock, None) is None:
                continue
            if sock in self._frozen:
                self._frozen.discard(sock)
            else:
                self._selector.unregister(sock)
            if reset:
                _reset(sock)
            else:
                try:  # what is still buffered for it first, best effort
                    sock.setblocking(True)
                    sock.settimeout(1)
                    sock.sendall(pair.pending[sock])
                    sock.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                sock.close()

    def _cut(self) -> int:
        pairs = {id(pair): pair for pair in self._pairs.values()}
        for pair in pairs.values():
            self._end(pair, reset=True)
        return len(pairs)

    def _sever(self) -> int:
        pairs = {id(pair): pair for pair in self._pairs.values()}
        for pair in pairs.values():
            for sock in (pair.client, pair.backend):
                del self._pairs[sock]
                if sock in self._frozen:
                    self._frozen.discard(sock)
                else:
                    self._selector.unregister(sock)
            _reset(pair.backend)
            self._held.append(pair.client)  # swallowed from now on, reset by unblock()
            self._selector.register(pair.client, selectors.EVENT_READ, "held")
        return len(pairs)

    def _freeze(self) -> int:
        frozen = 0
        for sock in list(self._pairs):
            if sock not in self._frozen:
                self._selector.unregister(sock)
                self._frozen.add(sock)
                frozen += 1
        return frozen // 2

    def _thaw(self) -> None:
        for sock in self._frozen:
            pair = self._pairs.get(sock)
            if pair is not None:
                self._selector.register(sock, selectors.EVENT_READ, pair)
        self._frozen.clear()
        for pair in {id(p): p for p in self._pairs.values()}.values():
            self._interest(pair)

    def _unblock(self) -> None:
        self.mode = None
        for sock in self._held:
            self._selector.unregister(sock)
            _reset(sock)
        self._held.clear()

    def _shutdown(self) -> None:
        self._cut()
        self._unblock()
        self._selector.unregister(self.listener)
        self.listener.close()
        self._closed = True
