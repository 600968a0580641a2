"""queues.features.build: every ``x-`` argument and policy key, which one wins, and the exact
406 PRECONDITION_FAILED texts (RabbitMQ 3.10's where RabbitMQ has the argument; the
texts in tests/test_dead_letter_rabbitmq.py were checked against it)."""

from __future__ import annotations

import datetime
import decimal

import pytest
from hypothesis import given, strategies as st
from rabbitmq_reference import INVALID_QUEUE_ARGUMENTS

from leveret.core.errors import PreconditionFailed
from leveret.core.queue_config import (
    BOUNDED_IN_MEMORY,
    BOUNDED_IN_MEMORY_BYTES,
    DEFAULT_DLQ_PREFIX,
    DEFAULT_IN_MEMORY,
    DEFAULT_IN_MEMORY_BYTES,
    DEFAULT_SHARED_DLQ,
    LAZY_IN_MEMORY,
    DeadLetterConfig,
    QueueConfig,
    amqp_type_name,
    parse_age,
)
from leveret.core.queues.features import build
from leveret.core.redelivery import RedeliveryPolicy

WHERE = " for queue 'q' in vhost '/'"


def config(arguments: dict | None = None, policy: dict | None = None) -> QueueConfig:
    return build(arguments or {}, policy, WHERE)


def refused(arguments: dict, policy: dict | None = None, where: str = WHERE) -> str:
    """The text of the PreconditionFailed (AMQP 406) that build() raises."""
    with pytest.raises(PreconditionFailed) as info:
        build(arguments, policy, where)
    return info.value.text


def field(cfg: QueueConfig, path: str):
    value = cfg
    for part in path.split("."):
        value = getattr(value, part)
    return value


# -- defaults ---------------------------------------------------------------------------
def test_no_arguments_and_no_policy_give_the_defaults():
    cfg = config()
    assert cfg == QueueConfig()
    assert cfg.overflow == "drop-head" and cfg.queue_type == "classic"
    assert cfg.max_in_memory == DEFAULT_IN_MEMORY
    assert cfg.dead_letter == DeadLetterConfig(exchange=None, routing_key=None, strategy=None,
                                               queue=DEFAULT_SHARED_DLQ, prefix=DEFAULT_DLQ_PREFIX,
                                               process_expired=True, process_non_persistent=False)
    assert cfg.redelivery == RedeliveryPolicy(max_redeliveries=-1, initial_delay=0,
                                              exponential=False, multiplier=5.0, max_delay=-1)
    assert (cfg.deduplication, cfg.dedup_header, cfg.cache_size, cfg.cache_ttl) == (
        False, None, 100_000, None)
    assert (cfg.max_age, cfg.max_segment_size) == (None, 500_000_000)


def test_unknown_arguments_and_policy_keys_are_ignored():
    assert config({"x-unknown": 1, "x-queue-master-locator": "min-masters", "plain": "x"},
                  {"ha-mode": "all", "federation-upstream": "u"}) == QueueConfig()


