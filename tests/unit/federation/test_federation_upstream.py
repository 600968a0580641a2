"""Upstream definitions, parsed and checked as RabbitMQ 3.10's federation plugin does."""

from __future__ import annotations

import pytest

from leveret.federation.upstream import FederationError, Upstream, check_upstream_set, policy_upstreams


def test_defaults_are_rabbitmqs():
    upstream = Upstream.from_parameter("/", "up", {"uri": "amqp://h"})
    assert upstream.uris == ("amqp://h",) and upstream.prefetch_count == 1000
    assert upstream.reconnect_delay == 5.0 and upstream.ack_mode == "on-confirm"
    assert upstream.max_hops == 1 and upstream.trust_user_id is False
    assert upstream.exchange is None and upstream.queue is None and upstream.expires is None


def test_every_key_is_read():
    value = {
        "uri": ["amqp://a", "amqps://b"], "prefetch-count": 5, "reconnect-delay": 0.5,
        "ack-mode": "no-ack", "trust-user-id": True, "exchange": "x", "queue": "q",
        "max-hops": 3, "expires": 60000, "message-ttl": 1000, "consumer-tag": "ct",
        "queue-type": "quorum", "bind-nowait": True, "ha-policy": "all",
    }  # fmt: skip
    upstream = Upstream.from_parameter("v", "n", value)
    assert upstream.uris == ("amqp://a", "amqps://b") and upstream.vhost == "v" and upstream.name == "n"
    assert (upstream.prefetch_count, upstream.reconnect_delay, upstream.ack_mode) == (5, 0.5, "no-ack")
    assert (upstream.exchange, upstream.queue, upstream.max_hops) == ("x", "q", 3)
    assert (upstream.expires, upstream.message_ttl, upstream.consumer_tag) == (60000, 1000, "ct")
    assert upstream.trust_user_id and upstream.bind_nowait and upstream.queue_type == "quorum"


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("amqp://x", "JSON object"),
        ({}, '"uri" not found'),
        ({"uri": "http://x"}, "not a valid URI"),
        ({"uri": []}, "non-empty list"),
        ({"uri": "amqp://x", "prefetch-count": "many"}, "prefetch-count"),
        ({"uri": "amqp://x", "max-hops": -1}, "max-hops"),
        ({"uri": "amqp://x", "reconnect-delay": True}, "reconnect-delay"),
        ({"uri": "amqp://x", "ack-mode": "sometimes"}, "ack-mode"),
        ({"uri": "amqp://x", "trust-user-id": "yes"}, "trust-user-id"),
        ({"uri": "amqp://x", "exchange": 3}, "exchange"),
        ({"uri": "amqp://x", "queue-type": "stream"}, "queue-type"),
        ({"uri": "amqp://x", "bogus": 1}, "Unrecognised terms"),
    ],
)
def test_a_bad_upstream_is_refused_naming_the_key(value, reason):
    with pytest.raises(FederationError, match=reason):
        Upstream.from_parameter("/", "bad", value)


def test_upstream_sets_name_upstreams_with_overrides():
    assert check_upstream_set([{"upstream": "a"}, {"upstream": "b", "max-hops": 2}])
    bad_sets = ({"upstream": "a"}, [{"name": "a"}], [{"upstream": "a", "max-hops": "x"}],
                [{"upstream": "a", "x": 1}])
    for bad in bad_sets:
        with pytest.raises(FederationError):
            check_upstream_set(bad)


def test_a_policy_applies_one_upstream_a_set_or_all():
    parameters = {
        ("federation-upstream", "/", "a"): {"uri": "amqp://a"},
        ("federation-upstream", "/", "b"): {"uri": "amqp://b", "max-hops": 1},
        ("federation-upstream", "/", "broken"): {"uri": "http://nope"},
        ("federation-upstream", "other", "c"): {"uri": "amqp://c"},
        ("federation-upstream-set", "/", "s"): [{"upstream": "b", "max-hops": 4}, {"upstream": "missing"}],
    }
    names = lambda definition: [(u.name, u.max_hops) for u in policy_upstreams(parameters, "/", definition)]  # noqa: E731
    assert names({"federation-upstream": "a"}) == [("a", 1)]
    assert names({"federation-upstream-set": "s"}) == [("b", 4)]  # the set's override; a missing one left out
    assert names({"federation-upstream-set": "all"}) == [("a", 1), ("b", 1)]  # this vhost's valid ones
    assert names({"federation-upstream": "missing"}) == [] and names({"max-length": 3}) == []
    assert names(None) == []
