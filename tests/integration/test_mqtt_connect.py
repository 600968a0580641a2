"""CONNECT / CONNACK in MQTT 3.1.1 and 5.0: return and reason codes, client identifiers,
credentials, keep alive. Runs against leveret or mosquitto (MQTT_BROKER, tests/mqtt_brokers.py).
Sections are MQTT 5.0's unless marked 3.1.1."""

from __future__ import annotations

import struct
import time

import paho.mqtt.client as paho
import pytest
from mqtt_clients import API_VERSIONS, PROTOCOLS, V5, V311, Paho, Raw, raw_connected

from leveret.protocol.mqtt import packets as p


@pytest.mark.parametrize("api", API_VERSIONS, ids=["api1", "api2"])
@pytest.mark.parametrize("protocol", PROTOCOLS, ids=["v311", "v5"])
def test_paho_connects_with_each_api_and_protocol(mqtt_broker, api, protocol):
    with Paho(mqtt_broker, api, protocol) as client:
        flags, rc = client.connected()
        assert rc == 0
        session_present = flags["session present"] if isinstance(flags, dict) else flags.session_present
        assert not session_present


@pytest.mark.parametrize("version", [V311, V5])
def test_connack_accepts_clean_connect(mqtt_broker, version):
    with Raw(mqtt_broker, version) as raw:
        ack = raw.connect()
        assert ack.reason_code == 0 and not ack.session_present
        raw.send(p.PingReq())
        assert isinstance(raw.recv(), p.PingResp)


def _connect_bytes(name: bytes, level: int) -> bytes:
    body = struct.pack("!H", len(name)) + name + bytes([level, 0x02]) + struct.pack("!H", 60)
    if level == 5:
        body += b"\x00"  # no properties
    body += struct.pack("!H", 3) + b"abc"
    return bytes([0x10, len(body)]) + body


@pytest.mark.parametrize("level", [3, 6, 0x7F])
def test_unsupported_protocol_level_gets_connack_1_then_close(mqtt_broker, level):
    # 3.1.1 §3.1.2.2: the server responds with CONNACK return code 0x01 (unacceptable
    # protocol level) and disconnects. Both brokers answer in the 3.1.1 form (2 bytes),
    # since the client's version is unknown (5.0 §3.1.2.2 allows 0x84 in 5.0 form).
    with Raw(mqtt_broker, V311) as raw:
        raw.send_bytes(_connect_bytes(b"MQTT", level))
        raw.sock.settimeout(5)
        data = b""
        while True:
            chunk = raw.sock.recv(100)
            if not chunk:
                break
            data += chunk
        assert data == b"\x20\x02\x00\x01"


def test_bad_protocol_name_closes(mqtt_broker):
    # 3.1.1 §3.1.2.1 / 5.0 §3.1.2.1: a protocol name other than "MQTT": the server MAY
    # disconnect without CONNACK (mosquitto does; a CONNACK 0x84 then close is allowed too).
    with Raw(mqtt_broker, V311) as raw:
        raw.send_bytes(_connect_bytes(b"MQTX", 4))
        got = raw.closed_after()
        assert all(isinstance(x, p.ConnAck) and x.reason_code != 0 for x in got)


def test_v311_empty_client_id_without_clean_session_is_rejected(mqtt_broker):
    # 3.1.1 §3.1.3.1 [MQTT-3.1.3-8]: CONNACK 0x02 identifier rejected, then close.
    with Raw(mqtt_broker, V311) as raw:
        ack = raw.connect(client_id="", clean_start=False)
        assert ack.reason_code == 0x02
        assert raw.closed_after() == []


def test_v311_empty_client_id_with_clean_session_is_accepted(mqtt_broker):
    with Raw(mqtt_broker, V311) as raw:
        ack = raw.connect(client_id="", clean_start=True)
        assert ack.reason_code == 0 and not ack.session_present


def test_v5_empty_client_id_gets_assigned_client_identifier(mqtt_broker):
    # §3.1.3.1, §3.2.2.3.7: the server assigns an identifier and returns it in CONNACK.
    with Raw(mqtt_broker, V5) as raw:
        ack = raw.connect(client_id="")
        assert ack.reason_code == 0
        assigned = p.get_property(ack.properties, p.ASSIGNED_CLIENT_IDENTIFIER)
        assert isinstance(assigned, str) and assigned
    with Raw(mqtt_broker, V5) as other:
        other_assigned = p.get_property(other.connect(client_id="").properties, p.ASSIGNED_CLIENT_IDENTIFIER)
        assert other_assigned != assigned


def test_v5_given_client_id_is_not_reassigned(mqtt_broker):
    with Raw(mqtt_broker, V5) as raw:
        ack = raw.connect()
        assert p.get_property(ack.properties, p.ASSIGNED_CLIENT_IDENTIFIER) is None


