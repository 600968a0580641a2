"""The exchange types people install RabbitMQ plugins for, built in.

- ``x-consistent-hash`` (the ``rabbitmq_consistent_hash_exchange`` plugin): each
  binding's key is a weight, the number of buckets its destination owns on a ring; a
  message goes to the owner of the bucket its routing key (or the header named by the
  exchange's ``hash-header`` argument, or the property named by ``hash-property``) hashes
  to, computed as the plugin does (:mod:`.erlang_hash`), so the same message picks the
  same queue here as on RabbitMQ given the same bindings made in the same order.
- ``x-random`` (the ``rabbitmq_random_exchange`` plugin): one binding picked at random,
  the routing key ignored.
- ``x-local-random`` (RabbitMQ 4.0): one random binding among those to queues on the
  publisher's node; a leveret node has every queue local, so any bound queue. Bindings
  must have an empty key and lead to a classic queue, as in RabbitMQ.
- ``x-modulus-hash`` (RabbitMQ 4.3): ``phash2`` of the routing keys modulo the number of
  bindings, taken in destination name order, so a destination bound twice gets twice the
  share.
- ``x-federation-upstream`` (the ``rabbitmq_federation`` plugin): the internal exchange a
  federation downstream declares on its upstream (:class:`FederationUpstreamExchange`).

Routing is cheap: the ring and the sorted lists are rebuilt on bind and unbind, never
per message.
"""

from __future__ import annotations

import bisect
import calendar
import random
import re
from functools import lru_cache
from typing import Any

from .erlang_hash import UNDEFINED, Atom, jump_consistent_hash, phash2
from .errors import precondition_failed
from .exchange_base import Binding, Exchange
from .message import RABBIT_FIELD_TYPES, Message
from .queue_config import amqp_type_name

HASH_PROPERTIES = ("correlation_id", "message_id", "timestamp")


_INTEGER = re.compile(r"[+-]?[0-9]+\Z")


def _erlang_binary(text: str) -> str:
    """How Erlang's ``~p`` prints the binary of ``text``'s UTF-8 bytes (RabbitMQ's error
    texts): ``<<"abc">>`` when every byte is printable Latin-1, else ``<<97,1,98>>``
    (``<<>>`` when empty)."""
    data = text.encode("utf-8", "surrogateescape")
    escapes = {
        8: "\\b",
        9: "\\t",
        10: "\\n",
        11: "\\v",
        12: "\\f",
        13: "\\r",
        27: "\\e",
        34: '\\"',
        92: "\\\\",
    }
    if data and all(32 <= b <= 126 or b >= 160 or b in escapes for b in data):
        return (
            '<<"'
            + "".join(escapes.get(b, "") or chr(b) for b in data).encode("latin-1").decode("utf-8", "replace")
            + '">>'
        )
    return "<<" + ",".join(str(b) for b in data) + ">>"


def typed_header(message: Message, name: str) -> tuple[str, Any] | None:
    """A header as ``(AMQP type tag, value)``: from the message's format when it keeps
    wire types (AMQP 0-9-1), else guessed from the plain value as pika would encode it."""
    reader = getattr(message.format, "typed_header", None)
    if reader is not None:
        return reader(message, name)
    value = message.header(name)
    return None if value is None else _guess_tag(value)


