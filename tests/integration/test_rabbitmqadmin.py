"""The classic ``rabbitmqadmin`` script (Debian's rabbitmq-server package ships it)
driving the management API: the same commands against leveret and a RabbitMQ node
(when installed) must give the same results. Skipped when the script is absent."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from eventually import eventually
from targets import Target, unique

CANDIDATES = [
    "/usr/bin/rabbitmqadmin",
    *sorted(Path("/usr/lib/rabbitmq/lib").glob("rabbitmq_server-*/plugins/rabbitmq_management-*/priv/www/cli/"
                                                  "rabbitmqadmin")),
]
SCRIPT = next((str(p) for p in CANDIDATES if Path(p).is_file()), None) or shutil.which("rabbitmqadmin")
pytestmark = pytest.mark.skipif(SCRIPT is None, reason="rabbitmqadmin is not installed")


def admin(target: Target, *args: str, vhost: str | None = None, check: bool = True) -> str:
    """Run ``rabbitmqadmin`` against ``target``; its standard output."""
    assert SCRIPT is not None
    command = [sys.executable, SCRIPT, "-H", target.host, "-P", str(target.http_port), "-u", "guest",
               "-p", "guest", "-f", "raw_json"]
    if vhost is not None:
        command += ["-V", vhost]
    done = subprocess.run([*command, *args], capture_output=True, text=True, timeout=60)
    if check:
        assert done.returncode == 0, done.stderr + done.stdout
    return done.stdout


def listing(target: Target, *args: str, vhost: str | None = None) -> list[dict]:
    return json.loads(admin(target, "list", *args, vhost=vhost))


@pytest.fixture
def vhost(target: Target):
    name = unique("v")
    admin(target, "declare", "vhost", f"name={name}")
    yield name
    admin(target, "delete", "vhost", f"name={name}", check=False)


def test_declare_list_publish_get_purge_delete(target, vhost):
    admin(target, "declare", "exchange", "name=orders", "type=topic", vhost=vhost)
    admin(target, "declare", "queue", "name=q", "durable=true", 'arguments={"x-max-length": 10}', vhost=vhost)
    admin(target, "declare", "binding", "source=orders", "destination=q", "routing_key=eu.*", vhost=vhost)

    queues = listing(target, "queues", "name", "durable", "arguments", vhost=vhost)
    assert queues == [{"name": "q", "durable": True, "arguments": {"x-max-length": 10}}]
    exchanges = {e["name"]: e["type"] for e in listing(target, "exchanges", "name", "type", vhost=vhost)}
    assert exchanges["orders"] == "topic" and exchanges["amq.topic"] == "topic"
    bindings = listing(target, "bindings", "source", "destination", "routing_key", "properties_key",
                       vhost=vhost)
    assert {"source": "orders", "destination": "q", "routing_key": "eu.*",
            "properties_key": "eu.%2A"} in bindings

    admin(target, "publish", "exchange=orders", "routing_key=eu.fr", "payload=bonjour", vhost=vhost)
    admin(target, "publish", "exchange=orders", "routing_key=us.ny", "payload=lost", vhost=vhost)
    admin(target, "publish", "routing_key=q", "payload=direct", vhost=vhost)
    # RabbitMQ's queue statistics lag behind its queues
    assert eventually(lambda: listing(target, "queues", "name", "messages", vhost=vhost)
                      == [{"name": "q", "messages": 2}], 15, 0.3)

    got = json.loads(admin(target, "get", "queue=q", "count=5", "ackmode=ack_requeue_true", vhost=vhost))
    assert [(m["payload"], m["routing_key"], m["redelivered"]) for m in got] == \
        [("bonjour", "eu.fr", False), ("direct", "q", False)]
    got = json.loads(admin(target, "get", "queue=q", "ackmode=ack_requeue_false", vhost=vhost))
    assert [(m["payload"], m["redelivered"]) for m in got] == [("bonjour", True)]

    admin(target, "purge", "queue", "name=q", vhost=vhost)
    assert json.loads(admin(target, "get", "queue=q", vhost=vhost)) == []

    admin(target, "delete", "binding", "source=orders", "destination_type=queue", "destination=q",
          "properties_key=eu.%2A", vhost=vhost)
    assert [b for b in listing(target, "bindings", "source", vhost=vhost) if b["source"] == "orders"] == []
    admin(target, "delete", "queue", "name=q", vhost=vhost)
    admin(target, "delete", "exchange", "name=orders", vhost=vhost)
    assert listing(target, "queues", "name", vhost=vhost) == []


def test_sorted_lists_and_overview(target, vhost):
    for name in ("b", "c", "a"):
        admin(target, "declare", "queue", f"name={name}", vhost=vhost)
    names = [q["name"] for q in listing(target, "queues", "name", vhost=vhost)]
    assert names == ["a", "b", "c"]
    reverse = json.loads(admin(target, "--sort=name", "--sort-reverse", "list", "queues", "name",
                               vhost=vhost))
    assert [q["name"] for q in reverse] == ["c", "b", "a"]
    overview = json.loads(admin(target, "show", "overview"))[0]
    assert {"rabbitmq_version", "cluster_name", "queue_totals", "object_totals"} <= set(overview)
    nodes = listing(target, "nodes", "name", "running")
    assert len(nodes) == 1 and nodes[0]["running"] is True


def test_list_and_close_connections(target, vhost):
    connection = target.amqp(vhost=vhost)
    connection.channel()
    deadline = time.monotonic() + 15
    rows: list[dict] = []
    while time.monotonic() < deadline:
        rows = [c for c in listing(target, "connections", "name", "vhost", "user") if c["vhost"] == vhost]
        if rows:
            break
        time.sleep(0.3)
    assert len(rows) == 1 and rows[0]["user"] == "guest"
    admin(target, "close", "connection", f"name={rows[0]['name']}")
    deadline = time.monotonic() + 10
    while connection.is_open and time.monotonic() < deadline:
        try:
            connection.process_data_events(time_limit=0.2)
        except Exception:
            break
    assert not connection.is_open


def test_export_and_import_definitions(target, vhost, tmp_path):
    admin(target, "declare", "exchange", "name=x", "type=fanout", vhost=vhost)
    admin(target, "declare", "queue", "name=kept", "durable=true", vhost=vhost)
    admin(target, "declare", "binding", "source=x", "destination=kept", vhost=vhost)
    exported = tmp_path / "definitions.json"
    admin(target, "export", str(exported))
    document = json.loads(exported.read_text())
    queues = [{"name": q["name"], "vhost": q["vhost"]} for q in document["queues"]]
    assert {"name": "kept", "vhost": vhost} in queues

    admin(target, "delete", "queue", "name=kept", vhost=vhost)
    admin(target, "delete", "exchange", "name=x", vhost=vhost)
    admin(target, "import", str(exported))
    assert listing(target, "queues", "name", vhost=vhost) == [{"name": "kept"}]
    assert {"source": "x", "destination": "kept"} in listing(target, "bindings", "source", "destination",
                                                             vhost=vhost)


def test_export_and_import_one_vhost(target, vhost, tmp_path):
    admin(target, "declare", "queue", "name=mine", "durable=true", vhost=vhost)
    exported = tmp_path / "vhost.json"
    admin(target, "export", str(exported), vhost=vhost)
    document = json.loads(exported.read_text())
    assert {"rabbit_version", "queues", "exchanges", "bindings", "policies"} <= set(document)
    assert "users" not in document and "vhosts" not in document
    assert [q["name"] for q in document["queues"]] == ["mine"] and "vhost" not in document["queues"][0]

    other = unique("v")
    admin(target, "declare", "vhost", f"name={other}")
    try:
        admin(target, "import", str(exported), vhost=other)
        assert listing(target, "queues", "name", "durable", vhost=other) == \
            [{"name": "mine", "durable": True}]
    finally:
        admin(target, "delete", "vhost", f"name={other}", check=False)


LISTABLE = ["connections", "channels", "consumers", "exchanges", "queues", "bindings", "users", "vhosts",
            "permissions", "nodes", "parameters", "policies", "operator_policies", "vhost_limits"]


@pytest.mark.parametrize("kind", LISTABLE)
def test_every_list_command_works(target, kind):
    """``rabbitmqadmin list <kind>`` with its default columns."""
    rows = json.loads(admin(target, "list", kind))
    assert isinstance(rows, list)
    if kind in ("exchanges", "users", "vhosts", "permissions", "nodes"):
        assert rows, kind


def test_vhosts_list_their_messages(target, vhost):
    admin(target, "declare", "queue", "name=q", vhost=vhost)
    admin(target, "publish", "routing_key=q", "payload=m", vhost=vhost)
    deadline = time.monotonic() + 15
    while True:
        rows = [r for r in listing(target, "vhosts", "name", "messages") if r["name"] == vhost]
        if rows == [{"name": vhost, "messages": 1}] or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert rows == [{"name": vhost, "messages": 1}]
