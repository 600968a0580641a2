"""Master/standby on a shared PostgreSQL, with real processes and real clients: a
publisher with confirms and a consumer acking, both following the master through a
list of brokers (pika's list of ConnectionParameters), while the master is killed,
cut off from the database, or the database itself restarts. Every confirmed message
must be delivered (duplicates allowed)."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request

import pika
import pika.exceptions
import pytest
from eventually import eventually
from ha import Node
from servers import ServerProcess

QUEUE = "orders"
TOTAL = 1200
CLIENT_ERRORS = (pika.exceptions.AMQPError, OSError)


def parameters(nodes: list[Node]) -> list[pika.ConnectionParameters]:
    """Every broker of the cluster, in order: pika tries each until one accepts (a
    standby refuses at once: it does not listen)."""
    return [
        pika.ConnectionParameters("127.0.0.1", node.amqp_port, connection_attempts=1, socket_timeout=5)
        for node in nodes
    ]


def connect(nodes: list[Node], timeout: float = 30.0) -> pika.BlockingConnection:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return pika.BlockingConnection(parameters(nodes))
        except CLIENT_ERRORS:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


class Publisher(threading.Thread):
    """Publishes ``TOTAL`` persistent messages one by one with confirms, reconnecting
    on failure (the unconfirmed one is sent again); ``confirmed`` holds the bodies the
    broker confirmed."""

    def __init__(self, nodes: list[Node]) -> None:
        super().__init__(daemon=True)
        self.nodes = nodes
        self.confirmed: list[str] = []
        self.reconnects = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            number = 0
            while number < TOTAL:
                try:
                    connection = connect(self.nodes)
                    channel = connection.channel()
                    channel.confirm_delivery()
                    channel.queue_declare(QUEUE, durable=True)
                    while number < TOTAL:
                        body = f"m{number}"
                        channel.basic_publish(
                            "", QUEUE, body.encode(), pika.BasicProperties(delivery_mode=2)
                        )
                        self.confirmed.append(body)
                        number += 1
                    connection.close()
                except CLIENT_ERRORS:
                    self.reconnects += 1
        except BaseException as exc:  # reported by the test
            self.error = exc


def drain(nodes: list[Node], expected: set[str], timeout: float = 60.0) -> set[str]:
    """Consume and ack until every body of ``expected`` came (or ``timeout``),
    following the master across failures; what was received."""
    received: set[str] = set()
    deadline = time.monotonic() + timeout
    while not expected <= received and time.monotonic() < deadline:
        try:
            connection = connect(nodes)
            channel = connection.channel()
            channel.queue_declare(QUEUE, durable=True)
            channel.basic_qos(prefetch_count=100)
            for method, _, body in channel.consume(QUEUE, inactivity_timeout=1):
                if method is None:
                    if expected <= received or time.monotonic() > deadline:
                        break
                    continue
                received.add(body.decode())
                channel.basic_ack(method.delivery_tag)
            connection.close()
        except CLIENT_ERRORS:
            continue
    return received


def health(node: Node) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"{node.http_url}/api/health/checks/is-in-service", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def wait_until_confirmed(publisher: Publisher, count: int) -> None:
    eventually(lambda: len(publisher.confirmed) >= count or not publisher.is_alive(), 60, 0.01)
    assert len(publisher.confirmed) >= count, publisher.error


def test_a_standby_refuses_clients_at_once_and_says_so_over_http(cluster):
    master, standby = cluster
    started = time.monotonic()
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(parameters([standby]))
    assert time.monotonic() - started < 2  # refused, not hung
    code, body = health(standby)
    assert code == 503 and "standby" in body
    assert health(master)[0] == 200


def test_kill_9_of_the_master_loses_no_confirmed_message(cluster):
    master, standby = cluster
    publisher = Publisher(cluster)
    publisher.start()
    wait_until_confirmed(publisher, TOTAL // 3)
    killed = time.monotonic()
    master.kill()
    standby.wait_for("leveret ready")
    failover = time.monotonic() - killed
    publisher.join(120)
    assert publisher.error is None and not publisher.is_alive()
    assert publisher.reconnects >= 1
    confirmed = set(publisher.confirmed)
    assert len(confirmed) == TOTAL
    assert confirmed <= drain(cluster, confirmed)
    assert failover < 5, f"failover took {failover:.2f} s"
    master.start()  # the old master comes back as a standby
    master.wait_for("leveret standby")
    assert health(master)[0] == 503


def test_a_master_cut_off_from_the_database_stops_and_the_standby_takes_over(cluster, postgres):
    master, standby = cluster
    publisher = Publisher(cluster)
    publisher.start()
    wait_until_confirmed(publisher, TOTAL // 3)
    postgres.sql(  # end the master's writer session, which holds the lock (fencing)
        "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype='advisory' AND granted "
        "AND objid=hashtext(%s)::oid",
        master.cluster,
    )
    standby.wait_for("leveret ready")
    master.wait_for("leveret standby")  # stopped serving, waits again
    publisher.join(120)
    assert publisher.error is None and not publisher.is_alive()
    confirmed = set(publisher.confirmed)
    assert len(confirmed) == TOTAL
    assert confirmed <= drain(cluster, confirmed)
    assert health(master)[0] == 503 and health(standby)[0] == 200


def test_postgresql_restarted_under_load_loses_no_confirmed_message(cluster, postgres):
    publisher = Publisher(cluster)
    publisher.start()
    wait_until_confirmed(publisher, TOTAL // 3)
    postgres.restart()  # every session ends: the brokers race for the lock again
    publisher.join(120)
    assert publisher.error is None and not publisher.is_alive()
    confirmed = set(publisher.confirmed)
    assert len(confirmed) == TOTAL
    assert confirmed <= drain(cluster, confirmed)
    roles = sorted(health(node)[0] for node in cluster)
    assert roles == [200, 503]  # one master, one standby


def test_the_config_files_store_section_selects_postgresql(postgres, tmp_path):
    config = tmp_path / "broker.toml"
    config.write_text(f'[store]\nurl = "{postgres.url}"\ncluster = "from_config"\n')
    server = ServerProcess(tmp_path / "data", "--config", str(config))
    try:
        connection = pika.BlockingConnection(pika.URLParameters(server.url))
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("kept", durable=True)
        channel.basic_publish("", "kept", b"in postgres", pika.BasicProperties(delivery_mode=2))
        connection.close()
    finally:
        server.kill()
    rows = postgres.sql('SELECT body FROM "from_config".messages')
    assert rows == [(b"in postgres",)]
    assert not (tmp_path / "data" / "leveret.db").exists()  # not in SQLite
