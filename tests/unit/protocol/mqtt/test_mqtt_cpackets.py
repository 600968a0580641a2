"""The compiled MQTT reader (``_cpackets.pyx``) against the pure one (``py_feed``): the
same packets and buffered bytes after every read, and the same MalformedPacket (text
and reason code) at the same read, on valid packets, arbitrary bytes and PUBLISHes
mangled in every field, cut anywhere."""

from __future__ import annotations

import pytest
from compiled_twins import compiled
from hypothesis import given, strategies as st
from sans_io import FUZZ, split

from leveret.protocol.mqtt import packets as p

COMPILED, NOT_BUILT = compiled("leveret.protocol.mqtt._cpackets")
pytestmark = pytest.mark.skipif(COMPILED is None, reason=NOT_BUILT)


def outcome(feed, version, chunks, limit):
    """What each read gives (packets, then the bytes held), or the error it ends with."""
    reader = p.PacketReader(version, max_packet_size=limit)
    seen = []
    for chunk in chunks:
        try:
            seen.append((feed(reader, chunk), bytes(reader._buffer)))
        except p.MalformedPacket as exc:
            seen.append(("error", str(exc), exc.reason_code))
            break
    return seen


def same(version, chunks, limit=300):
    assert COMPILED is not None
    assert outcome(COMPILED.feed, version, chunks, limit) == outcome(p.py_feed, version, chunks, limit)


publishes = st.builds(
    lambda topic, payload, qos, retain, dup, pid, props: p.Publish(
        topic, payload, qos, retain, dup and qos > 0, pid if qos else None, props
    ),
    st.text(st.characters(codec="utf-8", exclude_characters="\x00+#"), min_size=1, max_size=6),
    st.binary(max_size=20),
    st.integers(0, 2),
    st.booleans(),
    st.booleans(),
    st.integers(1, 0xFFFF),
    st.sampled_from([(), ((p.USER_PROPERTY, ("k", "v")),), ((p.TOPIC_ALIAS, 2),)]),
)
others = st.sampled_from([p.PingReq(), p.PubAck(3), p.PubRel(9), p.Subscribe(1, (p.Subscription("a/#", 1),))])


@pytest.mark.parametrize("version", [None, 4, 5])
@FUZZ
@given(st.lists(st.one_of(publishes, others), max_size=6), st.lists(st.integers(0, 400), max_size=5))
def test_valid_packets_read_the_same(version, packets, cuts):
    head = p.encode(p.Connect("c"), version or 4) if version is None else b""
    data = head + b"".join(p.encode(packet, version or 4) for packet in packets)
    same(version, split(data, cuts))


@pytest.mark.parametrize("version", [None, 4, 5])
@FUZZ
@given(st.binary(max_size=300), st.lists(st.integers(0, 300), max_size=5))
def test_any_bytes_read_the_same(version, data, cuts):
    same(version, split(data, cuts))


@pytest.mark.parametrize("version", [4, 5])
@FUZZ
@given(publishes, st.lists(st.tuples(st.integers(0, 40), st.integers(0, 255)), max_size=3),
       st.lists(st.integers(0, 80), max_size=3), st.sampled_from([300, 20]))
def test_mangled_publishes_read_the_same(version, packet, changes, cuts, limit):
    """A PUBLISH with bytes changed anywhere (flags, lengths, topic, packet id, the
    property length): every way the fast path must hand over to the pure decoder."""
    data = bytearray(p.encode(packet, version))
    for index, value in changes:
        data[index % len(data)] = value
    same(version, split(bytes(data) + p.encode(p.PingReq(), version), cuts), limit)
