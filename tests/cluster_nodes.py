"""Active nodes of one leveret cluster (docs/cluster.md) as subprocesses, for the cluster
tests: ``leveret server --store URL --cluster C --node NAME`` on the test session's
PostgreSQL (tests/postgres.py), each node on its own fixed ports (AMQP, STOMP, MQTT,
HTTP) so it restarts where its clients expect it.

- :class:`ClusterNode`: one node; :meth:`~ClusterNode.start`, :meth:`~ClusterNode.
  wait_ready`, :meth:`~ClusterNode.kill` (kill -9), :meth:`~ClusterNode.terminate`
  (SIGTERM: a graceful stop), :meth:`~ClusterNode.restart`; :func:`start_nodes` starts
  n1, n2 … one after the other; :func:`writer_pid` a node's writer session.
- :class:`Cluster`: N nodes of a new cluster schema, started together; a node named in
  ``cuttable`` reaches PostgreSQL through a :class:`~tcp_proxy.CuttableProxy` (in
  ``proxies``), so a test can cut that node's database sessions; :meth:`~Cluster.owner`
  reads a queue's owner node from the catalog (``queue_owners``), :meth:`~Cluster.
  live` the nodes whose advisory lock is held.
- ``cluster_of`` (a fixture): a factory of :class:`Cluster`, closed after the test.

Timing: every node runs with a short lease and grace (:data:`LEASE`, :data:`GRACE`;
3 s and 3.5 s in production), so failover tests do not wait on the production timings.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from postgres import PostgresServer, free_port
from tcp_proxy import CuttableProxy

#: seconds, for tests: a node fences itself after LEASE without a database round trip;
#: a survivor serves a dead node's queues GRACE after taking its lock (the node runtime
#: reads LEVERET_CLUSTER_LEASE and LEVERET_CLUSTER_GRACE: leveret.cluster.lease)
LEASE, GRACE = 1.0, 1.5
START_TIMEOUT = 30.0


def unique_cluster(prefix: str = "cl") -> str:
    """A new cluster (schema) name: lower case, no dash."""
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


class ClusterNode:
    """One node process named ``name`` of ``cluster``, storing in ``store_url``: its
    AMQP, STOMP, MQTT and HTTP ports (fixed: a restart keeps them), :meth:`wait_for` a
    line it prints (``leveret ready: … node NAME``), kill -9 / SIGTERM, its log.
    ``args``: more ``leveret server`` options; ``env``: more environment."""

    def __init__(
        self,
        directory: Path,
        store_url: str,
        cluster: str,
        name: str,
        lease: float = LEASE,
        grace: float = GRACE,
        args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.dir, self.name = directory, name
        self.store_url, self.cluster = store_url, cluster
        self.lease, self.grace = lease, grace
        self.args = args
        self.env = {
            **os.environ,
            "LEVERET_CLUSTER_LEASE": str(lease),
            "LEVERET_CLUSTER_GRACE": str(grace),
            **(env or {}),
        }
        self.log_path = directory / "server.log"
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        #: whether it has printed its ready line once (its ports are its own from then)
        self.ready_once = False
        self._lines: queue.Queue[str] = queue.Queue()
        self._pick_ports()

    def _pick_ports(self) -> None:
        self.amqp_port, self.stomp_port = free_port(), free_port()
        self.mqtt_port, self.http_port = free_port(), free_port()
        self.url = f"amqp://guest:guest@127.0.0.1:{self.amqp_port}/%2F"
        self.http_url = f"http://127.0.0.1:{self.http_port}"

    def argv(self) -> list[str]:
        return [
            sys.executable, "-m", "leveret", "server",
            "--amqp-port", str(self.amqp_port), "--stomp-port", str(self.stomp_port),
            "--mqtt-port", str(self.mqtt_port), "--http-port", str(self.http_port),
            "--web-stomp-port", "-1", "--web-mqtt-port", "-1", "--prometheus-port", "-1",
            "--data-dir", str(self.dir / "data"),
            "--store", self.store_url, "--cluster", self.cluster, "--node", self.name,
            *self.args,
        ]  # fmt: skip

    def start(self) -> ClusterNode:
        """Start the process (not waiting: :meth:`wait_ready`)."""
        assert not self.running, f"{self.name} runs already"
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lines = queue.Queue()
        self.starts += 1
        with open(self.log_path, "a") as log:
            log.write(f"---- start {self.starts} at {time.time():.3f}\n")
            log.flush()
            self.proc = subprocess.Popen(
                self.argv(), stdout=subprocess.PIPE, stderr=log, text=True, env=self.env
            )
        lines, stdout = self._lines, self.proc.stdout
        assert stdout is not None
        threading.Thread(target=lambda: [lines.put(line) for line in stdout], daemon=True).start()
        return self

    def wait_for(self, prefix: str, timeout: float = START_TIMEOUT) -> str:
        """The next line of stdout starting with ``prefix`` (RuntimeError with the end of
        the log if the process exits or ``timeout`` seconds pass first)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._lines.get(timeout=0.1)
            except queue.Empty:
                if self.proc is not None and self.proc.poll() is not None and self._lines.empty():
                    break
                continue
            if line.startswith(prefix):
                self.ready_once = self.ready_once or line.startswith("leveret ready")
                return line
        raise RuntimeError(f"{self.name}: no {prefix!r} line: {self.log()[-4000:]}")

    def wait_ready(self, timeout: float = START_TIMEOUT) -> str:
        """Wait for the ready line. A node's first start whose port was taken meanwhile
        (``free_port`` only finds a port free at one moment; other processes on the
        machine bind ports too) starts again on new ports, twice at the most."""
        for attempt in range(3):
            try:
                return self.wait_for("leveret ready", timeout)
            except RuntimeError:
                if attempt == 2 or self.ready_once or "address already in use" not in self._this_start_log():
                    raise
                self.kill()
                self._pick_ports()
                self.start()
        raise AssertionError("unreachable")

    def _this_start_log(self) -> str:
        return self.log().rpartition(f"---- start {self.starts} ")[2]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """kill -9 (and reap)."""
        if self.running:
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait()

    def terminate(self, timeout: float = 30.0) -> int | None:
        """SIGTERM (a graceful stop) and wait for the exit; its status."""
        if not self.running:
            return None if self.proc is None else self.proc.returncode
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError(f"{self.name} did not stop within {timeout} s") from None

    def restart(self, graceful: bool = True) -> ClusterNode:
        """Stop (SIGTERM, or kill -9) and start again on the same ports; ready."""
        if graceful:
            self.terminate()
        else:
            self.kill()
        self.start().wait_ready()
        return self

    def __repr__(self) -> str:
        return f"<node {self.name} amqp:{self.amqp_port} {'running' if self.running else 'stopped'}>"


