"""RabbitMQ's definitions document over HTTP (GET/POST /api/definitions): exported by
RabbitMQ 3.10, imported into leveret, exported again and imported back into RabbitMQ,
with users logging in with their passwords at every step."""

from __future__ import annotations

import pika
import pytest
from targets import Target, unique

from leveret import BlockingBroker


@pytest.fixture
def leveret():
    with BlockingBroker(amqp_port=0, http_port=0) as broker:
        assert broker.broker.management is not None
        yield Target("leveret", broker.broker.host, broker.amqp_port, broker.broker.management.port)


def define(target: Target, vhost: str, user: str) -> None:
    """A vhost, a user with a permission and a topic permission, and a durable exchange,
    queue (with arguments) and binding."""
    assert target.http("PUT", f"/api/vhosts/{vhost}")[0] in (201, 204)
    target.http("PUT", f"/api/users/{user}", {"password": "s3cret", "tags": "monitoring"})
    target.http("PUT", f"/api/permissions/{vhost}/{user}", {"configure": "^o", "write": ".*", "read": ".*"})
    target.http("PUT", f"/api/topic-permissions/{vhost}/{user}", {"exchange": "amq.topic", "write": "^a",
                                                                   "read": ".*"})
    with target.amqp(vhost=vhost) as connection:
        channel = connection.channel()
        channel.exchange_declare("orders", "topic", durable=True)
        channel.queue_declare("orders.eu", durable=True, arguments={"x-max-length": 1000})
        channel.queue_bind("orders.eu", "orders", "eu.#")
        channel.queue_declare("scratch")  # transient: exported too, as RabbitMQ does


def check(target: Target, vhost: str, user: str) -> None:
    """The definitions work: the user logs in with the password and publishes through
    the binding."""
    with target.amqp(user, "s3cret", vhost) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish("orders", "eu.fr", b"routed")
        assert channel.queue_declare("orders.eu", passive=True).method.message_count == 1
        channel.queue_purge("orders.eu")
    assert target.http("GET", f"/api/permissions/{vhost}/{user}")[1]["configure"] == "^o"


def test_an_export_holds_durable_things_and_password_hashes(target, leveret):
    vhost, user = unique("v"), unique("u")
    define(target, vhost, user)
    try:
        status, document = target.http("GET", "/api/definitions")
        assert status == 200
        assert {"users", "vhosts", "permissions", "topic_permissions", "policies", "queues", "exchanges",
                "bindings"} <= set(document)
        mine = next(u for u in document["users"] if u["name"] == user)
        assert (mine["hashing_algorithm"] == "rabbit_password_hashing_sha256"
                and mine["tags"] == ["monitoring"])
        queues = {(q["vhost"], q["name"]): q["durable"] for q in document["queues"]}
        assert queues[(vhost, "orders.eu")] is True and queues[(vhost, "scratch")] is False
        assert {"source": "orders", "vhost": vhost, "destination": "orders.eu", "destination_type": "queue",
                "routing_key": "eu.#", "arguments": {}} in document["bindings"]
    finally:
        target.http("DELETE", f"/api/vhosts/{vhost}")
        target.http("DELETE", f"/api/users/{user}")


def test_definitions_travel_rabbitmq_to_leveret_and_back(rabbitmq_target, leveret):
    rabbitmq = rabbitmq_target
    vhost, user = unique("v"), unique("u")
    define(rabbitmq, vhost, user)
    try:
        exported = rabbitmq.http("GET", "/api/definitions")[1]
        assert leveret.http("POST", "/api/definitions", exported) == (204, None)
        check(leveret, vhost, user)
        again = leveret.http("GET", "/api/definitions")[1]
        rabbitmq.http("DELETE", f"/api/vhosts/{vhost}")
        rabbitmq.http("DELETE", f"/api/users/{user}")
        status, body = rabbitmq.http("POST", "/api/definitions", again)
        assert status in (201, 204), body
        check(rabbitmq, vhost, user)
    finally:
        rabbitmq.http("DELETE", f"/api/vhosts/{vhost}")
        rabbitmq.http("DELETE", f"/api/users/{user}")


def test_a_malformed_document_changes_nothing(leveret):
    document = {"users": [{"name": "dave", "password_hash": "", "tags": []}],
                "permissions": [{"user": "dave", "vhost": "/", "configure": "(", "write": "", "read": ""}]}
    status, body = leveret.http("POST", "/api/definitions", document)
    assert status == 400 and "configure" in body["reason"]
    assert leveret.http("GET", "/api/users/dave")[0] == 404
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        leveret.amqp("dave", "")


@pytest.mark.parametrize("definition", [{"consumer-timeout-mode": "sometimes"},
                                        {"stream-filter-size-bytes": 5}, {"max-length": "abc"}])
def test_a_policy_with_a_bad_value_is_refused_and_changes_nothing(leveret, definition):
    """Checked as PUT /api/policies checks it: stored, such a policy would make every
    queue it matches fail to declare, and a durable one fail to recover."""
    document = {"users": [{"name": "erin", "password_hash": "", "tags": []}],
                "policies": [{"vhost": "/", "name": "bad", "pattern": ".*", "apply-to": "queues",
                              "definition": definition, "priority": 0}]}
    status, body = leveret.http("POST", "/api/definitions", document)
    assert status == 400 and "bad" in body["reason"]
    assert leveret.http("GET", "/api/policies/%2F/bad")[0] == 404
    assert leveret.http("GET", "/api/users/erin")[0] == 404
