"""The shovel definition parser (RabbitMQ's dynamic-shovel keys), and fuzzing: any JSON
value is either a definition or a ShovelError, never another exception."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from leveret.shovel.spec import DEFAULT_PREFETCH, ShovelError, ShovelSpec

MINIMAL = {"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://h/%2F"}


def test_defaults_are_rabbitmqs():
    spec = ShovelSpec.from_parameter(MINIMAL)
    assert spec.src_uris == ("amqp://",) and spec.dest_uris == ("amqp://h/%2F",)
    assert (spec.ack_mode, spec.delete_after, spec.prefetch_count, spec.reconnect_delay) == (
        "on-confirm", "never", DEFAULT_PREFETCH, 1.0)  # fmt: skip
    assert spec.dest_queue is None and spec.dest_exchange is None  # the message's own address


def test_every_key_is_read_including_the_older_names():
    spec = ShovelSpec.from_parameter({
        "src-uri": ["amqp://a", "amqps://b"], "src-exchange": "x", "src-exchange-key": "k.#",
        "dest-uri": "amqp://", "dest-exchange": "y", "dest-exchange-key": "z", "ack-mode": "no-ack",
        "delete-after": 5, "prefetch-count": 10, "reconnect-delay": 0.5,
        "src-protocol": "amqp091", "dest-protocol": "amqp091",
    })  # fmt: skip
    assert spec.src_uris == ("amqp://a", "amqps://b") and spec.src_exchange == "x"
    assert (spec.src_exchange_key, spec.dest_exchange, spec.dest_exchange_key) == ("k.#", "y", "z")
    assert (spec.ack_mode, spec.delete_after) == ("no-ack", 5)
    assert (spec.prefetch_count, spec.reconnect_delay) == (10, 0.5)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"src-queue": None}, "exactly one of src-queue or src-exchange"),
        ({"src-exchange": "x"}, "exactly one of src-queue or src-exchange"),
        ({"dest-queue": "q", "dest-exchange": "x"}, "both dest-queue and dest-exchange"),
        ({"dest-uri": []}, "dest-uri"),
        ({"dest-uri": ["amqp://", 3]}, "dest-uri"),
        ({"src-protocol": "amqp10"}, "src-protocol"),
        ({"src-prefetch-count": True}, "src-prefetch-count"),
        ({"reconnect-delay": "soon"}, "reconnect-delay"),
        ({"src-delete-after": "sometimes"}, "src-delete-after"),
        ({"src-queue": None, "src-exchange": "x", "src-delete-after": "queue-length"}, "needs src-queue"),
        ({"src-queue": 7}, "src-queue must be a string"),
    ],
)
def test_refusals_name_the_key(change, reason):
    value = {k: v for k, v in {**MINIMAL, **change}.items() if v is not None}
    with pytest.raises(ShovelError, match=reason):
        ShovelSpec.from_parameter(value)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)
KEYS = st.sampled_from(
    ["src-uri", "src-queue", "src-exchange", "src-exchange-key", "dest-uri", "dest-queue", "dest-exchange",
     "dest-exchange-key", "ack-mode", "src-delete-after", "src-prefetch-count", "reconnect-delay"]
)  # fmt: skip


LIKELY = st.sampled_from(["amqp://", "on-publish", "queue-length"])


@settings(max_examples=400, deadline=None)
@given(st.one_of(JSON, st.dictionaries(KEYS, JSON | LIKELY)))
def test_any_json_value_is_a_definition_or_a_shovel_error(value):
    try:
        spec = ShovelSpec.from_parameter(value)
    except ShovelError as exc:
        assert str(exc)
        return
    assert spec.src_uris and spec.dest_uris
    assert (spec.src_queue is None) != (spec.src_exchange is None)
