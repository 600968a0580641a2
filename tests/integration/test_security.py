"""leveret's own guards, beyond RabbitMQ's rules (those are in test_permissions.py and
test_management_access.py): failed logins slowed down and logged without the secret,
the HTTP API's Host check and security headers, and users and permissions that live in
the store (hashed), win over the config file once stored, and survive restarts."""

from __future__ import annotations

import asyncio
import logging
import time

import pika
import pytest
from amqp_raw import PLAIN_GUEST, RawClient
from pamqp import commands
from servers import ServerProcess
from targets import Target

from leveret import BlockingBroker
from leveret.core.login_throttle import ThrottleSettings
from leveret.store.sqlite import SQLiteStore


def refused_after(port: int, password: str) -> float:
    """Seconds from a PLAIN start-ok with ``password`` to its connection.close 403."""
    with RawClient(port) as client:
        client.send(b"AMQP\x00\x00\x09\x01")
        client.expect(commands.Connection.Start, 0)
        started = time.monotonic()
        client.send_method(0, commands.Connection.StartOk(
            client_properties={}, mechanism="PLAIN", response=f"\x00guest\x00{password}", locale="en_US"))
        close = client.expect_connection_close()
        assert close.reply_code == 403
        return time.monotonic() - started


def test_failed_logins_from_one_address_are_answered_later_and_logged_without_the_secret(caplog):
    caplog.set_level(logging.WARNING, "leveret.amqp")
    defaults = ThrottleSettings()
    burst, interval = defaults.address_burst, defaults.address_interval
    with BlockingBroker(amqp_port=0) as broker:
        delays = [refused_after(broker.amqp_port, "not-the-password") for _ in range(burst + 1)]
        assert max(delays[:burst]) < interval / 2  # the burst is answered at once ...
        assert delays[burst] >= interval * 0.9  # ... then one refusal per interval
        # a right password is answered at once all the same (the penalty is for failures)
        started = time.monotonic()
        with RawClient(broker.amqp_port) as client:
            client.handshake(response=PLAIN_GUEST)
        assert time.monotonic() - started < interval / 2
        assert refused_after(broker.amqp_port, "wrong again") >= interval * 0.5  # and wiped nothing
    lines = [r.getMessage() for r in caplog.records if "login refused" in r.getMessage()]
    assert len(lines) == burst + 2
    assert all("user 'guest'" in line and "PLAIN" in line for line in lines)
    assert not any("not-the-password" in r.getMessage() for r in caplog.records)


@pytest.fixture
def http_broker():
    with BlockingBroker(amqp_port=0, http_port=0) as broker:
        assert broker.broker.management is not None
        yield Target("leveret", broker.broker.host, broker.amqp_port, broker.broker.management.port)


