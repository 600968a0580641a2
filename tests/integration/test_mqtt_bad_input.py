"""Bad input: malformed packets and protocol violations (before and after CONNECT), the
server's receive maximum exceeded. Each gets the spec's reason code (5.0: DISCONNECT
before the close) or a close (3.1.1); every other client carries on and no accepted
QoS 1 message is lost. Runs against leveret or mosquitto (MQTT_BROKER,
tests/mqtt_brokers.py). Sections are MQTT 5.0's unless marked.

Expectations: leveret answers a packet its codec refuses (leveret.protocol.mqtt.packets,
MalformedPacket) with DISCONNECT carrying the codec's reason code in 5.0 (0x81 malformed
packet, 0x82 protocol error; §4.13.1 allows it) and a plain close in 3.1.1
[MQTT-4.8.0-1]. mosquitto 2.0.11 does the same except where MOSQUITTO_DIFFERS says.
"""

from __future__ import annotations

import struct

import pytest
from mqtt_brokers import unique
from mqtt_clients import V5, V311, Closed, Raw, ack_publish, raw_connected
from mqtt_violations import violations

from leveret.protocol.mqtt import packets as p

#: (protocol level, violation) → what mosquitto 2.0.11 does instead of leveret's answer:
#: ("open",) it carries on; ("disconnect", code or None) another code, or no DISCONNECT.
MOSQUITTO_DIFFERS: dict[tuple[int, str], tuple] = {
    # [MQTT-2.1.3-1] reserved flags: mosquitto ignores them on PINGREQ (answers PINGRESP).
    (V311, "pingreq reserved flags"): ("open",),
    (V5, "pingreq reserved flags"): ("open",),
    # [MQTT-3.3.1-2] DUP on QoS 0: mosquitto ignores the flag.
    (V311, "publish dup on qos 0"): ("open",),
    (V5, "publish dup on qos 0"): ("open",),
    # Closed without DISCONNECT (§4.13.1: the DISCONNECT is a MAY).
    (V5, "pubrel reserved flags"): ("disconnect", None),
    (V5, "remaining length of 5 bytes"): ("disconnect", None),
    (V5, "property twice"): ("disconnect", None),
    # A reserved packet type: mosquitto says 0x82 protocol error, the codec 0x81
    # malformed (§4.13: it cannot be parsed).
    (V5, "packet type 0"): ("disconnect", 0x82),
    # [MQTT-3.8.3-2] names a SUBSCRIBE without payload a protocol error (0x82, the
    # codec's); mosquitto says 0x81.
    (V5, "subscribe without filters"): ("disconnect", 0x81),
}


def expected(broker_name: str, version: int, name: str, data: bytes) -> tuple:
    if broker_name == "mosquitto" and (version, name) in MOSQUITTO_DIFFERS:
        return MOSQUITTO_DIFFERS[version, name]
    try:
        p.PacketReader(version).feed(data)
    except p.MalformedPacket as error:
        return ("disconnect", error.reason_code if version == V5 else None)
    raise AssertionError(f"the codec accepts {name!r}: not a violation")


def outcome(raw: Raw) -> tuple:
    """("open",) if the connection still answers a PINGREQ, else ("disconnect", the
    DISCONNECT's reason code or None)."""
    try:
        packet = raw.recv(0.5)
    except TimeoutError:
        pass
    except (Closed, p.MalformedPacket):
        return ("disconnect", None)
    else:
        if isinstance(packet, p.Disconnect):
            raw.closed_after()
            return ("disconnect", packet.reason_code)
        if not isinstance(packet, p.PingResp):  # an answer to the packet: still open
            raise AssertionError(f"unexpected {packet}")
    try:
        raw.send(p.PingReq())
        answer = raw.expect(p.PingResp, timeout=2)
    except (Closed, OSError, p.MalformedPacket):
        return ("disconnect", None)
    except TimeoutError:
        raise AssertionError("neither closed nor answering PINGREQ") from None
    assert isinstance(answer, p.PingResp)
    return ("open",)


def _cases():
    for version in (V311, V5):
        for name in violations(version):
            yield pytest.param(version, name, id=f"v{'5' if version == V5 else '311'}-{name}")


@pytest.mark.parametrize(("version", "name"), list(_cases()))
def test_violation_after_connect(mqtt_broker, version, name):
    topic = unique("bad/t")
    data = violations(version)[name]
    with raw_connected(mqtt_broker, V5) as bystander, raw_connected(mqtt_broker, version) as offender:
        bystander.subscribe(p.Subscription(topic, 1))
        offender.publish(topic, b"accepted before", qos=1, packet_id=11)  # PUBACKed
        offender.send_bytes(data)
        assert outcome(offender) == expected(mqtt_broker.name, version, name, data)
        # The QoS 1 message the server acknowledged is delivered; the bystander and new
        # clients carry on.
        message = bystander.recv_publish()
        assert message.payload == b"accepted before"
        ack_publish(bystander, message)
        with raw_connected(mqtt_broker, V311) as publisher:
            publisher.publish(topic, b"after", qos=1)
        assert bystander.recv_publish().payload == b"after"


