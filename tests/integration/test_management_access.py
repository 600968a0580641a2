"""The management API's users, permissions, topic permissions and vhosts, and who may
call what (tags), as RabbitMQ 3.10's management plugin answers: every test runs against
leveret and a RabbitMQ node (when installed) with the same HTTP calls and expects the
same statuses and bodies, read from RabbitMQ 3.10.8."""

from __future__ import annotations

import pytest
from targets import Target, unique

NOT_FOUND = {"error": "Object Not Found", "reason": "Not Found"}
NOT_MANAGEMENT = {"error": "not_authorised", "reason": "Not management user"}
NOT_ADMIN = {"error": "not_authorised", "reason": "Not administrator user"}
FULL = {"configure": ".*", "write": ".*", "read": ".*"}


@pytest.fixture
def names(target: Target):
    """Unique names for users and vhosts this test makes; removed afterwards."""
    made: list[str] = []

    def name(prefix: str) -> str:
        made.append(unique(prefix))
        return made[-1]

    yield name
    for thing in made:
        target.http("DELETE", f"/api/users/{thing}")
        target.http("DELETE", f"/api/vhosts/{thing}")


def test_users_are_created_replaced_read_and_deleted(target, names):
    user = names("u")
    assert target.http("PUT", f"/api/users/{user}", {"password": "pw", "tags": "administrator,monitoring"}) \
        == (201, None)
    status, body = target.http("GET", f"/api/users/{user}")
    assert status == 200
    assert set(body) == {"name", "password_hash", "hashing_algorithm", "tags", "limits"}
    assert (body["name"], body["hashing_algorithm"], body["tags"], body["limits"]) == \
        (user, "rabbit_password_hashing_sha256", ["administrator", "monitoring"], {})
    assert target.http("PUT", f"/api/users/{user}", {"password": "pw2", "tags": ["management", "x"]}) \
        == (204, None)
    assert target.http("GET", f"/api/users/{user}")[1]["tags"] == ["management", "x"]
    assert user in [u["name"] for u in target.http("GET", "/api/users")[1]]
    assert target.http("DELETE", f"/api/users/{user}") == (204, None)
    assert target.http("GET", f"/api/users/{user}") == (404, NOT_FOUND)
    assert target.http("DELETE", f"/api/users/{user}") == (404, NOT_FOUND)


def test_bad_user_bodies_are_refused(target, names):
    user = names("u")
    assert target.http("PUT", f"/api/users/{user}", {"password": "x"}) == \
        (400, {"error": "bad_request", "reason": "tags_not_present"})
    assert target.http("PUT", f"/api/users/{user}", {"password_hash": "zzz", "tags": ""}) == \
        (400, {"error": "bad_request", "reason": ["not_base64", "zzz"]})
    assert target.http("GET", f"/api/users/{user}") == (404, NOT_FOUND)


def test_a_password_hash_made_by_rabbitmq_logs_in(target, names):
    """A hash given as password_hash (RabbitMQ's scheme: salted SHA-256) logs in."""
    vhost, user = names("v"), names("u")
    known = "Rg7zqF0qkYPq3sE7W3ZuOW+BvBZVuYI399YVWj1e1OYfAGuW"  # "pw", hashed by RabbitMQ 3.10.8
    assert target.http("PUT", f"/api/vhosts/{vhost}")[0] == 201
    assert target.http("PUT", f"/api/users/{user}", {"password_hash": known, "tags": ""})[0] == 201
    assert target.http("PUT", f"/api/permissions/{vhost}/{user}", FULL)[0] == 201
    target.amqp(user, "pw", vhost).close()
    assert target.http("GET", f"/api/users/{user}")[1]["password_hash"] == known


@pytest.mark.parametrize("body", [{}, {"password_hash": ""}, {"password": ""}],
                         ids=["none", "no-hash", "blank"])
def test_a_user_without_a_password_cannot_log_in(target, names, body):
    user = names("u")
    assert target.http("PUT", f"/api/users/{user}", {**body, "tags": "management"}) == (201, None)
    assert target.http("GET", "/api/whoami", user=user, password="") == \
        (401, {"error": "not_authorized", "reason": "Login failed"})


