"""AMQP 1.0 source filters (leveret.protocol.amqp10.filters): which filters of a
source's filter map are applied and echoed, how each matches an AMQP 1.0 message (JMS
selector with Qpid JMS's header names, RabbitMQ 4's property and application-property
filter expressions with &p:/&s: affixes, SQL filter expressions translated to core's
selectors, stream filter values) and the consumer arguments of a stream offset spec."""

from __future__ import annotations

import datetime
import uuid

import pytest
from hypothesis import given, strategies as st

from leveret.core.selector import message_lookup
from leveret.protocol.amqp10 import errors as e, performatives as p
from leveret.protocol.amqp10.filters import source_filters
from leveret.protocol.amqp10.message import decode_transfer
from leveret.protocol.amqp10.types import Described, Symbol, Timestamp, UInt, ULong, encode


def amqp_message(
    subject: str | None = "red.apple",
    app: dict | None = None,
    annotations: dict | None = None,
    priority: int | None = None,
    **props: object,
):
    """A core message as an AMQP 1.0 sender's transfer makes it."""
    sections = []
    if priority is not None:
        sections.append(p.Header(durable=True, priority=priority))
    if annotations:
        sections.append(p.MessageAnnotations({Symbol(k): v for k, v in annotations.items()}))
    sections.append(p.Properties(subject=subject, **props))
    if app is not None:
        sections.append(p.ApplicationProperties(app))
    sections.append(p.Data(b"body"))
    payload = b"".join(encode(p.to_described(s)) for s in sections)
    return decode_transfer(payload, "", "q")


def described(name: str, value: object) -> Described:
    return Described(Symbol(name), value)


def matches(filter_map: dict, message) -> bool:
    selector = source_filters(filter_map).selector
    assert selector is not None
    return selector.matches(message_lookup(message))


# -- echo ---------------------------------------------------------------------------------
def test_no_filter_map_means_no_selector_and_nothing_echoed():
    out = source_filters(None)
    assert out.selector is None and out.arguments == {} and out.echoed is None


def test_unknown_and_malformed_filters_are_not_echoed():
    good = described("amqp:application-properties-filter", {"k": 1})
    filter_map = {
        Symbol("mine"): described("example:unknown", "x"),
        Symbol("not-described"): "x",
        Symbol("empty"): described("amqp:properties-filter", {}),
        Symbol("bad-field"): described("amqp:properties-filter", {Symbol("colour"): "red"}),
        Symbol("bad-affix"): described("amqp:properties-filter", {Symbol("subject"): "&x:red"}),
        Symbol("sql"): described("amqp:sql-filter", "k = 1 AND"),
        Symbol("app"): good,
    }
    out = source_filters(filter_map)
    assert out.echoed == {Symbol("app"): good}
    assert out.selector is not None


def test_filters_are_recognised_by_descriptor_code_too():
    by_code = {
        Symbol("selector"): Described(ULong(0x0000468C00000004), "k = 1"),
        Symbol("props"): Described(ULong(0x173), {Symbol("subject"): "red.apple"}),
    }
    out = source_filters(by_code)
    assert set(out.echoed or {}) == {Symbol("selector"), Symbol("props")}
    assert matches(by_code, amqp_message(app={"k": 1}))
    assert not matches(by_code, amqp_message(app={"k": 2}))


def test_sql_and_property_filters_exclude_each_other_first_wins():
    props = described("amqp:properties-filter", {Symbol("subject"): "red.apple"})
    sql = described("amqp:sql-filter", "k = 1")
    out = source_filters({Symbol("p"): props, Symbol("sql-filter"): sql})
    assert list(out.echoed or {}) == [Symbol("p")]
    out = source_filters({Symbol("sql-filter"): sql, Symbol("p"): props})
    assert list(out.echoed or {}) == [Symbol("sql-filter")]


