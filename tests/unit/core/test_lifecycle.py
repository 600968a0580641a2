"""core.lifecycle driven directly: what open_connection registers, what the handle's
close() undoes (once), what a refusal leaves (nothing), and the failed-login path."""

from __future__ import annotations

import logging

import pytest

from leveret.core.broker import BrokerCore
from leveret.core.clock import ManualClock
from leveret.core.connections import ConnectionFacts
from leveret.core.lifecycle import (
    ClientIdInUse,
    ConnectionLimitReached,
    connection_accepted,
    connection_ended,
    login_accepted,
    login_refused,
    open_connection,
)
from leveret.core.login_throttle import ThrottleSettings

FREE = ThrottleSettings().address_burst


class Client:
    """The smallest adapter: it records what the lifecycle tells it."""

    def __init__(self) -> None:
        self.events: list[tuple[str, object]] = []

    def facts(self) -> ConnectionFacts:
        return ConnectionFacts("127.0.0.1", 50000, "127.0.0.1", 1883, "TEST", "guest", "/", 0.0)

    def close_by_operator(self, reason: str) -> None:
        self.events.append(("operator", reason))

    def on_alarm(self, active: bool) -> None:
        self.events.append(("alarm", active))

    def on_vhost_deleted(self, name: str) -> None:
        self.events.append(("vhost deleted", name))


def registered(core: BrokerCore) -> tuple[int, int, int, int]:
    return (len(core.connections), len(core.alarm_listeners), len(core.vhost_deleted_listeners),
            len(core.client_ids))


def test_open_registers_and_close_undoes_everything_once():
    core = BrokerCore(ManualClock())
    core.add_vhost("other")
    before = registered(core)
    client, bystander = Client(), Client()
    handle = open_connection(core, client, "guest", core.vhosts["/"], "TEST", "127.0.0.1:50000", "c1")
    open_connection(core, bystander, "guest", core.vhosts["other"], "TEST", "127.0.0.1:50001")
    assert registered(core)[0] == before[0] + 2 and core.client_ids == {"c1": client}
    assert core.connections.find("127.0.0.1:50000 -> 127.0.0.1:1883") is not None
    assert core.connections.count_in("/") == 1
    core.set_alarm(True, "memory")
    core.delete_vhost("other")  # only the bystander's vhost
    assert client.events == [("alarm", True)]
    assert bystander.events == [("alarm", True), ("vhost deleted", "other")]
    core.delete_vhost("/")
    assert client.events[-1] == ("vhost deleted", "/")
    handle.close()
    handle.close()
    assert handle.closed
    assert registered(core) == (before[0] + 1, before[1] + 1, before[2] + 1, before[3])
    core.set_alarm(False, "memory")
    assert client.events[-1] == ("vhost deleted", "/")  # it hears nothing more


def test_a_refused_open_registers_nothing():
    core = BrokerCore(ManualClock())
    vhost = core.vhosts["/"]
    first = open_connection(core, Client(), "guest", vhost, "TEST", "127.0.0.1:1", "c1")
    with pytest.raises(ClientIdInUse, match="client-id 'c1' is already connected"):
        open_connection(core, Client(), "guest", vhost, "TEST", "127.0.0.1:2", "c1")
    core.set_vhost_limit("/", "max-connections", 1)
    before = registered(core)
    with pytest.raises(ConnectionLimitReached) as refused:
        open_connection(core, Client(), "guest", vhost, "TEST", "127.0.0.1:3", "c2")
    assert refused.value.text == (
        "access to vhost '/' refused for user 'guest': connection limit (1) is reached")
    assert refused.value.condition == "not_allowed"
    assert registered(core) == before
    first.close()
    open_connection(core, Client(), "guest", vhost, "TEST", "127.0.0.1:4", "c1").close()  # room again


def test_a_refused_login_is_logged_without_the_secret_audited_and_throttled(caplog):
    core = BrokerCore(ManualClock())
    log = logging.getLogger("leveret.test")
    caplog.set_level(logging.INFO)
    delays = [
        login_refused(core, log, "10.0.0.1:4000", "PLAIN", "bob", "invalid credentials", protocol="test")
        for _ in range(FREE + 1)
    ]
    warnings = [r.getMessage() for r in caplog.records if r.name == "leveret.test"]
    line = "connection 10.0.0.1:4000: PLAIN login refused: user 'bob' - invalid credentials"
    assert warnings == [line] * (FREE + 1)
    audited = [r.getMessage() for r in caplog.records if r.name != "leveret.test"]
    assert "login.refused by user 'bob' from 10.0.0.1: protocol='test'" in audited
    assert delays[:FREE] == [0.0] * FREE and delays[FREE] > 0  # counted per address
    assert core.login_throttle.throttled("10.0.0.1") and not core.login_throttle.throttled("10.0.0.2")
    login_accepted(core, "10.0.0.1:4002")
    assert core.login_throttle.throttled("10.0.0.1")  # a login wipes nothing


def test_unauthenticated_connections_are_counted_until_they_log_in_are_refused_or_end():
    core = BrokerCore(ManualClock())
    core.login_throttle.settings = ThrottleSettings(max_unauthenticated=2)
    log = logging.getLogger("leveret.test")
    assert connection_accepted(core, "10.0.0.1:1") and connection_accepted(core, "10.0.0.1:2")
    assert not connection_accepted(core, "10.0.0.1:3")
    login_accepted(core, "10.0.0.1:1")
    assert connection_accepted(core, "10.0.0.1:4")
    connection_ended(core, "10.0.0.1:4")
    login_refused(core, log, "10.0.0.1:2", "PLAIN", "bob", "invalid credentials")  # within the burst
    assert core.login_throttle.unauthenticated("10.0.0.1") == 0
