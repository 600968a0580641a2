"""A dynamic shovel runs on one node of a cluster, as RabbitMQ runs each dynamic shovel
on one node: the live node with the lowest number; the other keeps the shared
definition and starts no worker, and starts it when that node dies (kill -9). Each message is
moved once (a shovel from an exchange: a second copy of it would move each twice)."""

from __future__ import annotations

import json
import urllib.request

import pika
import pytest
from cluster_nodes import ClusterNode, start_nodes
from eventually import eventually
from targets import unique

AUTH = {"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q=", "Content-Type": "application/json"}
SHOVEL = {"src-uri": "amqp://", "src-exchange": "fan", "dest-uri": "amqp://", "dest-queue": "dst"}


@pytest.fixture
def nodes(postgres, tmp_path):
    cluster = unique("shovels").replace("-", "_")
    started = start_nodes(tmp_path, postgres.url, cluster, 2)
    # (started together: either may have registered first)
    first = postgres.sql(f'SELECT name FROM "{cluster}".cluster_nodes ORDER BY number LIMIT 1')[0][0]
    yield sorted(started, key=lambda node: node.name != first)
    for node in started:
        node.kill()


def http(node: ClusterNode, method: str, path: str, body: dict | None = None) -> object:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(node.http_url + path, data=data, method=method, headers=AUTH)
    with urllib.request.urlopen(request, timeout=10) as answer:
        text = answer.read()
        return json.loads(text) if text else None


def running_on(node: ClusterNode) -> list[str]:
    """The nodes ``node``'s /api/shovels rows name, for the shovels running there."""
    rows = http(node, "GET", "/api/shovels")
    assert isinstance(rows, list)
    return [row.get("node", "?") for row in rows if row["state"] == "running"]


def publish(node: ClusterNode, bodies: list[bytes]) -> None:
    with pika.BlockingConnection(pika.URLParameters(node.url)) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        for body in bodies:
            channel.basic_publish("fan", "", body, pika.BasicProperties(delivery_mode=2))


def count(node: ClusterNode, queue: str) -> int:
    with pika.BlockingConnection(pika.URLParameters(node.url)) as connection:
        return connection.channel().queue_declare(queue, passive=True).method.message_count


def test_a_dynamic_shovel_runs_on_one_node_and_moves_to_a_survivor(nodes) -> None:
    runner, other = nodes  # the lowest number first
    with pika.BlockingConnection(pika.URLParameters(other.url)) as connection:
        channel = connection.channel()
        channel.exchange_declare("fan", "fanout", durable=True)
        channel.queue_declare("dst", durable=True)  # owned by the other: it stays when the runner dies
    http(other, "PUT", "/api/parameters/shovel/%2F/mover", {"value": SHOVEL})
    assert eventually(lambda: len(running_on(runner)) == 1)
    assert running_on(other) == []  # the definition is there, no worker
    assert running_on(runner) == [runner.name]
    publish(other, [b"first %d" % n for n in range(50)])
    assert eventually(lambda: count(other, "dst") >= 50)
    assert count(other, "dst") == 50, "a message moved twice"  # (a late copy would show by now)
    runner.kill()
    assert eventually(lambda: running_on(other) == [other.name], timeout=10), other.log()[-3000:]
    publish(other, [b"then %d" % n for n in range(30)])
    assert eventually(lambda: count(other, "dst") >= 80)
    assert count(other, "dst") == 80
