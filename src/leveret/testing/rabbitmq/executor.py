"""The object pytest-rabbitmq's process fixture yields, with a leveret behind it.

pytest-rabbitmq 5.x yields a ``RabbitMqExecutor`` (mirakuru's ``TCPExecutor``); the
attributes and methods its users read are kept here: ``host``, ``port``,
``rabbit_ctl``, ``start()``, ``stop()``, ``running()``, ``stopped()`` and the
``list_exchanges()`` / ``list_queues()`` the client fixture's cleanup calls, plus
``user``, ``password``, ``vhost`` and ``url`` (the AMQP URL a framework is given),
which RabbitMQ's fixture leaves to the caller (it always logs in as guest/guest on
``/``).

Two kinds: :class:`InProcessLeveret` runs :class:`~leveret.BlockingBroker` in a
background thread of the test process (starts in ~50 ms; nothing on disk unless
``data_dir`` is given), :class:`SubprocessLeveret` runs ``python -m leveret server``
(its own process and data directory; survives a test that forks or calls ``os._exit``,
and can be stopped and started again with its durable queues kept, as RabbitMQ).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ...server.broker import BlockingBroker

#: The listeners a :class:`SubprocessLeveret` turns off (only AMQP and HTTP listen).
OFF_LISTENERS = ("stomp", "web-stomp", "mqtt", "web-mqtt", "prometheus")


class LeveretExecutor:
    """What the ``rabbitmq_proc`` fixture yields: one leveret on ``host:port``.

    Log in as ``user``/``password`` (guest/guest, which leveret, like RabbitMQ, accepts
    from loopback addresses only) on ``vhost`` ``/``; ``url`` is
    ``amqp://guest:guest@host:port/%2F``.
    """

    user = "guest"
    password = "guest"
    vhost = "/"

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        #: The AMQP port; 0 before the first start means "a free one", fixed after it.
        self.port = port

    @property
    def url(self) -> str:
        """The AMQP URL of the default user on vhost ``/``, as pika, kombu, dramatiq,
        aio-pika (FastStream, taskiq) take it."""
        return f"amqp://{self.user}:{self.password}@{self.host}:{self.port}/%2F"

    @property
    def amqp_url(self) -> str:
        """Same as :attr:`url` (the ``leveret_broker`` fixture's name for it)."""
        return self.url

    def start(self) -> LeveretExecutor:
        """Start the broker on :attr:`port` (a free port the first time when 0);
        OSError if the port cannot be bound."""
        raise NotImplementedError

    def stop(self) -> LeveretExecutor:
        """Stop the broker; clients see their connections closed (320
        CONNECTION_FORCED from a subprocess, a dropped socket in process)."""
        raise NotImplementedError

    def running(self) -> bool:
        """Whether the broker is started."""
        raise NotImplementedError

    @contextmanager
    def stopped(self) -> Iterator[LeveretExecutor]:
        """Stop the broker for the ``with`` block and start it again on the same port
        after it (mirakuru's ``stopped()``), to test a client's reconnection."""
        self.stop()
        try:
            yield self
        finally:
            self.start()

    def list_exchanges(self) -> list[str]:
        """Names of the exchanges of vhost ``/`` except the default exchange (``""``),
        ``amq.*`` included, as ``rabbitmqctl list_exchanges name`` gives them to
        pytest-rabbitmq."""
        raise NotImplementedError

    def list_queues(self) -> list[str]:
        """Names of the queues of vhost ``/``, as ``rabbitmqctl list_queues name``."""
        raise NotImplementedError

    def __enter__(self) -> LeveretExecutor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class InProcessLeveret(LeveretExecutor):
    """A :class:`~leveret.BlockingBroker` in a thread of the test process.

    Only AMQP listens (STOMP, MQTT, HTTP and Prometheus are off). Without ``data_dir``
    nothing is kept on disk, so :meth:`stop` then :meth:`start` comes back empty
    (RabbitMQ's fixture keeps durable queues across a restart: pass ``data_dir`` for
    that, at the price of a disk write per persistent message). ``overrides`` are
    :class:`~leveret.config.Settings` fields (e.g. ``policies``, ``limits``).
    """

    rabbit_ctl = None  # no control socket without a data directory

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, data_dir: Path | None = None, **overrides: Any
    ) -> None:
        super().__init__(host, port)
        self.data_dir = data_dir
        self.overrides = overrides
        #: The broker while started (``.core`` for inspection, ``.call`` to run on its loop).
        self.broker: BlockingBroker | None = None

    def start(self) -> InProcessLeveret:
        if self.broker is None:
            broker = BlockingBroker(
                host=self.host,
                amqp_port=self.port,
                data_dir=str(self.data_dir) if self.data_dir else None,
                **self.overrides,
            )
            broker.start()
            self.broker = broker
            self.port = broker.amqp_port
        return self

    def stop(self) -> InProcessLeveret:
        if self.broker is not None:
            self.broker.stop()
            self.broker = None
        return self

    def running(self) -> bool:
        return self.broker is not None

    def _names(self, kind: str) -> list[str]:
        broker = self.broker
        if broker is None:
            raise RuntimeError("leveret is not running")
        core = broker.core

        def names() -> list[str]:
            vhost = core.vhosts.get(self.vhost)
            return [name for name in getattr(vhost, kind, ()) if name]

        found: list[str] = broker.call(names)
        return found

    def list_exchanges(self) -> list[str]:
        return self._names("exchanges")

    def list_queues(self) -> list[str]:
        return self._names("queues")


