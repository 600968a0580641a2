"""MQTT state beyond queues: retained messages and persistent-session records, per
vhost (in memory for now; the durable version replaces this module)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .topics import matches

if TYPE_CHECKING:
    from ...core.broker import BrokerCore

NEVER = 0xFFFFFFFF  # a session expiry interval that never ends (seconds)


@dataclass(slots=True)
class RetainedMessage:
    topic: str
    payload: bytes
    qos: int
    properties: bytes  # the MQTT 5 property block as encoded on the wire (may be b"")
    expires_at: float | None = None  # epoch seconds, None: never


@dataclass(frozen=True, slots=True)
class SubscriptionOptions:
    qos: int
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0
    identifier: int | None = None


@dataclass(slots=True)
class SessionRecord:
    vhost: str
    client_id: str
    expiry_interval: int  # seconds; NEVER: never expires
    subscriptions: dict[str, SubscriptionOptions] = field(default_factory=dict)
    awaiting_rel: set[int] = field(default_factory=set)
    awaiting_comp: set[int] = field(default_factory=set)
    disconnected_at: float | None = None


class MqttState:
    """Retained messages and session records of one broker core."""

    def __init__(self) -> None:
        self._retained: dict[str, dict[str, RetainedMessage]] = {}
        self._sessions: dict[tuple[str, str], SessionRecord] = {}

    @classmethod
    def of(cls, core: BrokerCore) -> MqttState:
        state = getattr(core, "_mqtt_state", None)
        if state is None:
            state = cls()
            core._mqtt_state = state  # type: ignore[attr-defined]
        return state

    def retain(self, vhost: str, message: RetainedMessage) -> None:
        self._retained.setdefault(vhost, {})[message.topic] = message

    def clear_retained(self, vhost: str, topic: str) -> None:
        self._retained.get(vhost, {}).pop(topic, None)

    def retained_matching(self, vhost: str, topic_filter: str, now: float) -> list[RetainedMessage]:
        topics = self._retained.get(vhost, {})
        found = [m for t, m in topics.items() if matches(topic_filter, t)]
        expired = [m for m in found if m.expires_at is not None and m.expires_at <= now]
        for message in expired:
            del topics[message.topic]
        return [m for m in found if m not in expired]

    def retained_count(self, vhost: str) -> int:
        return len(self._retained.get(vhost, {}))

    def session(self, vhost: str, client_id: str) -> SessionRecord | None:
        return self._sessions.get((vhost, client_id))

    def save_session(self, record: SessionRecord) -> None:
        self._sessions[(record.vhost, record.client_id)] = record

    def delete_session(self, vhost: str, client_id: str) -> None:
        self._sessions.pop((vhost, client_id), None)

    def all_sessions(self) -> list[SessionRecord]:
        return list(self._sessions.values())

    def expired_sessions(self, now: float) -> list[SessionRecord]:
        return [
            r
            for r in self._sessions.values()
            if r.disconnected_at is not None
            and r.expiry_interval != NEVER
            and r.disconnected_at + r.expiry_interval <= now
        ]

    def forget_vhost(self, vhost: str) -> None:
        self._retained.pop(vhost, None)
        for key in [k for k in self._sessions if k[0] == vhost]:
            del self._sessions[key]
