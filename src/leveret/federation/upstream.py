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

import json
from dataclasses import dataclass, replace
from typing import Any

from ..core.policy import erlang_term
from .uri import URIError, connect_options

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
        _known(value, name)
        if "uri" not in value:
            raise FederationError(f'Key "uri" not found in {name}')
        return cls(name=name, vhost=vhost, uris=_uris(value["uri"]), **_options(value))

    def overridden(self, overrides: dict[str, Any]) -> Upstream:
        """This upstream with an upstream set entry's keys (``upstream`` itself aside)."""
        keys = {k: v for k, v in overrides.items() if k != "upstream"}
        changed = _options(keys)
        if "uri" in keys:
            changed["uris"] = _uris(keys["uri"])
        return replace(self, **changed)


def check_upstream_set(value: Any, name: str = "") -> list[dict[str, Any]]:
    """A ``federation-upstream-set`` value (named ``name``): a list of objects with an
    ``upstream`` name and optional overrides; FederationError otherwise."""
    if not isinstance(value, list) or not all(isinstance(entry, dict) for entry in value):
        raise FederationError(f"{UPSTREAM_SET} value must be a list of objects")
    for entry in value:
        keys = {k: v for k, v in entry.items() if k != "upstream"}
        _known(keys, name)
        if not isinstance(entry.get("upstream"), str):
            raise FederationError(f'Key "upstream" not found in {name}')
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


def _known(value: dict[str, Any], name: str) -> None:
    unknown = [(k, v) for k, v in value.items() if k not in _KNOWN]
    if unknown:
        terms = ",".join(f"{{<<{json.dumps(k)}>>,{erlang_term(v)}}}" for k, v in unknown)
        raise FederationError(f"Unrecognised terms [{terms}] in {name}")


def _options(value: dict[str, Any]) -> dict[str, Any]:
    """The dataclass fields of the optional keys in ``value``, checked."""
    out: dict[str, Any] = {}
    for key in _NUMBERS:
        if key in value:
            found = value[key]
            if not isinstance(found, int) or isinstance(found, bool) or found < 0:
                raise FederationError(f"{key} should be a number, actually was {erlang_term(found)}")
            out[key.replace("-", "_")] = found
    if "reconnect-delay" in value:
        delay = value["reconnect-delay"]
        if not isinstance(delay, int | float) or isinstance(delay, bool) or delay < 0:
            raise FederationError(f"reconnect-delay should be a number, actually was {erlang_term(delay)}")
        out["reconnect_delay"] = float(delay)
    if "ack-mode" in value:
        if value["ack-mode"] not in ACK_MODES:
            modes = ",".join(erlang_term(m) for m in ("no-ack", "on-publish", "on-confirm"))
            raise FederationError(
                f"ack-mode should be one of [{modes}], actually was {erlang_term(value['ack-mode'])}"
            )
        out["ack_mode"] = value["ack-mode"]
    for key in ("trust-user-id", "bind-nowait"):
        if key in value:
            if not isinstance(value[key], bool):
                raise FederationError(f"{key} should be boolean, actually was {erlang_term(value[key])}")
            out[key.replace("-", "_")] = value[key]
    for key in ("exchange", "queue", "consumer-tag", "ha-policy"):
        if key in value and not isinstance(value[key], str):
            raise FederationError(f"{key} should be binary, actually was {erlang_term(value[key])}")
    for key in ("exchange", "queue", "consumer-tag"):
        if key in value:
            out[key.replace("-", "_")] = value[key]
    if "queue-type" in value:
        found = value["queue-type"]
        if found not in QUEUE_TYPES:
            raise FederationError(
                f"queue-type should be one of classic, quorum, actually was {erlang_term(found)}"
            )
        out["queue_type"] = value["queue-type"]
    return out


def _uris(found: Any) -> tuple[str, ...]:
    uris = [found] if isinstance(found, str) else found
    if not isinstance(uris, list) or not uris or not all(isinstance(u, str) for u in uris):
        raise FederationError("uri should be a URI or a non-empty list of URIs")
    for uri in uris:
        if not uri.startswith(("amqp://", "amqps://")):
            scheme = uri.partition("://")[0] if "://" in uri else ""
            raise FederationError(
                f'"{uri}" not a valid URI: {{{{unexpected_uri_scheme,"{scheme}"}},"{uri}"}}'
            )
        try:  # query values RabbitMQ's amqp_uri:parse refuses (heartbeat=often, verify=maybe)
            connect_options(uri)
        except URIError as exc:
            raise FederationError(f'"{uri}" not a valid URI: {exc}') from None
    return tuple(uris)
