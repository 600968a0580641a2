"""Active nodes of a leveret cluster on the test session's PostgreSQL, as
``leveret server --store URL --cluster C --node NAME`` processes on fixed ports
(restartable on the same ports), with a short lease and grace (LEVERET_CLUSTER_LEASE,
LEVERET_CLUSTER_GRACE) so failover tests do not wait on the production timings."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

from postgres import free_port

#: seconds, for tests: a node fences itself after LEASE without a database round trip;
#: a survivor serves a dead node's queues GRACE after taking its lock
LEASE, GRACE = 1.0, 1.5


class ClusterNode:
    """One node process: its AMQP, STOMP and HTTP ports, :meth:`wait_for` a line it
    prints (``leveret ready: … node NAME``), kill -9 / SIGTERM, its log."""

    def __init__(
        self,
        directory: Path,
        store_url: str,
        cluster: str,
        name: str,
        lease: float = LEASE,
        grace: float = GRACE,
    ) -> None:
        self.dir = directory
        self.store_url, self.cluster, self.name = store_url, cluster, name
        self.lease, self.grace = lease, grace
        self.amqp_port, self.stomp_port, self.http_port = free_port(), free_port(), free_port()
        self.url = f"amqp://guest:guest@127.0.0.1:{self.amqp_port}/%2F"
        self.http_url = f"http://127.0.0.1:{self.http_port}"
        self.log_path = directory / "server.log"
        self.proc: subprocess.Popen | None = None
        self._lines: queue.Queue[str] = queue.Queue()

    def start(self) -> ClusterNode:
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lines = queue.Queue()
        env = dict(os.environ, LEVERET_CLUSTER_LEASE=str(self.lease), LEVERET_CLUSTER_GRACE=str(self.grace))
        with open(self.log_path, "a") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable, "-m", "leveret", "server",
                    "--amqp-port", str(self.amqp_port), "--stomp-port", str(self.stomp_port),
                    "--web-stomp-port", "-1", "--mqtt-port", "-1", "--web-mqtt-port", "-1",
                    "--prometheus-port", "-1",
                    "--http-port", str(self.http_port), "--data-dir", str(self.dir / "data"),
                    "--store", self.store_url, "--cluster", self.cluster, "--node", self.name,
                ],
                stdout=subprocess.PIPE, stderr=log, text=True, env=env,
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
        raise RuntimeError(f"{self.name}: no {prefix!r} line: {self.log()[-3000:]}")

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def kill(self) -> None:
        """kill -9."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def terminate(self, timeout: float = 30.0) -> int | None:
        """SIGTERM (a graceful stop) and wait; the exit code."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout)
        return self.proc.returncode if self.proc is not None else None


def start_nodes(
    directory: Path, store_url: str, cluster: str, count: int, **timings: float
) -> list[ClusterNode]:
    """``count`` nodes n1, n2 … of ``cluster``, started together; returns once every
    one is ready."""
    nodes = [
        ClusterNode(directory / f"n{number}", store_url, cluster, f"n{number}", **timings).start()
        for number in range(1, count + 1)
    ]
    for node in nodes:
        node.wait_for("leveret ready")
    return nodes


def writer_pid(postgres, cluster: str, node: str) -> int | None:
    """The backend pid of ``node``'s store writer (the session holding its advisory
    lock), None if the node is not live."""
    rows = postgres.sql(
        "SELECT pid FROM pg_locks WHERE locktype='advisory' AND granted "
        "AND classid=hashtext('leveret-node')::oid AND objid=hashtext(%s)::oid",
        f"{cluster}/{node}",
    )
    return rows[0][0] if rows else None


def live_nodes(postgres, cluster: str) -> set[str]:
    """The nodes of ``cluster`` whose advisory lock is held now."""
    rows = postgres.sql(
        f'SELECT name FROM "{cluster}".cluster_nodes WHERE EXISTS (SELECT 1 FROM pg_locks WHERE '
        "locktype='advisory' AND granted AND classid=hashtext('leveret-node')::oid "
        f"AND objid=hashtext(%s || '/' || name)::oid)",
        cluster,
    )
    return {row[0] for row in rows}


def owner(postgres, cluster: str, queue: str) -> str | None:
    """The owner of ``queue`` (any vhost) in ``queue_owners``."""
    rows = postgres.sql(f'SELECT node FROM "{cluster}".queue_owners WHERE name=%s', queue)
    return rows[0][0] if rows else None
