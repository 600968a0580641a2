"""MQTT connections for operators: the management API lists them (protocol ``MQTT
3.1.1``/``MQTT 5.0``, client id, keep alive, session), an operator's close, ``leveret
ctl close_connection`` and a vhost's deletion disconnect them (MQTT 5: DISCONNECT 0x98
Administrative action), Prometheus counts their messages by QoS and their connections
in the connection gauges, and a resource alarm stops reading their publishers. With
paho-mqtt 2.x over MQTT 3.1.1 and 5.0.

leveret's management: skipped with ``MQTT_BROKER=mosquitto``."""

from __future__ import annotations

import os
import socket
import time
import urllib.request
import uuid
from collections.abc import Iterator

import pika
import pytest
from eventually import eventually
from mqtt_ops_clients import V5, V311, Client
from prometheus_client.parser import text_string_to_metric_families
from servers import ServerProcess, ctl_rows as ctl
from targets import Target, unique

from leveret import BlockingBroker

if os.environ.get("MQTT_BROKER", "leveret") != "leveret":
    pytest.skip("leveret's management API, ctl and metrics", allow_module_level=True)

ADMINISTRATIVE_ACTION = 0x98
VERSIONS = pytest.mark.parametrize("version", [V311, V5], ids=["3.1.1", "5.0"])
PROTOCOL = {V311: "MQTT 3.1.1", V5: "MQTT 5.0"}


@pytest.fixture(scope="module")
def broker() -> Iterator[BlockingBroker]:
    with BlockingBroker(amqp_port=0, mqtt_port=0, http_port=0, prometheus_port=0) as broker:
        yield broker


@pytest.fixture(scope="module")
def api(broker: BlockingBroker) -> Target:
    return Target.of(broker)


def client_id() -> str:
    return f"m-{uuid.uuid4().hex[:10]}"


def row_of(api: Target, cid: str, path: str = "/api/connections") -> dict | None:
    rows = api.http("GET", path)[1]
    return next((r for r in rows if r["client_properties"].get("client_id") == cid), None)


def closed_by_broker(client: Client) -> int:
    """How the broker ended ``client``'s connection, as paho tells it: 5.0's DISCONNECT
    reason code; 3.1.1 (a server sends no DISCONNECT): paho's "connection lost"."""
    return client.disconnected()


def raw_mqtt5(port: int, cid: str, keep_alive: int = 60) -> socket.socket:
    """A socket that sent an MQTT 5 CONNECT (clean start, ``keep_alive`` seconds, no
    properties) and read its CONNACK."""
    name = cid.encode()
    body = (b"\x00\x04MQTT\x05\x02" + keep_alive.to_bytes(2, "big") + b"\x00"
            + len(name).to_bytes(2, "big") + name)
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(bytes([0x10, len(body)]) + body)
    connack = sock.recv(2)
    assert connack[:1] == b"\x20"
    sock.recv(connack[1])
    return sock


def read_to_end(sock: socket.socket) -> bytes:
    """Everything the broker sends until it closes the socket (TimeoutError if not)."""
    data = b""
    while chunk := sock.recv(4096):
        data += chunk
    return data


# -- the management API -----------------------------------------------------------
@VERSIONS
def test_the_api_lists_mqtt_connections_with_client_id_keep_alive_and_session(broker, api, version):
    cid = client_id()
    client = Client(broker.mqtt_port, cid, version, "guest", "guest", clean=False)
    try:
        assert client.connect(keepalive=30, session_expiry=600) == 0
        assert client.subscribe("sensors/+/temp", 1) == [1]
        row = eventually(lambda: row_of(api, cid))
        assert row is not None
        assert row["protocol"] == PROTOCOL[version]
        assert (row["user"], row["vhost"], row["timeout"], row["channels"]) == ("guest", "/", 30, 1)
        properties = row["client_properties"]
        assert (properties["client_id"], properties["keep_alive"]) == (cid, 30)
        assert properties["clean_session"] is False
        # 3.1.1's persistent session never expires; 5.0's asked for 600 s
        assert properties["session_expiry_interval"] == (600 if version == V5 else 0xFFFFFFFF)
        assert row_of(api, cid, "/api/vhosts/%2F/connections") is not None
        assert api.http("GET", "/api/connections/" + urllib.request.quote(row["name"], safe=""))[0] == 200
        consumers = [c for c in api.http("GET", "/api/consumers")[1]
                     if c["queue"]["name"] == f"mqtt-subscription-{cid}qos1"]
        assert len(consumers) == 1
    finally:
        client.close()
        # the session outlives the connection: its durable queue stays, until cleaned
        assert api.http("DELETE", f"/api/queues/%2F/mqtt-subscription-{cid}qos1")[0] == 204


