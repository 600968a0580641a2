"""A queue's effective settings, from its ``x-`` arguments and the matching policy.

As in RabbitMQ 3.10, where both give a numeric limit (``message-ttl``, ``expires``,
``max-length``, ``max-length-bytes``, ``max-redeliveries``) the lower wins; for the
others the queue argument wins over the policy. Invalid values are a 406
PRECONDITION_FAILED at declaration, naming the argument.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from .deduplication import DEFAULT_CACHE_SIZE
from .errors import precondition_failed
from .redelivery import RedeliveryPolicy

OVERFLOW_MODES = ("drop-head", "reject-publish", "reject-publish-dlx")
STRATEGIES = ("shared", "individual", "discard")
#: RabbitMQ's quorum-queue dead-letter strategies (the same argument, other values):
#: whether a dead message may be lost on the way to its dead-letter exchange's queues.
DELIVERY_GUARANTEES = ("at-most-once", "at-least-once")
DEFAULT_SHARED_DLQ = "leveret.DLQ"
DEFAULT_DLQ_PREFIX = "DLQ."
DEFAULT_IN_MEMORY = 50_000  # ready messages kept in memory before paging out
#: Body bytes a classic queue keeps in memory before paging new messages out (with a
#: store): a few large messages page too (``x-max-in-memory-bytes``, as RabbitMQ's
#: quorum queues name it).
DEFAULT_IN_MEMORY_BYTES = 64 * 1024 * 1024
LAZY_IN_MEMORY = 1_000  # the same for x-queue-mode=lazy

_MIN_WINS = {"message-ttl", "expires", "max-length", "max-length-bytes", "max-redeliveries", "delivery-limit"}


@dataclass(frozen=True)
class DeadLetterConfig:
    """Where a queue's dead messages go: a dead-letter exchange (RabbitMQ) or a
    dead-letter strategy (ActiveMQ); neither means they are dropped."""

    exchange: str | None = None
    routing_key: str | None = None
    strategy: str | None = None
    #: RabbitMQ's ``x-dead-letter-strategy`` for quorum queues; within one leveret the
    #: dead copy is routed in the same store write that removes the original, so both
    #: values keep it (at-least-once) and the setting is recorded only.
    guarantee: str = "at-most-once"
    queue: str = DEFAULT_SHARED_DLQ
    prefix: str = DEFAULT_DLQ_PREFIX
    process_expired: bool = True
    process_non_persistent: bool = False


@dataclass(frozen=True)
class QueueConfig:
    """A queue's effective settings (:func:`build`); None: no limit. Lengths count
    messages, sizes are body bytes."""

    message_ttl: int | None = None  # ms
    expires: int | None = None  # ms
    max_length: int | None = None
    max_length_bytes: int | None = None
    overflow: str = "drop-head"
    max_in_memory: int = DEFAULT_IN_MEMORY
    max_in_memory_bytes: int = DEFAULT_IN_MEMORY_BYTES
    dead_letter: DeadLetterConfig = field(default_factory=DeadLetterConfig)
    redelivery: RedeliveryPolicy = field(default_factory=RedeliveryPolicy)
    deduplication: bool = False
    dedup_header: str | None = None
    cache_size: int = DEFAULT_CACHE_SIZE
    cache_ttl: int | None = None  # ms
    queue_type: str = "classic"
    single_active_consumer: bool = False
    max_priority: int | None = None  # x-max-priority: priorities 0..max_priority (classic)
    max_age: float | None = None  # seconds (streams)
    max_segment_size: int = 500_000_000  # bytes (streams)


def _text(value: Any, source: str, where: str) -> Any:
    """A long string argument as text: pamqp hands over bytes that are not UTF-8, which
    no queue argument can use (406, not an internal error)."""
    if not isinstance(value, bytes):
        return value
    try:
        return value.decode()
    except UnicodeDecodeError:
        raise precondition_failed(f"invalid arg '{source}'{where}: not valid UTF-8") from None


def amqp_type_name(value: Any) -> str:
    """RabbitMQ's name for the field type a (decoded) value most likely had."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "signedint" if -(2**31) <= value < 2**31 else "long"
    return {
        str: "longstr",
        bytes: "binary",
        float: "double",
        dict: "table",
        list: "array",
        type(None): "void",
        Decimal: "decimal",
        bytearray: "binary",
    }.get(type(value), "timestamp")  # pamqp decodes x as bytearray


