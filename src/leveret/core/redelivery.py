"""ActiveMQ's redelivery policy, for messages that come back to a queue.

A message returns to its queue when it is nacked or rejected with requeue, when its
channel or connection closes with it unacknowledged, or on basic.recover. With a policy,
its k-th redelivery waits ``initial_delay × multiplier^(k-1)`` ms (exponential back-off)
or ``initial_delay`` ms, capped at ``max_delay`` ms; once it has been redelivered
``max_redeliveries`` times, the next return makes it a poison message, dead-lettered
with reason ``delivery_limit``. Field names follow ActiveMQ's RedeliveryPolicy
(maximumRedeliveries, initialRedeliveryDelay, useExponentialBackOff,
backOffMultiplier, maximumRedeliveryDelay); defaults too, but for
``max_redeliveries``, which is unlimited (-1) unless set, as RabbitMQ queues have no
limit.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RedeliveryPolicy:
    """A queue's redelivery policy (see the module doc); delays in milliseconds."""

    max_redeliveries: int = -1  # -1: unlimited
    initial_delay: int = 0  # ms; 0 requeues at once
    exponential: bool = False
    multiplier: float = 5.0
    max_delay: int = -1  # ms; -1: no cap

    def exhausted(self, delivery_count: int) -> bool:
        """True when a message delivered ``delivery_count`` times may not be delivered
        again: it has had ``delivery_count - 1`` redeliveries."""
        return 0 <= self.max_redeliveries < delivery_count

    def delay(self, redelivery: int) -> float:
        """Milliseconds to wait before redelivery number ``redelivery`` (1-based)."""
        if self.initial_delay <= 0:
            return 0.0
        delay = float(self.initial_delay)
        if self.exponential:
            delay *= self.multiplier ** (redelivery - 1)
        if self.max_delay >= 0:
            delay = min(delay, float(self.max_delay))
        return delay

    @property
    def active(self) -> bool:
        """Whether it limits or delays redeliveries (deliveries then carry
        ``x-delivery-count``)."""
        return self.max_redeliveries >= 0 or self.initial_delay > 0