@VERSIONS
def test_an_operators_close_disconnects_with_administrative_action(broker, api, version):
    cid = client_id()
    client = Client(broker.mqtt_port, cid, version, "guest", "guest")
    try:
        assert client.connect() == 0
        row = eventually(lambda: row_of(api, cid))
        assert row is not None
        name = urllib.request.quote(row["name"], safe="")
        status, _ = api.http("DELETE", f"/api/connections/{name}", headers={"X-Reason": "maintenance"})
        assert status == 204
        code = closed_by_broker(client)
        assert code == ADMINISTRATIVE_ACTION if version == V5 else code != 0
        assert eventually(lambda: row_of(api, cid) is None)
    finally:
        client.close()


def test_after_the_disconnect_0x98_the_socket_closes(broker, api):
    """On the wire: DISCONNECT 0x98 with a reason string, then the broker's FIN."""
    cid = client_id()
    with raw_mqtt5(broker.mqtt_port, cid) as sock:
        row = eventually(lambda: row_of(api, cid))
        assert row is not None
        name = urllib.request.quote(row["name"], safe="")
        assert api.http("DELETE", f"/api/connections/{name}", headers={"X-Reason": "maintenance"})[0] == 204
        data = read_to_end(sock)
    assert data[:1] == b"\xe0" and data[2] == ADMINISTRATIVE_ACTION
    assert b"maintenance" in data


def test_deleting_the_vhost_disconnects_its_mqtt_clients(broker, api):
    vhost = unique("mqdel")
    assert api.http("PUT", f"/api/vhosts/{vhost}")[0] == 201
    clients = [Client(broker.mqtt_port, client_id(), version, f"{vhost}:guest", "guest")
               for version in (V5, V311)]
    try:
        for client in clients:
            assert client.connect() == 0
        assert api.http("DELETE", f"/api/vhosts/{vhost}")[0] == 204
        assert closed_by_broker(clients[0]) == ADMINISTRATIVE_ACTION
        assert closed_by_broker(clients[1]) != 0
    finally:
        for client in clients:
            client.close()


# -- leveret ctl ------------------------------------------------------------------
def test_ctl_lists_and_closes_mqtt_connections(tmp_path):
    server = ServerProcess(tmp_path / "data")
    try:
        assert server.mqtt_port is not None
        cid = client_id()
        client = Client(server.mqtt_port, cid, V5, "guest", "guest")
        try:
            assert client.connect(keepalive=45) == 0
            columns = ("name", "protocol", "user", "vhost", "timeout", "client_properties")
            rows = ctl(tmp_path / "data", "list_connections", *columns)
            mqtt = [r for r in rows if f'"client_id": "{cid}"' in r[5]]
            assert len(mqtt) == 1
            assert mqtt[0][1:5] == ["MQTT 5.0", "guest", "/", "45"]
            ctl(tmp_path / "data", "close_connection", mqtt[0][0], "go away")
            assert closed_by_broker(client) == ADMINISTRATIVE_ACTION
        finally:
            client.close()
    finally:
        server.kill()