def build(arguments: dict, policy_definition: dict | None = None, where: str = "") -> QueueConfig:
    """The effective config of a queue declared with ``arguments`` under the policy
    ``policy_definition``. Raises PreconditionFailed (AMQP 406) for an invalid value, with
    RabbitMQ's text (``where``: `` for queue 'q' in vhost '/'``)."""
    policy = policy_definition or {}

    def get(key: str, kind: type, minimum: int | None = None) -> Any:
        arg = _text(arguments.get("x-" + key), "x-" + key, where)
        pol = _text(policy.get(key), key, where)
        for source, value in (("x-" + key, arg), (key, pol)):
            if value is None:
                continue
            ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
            if kind is float:
                ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not ok and kind is str:
                raise precondition_failed(
                    f"invalid type '{amqp_type_name(value)}' for arg "
                    f"'{source}'{where.replace(' for ', ' in ', 1)}"
                )
            if not ok and kind is int:
                raise precondition_failed(
                    f"invalid arg '{source}'{where}: \"expected integer, got {amqp_type_name(value)}\""
                )
            if not ok:
                raise precondition_failed(f"invalid arg '{source}'{where}: {value!r}")
            if minimum is not None and value < minimum:
                detail = "value_zero" if value == 0 else "value_negative" if value < 0 else "value_too_small"
                raise precondition_failed(f"invalid arg '{source}'{where}: {{{detail},{value}}}")
        if arg is not None and pol is not None and key in _MIN_WINS:
            return min(arg, pol)
        return arg if arg is not None else pol

    overflow = get("overflow", str) or "drop-head"
    if overflow not in OVERFLOW_MODES:
        source = "x-overflow" if arguments.get("x-overflow") is not None else "overflow"
        raise precondition_failed(f"invalid arg '{source}'{where}: invalid_overflow")
    strategy = get("dead-letter-strategy", str)
    guarantee = "at-most-once"
    if strategy in DELIVERY_GUARANTEES:  # RabbitMQ's meaning (quorum queues)
        guarantee, strategy = strategy, None
    elif strategy is not None and strategy not in STRATEGIES:
        raise precondition_failed(f"invalid arg 'x-dead-letter-strategy'{where}: invalid_dlx_strategy")
    exchange = get("dead-letter-exchange", str)
    if "x-dead-letter-routing-key" in arguments and "x-dead-letter-exchange" not in arguments:
        raise precondition_failed(
            f"invalid arg 'x-dead-letter-routing-key'{where}: routing_key_but_no_dlx_defined"
        )
    if exchange is not None and strategy is not None:
        raise precondition_failed(
            "x-dead-letter-exchange and x-dead-letter-strategy cannot both be set: "
            "choose RabbitMQ's dead-letter exchange or an ActiveMQ dead-letter strategy"
        )
    for key in ("dead-letter-queue", "dead-letter-queue-prefix"):
        name = get(key, str)
        if strategy is not None and name is not None and name.startswith("amq."):
            # the broker could not declare it when a message dies: refuse it up front
            raise precondition_failed(f"invalid arg 'x-{key}': '{name}' (reserved prefix 'amq.')")
    queue_type = get("queue-type", str) or "classic"
    if queue_type not in ("classic", "stream", "quorum"):
        raise precondition_failed(f"invalid arg 'x-queue-type': '{queue_type}'")
    single_active = arguments.get("x-single-active-consumer", False)
    if not isinstance(single_active, bool):  # an argument only: RabbitMQ has no such policy key
        kind = amqp_type_name(single_active)
        raise precondition_failed(
            f"invalid arg 'x-single-active-consumer'{where}: {{unacceptable_type,{kind}}}"
        )
    max_priority = _max_priority(arguments, queue_type, where)
    max_age = parse_age(get("max-age", str))
    limits = [v for v in (get("max-redeliveries", int, 0), get("delivery-limit", int, 0)) if v is not None]
    in_memory = get("max-in-memory-length", int, 0)
    if in_memory is None:
        in_memory = LAZY_IN_MEMORY if get("queue-mode", str) == "lazy" else DEFAULT_IN_MEMORY
    return QueueConfig(
        message_ttl=get("message-ttl", int, 0),
        expires=get("expires", int, 1),
        max_length=get("max-length", int, 0),
        max_length_bytes=get("max-length-bytes", int, 0),
        overflow=overflow,
        max_in_memory=in_memory,
        max_in_memory_bytes=_or(get("max-in-memory-bytes", int, 0), DEFAULT_IN_MEMORY_BYTES),
        deduplication=_flag(get("message-deduplication", bool), False),
        dedup_header=get("deduplication-header", str),
        cache_size=_or(get("cache-size", int, 1), DEFAULT_CACHE_SIZE),
        cache_ttl=get("cache-ttl", int, 1),
        queue_type=queue_type,
        single_active_consumer=single_active,
        max_priority=max_priority,
        max_age=max_age,
        max_segment_size=_or(get("stream-max-segment-size-bytes", int, 1), 500_000_000),
        dead_letter=DeadLetterConfig(
            exchange=exchange,
            routing_key=get("dead-letter-routing-key", str),
            strategy=strategy,
            guarantee=guarantee,
            queue=get("dead-letter-queue", str) or DEFAULT_SHARED_DLQ,
            prefix=get("dead-letter-queue-prefix", str) or DEFAULT_DLQ_PREFIX,
            process_expired=_flag(get("dead-letter-expired", bool), True),
            process_non_persistent=_flag(get("dead-letter-non-persistent", bool), False),
        ),
        redelivery=RedeliveryPolicy(
            max_redeliveries=min(limits) if limits else -1,
            initial_delay=get("redelivery-delay", int, 0) or 0,
            exponential=_flag(get("redelivery-exponential", bool), False),
            multiplier=float(get("redelivery-backoff-multiplier", float, 1) or 5.0),
            max_delay=_or(get("redelivery-max-delay", int, 0), -1),
        ),
    )