# -- every key, as an argument and as a policy key ---------------------------------------
ACCEPTED = [
    # (key without "x-", value, field, expected)
    ("message-ttl", 0, "message_ttl", 0),
    ("message-ttl", 60_000, "message_ttl", 60_000),
    ("expires", 1, "expires", 1),
    ("max-length", 0, "max_length", 0),
    ("max-length", 2**40, "max_length", 2**40),
    ("max-length-bytes", 1024, "max_length_bytes", 1024),
    ("overflow", "drop-head", "overflow", "drop-head"),
    ("overflow", "reject-publish", "overflow", "reject-publish"),
    ("overflow", "reject-publish-dlx", "overflow", "reject-publish-dlx"),
    ("max-in-memory-length", 0, "max_in_memory", 0),
    ("max-in-memory-length", 7, "max_in_memory", 7),
    ("queue-mode", "lazy", "max_in_memory", LAZY_IN_MEMORY),
    ("queue-mode", "default", "max_in_memory", DEFAULT_IN_MEMORY),
    ("dead-letter-exchange", "dlx", "dead_letter.exchange", "dlx"),
    ("dead-letter-exchange", "", "dead_letter.exchange", ""),  # the default exchange
    ("dead-letter-strategy", "shared", "dead_letter.strategy", "shared"),
    ("dead-letter-strategy", "individual", "dead_letter.strategy", "individual"),
    ("dead-letter-strategy", "discard", "dead_letter.strategy", "discard"),
    ("dead-letter-queue", "my.DLQ", "dead_letter.queue", "my.DLQ"),
    ("dead-letter-queue-prefix", "dead.", "dead_letter.prefix", "dead."),
    ("dead-letter-expired", False, "dead_letter.process_expired", False),
    ("dead-letter-non-persistent", True, "dead_letter.process_non_persistent", True),
    ("max-redeliveries", 0, "redelivery.max_redeliveries", 0),
    ("max-redeliveries", 6, "redelivery.max_redeliveries", 6),
    ("delivery-limit", 3, "redelivery.max_redeliveries", 3),
    ("redelivery-delay", 250, "redelivery.initial_delay", 250),
    ("redelivery-exponential", True, "redelivery.exponential", True),
    ("redelivery-backoff-multiplier", 2, "redelivery.multiplier", 2.0),
    ("redelivery-backoff-multiplier", 1.5, "redelivery.multiplier", 1.5),
    ("redelivery-backoff-multiplier", 1, "redelivery.multiplier", 1.0),
    ("redelivery-max-delay", 0, "redelivery.max_delay", 0),
    ("redelivery-max-delay", 60_000, "redelivery.max_delay", 60_000),
    ("message-deduplication", True, "deduplication", True),
    ("deduplication-header", "x-id", "dedup_header", "x-id"),
    ("cache-size", 1, "cache_size", 1),
    ("cache-ttl", 5000, "cache_ttl", 5000),
    ("queue-type", "classic", "queue_type", "classic"),
    ("queue-type", "stream", "queue_type", "stream"),
    ("max-age", "7D", "max_age", 7 * 86400),
    ("stream-max-segment-size-bytes", 1_000_000, "max_segment_size", 1_000_000),
]


@pytest.mark.parametrize("key,value,path,expected", ACCEPTED)
def test_each_argument_sets_its_field(key, value, path, expected):
    assert field(config({"x-" + key: value}), path) == expected


@pytest.mark.parametrize("key,value,path,expected", ACCEPTED)
def test_each_policy_key_sets_the_same_field(key, value, path, expected):
    assert field(config(policy={key: value}), path) == expected


@pytest.mark.parametrize("key,value,path,expected", [
    ("dead-letter-exchange", b"dlx", "dead_letter.exchange", "dlx"),
    ("overflow", b"reject-publish", "overflow", "reject-publish"),
    ("queue-type", b"stream", "queue_type", "stream"),
    ("max-age", b"12h", "max_age", 12 * 3600),
])
def test_binary_strings_are_read_as_text(key, value, path, expected):
    assert field(config({"x-" + key: value}), path) == expected
    assert field(config(policy={key: value}), path) == expected


@pytest.mark.parametrize("arguments,text", [
    ({"x-dead-letter-exchange": bytearray(b"dlx")},
     "invalid type 'binary' for arg 'x-dead-letter-exchange' in queue 'q' in vhost '/'"),
    ({"x-max-length": bytearray(b"1")},
     "invalid arg 'x-max-length' for queue 'q' in vhost '/': \"expected integer, got binary\""),
])
def test_byte_arrays_from_the_wire_are_refused_as_binary(arguments, text):
    # pamqp decodes a field of type x (pika's bytes) to a bytearray, not bytes
    assert refused(arguments) == text