# -- Prometheus -------------------------------------------------------------------
def scrape(url: str) -> dict[tuple[str, frozenset], float]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_prometheus_counts_mqtt_messages_by_qos_and_mqtt_connections(broker):
    url = str(broker.prometheus_url).rstrip("/")
    before = scrape(url)

    def mqtt(samples: dict, direction: str, qos: int) -> float:
        return samples[(f"leveret_mqtt_messages_{direction}_total", frozenset({("qos", str(qos))}))]

    publisher = Client(broker.mqtt_port, client_id(), V5, "guest", "guest")
    subscriber = Client(broker.mqtt_port, client_id(), V311, "guest", "guest")
    try:
        assert publisher.connect() == 0 and subscriber.connect() == 0
        topic = f"metrics/{uuid.uuid4().hex[:8]}"
        assert subscriber.subscribe(topic, 2) == [2]
        for qos in (0, 1, 1, 2):
            publisher.paho.publish(topic, b"x", qos)
        for _ in range(4):
            subscriber.message()
        connections = scrape(url)[("rabbitmq_connections", frozenset())]
        assert connections >= before[("rabbitmq_connections", frozenset())] + 2
    finally:
        publisher.close()
        subscriber.close()

    def counted(samples: dict) -> bool:
        return all(
            mqtt(samples, direction, qos) - mqtt(before, direction, qos) == n
            for direction in ("received", "sent")
            for qos, n in ((0, 1), (1, 2), (2, 1))
        )

    assert eventually(lambda: counted(scrape(url)))


# -- alarms -----------------------------------------------------------------------
def test_an_mqtt_publisher_is_not_read_during_a_resource_alarm(tmp_path):
    """As AMQP and STOMP publishers (RabbitMQ's rule): the PUBLISH that finds the alarm
    is taken, nothing more is read until the alarm ends; the connection shows
    ``blocked`` meanwhile."""
    # A limit above any real disk's free space raises the disk alarm at once.
    with BlockingBroker(amqp_port=0, mqtt_port=0, http_port=0, data_dir=str(tmp_path),
                        disk_free_limit=10**18) as broker:
        api = Target.of(broker)
        amqp = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
        channel = amqp.channel()
        channel.queue_declare("alarmed", durable=True)
        channel.queue_bind("alarmed", "amq.topic", "alarm.#")

        def count() -> int:
            return channel.queue_declare("alarmed", passive=True).method.message_count

        cid = client_id()
        publisher = Client(broker.mqtt_port, cid, V5, "guest", "guest")
        try:
            assert publisher.connect() == 0
            infos = [publisher.paho.publish("alarm/a", f"m{i}".encode(), 1) for i in range(3)]
            assert eventually(lambda: (row_of(api, cid) or {}).get("state") == "blocked")
            amqp.sleep(0.5)
            assert count() <= 1
            assert publisher.paho.is_connected()
            broker.broker.settings.disk_free_limit = 0
            assert eventually(lambda: count() == 3, timeout=8)
            assert eventually(lambda: all(info.is_published() for info in infos))
            assert (row_of(api, cid) or {}).get("state") == "running"
        finally:
            publisher.close()
            amqp.close()


def test_a_blocked_publishers_keep_alive_does_not_run_out(tmp_path):
    """Time a publisher is not read (the alarm) does not count against its keep alive:
    silent for longer than 1.5 keep alives while blocked, it is still connected, and
    answered once the alarm ends."""
    with (
        BlockingBroker(amqp_port=0, mqtt_port=0, data_dir=str(tmp_path), disk_free_limit=10**18) as broker,
        raw_mqtt5(broker.mqtt_port, client_id(), keep_alive=1) as sock,
    ):
        topic = b"alarm/k"
        publish = len(topic).to_bytes(2, "big") + topic + b"\x00" + b"payload"  # QoS 0
        sock.sendall(bytes([0x30, len(publish)]) + publish)
        time.sleep(2.0)  # 1.5 keep alives is 1.5 s
        sock.settimeout(0.1)
        with pytest.raises(TimeoutError):  # neither a DISCONNECT nor the end
            sock.recv(1)
        broker.broker.settings.disk_free_limit = 0
        sock.settimeout(8)
        sock.sendall(b"\xc0\x00")  # PINGREQ
        assert sock.recv(2) == b"\xd0\x00"  # PINGRESP
