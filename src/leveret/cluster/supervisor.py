"""``leveret server --nodes N``: N cluster nodes on one machine, one set of client ports.

The same node mechanism as a cluster of machines (docs/cluster.md, "One machine, several
cores"), not a second one: the supervisor starts N processes ``python -m leveret server
--store URL --cluster NAME --node HOST-i`` and only watches them.

- The store: ``--store`` if given, else a private PostgreSQL server under the data
  directory (``DIR/postgresql``, :mod:`.embedded_pg`; ``initdb`` once, reused at the next
  start, listening on a Unix socket in its 0700 directory only; on 127.0.0.1 only
  when the directory's path is too long for a socket address).
- The client ports (AMQP, AMQPS, STOMP, MQTT, HTTP, WebSocket, Prometheus) are the same for
  every node, bound with SO_REUSEPORT (the ``reuse_port`` setting): clients connect to one
  address and the kernel spreads the connections over the nodes. A port given as 0 is
  picked once here, so that all nodes share it. Each node also gets a private AMQP port
  (``cluster_port``) for the other nodes' links, since the shared port reaches any node,
  and its own Prometheus port (the given one plus its index - 1: RabbitMQ's metrics are
  per node, and a scrape must know which node it reads).
- Each node has its data directory ``DIR/nodes/HOST-i`` (its ``leveret ctl`` socket) and
  keeps ``--workers`` (connection I/O processes of its own).
- It prints one ``leveret ready`` line when every node is ready, restarts a node that
  exits (a fenced node exits non-zero; a second pause after each quick exit, up to
  :data:`RESTART_MAX`), and on SIGTERM or SIGINT stops the nodes (SIGTERM: each closes
  its connections with 320 CONNECTION_FORCED and leaves the cluster cleanly), then the
  private PostgreSQL (a fast shutdown).

A node that exits before the first ``ready`` stops everything (a port in use, a bad
config): :class:`SupervisorError` names it, with the end of its output.
"""

from __future__ import annotations

import collections
import functools
import logging
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from ..config import Settings
from ..store.lock import DataDirLock
from .embedded_pg import EmbeddedPostgres, free_port, socket_fits

log = logging.getLogger("leveret.cluster.supervisor")

#: Seconds the nodes have to become ready at start (a standby-like wait for a node name
#: still live after a crash is bounded by the lease, 3 s).
READY_TIMEOUT = 60.0
#: Seconds the nodes have to exit after SIGTERM before they are killed.
STOP_TIMEOUT = 30.0
#: Seconds before a node that exited is started again (doubled after each exit within
#: :data:`STABLE_AFTER` seconds of its start, up to :data:`RESTART_MAX`).
RESTART_MIN = 0.5
RESTART_MAX = 10.0
STABLE_AFTER = 30.0
#: Lines of a node's output kept to explain its exit.
TAIL_LINES = 20


class SupervisorError(RuntimeError):
    """The nodes could not be started (the message names the node and its last output)."""


@dataclass
class NodeProcess:
    """One node: its name, private AMQP port and data directory, and its process."""

    name: str
    cluster_port: int
    data_dir: Path
    prometheus_port: int | None
    process: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    ready: threading.Event = field(default_factory=threading.Event)
    tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=TAIL_LINES))
    restarts: int = 0
    pause: float = RESTART_MIN
    restart_at: float | None = None