def test_one_property_filter_of_each_section():
    first = described("amqp:application-properties-filter", {"k": 1})
    second = described("amqp:application-properties-filter", {"k": 2})
    out = source_filters({Symbol("a"): first, Symbol("b"): second})
    assert list(out.echoed or {}) == [Symbol("a")]


def test_too_many_fields_is_not_applied():
    many = {f"k{i}": i for i in range(17)}
    assert source_filters({Symbol("a"): described("amqp:application-properties-filter", many)}).echoed == {}
    many.pop("k16")
    assert source_filters({Symbol("a"): described("amqp:application-properties-filter", many)}).echoed


# -- JMS selector -------------------------------------------------------------------------
def test_jms_selector_on_application_properties_and_header_fields():
    f = {Symbol("jms-selector"): described("apache.org:selector-filter:string", "k > 2 AND JMSPriority = 7")}
    assert matches(f, amqp_message(app={"k": 3}, priority=7))
    assert not matches(f, amqp_message(app={"k": 3}))  # priority 4 by default
    assert not matches(f, amqp_message(app={"k": 2}, priority=7))


def test_jms_selector_reads_qpid_jms_names():
    f = {
        Symbol("s"): described(
            "apache.org:selector-filter:string",
            "JMSType = 'red.apple' AND JMSXGroupID = 'g1' AND JMSXGroupSeq = 3 AND JMSCorrelationID = 'c'",
        )
    }
    msg = amqp_message(group_id="g1", group_sequence=UInt(3), correlation_id="c")
    assert matches(f, msg)
    assert not matches(
        f, amqp_message(subject="green", group_id="g1", group_sequence=UInt(3), correlation_id="c")
    )


def test_jms_timestamp_is_the_creation_time():
    f = {
        Symbol("s"): described(
            "apache.org:selector-filter:string", "JMSTimestamp > 1000 AND JMSExpiration = 0"
        )
    }
    assert matches(f, amqp_message(creation_time=Timestamp(2000)))
    assert not matches(f, amqp_message(creation_time=Timestamp(500)))
    assert not matches(f, amqp_message())  # none: unknown


def test_invalid_jms_selector_refuses_the_attach():
    with pytest.raises(e.LinkFault) as info:
        source_filters({Symbol("s"): described("apache.org:selector-filter:string", "k >")})
    assert info.value.condition == "amqp:invalid-field"


# -- property filter expressions ----------------------------------------------------------
@pytest.mark.parametrize(
    ("reference", "expected"),
    [
        ("red.apple", True),
        ("red", False),
        ("&p:red.", True),
        ("&p:green", False),
        ("&s:.apple", True),
        ("&s:pear", False),
        (None, True),
    ],
)
def test_properties_filter_subject(reference, expected):
    f = {Symbol("p"): described("amqp:properties-filter", {Symbol("subject"): reference})}
    assert matches(f, amqp_message()) is expected


def test_escaped_ampersand_is_a_plain_string():
    f = {Symbol("p"): described("amqp:properties-filter", {Symbol("subject"): "&&p:x"})}
    assert matches(f, amqp_message(subject="&p:x"))
    assert not matches(f, amqp_message(subject="x"))


def test_properties_filter_ids_times_and_every_field_must_match():
    ident = uuid.uuid4()
    msg = amqp_message(
        message_id=ident,
        correlation_id=ULong(42),
        content_type=Symbol("text/plain"),
        creation_time=Timestamp(1_700_000_000_000),
        to="/queues/q",
    )
    fields = {
        Symbol("message-id"): ident,
        Symbol("correlation-id"): ULong(42),
        Symbol("content-type"): Symbol("text/plain"),
        Symbol("creation-time"): Timestamp(1_700_000_000_000),
        Symbol("to"): "&p:/queues/",
    }
    assert matches({Symbol("p"): described("amqp:properties-filter", fields)}, msg)
    fields[Symbol("correlation-id")] = ULong(43)
    assert not matches({Symbol("p"): described("amqp:properties-filter", fields)}, msg)