#: The MQTT 5.0 CONNACK reason code for a wrong password, per broker: §3.2.2.2 has 0x86
#: bad user name or password, which leveret sends (as RabbitMQ 3.13's MQTT 5); mosquitto
#: 2.0.11 sends 0x87 not authorized for any failed password check.
BAD_PASSWORD_V5 = {"leveret": 0x86, "mosquitto": 0x87}


@pytest.mark.parametrize("version", [V311, V5])
def test_wrong_password_is_refused(mqtt_broker, version):
    # 3.1.1 §3.2.2.3: return code 5 not authorized (4 bad user name or password is for
    # malformed credentials) / 5.0: see BAD_PASSWORD_V5; then the server closes.
    code = 0x05 if version == V311 else BAD_PASSWORD_V5[mqtt_broker.name]
    user, password = mqtt_broker.bad_credentials()
    with Raw(mqtt_broker, version) as raw:
        ack = raw.connect(username=user, password=password.encode())
        assert ack.reason_code == code
        assert raw.closed_after() == []


@pytest.mark.parametrize("version", [V311, V5])
def test_right_password_is_accepted(mqtt_broker, version):
    user, password = mqtt_broker.credentials()
    with Raw(mqtt_broker, version) as raw:
        assert raw.connect(username=user, password=password.encode()).reason_code == 0


@pytest.mark.parametrize("protocol", PROTOCOLS, ids=["v311", "v5"])
def test_paho_wrong_password_is_refused(mqtt_broker, protocol):
    user, password = mqtt_broker.bad_credentials()
    client = Paho(mqtt_broker, paho.CallbackAPIVersion.VERSION2, protocol, credentials=(user, password))
    try:
        _flags, rc = client.connected()
        # paho reports 3.1.1's return code 5 as its 5.0 equivalent, 0x87 not authorized.
        assert rc.value == (0x87 if protocol == paho.MQTTv311 else BAD_PASSWORD_V5[mqtt_broker.name])
    finally:
        client.client.loop_stop()


#: Seconds after which a silent client with keep alive 1 s must be gone. §3.1.2.10 says
#: 1.5 × keep alive; leveret is held to that (plus scheduling slack); mosquitto 2.0.11
#: checks keep alives on a coarse timer and closes after about 6 s.
KEEP_ALIVE_1_CLOSED_BY = {"leveret": 3.0, "mosquitto": 9.0}


def test_keep_alive_expiry_closes_connection(mqtt_broker):
    # 3.1.1 §3.1.2.10 / 5.0 §3.1.2.10: no control packet within 1.5 × keep alive → the
    # server closes the connection (in 5.0 it MAY first send DISCONNECT 0x8D). One 3.1.1
    # and one 5.0 client wait side by side.
    old = raw_connected(mqtt_broker, V311, keep_alive=1)
    new = raw_connected(mqtt_broker, V5, keep_alive=1)
    start = time.monotonic()
    limit = KEEP_ALIVE_1_CLOSED_BY[mqtt_broker.name]
    try:
        assert old.closed_after(timeout=limit) == []
        got = new.closed_after(timeout=limit - (time.monotonic() - start) + 0.1)
        assert [getattr(x, "reason_code", x) for x in got] in ([], [0x8D])
        assert time.monotonic() - start >= 1.0
    finally:
        old.close()
        new.close()


def test_pings_keep_connection_alive(mqtt_broker):
    with raw_connected(mqtt_broker, V5, keep_alive=1) as raw:
        for _ in range(5):
            time.sleep(0.5)
            raw.send(p.PingReq())
            assert isinstance(raw.recv(), p.PingResp)


def test_connack_v5_properties_describe_the_server(mqtt_broker):
    # §3.2.2.3: what the server supports; absent means the default (retain, wildcards,
    # subscription identifiers, shared subscriptions available; maximum QoS 2).
    with Raw(mqtt_broker, V5) as raw:
        ack = raw.connect()
        props = dict(ack.properties)
        assert props.get(p.MAXIMUM_QOS, 2) == 2
        assert props.get(p.RETAIN_AVAILABLE, 1) == 1
        assert props.get(p.WILDCARD_SUBSCRIPTION_AVAILABLE, 1) == 1
        assert props.get(p.SUBSCRIPTION_IDENTIFIER_AVAILABLE, 1) == 1
        assert props.get(p.SHARED_SUBSCRIPTION_AVAILABLE, 1) == 1


def test_second_connect_is_a_protocol_error(mqtt_broker):
    # §3.1 [MQTT-3.1.0-2]: a second CONNECT is a protocol error; the connection closes
    # (5.0: with DISCONNECT 0x82 if the server sends one).
    with raw_connected(mqtt_broker, V5) as raw:
        raw.send(p.Connect("again"))
        assert raw.disconnected_with() in (None, 0x82)


@pytest.mark.parametrize("version", [V311, V5])
def test_first_packet_not_connect_closes(mqtt_broker, version):
    # 3.1.1 §3.1 [MQTT-3.1.0-1]: the first packet from the client must be CONNECT.
    with Raw(mqtt_broker, version) as raw:
        raw.send(p.PingReq())
        assert raw.closed_after() == []
