"""Start, measure and stop the brokers under test (leveret, RabbitMQ, ActiveMQ, mosquitto).

Each broker runs as a private subprocess on a free loopback port with its own
temporary data directory, so a benchmark run never touches a system broker.

Process accounting (used for CPU/message and RSS) reads ``/proc``: CPU is
``utime + stime`` (fields 14 and 15 of ``/proc/PID/stat``, in clock ticks,
converted with ``SC_CLK_TCK``) summed over the broker's main process and all
of its live descendants; RSS is ``VmRSS`` from ``/proc/PID/status`` summed the
same way.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

CLK_TCK = os.sysconf("SC_CLK_TCK")
RABBITMQ_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"
MOSQUITTO = "/usr/sbin/mosquitto"  # Debian's package (apt-get install mosquitto)
ACTIVEMQ_HOME = "/usr/share/activemq"  # Debian's package (apt-get install activemq)
ACTIVEMQ_JAR = os.path.join(ACTIVEMQ_HOME, "bin", "activemq.jar")


# --------------------------------------------------------------- /proc helpers
def _children(pid: int) -> list[int]:
    kids: list[int] = []
    task_dir = Path(f"/proc/{pid}/task")
    try:
        for task in task_dir.iterdir():
            try:
                kids.extend(int(x) for x in (task / "children").read_text().split())
            except OSError:
                pass
    except OSError:
        pass
    return kids


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its live descendants."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(_children(p))
    return out


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of one process, in seconds (0 if it is gone)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    # comm (field 2) may contain spaces: split after its closing parenthesis.
    fields = raw[raw.rindex(")") + 2:].split()
    # fields[0] is field 3 (state), so field 14 is fields[11], field 15 fields[12]
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def machine_cpu() -> tuple[float, float]:
    """(busy, iowait) CPU seconds of the whole machine so far, all cores (``/proc/stat``)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, _idle, iowait, irq, softirq, steal = (ticks + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / CLK_TCK, iowait / CLK_TCK


def proc_rss_bytes(pid: int) -> int:
    """VmRSS of one process, in bytes (0 if gone or a kernel thread)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def proc_comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def disk_usage(path: str) -> tuple[int, int]:
    """(bytes allocated on disk, apparent size in bytes) of every file under ``path``."""
    used = apparent = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                st = os.lstat(os.path.join(root, f))
            except OSError:
                continue
            used += st.st_blocks * 512
            apparent += st.st_size
    return used, apparent


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1 (tiny race, acceptable here)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def amqp_port_open(host: str, port: int) -> bool:
    """True if the port accepts TCP and answers the AMQP protocol header."""
    try:
        with socket.create_connection((host, port), timeout=1) as s:
            s.sendall(b"AMQP\x00\x00\x09\x01")
            s.settimeout(2)
            data = s.recv(1)
            return data == b"\x01"  # first byte of a method frame (connection.start)
    except OSError:
        return False


def stomp_connect(host: str, port: int, login: str | None = "guest", passcode: str | None = "guest",
                  accept_version: str = "1.2", timeout: float = 2.0,
                  host_header: str = "localhost") -> tuple[str, dict[str, str]] | None:
    """One STOMP CONNECT on a fresh socket: (command, headers) of the answer
    (``CONNECTED`` or ``ERROR``), or None if the port is closed or says nothing.
    ``host_header``: RabbitMQ takes it as the vhost (``/``); ActiveMQ ignores it."""
    lines = ["CONNECT", f"accept-version:{accept_version}", f"host:{host_header}", "heart-beat:0,0"]
    if login is not None:
        lines += [f"login:{login}", f"passcode:{passcode or ''}"]
    try:
        with socket.create_connection((host, port), timeout=1) as s:
            s.sendall(("\n".join(lines) + "\n\n\0").encode())
            s.settimeout(timeout)
            data = b""
            while b"\0" not in data:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
    except OSError:
        return None
    head = data.split(b"\0", 1)[0].lstrip(b"\r\n").split(b"\n\n", 1)[0].decode(errors="replace")
    if not head:
        return None
    command, *rest = head.split("\n")
    headers: dict[str, str] = {}
    for line in rest:
        k, _, v = line.partition(":")
        headers.setdefault(k, v)  # the first occurrence wins
    return command, headers


def mqtt_connect(host: str, port: int, version: int = 4, client_id: str = "",
                 username: str | None = None, password: str | None = None,
                 timeout: float = 2.0) -> int | None:
    """One MQTT CONNECT (clean session, keep alive 0) on a fresh socket: the CONNACK's
    return code (3.1.1, ``version`` 4) or reason code (5.0, ``version`` 5), 0 meaning
    accepted; None if the port is closed or answers no CONNACK. The bytes are built
    here (MQTT 3.1.1 §3.1, 5.0 §3.1), so this works without leveret importable."""
    def string(b: bytes) -> bytes:
        return len(b).to_bytes(2, "big") + b

    flags = 0x02 | (0x80 if username is not None else 0) | (0x40 if password is not None else 0)
    body = string(b"MQTT") + bytes([version, flags]) + b"\x00\x00"
    if version == 5:
        body += b"\x00"  # no properties
    body += string(client_id.encode())
    if username is not None:
        body += string(username.encode())
    if password is not None:
        body += string(password.encode())
    try:
        with socket.create_connection((host, port), timeout=1) as s:
            s.sendall(b"\x10" + bytes([len(body)]) + body)  # len(body) < 128 here
            s.settimeout(timeout)
            data = b""
            while len(data) < 4:
                chunk = s.recv(64)
                if not chunk:
                    return None
                data += chunk
            if data[0] != 0x20:
                return None
            s.sendall(b"\xe0\x00")  # DISCONNECT
            return data[3]
    except OSError:
        return None


def raise_nofile_limit() -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit (brokers started after
    inherit it); returns the new soft limit (file descriptors)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


# ------------------------------------------------------------------ brokers
class BrokerError(RuntimeError):
    pass


@dataclass
class Broker:
    """A running broker subprocess.

    ``pid`` is the process whose CPU is measured (RabbitMQ: ``beam.smp``),
    ``root`` the process we spawned (RabbitMQ: its shell wrapper).
    """

    name: str
    host: str = "127.0.0.1"
    port: int = 0
    #: the STOMP port (leveret: from its ready line; RabbitMQ with ``stomp=True``;
    #: ActiveMQ: ``port``); 0 when the broker does not listen for STOMP
    stomp_port: int = 0
    #: the MQTT port (mosquitto: ``port``; RabbitMQ with ``mqtt=True``; leveret with
    #: ``mqtt=True``); 0 when the broker does not listen for MQTT
    mqtt_port: int = 0
    #: the MQTT-over-WebSocket port (RabbitMQ ``web_mqtt=True``, leveret ``web_mqtt=True``)
    web_mqtt_port: int = 0
    pid: int = 0
    root: subprocess.Popen | None = None
    workdir: str = ""
    log_path: str = ""
    extra: dict = field(default_factory=dict)

    # measurement -------------------------------------------------------
    def cpu_seconds(self) -> float:
        """CPU seconds (user + system) of the broker process tree."""
        return sum(proc_cpu_seconds(p) for p in process_tree(self.pid))

    def rss_bytes(self) -> int:
        """Resident memory of the broker process tree, in bytes."""
        return sum(proc_rss_bytes(p) for p in process_tree(self.pid))

    def alive(self) -> bool:
        return self.root is not None and self.root.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(Path(self.log_path).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def data_dir(self) -> str:
        """Where the broker keeps its messages (for disk usage)."""
        raise NotImplementedError

    def disk_usage(self) -> tuple[int, int]:
        """(allocated, apparent) bytes of the broker's data directory."""
        return disk_usage(self.data_dir())

    # lifecycle ---------------------------------------------------------
    def start(self) -> Broker:
        """Prepare a fresh working directory and launch; on failure, clean up and raise."""
        self.prepare()
        try:
            self.launch(self.start_timeout)
        except BrokerError:
            self.stop()
            raise
        return self

    def prepare(self) -> None:
        """Make the working directory (and pick ports) for a first launch."""
        raise NotImplementedError

    #: seconds ``stop`` waits for a clean exit before SIGKILL
    stop_timeout: float = 15.0

    def stop(self) -> None:
        """Shut down (waiting ``stop_timeout`` seconds at most) and remove the working
        directory."""
        self.shutdown(timeout=self.stop_timeout)
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = ""

    def shutdown(self, kill: bool = False, timeout: float = 120.0) -> float:
        """Stop the broker process but keep its data directory (for a restart).

        ``kill``: SIGKILL (a crash) instead of a clean SIGTERM shutdown; SIGKILL after
        ``timeout`` seconds either way. Returns the seconds until the process had exited.
        This is for a broker that is the process we spawned (``root``); RabbitMQ overrides it.
        """
        t0 = time.monotonic()
        if self.root is not None and self.root.poll() is None:
            self.root.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                self.root.wait(timeout)
            except subprocess.TimeoutExpired:
                self.root.kill()
                self.root.wait(5)
        return time.monotonic() - t0

    def launch(self, timeout: float = 900.0) -> float:
        """Start the process again on the same data directory; returns the
        ``time.monotonic()`` just before it was spawned (it is ready on return)."""
        raise NotImplementedError

    def __enter__(self) -> Broker:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class Leveret(Broker):
    """``python -m leveret server --amqp-port 0 --stomp-port 0 --web-stomp-port 0 --data-dir <tmp>``.

    Ready when it prints ``leveret ready: amqp://127.0.0.1:PORT stomp://127.0.0.1:PORT``
    (``stomp_port`` is the second one).

    MQTT: when the tree's ``leveret server`` has ``--mqtt-port`` (see :meth:`has_mqtt`),
    ``mqtt=True`` passes a free loopback port (``mqtt_port``, kept across restarts) and
    the broker is ready once that port also answers an MQTT 3.1.1 CONNECT (anonymous)
    with CONNACK 0; otherwise ``--mqtt-port=-1`` keeps it off, so that no bench binds
    the default 1883. ``web_mqtt`` passes a free port to ``--web-mqtt-port``
    (``web_mqtt_port``); otherwise it gets ``0`` (a port the system picks, not 15675).
    Asking for MQTT from a tree without the option raises :class:`BrokerError`.
    """

    READY = re.compile(r"leveret ready: amqp://([\d.]+|\[[0-9a-fA-F:]+\]|[\w.-]+):(\d+)")
    READY_STOMP = re.compile(r"leveret ready: \S+ stomp://(?:[\d.]+|\[[0-9a-fA-F:]+\]|[\w.-]+):(\d+)")
    PROMETHEUS = re.compile(r"leveret prometheus: (http://\S+)/metrics")

    def __init__(self, python: str = sys.executable, start_timeout: float = 30.0,
                 src: str | None = None, extra_args: list[str] | None = None,
                 mqtt: bool = False, web_mqtt: bool = False) -> None:
        super().__init__(name="leveret")
        self.mqtt = mqtt
        self.web_mqtt = web_mqtt
        self.python = python
        #: more ``leveret server`` options (e.g. ``--http-port 0``)
        self.extra_args = list(extra_args or [])
        self.start_timeout = start_timeout
        #: Another leveret source tree (its src/) for the broker alone, e.g. a checkout
        #: of an older commit, so the same bench measures before and after a change.
        self.src = src

    def data_dir(self) -> str:
        return os.path.join(self.workdir, "data")

    def _cli_has(self, option: str) -> bool:
        """Whether the leveret this runs (``src``, or the importable one) knows a
        ``leveret server`` option: older trees lack the newer ones."""
        if self.src:
            package = os.path.join(self.src, "leveret")
        else:
            spec = importlib.util.find_spec("leveret")
            if spec is None or spec.origin is None:
                return False
            package = os.path.dirname(spec.origin)
        # cli.py in older trees, the cli/ package's server.py since.
        for cli in (os.path.join(package, "cli", "server.py"), os.path.join(package, "cli.py")):
            try:
                with open(cli) as f:
                    return option in f.read()
            except OSError:
                continue
        return False

    def has_mqtt(self) -> bool:
        """Whether this tree's ``leveret server`` takes ``--mqtt-port``."""
        return self._cli_has("--mqtt-port")

    def prepare(self) -> None:
        if (self.mqtt or self.web_mqtt) and not self.has_mqtt():
            raise BrokerError("this leveret has no MQTT yet (no `leveret server --mqtt-port`)")
        if self.web_mqtt and not self._cli_has("--web-mqtt-port"):
            raise BrokerError("this leveret has no MQTT over WebSocket yet (no `--web-mqtt-port`)")
        self.workdir = tempfile.mkdtemp(prefix="leveret-bench-")
        os.makedirs(self.data_dir())
        self.mqtt_port = free_port() if self.mqtt else 0
        self.web_mqtt_port = free_port() if self.web_mqtt else 0

    def launch(self, timeout: float = 900.0) -> float:
        self.log_path = os.path.join(self.workdir, "leveret.log")
        cmd = [self.python, "-m", "leveret", "server", "--amqp-port", "0", "--stomp-port", "0",
               "--web-stomp-port", "0", "--data-dir", self.data_dir()]
        if self._cli_has("--prometheus-port"):  # a free port, not 15692 (runs may overlap)
            cmd += ["--prometheus-port", "0"]
        if self.has_mqtt():  # explicit: the default would be 1883 for every bench
            cmd += [f"--mqtt-port={self.mqtt_port or -1}"]
        if self._cli_has("--web-mqtt-port"):  # likewise, not 15675 (0: a free port)
            cmd += [f"--web-mqtt-port={self.web_mqtt_port}"]
        cmd += self.extra_args
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        if self.src:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, (self.src, env.get("PYTHONPATH"))))
        if env.get("PYTHONPATH"):  # absolute: the broker runs in its temporary directory, where
            # a relative PYTHONPATH=src would find nothing and the installed leveret would run
            paths = env["PYTHONPATH"].split(os.pathsep)
            env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in paths if p)
        offset = os.path.getsize(self.log_path) if os.path.exists(self.log_path) else 0
        with open(self.log_path, "ab") as log:
            t0 = time.monotonic()
            self.root = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env, start_new_session=True, cwd=self.workdir)
        self.pid = self.root.pid
        deadline = t0 + timeout
        while time.monotonic() < deadline:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                text = f.read().decode(errors="replace")
            m = self.READY.search(text)
            if m:
                self.host = m.group(1).strip("[]")
                self.port = int(m.group(2))
                m_stomp = self.READY_STOMP.search(text)
                self.stomp_port = int(m_stomp.group(1)) if m_stomp else 0
                if not self.mqtt or mqtt_connect(self.host, self.mqtt_port) == 0:
                    return t0
            if self.root.poll() is not None:
                break
            time.sleep(0.02)
        raise BrokerError(f"leveret did not become ready (cmd: {' '.join(cmd)})\n{self.log_tail()}")

    def prometheus_url(self, timeout: float = 5.0) -> str | None:
        """``http://host:port`` of the broker's Prometheus metrics (printed after the
        ready line), or None if it has none (an older tree)."""
        deadline = time.monotonic() + timeout
        while True:
            with open(self.log_path, "rb") as f:
                m = self.PROMETHEUS.search(f.read().decode(errors="replace"))
            if m:
                return m.group(1)
            if time.monotonic() > deadline or not self._cli_has("--prometheus-port"):
                return None
            time.sleep(0.02)


