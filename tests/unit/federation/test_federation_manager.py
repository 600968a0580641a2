"""The federation manager on the broker's hot paths (federation/manager.py): a queue or
exchange declared or deleted in a vhost without upstreams costs no reconcile (policy
match, upstream parsing)."""

from __future__ import annotations

from leveret.core.broker import BrokerCore
from leveret.core.clock import ManualClock
from leveret.core.policy import Policy
from leveret.federation.manager import Federation


def test_declares_in_a_vhost_without_upstreams_match_no_policy():
    core = BrokerCore(ManualClock())
    core.set_policy(Policy(name="p", pattern="^other$", definition={"max-length": 5}, vhost="/"))
    federation = Federation(core, lambda: "amqp://guest:guest@localhost:5672/%2F", lambda: "node")
    federation.start()
    vhost = core.vhosts["/"]
    looked_up: list[str | None] = []  # what the manager re-examined
    reconcile = federation.reconcile

    def counted(vhost_name: str, kind: str | None = None, name: str | None = None) -> None:
        looked_up.append(name)
        reconcile(vhost_name, kind, name)

    federation.reconcile = counted  # type: ignore[method-assign]

    vhost.declare_queue("q1", None)
    vhost.delete_queue("q1")
    core.set_policy(Policy(name="p2", pattern="^fed$", definition={"federation-upstream": "up"}, vhost="/"))
    assert looked_up == []

    core.set_parameter("federation-upstream", "/", "up", {"uri": "amqp://elsewhere"})
    vhost.declare_queue("q2", None)
    assert "q2" in looked_up  # an upstream exists: the queue may be federated

    core.clear_parameter("federation-upstream", "/", "up")
    looked_up.clear()
    vhost.declare_queue("q3", None)
    assert looked_up == []


def test_a_failing_entity_listener_does_not_fail_the_declare():
    core = BrokerCore(ManualClock())

    def broken(vhost: str, kind: str, name: str) -> None:
        raise RuntimeError("listener bug")

    core.entity_listeners.append(broken)
    queue = core.vhosts["/"].declare_queue("q", None)
    assert core.vhosts["/"].queues["q"] is queue
    assert core.vhosts["/"].delete_queue("q") == 0
