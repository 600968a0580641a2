"""The AMQP 1.0 message format (protocol/amqp10/message.py): transfers decoded and
encoded against python-qpid-proton's own Message codec, the bare message passed
through byte for byte, bodies byte for byte for the other protocols, the property
mapping both ways (RabbitMQ 4's mc_amqp / mc_amqpl), deaths, the modified outcome's
annotations, the store, and malformed payloads refused with their condition."""

from __future__ import annotations

import datetime
import uuid

import pytest
from proton import Message as ProtonMessage, symbol, ulong

from leveret.amqp import properties as wire
from leveret.core.message import NEUTRAL, Death, Message, Properties
from leveret.protocol.amqp.message import content_header, from_publish
from leveret.protocol.amqp10 import sections as s, types as t
from leveret.protocol.amqp10.message import (
    AMQP10,
    AMQP10_TYPE,
    address_fields,
    annotated,
    decode_transfer,
    delivery_delay,
    delivery_time,
    delivery_time_of,
    encode_transfer,
    message_subject,
    message_to,
    payload,
)
from leveret.protocol.amqp10.types import DecodeError
from leveret.protocol.mqtt import packets as mqtt_packets
from leveret.protocol.mqtt.message import MQTT, encode_publish
from leveret.protocol.stomp.message import from_send

DECODE_ERROR = "amqp:decode-error"
INVALID_FIELD = "amqp:invalid-field"


def received(data: bytes) -> ProtonMessage:
    """A payload as proton's receiver decodes it."""
    message = ProtonMessage()
    message.decode(data)
    return message


def section(code: int, value) -> bytes:
    return t.encode(t.Described(t.ULong(code), value))


def bare_of(data: bytes) -> bytes:
    """The bare message and footer of a payload (from its properties on)."""
    sc = s.scan(data)
    for span in (sc.properties, sc.application_properties):
        if span is not None:
            return data[span[0] :]
    return data[sc.body :]


def full_proton_message(**overrides) -> ProtonMessage:
    fields = dict(
        body=b"hello",
        inferred=True,
        durable=True,
        priority=7,
        ttl=2.5,
        id=uuid.UUID("6bed1003-b69b-4ed5-9ff5-72081f59a962"),
        user_id=b"guest",
        address="/queues/q",
        subject="subj",
        reply_to="/queues/r%20q",
        correlation_id="corr",
        content_type="text/plain",
        content_encoding="gzip",
        creation_time=1700000000.25,
        group_id="group",
        properties={"a": 1, "b": "x", "f": 1.5, "t": True},
        annotations={symbol("x-opt-a"): "b"},
    )
    fields.update(overrides)
    return ProtonMessage(**fields)


# -- round trips through proton ----------------------------------------------------------


def test_a_proton_message_comes_back_to_a_proton_receiver_with_everything():
    sent = full_proton_message()
    message = decode_transfer(sent.encode(), "", "q")
    assert (message.persistent, message.priority, message.ttl, message.body) == (True, 7, 2500, b"hello")
    got = received(encode_transfer(message, 0, True, None))
    for name in (
        "durable",
        "priority",
        "ttl",
        "id",
        "user_id",
        "address",
        "subject",
        "reply_to",
        "correlation_id",
        "content_type",
        "content_encoding",
        "creation_time",
        "group_id",
        "properties",
        "inferred",
    ):
        assert getattr(got, name) == getattr(sent, name), name
    assert bytes(got.body) == b"hello"
    assert got.first_acquirer is True and got.delivery_count == 0
    assert got.annotations == {"x-opt-a": "b", "x-exchange": "", "x-routing-key": "q"}


def test_the_header_carries_each_delivery_s_count_first_acquirer_and_ttl_left():
    message = decode_transfer(full_proton_message().encode(), "amq.topic", "a.b")
    got = received(encode_transfer(message, 3, False, 1200))
    assert (got.delivery_count, got.first_acquirer, got.ttl, got.durable, got.priority) == (
        3,
        False,
        1.2,
        True,
        7,
    )
    got = received(encode_transfer(message, 0, True, None))
    assert got.ttl == 2.5  # the message's own
    assert got.annotations["x-routing-key"] == "a.b" and got.annotations["x-exchange"] == "amq.topic"


