"""Exchanges and their routing: direct, fanout, topic and headers (AMQP 0-9-1 §3.1.3).

An exchange routes a message to destinations: queues, or other exchanges when bound
with exchange.bind (RabbitMQ's exchange-to-exchange bindings). Following those, and the
``alternate-exchange`` argument, is the virtual host's job (:mod:`leveret.core.vhost`).
"""

from __future__ import annotations

from typing import Any

from .errors import CommandInvalid, precondition_failed
from .exchange_base import Binding as Binding, Exchange as Exchange, freeze as freeze  # re-exported
from .exchange_types import PLUGIN_EXCHANGE_TYPES
from .message import Message
from .topic import TopicTrie

DEFAULT_EXCHANGE = ""


class DirectExchange(Exchange):
    """Routes to bindings whose key equals the routing key."""

    type = "direct"
    description = "AMQP 0-9-1 direct: the binding key equals the routing key"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._by_key: dict[str, dict[Any, None]] = {}

    def _bind(self, binding: Binding) -> None:
        self._by_key.setdefault(binding.routing_key, {})[binding.destination] = None

    def _unbind(self, binding: Binding) -> None:
        if any(
            b.destination is binding.destination and b.routing_key == binding.routing_key
            for b in self.bindings.values()
        ):
            return  # still bound under other arguments
        dests = self._by_key.get(binding.routing_key)
        if dests is not None:
            dests.pop(binding.destination, None)
            if not dests:
                del self._by_key[binding.routing_key]

    def route(self, message: Message) -> tuple | list:
        """Destinations bound with exactly ``message.routing_key`` or one of its ``cc``
        keys (RabbitMQ's ``CC``/``BCC``), once each."""
        if message.cc:
            found: dict[Any, None] = {}
            for key in (message.routing_key, *message.cc):
                found.update(self._by_key.get(key, ()))
            return list(found)
        dests = self._by_key.get(message.routing_key)
        return list(dests) if dests else ()


class FanoutExchange(Exchange):
    """Routes to every binding, ignoring the routing key (and ``CC``/``BCC``)."""

    type = "fanout"
    description = "AMQP 0-9-1 fanout: every binding"

    def route(self, message: Message) -> tuple | list:
        """Every bound destination, once each."""
        return list(dict.fromkeys(b.destination for b in self.bindings.values()))


class TopicExchange(Exchange):
    """Routes by pattern: ``*`` one word, ``#`` zero or more (see :mod:`.topic`)."""

    type = "topic"
    description = "AMQP 0-9-1 topic: binding patterns over dot-separated routing keys"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._trie = TopicTrie()
        self._counts: dict[tuple, int] = {}

    def _bind(self, binding: Binding) -> None:
        key = (binding.routing_key, binding.destination)
        self._counts[key] = self._counts.get(key, 0) + 1
        self._trie.add(binding.routing_key, binding.destination)

    def _unbind(self, binding: Binding) -> None:
        key = (binding.routing_key, binding.destination)
        self._counts[key] -= 1
        if not self._counts[key]:
            del self._counts[key]
            self._trie.remove(binding.routing_key, binding.destination)

    def route(self, message: Message) -> tuple | list:
        """Destinations whose binding pattern matches ``message.routing_key`` or one of
        its ``cc`` keys (RabbitMQ's ``CC``/``BCC``), once each."""
        if message.cc:
            found: dict[Any, None] = {}
            for key in (message.routing_key, *message.cc):
                found.update(dict.fromkeys(self._trie.match(key)))
            return list(found)
        return self._trie.match(message.routing_key)


class HeadersExchange(Exchange):
    """Routes by message headers against binding arguments, RabbitMQ's ``x-match``:
    ``all`` (default) or ``any``; ``all-with-x``/``any-with-x`` also compare arguments
    starting ``x-``. A binding value of void (None) matches on the key's presence.
    Routing keys, ``CC`` and ``BCC`` ones included, play no part."""

    type = "headers"
    description = "AMQP 0-9-1 headers: binding arguments against message headers"

    @staticmethod
    def validate_binding(binding: Binding) -> None:
        """A bad ``x-match`` (see :func:`check_x_match`)."""
        check_x_match(binding.arguments)

    def route(self, message: Message) -> tuple | list:
        """Destinations whose binding arguments match the message's headers (decodes the
        properties)."""
        headers = message.headers
        return list(
            dict.fromkeys(
                b.destination for b in self.bindings.values() if headers_match(b.arguments, headers)
            )
        )


X_MATCH = ("all", "any", "all-with-x", "any-with-x")


