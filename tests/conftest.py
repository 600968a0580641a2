"""Shared fixtures. ``leveret_broker`` (a fresh in-process broker per test) comes from
leveret's own pytest plugin; ``server_process`` runs ``leveret server`` as a subprocess."""

from __future__ import annotations

import ipaddress
import os
import socket
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from amqp10_brokers import _amqp10_rabbitmq, amqp10_broker  # noqa: F401 (fixtures)
from cluster_nodes import cluster_of  # noqa: F401 (fixture)
from ha import Node
from hypothesis import settings
from mqtt_brokers import _mqtt_session_broker, mqtt_broker, mqtt_own_broker  # noqa: F401 (fixtures)
from postgres import PostgresServer
from servers import TEST_WORKERS, ServerProcess
from targets import Target, leveret_target, rabbitmq_installed, start_rabbitmq, unique

from leveret import BlockingBroker

# No per-example deadline (hypothesis's default is 200 ms of wall-clock time): on a busy
# machine a slow example is not a failure (scripts/stress-unit).
settings.register_profile("leveret", deadline=None)
settings.load_profile("leveret")

@pytest.fixture
def server_process(tmp_path: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(tmp_path / "data")
    yield server
    server.kill()


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """One PostgreSQL server for the session (tests keep apart by cluster name, which
    is the store's schema)."""
    server = PostgresServer().start()
    yield server
    server.close()


@pytest.fixture
def cluster(postgres, tmp_path: Path) -> Iterator[list[Node]]:
    """Two ``leveret server`` processes of a new cluster on the session's PostgreSQL:
    the first is the master, the second a standby."""
    name = unique("cluster").replace("-", "_")
    first = Node(tmp_path / "a", postgres.url, name).start()
    first.wait_for("leveret ready")
    second = Node(tmp_path / "b", postgres.url, name).start()
    second.wait_for("leveret standby")
    yield [first, second]
    for node in (first, second):
        node.kill()


@pytest.fixture
def leveret_broker() -> Iterator[BlockingBroker]:
    """The pytest plugin's fixture (a fresh broker, nothing on disk), with
    LEVERET_TEST_WORKERS connection workers (0: none, the plugin's broker)."""
    with BlockingBroker(amqp_port=0, stomp_port=0, workers=TEST_WORKERS) as broker:
        yield broker


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


@pytest.fixture(scope="session")
def rabbitmq_target() -> Iterator[Target]:
    """One private RabbitMQ node with management for the session (skipped when
    rabbitmq-server is not installed)."""
    if not rabbitmq_installed():
        pytest.skip("rabbitmq-server is not installed: only leveret is checked")
    node, target = start_rabbitmq()
    yield target
    node.stop()


@pytest.fixture(params=["leveret", "rabbitmq"])
def target(request) -> Iterator[Target]:
    """The test's broker: a fresh leveret (AMQP and HTTP), or the session's RabbitMQ."""
    if request.param == "rabbitmq":
        yield request.getfixturevalue("rabbitmq_target")
        return
    with BlockingBroker(amqp_port=0, http_port=0, workers=TEST_WORKERS) as broker:
        yield leveret_target(broker)


@pytest.fixture
def vhost(target: Target):
    """A fresh vhost of the target (guest has full permissions there); deleted afterwards."""
    name = unique("v")
    assert target.http("PUT", f"/api/vhosts/{urllib.parse.quote(name, safe='')}")[0] == 201
    yield name
    target.http("DELETE", f"/api/vhosts/{urllib.parse.quote(name, safe='')}")


os.environ.setdefault("PYTHONUNBUFFERED", "1")


@pytest.fixture(scope="session")
def other_host() -> str:
    """A local address that is not loopback: a connection from it to 127.0.0.1 reaches the
    broker as one from another host would (guest only from loopback, as RabbitMQ).
    Skipped on a machine with no such address."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # picks the source address; sends nothing
        except OSError:
            pytest.skip("no route off this host, so no non-loopback source address")
        address = probe.getsockname()[0]
    if ipaddress.ip_address(address).is_loopback:
        pytest.skip("this host's only address is a loopback one")
    return address
