"""The ``error`` of failing federation links, on a leveret downstream federating ``fx``
(and the queue ``fq``) from a leveret upstream in every way a link fails: each row's
text starts with RabbitMQ 3.10's term for the failure (``econnrefused``,
``auth_failure``, ``not_allowed``, ``server_initiated_close``) and carries the AMQP
reply code and text (RabbitMQ's rows, read from a node with ``rabbitmq_federation``:
docs/federation.md#operations). The TLS failures are in test_federation_tls.py."""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator

import pytest
from brokers import free_port as closed_port  # a port nothing listens on
from eventually import eventually
from targets import Target, put, rabbitmq_installed

from leveret import BlockingBroker

TIMEOUT = 8.0


class Pair:
    def __init__(self, up: Target, down: Target, closed: int) -> None:
        self.up, self.down, self.closed = up, down, closed

    def rows(self) -> dict[str, dict]:
        status, rows = self.down.http("GET", "/api/federation-links")
        assert status == 200
        return {f"{row['type']}:{row['upstream']}": row for row in rows}

    def settled(self, *keys: str) -> dict[str, dict]:
        """The rows once every link in ``keys`` has left ``starting``."""
        seen: dict[str, dict] = {}

        def ready() -> bool:
            seen.update(self.rows())
            return all(seen.get(key, {}).get("status") in ("running", "error") for key in keys)

        assert eventually(ready, TIMEOUT, 0.1), seen
        return seen


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    with (
        BlockingBroker(amqp_port=0, http_port=0) as up_broker,
        BlockingBroker(amqp_port=0, http_port=0) as down_broker,
    ):
        up, down = Target.of(up_broker), Target.of(down_broker)
        put(down, "/api/global-parameters/cluster_name", {"value": "down@fed"})
        closed, port = closed_port(), up.amqp_port
        put(up, "/api/vhosts/limited", {})
        put(up, "/api/permissions/limited/guest", {"configure": "^$", "write": "^$", "read": "^$"})
        put(up, "/api/queues/%2F/up.q", {"arguments": {"x-max-length": 5}})
        # the exchange link's upstream queue, there already with another x-expires
        put(up, "/api/queues/%2F/" + urllib.parse.quote("federation: fy -> down@fed", safe=""),
            {"durable": True, "arguments": {"x-expires": 99999}})  # fmt: skip
        put(down, "/api/exchanges/%2F/fx", {"type": "topic"})
        put(down, "/api/exchanges/%2F/fy", {"type": "topic"})
        put(down, "/api/queues/%2F/fq", {})
        upstreams = {
            "refused": {"uri": f"amqp://guest:guest@127.0.0.1:{closed}"},
            "password": {"uri": f"amqp://guest:wrong@127.0.0.1:{port}"},
            "vhost": {"uri": f"amqp://guest:guest@127.0.0.1:{port}/nosuch"},
            "permission": {"uri": f"amqp://guest:guest@127.0.0.1:{port}/limited"},
            "exchange": {"uri": f"amqp://guest:guest@127.0.0.1:{port}", "exchange": "missing.x"},
            "queue-args": {"uri": f"amqp://guest:guest@127.0.0.1:{port}", "queue": "up.q"},
            "expires": {"uri": f"amqp://guest:guest@127.0.0.1:{port}", "expires": 1000},
        }
        for name, value in upstreams.items():
            value = {**value, "reconnect-delay": 1}
            put(down, f"/api/parameters/federation-upstream/%2F/{name}", {"value": value})
        exchanges = [n for n in upstreams if n not in ("queue-args", "expires")]
        for upstream in exchanges:
            one = {"value": [{"upstream": upstream}]}
            put(down, f"/api/parameters/federation-upstream-set/%2F/{upstream}", one)
        every = {"value": [{"upstream": n} for n in exchanges]}
        put(down, "/api/parameters/federation-upstream-set/%2F/fx", every)
        for name, pattern, kind, definition in (
            ("fx", "^fx$", "exchanges", {"federation-upstream-set": "fx"}),
            ("fy", "^fy$", "exchanges", {"federation-upstream": "expires"}),
            ("fq", "^fq$", "queues", {"federation-upstream": "queue-args"}),
        ):
            policy = {"pattern": pattern, "apply-to": kind, "definition": definition}
            put(down, f"/api/policies/%2F/{name}", policy)
        yield Pair(up, down, closed)


def test_a_refused_connection_names_the_address(pair):
    row = pair.settled("exchange:refused")["exchange:refused"]
    assert row["status"] == "error"
    assert row["error"] == f"econnrefused: connection refused by 127.0.0.1:{pair.closed}"


def test_a_wrong_password_is_an_auth_failure_with_the_reply(pair):
    row = pair.settled("exchange:password")["exchange:password"]
    assert row["error"].startswith(
        "auth_failure: 403 ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN"
    ), row
    assert "wrong" not in row["error"] and row["uri"] == f"amqp://127.0.0.1:{pair.up.amqp_port}"


def test_a_missing_vhost_is_not_allowed_with_the_reply(pair):
    row = pair.settled("exchange:vhost")["exchange:vhost"]
    assert row["error"] == "not_allowed: 530 NOT_ALLOWED - vhost nosuch not found"


def test_a_refused_declare_is_a_server_initiated_close_with_code_and_text(pair):
    row = pair.settled("exchange:permission")["exchange:permission"]
    assert row["status"] == "error"
    assert row["error"].startswith(
        "server_initiated_close: 403 ACCESS_REFUSED - access to queue "
        "'federation: fx -> down@fed:/:fx' in vhost 'limited' refused"
    ), row


