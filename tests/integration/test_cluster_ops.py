"""The cluster seen from any node (docs/cluster.md, Operations): two active nodes of one
cluster on a real PostgreSQL, as ``leveret server --store URL --cluster C --node N``
processes, checked as an operator checks a RabbitMQ cluster: ``/api/nodes`` lists both
from either node, a queue's ``node`` is its owner, ``leveret ctl cluster_status`` (text
and ``--formatter json``), ``forget_cluster_node`` refused for a live node and done for
a stopped one, ``move_queue`` moves a durable queue (its message is then got on the new
owner), and each node's Prometheus ``rabbitmq_identity_info`` names it, with the queue
series of the queues it owns only."""

from __future__ import annotations

import base64
import json
import os
import queue
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from eventually import eventually
from postgres import free_port
from targets import unique

pytest.importorskip("leveret.cluster.node")  # the node runtime (issue 32)

#: seconds, for tests: the lease and grace of a node (production: 3 and 3.5)
TIMINGS = {"LEVERET_CLUSTER_LEASE": "1.0", "LEVERET_CLUSTER_GRACE": "1.5"}
WAIT = 10.0  # seconds a change may take to be seen on every node


class Node:
    """A node process with its AMQP, HTTP and Prometheus ports and its data directory
    (``leveret ctl --data-dir``); :meth:`ready` waits for it."""

    def __init__(self, directory: Path, store_url: str, cluster: str, name: str) -> None:
        self.name, self.data = name, directory / "data"
        self.amqp_port, self.http_port, self.prometheus_port = free_port(), free_port(), free_port()
        self.url = f"amqp://guest:guest@127.0.0.1:{self.amqp_port}/%2F"
        directory.mkdir(parents=True, exist_ok=True)
        self.log_path = directory / "server.log"
        with open(self.log_path, "a") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable, "-m", "leveret", "server",
                    "--amqp-port", str(self.amqp_port), "--http-port", str(self.http_port),
                    "--prometheus-port", str(self.prometheus_port),
                    "--stomp-port", "-1", "--web-stomp-port", "-1", "--mqtt-port", "-1",
                    "--web-mqtt-port", "-1", "--data-dir", str(self.data),
                    "--store", store_url, "--cluster", cluster, "--node", name,
                ],
                stdout=subprocess.PIPE, stderr=log, text=True, env=dict(os.environ, **TIMINGS),
            )  # fmt: skip
        self.lines: queue.Queue[str] = queue.Queue()
        stdout = self.proc.stdout
        assert stdout is not None
        threading.Thread(target=lambda: [self.lines.put(line) for line in stdout], daemon=True).start()

    def ready(self) -> Node:
        """Once it printed its ready line (RuntimeError with its log after 30 s)."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                if self.lines.get(timeout=0.1).startswith("leveret ready"):
                    return self
            except queue.Empty:
                pass
        self.kill()
        raise RuntimeError(f"{self.name} did not start: {self.log_path.read_text()[-3000:]}")

    def api(self, path: str) -> tuple[int, object]:
        request = urllib.request.Request(f"http://127.0.0.1:{self.http_port}{path}")
        request.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, None

    def metrics(self, path: str = "/metrics") -> str:
        url = f"http://127.0.0.1:{self.prometheus_port}{path}"
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.read().decode()

    def ctl(self, *args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "leveret", "ctl", "--data-dir", str(self.data), *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)

    def terminate(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def cluster_name() -> str:
    return unique("ops").replace("-", "_")


@pytest.fixture(scope="module")
def nodes(postgres, cluster_name, tmp_path_factory) -> Iterator[list[Node]]:
    """n1 and n2, both running and each seeing the other."""
    directory = tmp_path_factory.mktemp("cluster-ops")
    started: list[Node] = []
    try:
        for name in ("n1", "n2"):  # started together
            started.append(Node(directory / name, postgres.url, cluster_name, name))
        for node in started:
            node.ready()
        for node in started:
            both = eventually(lambda node=node: running_names(node) == {"n1", "n2"}, WAIT)
            assert both, node.api("/api/nodes")
        yield started
    finally:
        for node in started:
            node.kill()


def running_names(node: Node) -> set[str]:
    status, rows = node.api("/api/nodes")
    assert status == 200
    return {row["name"] for row in rows if row["running"]}


def declare(node: Node, name: str, messages: int = 0) -> None:
    """Durable ``name`` declared on ``node`` (its owner: client-local) with ``messages``
    persistent messages, confirmed."""
    with pika.BlockingConnection(pika.URLParameters(node.url)) as connection:
        channel = connection.channel()
        channel.queue_declare(name, durable=True)
        channel.confirm_delivery()
        for number in range(messages):
            channel.basic_publish("", name, f"m{number}".encode(), pika.BasicProperties(delivery_mode=2))


def queue_row(node: Node, name: str) -> dict | None:
    status, row = node.api(f"/api/queues/%2F/{name}")
    return row if status == 200 and isinstance(row, dict) else None


def test_every_node_lists_every_node_and_names_itself(nodes, cluster_name):
    for node in nodes:
        status, rows = node.api("/api/nodes")
        assert status == 200 and [row["name"] for row in rows] == ["n1", "n2"]
        for row in rows:
            assert row["type"] == "disc" and row["running"] is True and row["uptime"] > 0
            assert row["partitions"] == [] and row["being_drained"] is False
        mine = next(row for row in rows if row["name"] == node.name)
        assert mine["os_pid"] == str(node.proc.pid) and mine["mem_used"] > 0 and mine["fd_used"] > 0
        other = next(row for row in rows if row["name"] != node.name)
        peer = nodes[1] if node is nodes[0] else nodes[0]
        assert other["amqp"].endswith(f":{peer.amqp_port}")  # from the catalog
        assert "os_pid" not in other  # only what the catalog knows of another node
        status, one = node.api(f"/api/nodes/{other['name']}")
        assert status == 200 and isinstance(one, dict) and one["name"] == other["name"] and one["running"]
        assert node.api("/api/nodes/nobody")[0] == 404
        overview = node.api("/api/overview")[1]
        assert isinstance(overview, dict)
        assert overview["node"] == node.name and overview["cluster_name"] == cluster_name


def test_a_queue_is_shown_on_its_owner_from_either_node(nodes):
    n1, n2 = nodes
    declare(n2, "owned-by-n2", messages=2)
    declare(n1, "owned-by-n1")
    for node in nodes:
        assert eventually(lambda node=node: queue_row(node, "owned-by-n2"), WAIT), node.name
        assert queue_row(node, "owned-by-n2")["node"] == "n2"  # type: ignore[index]
        assert eventually(lambda node=node: queue_row(node, "owned-by-n1"), WAIT), node.name
        assert queue_row(node, "owned-by-n1")["node"] == "n1"  # type: ignore[index]
    assert queue_row(n2, "owned-by-n2")["messages"] == 2  # type: ignore[index]
    status, listing = n1.api("/api/queues/%2F?sort=node&columns=name,node")
    assert status == 200 and isinstance(listing, list)
    nodes_of = {row["name"]: row["node"] for row in listing}
    assert nodes_of["owned-by-n2"] == "n2" and nodes_of["owned-by-n1"] == "n1"


def test_cluster_status_from_the_ctl_of_either_node(nodes, cluster_name):
    for node in nodes:
        answer = node.ctl("cluster_status", "--formatter", "json")
        assert answer.returncode == 0, answer.stderr
        status = json.loads(answer.stdout)
        assert status["cluster_name"] == cluster_name
        assert status["disk_nodes"] == ["n1", "n2"] and status["running_nodes"] == ["n1", "n2"]
        assert status["ram_nodes"] == [] and status["partitions"] == {}
        ports = {x["port"] for listeners in status["listeners"].values() for x in listeners}
        assert {nodes[0].amqp_port, nodes[1].amqp_port} <= ports
        text = node.ctl("cluster_status")
        assert text.returncode == 0, text.stderr
        assert f"Cluster status of node {node.name} ..." in text.stdout
        assert "Disk Nodes\n\nn1\nn2\n" in text.stdout and "Running Nodes\n\nn1\nn2\n" in text.stdout


def test_forgetting_a_running_node_is_refused_and_a_stopped_one_is_forgotten(
    nodes, postgres, cluster_name, tmp_path
):
    n1, n2 = nodes
    refused = n1.ctl("forget_cluster_node", "n2")
    assert refused.returncode == 1 and "running" in refused.stderr
    assert n1.ctl("forget_cluster_node", "n1").returncode == 1  # the node the ctl runs on
    assert n1.ctl("forget_cluster_node", "nobody").returncode == 1
    n3 = Node(tmp_path / "n3", postgres.url, cluster_name, "n3").ready()
    try:
        assert eventually(lambda: "n3" in running_names(n1), WAIT)
        n3.terminate()  # a graceful stop: it leaves
        assert eventually(lambda: "n3" not in running_names(n1), WAIT)
        _, rows = n1.api("/api/nodes")
        assert [row["running"] for row in rows if row["name"] == "n3"] == [False]  # still a member
        forgotten = n2.ctl("forget_cluster_node", "n3")
        assert forgotten.returncode == 0, forgotten.stderr
        for node in nodes:
            names = lambda node=node: [row["name"] for row in node.api("/api/nodes")[1]]  # noqa: E731
            assert eventually(lambda names=names: names() == ["n1", "n2"], WAIT)
    finally:
        n3.kill()


def test_move_queue_moves_a_durable_queue_to_another_node(nodes):
    n1, n2 = nodes
    declare(n1, "moving", messages=1)
    assert eventually(lambda: queue_row(n2, "moving"), WAIT)
    refused = n1.ctl("move_queue", "/", "moving", "nobody")
    assert refused.returncode == 1 and "not a running node" in refused.stderr
    moved = n1.ctl("move_queue", "/", "moving", "n2")
    assert moved.returncode == 0, moved.stderr
    assert "from node n1 to node n2" in moved.stdout
    for node in nodes:
        on_n2 = eventually(lambda node=node: (queue_row(node, "moving") or {}).get("node") == "n2", WAIT)
        assert on_n2, node.name

    def got_on(node: Node) -> bytes | None:
        with pika.BlockingConnection(pika.URLParameters(node.url)) as connection:
            method, _, body = connection.channel().basic_get("moving", auto_ack=True)
            return body if method is not None else None

    assert eventually(lambda: got_on(n2), WAIT) == b"m0"  # the new owner serves it
    declare(n1, "moving", messages=1)  # forwarded to n2, stored there
    back = n1.ctl("move_queue", "/", "moving", "n1")  # to the node the ctl runs on
    assert back.returncode == 0, back.stderr
    for node in nodes:
        on_n1 = eventually(lambda node=node: (queue_row(node, "moving") or {}).get("node") == "n1", WAIT)
        assert on_n1, node.name
    assert eventually(lambda: got_on(n1), WAIT) == b"m0"


def test_each_node_serves_its_own_identity_and_its_own_queues(nodes, cluster_name):
    n1, n2 = nodes
    declare(n2, "metered-on-n2")
    assert eventually(lambda: queue_row(n1, "metered-on-n2"), WAIT)
    for node in nodes:
        for path in ("/metrics", "/metrics/per-object"):
            text = node.metrics(path).splitlines()
            lines = [line for line in text if line.startswith("rabbitmq_identity_info{")]
            assert len(lines) == 1
            assert f'rabbitmq_node="{node.name}"' in lines[0]
            assert f'rabbitmq_cluster="{cluster_name}"' in lines[0]
            assert f'rabbitmq_cluster_permanent_id="leveret-cluster-id-{cluster_name}"' in lines[0]
    series = 'rabbitmq_queue_messages_ready{queue="metered-on-n2",vhost="/"}'
    assert eventually(lambda: series in n2.metrics("/metrics/per-object"), WAIT)
    assert series not in n1.metrics("/metrics/per-object")  # the owner's metrics only
