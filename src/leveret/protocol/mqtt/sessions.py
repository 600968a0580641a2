"""What outlives an MQTT connection on the broker's clock: delayed will messages and
the expiry of disconnected sessions (MQTT 5.0 §3.1.2.5, §3.1.3.2.2, §4.1).

A session's subscriptions and packet-id state are :mod:`.state`'s records and its
messages wait in its queue; this registry only holds the timers: a will published
after its Will Delay Interval unless the client comes back first, and a session (its
record and its queue) deleted once its Session Expiry Interval has passed without a
connection. Timers run on ``core.clock`` (tests step it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from .state import NEVER, MqttState

if TYPE_CHECKING:
    from ...core.broker import BrokerCore
    from ...core.clock import Timer

Key = tuple[str, str]  # (vhost, client identifier)


def session_queue_name(client_id: str) -> str:
    """The queue holding a session's messages (RabbitMQ 3.x's name for QoS 1)."""
    return f"mqtt-subscription-{client_id}qos1"


class SessionTimers:
    """Pending wills and session expiries of one broker core."""

    def __init__(self, core: BrokerCore) -> None:
        self.core = core
        self._wills: dict[Key, tuple[Timer, Callable[[], None]]] = {}
        self._expiries: dict[Key, Timer] = {}
        #: packet ids of messages a session's last connection had in flight, by
        #: (queue name, seq): its next connection resends them with the same ids
        self._packet_ids: dict[Key, dict[tuple[str, int], int]] = {}

    @classmethod
    def of(cls, core: BrokerCore) -> SessionTimers:
        timers = core.adapter_settings.get("mqtt-timers")
        if not isinstance(timers, SessionTimers):
            timers = core.adapter_settings["mqtt-timers"] = cls(core)
        return timers

    # -- wills ------------------------------------------------------------------------
    def delay_will(self, key: Key, delay: float, publish: Callable[[], None]) -> None:
        """Publish a will after ``delay`` seconds unless :meth:`reconnected` comes first."""
        self.cancel_will(key)

        def fire() -> None:
            self._wills.pop(key, None)
            publish()

        self._wills[key] = (self.core.clock.call_later(delay, fire), publish)

    def cancel_will(self, key: Key) -> None:
        pending = self._wills.pop(key, None)
        if pending is not None:
            pending[0].cancel()

    def will_now(self, key: Key) -> None:
        """The session ends before its will's delay: the will goes now (§3.1.3.2.2)."""
        pending = self._wills.pop(key, None)
        if pending is not None:
            pending[0].cancel()
            pending[1]()

    # -- packet ids ----------------------------------------------------------------------
    def keep_packet_ids(self, key: Key, ids: dict[tuple[str, int], int]) -> None:
        """The packet ids the session's messages in flight were sent with (in memory:
        after a restart they are sent with new ids, DUP set all the same)."""
        if ids:
            self._packet_ids[key] = ids
        else:
            self._packet_ids.pop(key, None)

    def take_packet_ids(self, key: Key) -> dict[tuple[str, int], int]:
        return self._packet_ids.pop(key, {})

    # -- session expiry ----------------------------------------------------------------
    def reconnected(self, key: Key) -> None:
        """The client is back: its will waits no more (it is not sent) and its session
        does not expire."""
        self.cancel_will(key)
        timer = self._expiries.pop(key, None)
        if timer is not None:
            timer.cancel()

    def expire_after(self, key: Key, seconds: int) -> None:
        """The session of ``key`` ended its connection: it expires in ``seconds`` (0:
        now; :data:`~.state.NEVER`: never)."""
        if seconds == NEVER:
            return
        if seconds <= 0:
            self.expire(key)
            return
        old = self._expiries.pop(key, None)
        if old is not None:
            old.cancel()
        self._expiries[key] = self.core.clock.call_later(seconds, lambda: self.expire(key))

    def expire(self, key: Key) -> None:
        """The session is over: its will goes if still waiting, its record and queue are
        deleted (a queue a connection consumes from again is kept)."""
        self._expiries.pop(key, None)
        self._packet_ids.pop(key, None)
        self.will_now(key)
        vhost_name, client_id = key
        MqttState.of(self.core).delete_session(vhost_name, client_id)
        vhost = self.core.vhosts.get(vhost_name)
        if vhost is None:
            return
        queue = vhost.queues.get(session_queue_name(client_id))
        if queue is not None and not queue.consumers:
            vhost.delete_queue(queue.name)

    def start(self) -> None:
        """After a restart: sessions that expired while the broker was down go, the
        others of disconnected clients expire on time."""
        state = MqttState.of(self.core)
        now = self.core.clock.time()
        for record in state.expired_sessions(now):
            self.expire((record.vhost, record.client_id))
        for record in state.all_sessions():
            if record.disconnected_at is None:  # it was connected when the broker stopped
                record.disconnected_at = now
                state.save_session(record)
            if record.expiry_interval != NEVER:
                left = record.disconnected_at + record.expiry_interval - now
                self.expire_after((record.vhost, record.client_id), max(0, int(left)))