@pytest.mark.parametrize(
    "body",
    [b"", b"bytes", "text", [1, "two", 3.0], {"k": "v"}, 42, uuid.UUID(int=7), b"x" * 70_000],
)
def test_every_kind_of_body_comes_back_as_it_was_sent(body):
    sent = ProtonMessage(body=body, inferred=isinstance(body, bytes | list))
    message = decode_transfer(sent.encode(), "", "q")
    got = received(encode_transfer(message, 0, True, None))
    want = body
    assert (bytes(got.body) if isinstance(got.body, memoryview) else got.body) == want
    assert got.inferred == sent.inferred


def test_the_bare_message_passes_through_byte_for_byte():
    sent = full_proton_message(body=b"x" * 5000)
    data = sent.encode() + section(0x78, {t.Symbol("hash"): b"\x01\x02"})
    message = decode_transfer(data, "", "q")
    out = encode_transfer(message, 1, False, None)
    assert bare_of(out) == bare_of(data)
    assert payload(message) == data


@pytest.mark.parametrize(
    "body_sections",
    [
        [section(0x75, b"one"), section(0x75, b""), section(0x75, b"three" * 100)],
        [section(0x76, [1, 2]), section(0x76, ["x"])],
        [section(0x77, "a value")],
        [section(0x75, b"data"), section(0x78, {t.Symbol("f"): 1})],
    ],
)
def test_several_body_sections_and_a_footer_pass_through(body_sections):
    data = section(0x70, [True]) + section(0x73, ["id"]) + b"".join(body_sections)
    message = decode_transfer(data, "", "q")
    out = encode_transfer(message, 0, True, None)
    assert bare_of(out) == bare_of(data)
    assert payload(message) == data


def test_delivery_annotations_are_for_one_hop_and_dropped():
    data = section(0x71, {t.Symbol("x-opt-hop"): 1}) + section(0x75, b"body")
    message = decode_transfer(data, "", "q")
    out = encode_transfer(message, 0, True, None)
    assert s.scan(out).delivery_annotations is None
    assert received(out).instructions is None
    assert message.body == b"body"


def test_symbolic_and_ulong_descriptors_are_sections_too():
    data = (
        t.encode(t.Described(t.Symbol("amqp:header:list"), [True]))
        + b"\x00\x80" + (0x73).to_bytes(8, "big") + t.encode(["id"])
        + t.encode(t.Described(t.Symbol("amqp:data:binary"), b"body"))
    )  # fmt: skip
    message = decode_transfer(data, "", "q")
    assert message.persistent and message.body == b"body" and message.properties.message_id == "id"
    assert bare_of(encode_transfer(message, 0, True, None)) == bare_of(data)


# -- the body for other protocols ---------------------------------------------------------


def test_data_sections_are_the_body_byte_for_byte_concatenated():
    data = section(0x75, b"\x00\xff") + section(0x75, b"abc") + section(0x75, bytes(range(256)))
    message = decode_transfer(data, "", "q")
    assert message.body == b"\x00\xffabc" + bytes(range(256))
    assert message.properties.type is None
    header = wire.decode(content_header(message))
    assert header.message_type is None


def test_an_amqp_value_body_reaches_amqp_0_9_1_as_its_encoding_with_type_amqp_1_0():
    data = ProtonMessage(body="text").encode() + section(0x78, {t.Symbol("f"): 1})
    message = decode_transfer(data, "", "q")
    body_start = s.scan(data).body
    assert message.body == data[body_start:]  # body sections and footer, as encoded (RabbitMQ 4)
    assert message.properties.type == AMQP10_TYPE
    assert wire.decode(content_header(message)).message_type == AMQP10_TYPE


