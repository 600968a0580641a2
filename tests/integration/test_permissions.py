"""Users, permissions and topic permissions as RabbitMQ 3.10 enforces them, over AMQP
(pika) and the management HTTP API. Every test runs against leveret and against a
RabbitMQ node (when installed, see targets.py) with the same calls and expects the same
answers: statuses, bodies, reply codes and texts, read from RabbitMQ 3.10.8."""

from __future__ import annotations

import base64
import http.client
import json
import re

import pika
import pytest
from amqp_raw import PLAIN_GUEST, RawClient
from pamqp import commands
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker, ProbableAccessDeniedError
from targets import Target, grant, new_account, unique


@pytest.fixture
def account(target: Target):
    """A fresh vhost and a user ``name``/``pw`` with no permissions yet (targets.new_account)."""
    with new_account(target, "vh", "user") as names:
        yield names


def refusal(target: Target, vhost: str, user: str, operation) -> str | None:
    """Run ``operation(channel)`` as ``user``; None if it worked, else the reply code
    and text of the channel.close it got."""
    connection = target.amqp(user, "pw", vhost)
    try:
        operation(connection.channel())
    except ChannelClosedByBroker as exc:
        return f"{exc.reply_code} {exc.reply_text}"
    finally:
        if connection.is_open:
            connection.close()
    return None


def refused(kind: str, name: str, vhost: str, user: str) -> str:
    return f"403 ACCESS_REFUSED - access to {kind} '{name}' in vhost '{vhost}' refused for user '{user}'"


# -- AMQP: which operation needs which permission -------------------------------------
def test_configure_permission_governs_declare_and_delete(target, account):
    vhost, user = account
    grant(target, vhost, user, configure="^mine")
    with target.amqp(vhost=vhost) as admin:  # guest makes what the user may not
        channel = admin.channel()
        channel.queue_declare("theirs")
        channel.exchange_declare("theirs.x", "direct")
    assert refusal(target, vhost, user, lambda ch: ch.queue_declare("mine.q")) is None
    assert refusal(target, vhost, user, lambda ch: ch.exchange_declare("mine.x", "fanout")) is None
    assert refusal(target, vhost, user, lambda ch: ch.queue_declare("theirs")) == \
        refused("queue", "theirs", vhost, user)
    assert refusal(target, vhost, user, lambda ch: ch.exchange_declare("x2", "direct")) == \
        refused("exchange", "x2", vhost, user)
    assert refusal(target, vhost, user, lambda ch: ch.queue_delete("theirs")) == \
        refused("queue", "theirs", vhost, user)
    assert refusal(target, vhost, user, lambda ch: ch.exchange_delete("theirs.x")) == \
        refused("exchange", "theirs.x", vhost, user)
    # a server-named queue is checked under the name the broker gives it
    text = refusal(target, vhost, user, lambda ch: ch.queue_declare(""))
    assert re.fullmatch(refused("queue", "amq\\.gen-[A-Za-z0-9_-]{22}", vhost, user), text)
    # a passive declare checks existence only
    assert refusal(target, vhost, user, lambda ch: ch.queue_declare("theirs", passive=True)) is None
    assert refusal(target, vhost, user, lambda ch: ch.queue_declare("none", passive=True)) == \
        f"404 NOT_FOUND - no queue 'none' in vhost '{vhost}'"


def test_a_dead_letter_exchange_needs_write_on_it_and_read_on_the_queue(target, account):
    vhost, user = account
    grant(target, vhost, user, write="^mine")
    declare = lambda ch: ch.queue_declare("mine.q", arguments={"x-dead-letter-exchange": "dlx"})  # noqa: E731
    assert refusal(target, vhost, user, declare) == refused("exchange", "dlx", vhost, user)
    grant(target, vhost, user, write="^(mine|dlx)", read="^other")
    assert refusal(target, vhost, user, declare) == refused("queue", "mine.q", vhost, user)
    grant(target, vhost, user)
    assert refusal(target, vhost, user, declare) is None