class Supervisor:
    """Runs ``nodes`` node processes of ``settings`` (the server's resolved settings;
    ``config_file`` and ``consumer_timeout`` are passed on to every node) until a signal.
    :meth:`run` returns the exit code."""

    def __init__(
        self,
        settings: Settings,
        nodes: int,
        config_file: str | None = None,
        consumer_timeout: int | None = None,
    ) -> None:
        self.settings = settings
        self.count = nodes
        self.config_file = config_file
        self.consumer_timeout = consumer_timeout
        self.data_dir = Path(settings.data_dir or "./leveret-data").absolute()
        self.postgres: EmbeddedPostgres | None = None
        self.store_url = settings.store_url
        self.nodes: list[NodeProcess] = []
        self._stop = threading.Event()
        self._lock = DataDirLock(self.data_dir)

    # -- the ports every node shares --------------------------------------------------

    def _resolve_ports(self) -> None:
        """A port given as 0 ("a free one") is picked here once: every node must bind
        the same port."""
        settings = self.settings
        for key in (
            "amqp_port",
            "http_port",
            "https_port",
            "amqps_port",
            "stomp_port",
            "web_stomp_port",
            "mqtt_port",
            "web_mqtt_port",
            "mqtts_port",
            "web_amqp_port",
        ):
            port = getattr(settings, key, None)
            if port == 0:
                setattr(settings, key, free_port(settings.bind or "0.0.0.0"))
            elif port is not None:
                _check_free(settings.bind, port)

    def _argv(self, node: NodeProcess) -> list[str]:
        """The command line of one node."""
        settings = self.settings
        assert self.store_url is not None
        argv = [
            sys.executable,
            "-m",
            "leveret",
            "server",
            "--store",
            self.store_url,
            "--cluster",
            settings.store_cluster,
            "--node",
            node.name,
            "--advertise",
            settings.cluster_advertise,
            "--cluster-port",
            str(node.cluster_port),
            "--reuse-port",
            "--data-dir",
            str(node.data_dir),
            "--bind",
            settings.bind,
            "--amqp-port",
            str(settings.amqp_port),
            "--workers",
            str(settings.workers),
            "--log-level",
            settings.log_level,
        ]
        for option, key in (
            ("--http-port", "http_port"),
            ("--stomp-port", "stomp_port"),
            ("--web-stomp-port", "web_stomp_port"),
            ("--mqtt-port", "mqtt_port"),
            ("--web-mqtt-port", "web_mqtt_port"),
            ("--mqtts-port", "mqtts_port"),
            ("--web-amqp-port", "web_amqp_port"),
        ):
            port = getattr(settings, key)
            argv += [option, str(-1 if port is None else port)]  # -1: off
        argv += ["--prometheus-port", str(-1 if node.prometheus_port is None else node.prometheus_port)]
        if self.config_file is not None:
            argv += ["--config", str(Path(self.config_file).absolute())]
        if self.consumer_timeout is not None:
            argv += ["--consumer-timeout", str(self.consumer_timeout)]
        return argv

    # -- processes --------------------------------------------------------------------

    def _spawn(self, node: NodeProcess) -> None:
        """Start ``node``'s process; two threads read its output (stdout for its ready
        line, both passed on to stderr with the node's name)."""
        node.ready.clear()
        node.data_dir.mkdir(parents=True, exist_ok=True)
        node.process = subprocess.Popen(
            self._argv(node),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # a terminal's ^C reaches the supervisor, which orders the stop
            preexec_fn=_die_with_parent(),  # prctl only: no import, no lock in the child
        )
        node.started = time.monotonic()
        assert node.process.stdout is not None and node.process.stderr is not None
        for stream, watch in ((node.process.stdout, True), (node.process.stderr, False)):
            threading.Thread(
                target=self._read, args=(node, stream, watch), name=f"leveret-{node.name}", daemon=True
            ).start()

    def _read(self, node: NodeProcess, stream: IO[bytes], watch: bool) -> None:
        """Pass ``stream``'s lines on to stderr as ``[NODE] line``; on stdout, the node's
        ``leveret ready`` line sets its ready event."""
        for raw in stream:
            line = raw.decode(errors="replace").rstrip("\n")
            node.tail.append(line)
            if watch and line.startswith("leveret ready:"):
                node.ready.set()
            sys.stderr.write(f"[{node.name}] {line}\n")
            sys.stderr.flush()
        stream.close()

    def _stop_nodes(self) -> None:
        """SIGTERM to every node, then wait (at most :data:`STOP_TIMEOUT` s together)
        and kill those left."""
        running = [
            node.process for node in self.nodes if node.process is not None and node.process.poll() is None
        ]
        for process in running:
            process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        for process in running:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("node process %d did not stop in %.0f s: killed", process.pid, STOP_TIMEOUT)
                process.kill()
                process.wait()

    # -- the run ----------------------------------------------------------------------

    def run(self) -> int:
        """Start the store and the nodes, print the ready lines, watch until SIGTERM or
        SIGINT, stop everything; returns 0. Raises SupervisorError if a node exits
        before the cluster was first ready, DataDirLocked if another leveret uses the
        data directory."""
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: self._stop.set())
        self._lock.acquire()
        try:
            self._start()
            if not self._stop.is_set():
                self._say_ready()
                self._watch()
        finally:
            self._stop_nodes()
            if self.postgres is not None:
                self.postgres.stop()
            self._lock.release()
        return 0

    def _start(self) -> None:
        settings = self.settings
        self._resolve_ports()  # before anything starts: a port in use ends it here
        if self.store_url is None:
            directory = self.data_dir / "postgresql"
            tcp = not socket_fits(directory)
            if tcp:
                log.warning("%s: too long for a Unix socket: PostgreSQL listens on 127.0.0.1", directory)
            self.postgres = EmbeddedPostgres(directory, tcp=tcp)
            log.info("starting the private PostgreSQL in %s", self.postgres.dir)
            try:
                self.postgres.start()
            except RuntimeError as exc:
                raise SupervisorError(str(exc)) from None
            self.store_url = self.postgres.url
        host = socket.gethostname().split(".")[0] or "leveret"
        for index in range(1, self.count + 1):
            name = f"{host}-{index}"
            port = (
                settings.cluster_port + index - 1
                if settings.cluster_port
                else free_port(settings.bind or "0.0.0.0")
            )
            metrics = settings.prometheus_port
            if metrics == 0:
                metrics = free_port(settings.bind or "0.0.0.0")
            elif metrics is not None:
                metrics += index - 1
            self.nodes.append(NodeProcess(name, port, self.data_dir / "nodes" / name, metrics))
        if self._stop.is_set():  # a signal while PostgreSQL started
            return
        for node in self.nodes:
            self._spawn(node)
        deadline = time.monotonic() + READY_TIMEOUT
        while not all(node.ready.is_set() for node in self.nodes):
            if self._stop.wait(0.05):
                return
            for node in self.nodes:
                assert node.process is not None
                if node.process.poll() is not None:
                    time.sleep(0.1)  # its last lines
                    raise SupervisorError(
                        f"node {node.name} exited with code {node.process.returncode} while starting:\n"
                        + "\n".join(node.tail)
                    )
            if time.monotonic() > deadline:
                late = [node.name for node in self.nodes if not node.ready.is_set()]
                raise SupervisorError(f"nodes not ready after {READY_TIMEOUT:.0f} s: {', '.join(late)}")

    def _say_ready(self) -> None:
        """The same lines as one broker's (the shared addresses), then the nodes."""
        settings = self.settings
        host = settings.bind
        ready = f"leveret ready: amqp://{host}:{settings.amqp_port}"
        if settings.stomp_port is not None:
            ready += f" stomp://{host}:{settings.stomp_port}"
        if settings.mqtt_port is not None:
            ready += f" mqtt://{host}:{settings.mqtt_port}"
        lines = [ready]
        if settings.http_port is not None:
            lines.append(f"leveret management: http://{host}:{settings.http_port}/api/")
        for name, key in (
            ("web-stomp", "web_stomp_port"),
            ("web-mqtt", "web_mqtt_port"),
            ("web-amqp", "web_amqp_port"),
        ):
            port = getattr(settings, key)
            if port is not None:
                lines.append(f"leveret {name}: ws://{host}:{port}/ws")
        for node in self.nodes:
            if node.prometheus_port is not None:
                lines.append(
                    f"leveret prometheus: http://{host}:{node.prometheus_port}/metrics ({node.name})"
                )
        store = "private PostgreSQL " + str(self.data_dir / "postgresql") if self.postgres else "--store"
        lines.append(
            f"leveret nodes: {' '.join(node.name for node in self.nodes)} "
            f"(cluster {settings.store_cluster}, {store})"
        )
        sys.stdout.write("\n".join(lines) + "\n")
        sys.stdout.flush()

    def _watch(self) -> None:
        """Until a signal: start again each node that exited, after its pause."""
        while not self._stop.wait(0.1):
            now = time.monotonic()
            for node in self.nodes:
                process = node.process
                assert process is not None
                if node.restart_at is None and process.poll() is not None:
                    if now - node.started > STABLE_AFTER:
                        node.pause = RESTART_MIN
                    node.restart_at = now + node.pause
                    log.warning(
                        "node %s exited with code %s: starting it again in %.1f s",
                        node.name,
                        process.returncode,
                        node.pause,
                    )
                    node.pause = min(RESTART_MAX, node.pause * 2)
                elif node.restart_at is not None and now >= node.restart_at:
                    node.restart_at = None
                    node.restarts += 1
                    self._spawn(node)


def _check_free(host: str, port: int) -> None:
    """SupervisorError if ``host:port`` is bound already. The nodes bind with
    SO_REUSEPORT, which another process of the same user (another ``--nodes``, say) may
    have done too: the kernel would then spread clients over two unrelated brokers.
    A bind without SO_REUSEPORT fails on any bound port, so it is tried first."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    for family, kind, proto, _, address in dict.fromkeys(infos):
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the listeners
            try:
                probe.bind(address)
            except OSError as exc:
                raise SupervisorError(f"cannot listen on {host}:{port}: {exc.strerror}") from None


def _die_with_parent() -> Callable[[], None] | None:
    """For a node's process, run before exec: SIGTERM when the supervisor dies (Linux's
    PR_SET_PDEATHSIG), so that no node outlives a killed supervisor. Looked up here, in
    the parent: the child of a threaded process must not import or take locks."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return functools.partial(prctl, 1, int(signal.SIGTERM))  # 1: PR_SET_PDEATHSIG


__all__ = ["NodeProcess", "Supervisor", "SupervisorError"]