def test_permissions_are_set_read_and_cleared(target, names):
    vhost, user = names("v"), names("u")
    target.http("PUT", f"/api/vhosts/{vhost}")
    target.http("PUT", f"/api/users/{user}", {"password": "pw", "tags": ""})
    path = f"/api/permissions/{vhost}/{user}"
    assert target.http("GET", path) == (404, NOT_FOUND)
    assert target.http("PUT", path, {"configure": ""}) == \
        (400, {"error": "bad_request", "reason": "[{key_missing,write},{key_missing,read}]"})
    assert target.http("PUT", path, {"configure": "", "write": "^w", "read": ".*"}) == (201, None)
    assert target.http("PUT", path, {"configure": "", "write": "^w", "read": ".*"}) == (204, None)
    row = {"user": user, "vhost": vhost, "configure": "", "write": "^w", "read": ".*"}
    assert target.http("GET", path) == (200, row)
    assert row in target.http("GET", "/api/permissions")[1]
    assert target.http("GET", f"/api/users/{user}/permissions") == (200, [row])
    assert row in target.http("GET", f"/api/vhosts/{vhost}/permissions")[1]
    assert target.http("PUT", f"/api/permissions/{vhost}/nobody-{user}", FULL) == \
        (400, {"error": "bad_request", "reason": "vhost_or_user_not_found"})
    assert target.http("PUT", f"/api/permissions/no-{vhost}/{user}", FULL) == \
        (400, {"error": "bad_request", "reason": "vhost_or_user_not_found"})
    assert target.http("DELETE", path) == (204, None)
    assert target.http("DELETE", path) == (404, NOT_FOUND)


def test_a_new_vhost_gives_its_creator_full_permissions(target, names):
    vhost = names("v")
    assert target.http("PUT", f"/api/vhosts/{vhost}") == (201, None)
    assert target.http("PUT", f"/api/vhosts/{vhost}") == (204, None)
    assert target.http("GET", f"/api/permissions/{vhost}/guest") == \
        (200, {"user": "guest", "vhost": vhost, **FULL})
    assert target.http("GET", f"/api/vhosts/{vhost}")[1]["name"] == vhost


def test_topic_permissions_are_set_read_and_cleared(target, names):
    vhost, user = names("v"), names("u")
    target.http("PUT", f"/api/vhosts/{vhost}")
    target.http("PUT", f"/api/users/{user}", {"password": "pw", "tags": ""})
    path = f"/api/topic-permissions/{vhost}/{user}"
    assert target.http("PUT", path, {"exchange": "amq.topic", "write": ".*"}) == \
        (400, {"error": "bad_request", "reason": "[{key_missing,read}]"})
    body = {"exchange": "amq.topic", "write": "^a", "read": "^r"}
    assert target.http("PUT", path, body) == (201, None)
    assert target.http("PUT", path, body) == (204, None)
    row = {"user": user, "vhost": vhost, **body}
    assert target.http("GET", path) == (200, [row])
    assert target.http("GET", f"/api/users/{user}/topic-permissions") == (200, [row])
    assert row in target.http("GET", "/api/topic-permissions")[1]
    assert target.http("DELETE", path) == (204, None)
    assert target.http("DELETE", path) == (404, NOT_FOUND)


# -- tags: who may call what -------------------------------------------------------------
ROUTES = ["/api/overview", "/api/vhosts", "/api/queues", "/api/whoami", "/api/users", "/api/permissions",
          "/api/users/guest/permissions"]
EXPECTED = {  # tag -> status of each route above, as RabbitMQ 3.10.8 answers
    "": [401] * 7,
    "management": [200, 200, 200, 200, 401, 401, 401],
    "policymaker": [200, 200, 200, 200, 401, 401, 401],
    "monitoring": [200, 200, 200, 200, 401, 401, 401],
    "administrator": [200] * 7,
}


