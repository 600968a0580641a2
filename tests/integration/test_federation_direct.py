"""A running federation link's local side is a direct connection, as RabbitMQ 3.10's
(checked on a node with ``rabbitmq_federation``: the last test here): the links publish
into their broker through core, and ``/api/connections`` lists that as ``type``
``direct``, ``protocol`` ``Direct 0-9-1``, with only ``connection_name`` as client
property; the link row's ``local_connection`` names it and ``local_channel`` is its one
channel; closing it (HTTP, ``leveret ctl``) makes the link start over."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from eventually import eventually
from targets import Target, put, rabbitmq_installed

from leveret import BlockingBroker
from leveret.cli.ctl import request

TIMEOUT = 20.0  # seconds
#: The fields of RabbitMQ 3.10's ``/api/connections`` row of a direct connection.
DIRECT_FIELDS = {"client_properties", "connected_at", "name", "node", "protocol", "type", "user",
                 "user_who_performed_action", "vhost"}  # fmt: skip
#: An Erlang pid as RabbitMQ prints it (``<rabbit@host.1795856166.835.0>``); leveret's names
#: have the same shape.
PID = re.compile(r"^<\S+\.\d+\.\d+\.0>$")


def target(broker: BlockingBroker) -> Target:
    return Target("leveret", "127.0.0.1", broker.amqp_port, int(str(broker.http_url).rsplit(":", 1)[1]))


def federate(down: Target, uri: str) -> None:
    """An exchange link (``fed.x`` from ``src.x``) and a queue link (``fq.q`` from
    ``src.q``) of the upstream ``good`` at ``uri``, as the RabbitMQ check has them."""
    for path, body in (
        ("/api/exchanges/%2F/fed.x", {"type": "topic"}),
        ("/api/queues/%2F/fq.q", {}),
        ("/api/parameters/federation-upstream/%2F/good",
         {"value": {"uri": uri, "exchange": "src.x", "queue": "src.q", "reconnect-delay": 1}}),
        ("/api/policies/%2F/federate",
         {"pattern": "^fed\\.", "definition": {"federation-upstream-set": "all"}, "apply-to": "exchanges"}),
        ("/api/policies/%2F/federate-queues",
         {"pattern": "^fq\\.", "definition": {"federation-upstream": "good"}, "apply-to": "queues"}),
    ):  # fmt: skip
        put(down, path, body)


def running_rows(down: Target) -> dict[str, dict]:
    """The link rows by type once both links run (with their ``local_channel``: RabbitMQ
    adds it once its statistics of the channel came, every few seconds)."""
    rows: dict[str, dict] = {}

    def ready() -> bool:
        rows.clear()
        rows.update({r["type"]: r for r in down.http("GET", "/api/federation-links")[1]})
        kinds = ("exchange", "queue")
        return [rows.get(kind, {}).get("status") for kind in kinds] == ["running"] * 2 and all(
            "local_channel" in rows[kind] for kind in kinds
        )

    assert eventually(ready, 40, 0.2), rows
    return rows


def listed(down: Target, path: str, names: set[str]) -> dict[str, dict]:
    """``path``'s rows by name once it lists ``names`` (RabbitMQ's lists follow its
    statistics, a few seconds late)."""
    rows: dict[str, dict] = {}

    def ready() -> bool:
        rows.clear()
        rows.update({r["name"]: r for r in down.http("GET", path)[1]})
        return names <= set(rows)

    assert eventually(ready, 40, 0.2), (names, list(rows))
    return rows


def check_direct_connections(down: Target, rows: dict[str, dict]) -> None:
    """What both brokers show of the links' direct connections."""
    names = {rows[kind]["local_connection"] for kind in ("exchange", "queue")}
    connections = listed(down, "/api/connections", names)
    channels = listed(down, "/api/channels", {f"{name} (1)" for name in names})
    for kind, policy in (("exchange", "federate"), ("queue", "federate-queues")):
        row = rows[kind]
        name = row["local_connection"]
        assert PID.match(name), name
        connection = connections[name]
        assert set(connection) == DIRECT_FIELDS, connection
        shown = (connection["type"], connection["protocol"], connection["vhost"])
        assert shown == ("direct", "Direct 0-9-1", "/")
        assert connection["client_properties"] == {
            "connection_name": f"Federation link (upstream: good, policy: {policy})"
        }
        channel = row["local_channel"]
        assert channel["name"] == f"{name} (1)" and channel["number"] == 1 and channel["confirm"] is True
        undefined = {"peer_host": "undefined", "peer_port": "undefined"}  # RabbitMQ's for a direct one
        assert channel["connection_details"] == {"name": name, **undefined}
        assert channels[channel["name"]]["connection_details"]["name"] == name
    assert rows["exchange"]["local_connection"] != rows["queue"]["local_connection"]


