"""Operator policies, global parameters and runtime parameters over the management API,
run against leveret and (when installed) a RabbitMQ 3.10 node with the same calls."""

from __future__ import annotations

from eventually import eventually_equal
from targets import Target, unique
from test_management_api import q, wait_for

from leveret import BlockingBroker


def test_an_operator_policy_caps_a_queue_below_its_own_limit(target: Target, vhost):
    name = unique("op")
    body = {"pattern": "^capped", "definition": {"max-length": 2}, "apply-to": "queues"}
    assert target.http("PUT", f"/api/operator-policies/{q(vhost)}/{name}", body)[0] == 201
    assert target.http("PUT", f"/api/operator-policies/{q(vhost)}/{name}", body)[0] == 204
    listed = target.http("GET", f"/api/operator-policies/{q(vhost)}")[1]
    assert listed == [{"vhost": vhost, "name": name, "pattern": "^capped", "apply-to": "queues",
                       "definition": {"max-length": 2}, "priority": 0}]
    connection = target.amqp(vhost=vhost)
    channel = connection.channel()
    channel.queue_declare("capped-high", arguments={"x-max-length": 5})  # the operator's 2 wins
    channel.queue_declare("capped-low", arguments={"x-max-length": 1})  # its own 1 wins
    channel.queue_declare("free", arguments={"x-max-length": 5})  # not matched
    for _ in range(6):
        for queue in ("capped-high", "capped-low", "free"):
            channel.basic_publish("", queue, b"x")
    counts = {n: channel.queue_declare(n, passive=True).method.message_count
              for n in ("capped-high", "capped-low", "free")}
    assert counts == {"capped-high": 2, "capped-low": 1, "free": 5}
    connection.close()
    info = wait_for(lambda: (r := target.http("GET", f"/api/queues/{q(vhost)}/capped-high")[1])
                    .get("operator_policy") and r)
    assert info["operator_policy"] == name
    assert info["effective_policy_definition"] == {"max-length": 2}
    assert target.http("GET", f"/api/queues/{q(vhost)}/free")[1]["operator_policy"] is None
    assert target.http("DELETE", f"/api/operator-policies/{q(vhost)}/{name}")[0] == 204
    assert target.http("DELETE", f"/api/operator-policies/{q(vhost)}/{name}")[0] == 404


def test_an_operator_policy_takes_only_limits(target: Target, vhost):
    status, body = target.http("PUT", f"/api/operator-policies/{q(vhost)}/bad",
                               {"pattern": ".*", "definition": {"dead-letter-exchange": "x"}})
    assert status == 400
    assert body["reason"] == ('Validation failed\n\n[{<<"dead-letter-exchange">>,<<"x">>}] '
                              "are not recognised policy settings\n")
    assert target.http("GET", f"/api/operator-policies/{q(vhost)}/bad")[0] == 404


def test_only_administrators_see_and_set_operator_policies(target: Target, vhost):
    users = {"pm": "policymaker", "mg": "management"}
    try:
        for user, tag in users.items():
            name = unique(user)
            target.http("PUT", f"/api/users/{name}", {"password": "pw", "tags": tag})
            target.http("PUT", f"/api/permissions/{q(vhost)}/{name}",
                        {"configure": ".*", "write": ".*", "read": ".*"})
            users[user] = name
        body = {"pattern": "^x", "definition": {"message-ttl": 1000}}
        path = f"/api/operator-policies/{q(vhost)}/ttl"
        refused = (401, {"error": "not_authorised", "reason": "Not administrator user"})
        for user in users.values():  # changes: unlike policies, administrators only (RabbitMQ 3.10)
            assert target.http("PUT", path, body, user=user, password="pw") == refused
            listed = target.http("GET", f"/api/operator-policies/{q(vhost)}", user=user, password="pw")
            assert listed == (200, [])
        assert target.http("PUT", path, body)[0] == 201
        seen = {key: target.http("GET", f"/api/operator-policies/{q(vhost)}", user=user, password="pw")[1]
                for key, user in users.items()}
        assert [p["name"] for p in seen["pm"]] == [p["name"] for p in seen["mg"]] == ["ttl"]
    finally:
        for name in users.values():
            target.http("DELETE", f"/api/users/{name}")


def test_global_parameters_and_parameters(target: Target):
    assert target.http("PUT", "/api/global-parameters/cluster_name", {"value": "east-1"})[0] == 201
    try:
        one = target.http("GET", "/api/global-parameters/cluster_name")[1]
        assert one == {"value": "east-1", "name": "cluster_name"}
        assert {"name": "cluster_name", "value": "east-1"} in target.http("GET", "/api/global-parameters")[1]
        assert target.http("GET", "/api/overview")[1]["cluster_name"] == "east-1"
        definitions = target.http("GET", "/api/definitions")[1]
        assert {"name": "cluster_name", "value": "east-1"} in definitions["global_parameters"]
    finally:
        assert target.http("DELETE", "/api/global-parameters/cluster_name")[0] == 204
    assert target.http("GET", "/api/global-parameters/cluster_name")[0] == 404
    # a component neither has (shovels: test_shovels.py; federation: test_federation_*.py)
    value = {"value": {"uri": "amqp://remote"}}
    status, body = target.http("PUT", "/api/parameters/no-such-plugin/%2F/u1", value)
    assert status == 400
    assert body["reason"] == "Validation failed\n\ncomponent no-such-plugin not found\n"
    assert target.http("GET", "/api/parameters/no-such-plugin")[1] == []


def test_operator_policies_survive_a_restart_and_travel_in_definitions(tmp_path):
    data = str(tmp_path / "data")
    body = {"pattern": "^q", "definition": {"max-length": 3}, "apply-to": "queues", "priority": 1}
    with BlockingBroker(amqp_port=0, http_port=0, data_dir=data) as broker:
        target = Target("leveret", "127.0.0.1", broker.amqp_port, broker.broker.management.port)
        assert target.http("PUT", "/api/operator-policies/%2F/cap", body)[0] == 201
        assert target.http("PUT", "/api/global-parameters/cluster_name", {"value": "west"})[0] == 201
        exported = target.http("GET", "/api/definitions")[1]
    assert {"value": {"pattern": "^q", "definition": {"max-length": 3}, "priority": 1, "apply-to": "queues"},
            "vhost": "/", "component": "operator_policy", "name": "cap"} in exported["parameters"]
    with BlockingBroker(amqp_port=0, http_port=0, data_dir=data) as broker:
        target = Target("leveret", "127.0.0.1", broker.amqp_port, broker.broker.management.port)
        assert target.http("GET", "/api/operator-policies/%2F/cap")[1]["definition"] == {"max-length": 3}
        assert target.http("GET", "/api/overview")[1]["cluster_name"] == "west"
    with BlockingBroker(amqp_port=0, http_port=0) as broker:  # a fresh broker imports them
        target = Target("leveret", "127.0.0.1", broker.amqp_port, broker.broker.management.port)
        assert target.http("POST", "/api/definitions", exported)[0] in (200, 201, 204)
        assert target.http("GET", "/api/operator-policies")[1][0]["name"] == "cap"
        connection = target.amqp()
        channel = connection.channel()
        channel.queue_declare("queue")
        for _ in range(5):
            channel.basic_publish("", "queue", b"x")
        count = eventually_equal(lambda: channel.queue_declare("queue", passive=True).method.message_count, 3)
        assert count == 3
        connection.close()
