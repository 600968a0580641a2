"""The ``leveret`` command line, its config file, and the embedding entry points
(``leveret.Broker``, ``leveret.BlockingBroker``, the ``leveret_broker`` pytest fixture).

Servers run as real subprocesses (``server_process`` / :class:`ServerProcess`), so the
ready line, signals and exit codes are what a user sees.
"""

from __future__ import annotations

import asyncio
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from importlib.metadata import entry_points
from pathlib import Path

import pika
import pytest
from eventually import poll
from pika.exceptions import (
    AuthenticationError,
    ConnectionClosedByBroker,
    ProbableAccessDeniedError,
    ProbableAuthenticationError,
)
from servers import ServerProcess

import leveret

LEVERET = [sys.executable, "-m", "leveret"]
READY = re.compile(r"leveret ready: amqp://([\d.]+):(\d+)$")


def connect(url: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(url))


def roundtrip(connection: pika.BlockingConnection, body: bytes = b"ping") -> None:
    """Declare, publish and get back one message over ``connection``."""
    channel = connection.channel()
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.basic_publish("", queue, body)
    method, _props, got = poll(lambda: channel.basic_get(queue, auto_ack=True),
                               lambda message: message[0] is not None, 5, 0.01)
    assert method is not None, "published message never arrived"
    assert got == body
    channel.close()


def run(*args: str, timeout: float = 15) -> subprocess.CompletedProcess:
    return subprocess.run([*LEVERET, *args], capture_output=True, text=True, timeout=timeout)


# -- ready line, --amqp-port 0, --bind ---------------------------------------------------
def test_ready_line_names_a_working_port(server_process):
    assert server_process.host == "127.0.0.1"
    assert server_process.port > 0
    connection = connect(server_process.url)
    roundtrip(connection)
    connection.close()


def test_amqp_port_0_gives_each_server_its_own_port(tmp_path):
    first = ServerProcess(tmp_path / "one")
    try:
        second = ServerProcess(tmp_path / "two")
        try:
            assert first.port != second.port
            for server in (first, second):
                connection = connect(server.url)
                roundtrip(connection)
                connection.close()
        finally:
            second.kill()
    finally:
        first.kill()


def test_bind_listens_on_that_address_only(tmp_path):
    """127.0.0.2 is a loopback address on Linux, so guest may still log in."""
    server = ServerProcess(tmp_path / "data", "--bind", "127.0.0.2")
    try:
        assert server.host == "127.0.0.2"
        connection = connect(f"amqp://guest:guest@127.0.0.2:{server.port}/%2F")
        roundtrip(connection)
        connection.close()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", server.port), timeout=2).close()
    finally:
        server.kill()