def test_a_default_queue_has_no_in_memory_limit_and_a_bounded_one_the_old_defaults():
    """RabbitMQ 3.10: a default classic queue pages under memory pressure only; one
    in-memory limit given, the other is what it was before (50,000 messages, 64 MiB)."""
    plain = config()
    assert (plain.max_in_memory, plain.max_in_memory_bytes) == (DEFAULT_IN_MEMORY, DEFAULT_IN_MEMORY_BYTES)
    assert DEFAULT_IN_MEMORY > 10**12 and DEFAULT_IN_MEMORY_BYTES > 10**15
    by_bytes = config({"x-max-in-memory-bytes": 1000})
    assert (by_bytes.max_in_memory, by_bytes.max_in_memory_bytes) == (BOUNDED_IN_MEMORY, 1000)
    by_length = config(policy={"max-in-memory-length": 7})
    assert (by_length.max_in_memory, by_length.max_in_memory_bytes) == (7, BOUNDED_IN_MEMORY_BYTES)
    lazy = config({"x-queue-mode": "lazy"})
    assert (lazy.max_in_memory, lazy.max_in_memory_bytes) == (LAZY_IN_MEMORY, BOUNDED_IN_MEMORY_BYTES)


def test_max_in_memory_length_wins_over_lazy_mode():
    assert config({"x-queue-mode": "lazy", "x-max-in-memory-length": 5}).max_in_memory == 5
    assert config({"x-queue-mode": "lazy"}, {"max-in-memory-length": 0}).max_in_memory == 0


def test_max_redeliveries_and_delivery_limit_together_the_lower_wins():
    assert config({"x-max-redeliveries": 5, "x-delivery-limit": 2}).redelivery.max_redeliveries == 2
    assert config({"x-max-redeliveries": 1}, {"delivery-limit": 4}).redelivery.max_redeliveries == 1


def test_redelivery_is_active_with_a_limit_or_a_delay_only():
    assert not config().redelivery.active
    assert config({"x-max-redeliveries": 0}).redelivery.active
    assert config({"x-redelivery-delay": 1}).redelivery.active
    assert not config({"x-redelivery-delay": 0}).redelivery.active


@pytest.mark.parametrize("text,seconds", [
    ("10s", 10), ("30m", 1800), ("12h", 43200), ("7D", 604800), ("2M", 2 * 30 * 86400),
    ("1Y", 365 * 86400), ("0s", 0), ("120s", 120),
])
def test_max_age_units(text, seconds):
    assert parse_age(text) == seconds
    assert parse_age(None) is None


# -- arguments and policies together ------------------------------------------------------
MIN_WINS = [
    ("message-ttl", "message_ttl", 0), ("expires", "expires", 1),
    ("max-length", "max_length", 0), ("max-length-bytes", "max_length_bytes", 0),
    ("max-redeliveries", "redelivery.max_redeliveries", 0),
    ("delivery-limit", "redelivery.max_redeliveries", 0),
]


@pytest.mark.parametrize("key,path,minimum", MIN_WINS)
@given(data=st.data())
def test_numeric_limits_from_argument_and_policy_the_lower_wins(key, path, minimum, data):
    arg = data.draw(st.integers(minimum, 2**40), label="argument")
    pol = data.draw(st.integers(minimum, 2**40), label="policy")
    assert field(config({"x-" + key: arg}, {key: pol}), path) == min(arg, pol)


ARGUMENT_WINS = [
    ("overflow", "reject-publish", "drop-head", "overflow"),
    ("dead-letter-exchange", "from-arg", "from-policy", "dead_letter.exchange"),
    ("dead-letter-strategy", "individual", "shared", "dead_letter.strategy"),
    ("dead-letter-queue", "arg.DLQ", "pol.DLQ", "dead_letter.queue"),
    ("dead-letter-queue-prefix", "A.", "P.", "dead_letter.prefix"),
    ("dead-letter-expired", False, True, "dead_letter.process_expired"),
    ("dead-letter-non-persistent", True, False, "dead_letter.process_non_persistent"),
    ("redelivery-delay", 100, 500, "redelivery.initial_delay"),
    ("redelivery-delay", 900, 500, "redelivery.initial_delay"),
    ("redelivery-exponential", False, True, "redelivery.exponential"),
    ("redelivery-backoff-multiplier", 2, 3, "redelivery.multiplier"),
    ("redelivery-max-delay", 9000, 10, "redelivery.max_delay"),
    ("max-in-memory-length", 100, 5, "max_in_memory"),
    ("message-deduplication", False, True, "deduplication"),
    ("deduplication-header", "a", "b", "dedup_header"),
    ("cache-size", 10, 5, "cache_size"),
    ("cache-ttl", 10, 5, "cache_ttl"),
    ("queue-type", "classic", "stream", "queue_type"),
    ("max-age", "1h", "1s", "max_age"),
    ("stream-max-segment-size-bytes", 10, 5, "max_segment_size"),
]


