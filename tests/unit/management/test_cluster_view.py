"""The cluster's rows as the API and ``leveret ctl`` show them, from the rows
``ClusterNode.nodes()`` gives (plain data in, RabbitMQ's shapes out): this node's full
row under its node name, another node only with what the catalog knows of it, a stopped
node without uptime, rabbitmqctl cluster_status's text."""

from __future__ import annotations

from leveret.cli.ctl_cluster import status_text
from leveret.management.cluster_view import address, node_rows

LOCAL = {"name": "n1", "type": "disc", "running": True, "os_pid": "42", "uptime": 5000, "mem_used": 1}
CATALOG = [
    {"name": "n2", "type": "disc", "running": True, "state": "running", "uptime": 9000,
     "amqp": "10.0.0.2:5672", "http": None, "queues": 3, "this_node": False},
    {"name": "n1", "type": "disc", "running": True, "state": "running", "uptime": 7000,
     "amqp": "10.0.0.1:5672", "http": "10.0.0.1:15672", "queues": 1, "this_node": True},
    {"name": "n0", "type": "disc", "running": False, "state": "left", "uptime": 0,
     "amqp": "10.0.0.9:5672", "queues": 0, "this_node": False},
]  # fmt: skip


def test_every_node_is_listed_by_name_with_what_is_known_of_it():
    rows = node_rows(CATALOG, LOCAL)
    assert [row["name"] for row in rows] == ["n0", "n1", "n2"]
    stopped, me, other = rows
    # this node: its own figures win over the catalog's (its uptime, pid, memory)
    assert me["os_pid"] == "42" and me["uptime"] == 5000 and me["queues"] == 1 and "this_node" not in me
    # another node: RabbitMQ's fields the catalog can fill, and leveret's own
    assert other == {
        "name": "n2", "type": "disc", "running": True, "uptime": 9000, "cluster_links": [],
        "partitions": [], "being_drained": False, "state": "running", "amqp": "10.0.0.2:5672",
        "http": None, "queues": 3,
    }  # fmt: skip
    assert stopped["running"] is False and "uptime" not in stopped and stopped["state"] == "left"


def test_this_node_is_listed_before_the_catalog_has_its_row():
    rows = node_rows(CATALOG[:1], LOCAL)
    assert [row["name"] for row in rows] == ["n1", "n2"] and rows[0] == LOCAL


def test_addresses_of_a_node():
    assert address(CATALOG[0], "amqp") == ("10.0.0.2", 5672)
    assert address(CATALOG[0], "http") is None
    assert address({"host": "h", "amqp_port": 5673}, "amqp") == ("h", 5673)


def test_cluster_status_text_has_rabbitmqctls_sections():
    document = {
        "cluster_name": "prod",
        "disk_nodes": ["n1", "n2"],
        "running_nodes": ["n1"],
        "versions": {"n1": {"rabbitmq_name": "leveret", "rabbitmq_version": "1.0", "erlang_version": "3.11"}},
        "maintenance_status": {"n1": "not under maintenance"},
        "alarms": [],
        "listeners": {"n1": [{"interface": "0.0.0.0", "port": 5672, "protocol": "amqp", "purpose": "AMQP"}]},
    }
    text = status_text(document)
    assert text.startswith("Basics\n\nCluster name: prod\n\nDisk Nodes\n\nn1\nn2\n\nRunning Nodes\n\nn1\n\n")
    assert "n1: leveret 1.0 on Python 3.11" in text and "Alarms\n\n(none)" in text
    assert "Node: n1, interface: 0.0.0.0, port: 5672, protocol: amqp, purpose: AMQP" in text
