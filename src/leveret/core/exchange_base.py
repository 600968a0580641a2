"""The exchange and binding objects every exchange type builds on.

An exchange holds its bindings (source --routing key/arguments--> destination, a queue
or another exchange) and answers :meth:`Exchange.route`; the types are in
:mod:`.exchange` (AMQP's four and the delayed-message exchange) and
:mod:`.exchange_types` (the plugin types).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .message import Message


def freeze(value: Any) -> Any:
    """A hashable, order-insensitive form of a field table or value (binding identity)."""
    if isinstance(value, dict):
        return tuple(sorted((k, freeze(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(freeze(v) for v in value)
    return value


@dataclass(eq=False)
class Binding:
    """source --routing_key/arguments--> destination (a Queue or an Exchange)."""

    source: Exchange
    destination: Any
    routing_key: str
    arguments: dict = field(default_factory=dict)

    @property
    def key(self) -> tuple:
        """The binding's identity in its source: ``(destination, routing_key, frozen
        arguments)``; a second identical bind is a no-op."""
        return (self.destination, self.routing_key, freeze(self.arguments))


class Exchange:
    """Base exchange: holds bindings; subclasses implement :meth:`route`."""

    type = ""
    #: One line on how it routes (the management API's ``exchange_types``)
    description = ""
    #: Whether publishes are held for later rather than routed (the delayed-message type)
    holds_messages = False

    def __init__(
        self,
        name: str,
        durable: bool = False,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: dict | None = None,
    ) -> None:
        self.name = name
        self.durable = durable
        self.auto_delete = auto_delete
        self.internal = internal
        self.arguments = dict(arguments or {})
        self.bindings: dict[tuple, Binding] = {}
        #: How many bindings lead to other exchanges (routing must follow them).
        self.exchange_bindings = 0

    @property
    def alternate_exchange(self) -> str | None:
        """The ``alternate-exchange`` argument (RabbitMQ): where messages this exchange
        cannot route go; None if unset."""
        return self.arguments.get("alternate-exchange")

    def add_binding(self, binding: Binding) -> bool:
        """Add; False if an identical binding exists (binding twice is a no-op)."""
        if binding.key in self.bindings:
            return False
        self.bindings[binding.key] = binding
        if isinstance(binding.destination, Exchange):
            self.exchange_bindings += 1
        self._bind(binding)
        return True

    def remove_binding(self, binding: Binding) -> Binding | None:
        """Remove the binding with ``binding``'s key; returns the one removed, or None if
        there was none."""
        existing = self.bindings.pop(binding.key, None)
        if existing is not None:
            if isinstance(existing.destination, Exchange):
                self.exchange_bindings -= 1
            self._unbind(existing)
        return existing

    def route(self, message: Message) -> tuple | list:
        """Destinations of ``message`` through this exchange's own bindings."""
        raise NotImplementedError

    @staticmethod
    def validate_binding(binding: Binding) -> None:
        """Raise (PreconditionFailed, 406, as RabbitMQ's ``binding_invalid``) if this
        type cannot have ``binding``; checked on every bind, before anything changes."""

    def _bind(self, binding: Binding) -> None:
        pass

    def _unbind(self, binding: Binding) -> None:
        pass

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"
