"""Federation operations on two real leveret brokers (an upstream and a downstream that
federates ``fed.x`` from it and from a closed port): ``/api/federation-links`` rows with
RabbitMQ 3.10's fields (read from a node with ``rabbitmq_federation_management``: see
docs/federation.md), who may read them, ``state/down``, restart over HTTP and with
``leveret ctl``, and the Prometheus gauge of links by state."""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from brokers import free_port as closed_port  # a port nothing listens on
from click.testing import CliRunner
from eventually import eventually
from targets import Target, rabbitmq_installed

from leveret import BlockingBroker
from leveret.cli.ctl import ctl, request

TIMEOUT = 20.0
#: The fields of RabbitMQ 3.10's rows (besides ``local_channel``, which a running link
#: has when its channel's statistics are known).
ERROR_FIELDS = {"node", "exchange", "upstream_exchange", "type", "vhost", "upstream", "id", "status",
                "error", "uri", "timestamp"}  # fmt: skip
RUNNING_FIELDS = ERROR_FIELDS - {"error"} | {"local_connection"}
#: A running queue link's: ``queue``, ``upstream_queue``, ``consumer_tag`` instead of
#: ``exchange`` and ``upstream_exchange``.
QUEUE_FIELDS = (RUNNING_FIELDS - {"exchange", "upstream_exchange"}) | {"queue", "upstream_queue",
                                                                   "consumer_tag"}  # fmt: skip
TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\d \d{1,2}:\d\d:\d\d$")  # RabbitMQ's: the hour unpadded


def target(broker: BlockingBroker) -> Target:
    return Target("leveret", "127.0.0.1", broker.amqp_port, int(str(broker.http_url).rsplit(":", 1)[1]))


class Pair:
    """The downstream (HTTP, ctl socket, Prometheus) and its working upstream."""

    def __init__(self, down: BlockingBroker, up: BlockingBroker, data_dir: Path, closed: int) -> None:
        self.down, self.up, self.data_dir, self.closed = down, up, data_dir, closed
        self.http = target(down).http

    def links(self, path: str = "/api/federation-links", **login: Any) -> list[dict]:
        status, rows = self.http("GET", path, **login)
        assert status == 200, rows
        return rows

    def by_upstream(self) -> dict[str, dict]:
        return {row["upstream"]: row for row in self.links()}

    def settled(self) -> dict[str, dict]:
        """The rows once ``good`` runs and ``refused`` has failed."""
        rows: dict[str, dict] = {}

        def ready() -> bool:
            rows.update(self.by_upstream())
            return rows.get("good", {}).get("status") == "running" and rows.get("refused", {}).get(
                "status"
            ) == "error"

        assert eventually(ready, TIMEOUT, 0.1), rows
        return rows


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> Iterator[Pair]:
    # the links these surfaces show are exchange links (federation/exchange_link.py)
    pytest.importorskip("leveret.federation.exchange_link")
    data_dir = tmp_path_factory.mktemp("federation-ops") / "down"
    with (
        BlockingBroker(amqp_port=0, http_port=0) as up,
        BlockingBroker(amqp_port=0, http_port=0, prometheus_port=0, data_dir=str(data_dir)) as down,
    ):
        closed = closed_port()
        upstream, downstream = target(up), target(down)

        def put(side: Target, path: str, body: dict) -> None:
            status, answer = side.http("PUT", path, body)
            assert status in (201, 204), (path, answer)

        put(upstream, "/api/exchanges/%2F/fed.x", {"type": "topic"})
        put(downstream, "/api/exchanges/%2F/fed.x", {"type": "topic"})
        for name, uri in (
            ("good", f"amqp://guest:guest@127.0.0.1:{up.amqp_port}"),
            ("refused", f"amqp://guest:secret@127.0.0.1:{closed}/%2F?heartbeat=5"),
        ):
            value = {"uri": uri, "reconnect-delay": 1}
            put(downstream, f"/api/parameters/federation-upstream/%2F/{name}", {"value": value})
        every = {"federation-upstream-set": "all"}
        policy = {"pattern": "^fed\\.", "definition": every, "apply-to": "exchanges"}
        put(downstream, "/api/policies/%2F/federate", policy)
        for user, tags in (("watcher", "management"), ("monitor", "monitoring"), ("outsider", "monitoring")):
            put(downstream, f"/api/users/{user}", {"password": user, "tags": tags})
        for user in ("watcher", "monitor"):
            put(downstream, f"/api/permissions/%2F/{user}", {"configure": ".*", "write": ".*", "read": ".*"})
        put(downstream, "/api/vhosts/other", {})
        yield Pair(down, up, data_dir, closed)


