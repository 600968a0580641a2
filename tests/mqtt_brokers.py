"""The MQTT broker the MQTT behaviour tests run against: leveret (default) or a private
mosquitto 2.0 (``MQTT_BROKER=mosquitto``), so every expectation is checked on the
reference broker too (docs/mqtt.md, "Running the MQTT tests against mosquitto").

Fixtures (imported by tests/conftest.py):

- ``mqtt_broker``: the session's :class:`MqttBroker`, started once and restarted if a
  test left it dead. Tests keep apart by :func:`unique` topics and client ids.
- ``mqtt_own_broker``: a broker of the test's own, for tests that restart it
  (:meth:`MqttBroker.restart`) or change its state for everyone.

Both skip with the reason when the chosen broker cannot run here: leveret without
``--mqtt-port`` in ``leveret server --help``, or mosquitto not installed.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

#: Which broker the MQTT tests run against: ``leveret`` or ``mosquitto``.
BROKER = os.environ.get("MQTT_BROKER", "leveret")
MOSQUITTO = shutil.which("mosquitto") or (
    "/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else None
)

_counter = itertools.count()


def unique(prefix: str = "t") -> str:
    """A name no other test of this run uses (topics and client ids on a shared broker)."""
    return f"{prefix}-{os.getpid()}-{next(_counter)}-{time.monotonic_ns() % 1_000_000}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_listening(host: str, port: int, proc: subprocess.Popen, log: Path, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the broker exited ({proc.returncode}): {log.read_text()[-2000:]}")
        try:
            socket.create_connection((host, port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(
        f"the broker did not listen on {host}:{port} in {timeout} s: {log.read_text()[-2000:]}"
    )


class MqttBroker:
    """A running MQTT broker: ``host``/``port`` of its MQTT listener (TCP), its ``name``
    (``"leveret"`` or ``"mosquitto"``), credentials, and restart with state kept."""

    name = ""
    #: :meth:`restart` keeps retained messages and persistent sessions (with their
    #: subscriptions and queued QoS 1/2 messages).
    supports_restart = True

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.host = "127.0.0.1"
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.log_path = workdir / f"{self.name}.log"

    # -- credentials ---------------------------------------------------------------------

    def credentials(self) -> tuple[str, str]:
        """A (user name, password) the broker accepts."""
        raise NotImplementedError

    def bad_credentials(self) -> tuple[str, str]:
        """A known user name with a wrong password: refused with CONNACK 5 (3.1.1) /
        0x86 bad user name or password (5.0)."""
        return self.credentials()[0], "not-the-password"

    # -- process -------------------------------------------------------------------------

    def _command(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> MqttBroker:
        with open(self.log_path, "a") as log:
            self.proc = subprocess.Popen(
                self._command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        _wait_listening(self.host, self.port, self.proc, self.log_path)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 10) -> None:
        """Stop gracefully (SIGTERM: both brokers save their state), kill if it hangs."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def kill(self) -> None:
        """kill -9: what was not yet on disk is lost (the broker's durability)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def restart(self) -> None:
        """Stop gracefully and start again on the same port with the same state."""
        if not self.supports_restart:
            pytest.skip(f"{self.name}: restart keeping state is not supported")
        self.stop()
        self.start()

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""


class Mosquitto(MqttBroker):
    """A private mosquitto 2.0: a listener on 127.0.0.1, anonymous clients allowed and a
    password file with one user (a wrong password is refused), persistence in the
    work dir (so :meth:`restart` keeps sessions and retained messages), a maximum
    packet size of 100,000 bytes, other limits at mosquitto's defaults."""

    name = "mosquitto"
    USER, PASSWORD = "mqtt-user", "mqtt-secret"

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        passwd = workdir / "passwd"
        passwd.write_text("")
        subprocess.run(
            ["mosquitto_passwd", "-b", str(passwd), self.USER, self.PASSWORD],
            check=True,
            capture_output=True,
        )
        passwd.chmod(0o600)
        self.config = workdir / "mosquitto.conf"
        self.config.write_text(
            "\n".join(
                [
                    # Run as root (CI), mosquitto would switch to user "mosquitto", which
                    # cannot read the private temp dir: stay who we are.
                    *(["user root"] if os.geteuid() == 0 else []),
                    "per_listener_settings false",
                    f"listener {self.port} 127.0.0.1",
                    "allow_anonymous true",
                    f"password_file {passwd}",
                    "persistence true",
                    f"persistence_location {workdir}/",
                    # Saved after every change (autosave_interval counts changes then),
                    # for the kill -9 test; by default every 30 min.
                    "autosave_on_changes true",
                    "autosave_interval 1",
                    # A maximum packet size (CONNACK 5.0 property) for the oversize test to
                    # cross; mosquitto's default is none.
                    "max_packet_size 100000",
                    "log_dest stderr",
                    "log_type error",
                    "log_type warning",
                    "log_type notice",
                    "log_type information",
                    "",
                ]
            )
        )

    def credentials(self) -> tuple[str, str]:
        return self.USER, self.PASSWORD

    def _command(self) -> list[str]:
        assert MOSQUITTO is not None
        return [MOSQUITTO, "-c", str(self.config)]


