"""A basic.consume subscription: core's Consumer, written as AMQP basic.deliver frames."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pamqp import commands

from ...core.errors import precondition_failed
from ...core.queue_config import amqp_type_name
from ...core.queues import Queue, QueuedMessage
from ...core.selector import Selector, SelectorError, compile_selector

if TYPE_CHECKING:
    from .channel import Channel


def selector_of(arguments: dict) -> Selector | None:
    """The consumer's JMS selector from basic.consume's ``x-selector`` argument (a
    leveret extension; strings compare as JMS properties do, without STOMP's
    conversion); PreconditionFailed (406) for one that does not compile."""
    text = arguments.get("x-selector")
    if text is None:
        return None
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    if not isinstance(text, str):
        raise precondition_failed("invalid arg 'x-selector': a selector is a string")
    try:
        return compile_selector(text)
    except SelectorError as exc:
        raise precondition_failed(str(exc)) from None


def priority_of(arguments: dict, where: str) -> int:
    """The consumer's priority from basic.consume's ``x-priority`` argument (RabbitMQ's
    consumer priorities; any integer, 0 when absent); PreconditionFailed (406) with
    RabbitMQ's text for another type (``where``: `` for queue 'q' in vhost '/'``)."""
    priority = arguments.get("x-priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise precondition_failed(
            f"invalid arg 'x-priority'{where}: \"expected integer, got {amqp_type_name(priority)}\""
        )
    return priority


class ChannelConsumer:
    """One consumer on one channel.

    ``prefetch`` is the per-consumer prefetch count in force when it subscribed
    (basic.qos with global=false, RabbitMQ's semantics); 0 means unlimited.
    ``selector`` comes from the ``x-selector`` argument (see :func:`selector_of`),
    ``priority`` from ``x-priority`` (see :func:`priority_of`).
    """

    __slots__ = (
        "arguments",
        "channel",
        "channel_window",
        "deadline_group",
        "deadline_key",
        "encoded_tag",
        "examined",
        "exclusive",
        "no_ack",
        "prefetch",
        "priority",
        "queue",
        "selector",
        "tag",
        "unacked",
    )

    def __init__(
        self, channel: Channel, queue: Queue | None, tag: str, no_ack: bool, exclusive: bool, arguments: dict
    ) -> None:
        self.channel = channel
        self.queue = queue
        self.tag = tag
        self.encoded_tag = tag.encode()
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.arguments = arguments
        self.prefetch = channel.prefetch_count
        self.channel_window = True  # counted in the channel's (global) prefetch window
        self.unacked = 0
        self.selector = selector_of(arguments)
        self.examined = 0
        where = f" for queue '{queue.name}' in vhost '{queue.host.name}'" if queue is not None else ""
        self.priority = priority_of(arguments, where)
        #: (timeout ms, mode) of its deliveries' acknowledgement deadline, None: none
        #: (no-ack, or timeouts off); set by the channel (see core.consumer_timeout)
        self.deadline_key: tuple[int, str] | None = None
        self.deadline_group: Any = None

    @property
    def global_prefetch(self) -> int:
        """The channel's prefetch count (basic.qos global=true) if this consumer is
        held by it, 0: unlimited or not held (see ``Channel._own_prefetch``)."""
        return self.channel.global_prefetch if self.channel_window else 0

    def can_accept(self) -> bool:
        """Whether a delivery may go out now: channel flow on, socket below its high
        water mark, and (unless no-ack) room in the consumer's and the channel's
        prefetch windows."""
        channel = self.channel
        if not channel.active or not channel.connection.writable:
            return False
        if self.no_ack:
            return True
        if self.prefetch and self.unacked >= self.prefetch:
            return False
        window = channel.global_prefetch
        return not window or not self.channel_window or len(channel.unacked) < window

    def deliver(self, queue: Queue | None, entry: QueuedMessage) -> None:
        """Send ``entry`` as basic.deliver (``queue`` None: a direct reply-to message)."""
        self.channel.deliver(self, queue, entry)

    def cancel_by_broker(self) -> None:
        """The queue was deleted: forget the consumer and, if the client said it
        understands them, send basic.cancel (RabbitMQ's consumer cancel notification),
        after the delete-ok when this consumer's own channel deleted the queue."""
        channel = self.channel
        channel.consumers.pop(self.tag, None)
        if channel.connection.capabilities.get("consumer_cancel_notify"):
            cancel = commands.Basic.Cancel(consumer_tag=self.tag, nowait=True)
            if channel.deferred_cancels is not None:
                channel.deferred_cancels.append(cancel)
            else:
                channel.send_method(cancel)
