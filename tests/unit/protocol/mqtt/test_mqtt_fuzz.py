"""Fuzzing the MQTT packet codec: any bytes, cut anywhere, give packets or
MalformedPacket (never another exception), and every packet hypothesis builds round-trips
through encode and PacketReader in MQTT 3.1.1 and 5.0."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st
from sans_io import FUZZ, split

from leveret.protocol.mqtt import packets as p
from leveret.protocol.mqtt.packets import MalformedPacket, PacketReader, encode


def packets_of(reader: PacketReader, chunks: list[bytes]) -> list[p.Packet]:
    out: list[p.Packet] = []
    for chunk in chunks:
        out += reader.feed(chunk)
    return out


@pytest.mark.parametrize("version", [None, 4, 5])
@FUZZ
@given(st.binary(max_size=400), st.lists(st.integers(0, 400), max_size=6))
def test_the_reader_takes_any_bytes(version, data, cuts):
    try:
        packets_of(PacketReader(version, max_packet_size=300), split(data, cuts))
    except MalformedPacket as exc:
        assert str(exc) and exc.reason_code in (0x81, 0x82, 0x84, 0x95)


@FUZZ
@given(st.sampled_from(range(1, 16)), st.binary(max_size=60), st.lists(st.integers(0, 80), max_size=4))
def test_any_body_after_a_valid_fixed_header(kind, body, cuts):
    """Random bodies behind a well-formed fixed header reach the per-type decoders."""
    flags = 2 if kind in (p.PUBREL, p.SUBSCRIBE, p.UNSUBSCRIBE) else 0
    data = bytes([kind << 4 | flags]) + p._varint(len(body)) + body
    for version in (4, 5):
        try:
            packets_of(PacketReader(version), split(data, cuts))
        except MalformedPacket as exc:
            assert str(exc)


text = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=8)
name = st.text(st.characters(codec="utf-8", exclude_characters="\x00+#"), min_size=1, max_size=8)
filt = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=8)
u16 = st.integers(0, 0xFFFF)
pid = st.integers(1, 0xFFFF)
code = st.integers(0, 255)
blob = st.binary(max_size=16)


def prop_value(identifier: int) -> st.SearchStrategy:
    kind = p.PROPERTY_TYPES[identifier]
    return {
        p.BYTE: st.integers(0, 255),
        p.TWO_BYTE: u16,
        p.FOUR_BYTE: st.integers(0, 2**32 - 1),
        p.VARINT: st.integers(0, p.MAX_VARINT),
        p.UTF8: text,
        p.BINARY: blob,
        p.PAIR: st.tuples(text, text),
    }[kind]


@st.composite
def properties(draw, kind):
    """Properties allowed in packet type ``kind`` (table 2-4), in range."""
    allowed = sorted(i for i, kinds in p.PROPERTY_PACKETS.items() if kind in kinds)
    ids = draw(st.lists(st.sampled_from(allowed), max_size=5))
    repeatable = {p.USER_PROPERTY, p.SUBSCRIPTION_IDENTIFIER} if kind == p.PUBLISH else {p.USER_PROPERTY}
    out, seen = [], set()
    for identifier in ids:
        if identifier in seen and identifier not in repeatable:
            continue
        seen.add(identifier)
        value = draw(prop_value(identifier))
        if identifier in p._FLAG:
            value &= 1
        elif identifier in p._NOT_ZERO:
            value = value or 1
        out.append((identifier, value))
    if p.AUTHENTICATION_DATA in seen and p.AUTHENTICATION_METHOD not in seen:
        out.append((p.AUTHENTICATION_METHOD, "PLAIN"))
    return tuple(out)


def packets(v5: bool) -> st.SearchStrategy:
    def props(kind):
        return properties(kind) if v5 else st.just(())

    rc = code if v5 else st.just(0)
    will = st.builds(p.Will, name, blob, st.integers(0, 2), st.booleans(), props(p.WILL))
    user = st.none() | text
    password = st.none() | blob

    @st.composite
    def connect(draw):
        username = draw(user)
        pw = draw(password) if (v5 or username is not None) else None
        return p.Connect(
            draw(text),
            draw(st.booleans()),
            draw(u16),
            username,
            pw,
            draw(st.none() | will),
            draw(props(p.CONNECT)),
        )

    @st.composite
    def publish(draw):
        qos = draw(st.integers(0, 2))
        return p.Publish(
            draw(name | (st.just("") if v5 else name)),
            draw(blob),
            qos,
            draw(st.booleans()),
            draw(st.booleans()) if qos else False,
            draw(pid) if qos else None,
            draw(props(p.PUBLISH)),
        )

    subscription = st.builds(
        p.Subscription,
        filt,
        st.integers(0, 2),
        st.booleans() if v5 else st.just(False),
        st.booleans() if v5 else st.just(False),
        st.integers(0, 2) if v5 else st.just(0),
    )
    acks = [st.builds(ack, pid, rc, props(p.PUBACK)) for ack in (p.PubAck, p.PubRec, p.PubRel, p.PubComp)]
    others = [
        st.builds(p.ConnAck, st.booleans(), code, props(p.CONNACK)),
        publish(),
        *acks,
        st.builds(
            p.Subscribe, pid, st.lists(subscription, min_size=1, max_size=4).map(tuple), props(p.SUBSCRIBE)
        ),
        st.builds(
            p.SubAck,
            pid,
            st.lists(code if v5 else st.sampled_from((0, 1, 2, 0x80)), min_size=1, max_size=4).map(tuple),
            props(p.SUBACK),
        ),
        st.builds(
            p.Unsubscribe, pid, st.lists(filt, min_size=1, max_size=4).map(tuple), props(p.UNSUBSCRIBE)
        ),
        st.builds(
            p.UnsubAck,
            pid,
            st.lists(code, min_size=1, max_size=4).map(tuple) if v5 else st.just(()),
            props(p.UNSUBACK),
        ),
        st.just(p.PingReq()),
        st.just(p.PingResp()),
        st.builds(p.Disconnect, rc, props(p.DISCONNECT)),
    ]
    if v5:
        others.append(st.builds(p.Auth, code, props(p.AUTH)))
    return st.one_of(connect(), *others)


@FUZZ
@given(st.data(), st.lists(st.integers(0, 400), max_size=4))
def test_encode_then_decode_round_trips(data, cuts):
    for version in (4, 5):
        packet = data.draw(packets(version == 5))
        wire = encode(packet, version)
        reader = PacketReader(None if isinstance(packet, p.Connect) else version)
        assert packets_of(reader, split(wire, cuts)) == [packet]