def rabbitmq_installed() -> bool:
    return os.path.exists(RABBITMQ_SERVER) and shutil.which("erl") is not None


class RabbitMQ(Broker):
    """A private RabbitMQ node started from the Debian package's scripts.

    Isolation: random node name ``bench-<hex>@localhost``, free loopback
    ports for AMQP, Erlang distribution and a private ``epmd``
    (``ERL_EPMD_PORT``), all state (mnesia, logs, Erlang cookie via ``HOME``)
    in a temporary directory, an empty enabled-plugins file (no management
    plugin), and an empty ``rabbitmq-env.conf`` so /etc settings are ignored.

    ``schedulers``: if set, Erlang scheduler threads (``+S N:N``); default is
    one per core. ``management``: enable ``rabbitmq_management`` on a free
    loopback port (``http_port``), for the tests that compare HTTP answers.
    ``stomp``: enable ``rabbitmq_stomp`` (through the enabled-plugins file) with one
    listener on a free loopback port (``stomp_port``); the node is then ready once
    that port also answers a STOMP CONNECT (guest/guest, vhost ``/``) with CONNECTED.
    ``mqtt``: enable ``rabbitmq_mqtt`` (MQTT 3.1.1 only in 3.10) with one listener on a
    free loopback port (``mqtt_port``), ``mqtt.allow_anonymous = true`` with the default
    user ``guest``/``guest`` (allowed because clients come from loopback), vhost ``/``,
    exchange ``amq.topic`` and ``mqtt.prefetch = mqtt_prefetch`` (QoS 1 deliveries
    unacknowledged per subscriber; the plugin's default is 10); the node is then ready
    once that port answers an anonymous CONNECT with CONNACK 0. ``web_mqtt``: also
    ``rabbitmq_web_mqtt`` on a free loopback port (``web_mqtt_port``, path ``/ws``).
    ``amqp10``: enable ``rabbitmq_amqp1_0`` (3.10's plugin: AMQP 1.0 on the AMQP port,
    sniffed from the protocol header; v1 addresses ``/queue/NAME``, ``/exchange/X/KEY``).
    ``federation``: enable ``rabbitmq_federation`` and ``rabbitmq_federation_management``
    (and so ``rabbitmq_management``: ``/api/federation-links``).
    ``conf``: more ``rabbitmq.conf`` lines; ``advanced_config``: the terms of an
    ``advanced.config`` list (``{rabbit, [{channel_tick_interval, 100}]}``).
    File descriptors: the node inherits this process's RLIMIT_NOFILE (call
    :func:`raise_nofile_limit` first for many connections).
    """

    def __init__(self, start_timeout: float = 90.0, schedulers: int | None = None,
                 management: bool = False, stomp: bool = False, mqtt: bool = False,
                 web_mqtt: bool = False, mqtt_prefetch: int = 10, amqp10: bool = False,
                 conf: str = "", advanced_config: str = "", federation: bool = False) -> None:
        super().__init__(name="rabbitmq")
        self.federation = federation
        self.conf = conf  # more rabbitmq.conf lines
        self.advanced_config = advanced_config  # advanced.config terms ({rabbit, [...]}), if any
        self.amqp10 = amqp10
        self.start_timeout = start_timeout
        self.schedulers = schedulers
        self.management = management or federation
        self.stomp = stomp
        self.mqtt = mqtt or web_mqtt
        self.web_mqtt = web_mqtt
        self.mqtt_prefetch = mqtt_prefetch
        self.epmd_port = 0
        self.http_port = 0

    def _env(self) -> dict:
        w = self.workdir
        Path(w, "rabbitmq-env.conf").write_text("")
        plugins = [name for name, wanted in (("rabbitmq_management", self.management),
                                             ("rabbitmq_stomp", self.stomp),
                                             ("rabbitmq_mqtt", self.mqtt),
                                             ("rabbitmq_web_mqtt", self.web_mqtt),
                                             ("rabbitmq_amqp1_0", self.amqp10),
                                             ("rabbitmq_federation", self.federation),
                                             ("rabbitmq_federation_management", self.federation))
                   if wanted]
        Path(w, "enabled_plugins").write_text(f"[{','.join(plugins)}].\n")
        Path(w, "rabbitmq.conf").write_text(
            "loopback_users.guest = true\n"
            "log.console = false\n"
            "log.file.level = warning\n"
            + (f"management.tcp.port = {self.http_port}\nmanagement.tcp.ip = 127.0.0.1\n"
               if self.management else "")
            + (f"stomp.listeners.tcp.1 = 127.0.0.1:{self.stomp_port}\n" if self.stomp else "")
            + (f"mqtt.listeners.tcp.1 = 127.0.0.1:{self.mqtt_port}\n"
               "mqtt.allow_anonymous = true\nmqtt.default_user = guest\nmqtt.default_pass = guest\n"
               f"mqtt.vhost = /\nmqtt.exchange = amq.topic\nmqtt.prefetch = {self.mqtt_prefetch}\n"
               if self.mqtt else "")
            + (f"web_mqtt.tcp.port = {self.web_mqtt_port}\nweb_mqtt.tcp.ip = 127.0.0.1\n"
               if self.web_mqtt else "")
            + self.conf
        )
        Path(w, "advanced.config").write_text(f"[{self.advanced_config}].\n")
        erl_args = "-kernel inet_dist_use_interface {127,0,0,1}"
        if self.schedulers:
            erl_args += f" +S {self.schedulers}:{self.schedulers}"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
        env.update(
            HOME=w,
            RABBITMQ_CONF_ENV_FILE=os.path.join(w, "rabbitmq-env.conf"),
            RABBITMQ_CONFIG_FILE=os.path.join(w, "rabbitmq.conf"),
            RABBITMQ_ADVANCED_CONFIG_FILE=os.path.join(w, "advanced.config"),
            RABBITMQ_ENABLED_PLUGINS_FILE=os.path.join(w, "enabled_plugins"),
            RABBITMQ_NODENAME=self.extra["nodename"],
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_DIST_PORT=str(self.extra["dist_port"]),
            RABBITMQ_MNESIA_BASE=os.path.join(w, "mnesia"),
            RABBITMQ_LOG_BASE=os.path.join(w, "log"),
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=erl_args,
            ERL_EPMD_PORT=str(self.epmd_port),
            ERL_EPMD_ADDRESS="127.0.0.1",
        )
        return env

    def data_dir(self) -> str:
        return os.path.join(self.workdir, "mnesia")

    def prepare(self) -> None:
        if not rabbitmq_installed():
            raise BrokerError("rabbitmq-server is not installed (apt-get install -y rabbitmq-server)")
        self.workdir = tempfile.mkdtemp(prefix="rabbitmq-bench-")
        self.port = free_port()
        self.epmd_port = free_port()
        self.http_port = free_port() if self.management else 0
        self.stomp_port = free_port() if self.stomp else 0
        self.mqtt_port = free_port() if self.mqtt else 0
        self.web_mqtt_port = free_port() if self.web_mqtt else 0
        self.extra = {"nodename": f"bench-{secrets.token_hex(4)}@localhost", "dist_port": free_port()}

    def launch(self, timeout: float = 900.0) -> float:
        """Start (or restart) the node: same node name, ports and mnesia directory."""
        self.log_path = os.path.join(self.workdir, "stdout.log")
        env = self._env()
        with open(self.log_path, "ab") as log:
            t0 = time.monotonic()
            self.root = subprocess.Popen([RABBITMQ_SERVER], stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env, cwd=self.workdir,
                                         start_new_session=True)
        self.pid = 0
        deadline = t0 + timeout
        while time.monotonic() < deadline:
            if self.root.poll() is not None:
                break
            if (amqp_port_open(self.host, self.port) and (not self.stomp or self._stomp_ready())
                    and (not self.mqtt or mqtt_connect(self.host, self.mqtt_port) == 0)):
                beam = self._find_beam()
                if beam:
                    self.pid = beam
                    return t0
            time.sleep(0.05)
        raise BrokerError(f"RabbitMQ did not start on port {self.port}\n{self.log_tail()}")

    def _stomp_ready(self) -> bool:
        answer = stomp_connect(self.host, self.stomp_port, host_header="/")
        return answer is not None and answer[0] == "CONNECTED"

    def find_pid(self) -> int:
        """The beam.smp PID of the running node (0 while it is not up yet)."""
        if self.root is None:
            return 0
        return self._find_beam()

    def shutdown(self, kill: bool = False, timeout: float = 120.0) -> float:
        """Stop the node but keep mnesia (and the private epmd) for a restart.

        Clean: SIGTERM to the wrapper script (a clean VM shutdown). ``kill``:
        SIGKILL to ``beam.smp`` (an unclean stop, like a crash or power loss of
        the VM process)."""
        t0 = time.monotonic()
        if self.root is None:
            return 0.0
        tree = [(p, proc_comm(p)) for p in process_tree(self.root.pid)]
        if self.root.poll() is None:
            if kill:
                beam = self._find_beam()
                if beam:
                    os.kill(beam, signal.SIGKILL)
            else:
                self.root.send_signal(signal.SIGTERM)
            try:
                self.root.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        elapsed = time.monotonic() - t0
        for p, comm in tree:  # anything left of the VM: kill by PID (if still the same program)
            if p != self.root.pid and comm and proc_comm(p) == comm:
                try:
                    os.kill(p, signal.SIGKILL)
                except OSError:
                    pass
        if self.root.poll() is None:
            self.root.kill()
            self.root.wait(5)
        return elapsed

    def _find_beam(self) -> int:
        for p in process_tree(self.root.pid):
            if proc_comm(p).startswith("beam"):
                return p
        return 0

    def _epmd_pids(self) -> list[int]:
        """epmd daemons started with our private ERL_EPMD_PORT."""
        out = []
        marker = f"ERL_EPMD_PORT={self.epmd_port}".encode()
        for d in Path("/proc").iterdir():
            if not d.name.isdigit() or proc_comm(int(d.name)) != "epmd":
                continue
            try:
                if marker in (d / "environ").read_bytes().split(b"\0"):
                    out.append(int(d.name))
            except OSError:
                pass
        return out

    def stop(self) -> None:
        if self.root is not None:
            self.shutdown(timeout=30)
        if self.epmd_port:
            for p in self._epmd_pids():
                try:
                    os.kill(p, signal.SIGTERM)
                except OSError:
                    pass
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = ""