def check_x_match(arguments: dict) -> None:
    """PreconditionFailed (AMQP 406) for a headers binding whose ``x-match`` is not one
    of X_MATCH, as RabbitMQ."""
    mode = arguments.get("x-match", "all")
    if isinstance(mode, bytes):
        mode = mode.decode("utf-8", "replace")
    if mode not in X_MATCH:
        raise precondition_failed(
            f"Invalid x-match field value {mode!r}; expected all, any, all-with-x, or any-with-x"
        )


def headers_match(arguments: dict, headers: dict) -> bool:
    """Whether ``headers`` (a message's) satisfy a headers binding's ``arguments``
    under its ``x-match`` (see :class:`HeadersExchange`)."""
    mode = arguments.get("x-match", "all")
    if isinstance(mode, bytes):
        mode = mode.decode()
    with_x = mode.endswith("-with-x")
    wanted = [(k, v) for k, v in arguments.items() if k != "x-match" and (with_x or not k.startswith("x-"))]
    hits = (k in headers and (v is None or _same_value(headers[k], v)) for k, v in wanted)
    if mode.startswith("any"):
        return any(hits)
    return all(hits)


def _same_value(a: Any, b: Any) -> bool:
    """Field values equal as RabbitMQ compares them: a boolean never equals a number
    (Python's ``True == 1`` does not hold in AMQP tables)."""
    if isinstance(a, bool) is not isinstance(b, bool):
        return False
    return a == b


class DelayedMessageExchange(Exchange):
    """RabbitMQ's delayed-message exchange (the ``rabbitmq_delayed_message_exchange``
    plugin): type ``x-delayed-message``, routing as its ``x-delayed-type`` argument's
    type does, once each message's ``x-delay`` header (ms) has passed. The publish path
    hands delayed messages to the scheduler (:mod:`.scheduler`); :meth:`route` is the
    routing done when they are due. PreconditionFailed (406) with the plugin's text when
    ``x-delayed-type`` names no routing type."""

    type = "x-delayed-message"
    description = "Holds each message for its x-delay (ms), then routes as x-delayed-type"
    holds_messages = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        inner = self.arguments.get("x-delayed-type")
        if isinstance(inner, (bytes, bytearray)):
            inner = bytes(inner).decode(errors="replace")
        cls = EXCHANGE_TYPES.get(inner) if isinstance(inner, str) else None
        if cls is None or cls is DelayedMessageExchange:
            raise precondition_failed("Invalid argument, 'x-delayed-type' must be an existing exchange type")
        self._inner = cls(self.name, self.durable, self.auto_delete, self.internal, self.arguments)

    def delay_of(self, message: Message) -> int:
        """The message's ``x-delay`` in ms (an integer, or text holding one, as the
        plugin reads it); 0 (route at once) when absent, negative or not a number."""
        value = message.header("x-delay")
        if isinstance(value, (bytes, bytearray)):
            value = bytes(value).decode(errors="replace")
        if isinstance(value, bool):
            return 0
        try:
            return max(0, int(value)) if value is not None else 0
        except (TypeError, ValueError):
            return 0

    def route(self, message: Message) -> tuple | list:
        return self._inner.route(message)

    def validate_binding(self, binding: Binding) -> None:  # type: ignore[override]
        """As the ``x-delayed-type`` type checks its bindings."""
        self._inner.validate_binding(binding)

    def _bind(self, binding: Binding) -> None:
        self._inner.bindings[binding.key] = binding
        self._inner._bind(binding)

    def _unbind(self, binding: Binding) -> None:
        self._inner.bindings.pop(binding.key, None)
        self._inner._unbind(binding)


EXCHANGE_TYPES: dict[str, type[Exchange]] = {
    cls.type: cls
    for cls in (DirectExchange, FanoutExchange, TopicExchange, HeadersExchange, DelayedMessageExchange)
}
# The plugin types: x-consistent-hash, x-random, x-local-random, x-modulus-hash.
EXCHANGE_TYPES.update((cls.type, cls) for cls in PLUGIN_EXCHANGE_TYPES)


def exchange_class(type_name: str) -> type[Exchange]:
    """The class for an exchange type; unknown types are a 503 connection error, as in
    RabbitMQ ("unknown exchange type 'x'"; RabbitMQ says "invalid" instead for a name
    that happens to be an Erlang atom it knows, such as 'ok')."""
    try:
        return EXCHANGE_TYPES[type_name]
    except KeyError:
        raise CommandInvalid(f"unknown exchange type '{type_name}'") from None
