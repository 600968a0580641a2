"""The console's Connections page with MQTT clients (in a real browser): protocol, client
id, keep alive and session of each, and its Close button disconnects one (MQTT 5:
DISCONNECT 0x98 Administrative action)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from mqtt_ops_clients import V5, V311, Client
from selenium.webdriver.common.by import By
from test_console import login, wait

from leveret import BlockingBroker


@pytest.fixture(scope="module")
def broker() -> Iterator[BlockingBroker]:
    with BlockingBroker(amqp_port=0, http_port=0, mqtt_port=0) as broker:
        yield broker


def cells(driver, client_id: str) -> list[str]:
    """The Connections table's row of ``client_id`` (its cells' text), [] if none."""
    for row in driver.find_elements(By.CSS_SELECTOR, "table tbody tr"):
        texts = [td.text for td in row.find_elements(By.TAG_NAME, "td")]
        if client_id in texts:
            return texts
    return []


def test_mqtt_connections_show_client_id_keep_alive_and_session_and_close(driver, broker):
    sensor, gateway = f"sensor-{uuid.uuid4().hex[:6]}", f"gateway-{uuid.uuid4().hex[:6]}"
    clean = Client(broker.mqtt_port, sensor, V311, "guest", "guest")
    persistent = Client(broker.mqtt_port, gateway, V5, "guest", "guest", clean=False)
    try:
        assert clean.connect(keepalive=20) == 0
        assert persistent.connect(keepalive=90, session_expiry=3600) == 0
        login(driver, broker)
        driver.get(broker.http_url.rstrip("/") + "/#/connections")
        row = wait(driver, lambda d: cells(d, sensor))
        assert "MQTT 3.1.1" in row and "20 s" in row and "clean" in row
        row = wait(driver, lambda d: cells(d, gateway))
        assert "MQTT 5.0" in row and "90 s" in row and "persistent (expiry 3600 s)" in row
        for button in driver.find_elements(By.CSS_SELECTOR, "table tbody tr"):
            if gateway in button.text:
                button.find_element(By.CSS_SELECTOR, "button.danger").click()
                break
        assert persistent.disconnected() == 0x98
        driver.refresh()
        wait(driver, lambda d: cells(d, sensor) and not cells(d, gateway))
    finally:
        clean.close()
        persistent.close()
