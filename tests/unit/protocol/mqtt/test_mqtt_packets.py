"""The MQTT packet codec (leveret.protocol.mqtt.packets): every packet type round-trips in
MQTT 3.1.1 and 5.0, known bytes (spec examples, what paho-mqtt sends) decode, input cut
anywhere decodes the same, an oversize packet is refused from its fixed header, and each
malformed case raises MalformedPacket with the MQTT 5.0 reason code."""

from __future__ import annotations

import pytest

from leveret.protocol import prelogin
from leveret.protocol.mqtt import packets as p
from leveret.protocol.mqtt.packets import MalformedPacket, PacketReader, encode

USER = ((p.USER_PROPERTY, ("k", "v")), (p.USER_PROPERTY, ("k", "w")), (p.USER_PROPERTY, ("a", "")))
ALL_PROPS = (
    (p.PAYLOAD_FORMAT_INDICATOR, 1),
    (p.MESSAGE_EXPIRY_INTERVAL, 3600),
    (p.CONTENT_TYPE, "text/plain"),
    (p.RESPONSE_TOPIC, "reply/to"),
    (p.CORRELATION_DATA, b"\x00\x01"),
    (p.SUBSCRIPTION_IDENTIFIER, 268_435_455),
    (p.TOPIC_ALIAS, 7),
    *USER,
)


def both(packet: p.Packet, plain: p.Packet | None = None) -> list[tuple[int, p.Packet]]:
    """``packet`` in 5.0 and its 3.1.1 form (``plain``, or ``packet`` itself)."""
    return [(5, packet), (4, plain if plain is not None else packet)]


CONNECT = p.Connect(
    "client-1",
    clean_start=False,
    keep_alive=60,
    username="guest",
    password=b"guest",
    will=p.Will("last/will", b"gone", 2, True, ((p.WILL_DELAY_INTERVAL, 5), *USER)),
    properties=((p.SESSION_EXPIRY_INTERVAL, 300), (p.RECEIVE_MAXIMUM, 10), (p.MAXIMUM_PACKET_SIZE, 1024)),
)
CONNECT_311 = p.Connect("client-1", False, 60, "guest", b"guest", p.Will("last/will", b"gone", 2, True))

CASES: list[tuple[int, p.Packet]] = [
    *both(CONNECT, CONNECT_311),
    *both(p.Connect(), p.Connect()),
    (5, p.Connect("", password=b"token-only")),  # 5.0 allows a password alone (§3.1.2.9)
    *both(
        p.ConnAck(True, 0x87, ((p.ASSIGNED_CLIENT_IDENTIFIER, "auto-1"), (p.SERVER_KEEP_ALIVE, 30))),
        p.ConnAck(True, 5),
    ),
    *both(
        p.Publish("a/b", b"hi", 2, True, True, 65535, ALL_PROPS),
        p.Publish("a/b", b"hi", 2, True, True, 65535),
    ),
    *both(p.Publish("a/b", b"")),
    (5, p.Publish("", b"x", 1, packet_id=1, properties=((p.TOPIC_ALIAS, 1),))),
    *[
        case
        for ack in (p.PubAck, p.PubRec, p.PubRel, p.PubComp)
        for case in (
            *both(ack(1, 0x10, ((p.REASON_STRING, "why"),)), ack(1)),
            (5, ack(2, 0x92)),
            *both(ack(3)),
        )
    ],
    *both(
        p.Subscribe(
            5,
            (p.Subscription("a/+", 1, True, True, 2), p.Subscription("#", 2)),
            ((p.SUBSCRIPTION_IDENTIFIER, 9), *USER),
        ),
        p.Subscribe(5, (p.Subscription("a/+", 1), p.Subscription("#", 2))),
    ),
    *both(p.SubAck(5, (0, 1, 2, 0x80), ((p.REASON_STRING, "ok"),)), p.SubAck(5, (0, 1, 2, 0x80))),
    *both(p.Unsubscribe(6, ("a/+", "#"), USER), p.Unsubscribe(6, ("a/+", "#"))),
    *both(p.UnsubAck(6, (0, 0x11), USER), p.UnsubAck(6)),
    *both(p.PingReq()),
    *both(p.PingResp()),
    *both(p.Disconnect(0x04, ((p.SESSION_EXPIRY_INTERVAL, 0),)), p.Disconnect()),
    *both(p.Disconnect()),
    (5, p.Disconnect(0x8E)),
    (5, p.Auth(0x18, ((p.AUTHENTICATION_METHOD, "PLAIN"), (p.AUTHENTICATION_DATA, b"\x00u\x00p")))),
    (5, p.Auth()),
]