def mosquitto_installed() -> bool:
    return os.access(MOSQUITTO, os.X_OK)


class Mosquitto(Broker):
    """A private mosquitto 2.0 broker (Debian's ``/usr/sbin/mosquitto``), never the system
    service: ``mosquitto -c <tmp>/mosquitto.conf`` in the foreground.

    The generated configuration: one MQTT listener on a free loopback port (``port`` =
    ``mqtt_port``), ``allow_anonymous true``, ``max_connections -1``, ``persistence
    false``, ``set_tcp_nodelay false`` (mosquitto's default; ``tcp_nodelay=True`` sets
    it, as RabbitMQ does by default: mosquitto then writes every packet in its own TCP
    segment, which cost it and the subscriber more CPU per message here),
    ``max_queued_messages`` (default 1,000,000 per client; mosquitto's default of 1000
    drops QoS 0 messages to a slow subscriber), ``max_queued_bytes 0`` (no limit),
    ``max_inflight_messages`` (QoS 1/2 deliveries unacknowledged per client; its default
    is 20), ``connection_messages false`` (no log line per connection), logging of
    errors, warnings and notices to ``mosquitto.log`` in the instance's directory. Run as
    root, mosquitto would switch to the ``mosquitto`` user, so ``user root`` keeps it
    as the current user. ``web_mqtt``: also a ``protocol websockets`` listener on a free
    loopback port (``web_mqtt_port``).

    Ready when the port answers an MQTT 3.1.1 CONNECT with CONNACK 0; ``pid`` is the
    mosquitto process (spawned directly). Stopped with SIGTERM, SIGKILL after a timeout.
    File descriptors: it inherits this process's RLIMIT_NOFILE (see
    :func:`raise_nofile_limit`).
    """

    def __init__(self, start_timeout: float = 30.0, max_queued_messages: int = 1_000_000,
                 max_inflight_messages: int = 20, web_mqtt: bool = False,
                 binary: str = MOSQUITTO, tcp_nodelay: bool = False) -> None:
        super().__init__(name="mosquitto")
        self.start_timeout = start_timeout
        self.max_queued_messages = max_queued_messages
        self.max_inflight_messages = max_inflight_messages
        self.web_mqtt = web_mqtt
        self.binary = binary
        self.tcp_nodelay = tcp_nodelay

    def data_dir(self) -> str:
        return self.workdir

    def conf_path(self) -> str:
        return os.path.join(self.workdir, "mosquitto.conf")

    def prepare(self) -> None:
        if not os.access(self.binary, os.X_OK):
            raise BrokerError(f"mosquitto is not installed ({self.binary}; apt-get install -y mosquitto)")
        self.workdir = tempfile.mkdtemp(prefix="mosquitto-bench-")
        self.port = self.mqtt_port = free_port()
        self.web_mqtt_port = free_port() if self.web_mqtt else 0
        lines = [
            "# generated by leveret's bench/brokers.py: a private mosquitto for tests and benchmarks",
            "per_listener_settings false",
            "allow_anonymous true",
            "max_connections -1",
            f"max_queued_messages {self.max_queued_messages}",
            "max_queued_bytes 0",
            f"max_inflight_messages {self.max_inflight_messages}",
            "persistence false",
            f"set_tcp_nodelay {'true' if self.tcp_nodelay else 'false'}",
            "connection_messages false",
            "log_dest stdout",
            "log_type error",
            "log_type warning",
            "log_type notice",
            f"listener {self.port} {self.host}",
            "protocol mqtt",
        ]
        if os.geteuid() == 0:
            lines.insert(1, "user root")
        if self.web_mqtt:
            lines += [f"listener {self.web_mqtt_port} {self.host}", "protocol websockets"]
        Path(self.conf_path()).write_text("\n".join(lines) + "\n")

    def launch(self, timeout: float = 900.0) -> float:
        self.log_path = os.path.join(self.workdir, "mosquitto.log")
        with open(self.log_path, "ab") as log:
            t0 = time.monotonic()
            self.root = subprocess.Popen([self.binary, "-c", self.conf_path()], stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         cwd=self.workdir, start_new_session=True)
        self.pid = self.root.pid
        deadline = t0 + timeout
        while time.monotonic() < deadline:
            if self.root.poll() is not None:
                break
            if mqtt_connect(self.host, self.port) == 0:
                return t0
            time.sleep(0.02)
        raise BrokerError(f"mosquitto did not answer MQTT on port {self.port}\n{self.log_tail()}")