@pytest.mark.parametrize("key,arg,pol,path", ARGUMENT_WINS)
def test_other_keys_from_argument_and_policy_the_argument_wins(key, arg, pol, path):
    from_arg = field(config({"x-" + key: arg}), path)
    assert field(config({"x-" + key: arg}, {key: pol}), path) == from_arg
    assert field(config(policy={key: pol}), path) != from_arg  # the policy alone differs


def test_dead_letter_routing_key_in_the_policy_needs_no_exchange():
    assert config(policy={"dead-letter-routing-key": "k"}).dead_letter.routing_key == "k"


def test_dead_letter_routing_key_argument_with_the_exchange_in_a_policy_is_refused():
    # as RabbitMQ: arguments are validated on their own, before any policy applies
    assert refused({"x-dead-letter-routing-key": "k"}, {"dead-letter-exchange": "dlx"}) == (
        "invalid arg 'x-dead-letter-routing-key' for queue 'q' in vhost '/': "
        "routing_key_but_no_dlx_defined")


def test_policy_keys_with_the_x_prefix_are_not_policy_keys():
    assert config(policy={"x-message-ttl": 5}).message_ttl is None


# -- 406 texts --------------------------------------------------------------------------
# The texts checked against RabbitMQ 3.10 (tests/test_dead_letter_rabbitmq.py)
RABBITMQ_TEXTS = INVALID_QUEUE_ARGUMENTS


@pytest.mark.parametrize("arguments,text", RABBITMQ_TEXTS)
def test_invalid_argument_gets_rabbitmqs_text(arguments, text):
    assert refused(arguments) == text


@pytest.mark.parametrize("arguments,text", [
    ({"x-message-ttl": 1.5}, "invalid arg 'x-message-ttl'" + WHERE + ': "expected integer, got double"'),
    ({"x-expires": b"1"}, "invalid arg 'x-expires'" + WHERE + ': "expected integer, got longstr"'),
    ({"x-max-length": -(2**40)}, "invalid arg 'x-max-length'" + WHERE +
     ": {value_negative,-1099511627776}"),
    ({"x-max-length-bytes": {"a": 1}}, "invalid arg 'x-max-length-bytes'" + WHERE +
     ': "expected integer, got table"'),
    ({"x-max-length": [1]}, "invalid arg 'x-max-length'" + WHERE + ': "expected integer, got array"'),
    ({"x-max-length": None}, None),  # a void value is no value: accepted
    ({"x-overflow": 1}, "invalid type 'signedint' for arg 'x-overflow' in queue 'q' in vhost '/'"),
    ({"x-overflow": 2**40}, "invalid type 'long' for arg 'x-overflow' in queue 'q' in vhost '/'"),
    ({"x-dead-letter-exchange": True}, "invalid type 'bool' for arg 'x-dead-letter-exchange' in "
                                       "queue 'q' in vhost '/'"),
    ({"x-dead-letter-routing-key": 1.0, "x-dead-letter-exchange": "d"},
     "invalid type 'double' for arg 'x-dead-letter-routing-key' in queue 'q' in vhost '/'"),
])
def test_type_errors_name_rabbitmqs_field_type(arguments, text):
    if text is None:
        assert config(arguments).max_length is None
    else:
        assert refused(arguments) == text