def reader_for(packet: p.Packet, version: int) -> PacketReader:
    return PacketReader() if isinstance(packet, p.Connect) else PacketReader(version)


@pytest.mark.parametrize(("version", "packet"), CASES, ids=lambda x: type(x).__name__)
def test_every_packet_round_trips(version, packet):
    data = encode(packet, version)
    reader = reader_for(packet, version)
    assert reader.feed(data) == [packet]
    assert reader.version == version
    # byte by byte, the same packet, and only once it is whole
    reader = reader_for(packet, version)
    got = []
    for i in range(len(data)):
        got += reader.feed(data[i : i + 1])
        assert got == ([] if i < len(data) - 1 else [packet])


def test_311_leaves_out_what_it_has_no_room_for():
    assert encode(p.PubAck(1, 0x10, USER), 4) == b"\x40\x02\x00\x01"
    assert encode(p.Disconnect(0x04), 4) == b"\xe0\x00"
    assert encode(p.UnsubAck(6, (0,)), 4) == b"\xb0\x02\x00\x06"
    with pytest.raises(ValueError):
        encode(p.Auth(), 4)


def test_several_packets_in_one_read_and_one_cut_anywhere():
    data = b"".join(encode(packet, 5) for _, packet in CASES[6:20] if not isinstance(packet, p.Connect))
    want = [packet for _, packet in CASES[6:20] if not isinstance(packet, p.Connect)]
    assert PacketReader(5).feed(data) == want
    for cut in range(0, len(data), 7):
        reader = PacketReader(5)
        assert reader.feed(data[:cut]) + reader.feed(data[cut:]) == want


# -- known bytes ---------------------------------------------------------------------------

# What paho-mqtt sends for Client("test").connect(keepalive=60), MQTT 3.1.1, written out
# per §3.1 (test_what_paho_mqtt_sends_decodes checks paho's own bytes where it is installed).
PAHO_CONNECT = bytes.fromhex("101000044d5154540402003c000474657374")


def test_known_bytes_decode():
    assert PacketReader().feed(PAHO_CONNECT) == [p.Connect("test", True, 60)]
    assert encode(p.Connect("test", True, 60), 4) == PAHO_CONNECT
    assert encode(p.ConnAck(False, 0), 4) == b"\x20\x02\x00\x00"
    assert encode(p.ConnAck(False, 0), 5) == b"\x20\x03\x00\x00\x00"
    assert encode(p.Publish("a/b", b"hi"), 4) == b"\x30\x07\x00\x03a/bhi"
    assert encode(p.Subscribe(1, (p.Subscription("a/b", 1),)), 4) == b"\x82\x08\x00\x01\x00\x03a/b\x01"
    assert encode(p.PingReq(), 5) == b"\xc0\x00"
    assert encode(p.PingResp(), 5) == b"\xd0\x00"
    # MQTT 5.0 §3.1.2.1's example: protocol name "MQTT", then level 5
    assert encode(p.Connect(), 5)[2:9] == b"\x00\x04MQTT\x05"


