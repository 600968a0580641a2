"""The exchange link's names and decisions, as RabbitMQ 3.10's rabbit_federation_exchange_link
makes them: the upstream queue's name, the URI in ``x-received-from``, which messages
may enter, and how a downstream binding is passed upstream (``x-bound-from``)."""

from __future__ import annotations

import pytest

from leveret.core.clock import ManualClock
from leveret.core.vhost import VirtualHost
from leveret.federation.exchange_link import (
    ExchangeLink,
    should_forward,
    upstream_queue_name,
    uri_vhost,
    without_credentials,
)
from leveret.federation.upstream import Upstream


@pytest.mark.parametrize(
    ("upstream_exchange", "upstream_vhost", "vhost", "exchange", "name"),
    [
        ("fx", "/", "/", "fx", "federation: fx -> n"),
        ("up", "/", "/", "fx", "federation: up -> n:fx"),
        ("fx", "other", "/", "fx", "federation: fx -> n:/:fx"),
    ],
)
def test_upstream_queue_names(upstream_exchange, upstream_vhost, vhost, exchange, name):
    assert upstream_queue_name(upstream_exchange, upstream_vhost, vhost, exchange, "n") == name


def test_uris_as_written_in_x_received_from():
    assert without_credentials("amqp://u:p@host:5673/%2F") == "amqp://host:5673/%2F"
    assert without_credentials("amqps://u@h/v?verify=verify_none&password=k") == "amqps://h/v"  # as 3.10
    assert without_credentials("amqp://h") == "amqp://h"
    assert uri_vhost("amqp://h") == "/" and uri_vhost("amqp://h/") == "/"
    assert uri_vhost("amqp://h/%2F") == "/" and uri_vhost("amqp://h/a%2Fb") == "a/b"


def test_which_messages_may_enter():
    hop = {"cluster-name": "other", "vhost": "/"}
    assert should_forward(None, 1, "me", "/")
    assert should_forward("not an array", 1, "me", "/")
    assert should_forward([hop], 2, "me", "/") and not should_forward([hop], 1, "me", "/")
    assert not should_forward([{"cluster-name": "me", "vhost": "/"}], 5, "me", "/")
    assert should_forward([{"cluster-name": "me", "vhost": "v"}], 5, "me", "/")


def link(max_hops: int = 2) -> tuple[ExchangeLink, VirtualHost]:
    vhost = VirtualHost("/", ManualClock())
    vhost.declare_exchange("fx", "topic")
    upstream = Upstream(name="up", vhost="/", uris=("amqp://h",), max_hops=max_hops)
    made = ExchangeLink("/", "fx", upstream, lambda: "amqp://guest:guest@127.0.0.1:5672/%2F", "down")
    made._upstream_name = "top"
    made._suffix = "A"
    return made, vhost


def test_one_upstream_binding_per_key_and_arguments_counted_by_destination():
    made, vhost = link()
    for name in ("q1", "q2"):
        vhost.declare_queue(name, owner=None)
    vhost.bind("fx", vhost.queues["q1"], "a.*")
    vhost.bind("fx", vhost.queues["q2"], "a.*")
    first, second = vhost.exchanges["fx"].bindings.values()
    hop = {"cluster-name": "down", "vhost": "/", "exchange": "/:fx A", "hops": 2}
    assert made._order("bind", first, "/") == ("a.*", {"x-bound-from": [hop]})
    assert made._order("bind", second, "/") is None  # already bound upstream
    assert made._order("unbind", first, "/") is None  # q2 still wants it
    assert made._order("unbind", second, "/") == ("a.*", {"x-bound-from": [hop]})
    assert made._order("unbind", second, "/") is None  # nothing left to unbind


def test_a_binding_from_another_link_goes_on_one_hop_less():
    made, vhost = link(max_hops=5)
    vhost.declare_exchange("federation: fx -> c B", "fanout")
    below = {"cluster-name": "c", "vhost": "/", "exchange": "/:fx B", "hops": 2}
    vhost.bind("fx", vhost.exchanges["federation: fx -> c B"], "k", {"x-bound-from": [below]})
    [binding] = vhost.exchanges["fx"].bindings.values()
    hop = {"cluster-name": "down", "vhost": "/", "exchange": "/:fx A", "hops": 1}
    assert made._order("bind", binding, "/") == ("k", {"x-bound-from": [hop, below]})
    assert made._order("unbind", binding, "/") == ("k", {"x-bound-from": [hop, below]})
    # no hop left, or the upstream is where the binding came from: it stops here
    made, _ = link(max_hops=5)
    assert made._bound_from({"x-bound-from": [{**below, "hops": 1}]}, "/") is None
    made._upstream_name = "c"
    assert made._bound_from({"x-bound-from": [below]}, "/") is None
    assert made._bound_from({"x-bound-from": [below]}, "elsewhere") is not None