def test_the_http_api_answers_only_its_own_host_names(http_broker):
    port = http_broker.http_port
    for host in ("localhost", f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"):
        assert http_broker.http("GET", "/api/whoami", headers={"Host": host})[0] == 200, host
    status, body = http_broker.http("GET", "/api/whoami", headers={"Host": f"evil.example:{port}"})
    assert (status, body) == (400, {"error": "bad_request",
                                    "reason": "Host 'evil.example' is not allowed (http_allowed_hosts)"})


def test_http_answers_carry_security_headers(http_broker, caplog):
    caplog.set_level(logging.WARNING, "leveret.management")
    for password, path, status in (("guest", "/api/whoami", 200), ("nope", "/api/whoami", 401),
                                   ("guest", "/api/queues/%2F/missing", 404)):
        got, _, headers = http_broker.http_raw("GET", path, password=password)
        assert got == status
        assert headers["x-content-type-options"] == "nosniff" and headers["x-frame-options"] == "DENY"
        assert headers["content-security-policy"].startswith("script-src 'self'")
    assert any("HTTP access denied: user 'guest'" in r.getMessage() for r in caplog.records)
    assert not any("nope" in r.getMessage() for r in caplog.records)


CONFIG = """
[[users]]
name = "alice"
password = "from-config"
tags = ["administrator"]
"""


def test_stored_users_win_over_the_config_and_survive_restarts(tmp_path):
    config = tmp_path / "leveret.toml"
    config.write_text(CONFIG)
    args = ("--config", str(config), "--http-port", "0")
    server = ServerProcess(tmp_path / "data", *args)
    try:
        target = Target("leveret", server.host, server.port, int(server.http_url.rsplit(":", 1)[1]))
        assert target.http("PUT", "/api/users/alice", {"password": "changed", "tags": "administrator"},
                           user="alice", password="from-config") == (204, None)
        assert target.http("DELETE", "/api/users/guest", user="alice", password="changed") == (204, None)
        server.terminate()
        server = ServerProcess(tmp_path / "data", *args)
        target = Target("leveret", server.host, server.port, int(server.http_url.rsplit(":", 1)[1]))
        target.amqp("alice", "changed").close()
        for user, password in (("alice", "from-config"), ("guest", "guest")):
            with pytest.raises(pika.exceptions.ProbableAuthenticationError):
                target.amqp(user, password)
        stored = target.http("GET", "/api/users/alice", user="alice", password="changed")[1]
        assert stored["hashing_algorithm"] == "rabbit_password_hashing_sha256"
    finally:
        server.kill()
    text = b"".join(path.read_bytes() for path in (tmp_path / "data").iterdir() if path.is_file())
    assert b"changed" not in text and b"from-config" not in text  # only hashes on disk


def test_users_stored_in_clear_by_an_older_leveret_are_hashed_at_start(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    loop = asyncio.new_event_loop()
    store = SQLiteStore(str(data))
    store.load()
    store.start(loop)
    store.save_definition("user", "", "old", {"password": "plain", "vhosts": ["/"], "tags": []})
    written = loop.create_future()
    store.when_durable(written.set_result)
    assert loop.run_until_complete(asyncio.wait_for(written, 10))
    store.close()
    loop.close()
    server = ServerProcess(data)
    try:
        pika.BlockingConnection(pika.URLParameters(f"amqp://old:plain@{server.host}:{server.port}/%2F")).close()
    finally:
        server.kill()
    store = SQLiteStore(str(data))
    try:
        rows = {name: row for _, name, row in store.load().definitions["user"]}
    finally:
        store.close()
    assert "password" not in rows["old"] and rows["old"]["password_hash"]


def test_security_relevant_actions_are_audited_without_secrets(http_broker, caplog):
    caplog.set_level(logging.INFO, "leveret.audit")
    http_broker.http("PUT", "/api/vhosts/audited")
    http_broker.http("PUT", "/api/users/carol", {"password": "carols-secret", "tags": "management"})
    http_broker.http("PUT", "/api/permissions/audited/carol", {"configure": "", "write": ".*", "read": ".*"})
    with http_broker.amqp(vhost="audited") as connection:
        connection.channel().queue_declare("q")
    http_broker.http("DELETE", "/api/queues/audited/q/contents")
    http_broker.http("DELETE", "/api/users/carol")
    http_broker.http("GET", "/api/whoami", user="carol", password="wrong-secret")
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        http_broker.amqp("carol", "wrong-secret")
    lines = [r.getMessage() for r in caplog.records if r.name == "leveret.audit"]
    expected = [
        "vhost.put by user 'guest' from 127.0.0.1: vhost='audited'",
        "user.put by user 'guest' from 127.0.0.1: user='carol', tags='management'",
        "permission.put by user 'guest' from 127.0.0.1: user='carol' vhost='audited' configure='' "
        "write='.*' read='.*'",
        "queue.purge by user 'guest' from 127.0.0.1: vhost='audited' queue='q' messages=0",
        "user.delete by user 'guest' from 127.0.0.1: user='carol'",
        "login.refused by user 'carol' from 127.0.0.1: protocol='http'",
        "login.refused by user 'carol' from 127.0.0.1: protocol='amqp' mechanism='PLAIN'",
    ]
    assert [line.replace(",", "") for line in lines] == [line.replace(",", "") for line in expected]
    assert not any("secret" in line for line in lines)


def test_a_flood_of_bad_connections_costs_a_few_log_lines(tmp_path):
    """`leveret server` thins its log: at most 20 lines of one kind per 10 s."""
    server = ServerProcess(tmp_path / "data")
    try:
        for _ in range(100):
            with RawClient(server.port) as client:
                client.send(b"AMQP\x00\x00\x09\x01")
                client.expect(commands.Connection.Start, 0)
                client.send(b"\x09\x00\x00\x00\x00\x00\x00\xce")  # an unknown frame type: 501
                client.closed_within(5)
        lines = [line for line in server.log_path.read_text().splitlines()
                 if "closing with FRAME_ERROR" in line]
        assert 1 <= len(lines) <= 20
    finally:
        server.kill()


def test_a_dead_letter_strategy_and_api_replies_need_their_permissions(http_broker):
    """Beyond RabbitMQ's rules, leveret's own ways of putting messages into a queue are
    checked too: ActiveMQ's dead-letter strategy (configure and write on the dead-letter
    queue, read on the queue) and amq.leveret.api's replies (write on amq.default)."""
    http_broker.http("PUT", "/api/users/bob", {"password": "pw", "tags": ""})
    http_broker.http("PUT", "/api/permissions/%2F/bob", {"configure": "^bob", "write": "^(bob|amq\\.leveret)",
                                                         "read": "^bob"})
    connection = http_broker.amqp("bob", "pw")
    for arguments, refused in (
        ({"x-dead-letter-strategy": "shared", "x-dead-letter-queue": "victim"}, "queue 'victim'"),
        ({"x-dead-letter-strategy": "individual"}, "queue 'DLQ.bob.q'"),
    ):
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
            connection.channel().queue_declare("bob.q", arguments=arguments)
        assert caught.value.reply_code == 403 and refused in caught.value.reply_text
    channel = connection.channel()
    channel.queue_declare("bob.q", arguments={"x-dead-letter-strategy": "individual",
                                              "x-dead-letter-queue-prefix": "bob.dlq."})
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
        channel.basic_publish("amq.leveret.api", "lease.info", b"{}", pika.BasicProperties(reply_to="victim"))
        channel.queue_declare("bob.q", passive=True)
    assert caught.value.reply_text.endswith(
        "access to exchange 'amq.default' in vhost '/' refused for user 'bob'")
    connection.close()
