"""A queue's features, each in its own module that owns the validation of its ``x-``
arguments (and policy keys), as LavinMQ's ``Queue::Feature::*``, and the state and
behaviour it adds to a queue:

- :mod:`.limits`: ``x-max-length``, ``x-max-length-bytes``, ``x-overflow``;
- :mod:`.dead_lettering`: ``x-dead-letter-*`` (RabbitMQ's exchange, ActiveMQ's strategies);
- :mod:`.redelivery`: ``x-max-redeliveries``, ``x-delivery-limit``, ``x-redelivery-*``,
  and the requeued messages waiting out their delay;
- :mod:`.ttl`: ``x-message-ttl``, ``x-expires``, and the messages due to expire;
- :mod:`.deduplication`: ``x-message-deduplication``, ``x-deduplication-header``,
  ``x-cache-size``, ``x-cache-ttl``;
- :mod:`.paging`: ``x-max-in-memory-length``, ``x-max-in-memory-bytes``, ``x-queue-mode``;
- :mod:`.streams`: ``x-max-age``, ``x-stream-max-segment-size-bytes``;
- :mod:`.consumer_timeout`: ``x-consumer-timeout``, ``x-consumer-timeout-mode``;
- :mod:`.groups`: ActiveMQ's message groups (``JMSXGroupID``; no argument);
- :mod:`.leases`: a classic queue's leases (no argument);
- :mod:`.hold`: browsing and the dead-letter console's hold/scan (no argument).

:func:`build` reads the arguments every queue has (``x-queue-type``,
``x-single-active-consumer``, ``x-max-priority``: they choose the queue's type and
dispatch) and asks each feature for its own.
"""

from __future__ import annotations

from ...errors import precondition_failed
from ...queue_config import Arguments, QueueConfig, amqp_type_name, max_priority
from . import consumer_timeout, dead_lettering, deduplication, limits, paging, redelivery, streams, ttl

#: The features that read arguments, in the order they check them.
CONFIGURED = (limits, dead_lettering, streams, redelivery, paging, ttl, deduplication, consumer_timeout)


def build(arguments: dict, policy_definition: dict | None = None, where: str = "") -> QueueConfig:
    """The effective config of a queue declared with ``arguments`` under the policy
    ``policy_definition`` (see :mod:`...queue_config`). Raises PreconditionFailed (AMQP
    406) for an invalid value, with RabbitMQ's text (``where``: `` for queue 'q' in
    vhost '/'``)."""
    args = Arguments(arguments, policy_definition, where)
    queue_type = args.get("queue-type", str) or "classic"
    if queue_type not in ("classic", "stream", "quorum"):
        raise precondition_failed(f"invalid arg 'x-queue-type': '{queue_type}'")
    single_active = arguments.get("x-single-active-consumer", False)
    if not isinstance(single_active, bool):  # an argument only: RabbitMQ has no such policy key
        kind = amqp_type_name(single_active)
        raise precondition_failed(
            f"invalid arg 'x-single-active-consumer'{where}: {{unacceptable_type,{kind}}}"
        )
    fields = {}
    for feature in CONFIGURED:
        fields.update(feature.configure(args))
    return QueueConfig(
        queue_type=queue_type,
        single_active_consumer=single_active,
        max_priority=max_priority(arguments, queue_type, where),
        **fields,
    )