def test_application_properties_filter_types():
    msg = amqp_message(app={"n": 5, "f": 2.0, "b": True, "s": "order-17", "nothing": None})
    f = "amqp:application-properties-filter"
    assert matches({Symbol("a"): described(f, {"n": 5.0})}, msg)  # numbers across types
    assert matches({Symbol("a"): described(f, {"f": 2})}, msg)
    assert not matches({Symbol("a"): described(f, {"b": 1})}, msg)  # booleans only with booleans
    assert matches({Symbol("a"): described(f, {"b": True, "s": "&p:order-"})}, msg)
    assert matches({Symbol("a"): described(f, {"nothing": None})}, msg)  # null matches a present one
    assert not matches({Symbol("a"): described(f, {"missing": None})}, msg)  # not an absent one
    assert not matches({Symbol("a"): described(f, {"s": "&s:18"})}, msg)


# -- SQL filter expressions ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("k = 1", True),
        ("k != 1", False),
        ("a.k = 1 AND properties.subject = 'red.apple'", True),
        ("p.subject LIKE 'red.%' AND h.priority = 4", True),
        ('[my key] = "it\'s" OR k = 2', True),
        ("p.group_id IS NULL AND missing IS NULL", True),
        ("k IN ('1', '2')", False),  # a number is not in a list of strings
        ("NOT (k > 0 AND k < 5)", False),
        ("k * 2 + 1 = 3.0", True),
        ("k = 1 and p.subject = 'x'", False),  # keywords in any case
    ],
)
def test_sql_filter(sql, expected):
    msg = amqp_message(app={"k": 1, "my key": "it's"})
    assert matches({Symbol("sql-filter"): described("amqp:sql-filter", sql)}, msg) is expected


@pytest.mark.parametrize(
    "sql",
    [
        "k % 2 = 1",
        "k BETWEEN 0 AND 5",
        "p.creation_time < UTC()",
        "a.b = 0x0102",
        "x.subject = 'a'",
        "p.colour = 'a'",
        "k =",
        "'a' < 'b'",
    ],
)
def test_sql_filter_outside_cores_grammar_is_not_applied(sql):
    out = source_filters({Symbol("sql-filter"): described("amqp:sql-filter", sql)})
    assert out.echoed == {} and out.selector is None


def test_sql_filter_token_limit():
    sql = " OR ".join(["k = 1"] * 67)  # 3 * 67 + 66 = 267 tokens
    assert source_filters({Symbol("sql-filter"): described("amqp:sql-filter", sql)}).echoed == {}


# -- streams ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("spec", "argument"),
    [
        ("first", "first"),
        (Symbol("last"), "last"),
        ("next", "next"),
        (ULong(17), 17),
        (Timestamp(1_700_000_000_000), datetime.datetime.fromtimestamp(1_700_000_000, datetime.UTC)),
    ],
)
def test_stream_offset_spec(spec, argument):
    f = {Symbol("rabbitmq:stream-offset-spec"): described("rabbitmq:stream-offset-spec", spec)}
    out = source_filters(f, stream=True)
    assert out.arguments == {"x-stream-offset": argument}
    assert out.echoed == f and out.selector is None


def test_stream_offset_spec_only_on_streams_and_valid_ones():
    f = {Symbol("o"): described("rabbitmq:stream-offset-spec", "first")}
    assert source_filters(f).echoed == {} and source_filters(f).arguments == {}
    interval = {Symbol("o"): described("rabbitmq:stream-offset-spec", "10m")}
    assert source_filters(interval, stream=True, now=1_700_000_600).arguments == {
        "x-stream-offset": datetime.datetime.fromtimestamp(1_700_000_000, datetime.UTC)
    }
    assert source_filters(interval, stream=True).echoed == {}  # no clock to count from
    bad = {Symbol("o"): described("rabbitmq:stream-offset-spec", "10 minutes")}
    assert source_filters(bad, stream=True, now=1_700_000_600).echoed == {}
    undescribed = {Symbol("rabbitmq:stream-offset-spec"): "last"}  # RabbitMQ still reads these
    assert source_filters(undescribed, stream=True).arguments == {"x-stream-offset": "last"}