def test_links_have_rabbitmqs_fields_with_the_error_text_of_a_failing_upstream(pair):
    rows = pair.settled()
    good, refused = rows["good"], rows["refused"]
    assert set(refused) == ERROR_FIELDS
    assert set(good) - {"local_channel"} == RUNNING_FIELDS
    assert refused["status"] == "error" and "refused" in refused["error"].lower()
    assert refused["uri"] == f"amqp://127.0.0.1:{pair.closed}/%2F"  # no user, password or query
    assert good["uri"] == f"amqp://127.0.0.1:{pair.up.amqp_port}"
    for row in (good, refused):
        named = (row["type"], row["vhost"], row["exchange"], row["upstream_exchange"])
        assert named == ("exchange", "/", "fed.x", "fed.x")
        assert TIMESTAMP.match(row["timestamp"]), row["timestamp"]
        assert re.fullmatch(r"[0-9a-f]{8}", row["id"]) and row["node"]
    assert good["id"] != refused["id"]
    # the link's own connection to this broker is one the broker lists
    names = [c["name"] for c in pair.http("GET", "/api/connections")[1]]
    assert good["local_connection"] in names
    if "local_channel" in good:
        assert good["local_channel"]["connection_details"]["name"] == good["local_connection"]


def test_lists_by_vhost_and_down_links_and_who_may_read_them(pair):
    pair.settled()
    assert {r["upstream"] for r in pair.links("/api/federation-links/%2F")} == {"good", "refused"}
    assert pair.links("/api/federation-links/other") == []
    assert pair.http("GET", "/api/federation-links/nowhere")[0] == 404
    for path in ("/api/federation-links/state/down/", "/api/federation-links/%2F/state/down"):
        assert [r["upstream"] for r in pair.links(path)] == ["refused"]
    assert pair.links("/api/federation-links/other/state/down") == []
    # RabbitMQ's rules: the monitoring tag (or administrator), rows of the user's vhosts
    status, body = pair.http("GET", "/api/federation-links", user="watcher", password="watcher")
    assert (status, body["reason"]) == (401, "Not monitor user")
    assert {r["upstream"] for r in pair.links(user="monitor", password="monitor")} == {"good", "refused"}
    assert pair.links(user="outsider", password="outsider") == []
    shown = pair.links("/api/federation-links?columns=upstream,status&sort=upstream")
    assert shown == [{"upstream": "good", "status": "running"}, {"upstream": "refused", "status": "error"}]


def test_a_link_restarts_over_http_and_unknown_ones_are_404(pair):
    good = pair.settled()["good"]
    base = f"/api/federation-links/vhost/%2F/{good['id']}"
    assert pair.http("DELETE", f"{base}/{good['node']}/restart", user="watcher", password="watcher")[0] == 401
    assert pair.http("DELETE", f"{base}/elsewhere@host/restart")[0] == 404
    node = good["node"]
    assert pair.http("DELETE", f"/api/federation-links/vhost/%2F/00000000/{node}/restart")[0] == 404
    assert pair.http("DELETE", f"/api/federation-links/vhost/other/{good['id']}/{node}/restart")[0] == 404
    assert pair.http("DELETE", f"{base}/{good['node']}/restart")[0] == 204

    def reconnected() -> bool:
        row = pair.by_upstream()["good"]
        return row["status"] == "running" and row["local_connection"] != good["local_connection"]

    assert eventually(reconnected, TIMEOUT, 0.1), pair.by_upstream()["good"]


def test_ctl_federation_status_and_restart(pair):
    rows = pair.settled()
    answer = request(str(pair.data_dir), "federation_status", {})
    assert answer["ok"], answer
    listed = [dict(zip(answer["columns"], row)) for row in answer["rows"]]
    assert {r["upstream"]: r["status"] for r in listed} == {"good": "running", "refused": "error"}
    assert set(answer["columns"]) == {"type", "vhost", "exchange", "queue", "upstream", "upstream_exchange",
                                      "upstream_queue", "consumer_tag", "id", "status", "local_connection",
                                      "error", "uri", "last_changed"}  # rabbitmqctl's JSON keys  # fmt: skip
    refused = next(r for r in listed if r["upstream"] == "refused")
    assert (refused["queue"], refused["local_connection"]) == ("", "")
    assert "refused" in refused["error"].lower()
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", refused["last_changed"])
    runner = CliRunner()
    where = ["--data-dir", str(pair.data_dir)]
    down = runner.invoke(ctl, [*where, "federation_status", "--only-down"])
    assert down.exit_code == 0, down.output
    lines = down.output.splitlines()
    assert lines[0] == "Listing federation links which are down ..." and lines[1].startswith("type\tvhost\t")
    assert len(lines) == 3 and rows["refused"]["id"] in lines[2] and rows["good"]["id"] not in down.output
    good = rows["good"]["id"]
    restarted = runner.invoke(ctl, [*where, "restart_federation_link", good])
    assert restarted.exit_code == 0 and restarted.output.startswith(f"Restarting federation link {good}")
    missing = runner.invoke(ctl, [*where, "restart_federation_link", "00000000"])
    assert missing.exit_code == 1 and "Link with the given ID was not found" in missing.output
    assert eventually(lambda: pair.by_upstream()["good"]["status"] == "running", TIMEOUT, 0.1)


