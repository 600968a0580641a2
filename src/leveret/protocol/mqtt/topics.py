"""MQTT topic names and topic filters (MQTT 5.0 §4.7, 3.1.1 §4.7), and how they map to
routing keys on a topic exchange.

The mapping is RabbitMQ's MQTT plugin's (3.13 and later): ``/`` ↔ ``.`` (the level
separator), ``+`` ↔ ``*`` (one level), ``#`` ↔ ``#`` (any levels), and a ``.`` inside
an MQTT level becomes ``/`` in the routing key (and back), so MQTT topics with dots
reach AMQP and come back unchanged (RabbitMQ 3.10 turned such dots into separators).

A shared subscription (MQTT 5.0 §4.8.2) is ``$share/<group>/<filter>``.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

SHARE_PREFIX = "$share/"
#: Topics of the broker's own: like ``$`` topics, a filter that starts with a wildcard
#: does not match them (ActiveMQ's advisories, which leveret publishes on ``amq.topic``,
#: would otherwise reach every ``#`` subscriber).
SYSTEM_PREFIXES = ("$", "ActiveMQ/Advisory/")
_TO_KEY = str.maketrans({"/": ".", ".": "/", "+": "*"})
_TO_TOPIC = str.maketrans({".": "/", "/": ".", "*": "+"})


class TopicError(ValueError):
    """A topic name or filter MQTT does not allow (MQTT 5.0 reason code 0x8F
    Topic Filter invalid / 0x90 Topic Name invalid)."""


def check_topic_name(topic: str) -> None:
    """A PUBLISH's (or will's) topic name: not empty, no wildcards (MQTT 5.0 §4.7.3,
    §3.3.2.1); U+0000 was refused by the codec. Raises TopicError."""
    if not topic:
        raise TopicError("a topic name must not be empty")
    if "+" in topic or "#" in topic:
        raise TopicError(f"a topic name must not contain wildcards: {topic!r}")


def check_topic_filter(topic_filter: str) -> None:
    """A SUBSCRIBE's topic filter: not empty, ``#`` only as a whole last level, ``+``
    only as a whole level (MQTT 5.0 §4.7.1). Raises TopicError."""
    if not topic_filter:
        raise TopicError("a topic filter must not be empty")
    levels = topic_filter.split("/")
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != len(levels) - 1):
            raise TopicError(f"'#' must be the whole last level of a topic filter: {topic_filter!r}")
        if "+" in level and level != "+":
            raise TopicError(f"'+' must be a whole level of a topic filter: {topic_filter!r}")


class SharedFilter(NamedTuple):
    """``$share/<group>/<filter>`` split; ``group`` is None for a plain filter."""

    group: str | None
    topic_filter: str


def split_shared(topic_filter: str) -> SharedFilter:
    """The share group and the filter of a subscription (MQTT 5.0 §4.8.2). Raises
    TopicError for a share name that is empty or has a wildcard, or no filter after it."""
    if not topic_filter.startswith(SHARE_PREFIX):
        check_topic_filter(topic_filter)
        return SharedFilter(None, topic_filter)
    group, sep, rest = topic_filter[len(SHARE_PREFIX) :].partition("/")
    if not group or "+" in group or "#" in group or not sep:
        raise TopicError(f"a shared subscription is $share/<group>/<filter>: {topic_filter!r}")
    check_topic_filter(rest)
    return SharedFilter(group, rest)


def to_routing_key(topic: str) -> str:
    """An MQTT topic name or filter as a topic exchange's routing or binding key."""
    return topic.translate(_TO_KEY)


def to_topic(routing_key: str) -> str:
    """A routing key (from any protocol) as the MQTT topic name subscribers see."""
    return routing_key.translate(_TO_TOPIC)


def system_topic(topic: str) -> bool:
    """Whether a filter starting with a wildcard must not match ``topic``
    (:data:`SYSTEM_PREFIXES`)."""
    return topic.startswith(SYSTEM_PREFIXES)


def deliverable(topic: str) -> bool:
    """Whether ``topic`` may be a PUBLISH's topic name: a routing key from AMQP or
    STOMP may hold ``*`` or ``#``, which would be wildcards (MQTT 5.0 §4.7.3: a
    malformed packet for the client), or be empty."""
    return bool(topic) and "+" not in topic and "#" not in topic


def name_part(topic_filter: str) -> str:
    """``topic_filter`` as part of a queue name: its routing key with the wildcards
    spelt out (``*`` → ``%2A``, ``#`` → ``%23``), so the name is never a pattern."""
    return to_routing_key(topic_filter).replace("%", "%25").replace("*", "%2A").replace("#", "%23")


@functools.lru_cache(maxsize=4096)
def _levels(topic_filter: str) -> tuple[str, ...]:
    return tuple(topic_filter.split("/"))


def matches(topic_filter: str, topic: str) -> bool:
    """Whether ``topic`` (a name) matches ``topic_filter`` (MQTT 5.0 §4.7): ``+`` one
    level, ``#`` the parent level and any below it, and a filter starting with a
    wildcard does not match a topic starting with ``$`` (§4.7.2) nor one of
    :data:`SYSTEM_PREFIXES`."""
    pattern = _levels(topic_filter)
    if pattern[0] in ("+", "#") and system_topic(topic):
        return False
    levels = topic.split("/")
    for i, level in enumerate(pattern):
        if level == "#":
            return True
        if i >= len(levels) or (level != "+" and level != levels[i]):
            return False
    return len(levels) == len(pattern)
