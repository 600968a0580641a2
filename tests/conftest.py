"""Shared fixtures. ``leveret_broker`` (a fresh in-process broker per test) comes from
leveret's own pytest plugin; ``server_process`` runs ``leveret server`` as a subprocess."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest


class ServerProcess:
    """A ``leveret server`` subprocess; ``port`` parsed from its ready line."""

    def __init__(self, data_dir: Path, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "leveret", "server", "--amqp-port", "0",
             "--data-dir", str(data_dir), *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        match = re.match(r"leveret ready: amqp://([\d.]+):(\d+)", line)
        if not match:
            self.proc.kill()
            raise RuntimeError(f"no ready line: {line!r} {self.proc.stderr.read()}")
        self.host, self.port = match.group(1), int(match.group(2))
        self.url = f"amqp://guest:guest@{self.host}:{self.port}/%2F"
        self.http_url = None
        if "--http-port" in args:  # the management API's line follows the ready line
            line = self.proc.stdout.readline()
            self.http_url = line.split()[-1].removesuffix("/api/")

    def terminate(self, timeout: float = 10) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def server_process(tmp_path: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(tmp_path / "data")
    yield server
    server.kill()


@pytest.fixture
def amqp_url(leveret_broker) -> str:
    return leveret_broker.amqp_url


@pytest.fixture
def connection(amqp_url: str) -> Iterator[pika.BlockingConnection]:
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    yield conn
    if conn.is_open:
        conn.close()


@pytest.fixture
def channel(connection: pika.BlockingConnection):
    return connection.channel()


os.environ.setdefault("PYTHONUNBUFFERED", "1")