def test_prometheus_counts_links_by_state_and_the_messages_they_move(pair):
    pair.settled()

    def scrape() -> str:
        with urllib.request.urlopen(f"{pair.down.prometheus_url}/metrics", timeout=10) as response:
            return response.read().decode()

    def gauge() -> dict[str, float]:
        text = scrape()
        assert "# TYPE rabbitmq_federation_links gauge" in text
        found = re.findall(r'^rabbitmq_federation_links\{status="(\w+)"\} ([\d.]+)$', text, re.M)
        return {state: float(value) for state, value in found}

    def moved() -> float:
        found = re.search(r'^leveret_federation_messages_total\{type="exchange"\} ([\d.]+)$', scrape(), re.M)
        assert found is not None
        return float(found.group(1))

    seen: dict[str, float] = {}

    def settled() -> bool:
        seen.update(gauge())
        return seen.get("running") == 1 and seen.get("error") == 1

    assert eventually(settled, TIMEOUT, 0.1), seen
    assert seen == {"starting": 0, "running": 1, "error": 1, "shutdown": 0}
    # a message published upstream for a downstream binding comes over the link
    before = moved()
    down = pika.BlockingConnection(pika.URLParameters(pair.down.amqp_url))
    up = pika.BlockingConnection(pika.URLParameters(pair.up.amqp_url))
    try:
        queue = down.channel().queue_declare("", exclusive=True).method.queue
        down.channel().queue_bind(queue, "fed.x", "metrics.key")

        def arrived() -> bool:  # once the binding has reached the upstream
            up.channel().basic_publish("fed.x", "metrics.key", b"over the link")
            down.process_data_events(0.2)
            return down.channel().queue_declare(queue, passive=True).method.message_count > 0

        assert eventually(arrived, TIMEOUT, 0.2)
        assert eventually(lambda: moved() > before, TIMEOUT, 0.1)
    finally:
        down.close()
        up.close()


def test_an_exchange_declared_after_the_policy_is_listed_until_deleted(pair):
    """Links follow the exchanges declared over AMQP in a vhost the broker made (its
    entity listeners reach every vhost)."""
    pair.settled()
    connection = pika.BlockingConnection(pika.URLParameters(pair.down.amqp_url))
    channel = connection.channel()
    channel.exchange_declare("fed.later", "topic")

    def later() -> list[dict]:
        return [r for r in pair.links() if r["exchange"] == "fed.later"]

    try:
        both = {"good", "refused"}
        assert eventually(lambda: {r["upstream"] for r in later()} == both, TIMEOUT, 0.1), later()
    finally:
        channel.exchange_delete("fed.later")
        connection.close()
    assert eventually(lambda: not later(), TIMEOUT, 0.1), later()