@pytest.mark.parametrize("arguments,text", [
    ({"x-dead-letter-exchange": "dlx", "x-dead-letter-strategy": "shared"},
     "x-dead-letter-exchange and x-dead-letter-strategy cannot both be set: choose RabbitMQ's "
     "dead-letter exchange or an ActiveMQ dead-letter strategy"),
    ({"x-dead-letter-strategy": "everything"},
     "invalid arg 'x-dead-letter-strategy' for queue 'q' in vhost '/': invalid_dlx_strategy"),
    ({"x-dead-letter-strategy": 1},
     "invalid type 'signedint' for arg 'x-dead-letter-strategy' in queue 'q' in vhost '/'"),
    ({"x-dead-letter-strategy": "shared", "x-dead-letter-queue": "amq.dlq"},
     "invalid arg 'x-dead-letter-queue': 'amq.dlq' (reserved prefix 'amq.')"),
    ({"x-dead-letter-strategy": "individual", "x-dead-letter-queue-prefix": "amq."},
     "invalid arg 'x-dead-letter-queue-prefix': 'amq.' (reserved prefix 'amq.')"),
    ({"x-dead-letter-queue": 7}, "invalid type 'signedint' for arg 'x-dead-letter-queue' in queue 'q' "
                                 "in vhost '/'"),
    ({"x-dead-letter-queue-prefix": False}, "invalid type 'bool' for arg 'x-dead-letter-queue-prefix' "
                                            "in queue 'q' in vhost '/'"),
    ({"x-dead-letter-expired": "false"}, "invalid arg 'x-dead-letter-expired'" + WHERE + ": 'false'"),
    ({"x-dead-letter-non-persistent": 0}, "invalid arg 'x-dead-letter-non-persistent'" + WHERE + ": 0"),
    ({"x-max-redeliveries": -1}, "invalid arg 'x-max-redeliveries'" + WHERE + ": {value_negative,-1}"),
    ({"x-max-redeliveries": "3"}, "invalid arg 'x-max-redeliveries'" + WHERE +
     ': "expected integer, got longstr"'),
    ({"x-delivery-limit": -2}, "invalid arg 'x-delivery-limit'" + WHERE + ": {value_negative,-2}"),
    ({"x-redelivery-delay": -1}, "invalid arg 'x-redelivery-delay'" + WHERE + ": {value_negative,-1}"),
    ({"x-redelivery-delay": 1.5}, "invalid arg 'x-redelivery-delay'" + WHERE +
     ': "expected integer, got double"'),
    ({"x-redelivery-exponential": "yes"}, "invalid arg 'x-redelivery-exponential'" + WHERE + ": 'yes'"),
    ({"x-redelivery-exponential": 1}, "invalid arg 'x-redelivery-exponential'" + WHERE + ": 1"),
    ({"x-redelivery-backoff-multiplier": 0.5}, "invalid arg 'x-redelivery-backoff-multiplier'" + WHERE +
     ": {value_too_small,0.5}"),
    ({"x-redelivery-backoff-multiplier": 0}, "invalid arg 'x-redelivery-backoff-multiplier'" + WHERE +
     ": {value_zero,0}"),
    ({"x-redelivery-backoff-multiplier": "2"}, "invalid arg 'x-redelivery-backoff-multiplier'" + WHERE +
     ": '2'"),
    ({"x-redelivery-backoff-multiplier": True}, "invalid arg 'x-redelivery-backoff-multiplier'" + WHERE +
     ": True"),
    ({"x-redelivery-max-delay": -1}, "invalid arg 'x-redelivery-max-delay'" + WHERE +
     ": {value_negative,-1}"),
    ({"x-max-in-memory-length": -1}, "invalid arg 'x-max-in-memory-length'" + WHERE +
     ": {value_negative,-1}"),
    ({"x-message-deduplication": "true"}, "invalid arg 'x-message-deduplication'" + WHERE + ": 'true'"),
    ({"x-deduplication-header": 1}, "invalid type 'signedint' for arg 'x-deduplication-header' in "
                                    "queue 'q' in vhost '/'"),
    ({"x-cache-size": 0}, "invalid arg 'x-cache-size'" + WHERE + ": {value_zero,0}"),
    ({"x-cache-ttl": -3}, "invalid arg 'x-cache-ttl'" + WHERE + ": {value_negative,-3}"),
    ({"x-queue-type": "raft"}, "invalid arg 'x-queue-type': 'raft'"),
    ({"x-queue-mode": 1}, "invalid type 'signedint' for arg 'x-queue-mode' in queue 'q' in vhost '/'"),
    ({"x-max-age": "7d"}, "invalid arg 'x-max-age': '7d'"),
    ({"x-max-age": "h"}, "invalid arg 'x-max-age': 'h'"),
    ({"x-max-age": "-1h"}, "invalid arg 'x-max-age': '-1h'"),
    ({"x-max-age": "1.5h"}, "invalid arg 'x-max-age': '1.5h'"),
    ({"x-max-age": 10}, "invalid type 'signedint' for arg 'x-max-age' in queue 'q' in vhost '/'"),
    ({"x-stream-max-segment-size-bytes": 0}, "invalid arg 'x-stream-max-segment-size-bytes'" + WHERE +
     ": {value_zero,0}"),
])
def test_invalid_leveret_argument_text(arguments, text):
    assert refused(arguments) == text


