"""Federation definitions over HTTP, as RabbitMQ 3.10 with ``rabbitmq_federation``
takes them: ``federation-upstream`` and ``federation-upstream-set`` runtime
parameters, the policy keys that apply them, definitions export/import, and removal
with their vhost."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from targets import Target

from leveret import BlockingBroker

UPSTREAM = {"uri": "amqp://guest:guest@127.0.0.1:1", "max-hops": 2, "ack-mode": "on-publish"}


@pytest.fixture
def target() -> Iterator[Target]:
    with BlockingBroker(amqp_port=0, http_port=0) as broker:
        yield Target.of(broker)


def test_upstreams_and_sets_are_stored_listed_and_deleted(target):
    assert target.http("PUT", "/api/parameters/federation-upstream/%2F/up", {"value": UPSTREAM})[0] == 201
    assert target.http("PUT", "/api/parameters/federation-upstream/%2F/up", {"value": UPSTREAM})[0] == 204
    the_set = [{"upstream": "up", "max-hops": 3}]
    assert target.http("PUT", "/api/parameters/federation-upstream-set/%2F/s", {"value": the_set})[0] == 201
    rows = target.http("GET", "/api/parameters/federation-upstream")[1]
    assert rows == [{"component": "federation-upstream", "vhost": "/", "name": "up", "value": UPSTREAM}]
    assert target.http("GET", "/api/parameters/federation-upstream-set/%2F/s")[1]["value"] == the_set
    assert target.http("DELETE", "/api/parameters/federation-upstream/%2F/up")[0] == 204
    assert target.http("DELETE", "/api/parameters/federation-upstream/%2F/up")[0] == 404


@pytest.mark.parametrize(
    ("component", "value", "reason"),
    [
        ("federation-upstream", {"max-hops": 1}, 'Key "uri" not found in bad'),
        ("federation-upstream", {"uri": "http://x"}, "not a valid URI"),
        ("federation-upstream", {"uri": "amqp://x", "prefetch-count": "lots"}, "prefetch-count"),
        ("federation-upstream-set", {"upstream": "up"}, "list"),
        ("federation-upstream", {"uri": "amqp://x", "bogus": 1},
         'Unrecognised terms [{&lt;&lt;"bogus"&gt;&gt;,1}] in bad'),
    ],
)
def test_a_bad_definition_gets_rabbitmqs_400(target, component, value, reason):
    status, body = target.http("PUT", f"/api/parameters/{component}/%2F/bad", {"value": value})
    assert status == 400 and body["error"] == "bad_request"
    assert body["reason"].startswith("Validation failed") and reason in body["reason"]
    assert target.http("GET", "/api/parameters")[1] == []


def test_a_policy_takes_one_federation_key_as_a_string(target):
    put = lambda definition: target.http(  # noqa: E731
        "PUT", "/api/policies/%2F/fed", {"pattern": "^fed", "definition": definition}
    )
    assert put({"federation-upstream-set": "all"})[0] == 201
    assert put({"federation-upstream": "up"})[0] == 204
    status, body = put({"federation-upstream": "up", "federation-upstream-set": "all"})
    assert status == 400
    assert "cannot specify federation-upstream, federation-upstream-set or" in body["reason"]
    status, body = put({"federation-upstream": 7})
    assert status == 400 and "7 is not a valid federation upstream name" in body["reason"]


def test_definitions_carry_federation_parameters_and_their_vhost_takes_them_away(target):
    assert target.http("PUT", "/api/vhosts/site", {})[0] == 201
    assert target.http("PUT", "/api/parameters/federation-upstream/site/up", {"value": UPSTREAM})[0] == 201
    the_set = [{"upstream": "up"}]
    assert target.http("PUT", "/api/parameters/federation-upstream-set/site/s", {"value": the_set})[0] == 201
    document = target.http("GET", "/api/definitions")[1]
    exported = [p for p in document["parameters"] if p["component"].startswith("federation")]
    names = {(p["component"], p["name"]) for p in exported}
    assert names == {("federation-upstream", "up"), ("federation-upstream-set", "s")}
    with BlockingBroker(amqp_port=0, http_port=0) as other:
        fresh = Target.of(other)
        assert fresh.http("POST", "/api/definitions", document)[0] in (200, 201, 204)
        assert fresh.http("GET", "/api/parameters/federation-upstream/site/up")[1]["value"] == UPSTREAM
        assert fresh.http("GET", "/api/parameters/federation-upstream-set/site/s")[1]["value"] == the_set
    assert target.http("DELETE", "/api/vhosts/site")[0] == 204
    assert target.http("GET", "/api/parameters")[1] == []


@pytest.mark.parametrize(
    ("component", "value"),
    [
        ("federation-upstream", {"uri": "http://nowhere"}),
        ("federation-upstream", {"uri": "amqp://h", "ack-mode": "sometimes"}),
        ("federation-upstream-set", {"upstream": "up"}),
    ],
)
def test_definitions_with_an_invalid_federation_parameter_are_refused_whole(target, component, value):
    """As RabbitMQ's import, which validates each parameter as its PUT does: nothing of
    the document is imported (the vhost included)."""
    document = {
        "vhosts": [{"name": "imported"}],
        "parameters": [{"vhost": "imported", "component": component, "name": "bad", "value": value}],
    }
    status, _ = target.http("POST", "/api/definitions", document)
    assert status == 400
    assert target.http("GET", f"/api/parameters/{component}/imported/bad")[0] == 404
    assert target.http("GET", "/api/vhosts/imported")[0] == 404