def test_write_permission_governs_publish_and_binding_destinations(target, account):
    vhost, user = account
    grant(target, vhost, user, write="^mine")
    with target.amqp(vhost=vhost) as admin:
        admin.channel().queue_declare("theirs")
    publish = lambda exchange: lambda ch: ch.basic_publish(exchange, "k", b"x") or ch.queue_declare(  # noqa: E731
        "mine.sync", passive=False)
    assert refusal(target, vhost, user, lambda ch: ch.queue_declare("mine.sync")) is None
    # the default exchange is checked as amq.default
    assert refusal(target, vhost, user, publish("")) == refused("exchange", "amq.default", vhost, user)
    assert refusal(target, vhost, user, publish("amq.fanout")) == \
        refused("exchange", "amq.fanout", vhost, user)
    assert refusal(target, vhost, user, lambda ch: ch.queue_bind("theirs", "amq.direct", "k")) == \
        refused("queue", "theirs", vhost, user)
    grant(target, vhost, user, write="^(mine|amq\\.default)")
    assert refusal(target, vhost, user, publish("")) is None


def test_read_permission_governs_consume_get_purge_and_binding_sources(target, account):
    vhost, user = account
    grant(target, vhost, user, read="^mine")
    with target.amqp(vhost=vhost) as admin:
        channel = admin.channel()
        channel.queue_declare("theirs")
        channel.queue_declare("mine.q")
    for operation in (lambda ch: ch.basic_get("theirs"), lambda ch: ch.queue_purge("theirs"),
                      lambda ch: ch.basic_consume("theirs", lambda *a: None)):
        assert refusal(target, vhost, user, operation) == refused("queue", "theirs", vhost, user)
    assert refusal(target, vhost, user, lambda ch: ch.basic_get("mine.q")) is None
    assert refusal(target, vhost, user, lambda ch: ch.queue_bind("mine.q", "amq.direct", "k")) == \
        refused("exchange", "amq.direct", vhost, user)


def test_a_vhost_needs_a_permission_to_be_opened(target, account):
    vhost, user = account
    for where, text in ((vhost, f"NOT_ALLOWED - access to vhost '{vhost}' refused for user '{user}'"),
                        ("no-such-vhost", "NOT_ALLOWED - vhost no-such-vhost not found")):
        with pytest.raises(ProbableAccessDeniedError) as caught:
            target.amqp(user, "pw", where)
        assert f"(530) {text!r}" in str(caught.value) or f'(530) "{text}"' in str(caught.value)
    grant(target, vhost, user)
    target.amqp(user, "pw", vhost).close()


def test_topic_permissions_limit_routing_keys_of_a_topic_exchange(target, account):
    vhost, user = account
    grant(target, vhost, user)
    status, _ = target.http("PUT", f"/api/topic-permissions/{vhost}/{user}",
                            {"exchange": "amq.topic", "write": "^{username}\\.", "read": "^r\\."})
    assert status == 201
    with target.amqp(user, "pw", vhost) as connection:
        channel = connection.channel()
        channel.queue_declare("q")
        channel.queue_bind("q", "amq.topic", "r.#")
        channel.basic_publish("amq.topic", f"{user}.x", b"allowed")
        channel.basic_publish("amq.direct", "anything", b"no topic rules on a direct exchange")
        assert channel.queue_declare("q", passive=True).method.message_count == 0
    topic = lambda key: f"403 ACCESS_REFUSED - access to topic '{key}' in exchange 'amq.topic' in vhost " \
                        f"'{vhost}' refused for user '{user}'"  # noqa: E731
    assert refusal(target, vhost, user, lambda ch: ch.basic_publish("amq.topic", "b.x", b"x")
                   or ch.queue_declare("q", passive=True)) == topic("b.x")
    assert refusal(target, vhost, user, lambda ch: ch.queue_bind("q", "amq.topic", "x.y")) == topic("x.y")
    assert target.http("DELETE", f"/api/topic-permissions/{vhost}/{user}")[0] == 204
    assert refusal(target, vhost, user, lambda ch: ch.queue_bind("q", "amq.topic", "x.y")) is None


def test_permissions_changed_at_run_time_apply_to_open_channels(target, account):
    vhost, user = account
    grant(target, vhost, user)
    with target.amqp(user, "pw", vhost) as connection:
        channel = connection.channel()
        channel.queue_declare("q1")
        grant(target, vhost, user, configure="^$")
        with pytest.raises(ChannelClosedByBroker) as caught:
            channel.queue_declare("q2")
        assert caught.value.reply_code == 403