def test_an_amqp_0_9_1_message_of_type_amqp_1_0_goes_back_as_its_sections():
    original = decode_transfer(ProtonMessage(body=["a", 1]).encode(), "", "q")
    header = wire.encode(wire.Properties(message_type=AMQP10_TYPE), len(original.body))
    message = from_publish("", "q", header, original.body)
    got = received(encode_transfer(message, 0, True, None))
    assert got.body == ["a", 1] and got.inferred is False
    # a body that is not AMQP sections stays data
    header = wire.encode(wire.Properties(message_type=AMQP10_TYPE), 3)
    got = received(encode_transfer(from_publish("", "q", header, b"abc"), 0, True, None))
    assert bytes(got.body) == b"abc" and got.inferred is True


# -- the facts and what the adapter reads -------------------------------------------------


def test_facts_come_from_the_header_and_default_as_the_spec_says():
    message = decode_transfer(section(0x75, b"x"), "", "q")
    assert (message.persistent, message.priority, message.ttl) == (False, None, None)
    message = decode_transfer(section(0x70, []) + section(0x75, b"x"), "", "q")
    assert (message.persistent, message.priority, message.ttl) == (False, None, None)
    data = section(0x70, [True, t.UByte(9), t.UInt(70_000), True, t.UInt(4)]) + section(0x75, b"x")
    message = decode_transfer(data, "", "q")
    assert (message.persistent, message.priority, message.ttl) == (True, 9, 70_000)


def test_rabbitmq_s_x_basic_annotations_stand_in_for_an_absent_header():
    annotations = {
        t.Symbol("x-basic-delivery-mode"): t.UByte(2),
        t.Symbol("x-basic-priority"): t.UByte(3),
        t.Symbol("x-basic-expiration"): "900",
    }
    message = decode_transfer(section(0x72, annotations) + section(0x75, b"x"), "", "q")
    assert (message.persistent, message.priority, message.ttl) == (True, 3, 900)


def test_to_subject_and_delivery_time_are_read_alone():
    message = decode_transfer(full_proton_message().encode(), "", "")
    assert message_to(message) == "/queues/q" and message_subject(message) == "subj"
    assert address_fields(message) == ("/queues/q", "subj")
    bare = decode_transfer(ProtonMessage(body=b"x", inferred=True).encode(), "", "")
    assert message_to(bare) is None and message_subject(bare) is None
    amqp = from_publish("", "q", wire.encode(wire.Properties(), 0), b"")
    assert message_to(amqp) is None and delivery_time(amqp, 0) is None
    assert address_fields(amqp) == (None, None) and address_fields(bare) == (None, None)


def test_delivery_time_and_delay_annotations():
    def at(annotations, now=1_000):
        data = section(0x72, annotations) + section(0x75, b"x")
        return delivery_time(decode_transfer(data, "", "q"), now)

    assert at({t.Symbol("x-opt-delivery-time"): t.Timestamp(5_000)}) == 5_000
    assert at({t.Symbol("x-opt-delivery-time"): 5_000}) == 5_000
    assert at({t.Symbol("x-opt-delivery-delay"): 250}) == 1_250
    assert at({t.Symbol("x-opt-delivery-time"): 500}) is None  # due already
    assert at({t.Symbol("x-opt-other"): 1}) is None
    assert delivery_time(decode_transfer(section(0x75, b"x"), "", "q"), 0) is None
    assert at({t.Symbol("x-opt-delivery-delay"): "soon"}) is None  # not an integer: ignored
    assert delivery_time_of({"x-opt-delivery-delay": 10}, 5) == 15
    message = decode_transfer(
        section(0x72, {t.Symbol("x-opt-delivery-delay"): 250}) + section(0x75, b""), "", ""
    )
    assert delivery_delay(message, 1_000) == 250
    assert delivery_delay(decode_transfer(section(0x75, b""), "", ""), 1_000) == 0


def test_x_cc_gives_the_sender_selected_routing_keys():
    data = section(0x72, {t.Symbol("x-cc"): ["k1", "k2"]}) + section(0x75, b"x")
    message = decode_transfer(data, "amq.direct", "k0")
    assert message.cc == ("k1", "k2")
    assert message.headers["CC"] == ["k1", "k2"]
    with pytest.raises(DecodeError) as info:
        decode_transfer(section(0x72, {t.Symbol("x-cc"): "k1"}) + section(0x75, b"x"), "", "q")
    assert info.value.condition == INVALID_FIELD