class Leveret(MqttBroker):
    """``leveret server --mqtt-port PORT`` as a subprocess with its own data dir (kept
    across :meth:`restart`); the default user guest/guest (loopback)."""

    name = "leveret"

    def credentials(self) -> tuple[str, str]:
        return "guest", "guest"

    def _command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "leveret",
            "server",
            "--amqp-port",
            "0",
            "--stomp-port",
            "0",
            "--web-stomp-port",
            "0",
            "--web-mqtt-port",
            "0",
            "--prometheus-port",
            "0",
            "--mqtt-port",
            str(self.port),
            "--data-dir",
            str(self.workdir / "data"),
        ]


@cache
def leveret_has_mqtt() -> bool:
    """Whether this leveret has the ``--mqtt-port`` option (the MQTT adapter)."""
    out = subprocess.run(
        [sys.executable, "-m", "leveret", "server", "--help"], capture_output=True, text=True, check=False
    )
    return "--mqtt-port" in out.stdout


def skip_unless_runnable() -> None:
    if BROKER == "mosquitto":
        if MOSQUITTO is None or shutil.which("mosquitto_passwd") is None:
            pytest.skip("MQTT_BROKER=mosquitto but mosquitto is not installed")
    elif BROKER == "leveret":
        if not leveret_has_mqtt():
            pytest.skip("leveret server has no --mqtt-port yet (the MQTT adapter): MQTT tests skipped")
    else:
        pytest.fail(f"MQTT_BROKER={BROKER!r}: expected 'leveret' or 'mosquitto'")


def make_broker(workdir: Path) -> MqttBroker:
    skip_unless_runnable()
    cls = Mosquitto if BROKER == "mosquitto" else Leveret
    return cls(workdir).start()


@pytest.fixture(scope="session")
def _mqtt_session_broker() -> Iterator[list[MqttBroker]]:
    skip_unless_runnable()
    workdir = Path(tempfile.mkdtemp(prefix="mqtt-broker-"))
    holder = [make_broker(workdir)]
    yield holder
    holder[0].stop()
    shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def mqtt_broker(_mqtt_session_broker: list[MqttBroker]) -> MqttBroker:
    """The session's MQTT broker (started again, same port and state, if a test left
    it dead; a crash shows in the failing test's log)."""
    broker = _mqtt_session_broker[0]
    if not broker.alive():
        broker.start()
    return broker


@pytest.fixture
def mqtt_own_broker(tmp_path: Path) -> Iterator[MqttBroker]:
    """A broker of this test's own (for restarts and kill -9)."""
    broker = make_broker(tmp_path)
    yield broker
    broker.kill()
