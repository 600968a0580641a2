"""Upstreams, from RabbitMQ's ``federation-upstream`` and ``federation-upstream-set``
runtime parameters, checked as RabbitMQ 3.10's ``rabbit_federation_parameters`` checks
them, and the policy keys that apply them.

A ``federation-upstream`` value (``PUT /api/parameters/federation-upstream/{vhost}/{name}``):

- ``uri`` (required; a string or a list: one is picked, the next on each reconnect),
  ``amqp://`` or ``amqps://``; ``amqp://`` with no host is this broker;
- ``prefetch-count`` (default 1000), ``reconnect-delay`` (seconds, default 5),
  ``ack-mode`` (``on-confirm`` default, ``on-publish``, ``no-ack``), ``trust-user-id``
  (default false);
- exchange federation: ``exchange`` (the upstream exchange; default the downstream's
  name), ``max-hops`` (default 1), ``expires`` and ``message-ttl`` (milliseconds, of the
  upstream queue), ``queue-type`` (``classic`` or ``quorum``), ``bind-nowait``;
- queue federation: ``queue`` (the upstream queue; default the downstream's name),
  ``consumer-tag``;
- ``ha-policy`` is accepted and ignored (RabbitMQ 3.10 keeps it for mirrored queues).

A ``federation-upstream-set`` value is a list of ``{"upstream": NAME}`` objects, each
optionally overriding that upstream's keys. A policy applies them with the key
``federation-upstream`` (one upstream) or ``federation-upstream-set`` (a set, or
``all``: every upstream of the vhost), never both.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

UPSTREAM = "federation-upstream"
UPSTREAM_SET = "federation-upstream-set"
ACK_MODES = ("on-confirm", "on-publish", "no-ack")
QUEUE_TYPES = ("classic", "quorum")


class FederationError(ValueError):
    """A definition RabbitMQ would refuse; the message says which key, in RabbitMQ's
    words (the management API answers it as 400 ``Validation failed``)."""


_NUMBERS = ("prefetch-count", "max-hops", "expires", "message-ttl")
_KNOWN = {
    "uri",
    "prefetch-count",
    "reconnect-delay",
    "ack-mode",
    "trust-user-id",
    "exchange",
    "max-hops",
    "expires",
    "message-ttl",
    "ha-policy",
    "queue",
    "consumer-tag",
    "queue-type",
    "bind-nowait",
}


@dataclass(frozen=True)
class Upstream:
    """One upstream of a vhost (see the module doc for each key's meaning)."""

    name: str
    vhost: str
    uris: tuple[str, ...]
    prefetch_count: int = 1000
    reconnect_delay: float = 5.0  # seconds
    ack_mode: str = "on-confirm"
    trust_user_id: bool = False
    exchange: str | None = None  # None: the downstream exchange's name
    queue: str | None = None  # None: the downstream queue's name
    max_hops: int = 1
    expires: int | None = None  # ms, of the upstream queue of an exchange link
    message_ttl: int | None = None  # ms
    consumer_tag: str | None = None
    queue_type: str = "classic"
    bind_nowait: bool = False

    @classmethod
    def from_parameter(cls, vhost: str, name: str, value: Any) -> Upstream:
        """Parse a ``federation-upstream`` value; FederationError naming the key."""
        if not isinstance(value, dict):
            raise FederationError(f"{UPSTREAM} value must be a JSON object")
        unknown = sorted(set(value) - _KNOWN)
        if unknown:
            raise FederationError(f"unrecognised {UPSTREAM} keys: {', '.join(unknown)}")
        if "uri" not in value:
            raise FederationError('Key "uri" not found in federation-upstream')
        return cls(name=name, vhost=vhost, uris=_uris(value["uri"]), **_options(value))

    def overridden(self, overrides: dict[str, Any]) -> Upstream:
        """This upstream with an upstream set entry's keys (``upstream`` itself aside)."""
        keys = {k: v for k, v in overrides.items() if k != "upstream"}
        unknown = sorted(set(keys) - _KNOWN)
        if unknown:
            raise FederationError(f"unrecognised {UPSTREAM_SET} keys: {', '.join(unknown)}")
        changed = _options(keys)
        if "uri" in keys:
            changed["uris"] = _uris(keys["uri"])
        return replace(self, **changed)


def check_upstream_set(value: Any) -> list[dict[str, Any]]:
    """A ``federation-upstream-set`` value: a list of objects with an ``upstream``
    name and optional overrides; FederationError otherwise."""
    if not isinstance(value, list):
        raise FederationError(f"{UPSTREAM_SET} value must be a list of objects")
    for entry in value:
        if not isinstance(entry, dict) or not isinstance(entry.get("upstream"), str):
            raise FederationError(f'each {UPSTREAM_SET} entry must be an object with an "upstream" name')
        keys = {k: v for k, v in entry.items() if k != "upstream"}
        unknown = sorted(set(keys) - _KNOWN)
        if unknown:
            raise FederationError(f"unrecognised {UPSTREAM_SET} keys: {', '.join(unknown)}")
        _options(keys)
        if "uri" in keys:
            _uris(keys["uri"])
    return value


def policy_upstreams(
    parameters: dict[tuple[str, str, str], Any], vhost: str, definition: dict | None
) -> list[Upstream]:
    """The upstreams a policy ``definition`` applies in ``vhost``, from the broker's
    runtime ``parameters`` (by name; a missing or invalid one is left out, as RabbitMQ
    starts no link for it)."""
    if not definition:
        return []
    if isinstance(definition.get(UPSTREAM), str):
        entries: list[dict[str, Any]] = [{"upstream": definition[UPSTREAM]}]
    elif definition.get(UPSTREAM_SET) == "all":
        entries = [{"upstream": n} for (c, v, n) in sorted(parameters) if c == UPSTREAM and v == vhost]
    elif isinstance(definition.get(UPSTREAM_SET), str):
        found = parameters.get((UPSTREAM_SET, vhost, definition[UPSTREAM_SET]))
        entries = found if isinstance(found, list) else []
    else:
        return []
    upstreams = []
    for entry in entries:
        try:
            name = entry["upstream"]
            value = parameters.get((UPSTREAM, vhost, name))
            if value is None:
                continue
            upstreams.append(Upstream.from_parameter(vhost, name, value).overridden(entry))
        except (FederationError, KeyError, TypeError):
            continue
    return upstreams


def _options(value: dict[str, Any]) -> dict[str, Any]:
    """The dataclass fields of the optional keys in ``value``, checked."""
    out: dict[str, Any] = {}
    for key in _NUMBERS:
        if key in value:
            found = value[key]
            if not isinstance(found, int) or isinstance(found, bool) or found < 0:
                raise FederationError(f"{key} should be a non-negative integer, actually was {found!r}")
            out[key.replace("-", "_")] = found
    if "reconnect-delay" in value:
        delay = value["reconnect-delay"]
        if not isinstance(delay, int | float) or isinstance(delay, bool) or delay < 0:
            raise FederationError(f"reconnect-delay should be a number, actually was {delay!r}")
        out["reconnect_delay"] = float(delay)
    if "ack-mode" in value:
        if value["ack-mode"] not in ACK_MODES:
            raise FederationError(
                f"ack-mode should be one of {', '.join(ACK_MODES)}, actually was {value['ack-mode']!r}"
            )
        out["ack_mode"] = value["ack-mode"]
    for key in ("trust-user-id", "bind-nowait"):
        if key in value:
            if not isinstance(value[key], bool):
                raise FederationError(f"{key} should be a boolean, actually was {value[key]!r}")
            out[key.replace("-", "_")] = value[key]
    for key in ("exchange", "queue", "consumer-tag", "ha-policy"):
        if key in value and not isinstance(value[key], str):
            raise FederationError(f"{key} should be a binary, actually was {value[key]!r}")
    for key in ("exchange", "queue", "consumer-tag"):
        if key in value:
            out[key.replace("-", "_")] = value[key]
    if "queue-type" in value:
        if value["queue-type"] not in QUEUE_TYPES:
            raise FederationError(
                f"queue-type should be one of classic, quorum, actually was {value['queue-type']!r}"
            )
        out["queue_type"] = value["queue-type"]
    return out


def _uris(found: Any) -> tuple[str, ...]:
    uris = [found] if isinstance(found, str) else found
    if not isinstance(uris, list) or not uris or not all(isinstance(u, str) for u in uris):
        raise FederationError("uri should be a URI or a non-empty list of URIs")
    for uri in uris:
        if not uri.startswith(("amqp://", "amqps://")):
            raise FederationError(f'"{uri}" not a valid URI: uri should start with amqp:// or amqps://')
    return tuple(uris)
