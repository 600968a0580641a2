"""MQTT clients on leveret's users, vhosts, permissions and topic permissions, as
RabbitMQ's MQTT plugin treats them (answers read from RabbitMQ 3.10.8 with
bench/mqtt_access_rabbitmq.py, MQTT 5 codes from the spec): ``vhost:user`` logins, the
port-to-vhost mapping, anonymous logins as the default user, CONNACK codes for refused
logins, write/read/configure permissions and topic permissions with ``{username}``,
``{vhost}`` and ``{client_id}``, with paho-mqtt 2.x over MQTT 3.1.1 and 5.0.

leveret's own rules (users, vhosts): skipped with ``MQTT_BROKER=mosquitto``."""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator

import pika
import pytest
from eventually import eventually
from mqtt_ops_clients import V5, V311, Client, connack
from targets import Target, grant, new_account

from leveret import BlockingBroker
from leveret.protocol.mqtt.settings import MqttSettings, settings_of

if os.environ.get("MQTT_BROKER", "leveret") != "leveret":
    pytest.skip("leveret's users, vhosts and permissions", allow_module_level=True)

#: What a refusal is answered with: 3.1.1 CONNACK return codes, MQTT 5.0 reason codes.
#: A failed login is 5 for 3.1.1 as mosquitto 2.0 answers it (RabbitMQ 3.10: 4).
BAD_LOGIN = {V311: 5, V5: 0x86}
NOT_AUTHORIZED = {V311: 5, V5: 0x87}
LIMIT = {V311: 5, V5: 0x97}
REFUSED_SUBSCRIPTION = {V311: 0x80, V5: 0x87}
VERSIONS = pytest.mark.parametrize("version", [V311, V5], ids=["3.1.1", "5.0"])


@pytest.fixture(scope="module")
def broker() -> Iterator[BlockingBroker]:
    with BlockingBroker(amqp_port=0, mqtt_port=0, http_port=0) as broker:
        yield broker


@pytest.fixture(scope="module")
def api(broker: BlockingBroker) -> Target:
    return Target.of(broker)


@pytest.fixture
def settings(broker: BlockingBroker) -> Iterator[MqttSettings]:
    """The broker's [mqtt] settings, put back as they were after the test."""
    settings = settings_of(broker.core)
    saved = dict(vars(settings))
    yield settings
    broker.call(vars(settings).update, saved)


@pytest.fixture
def account(api: Target) -> Iterator[tuple[str, str]]:
    """A fresh vhost and a user ``name``/``pw`` with no permission yet (targets.new_account)."""
    with new_account(api, "mqv", "mqu") as names:
        yield names


def client_id() -> str:
    return f"c-{uuid.uuid4().hex[:10]}"


def connection_of(api: Target, cid: str) -> dict:
    """The /api/connections row of the MQTT connection with client id ``cid``."""
    def find() -> dict | None:
        rows = api.http("GET", "/api/connections")[1]
        return next((r for r in rows if r["client_properties"].get("client_id") == cid), None)

    row = eventually(find)
    assert row is not None
    return row


# -- logins -----------------------------------------------------------------------
@VERSIONS
def test_refused_logins_get_their_connack_code(broker, api, account, settings, version):
    vhost, user = account
    port = broker.mqtt_port
    assert connack(port, version) == 0  # anonymous: guest, from loopback
    assert connack(port, version, username="guest", password="wrong") == BAD_LOGIN[version]
    assert connack(port, version, username="nobody", password="pw") == BAD_LOGIN[version]
    assert connack(port, version, username=f"{vhost}:{user}", password="pw") == NOT_AUTHORIZED[version]
    grant(api, vhost, user)
    assert connack(port, version, username=f"{vhost}:{user}", password="pw") == 0
    # a vhost that does not exist is a failed login, as RabbitMQ 3.10 takes it
    assert connack(port, version, username=f"no-such-vhost:{user}", password="pw") == BAD_LOGIN[version]
    broker.call(setattr, settings, "allow_anonymous", False)
    assert connack(port, version) == BAD_LOGIN[version]
    assert connack(port, version, username="guest", password="guest") == 0