def _java17() -> str | None:
    """A Java 17 ``java`` (Debian's openjdk-17, which the activemq package depends on)."""
    for candidate in sorted(glob.glob("/usr/lib/jvm/java-17-openjdk*/bin/java")):
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def activemq_installed() -> bool:
    return os.path.exists(ACTIVEMQ_JAR) and _java17() is not None


def _activemq_extra_jars() -> list[str]:
    """Jars the Debian package recommends but does not put on ActiveMQ's classpath: XStream
    and Jettison, which STOMP needs for advisory messages and ``transformation:jms-json|xml``
    (without them the broker logs NoClassDefFoundError and drops those dispatches)."""
    return [j for j in ("/usr/share/java/xstream.jar", "/usr/share/java/jettison.jar") if os.path.exists(j)]


# The JVM options /usr/bin/activemq passes to Java > 8 (so the broker runs on 17).
_ACTIVEMQ_JVM_OPENS = [
    "--add-reads=java.xml=java.logging",
    "--add-opens", "java.base/java.security=ALL-UNNAMED",
    "--add-opens", "java.base/java.net=ALL-UNNAMED",
    "--add-opens", "java.base/java.lang=ALL-UNNAMED",
    "--add-opens", "java.base/java.util=ALL-UNNAMED",
    "--add-opens", "java.naming/javax.naming.spi=ALL-UNNAMED",
    "--add-opens", "java.rmi/sun.rmi.transport.tcp=ALL-UNNAMED",
    "--add-opens", "java.base/java.util.concurrent=ALL-UNNAMED",
    "--add-opens", "java.base/java.util.concurrent.atomic=ALL-UNNAMED",
    "--add-exports=java.base/sun.net.www.protocol.http=ALL-UNNAMED",
    "--add-exports=java.base/sun.net.www.protocol.https=ALL-UNNAMED",
    "--add-exports=java.base/sun.net.www.protocol.jar=ALL-UNNAMED",
    "--add-exports=jdk.xml.dom/org.w3c.dom.html=ALL-UNNAMED",
    "--add-exports=jdk.naming.rmi/com.sun.jndi.url.rmi=ALL-UNNAMED",
]

