"""AMQP's form of core messages: a dead copy shows its deaths to core (headers-exchange
routing, deduplication) as a consumer would see them, and a message the broker built
keeps its properties when it dies."""

from __future__ import annotations

from pamqp import commands, header as pamqp_header

from leveret.amqp import field_table, properties as wire
from leveret.core.exchange import HeadersExchange, headers_match
from leveret.core.message import Death, Message, Properties
from leveret.protocol.amqp.message import content_header, from_publish


def published(headers: dict | None = None, expiration: str | None = None) -> Message:
    props = commands.Basic.Properties(headers=headers, expiration=expiration, message_id="m1")
    header = pamqp_header.ContentHeader(body_size=2, properties=props).marshal()
    return from_publish("orders", "new", header, b"hi")


def test_a_dead_copy_shows_its_death_headers_to_core():
    message = published(headers={"CC": ["audit"], "region": "emea"}, expiration="60000")
    death = Death("q", "rejected", 1_700_000_000, "orders", ("new", "audit"), "60000", True)
    dead = message.dead(death, "dlx", "dead")
    headers = dead.headers
    assert headers["x-first-death-reason"] == "rejected"
    assert headers["x-first-death-queue"] == "q"
    assert headers["x-death"][0]["reason"] == "rejected"
    assert "CC" not in headers  # dropped: the dead-letter routing key replaced the key
    assert headers["region"] == "emea"
    assert dead.properties.expiration is None and dead.ttl is None
    assert message.headers["CC"] == ["audit"]  # the original is unchanged
    # what core sees is what a consumer gets
    assert wire.decode(content_header(dead)).headers == headers


def test_a_headers_exchange_routes_dead_letters_by_their_death():
    exchange = HeadersExchange("dlx-h")
    dead = published().dead(Death("q", "expired", 1_700_000_000, "orders", ("new",)), "dlx-h", "")
    assert headers_match({"x-match": "all-with-x", "x-first-death-reason": "expired"}, dead.headers)
    assert not headers_match({"x-match": "all-with-x", "x-first-death-reason": "rejected"},
                             dead.headers)
    assert exchange.route(dead) == []  # no bindings yet: nothing, and no error


def test_a_broker_built_message_keeps_its_properties_when_it_dies():
    built = Message.build("", "replies", b"{}", Properties(
        content_type="application/json", correlation_id="c-1", headers={"a": 1}))
    dead = built.dead(Death("replies", "expired", 1_700_000_000, "", ("replies",)), "dlx", "")
    assert dead.properties.content_type == "application/json"
    assert dead.properties.correlation_id == "c-1"
    rendered = wire.decode(content_header(dead))
    assert rendered.content_type == "application/json" and rendered.correlation_id == "c-1"
    assert rendered.headers["a"] == 1 and rendered.headers["x-first-death-reason"] == "expired"
    restored = Message.restore("dlx", "", b"", dead.body, dead.meta())
    assert restored.properties.correlation_id == "c-1" and len(restored.deaths) == 1


# -- CC / BCC (RabbitMQ's sender-selected distribution) ---------------------------------
def typed(table: dict) -> Message:
    """A message whose headers are ``table`` with the wire types given (pika's)."""
    header = field_table.with_headers(published().encoded, table)
    return from_publish("orders", "new", header, b"hi")


def test_cc_and_bcc_become_routing_keys_and_bcc_leaves_the_header():
    cc = ("A", [("S", b"a"), ("I", 5), ("x", b"raw"), ("S", b"b")])
    message = typed({"CC": cc, "BCC": ("A", [("S", b"c")]), "n": ("I", 7)})
    assert message.cc == ("a", "b", "c")  # only long strings count
    offset = field_table.headers_offset(message.encoded)
    assert field_table.decode_table(message.encoded, offset)[0] == {"CC": cc, "n": ("I", 7)}
    only_bcc = published(headers={"BCC": ["c"]})
    assert wire.decode(only_bcc.encoded).headers == {}  # an empty table stays
    assert published(headers={"cc": ["x"]}).cc == ()  # names are case-sensitive


def test_a_cc_that_is_not_an_array_is_406_with_rabbitmqs_text():
    for headers, text in (({"CC": ("S", b"q")}, '"CC",longstr'), ({"BCC": ("I", 5)}, '"BCC",signedint'),
                          ({"BCC": ("S", b"q"), "CC": ("V", None)}, '"CC",void'),
                          ({"CC": ("x", b"q")}, '"CC",binary'), ({"CC": ("F", {})}, '"CC",table'),
                          ({"CC": ("L", 5)}, '"CC",long')):  # RabbitMQ reads L as l
        try:
            typed(headers)
        except Exception as exc:  # core's PreconditionFailed
            assert str(exc) == f"invalid message: {{unacceptable_type_in_header,{text}}}"
        else:
            raise AssertionError(f"{headers} was accepted")


def test_direct_and_topic_exchanges_route_on_cc_keys_fanout_does_not():
    from leveret.core.exchange import Binding, DirectExchange, FanoutExchange, TopicExchange

    message = published(headers={"CC": ["a.1", "b"], "BCC": ["b", "c.2"]})
    direct, topic, fanout = DirectExchange("d"), TopicExchange("t"), FanoutExchange("f")
    for key in ("new", "b", "zzz"):
        direct.add_binding(Binding(direct, key, key))
    topic.add_binding(Binding(topic, "Q1", "a.*"))
    topic.add_binding(Binding(topic, "Q2", "*.2"))
    topic.add_binding(Binding(topic, "Q3", "#"))
    fanout.add_binding(Binding(fanout, "F", "x"))
    assert direct.route(message) == ["new", "b"]  # each destination once
    assert sorted(topic.route(message)) == ["Q1", "Q2", "Q3"]
    assert fanout.route(message) == ["F"]


def test_cc_keys_survive_the_store_and_a_dead_letter_but_not_a_readdressing():
    message = published(headers={"CC": ["a"], "BCC": ["b"]})
    restored = Message.restore("orders", "new", message.encoded, message.body, message.meta())
    assert restored.cc == ("a", "b")
    kept = message.dead(Death("q", "rejected", 1_700_000_000, "orders", ("new", "a")), "dlx", "new")
    assert kept.cc == ("a", "b")
    gone = message.dead(Death("q", "rejected", 1_700_000_000, "orders", ("new", "a"), None, True),
                        "dlx", "dead")
    assert gone.cc == ()
    assert published().meta() is None  # the common case still costs nothing


def test_one_header_read_alone_is_what_the_full_decode_gives():
    """``Message.header`` reads the headers table without pamqp's decode of every
    property (the delayed-message exchange's ``x-delay`` on each publish); for each
    field type it gives what ``Message.headers`` gives."""
    import datetime
    import decimal

    headers = {
        "x-delay": 1500, "text": "héllo", "big": 2**40, "neg": -3, "flag": True, "off": False,
        "ratio": 0.25, "raw": bytearray(b"\x00\xff"), "nested": {"a": 1}, "list": [1, "x"],
        "money": decimal.Decimal("1.25"), "when": datetime.datetime(2026, 11, 23, 10, 0, 0),
        "nothing": None,
    }
    for name in [*headers, "absent"]:
        fresh = published(headers=headers)
        assert fresh.header(name) == published(headers=headers).headers.get(name), name
    assert published().header("x-delay") is None  # no headers table at all