def test_stream_filter_values_and_match_unfiltered():
    red = amqp_message(annotations={"x-stream-filter-value": "red"})
    blue = amqp_message(annotations={"x-stream-filter-value": "blue"})
    none = amqp_message()
    values = described("rabbitmq:stream-filter", ["red", "green"])
    f = {Symbol("rabbitmq:stream-filter"): values}
    assert [matches(f, m) for m in (red, blue, none)] == [True, False, False]
    f[Symbol("rabbitmq:stream-match-unfiltered")] = described("rabbitmq:stream-match-unfiltered", True)
    assert [matches(f, m) for m in (red, blue, none)] == [True, False, True]
    single = {Symbol("f"): described("rabbitmq:stream-filter", "blue")}
    assert [matches(single, m) for m in (red, blue, none)] == [False, True, False]


def test_all_applied_filters_must_match():
    f = {
        Symbol("rabbitmq:stream-filter"): described("rabbitmq:stream-filter", "red"),
        Symbol("a"): described("amqp:application-properties-filter", {"k": 1}),
    }
    assert matches(f, amqp_message(app={"k": 1}, annotations={"x-stream-filter-value": "red"}))
    assert not matches(f, amqp_message(app={"k": 2}, annotations={"x-stream-filter-value": "red"}))
    assert not matches(f, amqp_message(app={"k": 1}, annotations={"x-stream-filter-value": "blue"}))


# -- a stream delivery's x-stream-offset annotation ---------------------------------------
def test_with_annotations_inserts_or_merges_message_annotations():
    from leveret.protocol.amqp10.delivery_annotations import with_annotations
    from leveret.protocol.amqp10.types import decode_all

    def sections(payload: bytes) -> list:
        return [p.from_described(v) for v in decode_all(payload)]

    header, props, data = (
        encode(p.to_described(s)) for s in (p.Header(durable=True), p.Properties(), p.Data(b"x"))
    )
    out = sections(with_annotations(header + props + data, (("x-stream-offset", 7),)))
    assert [type(s) for s in out] == [p.Header, p.MessageAnnotations, p.Properties, p.Data]
    assert out[1].value == {"x-stream-offset": 7}
    annotations = encode(p.to_described(p.MessageAnnotations({Symbol("x-opt-a"): "b"})))
    out = sections(with_annotations(annotations + data, (("x-stream-offset", 8),)))
    assert [type(s) for s in out] == [p.MessageAnnotations, p.Data]
    assert out[0].value == {"x-opt-a": "b", "x-stream-offset": 8}


# -- any input ----------------------------------------------------------------------------
_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20) | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
_descriptors = st.sampled_from(
    [
        "apache.org:selector-filter:string",
        "amqp:properties-filter",
        "amqp:application-properties-filter",
        "amqp:sql-filter",
        "rabbitmq:stream-offset-spec",
        "rabbitmq:stream-filter",
        "rabbitmq:stream-match-unfiltered",
        "x:other",
    ]
)


@given(
    st.dictionaries(
        st.text(max_size=8).map(Symbol),
        st.builds(lambda d, v: Described(Symbol(d), v), _descriptors, _values)
        | st.builds(lambda v: Described(Symbol("amqp:sql-filter"), v), st.text(max_size=60)),
        max_size=4,
    )
)
def test_any_filter_map_gives_filters_or_an_invalid_field_refusal(filter_map):
    try:
        out = source_filters(filter_map, stream=True, now=1_700_000_000)
    except e.LinkFault as exc:
        assert exc.condition == "amqp:invalid-field"
        return
    assert set(out.echoed or {}) <= set(filter_map)
    if out.selector is not None:
        for message in (amqp_message(), amqp_message(app={"k": 1, "a": "x"}, priority=9)):
            assert out.selector.evaluate(message_lookup(message)) in (True, False, None)
