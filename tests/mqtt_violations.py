"""Packets that break MQTT 3.1.1 / 5.0, as bytes, for the bad-input tests: each sent by a
client after a successful CONNECT of the given protocol level."""

from __future__ import annotations

import struct

from leveret.protocol.mqtt import packets as p

V311, V5 = p.MQTT_3_1_1, p.MQTT_5


def _string(text: bytes) -> bytes:
    return struct.pack("!H", len(text)) + text


def _packet(first: int, body: bytes) -> bytes:
    return bytes([first]) + p._varint(len(body)) + body


def _subscribe(version: int) -> bytes:
    return p.encode(p.Subscribe(1, (p.Subscription("a/b", 0),)), version)


def violations(version: int) -> dict[str, bytes]:
    """Name → bytes of each violation for protocol level ``version``."""
    props = b"\x00" if version == V5 else b""
    publish_qos1 = p.encode(p.Publish("a/b", b"x", 1, packet_id=1), version)
    out = {
        # §2.1.3 [MQTT-2.1.3-1]: reserved fixed header flags.
        "subscribe reserved flags": bytes([0x80]) + _subscribe(version)[1:],
        "pingreq reserved flags": b"\xc1\x00",
        "pubrel reserved flags": p.encode(p.PubRel(1), version)[:0] + b"\x60\x02\x00\x01",
        # §1.5.5: a variable byte integer of more than 4 bytes.
        "remaining length of 5 bytes": b"\x30\xff\xff\xff\xff\x7f",
        # §3.3.1.2 [MQTT-3.3.1-4]: QoS 3.
        "publish qos 3": bytes([0x36]) + publish_qos1[1:],
        # §3.3.1.1 [MQTT-3.3.1-2]: DUP on QoS 0.
        "publish dup on qos 0": _packet(0x38, _string(b"a/b") + props + b"x"),
        # §3.3.2.1 [MQTT-3.3.2-2]: wildcards in a topic name.
        "publish topic with +": _packet(0x30, _string(b"a/+") + props + b"x"),
        "publish topic with #": _packet(0x30, _string(b"a/#") + props + b"x"),
        # §2.2.1 [MQTT-2.2.1-3]: packet identifier 0.
        "publish packet id 0": _packet(0x32, _string(b"a/b") + b"\x00\x00" + props + b"x"),
        # §1.5.4 [MQTT-1.5.4-1/2]: ill-formed UTF-8, U+0000.
        "topic not utf-8": _packet(0x30, _string(b"a/\xff") + props + b"x"),
        "topic with U+0000": _packet(0x30, _string(b"a/\x00") + props + b"x"),
        # §2.1.2: reserved packet type 0.
        "packet type 0": b"\x00\x00",
        # §3.8.3 [MQTT-3.8.3-3]: a SUBSCRIBE with no topic filter.
        "subscribe without filters": _packet(0x82, b"\x00\x01" + props),
        # §2.1.4: the remaining length says more than the packet has inside.
        "subscribe filter past its end": _packet(0x82, b"\x00\x01" + props + b"\x00\x09a/b"),
    }
    if version == V5:
        # §3.8.3.1: reserved bits 6-7 of the subscription options; retain handling 3.
        out["subscription options reserved bits"] = _subscribe(V5)[:-1] + b"\xc0"
        out["retain handling 3"] = _subscribe(V5)[:-1] + b"\x30"
        # §2.2.2.2: an unknown property; a property given twice; one not allowed here.
        out["unknown property"] = _packet(0x30, _string(b"a/b") + b"\x02\x7f\x00" + b"x")
        out["property twice"] = _packet(0x30, _string(b"a/b") + b"\x04\x01\x01\x01\x01" + b"x")
        out["property not allowed in publish"] = _packet(0x30, _string(b"a/b") + b"\x03\x21\x00\x05" + b"x")
    else:
        # 3.1.1 has no AUTH packet: type 15 is reserved (3.1.1 §2.2.1).
        out["auth in 3.1.1"] = b"\xf0\x00"
    return out