def _guess_tag(value: Any) -> tuple[str, Any]:
    if isinstance(value, bool):
        return ("t", value)
    if isinstance(value, int):
        return ("I", value) if -(2**31) <= value < 2**31 else ("l", value)
    if isinstance(value, float):
        return ("d", value)
    if isinstance(value, (bytes, bytearray)):
        return ("x", bytes(value))
    if isinstance(value, dict):
        return ("F", {k: _guess_tag(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return ("A", [_guess_tag(v) for v in value])
    return ("S", str(value).encode())


def erlang_field(typed: tuple[str, Any]) -> tuple:
    """A typed AMQP field value as RabbitMQ's ``rabbit_misc:table_lookup`` returns it:
    ``{Type, Value}`` (tables and arrays converted through)."""
    tag, value = typed
    kind = Atom(RABBIT_FIELD_TYPES.get(tag, "longstr"))
    if tag == "t":
        value = Atom("true" if value else "false")
    elif tag == "S" and isinstance(value, str):
        value = value.encode()
    elif tag == "V":
        value = UNDEFINED
    elif tag == "D":
        data = bytes(value)
        value = (data[0], int.from_bytes(data[1:5], "big"))
    elif tag == "F":
        value = [(k.encode(), *erlang_field(v)) for k, v in value.items()]
    elif tag == "A":
        value = [erlang_field(v) for v in value]
    return (kind, value)


class ConsistentHashExchange(Exchange):
    """``x-consistent-hash``: weighted consistent hashing, as RabbitMQ's plugin.

    Arguments: ``hash-header`` (a header's name) or ``hash-property`` (one of
    ``correlation_id``, ``message_id``, ``timestamp``) hash that instead of the routing
    key; a message without it hashes as Erlang's ``undefined`` (all such go to one
    queue). Errors, as the plugin's: both arguments, PreconditionFailed (406) ``hash-header
    and hash-property are mutually exclusive``; another property, 406 ``Unsupported
    property: NAME``; either argument not text, 406 ``invalid arg 'hash-header' for
    exchange 'X': "expected string, got signedint"`` (the plugin crashes there: 541
    INTERNAL_ERROR, closing the connection). A binding key that is not a positive integer,
    406 ``The binding key must be an integer: <<"KEY">>`` or ``The binding key must be
    greater than 0``.

    Like the plugin, only a destination's first binding puts it on the ring (a second
    binding with another weight changes nothing), and buckets are numbered in binding
    order. Unlike it, removing one of two bindings of a destination leaves the
    destination on the ring with its other binding's weight (the plugin takes it off the
    ring although a binding remains).
    """

    type = "x-consistent-hash"
    description = "Consistent hashing over weighted bindings (the rabbitmq_consistent_hash_exchange plugin)"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        header = self.arguments.get("hash-header")
        prop = self.arguments.get("hash-property")
        for name, value in (("hash-header", header), ("hash-property", prop)):
            if value is not None and not isinstance(value, (str, bytes)):
                # RabbitMQ 3.10's plugin crashes here (541 INTERNAL_ERROR, the connection
                # closed); a clean 406 on the channel instead
                raise precondition_failed(
                    f"invalid arg '{name}' for exchange '{self.name}': "
                    f'"expected string, got {amqp_type_name(value)}"'
                )
        header = header.decode(errors="replace") if isinstance(header, bytes) else header
        prop = prop.decode(errors="replace") if isinstance(prop, bytes) else prop
        if header is not None and prop is not None:
            raise precondition_failed("hash-header and hash-property are mutually exclusive")
        if prop is not None and prop not in HASH_PROPERTIES:
            raise precondition_failed(f"Unsupported property: {prop}")
        self.hash_header: str | None = header
        self.hash_property: str | None = prop
        #: destinations on the ring, in bucket order, and the end of each one's buckets
        self._owners: list[Any] = []
        self._ends: list[int] = []

    @staticmethod
    def validate_binding(binding: Binding) -> None:
        """PreconditionFailed (406) unless the binding key is a positive integer (text as
        Erlang's ``list_to_integer`` reads it: optional sign, digits)."""
        key = binding.routing_key
        if not _INTEGER.match(key):
            raise precondition_failed(f"The binding key must be an integer: {_erlang_binary(key)}")
        if int(key) < 1:
            raise precondition_failed("The binding key must be greater than 0")

    @property
    def buckets(self) -> int:
        """How many buckets the ring has: the sum of its destinations' weights."""
        return self._ends[-1] if self._ends else 0

    def ring(self) -> list[tuple[Any, int]]:
        """(destination, weight) in bucket order."""
        starts = [0, *self._ends[:-1]]
        return [(d, end - start) for d, start, end in zip(self._owners, starts, self._ends, strict=True)]

    def _rebuild(self) -> None:
        weights: dict[Any, int] = {}
        for binding in self.bindings.values():  # insertion order: the order of binding
            if binding.destination not in weights:
                weights[binding.destination] = int(binding.routing_key)
        owners, ends, total = [], [], 0
        for destination, weight in weights.items():
            total += weight
            owners.append(destination)
            ends.append(total)
        self._owners, self._ends = owners, ends

    def _bind(self, binding: Binding) -> None:
        if binding.destination not in self._owners:
            self._owners.append(binding.destination)
            self._ends.append(self.buckets + int(binding.routing_key))

    def _unbind(self, binding: Binding) -> None:
        self._rebuild()

    def hash_value(self, message: Message) -> object:
        """The Erlang term the plugin hashes for ``message``."""
        if self.hash_header is not None:
            typed = typed_header(message, self.hash_header)
            return UNDEFINED if typed is None else erlang_field(typed)
        if self.hash_property is not None:
            properties = message.properties
            if self.hash_property == "timestamp":
                stamp = properties.timestamp
                if stamp is None:
                    return UNDEFINED
                seconds = (
                    calendar.timegm(stamp.utctimetuple()) if stamp.tzinfo is None else int(stamp.timestamp())
                )
                return str(seconds).encode()
            value = getattr(properties, self.hash_property)
            return UNDEFINED if value is None else str(value).encode("utf-8", "surrogateescape")
        return message.routing_key.encode("utf-8", "surrogateescape")

    def route(self, message: Message) -> tuple | list:
        """The one destination owning the bucket the message hashes to; none if the ring
        is empty."""
        buckets = self.buckets
        if not buckets:
            return ()
        if self.hash_header is None and self.hash_property is None:
            bucket = _routing_key_bucket(message.routing_key, buckets)
        else:
            bucket = jump_consistent_hash(phash2(self.hash_value(message)), buckets)
        return [self._owners[bisect.bisect_right(self._ends, bucket)]]


@lru_cache(maxsize=8192)
def _routing_key_bucket(routing_key: str, buckets: int) -> int:
    return jump_consistent_hash(phash2(routing_key.encode("utf-8", "surrogateescape")), buckets)


class _PerBinding(Exchange):
    """Keeps one entry per binding (a destination bound twice appears twice)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._targets: list[Any] = []

    def _order(self, destinations: list[Any]) -> list[Any]:
        return destinations

    def _bind(self, binding: Binding) -> None:
        self._targets = self._order([*self._targets, binding.destination])

    def _unbind(self, binding: Binding) -> None:
        self._targets = self._order([b.destination for b in self.bindings.values()])


class RandomExchange(_PerBinding):
    """``x-random``, RabbitMQ's ``rabbitmq_random_exchange``: each message goes to one
    binding's destination picked uniformly at random (a destination bound twice is twice
    as likely); routing keys and arguments play no part. ``rng``: the random source
    (tests seed it)."""

    type = "x-random"
    description = "One binding at random (the rabbitmq_random_exchange plugin)"
    rng = random.Random()

    def route(self, message: Message) -> tuple | list:
        targets = self._targets
        if not targets:
            return ()
        if len(targets) == 1:
            return [targets[0]]
        return [targets[self.rng.randrange(len(targets))]]


class LocalRandomExchange(RandomExchange):
    """``x-local-random`` (RabbitMQ 4.0): as ``x-random`` over bindings to queues local
    to the publisher's node, which on a single leveret node is every bound queue.
    PreconditionFailed (406) with RabbitMQ's texts for a binding with a key (``Non empty
    binding 'KEY' key not permitted``), to a queue of another type than classic (``Queue
    type rabbit_quorum_queue not valid for this exchange type``) or to an exchange
    (``Destination not found``)."""

    type = "x-local-random"
    description = "One binding to a local classic queue at random (RabbitMQ 4.0)"

    @staticmethod
    def validate_binding(binding: Binding) -> None:
        if binding.routing_key:
            raise precondition_failed(f"Non empty binding '{binding.routing_key}' key not permitted")
        kind = getattr(binding.destination, "type_name", None)
        if kind is None:
            raise precondition_failed("Destination not found")
        if kind != "classic":
            raise precondition_failed(f"Queue type rabbit_{kind}_queue not valid for this exchange type")


class ModulusHashExchange(_PerBinding):
    """``x-modulus-hash`` (RabbitMQ 4.3): the destination at ``phash2(routing keys) mod
    bindings`` in the list of bindings' destinations sorted as RabbitMQ sorts resources
    (exchanges before queues, then by name), so routing is stable across restarts and a
    destination bound N times gets N shares. The routing keys are the routing key and
    any ``CC``/``BCC`` ones."""

    type = "x-modulus-hash"
    description = "Routing keys' hash modulo the number of bindings (RabbitMQ 4.3)"

    def _order(self, destinations: list[Any]) -> list[Any]:
        return sorted(
            destinations,
            key=lambda d: (not isinstance(d, Exchange), d.name.encode("utf-8", "surrogateescape")),
        )

    def route(self, message: Message) -> tuple | list:
        targets = self._targets
        if not targets:
            return ()
        keys = [message.routing_key, *message.cc]
        return [targets[_keys_hash(tuple(keys)) % len(targets)]]


@lru_cache(maxsize=8192)
def _keys_hash(keys: tuple[str, ...]) -> int:
    return phash2([k.encode("utf-8", "surrogateescape") for k in keys])


#: The header a federation link adds to each message it moves (RabbitMQ's name): an
#: array of tables, the latest hop first, each with the ``cluster-name`` and ``vhost``
#: the message came from.
RECEIVED_FROM = "x-received-from"


class FederationUpstreamExchange(_PerBinding):
    """``x-federation-upstream``, as RabbitMQ's ``rabbitmq_federation`` declares it on an
    upstream for each exchange federation link (``federation: X -> NODE A``, internal,
    auto-delete): a fanout that drops what must not travel further. A message whose
    ``x-received-from`` header already lists ``x-max-hops`` hops, or lists the downstream
    (``x-downstream-name`` cluster name and ``x-downstream-vhost``) as one it came from,
    goes nowhere: this is the plugin's hop limit and cycle detection, applied on the
    upstream so such messages never cross the link.

    Arguments: ``x-max-hops`` (required, an integer: PreconditionFailed 406 ``Argument
    x-max-hops missing`` or ``Argument x-max-hops must be of type long``, RabbitMQ's
    texts; RabbitMQ also wants the 64-bit AMQP type, leveret any integer type),
    ``x-downstream-name`` and ``x-downstream-vhost`` (text; absent, as from a
    downstream older than RabbitMQ 3.3 / 3.8.9, only the hop count applies)."""

    type = "x-federation-upstream"
    description = "Federation upstream helper exchange"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        hops = self.arguments.get("x-max-hops")
        if hops is None:
            raise precondition_failed("Argument x-max-hops missing")
        if not isinstance(hops, int) or isinstance(hops, bool):
            raise precondition_failed("Argument x-max-hops must be of type long")
        self.max_hops: int = hops
        self.downstream_name = _text(self.arguments.get("x-downstream-name"))
        self.downstream_vhost = _text(self.arguments.get("x-downstream-vhost"))

    def route(self, message: Message) -> tuple | list:
        """Every binding's destination, once per binding as a fanout, unless
        :meth:`should_forward` says the message must stop here."""
        if not self._targets or not self.should_forward(message.header(RECEIVED_FROM)):
            return ()
        return self._targets

    def should_forward(self, received_from: Any) -> bool:
        """False if the ``x-received-from`` value lists ``x-max-hops`` hops or more, or
        lists the downstream; True when the header is absent or not an array."""
        if not isinstance(received_from, (list, tuple)):
            return True
        return len(received_from) < self.max_hops and not already_seen(
            received_from, self.downstream_name, self.downstream_vhost
        )


def already_seen(hops: Any, cluster_name: str | None, vhost: str | None) -> bool:
    """Whether the array of ``x-received-from`` (or ``x-bound-from``) tables ``hops``
    has one with this ``cluster-name`` and ``vhost``: the message (binding) has been
    there, as RabbitMQ's federation cycle detection compares them. An unknown name
    (None) is never seen."""
    if cluster_name is None or not isinstance(hops, (list, tuple)):
        return False
    for hop in hops:
        if (
            isinstance(hop, dict)
            and _text(hop.get("cluster-name")) == cluster_name
            and _text(hop.get("vhost")) == vhost
        ):
            return True
    return False


def _text(value: Any) -> str | None:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return value if isinstance(value, str) else None


PLUGIN_EXCHANGE_TYPES: tuple[type[Exchange], ...] = (
    ConsistentHashExchange,
    RandomExchange,
    LocalRandomExchange,
    ModulusHashExchange,
    FederationUpstreamExchange,
)
