"""Consumer timeouts of a queue (RabbitMQ 3.12+): ``x-consumer-timeout`` (ms, policy key
``consumer-timeout``; argument and policy, the lower wins, as RabbitMQ) and
``x-consumer-timeout-mode`` (policy key ``consumer-timeout-mode``, a leveret name:
``close`` or ``graceful``; the argument wins). The timers and what a timeout does are
in :mod:`leveret.core.consumer_timeout` and the protocol adapters."""

from __future__ import annotations

from typing import Any

from ...consumer_timeout import MODES
from ...errors import precondition_failed
from ...queue_config import Arguments

#: The arguments this feature reads (without ``x-``; also policy keys).
KEYS = ("consumer-timeout", "consumer-timeout-mode")


def configure(args: Arguments) -> dict[str, Any]:
    """The :class:`.QueueConfig` fields of this feature: ``consumer_timeout`` (ms, a
    non-negative integer as RabbitMQ's policy validator wants; None: the broker's) and
    ``consumer_timeout_mode`` (None: ``close``). 406 for anything else."""
    mode = args.get("consumer-timeout-mode", str)
    if mode is not None and mode not in MODES:
        raise precondition_failed(
            f"invalid arg 'x-consumer-timeout-mode'{args.where}: '{mode}' (expected close or graceful)"
        )
    return {"consumer_timeout": args.get("consumer-timeout", int, 0), "consumer_timeout_mode": mode}