@pytest.mark.parametrize("policy,text", [
    ({"message-ttl": -5}, "invalid arg 'message-ttl'" + WHERE + ": {value_negative,-5}"),
    ({"redelivery-delay": -5}, "invalid arg 'redelivery-delay'" + WHERE + ": {value_negative,-5}"),
    ({"max-length": "10"}, "invalid arg 'max-length'" + WHERE + ': "expected integer, got longstr"'),
    ({"overflow": "nope"}, "invalid arg 'overflow'" + WHERE + ": invalid_overflow"),
    ({"dead-letter-exchange": 1}, "invalid type 'signedint' for arg 'dead-letter-exchange' in queue "
                                  "'q' in vhost '/'"),
])
def test_invalid_policy_value_is_refused_at_declaration_naming_the_policy_key(policy, text):
    assert refused({}, policy) == text


def test_an_invalid_argument_is_reported_before_the_policy_value():
    assert refused({"x-message-ttl": -1}, {"message-ttl": -2}) == (
        "invalid arg 'x-message-ttl'" + WHERE + ": {value_negative,-1}")


@given(key=st.sampled_from(["message-ttl", "max-length", "max-length-bytes", "max-redeliveries",
                            "delivery-limit", "redelivery-delay", "redelivery-max-delay",
                            "max-in-memory-length"]),
       value=st.integers(max_value=-1))
def test_any_negative_value_of_a_count_is_value_negative(key, value):
    assert refused({"x-" + key: value}) == (
        f"invalid arg 'x-{key}' for queue 'q' in vhost '/': {{value_negative,{value}}}")


@given(key=st.sampled_from(["expires", "cache-size", "cache-ttl", "stream-max-segment-size-bytes"]),
       value=st.integers(max_value=0))
def test_positive_only_arguments_refuse_zero_and_below(key, value):
    detail = "value_zero" if value == 0 else "value_negative"
    assert refused({"x-" + key: value}) == (
        f"invalid arg 'x-{key}' for queue 'q' in vhost '/': {{{detail},{value}}}")


def test_type_error_text_without_a_where_is_well_formed():
    assert refused({"x-dead-letter-exchange": 5}, where="") == (
        "invalid type 'signedint' for arg 'x-dead-letter-exchange'")
    assert refused({"x-message-ttl": -1}, where="") == "invalid arg 'x-message-ttl': {value_negative,-1}"


# -- amqp_type_name -----------------------------------------------------------------------
@pytest.mark.parametrize("value,name", [
    (True, "bool"), (False, "bool"), (0, "signedint"), (-2**31, "signedint"), (2**31 - 1, "signedint"),
    (2**31, "long"), (-2**31 - 1, "long"), ("s", "longstr"), (b"b", "binary"), (1.5, "double"),
    ({}, "table"), ([], "array"), (None, "void"),
    (datetime.datetime(2024, 1, 1), "timestamp"), (decimal.Decimal("1.5"), "decimal"),
    (bytearray(b"x"), "binary"),
])
def test_amqp_type_name_is_rabbitmqs_name_for_the_field_type(value, name):
    assert amqp_type_name(value) == name
