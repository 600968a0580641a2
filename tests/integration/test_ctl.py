"""``leveret ctl`` against a running ``leveret server``, as an operator uses rabbitmqctl:
users, vhosts, permissions, policies, listings with RabbitMQ's column names, closing a
connection, purging and deleting queues, definitions, limits. Everything over the
control socket in the data directory."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import pika
import pytest
from eventually import eventually
from servers import ServerProcess


def ctl(data: Path, *args: str, check: bool = True, quiet: bool = True) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "leveret", "ctl", "--data-dir", str(data),
               *(["-q"] if quiet else []), *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def rows(result: subprocess.CompletedProcess) -> list[list[str]]:
    """A listing's rows under its header."""
    return [line.split("\t") for line in result.stdout.splitlines()[1:]]


@pytest.fixture
def server(tmp_path: Path):
    process = ServerProcess(tmp_path / "data")
    yield process
    process.kill()


def test_the_socket_is_for_the_broker_user_only(server, tmp_path):
    mode = (tmp_path / "data" / "leveret.ctl").stat().st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600


def test_users_vhosts_and_permissions(server, tmp_path):
    data = tmp_path / "data"
    ctl(data, "add_vhost", "orders")
    ctl(data, "add_user", "bob", "s3cret")
    ctl(data, "set_user_tags", "bob", "monitoring")
    ctl(data, "set_permissions", "-p", "orders", "bob", "^bob", ".*", ".*")
    assert ["bob", "[monitoring]"] in rows(ctl(data, "list_users"))
    assert rows(ctl(data, "list_permissions", "-p", "orders")) == [["bob", "^bob", ".*", ".*"]]
    assert rows(ctl(data, "list_user_permissions", "bob")) == [["orders", "^bob", ".*", ".*"]]
    url = f"amqp://bob:s3cret@{server.host}:{server.port}/orders"
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.queue_declare("bob.q")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker):
        channel.queue_declare("other")
    connection.close()
    ctl(data, "change_password", "bob", "n3w")
    pika.BlockingConnection(pika.URLParameters(url.replace("s3cret", "n3w"))).close()
    refused = ctl(data, "set_permissions", "-p", "orders", "bob", "(", ".*", ".*", check=False)
    assert refused.returncode == 1 and "invalid regular expression" in refused.stderr
    ctl(data, "delete_user", "bob")
    assert "bob" not in ctl(data, "list_users").stdout
    assert "ctl.add_user by user" in server.log_path.read_text()  # audited, without the password
    assert "s3cret" not in server.log_path.read_text()


def test_listings_and_actions_on_queues_and_connections(server, tmp_path):
    data = tmp_path / "data"
    connection = pika.BlockingConnection(pika.URLParameters(server.url))
    channel = connection.channel()
    channel.queue_declare("work", durable=True)
    channel.queue_bind("work", "amq.direct", "jobs")
    for _ in range(3):
        channel.basic_publish("", "work", b"job")
    channel.basic_consume("work", lambda *a: None, consumer_tag="worker-1")
    connection.process_data_events(0.2)
    listed = rows(ctl(data, "list_queues", "name", "durable", "messages", "consumers"))
    assert ["work", "true", "3", "1"] in listed
    assert ["exchange", "amq.direct", "queue", "work", "jobs", "{}"] in rows(ctl(data, "list_bindings"))
    consumers = rows(ctl(data, "list_consumers"))
    assert consumers[0][0] == "work" and consumers[0][2] == "worker-1"
    names = rows(ctl(data, "list_connections", "name", "user", "state"))
    assert len(names) == 1 and names[0][1:] == ["guest", "running"]
    ctl(data, "close_connection", names[0][0], "maintenance")
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as caught:
        for _ in range(50):
            connection.process_data_events(0.1)
    assert (caught.value.reply_code, caught.value.reply_text) == (320, "CONNECTION_FORCED - maintenance")
    ctl(data, "purge_queue", "work")
    assert ["work", "0"] in rows(ctl(data, "list_queues"))
    ctl(data, "delete_queue", "work")
    assert "work" not in ctl(data, "list_queues").stdout
    missing = ctl(data, "delete_queue", "work", check=False)
    assert missing.returncode == 1 and "does not exist" in missing.stderr


def test_policies_are_run_time_objects_that_survive_a_restart(server, tmp_path):
    data = tmp_path / "data"
    ctl(data, "set_policy", "--apply-to", "queues", "short", "^short\\.", '{"max-length": 2}')
    assert rows(ctl(data, "list_policies")) == [
        ["/", "short", "^short\\.", "queues", '{"max-length": 2}', "0"]]
    server.terminate()
    restarted = ServerProcess(data)
    try:
        connection = pika.BlockingConnection(pika.URLParameters(restarted.url))
        channel = connection.channel()
        channel.queue_declare("short.q")
        for _ in range(5):
            channel.basic_publish("", "short.q", b"x")
        assert channel.queue_declare("short.q", passive=True).method.message_count == 2
        connection.close()
        ctl(data, "clear_policy", "short")
        assert rows(ctl(data, "list_policies")) == []
    finally:
        restarted.kill()


