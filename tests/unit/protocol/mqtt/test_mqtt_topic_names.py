"""MQTT topic names, filters and the routing-key mapping (protocol/mqtt/topics.py)."""

import pytest

from leveret.protocol.mqtt.topics import (
    TopicError,
    check_topic_filter,
    check_topic_name,
    matches,
    split_shared,
    to_routing_key,
    to_topic,
)


@pytest.mark.parametrize("bad", ["", "a/#/b", "a+", "a/b#", "#/a", "+a/b"])
def test_bad_filters_are_refused(bad):
    with pytest.raises(TopicError):
        check_topic_filter(bad)


@pytest.mark.parametrize("good", ["#", "+", "a/+/c", "a/#", "/", "+/+", "a//b", "$SYS/#"])
def test_good_filters_pass(good):
    check_topic_filter(good)


@pytest.mark.parametrize("bad", ["", "a/+", "a/#"])
def test_bad_names_are_refused(bad):
    with pytest.raises(TopicError):
        check_topic_name(bad)


def test_mapping_round_trips_dots_and_separators():
    assert to_routing_key("home/kitchen/temp") == "home.kitchen.temp"
    assert to_routing_key("sensors/+/v1.2/#") == "sensors.*.v1/2.#"
    for topic in ("a/b.c", "x.y", "/a//b/"):
        assert to_topic(to_routing_key(topic)) == topic


@pytest.mark.parametrize(
    ("pattern", "topic", "expected"),
    [
        ("sport/#", "sport", True),
        ("sport/#", "sport/tennis/player1", True),
        ("sport/+", "sport", False),
        ("sport/+", "sport/", True),
        ("+/+", "/finance", True),
        ("+", "/finance", False),
        ("#", "$SYS/uptime", False),
        ("+/monitor", "$SYS/monitor", False),
        ("$SYS/#", "$SYS/uptime", True),
        ("a/b", "a/b/c", False),
    ],
)
def test_matching_follows_the_spec(pattern, topic, expected):
    assert matches(pattern, topic) is expected


def test_shared_subscriptions_split():
    assert split_shared("$share/g1/a/+") == ("g1", "a/+")
    assert split_shared("a/b") == (None, "a/b")
    for bad in ("$share/g1", "$share//a", "$share/g+/a", "$share/g/a/#/b"):
        with pytest.raises(TopicError):
            split_shared(bad)


def test_advisories_are_system_topics_and_amqp_wildcards_are_not_deliverable():
    from leveret.protocol.mqtt.topics import deliverable, name_part

    assert not matches("#", "ActiveMQ/Advisory/Consumer/Queue/q")
    assert matches("ActiveMQ/#", "ActiveMQ/Advisory/Consumer/Queue/q")
    assert not deliverable(to_topic("a.*")) and not deliverable(to_topic("a.#")) and not deliverable("")
    assert deliverable(to_topic("a.b"))
    assert name_part("a/+/#") == "a.%2A.%23" and name_part("50%") == "50%25"
