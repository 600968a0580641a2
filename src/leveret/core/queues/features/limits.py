"""Length limits and overflow (RabbitMQ): ``x-max-length`` (messages),
``x-max-length-bytes`` (body bytes) and ``x-overflow`` (``drop-head``: the oldest die
with reason ``maxlen``; ``reject-publish``: the new one is refused, a negative confirm;
``reject-publish-dlx``: refused and dead-lettered). The lower of argument and policy
wins; invalid values are 406 with RabbitMQ's texts."""

from __future__ import annotations

from typing import Any

from ...errors import precondition_failed
from ...queue_config import OVERFLOW_MODES, Arguments, QueueConfig

#: The arguments this feature reads (without ``x-``; also policy keys).
KEYS = ("max-length", "max-length-bytes", "overflow")


def configure(args: Arguments) -> dict[str, Any]:
    """The :class:`QueueConfig` fields of this feature: ``max_length``,
    ``max_length_bytes`` (None: no limit) and ``overflow``."""
    overflow = args.get("overflow", str) or "drop-head"
    if overflow not in OVERFLOW_MODES:
        source = "x-overflow" if args.arguments.get("x-overflow") is not None else "overflow"
        raise precondition_failed(f"invalid arg '{source}'{args.where}: invalid_overflow")
    return {
        "overflow": overflow,
        "max_length": args.get("max-length", int, 0),
        "max_length_bytes": args.get("max-length-bytes", int, 0),
    }


def limited(config: QueueConfig) -> bool:
    """Whether the queue has a length limit at all."""
    return config.max_length is not None or config.max_length_bytes is not None


def over(config: QueueConfig, count: int, size: int) -> bool:
    """Whether ``count`` messages of ``size`` body bytes in all exceed the limits
    (RabbitMQ's ``will_overflow`` with what is to be added counted in)."""
    if config.max_length is not None and count > config.max_length:
        return True
    return config.max_length_bytes is not None and size > config.max_length_bytes
