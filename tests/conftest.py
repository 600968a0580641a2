"""Shared fixtures. ``leveret_broker`` (a fresh in-process broker per test) comes from
leveret's own pytest plugin; ``server_process`` runs ``leveret server`` as a subprocess."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from servers import ServerProcess


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