_ACTIVEMQ_XML = """\
<beans xmlns="http://www.springframework.org/schema/beans"
       xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
       xsi:schemaLocation="http://www.springframework.org/schema/beans http://www.springframework.org/schema/beans/spring-beans.xsd
       http://activemq.apache.org/schema/core http://activemq.apache.org/schema/core/activemq-core.xsd">
  <!-- generated by leveret's bench/brokers.py: a private ActiveMQ for tests and benchmarks -->
  <broker xmlns="http://activemq.apache.org/schema/core" brokerName="localhost" useJmx="false"
          dataDirectory="{data}" schedulerSupport="{scheduler}">
    <!-- as in ActiveMQ's shipped conf/activemq.xml -->
    <destinationPolicy>
      <policyMap>
        <policyEntries>
          <policyEntry topic=">">
            <pendingMessageLimitStrategy>
              <constantPendingMessageLimitStrategy limit="1000"/>
            </pendingMessageLimitStrategy>
          </policyEntry>
        </policyEntries>
      </policyMap>
    </destinationPolicy>
    <persistenceAdapter>
      <kahaDB directory="{data}/kahadb"/>
    </persistenceAdapter>
    <systemUsage>
      <systemUsage>
        <memoryUsage><memoryUsage percentOfJvmHeap="70"/></memoryUsage>
        <storeUsage><storeUsage limit="100 gb"/></storeUsage>
        <tempUsage><tempUsage limit="50 gb"/></tempUsage>
      </systemUsage>
    </systemUsage>
{plugins}    <transportConnectors>
{connectors}    </transportConnectors>
  </broker>
</beans>
"""

