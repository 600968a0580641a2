"""Dead-lettering configuration, LavinMQ's ``Queue::Feature::DeadLettering``: where a
queue's dead messages go (:mod:`...dead_letter` sends them; the queue hands each back
to its host as a :class:`..host.DeadLetter`).

RabbitMQ's dead-letter exchange: ``x-dead-letter-exchange``, ``x-dead-letter-routing-key``
(only with an exchange), ``x-dead-letter-strategy`` ``at-most-once``/``at-least-once``
(quorum queues; recorded). ActiveMQ's strategies: ``x-dead-letter-strategy``
``shared``/``individual``/``discard``, ``x-dead-letter-queue`` (shared),
``x-dead-letter-queue-prefix`` (individual), ``x-dead-letter-expired``,
``x-dead-letter-non-persistent``. An exchange and a strategy exclude each other; 406
with RabbitMQ's texts for invalid values."""

from __future__ import annotations

from typing import Any

from ...errors import precondition_failed
from ...queue_config import (
    DEFAULT_DLQ_PREFIX,
    DEFAULT_SHARED_DLQ,
    DELIVERY_GUARANTEES,
    STRATEGIES,
    Arguments,
    DeadLetterConfig,
    flag,
)

#: The arguments this feature reads (without ``x-``; also policy keys).
KEYS = (
    "dead-letter-exchange",
    "dead-letter-routing-key",
    "dead-letter-strategy",
    "dead-letter-queue",
    "dead-letter-queue-prefix",
    "dead-letter-expired",
    "dead-letter-non-persistent",
)


def configure(args: Arguments) -> dict[str, Any]:
    """The :class:`.QueueConfig` field of this feature: ``dead_letter``."""
    where = args.where
    strategy = args.get("dead-letter-strategy", str)
    guarantee = "at-most-once"
    if strategy in DELIVERY_GUARANTEES:  # RabbitMQ's meaning (quorum queues)
        guarantee, strategy = strategy, None
    elif strategy is not None and strategy not in STRATEGIES:
        raise precondition_failed(f"invalid arg 'x-dead-letter-strategy'{where}: invalid_dlx_strategy")
    exchange = args.get("dead-letter-exchange", str)
    if "x-dead-letter-routing-key" in args.arguments and "x-dead-letter-exchange" not in args.arguments:
        raise precondition_failed(
            f"invalid arg 'x-dead-letter-routing-key'{where}: routing_key_but_no_dlx_defined"
        )
    if exchange is not None and strategy is not None:
        raise precondition_failed(
            "x-dead-letter-exchange and x-dead-letter-strategy cannot both be set: "
            "choose RabbitMQ's dead-letter exchange or an ActiveMQ dead-letter strategy"
        )
    names = {}
    for key in ("dead-letter-queue", "dead-letter-queue-prefix"):
        name = names[key] = args.get(key, str)
        if strategy is not None and name is not None and name.startswith("amq."):
            # the broker could not declare it when a message dies: refuse it up front
            raise precondition_failed(f"invalid arg 'x-{key}': '{name}' (reserved prefix 'amq.')")
    return {
        "dead_letter": DeadLetterConfig(
            exchange=exchange,
            routing_key=args.get("dead-letter-routing-key", str),
            strategy=strategy,
            guarantee=guarantee,
            queue=names["dead-letter-queue"] or DEFAULT_SHARED_DLQ,
            prefix=names["dead-letter-queue-prefix"] or DEFAULT_DLQ_PREFIX,
            process_expired=flag(args.get("dead-letter-expired", bool), True),
            process_non_persistent=flag(args.get("dead-letter-non-persistent", bool), False),
        )
    }
