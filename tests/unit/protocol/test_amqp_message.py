"""AMQP's form of core messages: a dead copy shows its deaths to core (headers-exchange
routing, deduplication) as a consumer would see them, and a message the broker built
keeps its properties when it dies."""

from __future__ import annotations

from pamqp import commands, header as pamqp_header

from leveret.amqp import properties as wire
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
