"""Every transport MQTT clients use: WebSocket (``ws://HOST:PORT/ws``, subprotocol
``mqtt``, as RabbitMQ's Web MQTT), TLS (``mqtts_port``, client certificates naming the
user), and the AMQP port, which takes an MQTT CONNECT too (first-byte sniffing). With
paho-mqtt, aiohttp's WebSocket client for what paho does not do (messages split and
packed at will, refused subprotocols, text messages), raw sockets for the pre-login
limits, and mqtt.js (npm ``mqtt`` v5) under node.

``MQTT_BROKER=mosquitto`` runs the TLS round trip against a private mosquitto 2.0 as
well; the other tests are leveret's own and skip then: Debian's mosquitto 2.0.11 is built
without WebSocket support, and the AMQP port, certificate login order, pre-login limits,
HTTP cap and ready line are leveret's (docs/mqtt.md, "Transports")."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import aiohttp
import paho.mqtt.client as mqtt
import pika
import pytest
from certificates import CLIENT_DN, pem_files
from paho.mqtt.enums import CallbackAPIVersion
from websocket_raw import frame_head, read_until_closed, upgraded
from websocket_upgrade import upgrade_status

from leveret import BlockingBroker
from leveret.config import ConfigError, Settings, load
from leveret.core.auth import Permission, User
from leveret.server.http_limits import HttpLimits
from leveret.server.tls import TLSOptions

JS = Path(__file__).resolve().parent.parent / "js"
MQTT_BROKER = os.environ.get("MQTT_BROKER", "leveret")
MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
VERSIONS = [pytest.param(mqtt.MQTTv311, id="3.1.1"), pytest.param(mqtt.MQTTv5, id="5.0")]


# -- MQTT bytes, written by hand (3.1.1) ------------------------------------------------
def varint(n: int) -> bytes:
    """MQTT's Variable Byte Integer: 7 bits a byte, least significant first."""
    digits = [n >> (7 * i) & 0x7F for i in range(max(1, (n.bit_length() + 6) // 7))]
    return bytes(digit | 0x80 for digit in digits[:-1]) + bytes(digits[-1:])


def string(text: str) -> bytes:
    data = text.encode()
    return struct.pack(">H", len(data)) + data


def packet(first: int, body: bytes) -> bytes:
    return bytes([first]) + varint(len(body)) + body


def connect_packet(client_id: str) -> bytes:
    """CONNECT, MQTT 3.1.1, clean session, keep alive 60 s, no credentials (guest)."""
    return packet(0x10, string("MQTT") + b"\x04\x02\x00\x3c" + string(client_id))


def split_packets(data: bytes) -> list[tuple[int, bytes]]:
    """(first byte, body) of every whole packet in ``data``."""
    packets, i = [], 0
    while i < len(data):
        first, length, shift, i = data[i], 0, 0, i + 1
        while True:
            digit = data[i]
            i += 1
            length |= (digit & 0x7F) << shift
            shift += 7
            if not digit & 0x80:
                break
        packets.append((first, data[i : i + length]))
        i += length
    return packets


# -- paho -------------------------------------------------------------------------------
class Paho:
    """A paho-mqtt client running its network loop, with what it received."""

    def __init__(self, port: int, version: int, transport: str = "tcp", tls: dict | None = None,
                 username: str | None = "guest", client_id: str = "") -> None:
        self.messages: list[mqtt.MQTTMessage] = []
        self.connected = threading.Event()
        self.reason: object = None
        client_id = client_id or f"t-{time.monotonic_ns()}"
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=version,
                                  transport=transport)
        if transport == "websockets":
            self.client.ws_set_options(path="/ws")
        if tls is not None:
            self.client.tls_set(**tls)
        if username is not None:
            self.client.username_pw_set(username, "guest")
        self.client.on_connect = self._on_connect
        self.client.on_message = lambda client, userdata, message: self.messages.append(message)
        self.client.connect("localhost" if tls else "127.0.0.1", port)
        self.client.loop_start()
        assert self.connected.wait(5), "no CONNACK"

    def _on_connect(self, client, userdata, flags, reason, properties) -> None:
        self.reason = reason
        self.connected.set()

    def subscribe(self, topic: str, qos: int = 1) -> None:
        done = threading.Event()
        self.client.on_subscribe = lambda *args: done.set()
        self.client.subscribe(topic, qos)
        assert done.wait(5), "no SUBACK"

    def publish(self, topic: str, payload: bytes, qos: int) -> None:
        info = self.client.publish(topic, payload, qos)
        info.wait_for_publish(5)
        assert info.is_published()

    def wait_for(self, count: int, timeout: float = 5) -> list[mqtt.MQTTMessage]:
        deadline = time.monotonic() + timeout
        while len(self.messages) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(self.messages) >= count, [m.topic for m in self.messages]
        return self.messages

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def round_trip(client: Paho, prefix: str) -> None:
    """Subscribe to ``prefix/#``, publish at QoS 0 and 1, receive both, bodies as sent."""
    client.subscribe(f"{prefix}/#", 1)
    client.publish(f"{prefix}/zero", b"qos 0", 0)
    client.publish(f"{prefix}/one", b"\x00qos 1\xff", 1)
    received = {m.topic: (m.payload, m.qos) for m in client.wait_for(2)}
    assert received == {f"{prefix}/zero": (b"qos 0", 0), f"{prefix}/one": (b"\x00qos 1\xff", 1)}


def ws_port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/", 1)[0])


@pytest.fixture(autouse=True)
def leveret_only(request):
    """Under MQTT_BROKER=mosquitto only the tests on :func:`tls_target` run."""
    if MQTT_BROKER != "leveret" and "tls_target" not in request.fixturenames:
        pytest.skip(f"leveret's own transport or limit (MQTT_BROKER={MQTT_BROKER})")


# -- WebSocket --------------------------------------------------------------------------
@pytest.fixture
def broker():
    with BlockingBroker(amqp_port=0, web_mqtt_port=0) as running:
        yield running


@pytest.mark.parametrize("version", VERSIONS)
def test_paho_over_websocket_publishes_and_receives_qos_0_and_1(broker, version):
    assert broker.web_mqtt_url and broker.web_mqtt_url.endswith("/ws")
    client = Paho(ws_port(broker.web_mqtt_url), version, "websockets")
    try:
        round_trip(client, f"ws/{version}")
    finally:
        client.close()
    listener = ("http/web-mqtt", "127.0.0.1", ws_port(broker.web_mqtt_url))
    assert listener in broker.broker.node_info()["listeners"]


def test_packets_split_over_messages_and_packed_into_one(broker):
    """A CONNECT in 5-byte messages, then SUBSCRIBE with half a PUBLISH, then the rest of
    it with another PUBLISH: every packet is read; the answers are binary messages."""

    async def exchange(url: str) -> tuple[list[tuple[int, bytes]], set]:
        async with aiohttp.ClientSession() as session, session.ws_connect(url, protocols=["mqtt"]) as ws:
            assert ws.protocol == "mqtt"
            connect = connect_packet("split")
            for i in range(0, len(connect), 5):
                await ws.send_bytes(connect[i : i + 5])
            subscribe = packet(0x82, b"\x00\x01" + string("split/t") + b"\x01")
            qos1 = packet(0x32, string("split/t") + b"\x00\x02" + b"one")
            qos0 = packet(0x30, string("split/t") + b"zero")
            await ws.send_bytes(subscribe + qos1[:6])
            await ws.send_bytes(qos1[6:] + qos0)
            stream, kinds = b"", set()
            while len(split_packets(stream)) < 5:  # CONNACK SUBACK PUBACK PUBLISH PUBLISH
                message = await ws.receive(timeout=5)
                kinds.add(message.type)
                assert message.type == aiohttp.WSMsgType.BINARY, message
                stream += message.data
            return split_packets(stream), kinds

    packets, kinds = asyncio.run(exchange(broker.web_mqtt_url))
    assert kinds == {aiohttp.WSMsgType.BINARY}
    assert packets[0] == (0x20, b"\x00\x00")  # CONNACK accepted
    assert packets[1] == (0x90, b"\x00\x01\x01")  # SUBACK, QoS 1 granted
    assert (0x40, b"\x00\x02") in packets  # PUBACK of the QoS 1 publish
    publishes = sorted(body[2 + len("split/t"):] for first, body in packets if first >> 4 == 3)
    assert publishes == [b"\x00\x01one", b"zero"]  # QoS 1 (packet id 1) and QoS 0


@pytest.mark.parametrize("asked", [["v12.stomp"], [], ["mqtt5", "wamp"]])
def test_an_upgrade_without_the_mqtt_subprotocol_is_refused_with_400(broker, asked):
    assert upgrade_status(broker.web_mqtt_url, asked) == 400


def test_mqttv31_subprotocol_is_accepted_and_a_text_message_closes(broker):
    async def run(url: str) -> tuple[str | None, bytes, aiohttp.WSMessage]:
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(url, protocols=["mqttv3.1"]) as ws:
                protocol = ws.protocol
                await ws.send_bytes(connect_packet("older"))
                connack = (await ws.receive(timeout=5)).data
            async with session.ws_connect(url, protocols=["mqtt"]) as ws:
                await ws.send_str(connect_packet("text").decode("latin-1"))  # MQTT §6.0: binary only
                answer = await ws.receive(timeout=5)
            return protocol, connack, answer

    protocol, connack, answer = asyncio.run(run(broker.web_mqtt_url))
    assert protocol == "mqttv3.1" and connack == b"\x20\x02\x00\x00"
    assert answer.type == aiohttp.WSMsgType.CLOSE and answer.data == 1003  # unsupported data


def test_a_websocket_message_growing_past_the_prelogin_limit_is_refused_unread(broker):
    """aiohttp assembles a whole WebSocket message before leveret sees it: before CONNECT
    the bytes are counted as they come, so a 10 MB message (within the port's 16 MB
    message limit) is cut off after 64 KiB, not waited for."""
    with upgraded(broker.web_mqtt_url, "mqtt") as sock:
        # one binary frame of 10 MB
        sock.sendall(frame_head(0x2, 10_000_000) + connect_packet("big"))
        sock.sendall(b"z" * 200_000)
        closed, answer = read_until_closed(sock)
    assert closed, "the connection was kept, waiting for the rest of the message"
    assert b"\x20\x02" not in answer  # no CONNACK


def test_the_http_port_cap_holds_web_mqtt_connections():
    with BlockingBroker(amqp_port=0, web_mqtt_port=0, http=HttpLimits(max_connections=2)) as broker:
        assert broker.web_mqtt_url
        assert upgrade_status(broker.web_mqtt_url, ["mqtt"], held=2) == 503


# -- TLS --------------------------------------------------------------------------------
@pytest.fixture
def files(tmp_path) -> dict[str, str]:
    """PEM files of a new CA: the CA, the server's chain and key, a client's chain-and-key."""
    return pem_files(tmp_path)


def tls_broker(files, **settings) -> BlockingBroker:
    options = TLSOptions(files["server"], files["server_key"], files["ca"], verify="verify_peer")
    return BlockingBroker(amqp_port=0, mqtts_port=0, ssl_options=options, **settings)


def users(broker) -> list[str]:
    return broker.call(lambda: sorted(c.user.name for _, c in broker.broker.connections() if c.user))


@pytest.fixture
def tls_target(files, tmp_path):
    """(TLS port, leveret's BlockingBroker or None): leveret's ``mqtts_port``, or with
    MQTT_BROKER=mosquitto a private mosquitto's TLS listener with the same files."""
    if MQTT_BROKER == "leveret":
        with tls_broker(files) as broker:
            assert ("mqtt/ssl", "127.0.0.1", broker.mqtts_port) in broker.broker.node_info()["listeners"]
            yield broker.mqtts_port, broker
        return
    if not Path(MOSQUITTO).exists():
        pytest.skip("mosquitto is not installed")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = tmp_path / "mosquitto.conf"
    config.write_text(f"listener {port} 127.0.0.1\ncafile {files['ca']}\ncertfile {files['server']}\n"
                      f"keyfile {files['server_key']}\nallow_anonymous true\n"
                      "user root\n")  # (as root it would drop to a user who cannot read tmp_path)
    process = subprocess.Popen([MOSQUITTO, "-c", str(config)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and process.poll() is None, "mosquitto did not start"
                time.sleep(0.05)
        yield port, None
    finally:
        process.terminate()
        process.wait(10)


@pytest.mark.parametrize("version", VERSIONS)
def test_mqtt_over_tls_with_a_user_name(tls_target, files, version):
    port, broker = tls_target
    client = Paho(port, version, tls={"ca_certs": files["ca"]})
    try:
        round_trip(client, "tls")
        if broker is not None:
            assert users(broker) == ["guest"]
    finally:
        client.close()
    # the plain protocol on the TLS port gets nowhere
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(connect_packet("plain"))
        try:
            assert not sock.recv(100).startswith(b"\x20")
        except (ConnectionResetError, TimeoutError):
            pass


@pytest.mark.parametrize("version", VERSIONS)
def test_a_client_certificate_names_the_user_when_connect_has_none(files, version):
    with tls_broker(files) as broker:
        broker.call(broker.broker.core.add_user, User(CLIENT_DN))  # no password: the certificate is it
        broker.call(broker.broker.core.set_permission, CLIENT_DN, "/", Permission())
        tls = {"ca_certs": files["ca"], "certfile": files["client"]}
        client = Paho(broker.mqtts_port, version, tls=tls, username=None)
        try:
            assert not client.reason.is_failure
            round_trip(client, "cert")
            assert users(broker) == [CLIENT_DN]
        finally:
            client.close()
        # a user name in the CONNECT wins over the certificate (RabbitMQ's order)
        client = Paho(broker.mqtts_port, version, tls=tls, username="guest")
        try:
            assert users(broker) == ["guest"]
        finally:
            client.close()


def test_a_certificate_naming_no_user_is_refused_and_cert_login_can_be_off(files):
    tls = {"ca_certs": files["ca"], "certfile": files["client"]}
    with tls_broker(files) as broker:
        client = Paho(broker.mqtts_port, mqtt.MQTTv5, tls=tls, username=None)
        try:
            assert client.reason == "Bad user name or password"
        finally:
            client.close()
    with tls_broker(files, mqtt={"ssl_cert_login": False}) as broker:
        client = Paho(broker.mqtts_port, mqtt.MQTTv5, tls=tls, username=None)
        try:  # the certificate is not looked at: an anonymous client, the default user
            assert not client.reason.is_failure and users(broker) == ["guest"]
        finally:
            client.close()


def test_a_connect_announcing_more_than_the_prelogin_limit_over_tls_is_closed(files):
    with tls_broker(files) as broker:
        context = ssl.create_default_context(cafile=files["ca"])
        with socket.create_connection(("localhost", broker.mqtts_port), timeout=5) as raw, \
                context.wrap_socket(raw, server_hostname="localhost") as sock:
            sock.sendall(b"\x10" + varint(10_000_000) + b"\0" * 1000)
            try:
                assert sock.recv(100) == b""  # closed, not waiting for 10 MB
            except (ConnectionResetError, ssl.SSLError):
                pass


# -- the AMQP port ----------------------------------------------------------------------
@pytest.mark.parametrize("version", VERSIONS)
def test_the_amqp_port_takes_mqtt(broker, version):
    with pika.BlockingConnection(pika.URLParameters(broker.amqp_url)) as connection:
        channel = connection.channel()
        queue = channel.queue_declare("", exclusive=True).method.queue
        channel.queue_bind(queue, "amq.topic", "sniffed.#")
        client = Paho(broker.amqp_port, version)
        try:
            round_trip(client, "sniffed")
        finally:
            client.close()
        bodies = sorted(channel.basic_get(queue, auto_ack=True)[2] for _ in range(2))
        assert bodies == [b"\x00qos 1\xff", b"qos 0"]


# -- leveret server ---------------------------------------------------------------------
def test_leveret_server_prints_the_web_mqtt_url_and_management_lists_it(tmp_path):
    command = [sys.executable, "-m", "leveret", "server", "--amqp-port", "0", "--stomp-port", "-1",
               "--mqtt-port", "0", "--web-stomp-port", "-1", "--web-mqtt-port", "0",
               "--prometheus-port", "-1", "--http-port", "0", "--data-dir", str(tmp_path / "data")]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        lines = [process.stdout.readline() for _ in range(3)]
        assert re.fullmatch(r"leveret ready: amqp://127\.0\.0\.1:\d+ mqtt://127\.0\.0\.1:\d+\n", lines[0])
        assert lines[1].startswith("leveret management: http://127.0.0.1:")
        match = re.fullmatch(r"leveret web-mqtt: ws://127\.0\.0\.1:(\d+)/ws\n", lines[2])
        assert match, lines
        request = urllib.request.Request(lines[1].split(": ", 1)[1].strip() + "overview",
                                         headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="})
        with urllib.request.urlopen(request, timeout=10) as response:
            listeners = json.loads(response.read())["listeners"]
        assert {"protocol": "http/web-mqtt", "port": int(match.group(1))}.items() <= next(
            entry for entry in listeners if entry["protocol"] == "http/web-mqtt").items()
    finally:
        process.terminate()
        process.wait(10)


def test_the_config_file_sets_the_ports_and_mqtts_needs_ssl_options(tmp_path):
    config = tmp_path / "leveret.toml"
    config.write_text("[server]\nweb_mqtt_port = 0\nmqtts_port = 8883\n")
    with pytest.raises(ConfigError, match=r"mqtts_port.*ssl_options"):
        load(config, Settings())
    config.write_text("[server]\nweb_mqtt_port = 0\n")
    settings = load(config, Settings())
    assert settings.web_mqtt_port == 0 and settings.mqtts_port is None
    with BlockingBroker(settings, amqp_port=0) as broker:
        assert broker.web_mqtt_url and broker.web_mqtt_url.startswith("ws://127.0.0.1:")


# -- mqtt.js ----------------------------------------------------------------------------
@pytest.mark.skipif(shutil.which("node") is None or not (JS / "node_modules" / "mqtt").exists(),
                    reason="node or tests/js/node_modules (npm ci --prefix tests/js) is missing")
def test_mqtt_js_in_node_over_websocket_v311_and_v5(broker):
    with pika.BlockingConnection(pika.URLParameters(broker.amqp_url)) as connection:
        channel = connection.channel()
        queue = channel.queue_declare("", exclusive=True).method.queue
        channel.queue_bind(queue, "amq.topic", "js.#")
        result = subprocess.run(["node", str(JS / "mqtt_roundtrip.mjs"), broker.web_mqtt_url, "js"],
                                capture_output=True, text=True, timeout=60, cwd=JS)
        assert result.returncode == 0, result.stdout + result.stderr
        report = json.loads(result.stdout.strip().splitlines()[-1])
        for version in ("4", "5"):
            assert report[version]["granted"] == [1]
            seen = {entry["topic"]: entry for entry in report[version]["seen"]}
            assert bytes(seen[f"js/{version}/zero"]["payload"]) == b"qos 0 from mqtt.js"
            assert seen[f"js/{version}/zero"]["qos"] == 0
            assert bytes(seen[f"js/{version}/one"]["payload"]) == b"qos 1 from mqtt.js"
            assert seen[f"js/{version}/one"]["qos"] == 1
            assert bytes(seen[f"js/{version}/bytes"]["payload"]) == b"\x00\x01\x02\xff"
        five = {entry["topic"]: entry for entry in report["5"]["seen"]}["js/5/one"]
        assert five["userProperties"] == {"color": "red"} and five["contentType"] == "text/plain"
        # the same six publishes reached AMQP, bodies byte for byte
        bodies = []
        while (got := channel.basic_get(queue, auto_ack=True))[0] is not None:
            bodies.append(got[2])
        sent = [b"qos 0 from mqtt.js", b"qos 1 from mqtt.js", b"\x00\x01\x02\xff"] * 2
        assert sorted(bodies) == sorted(sent)
