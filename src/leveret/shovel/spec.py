"""A shovel's definition, from RabbitMQ's dynamic-shovel parameters (AMQP 0-9-1 on
both sides), checked the way RabbitMQ 3.10's ``rabbit_shovel_parameters`` checks them.

Keys (a JSON object, the value of ``PUT /api/parameters/shovel/{vhost}/{name}``):

- ``src-uri`` (string or list: one is picked, the next on each reconnect), ``src-queue``
  (declared as a durable classic queue if missing), or ``src-exchange`` with
  ``src-exchange-key`` (a server-named queue bound to it);
- ``dest-uri`` (string or list), and ``dest-queue`` (declared if missing; published
  through the default exchange) or ``dest-exchange`` with ``dest-exchange-key``
  (default: the message's own routing key);
- ``ack-mode``: ``on-confirm`` (default: the source message is acked once the
  destination confirmed it), ``on-publish``, ``no-ack``;
- ``src-delete-after``: ``never`` (default), ``queue-length`` (the source queue's length
  when the shovel starts) or a number of messages, after which the shovel deletes
  itself;
- ``src-prefetch-count`` (``prefetch-count`` in older releases; default 1000),
  ``reconnect-delay`` (seconds, default 1), ``src-protocol``/``dest-protocol``
  (``amqp091`` only);
- ``dest-add-forward-headers`` (an ``x-shovelled`` header), ``dest-add-timestamp-header``
  (``x-shovelled-timestamp``), ``dest-publish-properties`` (properties to set, AMQP's
  names with ``_``), ``src-predeclared``/``dest-predeclared`` (the queue exists: no
  declare), ``src-consumer-args`` (basic.consume arguments); the older names without
  ``dest-`` too.

``amqp://`` with no host is this broker, as RabbitMQ's shovels connect to the local
node: as user guest on vhost ``/`` over its own AMQP listener.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ACK_MODES = ("on-confirm", "on-publish", "no-ack")
DEFAULT_PREFETCH = 1000
DEFAULT_RECONNECT_DELAY = 1.0  # seconds

_KNOWN = {
    "src-uri",
    "src-queue",
    "src-exchange",
    "src-exchange-key",
    "src-protocol",
    "src-prefetch-count",
    "prefetch-count",
    "src-delete-after",
    "delete-after",
    "dest-uri",
    "dest-queue",
    "dest-exchange",
    "dest-exchange-key",
    "dest-protocol",
    "ack-mode",
    "reconnect-delay",
    "add-forward-headers",
    "dest-add-forward-headers",
    "add-timestamp-header",
    "dest-add-timestamp-header",
    "publish-properties",
    "dest-publish-properties",
    "src-predeclared",
    "dest-predeclared",
    "src-consumer-args",
}
#: ``dest-publish-properties`` keys (AMQP's property names) -> pamqp's attribute names
PROPERTIES = {
    "content_type": "content_type",
    "content_encoding": "content_encoding",
    "headers": "headers",
    "delivery_mode": "delivery_mode",
    "priority": "priority",
    "correlation_id": "correlation_id",
    "reply_to": "reply_to",
    "expiration": "expiration",
    "message_id": "message_id",
    "timestamp": "timestamp",
    "type": "message_type",
    "user_id": "user_id",
    "app_id": "app_id",
    "cluster_id": "cluster_id",
}


class ShovelError(ValueError):
    """A shovel definition RabbitMQ would refuse; the message says which key."""


@dataclass(frozen=True)
class ShovelSpec:
    """What one shovel moves, from where to where, and how (see the module doc)."""

    src_uris: tuple[str, ...]
    dest_uris: tuple[str, ...]
    src_queue: str | None = None
    src_exchange: str | None = None
    src_exchange_key: str = "#"
    dest_queue: str | None = None
    dest_exchange: str | None = None
    dest_exchange_key: str | None = None
    ack_mode: str = "on-confirm"
    delete_after: int | str = "never"  # "never", "queue-length" or a count
    prefetch_count: int = DEFAULT_PREFETCH
    reconnect_delay: float = DEFAULT_RECONNECT_DELAY
    add_forward_headers: bool = False
    add_timestamp_header: bool = False
    #: pamqp attribute name -> value, set on every message published
    publish_properties: dict[str, Any] = field(default_factory=dict)
    src_predeclared: bool = False
    dest_predeclared: bool = False
    src_consumer_args: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_parameter(cls, value: Any) -> ShovelSpec:
        """Parse a parameter's value; ShovelError naming the offending key."""
        if not isinstance(value, dict):
            raise ShovelError("shovel definition must be a JSON object")
        unknown = sorted(set(value) - _KNOWN)
        if unknown:
            raise ShovelError(f"unrecognised shovel parameters: {', '.join(unknown)}")
        for side in ("src", "dest"):
            protocol = value.get(f"{side}-protocol", "amqp091")
            if protocol != "amqp091":
                raise ShovelError(f"{side}-protocol: only amqp091 is supported, not {protocol!r}")
        src_queue, src_exchange = _text(value, "src-queue"), _text(value, "src-exchange")
        if (src_queue is None) == (src_exchange is None):
            raise ShovelError("must specify exactly one of src-queue or src-exchange")
        dest_queue, dest_exchange = _text(value, "dest-queue"), _text(value, "dest-exchange")
        if dest_queue is not None and dest_exchange is not None:
            raise ShovelError("may not specify both dest-queue and dest-exchange")
        ack_mode = value.get("ack-mode", "on-confirm")
        if ack_mode not in ACK_MODES:
            raise ShovelError(f"ack-mode must be one of {', '.join(ACK_MODES)}, not {ack_mode!r}")
        delete_after = value.get("src-delete-after", value.get("delete-after", "never"))
        if delete_after not in ("never", "queue-length") and not (
            isinstance(delete_after, int) and not isinstance(delete_after, bool) and delete_after >= 0
        ):
            raise ShovelError("src-delete-after must be never, queue-length or a non-negative integer")
        if delete_after == "queue-length" and src_queue is None:
            raise ShovelError("src-delete-after queue-length needs src-queue")
        prefetch = value.get("src-prefetch-count", value.get("prefetch-count", DEFAULT_PREFETCH))
        if not isinstance(prefetch, int) or isinstance(prefetch, bool) or prefetch < 0:
            raise ShovelError("src-prefetch-count must be a non-negative integer")
        delay = value.get("reconnect-delay", DEFAULT_RECONNECT_DELAY)
        if not isinstance(delay, int | float) or isinstance(delay, bool) or delay < 0:
            raise ShovelError("reconnect-delay must be a non-negative number")
        properties = value.get("dest-publish-properties", value.get("publish-properties", {}))
        if not isinstance(properties, dict) or not set(properties) <= set(PROPERTIES):
            known = ", ".join(PROPERTIES)
            raise ShovelError(f"dest-publish-properties must be an object with keys among {known}")
        consumer_args = value.get("src-consumer-args", {})
        if not isinstance(consumer_args, dict):
            raise ShovelError("src-consumer-args must be an object")
        return cls(
            src_uris=_uris(value, "src-uri"),
            dest_uris=_uris(value, "dest-uri"),
            src_queue=src_queue,
            src_exchange=src_exchange,
            src_exchange_key=_text(value, "src-exchange-key") or "#",
            dest_queue=dest_queue,
            dest_exchange=dest_exchange,
            dest_exchange_key=_text(value, "dest-exchange-key"),
            ack_mode=ack_mode,
            delete_after=delete_after,
            prefetch_count=prefetch,
            reconnect_delay=float(delay),
            add_forward_headers=_flag(value, "dest-add-forward-headers", "add-forward-headers"),
            add_timestamp_header=_flag(value, "dest-add-timestamp-header", "add-timestamp-header"),
            publish_properties={PROPERTIES[k]: v for k, v in properties.items()},
            src_predeclared=_flag(value, "src-predeclared"),
            dest_predeclared=_flag(value, "dest-predeclared"),
            src_consumer_args=dict(consumer_args),
        )


def _flag(value: dict, *keys: str) -> bool:
    """The first of ``keys`` present (a boolean; ShovelError otherwise), else False."""
    for key in keys:
        if key in value:
            if not isinstance(value[key], bool):
                raise ShovelError(f"{key} must be true or false")
            return value[key]
    return False


def _text(value: dict, key: str) -> str | None:
    found = value.get(key)
    if found is not None and not isinstance(found, str):
        raise ShovelError(f"{key} must be a string")
    return found


def _uris(value: dict, key: str) -> tuple[str, ...]:
    found = value.get(key)
    uris = [found] if isinstance(found, str) else found
    if not isinstance(uris, list) or not uris or not all(isinstance(u, str) for u in uris):
        raise ShovelError(f"{key} must be a URI or a non-empty list of URIs")
    for uri in uris:
        if not uri.startswith(("amqp://", "amqps://")):
            raise ShovelError(f"{key}: {uri!r} is not an amqp:// or amqps:// URI")
    return tuple(uris)