@pytest.mark.parametrize("definition", [
    '{"consumer-timeout-mode": "sometimes"}',
    '{"delayed-retry-type": "bogus"}',
    '{"stream-filter-size-bytes": 5}',
    '{"max-length": "abc"}',
])
def test_a_policy_with_a_bad_value_is_refused(server, tmp_path, definition):
    """As the management API (and rabbitmqctl) refuse it: stored, it would make every
    queue it matches fail to declare, and a durable one fail to recover at the next
    start."""
    data = tmp_path / "data"
    refused = ctl(data, "set_policy", "bad", ".*", definition, check=False)
    assert refused.returncode == 1 and "invalid policy" in refused.stderr
    assert rows(ctl(data, "list_policies")) == []


def test_operator_policies_cap_what_users_ask_for(server, tmp_path):
    data = tmp_path / "data"
    refused = ctl(data, "set_operator_policy", "dlx", ".*", '{"dead-letter-exchange": "x"}', check=False)
    assert refused.returncode == 1 and "dead-letter-exchange" in refused.stderr
    ctl(data, "set_operator_policy", "cap", "^capped", '{"max-length": 2}')
    assert rows(ctl(data, "list_operator_policies")) == [
        ["/", "cap", "^capped", "queues", '{"max-length": 2}', "0"]]
    assert rows(ctl(data, "list_policies")) == []
    connection = pika.BlockingConnection(pika.URLParameters(server.url))
    channel = connection.channel()
    channel.queue_declare("capped.q", arguments={"x-max-length": 10})
    for _ in range(5):
        channel.basic_publish("", "capped.q", b"x")
    assert channel.queue_declare("capped.q", passive=True).method.message_count == 2
    connection.close()
    ctl(data, "clear_operator_policy", "cap")
    assert rows(ctl(data, "list_operator_policies")) == []


def test_definitions_move_between_brokers_and_limits_change(server, tmp_path):
    data = tmp_path / "data"
    ctl(data, "add_user", "carol", "pw")
    ctl(data, "set_permissions", "carol", ".*", ".*", ".*")
    exported = tmp_path / "definitions.json"
    ctl(data, "export_definitions", str(exported))
    assert any(u["name"] == "carol" for u in json.loads(exported.read_text())["users"])
    other = ServerProcess(tmp_path / "other")
    try:
        ctl(tmp_path / "other", "import_definitions", str(exported))
        url = f"amqp://carol:pw@{other.host}:{other.port}/%2F"
        pika.BlockingConnection(pika.URLParameters(url)).close()
    finally:
        other.kill()
    ctl(data, "set_disk_free_limit", str(10**18))  # more than any disk: the alarm goes up
    alarmed = eventually(lambda: "disk" in dict(rows(ctl(data, "status"))).get("alarms", ""), 5, 0.1)
    assert alarmed, "the disk alarm did not go up"
    ctl(data, "set_disk_free_limit", "0")
    said = ctl(data, "set_vm_memory_high_watermark", "--absolute", "999999999", quiet=False).stdout
    assert said.strip() == "memory high watermark: 999999999 bytes"
    assert dict(rows(ctl(data, "status")))["vm_memory_high_watermark_bytes"] == "999999999"
    refused = ctl(data, "set_vm_memory_high_watermark", "1.5", check=False)
    assert refused.returncode == 1 and "invalid watermark" in refused.stderr


def test_without_a_running_broker_ctl_exits_69(tmp_path):
    result = ctl(tmp_path / "nothing", "list_queues", check=False)
    assert result.returncode == 69 and "cannot reach the broker" in result.stderr


def test_a_single_broker_is_its_own_cluster(server, tmp_path):
    """cluster_status as a lone RabbitMQ node answers it: itself the only disk and running
    node; the cluster's other commands are refused (tests/integration/test_cluster_ops.py
    has a real cluster)."""
    data = tmp_path / "data"
    status = json.loads(ctl(data, "cluster_status", "--formatter", "json").stdout)
    (node,) = status["disk_nodes"]
    assert status["running_nodes"] == [node] and status["ram_nodes"] == [] and status["partitions"] == {}
    amqp = [x for x in status["listeners"][node] if x["protocol"] == "amqp"]
    assert [x["port"] for x in amqp] == [server.port]
    text = ctl(data, "cluster_status", quiet=False).stdout
    assert text.startswith(f"Cluster status of node {node} ...\nBasics\n\nCluster name: ")
    assert f"Disk Nodes\n\n{node}\n\nRunning Nodes\n\n{node}\n" in text
    for refused in (("forget_cluster_node", "other"), ("move_queue", "/", "q", "other")):
        result = ctl(data, *refused, check=False)
        assert result.returncode == 1 and "not a cluster node" in result.stderr