class Cluster:
    """``len(names)`` nodes of a new cluster on ``postgres``; :meth:`start` starts them
    together and waits until each is ready."""

    def __init__(
        self,
        postgres: PostgresServer,
        directory: Path,
        names: tuple[str, ...] = ("n1", "n2", "n3"),
        cuttable: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        args: tuple[str, ...] = (),
        lease: float = LEASE,
        grace: float = GRACE,
    ) -> None:
        self.postgres = postgres
        self.name = unique_cluster()
        self.proxies: dict[str, CuttableProxy] = {}
        self.nodes: list[ClusterNode] = []
        for name in names:
            url = postgres.url
            if name in cuttable:
                proxy = self.proxies[name] = CuttableProxy(postgres.port)
                url = url.replace(f":{postgres.port}/", f":{proxy.port}/")
            self.nodes.append(
                ClusterNode(directory / name, url, self.name, name, lease, grace, args=args, env=env)
            )

    def start(self) -> Cluster:
        """Start every node together; wait until all are ready."""
        for node in self.nodes:
            node.start()
        for node in self.nodes:
            node.wait_ready()
        return self

    def __getitem__(self, name: str) -> ClusterNode:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    def __iter__(self) -> Iterator[ClusterNode]:
        return iter(self.nodes)

    def others(self, *names: str) -> list[ClusterNode]:
        """The nodes not named."""
        return [node for node in self.nodes if node.name not in names]

    # -- the catalog, read directly --------------------------------------------------------
    def owner(self, queue_name: str, vhost: str = "/") -> str | None:
        """The queue's owner node in ``queue_owners`` (None: no row)."""
        return owner(self.postgres, self.name, queue_name, vhost)

    def stored(self, queue_name: str, vhost: str = "/") -> set[str]:
        """The bodies of the messages stored for the queue now (rows of ``messages``
        under its queue id), for a report: a confirmed message neither consumed nor
        stored is lost, one stored but not delivered is stranded."""
        rows = self.postgres.sql(
            f'SELECT m.body FROM "{self.name}".messages m JOIN "{self.name}".queue_owners o '
            "ON m.queue_id = o.queue_id WHERE o.vhost = %s AND o.name = %s",
            vhost,
            queue_name,
        )
        return {bytes(row[0]).decode(errors="replace") for row in rows}

    def report(self, queue_name: str, missing: set[str]) -> str:
        """Where the queue is and which of ``missing`` are still stored, then every
        node's log: the tail of a failed assertion's message."""
        everything = self.stored(queue_name)
        stored = everything & missing
        return (
            f"queue {queue_name!r}: owner {self.owner(queue_name)}, live {sorted(self.live())}, "
            f"{len(everything)} messages stored; "
            f"{len(stored)} of the {len(missing)} missing are stored (stranded), "
            f"{len(missing) - len(stored)} are not (lost)\n{self.logs()}"
        )

    def live(self) -> set[str]:
        """The nodes whose advisory lock is held now."""
        return live_nodes(self.postgres, self.name)

    def wait_owner(self, queue_name: str, accept: Callable[[str | None], bool], timeout: float = 15.0) -> str:
        """Poll the queue's owner until ``accept(owner)``; it (AssertionError after
        ``timeout`` s)."""
        deadline = time.monotonic() + timeout
        while True:
            owner = self.owner(queue_name)
            if accept(owner):
                assert owner is not None
                return owner
            if time.monotonic() > deadline:
                raise AssertionError(f"owner of {queue_name!r} still {owner!r} after {timeout} s")
            time.sleep(0.05)

    def close(self) -> None:
        for node in self.nodes:
            node.kill()
        for proxy in self.proxies.values():
            proxy.close()

    def logs(self) -> str:
        """Every node's log, for a failed assertion's message."""
        return "\n".join(f"==== {node.name}\n{node.log()[-3000:]}" for node in self.nodes)