# -- AMQP 1.0 to neutral properties (what AMQP 0-9-1, STOMP and MQTT consumers get) --------


def test_properties_map_as_rabbitmq_4_maps_them_for_amqp_0_9_1():
    message = decode_transfer(full_proton_message().encode(), "", "q")
    props = message.properties
    assert props.message_id == "urn:uuid:6bed1003-b69b-4ed5-9ff5-72081f59a962"
    assert props.correlation_id == "corr"
    assert props.user_id == "guest"
    assert props.reply_to == "r q"  # /queues/:q is the queue's name
    assert props.content_type == "text/plain" and props.content_encoding == "gzip"
    assert props.timestamp == datetime.datetime(2023, 11, 14, 22, 13, 20, 250000, datetime.UTC)
    assert props.app_id == "group"
    assert props.delivery_mode == 2 and props.priority == 7 and props.expiration == "2500"
    assert props.type is None
    assert props.headers == {"a": 1, "b": "x", "f": 1.5, "t": True, "x-opt-a": "b"}
    header = wire.decode(content_header(message))
    assert header.message_id == props.message_id and header.app_id == "group"
    assert header.headers["x-opt-a"] == "b" and header.headers["a"] == 1


@pytest.mark.parametrize(
    ("value", "message_id", "header"),
    [
        (ulong(42), "42", None),
        (uuid.UUID(int=1), "urn:uuid:00000000-0000-0000-0000-000000000001", None),
        ("plain", "plain", None),
        ("x" * 256, None, "x" * 256),
        (b"\x00\x01", None, b"\x00\x01"),
    ],
)
def test_message_and_correlation_ids_of_each_type(value, message_id, header):
    sent = ProtonMessage(body=b"x", inferred=True, id=value, correlation_id=value)
    props = decode_transfer(sent.encode(), "", "q").properties
    assert props.message_id == message_id and props.correlation_id == message_id
    assert (props.headers or {}).get("x-message-id") == header
    assert (props.headers or {}).get("x-correlation-id") == header


def test_a_user_id_that_is_not_text_is_left_out():
    props = decode_transfer(
        ProtonMessage(body=b"", inferred=True, user_id=b"\xff\x00").encode(), "", "q"
    ).properties
    assert props.user_id is None


def test_annotation_values_and_internal_names():
    annotations = {
        t.Symbol("x-exchange"): "was",
        t.Symbol("x-routing-key"): "was",
        t.Symbol("x-basic-type"): "my-type",
        t.Symbol("x-opt-time"): t.Timestamp(1_500),
        t.Symbol("x-opt-list"): [t.UInt(1), "a"],
        t.Symbol("x-opt-map"): {t.Symbol("k"): t.Symbol("v")},
        t.Symbol("x-opt-uuid"): uuid.UUID(int=2),
        t.Symbol("x-opt-decimal"): t.Decimal32(b"\x00\x00\x00\x01"),
        t.Symbol("not-x"): 1,
        t.ULong(7): 1,
    }
    props = decode_transfer(section(0x72, annotations) + section(0x75, b"x"), "", "q").properties
    assert props.type == "my-type"
    assert props.headers == {
        "x-opt-time": datetime.datetime(1970, 1, 1, 0, 0, 1, 500000, datetime.UTC),
        "x-opt-list": [1, "a"],
        "x-opt-map": {"k": "v"},
        "x-opt-uuid": "00000000-0000-0000-0000-000000000002",
    }
    assert type(props.headers["x-opt-list"][0]) is int


# -- neutral properties to AMQP 1.0 -------------------------------------------------------


def amqp_091_message(body: bytes = b"abc", **fields) -> Message:
    header = wire.encode(wire.Properties(**fields), len(body))
    return from_publish("ex", "rk", header, body)