def test_port_in_use_is_a_clear_error(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run("server", "--amqp-port", str(port), "--data-dir", str(tmp_path))
    assert result.returncode != 0
    assert "leveret ready" not in result.stdout
    assert "Error: " in result.stderr and str(port) in result.stderr
    assert "Traceback" not in result.stderr


# -- shutdown on signals ------------------------------------------------------------------
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_closes_connections_with_320_and_exits_0(server_process, signum):
    connection = connect(server_process.url)
    channel = connection.channel()
    channel.queue_declare("before-shutdown")
    server_process.proc.send_signal(signum)
    with pytest.raises(ConnectionClosedByBroker) as info:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            connection.process_data_events(time_limit=0.1)
        pytest.fail("no connection.close from the broker")
    assert info.value.reply_code == 320
    assert "CONNECTION_FORCED" in info.value.reply_text
    assert server_process.proc.wait(10) == 0
    assert "shutting down" in server_process.log_path.read_text()


def test_signal_with_no_clients_exits_0(server_process):
    assert server_process.terminate() == 0


# -- --config ---------------------------------------------------------------------------
ALICE_CONFIG = """\
vhosts = ["/", "orders"]

[[users]]
name = "alice"
password = "s3cret"
vhosts = ["/", "orders"]
"""


@pytest.fixture
def alice_server(tmp_path):
    config = tmp_path / "leveret.toml"
    config.write_text(ALICE_CONFIG)
    server = ServerProcess(tmp_path / "data", "--config", str(config))
    yield server
    server.kill()


def test_config_user_and_vhost(alice_server):
    base = f"{alice_server.host}:{alice_server.port}"
    for url in (f"amqp://alice:s3cret@{base}/orders", f"amqp://alice:s3cret@{base}/%2F",
                f"amqp://guest:guest@{base}/%2F"):
        connection = connect(url)
        roundtrip(connection)
        connection.close()


def test_config_guest_is_refused_on_other_vhost(alice_server):
    with pytest.raises(ProbableAccessDeniedError) as info:
        connect(f"amqp://guest:guest@{alice_server.host}:{alice_server.port}/orders")
    assert "530" in str(info.value)


def test_config_wrong_password_is_refused(alice_server):
    with pytest.raises((ProbableAuthenticationError, AuthenticationError)) as info:
        connect(f"amqp://alice:wrong@{alice_server.host}:{alice_server.port}/orders")
    assert "403" in str(info.value) or "ACCESS_REFUSED" in str(info.value)


def test_config_file_is_overridden_by_options(tmp_path):
    """Command-line options win over the file's [server] table."""
    config = tmp_path / "leveret.toml"
    config.write_text('[server]\nbind = "127.0.0.2"\namqp_port = 1\n')
    server = ServerProcess(tmp_path / "data", "--config", str(config), "--bind", "127.0.0.1")
    try:
        assert server.host == "127.0.0.1"
        assert server.port != 1
    finally:
        server.kill()


@pytest.mark.parametrize("text, complaint", [
    ("colour = 'blue'\n", "colour"),
    ("[server]\nport = 5672\n", "server.port"),
    ("[server]\namqp_port = 'x'\n", "amqp_port"),
    ("[server]\nheartbeat = true\n", "heartbeat"),
    ("vhosts = 'orders'\n", "vhosts"),
    ("loopback_users = 'guest'\n", "loopback_users"),
    ("server = 5\n", "server"),
    ("[server]\nlog_level = 'loud'\n", "log_level"),
    ("[server]\nread_coalesce_ms = -1\n", "read_coalesce_ms"),
    ("[server]\nworkers = -1\n", "workers"),
    ("[server]\namqps_port = 5671\n", "ssl_options"),
    ("[ssl_options]\ncertfile = 'server.pem'\n", "keyfile"),
    ("[ssl_options]\ncertfile = 'a'\nkeyfile = 'b'\nverify = 'maybe'\n", "verify"),
    ("[[permissions]]\nuser = 'bob'\nvhost = '/'\nconfigure = '('\nwrite = ''\nread = ''\n", "configure"),
    ("[[users]]\nname = 'bob'\n", "users"),
    ("[[users]]\nname = 'bob'\npassword = 'x'\nvhosts = '/'\n", "vhosts"),
    ("[[users]]\nname = 'bob'\npassword = 'x'\npasswd = 'y'\n", "passwd"),
    ("vhosts = [\n", ""),
    ("this is not toml\n", ""),
    ("[store]\nurl = 'mysql://db'\n", "store.url"),
    ("[store]\npath = 'x'\n", "store.path"),
    ("[[shovels]]\nname = 's'\nsrc-uri = 'amqp://'\n", "shovel s"),
    ("[[shovels]]\nsrc-uri = 'amqp://'\n", "shovels"),
], ids=["unknown-key", "unknown-server-key", "str-for-int", "bool-for-int",
        "str-for-list", "str-for-loopback", "int-for-table", "bad-log-level", "negative-read-coalesce",
        "negative-workers",
        "tls-without-options",
        "tls-without-key", "tls-bad-verify", "bad-permission-regex",
        "user-without-password", "user-vhosts-str", "unknown-user-key", "truncated",
        "not-toml", "store-not-postgresql", "unknown-store-key", "bad-shovel", "shovel-without-name"])
def test_invalid_config_exits_nonzero_naming_the_file(tmp_path, text, complaint):
    config = tmp_path / "broken.toml"
    config.write_text(text)
    result = run("server", "--amqp-port", "0", "--data-dir", str(tmp_path / "data"),
                 "--config", str(config))
    assert result.returncode != 0
    assert "leveret ready" not in result.stdout
    assert str(config) in result.stderr
    assert complaint in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_config_file(tmp_path):
    result = run("server", "--amqp-port", "0", "--config", str(tmp_path / "absent.toml"))
    assert result.returncode != 0
    assert "absent.toml" in result.stderr


# -- --version, --help ----------------------------------------------------------------------
def test_version():
    result = run("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"leveret, version {leveret.__version__}"


def test_server_help_lists_options():
    result = run("server", "--help")
    assert result.returncode == 0
    for option in ("--bind", "--amqp-port", "--data-dir", "--config", "--log-level"):
        assert option in result.stdout


def test_console_script_is_installed():
    """``leveret`` on PATH (pyproject's [project.scripts]) is the same program."""
    script = Path(sys.executable).with_name("leveret")
    if not script.exists():
        pytest.skip("leveret console script not installed next to this interpreter")
    result = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=15)
    assert result.returncode == 0 and leveret.__version__ in result.stdout


# -- embedding --------------------------------------------------------------------------
def test_pytest_plugin_is_registered_by_entry_point(pytestconfig):
    names = {ep.name: ep.value for ep in entry_points(group="pytest11")}
    assert names.get("leveret") == "leveret.pytest_plugin"
    assert pytestconfig.pluginmanager.has_plugin("leveret")


def test_leveret_broker_fixture(leveret_broker):
    assert isinstance(leveret_broker, leveret.BlockingBroker)
    assert re.match(r"amqp://guest:guest@127\.0\.0\.1:\d+/%2F$", leveret_broker.amqp_url)
    connection = connect(leveret_broker.amqp_url)
    channel = connection.channel()
    channel.queue_declare("fixture-q")
    channel.basic_publish("", "fixture-q", b"hello")
    queue = leveret_broker.call(lambda: leveret_broker.core.vhosts["/"].queues["fixture-q"])
    assert leveret_broker.call(lambda: queue.message_count) == 1
    connection.close()


def test_async_broker_context_manager():
    async def main() -> tuple[int, bytes]:
        async with leveret.Broker(amqp_port=0) as broker:
            assert broker.amqp_port > 0
            reader, writer = await asyncio.open_connection(broker.host, broker.amqp_port)
            writer.write(b"AMQP\x00\x00\x09\x01")
            start = await reader.readexactly(7)  # a connection.start method frame's header
            writer.close()
            port = broker.amqp_port
        return port, start

    port, start = asyncio.run(main())
    assert start[0] == 1 and start[1:3] == b"\x00\x00"  # method frame on channel 0
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_async_broker_with_aio_pika():
    aio_pika = pytest.importorskip("aio_pika")

    async def main() -> bytes:
        async with leveret.Broker(amqp_port=0) as broker:
            connection = await aio_pika.connect(broker.amqp_url)
            async with connection:
                channel = await connection.channel()
                queue = await channel.declare_queue("", exclusive=True)
                await channel.default_exchange.publish(aio_pika.Message(b"async"), queue.name)
                message = await queue.get(timeout=5)
                await message.ack()
                return message.body

    assert asyncio.run(main()) == b"async"


def test_blocking_broker_context_manager():
    with leveret.BlockingBroker(amqp_port=0) as broker:
        port = broker.amqp_port
        connection = connect(broker.amqp_url)
        roundtrip(connection)
        connection.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_blocking_broker_stop_closes_clients_with_320():
    broker = leveret.BlockingBroker(amqp_port=0).start()
    connection = connect(broker.amqp_url)
    stopper = threading.Thread(target=broker.stop)  # stop() waits for the close-ok
    stopper.start()
    with pytest.raises(ConnectionClosedByBroker) as info:
        for _ in range(50):
            connection.process_data_events(time_limit=0.1)
    stopper.join(10)
    assert info.value.reply_code == 320


def test_broker_rejects_unknown_settings():
    with pytest.raises(TypeError):
        leveret.Broker(amqp_prot=0)