@pytest.mark.parametrize("tag", list(EXPECTED))
def test_tags_decide_which_routes_a_user_may_call(target, names, tag):
    user = names("u")
    target.http("PUT", f"/api/users/{user}", {"password": "pw", "tags": tag})
    for route, expected in zip(ROUTES, EXPECTED[tag]):
        status, body = target.http("GET", route, user=user, password="pw")
        assert status == expected, route
        if status == 401:
            assert body == (NOT_MANAGEMENT if not tag else NOT_ADMIN), route
    if tag:
        assert target.http("GET", "/api/whoami", user=user, password="pw") == (
            200, {"name": user, "tags": [tag]})
    admin = tag == "administrator"
    writes = [("PUT", f"/api/vhosts/{user}", 201), ("DELETE", f"/api/vhosts/{user}", 204),
              ("PUT", f"/api/users/{user}", 204)]
    for method, path, status in writes:
        answer = target.http(method, path, {"password": "pw", "tags": tag}, user=user, password="pw")
        assert answer == ((status, None) if admin else (401, NOT_ADMIN if tag else NOT_MANAGEMENT)), path


def test_management_users_see_only_vhosts_they_have_permissions_in(target, names):
    vhost, other, user, watcher = names("v"), names("v"), names("u"), names("u")
    for v in (vhost, other):
        target.http("PUT", f"/api/vhosts/{v}")
        with target.amqp(vhost=v) as connection:
            connection.channel().queue_declare(f"q-{v}")
    target.http("PUT", f"/api/users/{user}", {"password": "pw", "tags": "management"})
    target.http("PUT", f"/api/users/{watcher}", {"password": "pw", "tags": "monitoring"})
    target.http("PUT", f"/api/permissions/{vhost}/{user}", FULL)
    vhosts = {v["name"] for v in target.http("GET", "/api/vhosts", user=user, password="pw")[1]}
    assert vhost in vhosts and other not in vhosts
    queues = {q["name"] for q in target.http("GET", "/api/queues", user=user, password="pw")[1]}
    assert f"q-{vhost}" in queues and f"q-{other}" not in queues
    # monitoring lists every vhost, yet sees queues only where it has a permission
    listed = {v["name"] for v in target.http("GET", "/api/vhosts", user=watcher, password="pw")[1]}
    assert {vhost, other} <= listed
    assert target.http("GET", "/api/queues", user=watcher, password="pw") == (200, [])
    for who in (user, watcher):
        assert target.http("GET", f"/api/queues/{other}", user=who, password="pw") == \
            (401, {"error": "not_authorised", "reason": "User not authorised to access virtual host"})


def test_a_failed_login_is_401_login_failed(target):
    status, body = target.http("GET", "/api/overview", password="wrong")
    assert (status, body) == (401, {"error": "not_authorized", "reason": "Login failed"})


def test_password_hashes_move_between_rabbitmq_and_leveret(rabbitmq_target):
    """RabbitMQ → leveret → RabbitMQ: a user's password_hash, copied, keeps working."""
    from targets import Target

    from leveret import BlockingBroker

    user = unique("u")
    rabbitmq = rabbitmq_target
    try:
        rabbitmq.http("PUT", f"/api/users/{user}", {"password": "s3cret", "tags": ""})
        rabbitmq.http("PUT", f"/api/permissions/%2F/{user}", FULL)
        made_by_rabbitmq = rabbitmq.http("GET", f"/api/users/{user}")[1]["password_hash"]
        with BlockingBroker(amqp_port=0, http_port=0) as broker:
            assert broker.broker.management is not None
            leveret = Target("leveret", broker.broker.host, broker.amqp_port, broker.broker.management.port)
            for made_by in (made_by_rabbitmq, None):
                body = ({"password_hash": made_by, "tags": ""} if made_by
                        else {"password": "s3cret", "tags": ""})
                leveret.http("PUT", f"/api/users/{user}", body)
                leveret.http("PUT", f"/api/permissions/%2F/{user}", FULL)
                leveret.amqp(user, "s3cret").close()
            made_by_leveret = leveret.http("GET", f"/api/users/{user}")[1]["password_hash"]
        assert made_by_leveret != made_by_rabbitmq  # a fresh salt
        rabbitmq.http("PUT", f"/api/users/{user}", {"password_hash": made_by_leveret, "tags": ""})
        rabbitmq.amqp(user, "s3cret").close()
    finally:
        rabbitmq.http("DELETE", f"/api/users/{user}")