@pytest.mark.parametrize(
    ("value", "wire"),
    [  # MQTT 5.0 §1.5.5, table 1-1
        (0, "00"),
        (127, "7f"),
        (128, "8001"),
        (16_383, "ff7f"),
        (16_384, "808001"),
        (2_097_151, "ffff7f"),
        (2_097_152, "80808001"),
        (268_435_455, "ffffff7f"),
    ],
)
def test_remaining_length_as_a_variable_byte_integer(value, wire):
    publish = p.Publish("t", b"x" * (value - 3)) if value >= 3 else None
    if publish is not None and value < 3_000_000:
        data = encode(publish, 4)
        assert data[1 : 1 + len(wire) // 2].hex() == wire
        assert PacketReader(4).feed(data) == [publish]
    assert p._varint(value).hex() == wire
    assert p._read_varint(bytes.fromhex(wire), 0) == (value, len(wire) // 2)


# -- limits --------------------------------------------------------------------------------


def test_oversize_is_refused_from_the_fixed_header_alone():
    reader = PacketReader(5, max_packet_size=1000)
    with pytest.raises(MalformedPacket) as info:
        reader.feed(b"\x30\xff\xff\xff\x7f")  # claims 256 MiB, sends nothing of it
    assert info.value.reason_code == p.PACKET_TOO_LARGE
    reader = PacketReader(5, max_packet_size=1000)
    assert reader.feed(encode(p.Publish("t", b"x" * 993), 5)[:3]) == []  # 1000 bytes: allowed
    with pytest.raises(MalformedPacket):
        PacketReader(5, max_packet_size=1000).feed(encode(p.Publish("t", b"x" * 994), 5)[:3])


def test_before_connect_the_prelogin_limit_holds():
    header = b"\x10" + p._varint(prelogin.MAX_BYTES)
    with pytest.raises(MalformedPacket) as info:
        PacketReader().feed(header)
    assert info.value.reason_code == p.PACKET_TOO_LARGE
    assert PacketReader(5).feed(header) == []  # after CONNECT, only max_packet_size


# -- malformed -----------------------------------------------------------------------------

M, PE = p.MALFORMED, p.PROTOCOL_ERROR
UTF8_CONNECT = "101000044d51545404020000{}"


def connect_with_client_id(raw: bytes) -> bytes:
    body = b"\x00\x04MQTT\x04\x02\x00\x00" + len(raw).to_bytes(2, "big") + raw
    return b"\x10" + bytes([len(body)]) + body


MALFORMED = [
    # (version or None for before CONNECT, bytes, reason code, section)
    (5, "3180808080", M, "1.5.5"),  # remaining length in 5 bytes
    (5, "308000", M, "1.5.5"),  # not in the fewest bytes
    (5, "c100", M, "2.1.3"),  # PINGREQ with a flag
    (5, "6000", M, "2.1.3"),  # PUBREL without its 0b0010
    (5, "800600010003612f62", M, "2.1.3"),  # SUBSCRIBE without its 0b0010
    (5, "a2050001000161", M, "2.1.3"),  # UNSUBSCRIBE: topic filter runs past
    (5, "360500017400017800", M, "3.3.1.2"),  # QoS 3
    (5, "38040001740000", M, "3.3.1.1"),  # DUP on QoS 0
    (5, "32050001740000", PE, "2.2.1"),  # QoS 1 with packet identifier 0
    (5, "40020000", PE, "2.2.1"),  # PUBACK 0
    (5, "82030001 00", PE, "3.8.3"),  # SUBSCRIBE, no topic filter
    (4, "82020001", PE, "3.8.3"),
    (5, "a2030001 00", PE, "3.10.3"),  # UNSUBSCRIBE, no topic filter
    (5, "820800010000 03612f6203", M, "3.8.3.1"),  # retain handling 3
    (4, "820800010003612f6204", M, "3.8.3.1"),  # 3.1.1: reserved option bits
    (5, "820800010003612f6203", M, "3.8.3.1"),  # QoS 3 subscription
    (5, "8206000100 0000 01", PE, "4.7.3"),  # empty topic filter
    (5, "3006000361 2b6200", PE, "3.3.2.1"),  # wildcard in topic name
    (4, "30020000", PE, "4.7.3"),  # 3.1.1: empty topic name
    (5, "e0020405", M, "2.2.2.1"),  # DISCONNECT: properties longer than the packet
    (5, "e003040102", M, "2.2.2.2"),  # a four byte property with no data
    (5, "e00304017f", M, "2.2.2.2"),  # unknown property 0x7f
    (5, "e00c040a11000000011100000002", PE, "2.2.2.2"),  # session expiry twice
    (5, "b004000105 01", M, "3.11"),
    (5, "b003 0001 00", PE, "3.11.3"),  # UNSUBACK, no reason code
    (4, "900200 01", PE, "3.9.3"),  # SUBACK, no return code
    (4, "90030001 03", M, "3.9.3"),  # 3.1.1 SUBACK return code 3
    (5, "f005 00 03 160000", PE, "3.15.2.2"),  # AUTH: authentication data without a method
    (5, "e00500 03 230001", M, "2.2.2.2"),  # topic alias in a DISCONNECT
    (5, "3007000174 03 230000", PE, "2.2.2.2"),  # topic alias 0
    (5, "3006000174 02 0102", PE, "2.2.2.2"),  # payload format indicator 2
    (5, "3008000174 04 0b00 0b00", PE, "2.2.2.2"),  # subscription identifier 0
    # UNSUBACK: properties run past
    (4, "b003000100", M, "3.11.1"),  # 3.1.1 UNSUBACK with a reason code
    (4, "f000", M, "2.1.2"),  # AUTH in 3.1.1
    (5, "0000", M, "2.1.2"),  # type 0
    (4, "40030001 00", M, "2.1.4"),  # 3.1.1 PUBACK of 3 bytes
    (4, "e00100", M, "2.1.4"),  # 3.1.1 DISCONNECT with a byte
    (5, "20020100 ", M, "3.2.2"),  # 5.0 CONNACK without property length
    (5, "2003020000", M, "3.2.2.1"),  # CONNACK reserved flag bits
    (5, "101000044d5154540402003c000474657374", PE, "3.1"),  # a second CONNECT
    (None, "c000", PE, "3.1"),  # first packet not CONNECT
    (None, "100c00044d5154540403003c0000", M, "3.1.2.3"),  # reserved connect flag
    (None, "100c00044d5154540412003c0000", M, "3.1.2.6"),  # will QoS without a will
    (None, "100c00044d5154540442003c0000", M, "3.1.2.9"),  # 3.1.1: password, no user name
    (None, "101000044d515454041e003c000474657374", M, "3.1.3"),  # will flag, no will topic
    (None, "100c00044d5154540302003c0000", p.UNSUPPORTED_PROTOCOL_VERSION, "3.1.2.2"),
    (None, "100e00064d514973647003 02003c0000", p.UNSUPPORTED_PROTOCOL_VERSION, "3.1.2.1"),
]


@pytest.mark.parametrize(("version", "wire", "code", "section"), MALFORMED)
def test_malformed(version, wire, code, section):
    with pytest.raises(MalformedPacket) as info:
        PacketReader(version).feed(bytes.fromhex(wire.replace(" ", "")))
    assert info.value.reason_code == code, str(info.value)
    assert "§" in str(info.value)


@pytest.mark.parametrize(
    "raw",
    [b"a\x00b", b"\xed\xa0\x80", b"\xc0\xaf", b"\xff", b"\xe2\x82"],
    ids=["U+0000", "surrogate", "overlong", "invalid", "cut"],
)
def test_utf8_strings_are_checked(raw):
    with pytest.raises(MalformedPacket) as info:
        PacketReader().feed(connect_with_client_id(raw))
    assert info.value.reason_code == M and "§1.5.4" in str(info.value)
    assert PacketReader().feed(connect_with_client_id("é😀".encode())) == [p.Connect("é😀")]


def test_user_properties_repeat_in_order_and_subscription_identifiers_repeat_in_publish():
    publish = p.Publish(
        "t", b"", properties=((p.SUBSCRIPTION_IDENTIFIER, 1), (p.SUBSCRIPTION_IDENTIFIER, 2), *USER)
    )
    assert PacketReader(5).feed(encode(publish, 5)) == [publish]
    subscribe = p.Subscribe(
        1, (p.Subscription("t"),), ((p.SUBSCRIPTION_IDENTIFIER, 1), (p.SUBSCRIPTION_IDENTIFIER, 2))
    )
    with pytest.raises(MalformedPacket) as info:
        PacketReader(5).feed(encode(subscribe, 5))
    assert info.value.reason_code == PE


def test_encode_refuses_what_the_wire_cannot_carry():
    with pytest.raises(ValueError):
        encode(p.Publish("a\x00b"), 5)
    with pytest.raises(ValueError):
        encode(p.Publish("\ud800"), 5)
    with pytest.raises(ValueError):
        encode(p.Connect(), 3)


# -- what paho-mqtt sends (when installed) -------------------------------------------------


@pytest.mark.parametrize("version", [4, 5])
def test_what_paho_mqtt_sends_decodes(version):
    """paho-mqtt 2.x's own encoder (its Client with the socket left out) writes CONNECT,
    PUBLISH and SUBSCRIBE; they decode to what was asked, and re-encode to the same bytes."""
    mqtt = pytest.importorskip("paho.mqtt.client")
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties
    from paho.mqtt.subscribeoptions import SubscribeOptions

    sent: list[bytes] = []
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="test", protocol=version)
    client._packet_queue = lambda command, packet, mid, qos, info=None: sent.append(bytes(packet))
    client._sock = object()  # "connected", for _send_publish; never written to
    client.username_pw_set("guest", "guest")
    client.will_set("last/will", b"gone", 1, True)
    client._send_connect(60)
    props = None
    if version == 5:
        props = Properties(PacketTypes.PUBLISH)
        props.UserProperty = ("k", "v")
        props.MessageExpiryInterval = 60
    client._send_publish(7, b"a/b", b"hi", 1, False, False, None, props)
    options = SubscribeOptions(qos=2, noLocal=True) if version == 5 else 2
    client._send_subscribe(False, [(b"a/+", options)])
    reader = PacketReader()
    got = [packet for data in sent for packet in reader.feed(data)]
    user = ((p.USER_PROPERTY, ("k", "v")),)
    assert got == [
        p.Connect("test", True, 60, "guest", b"guest", p.Will("last/will", b"gone", 1, True)),
        p.Publish(
            "a/b", b"hi", 1, False, False, 7, ((p.MESSAGE_EXPIRY_INTERVAL, 60), *user) if props else ()
        ),
        p.Subscribe(1, (p.Subscription("a/+", 2, version == 5),)),
    ]
    assert [encode(packet, version) for packet in got] == sent
    client._sock = None
