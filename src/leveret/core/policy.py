"""RabbitMQ's policies: queue and exchange settings applied by name pattern.

A policy has a ``name``, a regular expression ``pattern`` matched against the queue or
exchange name (``re.search``, as RabbitMQ), ``apply_to`` (``queues``, ``exchanges`` or
``all``), a ``priority`` (the highest matching policy applies, alone) and a
``definition`` whose keys are the queue arguments without their ``x-`` prefix
(``message-ttl``, ``dead-letter-exchange``, ``max-redeliveries`` …).

Operator policies (RabbitMQ's ``set_operator_policy``) are policies an operator sets
over the users' ones: they may only hold :data:`OPERATOR_KEYS`, apply to queues only
(whatever their ``apply_to`` says, as in RabbitMQ 3.10), and for each of their keys the
lower of their value and the queue's own (argument or policy) wins
(:func:`with_operator_policy`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field


@dataclass
class Policy:
    """One policy of virtual host ``vhost`` (see the module doc). Raises ValueError
    for a bad ``apply_to``, re.error for a bad ``pattern``."""

    name: str
    pattern: str
    definition: dict
    apply_to: str = "all"
    priority: int = 0
    vhost: str = "/"
    _regex: re.Pattern = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.apply_to not in ("queues", "exchanges", "all"):
            raise ValueError(f"policy {self.name}: apply-to must be queues, exchanges or all")
        self._regex = re.compile(self.pattern)

    def matches(self, vhost: str, name: str, kind: str | None) -> bool:
        """Whether it applies to the ``kind`` (``queues``/``exchanges``; None: either,
        whatever ``apply_to`` says) ``name`` in ``vhost``."""
        if self.vhost != vhost or (kind is not None and self.apply_to not in (kind, "all")):
            return False
        return self._regex.search(name) is not None

    @classmethod
    def from_stored(cls, vhost: str, name: str, data: dict) -> Policy:
        """The policy a store's ``policy``/``operator_policy`` definition row holds
        (``pattern``, ``definition``, ``apply_to``, ``priority``); raises as the
        constructor does."""
        return cls(
            name,
            str(data["pattern"]),
            dict(data["definition"]),
            str(data["apply_to"]),
            int(data["priority"]),
            vhost,
        )


def matching(policies: list[Policy], vhost: str, name: str, kind: str | None) -> Policy | None:
    """The policy that applies to a ``kind`` (``queues``/``exchanges``; None: any)
    named ``name``."""
    found = [p for p in policies if p.matches(vhost, name, kind)]
    return max(found, key=lambda p: p.priority) if found else None


#: The keys an operator policy may set (RabbitMQ 3.10's), all limits where the lower wins.
OPERATOR_KEYS = frozenset(
    (
        "expires",
        "message-ttl",
        "max-length",
        "max-length-bytes",
        "max-in-memory-length",
        "max-in-memory-bytes",
        "delivery-limit",
    )
)


def not_operator_keys(definition: dict) -> list[str]:
    """The keys of ``definition`` an operator policy may not set."""
    return [key for key in definition if key not in OPERATOR_KEYS]


def with_operator_policy(definition: dict | None, operator: dict) -> dict:
    """A policy's ``definition`` (None: no policy) with an operator policy's keys
    applied: for each, the lower value when both set it (the queue's own arguments are
    compared later, when its config is built)."""
    merged = dict(definition or {})
    for key, value in operator.items():
        mine = merged.get(key)
        merged[key] = min(mine, value) if isinstance(mine, int) and isinstance(value, int) else value
    return merged


def erlang_term(value: object) -> str:
    """A JSON value as RabbitMQ prints it in a refusal: text as a binary, else JSON."""
    return f"<<{json.dumps(value)}>>" if isinstance(value, str) else json.dumps(value)


#: The policy keys that apply federation upstreams (:mod:`leveret.federation`).
FEDERATION_KEYS = ("federation-upstream", "federation-upstream-set")


def check_definition(definition: dict, where: str) -> None:
    """A policy definition's values, as a queue would take them (PreconditionFailed,
    406, with RabbitMQ's text), and its federation keys as RabbitMQ's federation plugin
    checks them: strings, not both in one policy (its texts)."""
    from .errors import precondition_failed
    from .queues.features import build  # (features import this module)

    build({}, definition, where)
    if all(key in definition for key in FEDERATION_KEYS):
        keys = "federation-upstream, federation-upstream-set or federation-upstream-pattern"
        raise precondition_failed(f"cannot specify {keys} together")
    for key in FEDERATION_KEYS:
        if key in definition and not isinstance(definition[key], str):
            raise precondition_failed(
                f"{erlang_term(definition[key])} is not a valid federation upstream name"
            )
