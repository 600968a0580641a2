"""A queue's redelivery policy, for messages that come back to a queue.

A delivered message comes back in one of two ways, as RabbitMQ 4.3 tells them apart:

- a **failed delivery**: the consumer says processing failed (AMQP 0-9-1
  ``basic.reject`` with requeue, STOMP ``NACK``, AMQP 1.0 ``modified`` with
  ``delivery-failed``, a lease that expires unacknowledged);
- a plain **return**: the message was given back without being processed
  (``basic.nack`` with requeue, ``basic.recover``, basic.cancel or a channel,
  connection or link closed with it unacknowledged, a consumer timeout, a management
  requeue, AMQP 1.0 ``released``, an explicit lease release).

The policy counts failures only (``QueuedMessage.failed_count``): once a message has
failed ``max_redeliveries`` times, the next failure makes it a poison message,
dead-lettered with reason ``delivery_limit`` (RabbitMQ 4.3's ``delivery-limit`` on
``delivery-count``); returns never poison a message.

Back-off, in two spellings of one setting:

- ActiveMQ's RedeliveryPolicy (maximumRedeliveries, initialRedeliveryDelay,
  useExponentialBackOff, backOffMultiplier, maximumRedeliveryDelay): the k-th failure
  waits ``initial_delay × multiplier^(k-1)`` ms (exponential) or ``initial_delay`` ms,
  capped at ``max_delay`` ms; returns come back at once;
- RabbitMQ 4.3's delayed retry (``x-delayed-retry-type`` / ``-min`` / ``-max``): a
  message coming back after k failures (at least 1) waits ``min(min × k, max)`` ms;
  ``type`` says which come-backs wait: ``failed``, ``returned`` or ``all``.

Defaults are ActiveMQ's but for ``max_redeliveries``, unlimited (-1) unless set, as
RabbitMQ queues have no limit.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Which come-backs wait out the back-off (RabbitMQ 4.3's ``x-delayed-retry-type``).
DELAYED_RETRY_TYPES = ("all", "failed", "returned")


@dataclass(frozen=True)
class RedeliveryPolicy:
    """A queue's redelivery policy (see the module doc); delays in milliseconds."""

    max_redeliveries: int = -1  # failures allowed before a message dies; -1: unlimited
    initial_delay: int = 0  # ms; 0 requeues at once
    exponential: bool = False
    multiplier: float = 5.0
    max_delay: int = -1  # ms; -1: no cap
    #: RabbitMQ 4.3's linear back-off (``initial_delay × k``) instead of ActiveMQ's
    linear: bool = False
    #: which come-backs wait: "failed" (ActiveMQ), "returned" or "all" (RabbitMQ 4.3)
    delayed: str = "failed"

    def exhausted(self, failures: int) -> bool:
        """True when a message that failed ``failures`` times (this one included) may
        not be delivered again: it has used up its ``max_redeliveries``."""
        return 0 <= self.max_redeliveries < failures

    def delay(self, redelivery: int) -> float:
        """Milliseconds to wait before redelivery number ``redelivery`` (1-based)."""
        if self.initial_delay <= 0:
            return 0.0
        delay = float(self.initial_delay)
        if self.linear:
            delay *= max(1, redelivery)
        elif self.exponential:
            delay *= self.multiplier ** (redelivery - 1)
        if self.max_delay >= 0:
            delay = min(delay, float(self.max_delay))
        return delay

    def return_delay(self, failed: bool, failures: int) -> float:
        """Milliseconds a message coming back waits: ``failed`` says whether this
        come-back is a failure, ``failures`` counts them so far (this one included)."""
        if self.delayed != "all" and failed != (self.delayed == "failed"):
            return 0.0
        return self.delay(failures)

    @property
    def active(self) -> bool:
        """Whether it limits or delays redeliveries (deliveries then carry
        ``x-delivery-count`` from the first one on)."""
        return self.max_redeliveries >= 0 or self.initial_delay > 0