def test_an_amqp_0_9_1_message_reaches_an_amqp_1_0_receiver_as_rabbitmq_4_converts_it():
    corr = uuid.UUID(int=99)
    message = amqp_091_message(
        content_type="application/json",
        content_encoding="utf-8",
        headers={"a": 1, "s": "text", "x-foo": "bar", "CC": ["k2"], "nested": {"k": 1}},
        delivery_mode=2,
        priority=3,
        correlation_id=f"urn:uuid:{corr}",
        reply_to="amq.rabbitmq.reply-to.abc",
        expiration="5000",
        message_id="mid",
        timestamp=datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC),
        message_type="my-type",
        user_id="guest",
        app_id="app",
    )
    got = received(encode_transfer(message, 0, True, None))
    assert bytes(got.body) == b"abc" and got.inferred is True  # one data section
    assert (got.durable, got.priority, got.ttl) == (True, 3, 5.0)
    assert got.id == "mid" and got.correlation_id == corr
    assert got.reply_to == "/queues/amq.rabbitmq.reply-to.abc"
    assert got.content_type == "application/json" and got.content_encoding == "utf-8"
    assert got.creation_time == datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC).timestamp()
    assert bytes(got.user_id) == b"guest" and got.group_id == "app"
    assert got.properties == {"a": 1, "s": "text"}  # tables stay out
    assert got.annotations == {
        "x-foo": "bar",
        "x-cc": ["k2"],
        "x-basic-type": "my-type",
        "x-exchange": "ex",
        "x-routing-key": "rk",
    }


def test_a_stomp_message_reaches_an_amqp_1_0_receiver():
    message = from_send(
        "", "q", {"persistent": "true", "reply-to": "/topic/replies.a", "custom": "v"}, b"body", "ID:s:1"
    )
    got = received(encode_transfer(message, 0, True, None))
    assert bytes(got.body) == b"body" and got.durable is True
    assert got.reply_to == "/exchanges/amq.topic/replies.a"
    assert got.properties["custom"] == "v" and got.id == "ID:s:1"


def test_an_mqtt_message_reaches_an_amqp_1_0_receiver():
    properties = ((mqtt_packets.RESPONSE_TOPIC, "replies/a"), (mqtt_packets.USER_PROPERTY, ("k", "v")))
    message = Message("amq.topic", "t.a", b"payload", MQTT, encode_publish(1, False, "c1", properties), True)
    got = received(encode_transfer(message, 0, True, None))
    assert bytes(got.body) == b"payload" and got.durable is True
    assert got.reply_to == "/exchanges/amq.topic/replies.a"
    assert got.properties["k"] == "v"
    assert got.annotations["x-mqtt-publish-qos"] == 1


def test_a_message_core_built_reaches_an_amqp_1_0_receiver():
    message = Message.build("", "q", b"{}", Properties(content_type="application/json", headers={"n": 2}))
    assert message.format is NEUTRAL
    got = received(encode_transfer(message, 0, True, None))
    assert got.content_type == "application/json" and got.properties == {"n": 2}
    assert bytes(got.body) == b"{}"


def test_rendering_is_cached_and_shared_with_amqp_0_9_1_consumers():
    message = amqp_091_message(headers={"a": 1})
    message.deaths = (Death("q", "expired", 1_700_000_000, "ex", ("rk",)),)
    first = encode_transfer(message, 0, True, None)
    assert encode_transfer(message, 0, True, None) == first
    header = wire.decode(content_header(message))  # AMQP 0-9-1 renders its own
    assert header.headers["x-death"][0]["reason"] == "expired"
    assert encode_transfer(message, 0, True, None) == first
    other = amqp_091_message(headers={"a": 1})
    other.deaths = message.deaths
    content_header(other)
    assert encode_transfer(other, 0, True, None) == first


# -- deaths ----------------------------------------------------------------------------