#: The highest ``x-max-priority`` RabbitMQ accepts (an AMQP priority is an octet).
MAX_PRIORITY = 255


def _max_priority(arguments: dict, queue_type: str, where: str) -> int | None:
    """``x-max-priority`` as RabbitMQ 3.10 checks it: an integer 0..255, from the queue
    argument only (RabbitMQ refuses a ``max-priority`` policy key; here a policy's is
    ignored), on classic queues only. PreconditionFailed (406) with RabbitMQ's texts."""
    if "x-max-priority" not in arguments:
        return None
    value = arguments["x-max-priority"]
    if queue_type != "classic":
        raise precondition_failed(
            f"invalid arg 'x-max-priority'{where} of queue type rabbit_{queue_type}_queue"
        )
    if isinstance(value, bool) or not isinstance(value, int):
        raise precondition_failed(
            f"invalid arg 'x-max-priority'{where}: \"expected integer, got {amqp_type_name(value)}\""
        )
    if value < 0:
        raise precondition_failed(f"invalid arg 'x-max-priority'{where}: {{value_negative,{value}}}")
    if value > MAX_PRIORITY:
        raise precondition_failed(f"invalid arg 'x-max-priority'{where}: {{max_value_exceeded,{value}}}")
    return value


_AGE_UNITS = {"Y": 365 * 86400, "M": 30 * 86400, "D": 86400, "h": 3600, "m": 60, "s": 1}


def parse_age(text: str | None) -> float | None:
    """RabbitMQ's ``x-max-age`` (``7D``, ``12h``, ``30m``, ``10s``; Y, M, D, h, m, s) in
    seconds; PreconditionFailed (AMQP 406) if malformed."""
    if text is None:
        return None
    if len(text) < 2 or text[-1] not in _AGE_UNITS or not text[:-1].isdigit():
        raise precondition_failed(f"invalid arg 'x-max-age': '{text}'")
    return int(text[:-1]) * _AGE_UNITS[text[-1]]


def _flag(value: bool | None, default: bool) -> bool:
    return default if value is None else value


def _or(value: int | None, default: int) -> int:
    return default if value is None else value