def test_deleting_a_vhost_closes_its_connections(target):
    vhost = unique("vh")
    assert target.http("PUT", f"/api/vhosts/{vhost}")[0] == 201
    connection = target.amqp(vhost=vhost)
    connection.channel().queue_declare("q")
    assert target.http("DELETE", f"/api/vhosts/{vhost}")[0] == 204
    with pytest.raises(ConnectionClosedByBroker) as caught:
        for _ in range(50):
            connection.process_data_events(0.1)
    deleted = (320, f"CONNECTION_FORCED - vhost '{vhost}' is deleted")
    # RabbitMQ says "is down" when its vhost supervisor stops before the deletion notice
    down = (320, f"CONNECTION_FORCED - vhost '{vhost}' is down")
    assert (caught.value.reply_code, caught.value.reply_text) in \
        ({deleted} if target.name == "leveret" else {deleted, down})
    assert target.http("GET", f"/api/vhosts/{vhost}")[0] == 404
    assert target.http("DELETE", f"/api/vhosts/{vhost}") == (404, {"error": "Object Not Found",
                                                                  "reason": "Not Found"})


def test_a_deleted_user_can_no_longer_log_in(target, account):
    vhost, user = account
    grant(target, vhost, user)
    target.amqp(user, "pw", vhost).close()
    assert target.http("DELETE", f"/api/users/{user}")[0] == 204
    with pytest.raises((ProbableAccessDeniedError, pika.exceptions.ProbableAuthenticationError)):
        target.amqp(user, "pw", vhost)


def test_purging_over_http_needs_read_on_the_queue(target, account):
    """The management API purges as the user does over AMQP."""
    vhost, user = account
    grant(target, vhost, user, read="^mine")
    target.http("PUT", f"/api/users/{user}", {"password": "pw", "tags": "management"})
    with target.amqp(vhost=vhost) as admin:
        admin.channel().queue_declare("theirs")
    assert target.http("DELETE", f"/api/queues/{vhost}/theirs/contents", user=user, password="pw") == \
        (401, {"error": "not_authorised", "reason": "Access refused."})


# -- guest only from loopback ---------------------------------------------------------
def http_from(target: Target, source: str, path: str, user: str, password: str) -> tuple[int, object]:
    connection = http.client.HTTPConnection(target.host, target.http_port, timeout=10,
                                            source_address=(source, 0))
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    try:
        connection.request("GET", path, headers={"Authorization": f"Basic {token}"})
        response = connection.getresponse()
        return response.status, json.loads(response.read() or b"null")
    finally:
        connection.close()


def guest_login_from(target: Target, source: str) -> object:
    """What a PLAIN guest/guest start-ok sent from ``source`` gets: tune or close."""
    with RawClient(target.amqp_port, target.host, source=source) as client:
        client.send(b"AMQP\x00\x00\x09\x01")
        client.expect(commands.Connection.Start, 0)
        client.send_method(0, commands.Connection.StartOk(
            client_properties={}, mechanism="PLAIN", response=PLAIN_GUEST, locale="en_US"))
        return client.read_frame()[1]


def test_guest_is_refused_from_another_host_over_amqp_and_http(target, account, other_host):
    """RabbitMQ's ``loopback_users``: guest logs in from loopback only (over a real TCP
    connection from a non-loopback address of this machine to 127.0.0.1)."""
    answer = guest_login_from(target, other_host)
    if target.name == "rabbitmq":
        # RabbitMQ 3.10 asks where the connection arrived (127.0.0.1), not where it came
        # from, so this one gets in; leveret asks the peer's address, as RabbitMQ's HTTP
        # API does, which also holds when a NAT rule forwards a remote peer to 127.0.0.1.
        assert isinstance(answer, commands.Connection.Tune)
    else:
        assert isinstance(answer, commands.Connection.Close)
        assert (answer.reply_code, answer.reply_text) == (
            403, "ACCESS_REFUSED - user 'guest' can only connect via localhost")
    assert http_from(target, other_host, "/api/whoami", "guest", "guest") == (
        401, {"error": "not_authorised", "reason": "User can only log in via localhost"})
    # another user, with the same rights, logs in from there
    vhost, user = account
    grant(target, vhost, user)
    target.http("PUT", f"/api/users/{user}", {"password": "pw", "tags": "administrator"})
    with RawClient(target.amqp_port, target.host, source=other_host) as client:
        client.handshake(channel_max=2047, frame_max=131072, vhost=vhost, response=f"\x00{user}\x00pw")
    status, body = http_from(target, other_host, "/api/whoami", user, "pw")
    assert status == 200 and body["name"] == user
