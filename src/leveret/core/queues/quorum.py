"""Quorum queues (``x-queue-type: quorum``), accepted with RabbitMQ 3.10's rules.

RabbitMQ replicates a quorum queue over a Raft group of nodes. leveret has one node, so
a quorum queue is a classic queue that RabbitMQ's rules shape:

- durable only, never exclusive or auto-delete, never server-named (406 with
  RabbitMQ's texts; arguments are checked first, then auto-delete, exclusive,
  durable, in RabbitMQ's order);
- every message is written to the store, persistent or not (RabbitMQ keeps every
  message in the Raft log); a publisher confirm waits for it;
- ``x-delivery-limit`` N: a message whose delivery failed N+1 times dies with reason
  ``delivery_limit`` (RabbitMQ 4.3: returns do not count); a redelivery carries
  ``x-acquired-count`` and, once one failed, ``x-delivery-count``;
- ``x-dead-letter-strategy`` ``at-most-once``/``at-least-once`` (see
  :class:`..queue_config.DeadLetterConfig`); ``x-quorum-initial-group-size`` must be a
  positive integer and is kept for the definitions (one node: one replica);
- consumers may not use a global prefetch (540, as RabbitMQ);
- classic-only and stream-only arguments (``x-max-priority``, ``x-queue-mode`` …) are
  refused.
"""

from __future__ import annotations

from ..errors import precondition_failed
from ..queue_config import amqp_type_name
from .base import QueuedMessage, delivery_counts
from .classic import ClassicQueue


class QuorumQueue(ClassicQueue):
    """A quorum queue on one node (see the module doc)."""

    type_name = "quorum"
    rabbitmq_type = "rabbit_quorum_queue"
    channel_prefetch = False
    persists_every_message = True
    takes_delivery_guarantees = True
    refused_arguments = frozenset(
        (
            "x-max-priority",
            "x-queue-mode",
            "x-queue-master-locator",
            "x-queue-version",
            "x-max-age",
            "x-stream-max-segment-size-bytes",
            "x-initial-cluster-size",
        )
    )

    @classmethod
    def check_declaration(
        cls, name: str, durable: bool, exclusive: bool, auto_delete: bool, arguments: dict, where: str
    ) -> None:
        super().check_declaration(name, durable, exclusive, auto_delete, arguments, where)
        if not name:  # RabbitMQ's order: arguments, the name, then the properties
            raise precondition_failed(f"Cannot declare a server-named queue for type {cls.rabbitmq_type}")
        for wrong, property_name in (
            (auto_delete, "auto-delete"),
            (exclusive, "exclusive-owner"),
            (not durable, "non-durable"),
        ):
            if wrong:
                raise precondition_failed(f"invalid property '{property_name}'{where}")
        size = arguments.get("x-quorum-initial-group-size")
        if size is not None:
            if isinstance(size, bool) or not isinstance(size, int):
                raise precondition_failed(
                    f"invalid arg 'x-quorum-initial-group-size'{where}: "
                    f'"expected integer, got {amqp_type_name(size)}"'
                )
            if size <= 0:
                detail = "value_zero" if size == 0 else "value_negative"
                raise precondition_failed(
                    f"invalid arg 'x-quorum-initial-group-size'{where}: {{{detail},{size}}}"
                )

    def delivery_headers(self, entry: QueuedMessage) -> tuple[tuple[str, int], ...]:
        """As RabbitMQ 4.3's quorum queues: ``x-delivery-count`` (failed deliveries)
        once one failed, ``x-acquired-count`` (deliveries before this one) on every
        redelivery; none on the first delivery."""
        return delivery_counts(entry, False)