def closed_and_restarted(down: Target, rows: dict[str, dict], close) -> None:
    """Closing the exchange link's direct connection (``close(name)``) makes the link
    start over on a new one; the queue link keeps its own."""
    name, other = rows["exchange"]["local_connection"], rows["queue"]["local_connection"]
    close(name)

    def restarted() -> bool:
        row = {r["type"]: r for r in down.http("GET", "/api/federation-links")[1]}["exchange"]
        return row["status"] == "running" and row.get("local_connection") not in (None, name)

    assert eventually(restarted, TIMEOUT, 0.1)
    gone = lambda: name not in {c["name"] for c in down.http("GET", "/api/connections")[1]}  # noqa: E731
    assert eventually(gone, 40, 0.2)
    assert other in {c["name"] for c in down.http("GET", "/api/connections")[1]}


@pytest.fixture
def brokers(tmp_path: Path) -> Iterator[tuple[BlockingBroker, Target, Path]]:
    data_dir = tmp_path / "down"
    with (
        BlockingBroker(amqp_port=0, http_port=0) as up,
        BlockingBroker(amqp_port=0, http_port=0, data_dir=str(data_dir)) as down,
    ):
        put(target(up), "/api/exchanges/%2F/src.x", {"type": "topic"})
        put(target(up), "/api/queues/%2F/src.q", {})
        federate(target(down), f"amqp://guest:guest@127.0.0.1:{up.amqp_port}")
        yield down, target(down), data_dir


def test_a_running_links_local_side_is_a_direct_connection(brokers):
    _, down, _ = brokers
    check_direct_connections(down, running_rows(down))
    # only an administrator (or its user, guest) may close it; the row is guest's
    put(down, "/api/users/other", {"password": "other", "tags": "monitoring"})
    name = running_rows(down)["exchange"]["local_connection"]
    path = f"/api/connections/{quote(name, safe='')}"
    assert down.http("GET", path)[1]["user"] == "guest"
    assert down.http("DELETE", path, user="other", password="other")[0] == 401


def test_closing_the_direct_connection_restarts_the_link_over_http_and_ctl(brokers):
    _, down, data_dir = brokers

    def over_http(name: str) -> None:
        assert down.http("DELETE", f"/api/connections/{quote(name, safe='')}")[0] == 204

    def over_ctl(name: str) -> None:
        answer = request(str(data_dir), "close_connection", {"name": name, "explanation": "test"})
        assert answer["ok"], answer

    closed_and_restarted(down, running_rows(down), over_http)
    closed_and_restarted(down, running_rows(down), over_ctl)
    listed = request(str(data_dir), "list_connections", {"columns": ["name", "protocol"]})
    assert [row[1] for row in listed["rows"] if PID.match(row[0])] == ["Direct 0-9-1"] * 2


@pytest.mark.skipif(not rabbitmq_installed(), reason="rabbitmq-server is not installed")
def test_rabbitmq_shows_the_same_direct_connections():
    """The expectations above on RabbitMQ 3.10 (one node federating from itself)."""
    from brokers import RabbitMQ

    node = RabbitMQ(federation=True).start()
    try:
        rabbit = Target("rabbitmq", "127.0.0.1", node.port, node.http_port)
        put(rabbit, "/api/exchanges/%2F/src.x", {"type": "topic"})
        put(rabbit, "/api/queues/%2F/src.q", {})
        federate(rabbit, f"amqp://guest:guest@127.0.0.1:{node.port}")
        rows = running_rows(rabbit)
        check_direct_connections(rabbit, rows)

        def over_http(name: str) -> None:
            assert rabbit.http("DELETE", f"/api/connections/{quote(name, safe='')}")[0] == 204

        closed_and_restarted(rabbit, rows, over_http)
    finally:
        node.stop()