def test_the_vhost_comes_from_the_user_name_then_the_port_then_the_default(broker, api, account, settings):
    vhost, user = account
    port = broker.mqtt_port
    grant(api, vhost, user)
    assert connack(port, V5, username=user, password="pw") == NOT_AUTHORIZED[V5]  # "/" by default

    def vhost_seen(username: str, password: str = "pw") -> str:
        cid = client_id()
        client = Client(port, cid, V5, username, password)
        try:
            assert client.connect() == 0
            return connection_of(api, cid)["vhost"]
        finally:
            client.close()

    # RabbitMQ's global parameter mqtt_port_to_vhost_mapping, {"port": "vhost"}
    mapping = {"value": {str(port): vhost}}
    assert api.http("PUT", "/api/global-parameters/mqtt_port_to_vhost_mapping", mapping)[0] == 201
    try:
        assert vhost_seen(user) == vhost
        assert vhost_seen("/:guest", "guest") == "/"  # the user name's vhost comes first
    finally:
        api.http("DELETE", "/api/global-parameters/mqtt_port_to_vhost_mapping")
    # [mqtt] port_vhosts, then [mqtt] vhost
    broker.call(setattr, settings, "port_vhosts", {port: vhost})
    assert vhost_seen(user) == vhost
    broker.call(setattr, settings, "port_vhosts", {})
    broker.call(setattr, settings, "vhost", vhost)
    assert vhost_seen(user) == vhost
    assert vhost_seen(f"{vhost}:{user}") == vhost  # split at the last colon, as RabbitMQ


@VERSIONS
def test_anonymous_logins_are_the_default_user_and_guest_only_from_loopback(
    broker, api, account, settings, other_host, version
):
    vhost, user = account
    port = broker.mqtt_port
    assert connack(port, version, source=other_host) == BAD_LOGIN[version]  # guest from afar
    assert connack(port, version, username="guest", password="guest", source=other_host) == BAD_LOGIN[version]
    grant(api, vhost, user)
    broker.call(vars(settings).update, {"default_user": user, "default_pass": "pw", "vhost": vhost})
    cid = client_id()
    client = Client(port, cid, version, source=other_host)
    try:
        assert client.connect() == 0
        row = connection_of(api, cid)
        assert (row["user"], row["vhost"], row["peer_host"]) == (user, vhost, other_host)
    finally:
        client.close()


@VERSIONS
def test_the_vhost_connection_limit_refuses_one_more(broker, api, account, version):
    vhost, user = account
    grant(api, vhost, user)
    assert api.http("PUT", f"/api/vhost-limits/{vhost}/max-connections", {"value": 1})[0] == 204
    login = {"username": f"{vhost}:{user}", "password": "pw"}
    first = Client(broker.mqtt_port, client_id(), version, **login)
    try:
        assert first.connect() == 0
        assert connack(broker.mqtt_port, version, **login) == LIMIT[version]
    finally:
        first.close()
    assert eventually(lambda: connack(broker.mqtt_port, version, **login) == 0)


def test_refused_mqtt_logins_are_audited(broker, caplog):
    caplog.set_level(logging.INFO, logger="leveret.audit")
    assert connack(broker.mqtt_port, V5, username="mallory", password="guess") == BAD_LOGIN[V5]
    lines = [r.getMessage() for r in caplog.records if r.name == "leveret.audit"]
    assert any(
        line.startswith("login.refused by user 'mallory' from 127.0.0.1") and "protocol='mqtt'" in line
        for line in lines
    ), lines
    assert not any("guess" in line for line in lines)  # never the secret