def test_an_upstream_queue_with_other_arguments_is_a_precondition_failure(pair):
    row = pair.settled("exchange:expires")["exchange:expires"]
    assert row["status"] == "error"
    assert row["error"].startswith("server_initiated_close: 406 PRECONDITION_FAILED - inequivalent arg "
                                   "'x-expires' for queue 'federation: fy -> down@fed'"), row  # fmt: skip


def test_a_query_value_rabbitmq_refuses_is_a_400_naming_it(pair):
    value = {"uri": f"amqp://guest:guest@127.0.0.1:{pair.up.amqp_port}?heartbeat=often"}
    path = "/api/parameters/federation-upstream/%2F/bad-query"
    status, body = pair.down.http("PUT", path, {"value": value})
    assert status == 400 and "URI query key heartbeat: not an integer: 'often'" in body["reason"], body


def test_a_missing_upstream_exchange_is_declared_and_an_existing_queue_used_as_rabbitmq_does(pair):
    rows = pair.settled("exchange:exchange", "queue:queue-args")
    assert rows["exchange:exchange"]["status"] == "running"
    assert pair.up.http("GET", "/api/exchanges/%2F/missing.x")[1]["type"] == "topic"
    assert rows["queue:queue-args"]["status"] == "running"  # RabbitMQ 3.10's queue link: running too
    assert pair.up.http("GET", "/api/queues/%2F/up.q")[1]["arguments"] == {"x-max-length": 5}


@pytest.mark.skipif(not rabbitmq_installed(), reason="rabbitmq-server is not installed")
def test_rabbitmq_shows_the_same_failures_as_erlang_terms(tmp_path):
    """RabbitMQ 3.10 (``rabbitmq_federation``, a node federating from itself) in the
    cases above: the word each leveret text starts with, and the same reply text
    (the table in docs/federation.md#operations)."""
    from brokers import RabbitMQ, free_port
    from certificates import pem_files

    (tmp_path / "good").mkdir()
    (tmp_path / "other").mkdir()
    good, other = pem_files(tmp_path / "good"), pem_files(tmp_path / "other")
    tls_port = free_port()
    conf = (
        f"listeners.ssl.1 = 127.0.0.1:{tls_port}\nssl_options.cacertfile = {good['ca']}\n"
        f"ssl_options.certfile = {good['server']}\nssl_options.keyfile = {good['server_key']}\n"
    )
    node = RabbitMQ(federation=True, conf=conf).start()
    try:
        rabbit = Target("rabbitmq", "127.0.0.1", node.port, node.http_port)
        port = node.port
        put(rabbit, "/api/global-parameters/cluster_name", {"value": "rmq"})
        put(rabbit, "/api/vhosts/limited", {})
        put(rabbit, "/api/permissions/limited/guest", {"configure": "^$", "write": "^$", "read": "^$"})
        put(rabbit, "/api/queues/%2F/" + urllib.parse.quote("federation: fy -> rmq", safe=""),
            {"durable": True, "arguments": {"x-expires": 99999}})  # fmt: skip
        upstreams = {
            "refused": f"amqp://guest:guest@127.0.0.1:{closed_port()}",
            "password": f"amqp://guest:wrong@127.0.0.1:{port}",
            "vhost": f"amqp://guest:guest@127.0.0.1:{port}/nosuch",
            "permission": f"amqp://guest:guest@127.0.0.1:{port}/limited",
            "tls-ca": f"amqps://guest:guest@localhost:{tls_port}?cacertfile={other['ca']}&verify=verify_peer",
        }
        for name, uri in upstreams.items():
            value = {"uri": uri, "reconnect-delay": 1}
            put(rabbit, f"/api/parameters/federation-upstream/%2F/{name}", {"value": value})
        expires = {"uri": f"amqp://guest:guest@127.0.0.1:{port}", "expires": 1000, "reconnect-delay": 1}
        put(rabbit, "/api/parameters/federation-upstream/%2F/expires", {"value": expires})
        every = {"value": [{"upstream": n} for n in upstreams]}
        put(rabbit, "/api/parameters/federation-upstream-set/%2F/fx", every)
        put(rabbit, "/api/exchanges/%2F/fx", {"type": "topic"})
        put(rabbit, "/api/exchanges/%2F/fy", {"type": "topic"})
        policies = (("fx", {"federation-upstream-set": "fx"}), ("fy", {"federation-upstream": "expires"}))
        for name, definition in policies:
            put(rabbit, f"/api/policies/%2F/{name}", {"pattern": f"^{name}$", "apply-to": "exchanges",
                                                     "definition": definition})  # fmt: skip
        bad = {"value": {"uri": f"amqp://guest:guest@127.0.0.1:{port}?heartbeat=often"}}
        assert rabbit.http("PUT", "/api/parameters/federation-upstream/%2F/bad", bad)[0] == 400
        errors: dict[str, str] = {}

        def failed() -> bool:
            for row in rabbit.http("GET", "/api/federation-links")[1]:
                if row.get("error"):
                    errors[row["upstream"]] = row["error"]
            return set(errors) == {*upstreams, "expires"}

        assert eventually(failed, 60, 0.5), errors
        assert errors["refused"] == "econnrefused"
        assert errors["password"].startswith(
            '{auth_failure,"ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN'
        )
        assert errors["vhost"] == "not_allowed"
        assert errors["permission"].startswith("{server_initiated_close,403,")
        refused = "ACCESS_REFUSED - access to queue 'federation: fx -> rmq:/:fx' in vhost 'limited'"
        assert refused in errors["permission"]
        assert errors["expires"].startswith("{server_initiated_close,406,")
        inequivalent = "PRECONDITION_FAILED - inequivalent arg 'x-expires' for queue 'federation: fy -> rmq'"
        assert inequivalent in errors["expires"]
        assert errors["tls-ca"].startswith("{tls_alert,{unknown_ca,")
    finally:
        node.stop()