class SubprocessLeveret(LeveretExecutor):
    """``python -m leveret server`` in its own process, data directory ``path``.

    AMQP on ``host:port`` and the management HTTP API on a free port (the listings
    use it: a millisecond, where pytest-rabbitmq's ``rabbitmqctl`` calls take about a
    second each); STOMP, MQTT and Prometheus are off. Durable queues survive
    :meth:`stop` / :meth:`start` as on RabbitMQ. :attr:`rabbit_ctl` runs
    ``leveret ctl`` (RabbitMQ's command names) against it.
    """

    def __init__(self, path: Path, host: str = "127.0.0.1", port: int = 0, timeout: float = 30.0) -> None:
        super().__init__(host, port)
        self.path = Path(path)
        #: Seconds to wait for the ready line on start, and for the exit on stop.
        self.timeout = timeout
        self.rabbit_ctl = [sys.executable, "-m", "leveret", "ctl", "--data-dir", str(self.path / "data")]
        self.http_url: str | None = None
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        """The broker's stdout and stderr."""
        return self.path / "leveret.log"

    def start(self) -> SubprocessLeveret:
        if self.process is not None:
            return self
        self.path.mkdir(parents=True, exist_ok=True)
        command = [
            sys.executable,
            "-m",
            "leveret",
            "server",
            "--bind",
            self.host,
            "--amqp-port",
            str(self.port),
        ]
        command += ["--http-port", "0", "--data-dir", str(self.path / "data")]
        for listener in OFF_LISTENERS:
            command += [f"--{listener}-port", "-1"]
        log = self.log_path.open("ab")
        start_offset = log.tell()
        self.process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=_same_leveret_env()
        )
        log.close()
        deadline = time.monotonic() + self.timeout
        while True:
            text = self.log_path.read_bytes()[start_offset:].decode(errors="replace")
            amqp = _line_word(text, "leveret ready: ", "amqp://")
            http = _line_word(text, "leveret management: ", "http")
            if amqp and http:
                self.port = int(amqp.rsplit(":", 1)[1])
                self.http_url = http.removesuffix("/api/").removesuffix("/api")
                return self
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"leveret did not start ({command}):\n{text[-2000:]}")
            time.sleep(0.02)

    def stop(self) -> SubprocessLeveret:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(self.timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        return self

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def rabbitctl_output(self, *args: str) -> str:
        """Run ``leveret ctl ARGS`` against this broker and return its output (as
        pytest-rabbitmq's method of that name runs ``rabbitmqctl``)."""
        return subprocess.check_output([*self.rabbit_ctl, *args], env=_same_leveret_env()).decode()

    def _names(self, kind: str) -> list[str]:
        if self.http_url is None or not self.running():
            raise RuntimeError("leveret is not running")
        request = urllib.request.Request(f"{self.http_url}/api/{kind}/{quote(self.vhost, safe='')}")
        token = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
        with urllib.request.urlopen(request, timeout=self.timeout) as response:
            return [item["name"] for item in json.load(response) if item["name"]]

    def list_exchanges(self) -> list[str]:
        return self._names("exchanges")

    def list_queues(self) -> list[str]:
        return self._names("queues")


def _same_leveret_env() -> dict[str, str]:
    """The environment, with ``PYTHONPATH`` led by the directory this leveret is
    imported from, so the subprocess runs the same leveret as the tests."""
    source = str(Path(__file__).resolve().parents[3])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [source, env.get("PYTHONPATH")]))
    return env


def _line_word(text: str, prefix: str, word_start: str) -> str | None:
    """The first word starting with ``word_start`` on the line starting with
    ``prefix``, or None."""
    for line in text.splitlines():
        if line.startswith(prefix):
            for word in line[len(prefix) :].split():
                if word.startswith(word_start):
                    return word
    return None