def _string(text: bytes) -> bytes:
    return struct.pack("!H", len(text)) + text


def _connect(level: int, flags: int, properties: bytes = b"\x00", payload: bytes = _string(b"cid")) -> bytes:
    body = (
        _string(b"MQTT")
        + bytes([level, flags])
        + b"\x00\x3c"
        + (properties if level == V5 else b"")
        + payload
    )
    return b"\x10" + p._varint(len(body)) + body


CONNECT_VIOLATIONS = {
    # 3.1.1 [MQTT-3.1.2-3] / 5.0 [MQTT-3.1.2-3]: the reserved connect flag is 0.
    "reserved connect flag": lambda v: _connect(v, 0x03),
    # [MQTT-3.1.2-12]: will QoS 3.
    "will qos 3": lambda v: _connect(
        v, 0x1E, payload=_string(b"cid") + (b"\x00" if v == V5 else b"") + _string(b"w") + _string(b"x")
    ),
    # §1.5.4 [MQTT-1.5.4-2]: U+0000 in a string.
    "client id with U+0000": lambda v: _connect(v, 0x02, payload=_string(b"a\x00b")),
}
CONNECT_VIOLATIONS_V5 = {
    # §3.1.2.11.3-4: receive maximum 0, maximum packet size 0 are protocol errors.
    "receive maximum 0": lambda v: _connect(v, 0x02, b"\x03\x21\x00\x00"),
    "maximum packet size 0": lambda v: _connect(v, 0x02, b"\x05\x27\x00\x00\x00\x00"),
}


@pytest.mark.parametrize(
    ("version", "name"),
    [(v, n) for v in (V311, V5) for n in CONNECT_VIOLATIONS] + [(V5, n) for n in CONNECT_VIOLATIONS_V5],
)
def test_bad_connect_is_closed_without_connack(mqtt_broker, version, name):
    # 3.1.1 [MQTT-3.1.4-1]: a CONNECT that breaks the spec → close without CONNACK.
    # 5.0 §3.1.4 allows a CONNACK with reason code ≥ 0x80 first; mosquitto 2.0.11 sends
    # none, and leveret copies it.
    make = CONNECT_VIOLATIONS.get(name) or CONNECT_VIOLATIONS_V5[name]
    with Raw(mqtt_broker, version) as raw:
        raw.send_bytes(make(version))
        assert raw.closed_after() == []


#: What a 5.0 client gets for QoS 2 PUBLISHes past the server's receive maximum without
#: PUBREL. [MQTT-3.3.4-8]: DISCONNECT 0x93 receive maximum exceeded (leveret);
#: mosquitto 2.0.11 (receive maximum 20) answers the one past it with PUBREC 0x97
#: quota exceeded and carries on.
ENFORCES_RECEIVE_MAXIMUM = {"leveret": True, "mosquitto": False}


def test_client_exceeding_the_servers_receive_maximum(mqtt_broker):
    with Raw(mqtt_broker, V5) as raw:
        ack = raw.connect()
        limit = p.get_property(ack.properties, p.RECEIVE_MAXIMUM) or 65535
        assert isinstance(limit, int) and limit <= 5000, "a receive maximum this test can cross"
        topic = unique("rmx/t")
        for i in range(1, limit + 2):
            raw.send(p.Publish(topic, b"", 2, packet_id=i))
        if ENFORCES_RECEIVE_MAXIMUM[mqtt_broker.name]:
            got = raw.closed_after()
            # (with a Reason String saying why: MQTT 5.0 §3.14.2.2.3 allows one)
            assert [x.reason_code for x in got if not isinstance(x, p.PubRec)] == [0x93]
            assert all(isinstance(x, (p.PubRec, p.Disconnect)) for x in got)
        else:
            for i in range(1, limit + 1):
                assert raw.recv() == p.PubRec(i)
            assert raw.recv() == p.PubRec(limit + 1, 0x97)
            raw.send(p.PingReq())
            assert raw.recv() == p.PingResp()


def test_v5_password_without_user_name_is_allowed(mqtt_broker):
    # 5.0 §3.1.2.9 allows a password without a user name (3.1.1 [MQTT-3.1.2-22] does
    # not); the broker then decides: both accept it as anonymous.
    with Raw(mqtt_broker, V5) as raw:
        assert raw.connect(password=b"only a password").reason_code == 0