_ACTIVEMQ_LOG4J = """\
# log4j 1.2 (Debian's ActiveMQ logs through slf4j-log4j12): everything to stdout, which
# bench/brokers.py sends to activemq.log in the instance's directory
log4j.rootLogger=INFO, stdout
log4j.logger.org.apache.activemq.spring=WARN
log4j.logger.org.springframework=WARN
log4j.logger.org.apache.xbean=WARN
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=%d | %-5p | %m | %c | %t%n
"""


class ActiveMQ(Broker):
    """A private ActiveMQ 5.17 broker started from the Debian package's jars.

    Runs ``java -jar /usr/share/activemq/bin/activemq.jar start xbean:file:<tmp>/conf/activemq.xml``
    with Java 17 directly, the way ``/usr/bin/activemq`` does (same ``--add-opens`` options and
    ``activemq.home/base/conf/data`` properties), but with ``activemq.base`` a temporary
    directory: its ``conf/activemq.xml`` is generated, its ``data/`` holds KahaDB and the
    scheduler store, ``tmp/`` is ``java.io.tmpdir``, and the log goes to ``activemq.log``. The
    system instance (/etc/activemq, /var/lib/activemq, the init script) is never used.

    The configuration: only a STOMP transport connector on ``127.0.0.1:port`` with the
    options of ActiveMQ's shipped config (``maximumConnections=1000``,
    ``wireFormat.maxFrameSize=104857600``), an OpenWire connector on another free loopback
    port only with ``openwire=True`` (the broker does not need one), no JMX, no web console
    (the Debian package has none), ``schedulerSupport`` on (``scheduler``), the shipped
    config's destination policy and usage limits.

    ``auth`` (default on): a ``simpleAuthenticationPlugin`` with the users ``guest/guest``
    (group ``users``) and ``admin/admin`` (groups ``admins,users``), and no anonymous
    access, so a bad login gets an ERROR frame; there is no authorization plugin, so every
    authenticated user may do everything. ``auth=False``: any login is accepted (ActiveMQ's
    default).

    Ready when the STOMP port answers a CONNECT (guest/guest) with CONNECTED. ``pid`` is
    the ``java`` process (spawned directly, so also ``root``). Stopped with SIGTERM (the
    JVM's shutdown hook stops the broker cleanly), SIGKILL after the timeout.
    """

    #: user name: (password, groups)
    USERS: ClassVar[dict[str, tuple[str, str]]] = {"guest": ("guest", "users"),
                                                   "admin": ("admin", "admins,users")}

    def __init__(self, start_timeout: float = 90.0, auth: bool = True, openwire: bool = False,
                 scheduler: bool = True, heap: str = "1G", java: str | None = None) -> None:
        super().__init__(name="activemq")
        self.start_timeout = start_timeout
        self.stop_timeout = 30.0  # the JVM's shutdown hook stops the broker first
        self.auth = auth
        self.openwire = openwire
        self.scheduler = scheduler
        self.heap = heap  # -Xmx; the shipped bin/env has -Xms64M -Xmx1G
        self.java = java or _java17() or "java"
        self.openwire_port = 0

    def data_dir(self) -> str:
        return os.path.join(self.workdir, "data")

    def conf_dir(self) -> str:
        return os.path.join(self.workdir, "conf")

    def prepare(self) -> None:
        if not activemq_installed():
            raise BrokerError("ActiveMQ (and Java 17) is not installed (apt-get install -y activemq)")
        self.workdir = tempfile.mkdtemp(prefix="activemq-bench-")
        for d in (self.conf_dir(), self.data_dir(), os.path.join(self.workdir, "tmp")):
            os.makedirs(d)
        self.port = self.stomp_port = free_port()
        self.openwire_port = free_port() if self.openwire else 0
        self.extra = {"openwire_port": self.openwire_port}
        self._write_config()

    def _write_config(self) -> None:
        connectors = (f'      <transportConnector name="stomp" uri="stomp://{self.host}:{self.port}'
                      '?maximumConnections=1000&amp;wireFormat.maxFrameSize=104857600"/>\n')
        if self.openwire:
            connectors += (f'      <transportConnector name="openwire" uri="tcp://{self.host}:'
                           f'{self.openwire_port}?maximumConnections=1000"/>\n')
        plugins = ""
        if self.auth:
            users = "".join(f'          <authenticationUser username="{u}" password="{p}" groups="{g}"/>\n'
                            for u, (p, g) in self.USERS.items())
            plugins = ('    <plugins>\n      <simpleAuthenticationPlugin anonymousAccessAllowed="false">\n'
                       f'        <users>\n{users}        </users>\n'
                       '      </simpleAuthenticationPlugin>\n    </plugins>\n')
        Path(self.conf_dir(), "activemq.xml").write_text(_ACTIVEMQ_XML.format(
            data=self.data_dir(), scheduler="true" if self.scheduler else "false",
            plugins=plugins, connectors=connectors))
        Path(self.conf_dir(), "log4j.properties").write_text(_ACTIVEMQ_LOG4J)

    def command(self) -> list[str]:
        w, conf = self.workdir, self.conf_dir()
        return [
            self.java, "-Xms64M", f"-Xmx{self.heap}", *_ACTIVEMQ_JVM_OPENS,
            f"-Dlog4j.configuration=file:{conf}/log4j.properties",
            f"-Djava.io.tmpdir={w}/tmp",
            f"-Dactivemq.classpath={':'.join([conf, *_activemq_extra_jars()])}",
            f"-Dactivemq.home={ACTIVEMQ_HOME}",
            f"-Dactivemq.base={w}",
            f"-Dactivemq.conf={conf}",
            f"-Dactivemq.data={self.data_dir()}",
            "-jar", ACTIVEMQ_JAR, "start", f"xbean:file:{conf}/activemq.xml",
        ]

    def launch(self, timeout: float = 900.0) -> float:
        """Start (or restart) the broker: same ports, configuration and data directory."""
        self.log_path = os.path.join(self.workdir, "activemq.log")
        cmd = self.command()
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("ACTIVEMQ_", "JAVA_", "_JAVA_", "JDK_"))}
        with open(self.log_path, "ab") as log:
            t0 = time.monotonic()
            self.root = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env, cwd=self.workdir, start_new_session=True)
        self.pid = self.root.pid
        deadline = t0 + timeout
        while time.monotonic() < deadline:
            if self.root.poll() is not None:
                break
            answer = stomp_connect(self.host, self.port)
            if answer is not None and answer[0] == "CONNECTED":
                return t0
            time.sleep(0.05)
        raise BrokerError(f"ActiveMQ did not answer STOMP on port {self.port}\n{self.log_tail()}")