def test_deaths_are_x_opt_deaths_for_amqp_1_0_receivers():
    message = decode_transfer(full_proton_message().encode(), "", "q")
    dead = message.dead(Death("q", "rejected", 1_700_000_000, "", ("q",), "2500"), "dlx", "dead")
    dead = dead.dead(Death("q", "rejected", 1_700_000_005, "", ("q",)), "dlx", "dead")
    dead = dead.dead(Death("dlq", "expired", 1_700_000_009, "dlx", ("dead",)), "", "again")
    got = received(encode_transfer(dead, 0, True, None))
    assert got.ttl == 0  # the dead copy has no TTL of its own
    assert got.first_acquirer is False  # RabbitMQ 4's, for a dead letter
    deaths = got.annotations["x-opt-deaths"].elements
    assert [(d["queue"], d["reason"], d["count"]) for d in deaths] == [
        ("dlq", "expired", 1),
        ("q", "rejected", 2),
    ]
    assert deaths[1]["first-time"] == 1_700_000_000_000 and deaths[1]["last-time"] == 1_700_000_005_000
    assert deaths[1]["ttl"] == 2500 and list(deaths[1]["routing-keys"].elements) == ["q"]
    assert got.annotations["x-exchange"] == "" and got.annotations["x-routing-key"] == "again"
    assert bare_of(encode_transfer(dead, 0, False, None)) == bare_of(payload(message))


def test_a_message_published_with_x_opt_deaths_has_that_history():
    deaths = t.Array(
        "map",
        (
            {
                t.Symbol("queue"): "q1",
                t.Symbol("reason"): t.Symbol("expired"),
                t.Symbol("count"): t.ULong(3),
                t.Symbol("first-time"): t.Timestamp(1_000_000),
                t.Symbol("last-time"): t.Timestamp(2_000_000),
                t.Symbol("exchange"): "x",
                t.Symbol("routing-keys"): t.Array("string", ("k",)),
            },
        ),
    )
    message = decode_transfer(section(0x72, {t.Symbol("x-opt-deaths"): deaths}) + section(0x75, b""), "", "q")
    assert message.death_history() == [("q1", "expired")]
    x_death = message.headers["x-death"]
    assert x_death == [
        {
            "count": 3,
            "reason": "expired",
            "queue": "q1",
            "time": datetime.datetime(1970, 1, 1, 0, 16, 40, tzinfo=datetime.UTC),
            "exchange": "x",
            "routing-keys": ["k"],
        }
    ]
    dead = message.dead(Death("q1", "expired", 3_000, "", ("q",)), "", "q2")
    got = received(encode_transfer(dead, 0, False, None)).annotations["x-opt-deaths"].elements
    assert len(got) == 1 and got[0]["count"] == 4 and got[0]["first-time"] == 1_000_000


# -- modified outcome's annotations, headers, the store ------------------------------------


def test_modified_annotations_are_merged_into_an_amqp_1_0_message():
    message = decode_transfer(full_proton_message().encode(), "", "q")
    changed = annotated(message, {symbol("x-opt-a"): "c", symbol("x-opt-new"): t.UInt(5)})
    got = received(encode_transfer(changed, 1, False, None))
    assert got.annotations["x-opt-a"] == "c" and got.annotations["x-opt-new"] == 5
    assert bare_of(encode_transfer(changed, 1, False, None)) == bare_of(payload(message))
    assert (changed.persistent, changed.priority, changed.ttl) == (True, 7, 2500)
    assert annotated(message, {}) is message


def test_modified_annotations_must_start_with_x():
    message = decode_transfer(section(0x75, b"x"), "", "q")
    for key in ("not-x", t.ULong(1)):
        with pytest.raises(DecodeError) as info:
            annotated(message, {key: 1})
        assert info.value.condition == INVALID_FIELD


def test_modified_annotations_become_headers_of_another_protocol_s_message():
    message = amqp_091_message(headers={"a": 1})
    changed = annotated(message, {"x-opt-n": 5, "x-opt-s": "v", "x-opt-b": True, "x-opt-l": [1]})
    assert changed.headers == {"a": 1, "x-opt-n": 5, "x-opt-s": "v", "x-opt-b": "true"}