# -- permissions ------------------------------------------------------------------
@VERSIONS
def test_publish_needs_write_on_the_exchange(broker, api, account, version):
    """A refused publish: 5.0 PUBACK 0x87; 3.1.1 cannot say it, the connection closes
    (RabbitMQ's). Subscribing needs write on the session queue only."""
    vhost, user = account
    grant(api, vhost, user, write="^mqtt-subscription-")
    client = Client(broker.mqtt_port, client_id(), version, f"{vhost}:{user}", "pw")
    try:
        assert client.connect() == 0
        assert client.subscribe("a/#", 1) == [1]
        if version == V5:
            assert client.publish("a/b", b"no", 1) == 0x87
            assert client.paho.is_connected()
        else:
            assert client.publish("a/b", b"no", 1, timeout=3) is None
            assert eventually(lambda: not client.paho.is_connected())
    finally:
        client.close()


@VERSIONS
@pytest.mark.parametrize(
    "permission",
    [{"configure": "^$"}, {"read": "^mqtt-subscription-"}, {"write": "^amq\\.topic$"}],
    ids=["no-configure-on-queue", "no-read-on-exchange", "no-write-on-queue"],
)
def test_subscribe_needs_configure_write_and_read(broker, api, account, version, permission):
    """The session queue is declared (configure), bound (write on it, read on
    ``amq.topic``) and consumed (read on it): any one missing refuses the SUBACK's
    filter (3.1.1: 0x80; 5.0: 0x87), the connection carries on and may publish."""
    vhost, user = account
    grant(api, vhost, user, **permission)
    client = Client(broker.mqtt_port, client_id(), version, f"{vhost}:{user}", "pw")
    try:
        assert client.connect() == 0
        assert client.subscribe("a/#", 1) == [REFUSED_SUBSCRIPTION[version]]
        assert client.publish("a/b", b"yes", 1) == 0
    finally:
        client.close()


@VERSIONS
def test_topic_permissions_expand_username_vhost_and_client_id(broker, api, account, version):
    """Topic permissions on ``amq.topic`` (write: publish, read: subscribe) are checked on
    the routing key (``/`` → ``.``), with ``{username}``, ``{vhost}`` and ``{client_id}``
    replaced as RabbitMQ's internal backend does for its MQTT plugin."""
    vhost, user = account
    grant(api, vhost, user)
    topic_permission = {
        "exchange": "amq.topic",
        "write": "^dev\\.{client_id}\\.",
        "read": "^cmd\\.({username}|{vhost})\\.",
    }
    assert api.http("PUT", f"/api/topic-permissions/{vhost}/{user}", topic_permission)[0] in (201, 204)
    cid = client_id()
    client = Client(broker.mqtt_port, cid, version, f"{vhost}:{user}", "pw")
    try:
        assert client.connect() == 0
        assert client.subscribe(f"cmd/{user}/#", 1) == [1]
        assert client.subscribe(f"cmd/{vhost}/+", 0) == [0]
        assert client.subscribe("cmd/someone-else/#", 1) == [REFUSED_SUBSCRIPTION[version]]
        assert client.subscribe("cmd/#", 1) == [REFUSED_SUBSCRIPTION[version]]
        assert client.publish(f"dev/{cid}/temp", b"21.5", 1) == 0
        # what the allowed subscription gets, from an AMQP publisher on amq.topic
        params = pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{broker.amqp_port}/{vhost}")
        with pika.BlockingConnection(params) as amqp:
            amqp.channel().basic_publish("amq.topic", f"cmd.{user}.reboot", b"now")
        message = client.message()
        assert (message.topic, message.payload) == (f"cmd/{user}/reboot", b"now")
        if version == V5:
            assert client.publish("dev/other-device/temp", b"x", 1) == 0x87
            assert client.publish(f"dev/{cid}/temp", b"21.6", 1) == 0  # and carries on
        else:
            assert client.publish("dev/other-device/temp", b"x", 1, timeout=3) is None
            assert eventually(lambda: not client.paho.is_connected())
    finally:
        client.close()
