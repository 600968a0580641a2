"""Passwords and permission checks, in core alone (the login throttle: test_login_throttle.py)."""

from __future__ import annotations

import base64
import hashlib

import pytest

from leveret.core import passwords
from leveret.core.access import Access
from leveret.core.auth import AuthenticationError, Permission, TopicPermission, User, UserDatabase, matches
from leveret.core.errors import BrokerError

# "pw" hashed by RabbitMQ 3.10.8 (rabbit_password_hashing_sha256), from GET /api/users/bob
RABBITMQ_HASH = "Rg7zqF0qkYPq3sE7W3ZuOW+BvBZVuYI399YVWj1e1OYfAGuW"


# -- passwords ------------------------------------------------------------------------
def test_a_hash_made_by_rabbitmq_checks_and_ours_has_its_shape():
    assert passwords.check_password("pw", RABBITMQ_HASH)
    assert not passwords.check_password("pW", RABBITMQ_HASH)
    ours = passwords.hash_password("pw")
    raw = base64.b64decode(ours)
    assert len(raw) == 4 + 32 and raw[4:] == hashlib.sha256(raw[:4] + b"pw").digest()
    assert ours != passwords.hash_password("pw")  # a fresh salt each time
    passwords.validate(ours, passwords.SHA256)


@pytest.mark.parametrize("algorithm", [passwords.SHA256, passwords.SHA512, passwords.MD5])
def test_every_rabbitmq_algorithm_round_trips(algorithm):
    made = passwords.hash_password("s3cret ü", algorithm)
    passwords.validate(made, algorithm)
    assert passwords.check_password("s3cret ü", made, algorithm)
    assert not passwords.check_password("s3cret u", made, algorithm)


@pytest.mark.parametrize("password_hash, algorithm", [
    ("zzz", passwords.SHA256),  # not base64
    (RABBITMQ_HASH, passwords.SHA512),  # the wrong length for the algorithm
    (RABBITMQ_HASH, "rabbit_password_hashing_rot13"),
])
def test_malformed_hashes_are_refused_and_never_match(password_hash, algorithm):
    with pytest.raises(passwords.HashError):
        passwords.validate(password_hash, algorithm)
    assert not passwords.check_password("pw", password_hash, algorithm)


def test_blank_passwords_and_unknown_users_are_refused_alike():
    users = UserDatabase([User("nopw", passwords.hash_password(""))], loopback_users=[])
    for name, password in (("nopw", ""), ("nobody", "x")):
        with pytest.raises(AuthenticationError, match="Login was refused using authentication mechanism"):
            users.authenticate(name, password, from_loopback=True)


# -- permission checks ----------------------------------------------------------------
def access(permission: Permission | None, topics: tuple[TopicPermission, ...] = ()) -> Access:
    users = UserDatabase([User.with_password("bob", "pw")], loopback_users=[])
    if permission is not None:
        users.permissions[("/", "bob")] = permission
    for topic in topics:
        users.topic_permissions[("/", "bob", topic.exchange)] = topic
    return Access(users, users.users["bob"], "/")


def refused_text(check, *args) -> str:
    with pytest.raises(BrokerError) as caught:
        check(*args)
    assert caught.value.condition == "access_refused"
    return caught.value.text


def test_expressions_are_searched_unanchored_and_empty_means_nothing():
    assert matches("bob", "the-bob-queue") and matches(".*", "") and not matches("^bob", "the-bob")
    assert not matches("", "anything") and matches("", "")  # RabbitMQ reads "" as ^$
    assert not matches("(", "(")  # an invalid expression allows nothing


def test_the_default_exchange_is_checked_as_amq_default():
    checks = access(Permission(write="^amq\\.default$"))
    checks.publish("")
    assert refused_text(checks.publish, "amq.direct") == \
        "access to exchange 'amq.direct' in vhost '/' refused for user 'bob'"
    assert refused_text(access(Permission(write="^$")).write, "exchange", "") == \
        "access to exchange 'amq.default' in vhost '/' refused for user 'bob'"


def test_no_permission_refuses_everything():
    checks = access(None)
    for check in (checks.configure, checks.write, checks.read):
        assert "refused for user 'bob'" in refused_text(check, "queue", "q")


def test_a_cached_publish_check_is_redone_after_a_change():
    checks = access(Permission())
    checks.publish("x")
    checks.users.permissions[("/", "bob")] = Permission(write="^$")
    checks.publish("x")  # nothing changed as far as the database knows: cached
    checks.users.changed()
    assert "exchange 'x'" in refused_text(checks.publish, "x")


def test_topic_permissions_expand_username_and_vhost():
    checks = access(Permission(), (TopicPermission("amq.topic", write="^{username}\\.{vhost}", read="^r"),))
    checks.topic("write", "amq.topic", "bob./.x")
    checks.topic("write", "other.topic", "anything")  # no topic permission there: allowed
    assert refused_text(checks.topic, "write", "amq.topic", "alice./") == \
        "access to topic 'alice./' in exchange 'amq.topic' in vhost '/' refused for user 'bob'"
    assert "topic 'x'" in refused_text(checks.topic, "read", "amq.topic", "x")


def test_topic_permissions_expand_the_connections_variables_escaped():
    """``{client_id}`` (an MQTT connection's) expanded with its regular-expression
    characters escaped, as RabbitMQ since CVE-2026-44838; unknown names stay as written."""
    topics = (TopicPermission("amq.topic", write="^dev\\.{client_id}\\.", read="^{client_id}$"),)
    users = access(Permission(), topics).users
    mqtt = Access(users, users.users["bob"], "/", {"client_id": "sensor-1"})
    mqtt.topic("write", "amq.topic", "dev.sensor-1.temp")
    assert "refused" in refused_text(mqtt.topic, "write", "amq.topic", "dev.sensor-2.temp")
    dotted = Access(users, users.users["bob"], "/", {"client_id": "a.b"})
    dotted.topic("read", "amq.topic", "a.b")
    assert "refused" in refused_text(dotted.topic, "read", "amq.topic", "aXb")  # "." is no regex dot
    wild = Access(users, users.users["bob"], "/", {"client_id": ".*"})
    assert "refused" in refused_text(wild.topic, "read", "amq.topic", "anything")
    amqp = Access(users, users.users["bob"], "/")  # no client id: "{client_id}" stays
    assert "refused" in refused_text(amqp.topic, "write", "amq.topic", "dev.sensor-1.temp")
