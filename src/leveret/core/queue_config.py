"""A queue's effective settings, from its ``x-`` arguments and the matching policy: the
:class:`QueueConfig` every queue has, and :class:`Arguments`, through which each queue
feature (:mod:`.queues.features`) reads and checks its own keys; ``features.build``
puts them together.

As in RabbitMQ 3.10, where both give a numeric limit (``message-ttl``, ``expires``,
``max-length``, ``max-length-bytes``, ``max-redeliveries``; and 3.12's
``consumer-timeout``) the lower wins; for the
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
#: No limit of a queue's own (above any count or size a queue reaches).
UNLIMITED = 2**62
#: A default classic queue (no ``x-queue-mode: lazy``, no ``x-max-in-memory-*``) keeps
#: every ready message in memory, as RabbitMQ 3.10's default classic queue does, until
#: the broker's memory passes the paging threshold (``vm_memory_high_watermark`` ×
#: ``vm_memory_high_watermark_paging_ratio``): then its messages page out to the store
#: (:meth:`.queues.classic.ClassicQueue.memory_short`).
DEFAULT_IN_MEMORY = UNLIMITED
DEFAULT_IN_MEMORY_BYTES = UNLIMITED
#: A bounded queue's ready messages kept in memory before new ones page out, when only
#: ``x-max-in-memory-bytes`` is given; also the most a queue reads back from the store
#: ahead of its consumers (:class:`.queues.backlog.Backlog`).
BOUNDED_IN_MEMORY = 50_000
#: Body bytes the same (``x-max-in-memory-bytes``, as RabbitMQ's quorum queues name it:
#: a few large messages page too), when only ``x-max-in-memory-length`` is given or
#: with ``x-queue-mode: lazy``.
BOUNDED_IN_MEMORY_BYTES = 64 * 1024 * 1024
LAZY_IN_MEMORY = 1_000  # the same for x-queue-mode=lazy
#: A default classic queue that is durable keeps at most this many messages, and this
#: many body bytes, in memory once a persistent message comes: past them a persistent
#: message (written to the store anyway) is paged out rather than also kept in memory,
#: and the messages after it follow it to the store (as RabbitMQ 3.12's classic queues,
#: which keep a small window in memory), so a backlog of persistent messages nobody
#: consumes does not grow the broker's memory.
STORED_IN_MEMORY = 50_000
STORED_IN_MEMORY_BYTES = 32 * 1024 * 1024

_MIN_WINS = {
    "consumer-timeout",
    "message-ttl",
    "expires",
    "max-length",
    "max-length-bytes",
    "max-redeliveries",
    "delivery-limit",
    "delayed-retry-min",  # RabbitMQ 4.3 takes the lower of argument and policy
    "delayed-retry-max",
}


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
    #: the same for persistent messages of a durable queue (see :data:`STORED_IN_MEMORY`)
    stored_in_memory: int = STORED_IN_MEMORY
    stored_in_memory_bytes: int = STORED_IN_MEMORY_BYTES
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
    filter_size: int | None = None  # bytes of a stream chunk's Bloom filter (None: default)
    #: ms a delivery may stay unacknowledged (x-consumer-timeout; None: the broker's)
    consumer_timeout: int | None = None
    consumer_timeout_mode: str | None = None  # close (None) or graceful


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


class Arguments:
    """A queue's ``x-`` arguments and matching policy, read one key at a time with
    RabbitMQ's checks: each feature (:mod:`.queues.features`) reads its own keys
    through :meth:`get`. ``where``: `` for queue 'q' in vhost '/'`` in error texts."""

    __slots__ = ("arguments", "policy", "where")

    def __init__(self, arguments: dict, policy: dict | None, where: str) -> None:
        self.arguments = arguments
        self.policy = policy or {}
        self.where = where

    def get(self, key: str, kind: type, minimum: int | None = None) -> Any:
        """The value of argument ``x-<key>`` or policy key ``<key>`` (the lower of both
        for the numeric limits, else the argument's), of type ``kind`` and at least
        ``minimum``; None when neither is set. PreconditionFailed (406) with RabbitMQ's
        text for a value of the wrong type or too small."""
        where = self.where
        arg = _text(self.arguments.get("x-" + key), "x-" + key, where)
        pol = _text(self.policy.get(key), key, where)
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


#: The highest ``x-max-priority`` RabbitMQ accepts (an AMQP priority is an octet).
MAX_PRIORITY = 255


def max_priority(arguments: dict, queue_type: str, where: str) -> int | None:
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


def flag(value: bool | None, default: bool) -> bool:
    return default if value is None else value


def or_default(value: int | None, default: int) -> int:
    return default if value is None else value