def test_a_queue_link_has_rabbitmqs_queue_fields(pair):
    """A federated queue's link: ``queue``, ``upstream_queue`` and ``consumer_tag`` where
    an exchange link has ``exchange`` and ``upstream_exchange``."""
    pytest.importorskip("leveret.federation.queue_link")
    upstream, downstream = target(pair.up), target(pair.down)
    assert upstream.http("PUT", "/api/queues/%2F/fq.q", {})[0] in (201, 204)
    value = {"uri": f"amqp://guest:guest@127.0.0.1:{pair.up.amqp_port}", "consumer-tag": "pull"}
    put = downstream.http("PUT", "/api/parameters/federation-upstream/%2F/queues", {"value": value})
    assert put[0] in (201, 204), put
    policy = {"pattern": "^fq\\.", "definition": {"federation-upstream": "queues"}, "apply-to": "queues"}
    assert downstream.http("PUT", "/api/policies/%2F/federate-queues", policy)[0] in (201, 204)
    assert downstream.http("PUT", "/api/queues/%2F/fq.q", {})[0] in (201, 204)
    rows: list[dict] = []

    def running() -> bool:
        rows[:] = [r for r in pair.links() if r["type"] == "queue"]
        return [r["status"] for r in rows] == ["running"]

    try:
        assert eventually(running, TIMEOUT, 0.1), rows
        [row] = rows
        assert set(row) - {"local_channel"} == QUEUE_FIELDS
        assert (row["queue"], row["upstream_queue"], row["consumer_tag"]) == ("fq.q", "fq.q", "pull")
        answer = request(str(pair.data_dir), "federation_status", {})
        listed = [dict(zip(answer["columns"], r)) for r in answer["rows"]]
        [shown] = [r for r in listed if r["type"] == "queue"]
        assert (shown["queue"], shown["exchange"], shown["consumer_tag"]) == ("fq.q", "", "pull")
    finally:
        downstream.http("DELETE", "/api/policies/%2F/federate-queues")
    assert eventually(lambda: not [r for r in pair.links() if r["type"] == "queue"], TIMEOUT, 0.1)


@pytest.mark.skipif(not rabbitmq_installed(), reason="rabbitmq-server is not installed")
def test_rabbitmq_shows_the_same_fields_states_and_answers():
    """The expectations above, on RabbitMQ 3.10 with ``rabbitmq_federation_management``
    (one node federating from itself and from a closed port): proves the tests right."""
    from brokers import RabbitMQ

    node = RabbitMQ(federation=True).start()
    try:
        rabbit = Target("rabbitmq", "127.0.0.1", node.port, node.http_port)
        closed = closed_port()
        for path, body in (
            ("/api/exchanges/%2F/src.x", {"type": "topic"}),
            ("/api/exchanges/%2F/fed.x", {"type": "topic"}),
            ("/api/queues/%2F/src.q", {}),
            ("/api/queues/%2F/fq.q", {}),
            ("/api/parameters/federation-upstream/%2F/good",
             {"value": {"uri": f"amqp://guest:guest@127.0.0.1:{node.port}", "exchange": "src.x",
                        "queue": "src.q", "reconnect-delay": 1}}),
            ("/api/parameters/federation-upstream/%2F/refused",
             {"value": {"uri": f"amqp://guest:secret@127.0.0.1:{closed}/%2F?heartbeat=5",
                        "reconnect-delay": 1}}),
            ("/api/policies/%2F/federate",
             {"pattern": "^fed\\.", "definition": {"federation-upstream-set": "all"},
              "apply-to": "exchanges"}),
            ("/api/policies/%2F/federate-queues",
             {"pattern": "^fq\\.", "definition": {"federation-upstream": "good"}, "apply-to": "queues"}),
            ("/api/users/watcher", {"password": "watcher", "tags": "management"}),
        ):  # fmt: skip
            assert rabbit.http("PUT", path, body)[0] in (201, 204), path
        rows: dict[tuple[str, str], dict] = {}

        def ready() -> bool:
            listed = rabbit.http("GET", "/api/federation-links")[1]
            rows.update({(r["type"], r["upstream"]): r for r in listed})
            states = {key: row["status"] for key, row in rows.items()}
            return states == {
                ("exchange", "good"): "running",
                ("queue", "good"): "running",
                ("exchange", "refused"): "error",
            }

        assert eventually(ready, 60, 0.5), rows
        good, refused, queue = rows["exchange", "good"], rows["exchange", "refused"], rows["queue", "good"]
        assert set(refused) == ERROR_FIELDS and refused["uri"] == f"amqp://127.0.0.1:{closed}/%2F"
        assert set(good) - {"local_channel"} == RUNNING_FIELDS and good["upstream_exchange"] == "src.x"
        assert set(queue) - {"local_channel"} == QUEUE_FIELDS
        assert queue["consumer_tag"] == "federation-link-good" and queue["upstream_queue"] == "src.q"
        assert TIMESTAMP.match(good["timestamp"]) and refused["error"] == "econnrefused"
        down = rabbit.http("GET", "/api/federation-links/state/down/")[1]
        assert [r["upstream"] for r in down] == ["refused"]
        status, body = rabbit.http("GET", "/api/federation-links", user="watcher", password="watcher")
        assert (status, body["reason"]) == (401, "Not monitor user")
        restart = f"/api/federation-links/vhost/%2F/{good['id']}/{good['node']}/restart"
        assert rabbit.http("DELETE", restart.replace(good["id"], "00000000"))[0] == 404
        assert rabbit.http("DELETE", restart)[0] == 204
    finally:
        node.stop()
