"""``leveret server`` processes sharing a PostgreSQL store: a master and standbys on
fixed ports, for failover tests (kill -9, a cut database session, a restarted
PostgreSQL)."""

from __future__ import annotations

import queue
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from postgres import free_port
from tcp_balancer import pump


class Node:
    """One ``leveret server --store URL`` on its own ports (AMQP, STOMP, MQTT, HTTP),
    restartable on the same ports; :meth:`wait_for` waits for a line it prints
    (``leveret standby``, ``leveret ready``)."""

    def __init__(self, directory: Path, store_url: str, cluster: str) -> None:
        self.dir = directory
        self.store_url, self.cluster = store_url, cluster
        self.amqp_port, self.stomp_port, self.http_port = free_port(), free_port(), free_port()
        self.mqtt_port = free_port()
        self.url = f"amqp://guest:guest@127.0.0.1:{self.amqp_port}/%2F"
        self.http_url = f"http://127.0.0.1:{self.http_port}"
        self.log_path = directory / "server.log"
        self.proc: subprocess.Popen | None = None
        self._lines: queue.Queue[str] = queue.Queue()

    def start(self) -> Node:
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lines = queue.Queue()
        with open(self.log_path, "a") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable, "-m", "leveret", "server",
                    "--amqp-port", str(self.amqp_port), "--stomp-port", str(self.stomp_port),
                    "--web-stomp-port", "-1", "--mqtt-port", str(self.mqtt_port), "--web-mqtt-port", "-1",
                    "--prometheus-port", "-1",
                    "--http-port", str(self.http_port), "--data-dir", str(self.dir / "data"),
                    "--store", self.store_url, "--cluster", self.cluster,
                ],
                stdout=subprocess.PIPE, stderr=log, text=True,
            )  # fmt: skip
        lines, stdout = self._lines, self.proc.stdout
        assert stdout is not None
        threading.Thread(target=lambda: [lines.put(line) for line in stdout], daemon=True).start()
        return self

    def wait_for(self, prefix: str, timeout: float = 30.0) -> str:
        """The next line starting with ``prefix`` (RuntimeError with the log if the
        process exits or ``timeout`` seconds pass first)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._lines.get(timeout=0.1)
            except queue.Empty:
                if self.proc is not None and self.proc.poll() is not None:
                    break
                continue
            if line.startswith(prefix):
                return line
        raise RuntimeError(f"no {prefix!r} line: {self.log_path.read_text()[-3000:]}")

    def kill(self) -> None:
        """kill -9."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)


class FirstAlive:
    """A TCP load balancer in miniature (HAProxy's place in the deployment): each
    client connection goes to the first backend that accepts one. A standby refuses
    connections, so new connections reach the master; when a backend's connection
    drops, the client's is closed and it reconnects through here."""

    def __init__(self, ports: list[int]) -> None:
        self.ports = ports
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        for port in self.ports:
            try:
                backend = socket.create_connection(("127.0.0.1", port), timeout=2)
                backend.settimeout(None)
                break
            except OSError:
                continue
        else:
            client.close()
            return
        threading.Thread(target=pump, args=(backend, client), daemon=True).start()
        pump(client, backend)

    def close(self) -> None:
        self.server.close()