# ------------------------------------------------------------------ self-check
def check_activemq() -> int:
    """``python bench/brokers.py activemq``: start a private ActiveMQ, send and receive one
    message on /queue/x with stomp.py over STOMP 1.0, 1.1 and 1.2 (printing each CONNECTED
    frame's headers), and stop it. Exit status 0 when all three round trips worked."""
    import threading

    import stomp  # stomp.py (the test extra)

    class Catch(stomp.ConnectionListener):
        def __init__(self) -> None:
            self.connected: dict[str, str] = {}
            self.message = None
            self.got = threading.Event()

        def on_connected(self, frame) -> None:
            self.connected = dict(frame.headers)

        def on_message(self, frame) -> None:
            self.message = frame
            self.got.set()

    if not activemq_installed():
        print("ActiveMQ is not installed (apt-get install -y activemq)", file=sys.stderr)
        return 1
    broker = ActiveMQ()
    t0 = time.monotonic()
    broker.start()
    failures = 0
    try:
        print(f"ActiveMQ ready on {broker.host}:{broker.port} (STOMP) in {time.monotonic() - t0:.2f} s, "
              f"pid {broker.pid}, dir {broker.workdir}")
        for version, cls in (("1.0", stomp.Connection10), ("1.1", stomp.Connection11),
                             ("1.2", stomp.Connection12)):
            conn = cls([(broker.host, broker.port)])
            catch = Catch()
            conn.set_listener("catch", catch)
            conn.connect("guest", "guest", wait=True)
            body = f"hello over STOMP {version}"
            if version == "1.0":
                conn.subscribe("/queue/x", ack="auto")
            else:
                conn.subscribe("/queue/x", id="s1", ack="auto")
            conn.send("/queue/x", body, headers={"color": "red"})
            ok = catch.got.wait(10) and catch.message is not None and catch.message.body == body
            failures += not ok
            print(f"STOMP {version}: CONNECTED " + ", ".join(f"{k}:{v}" for k, v in catch.connected.items()))
            got = catch.message
            print(f"  {'received' if ok else 'NOT received'}: "
                  + (f"{got.body!r} {dict(got.headers)}" if got is not None else "-"))
            conn.disconnect()
        cpu, rss = broker.cpu_seconds(), broker.rss_bytes()
        print(f"broker CPU so far {cpu:.2f} s, RSS {rss / 2**20:.0f} MiB")
    finally:
        t1 = time.monotonic()
        broker.stop()
        print(f"stopped in {time.monotonic() - t1:.2f} s")
    print("ok" if not failures else f"{failures} round trip(s) failed")
    return 1 if failures else 0


if __name__ == "__main__":
    if sys.argv[1:] == ["activemq"]:
        sys.exit(check_activemq())
    print("usage: python bench/brokers.py activemq   (start a private ActiveMQ, STOMP round trips, stop)",
          file=sys.stderr)
    sys.exit(2)