#: the name the cluster tests' helpers used first
NodeProcess = ClusterNode


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
        node.wait_ready()
    return nodes


def writer_pid(postgres: PostgresServer, cluster: str, node: str) -> int | None:
    """The backend pid of ``node``'s store writer (the session holding its advisory
    lock), None if the node is not live."""
    rows = postgres.sql(
        "SELECT pid FROM pg_locks WHERE locktype='advisory' AND granted "
        "AND classid=hashtext('leveret-node')::oid AND objid=hashtext(%s)::oid",
        f"{cluster}/{node}",
    )
    return rows[0][0] if rows else None


def live_nodes(postgres: PostgresServer, cluster: str) -> set[str]:
    """The nodes of ``cluster`` whose advisory lock is held now (RULES32: a node is
    live iff)."""
    rows = postgres.sql(
        f'SELECT name FROM "{cluster}".cluster_nodes WHERE EXISTS (SELECT 1 FROM pg_locks WHERE '
        "locktype='advisory' AND granted AND classid=hashtext('leveret-node')::oid "
        f"AND objid=hashtext(%s || '/' || name)::oid)",
        cluster,
    )
    return {row[0] for row in rows}


def owner(postgres: PostgresServer, cluster: str, queue: str, vhost: str | None = None) -> str | None:
    """The owner of ``queue`` (in ``vhost``, or any) in ``queue_owners``; None: no row."""
    if vhost is None:
        rows = postgres.sql(f'SELECT node FROM "{cluster}".queue_owners WHERE name=%s', queue)
    else:
        rows = postgres.sql(
            f'SELECT node FROM "{cluster}".queue_owners WHERE vhost=%s AND name=%s', vhost, queue
        )
    return rows[0][0] if rows else None


@pytest.fixture
def cluster_of(postgres: PostgresServer, tmp_path: Path) -> Iterator[Callable[..., Cluster]]:
    """``cluster_of(names=("n1", "n2", "n3"), cuttable=(), env=None, lease=…, grace=…)``: a started
    :class:`Cluster` of a new schema; every node is killed after the test."""
    made: list[Cluster] = []

    def make(**kwargs: object) -> Cluster:
        cluster = Cluster(postgres, tmp_path / f"cluster{len(made)}", **kwargs)  # type: ignore[arg-type]
        made.append(cluster)
        return cluster.start()

    yield make
    for cluster in made:
        cluster.close()