def test_with_headers_sets_application_properties_and_x_annotations():
    message = decode_transfer(full_proton_message(body=b"y" * 300).encode(), "", "q")
    changed = message.with_headers({"scheduledJobId": "j1", "x-delay": -5, "a": None})
    assert changed.header("x-delay") == -5 and changed.header("scheduledJobId") == "j1"
    assert changed.header("a") is None and changed.header("b") == "x"
    got = received(encode_transfer(changed, 0, True, None))
    assert got.properties == {"b": "x", "f": 1.5, "t": True, "scheduledJobId": "j1"}
    assert got.annotations["x-delay"] == -5 and got.annotations["x-opt-a"] == "b"
    assert bytes(got.body) == b"y" * 300 and got.subject == "subj"
    assert message.header("x-opt-a") == "b" and message.header("a") == 1 and message.header("zz") is None


def test_a_stored_message_reads_back_the_same():
    for data in (
        full_proton_message().encode(),
        ProtonMessage(body=["seq"]).encode(),
        section(0x72, {t.Symbol("x-cc"): ["k"]}) + section(0x75, b"a") + section(0x75, b"b"),
    ):
        message = decode_transfer(data, "ex", "rk")
        meta = message.meta()
        restored = Message.restore("ex", "rk", message.encoded, message.body, meta)
        assert restored.format is AMQP10
        assert (restored.persistent, restored.priority, restored.ttl, restored.cc) == (
            message.persistent,
            message.priority,
            message.ttl,
            message.cc,
        )
        assert encode_transfer(restored, 0, True, None) == encode_transfer(message, 0, True, None)
        assert restored.properties == message.properties


# -- malformed payloads ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        b"",
        section(0x70, [True]),  # no body
        section(0x73, []) + section(0x70, []) + section(0x75, b""),  # out of order
        section(0x70, []) + section(0x70, []) + section(0x75, b""),  # repeated
        section(0x77, 1) + section(0x77, 2),  # two amqp-value sections
        section(0x75, b"") + section(0x77, 2),  # two kinds of body
        section(0x75, "not binary"),
        section(0x76, "not a list"),
        section(0x72, [1]),  # annotations not a map
        section(0x73, {}),  # properties not a list
        section(0x79, b"") + section(0x75, b""),  # unknown section
        section(0x75, b"") + section(0x78, {}) + section(0x75, b""),  # body after the footer
        section(0x75, b"") + section(0x74, {}),  # after the body
        b"\x40" + section(0x75, b""),  # not a described value
        section(0x75, b"abc")[:-1],  # cut short
        section(0x70, ["yes"]) + section(0x75, b""),  # durable not a boolean
        section(0x70, [None, 300]) + section(0x75, b""),  # priority not a ubyte
        section(0x73, [None, "not binary"]) + section(0x75, b""),  # user-id
        section(0x73, [None, None, t.Symbol("to")]) + section(0x75, b""),  # to not a string
        section(0x73, [None, None, None, None, None, None, "not a symbol"]) + section(0x75, b""),
        section(0x74, {"k": [1]}) + section(0x75, b""),  # not a simple value
        section(0x74, {t.Symbol("k"): 1}) + section(0x75, b""),  # key not a string
        b"\x00\x53\x74\xc1\x07\x04\xa1\x01k\x40\xa1\x01k\x40" + section(0x75, b""),  # key twice
        b"\x00\x53\x73\xc0\x04\x01\xa1\x01\xff" + section(0x75, b""),  # not UTF-8
        b"\x00\xa3\x04nope" + b"\x40" + section(0x75, b""),  # unknown symbolic descriptor
    ],
)
def test_malformed_payloads_are_refused_with_decode_error(data):
    with pytest.raises(DecodeError) as info:
        decode_transfer(data, "", "q")
    assert info.value.condition == DECODE_ERROR


def test_a_header_of_the_usual_and_unusual_encodings_reads_the_same():
    for fields in (
        [],
        [True],
        [False, t.UByte(0), t.UInt(0), False, t.UInt(0)],
        [None, t.UByte(255), t.UInt(2**32 - 1), True, t.UInt(300)],
        [True, None, t.UInt(5)],
    ):
        data = section(0x70, fields)
        assert s.read_header(data, 0, len(data)) == s._read_header(data, 0, len(data))
    wide = b"\x00\x53\x70\xd0\x00\x00\x00\x07\x00\x00\x00\x02\x41\x50\x05"
    assert s.read_header(wide, 0, len(wide)) == (True, 5, None)
